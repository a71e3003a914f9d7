//! The one place that decides what the primary sends to replicas and the AOF. Only
//! deterministic commands go out: the holder as granted (the token's digest, the fence
//! as issued, absolute deadlines), never a token, a relative TTL or a random value.
//!
//! ```text
//! LOCK.REPL key GRANT <mode>;<digest>;<fence>;<expires-at>;<acquired-at>;<client-id>;<addr> [OWNER o] [FLOOR n]
//! LOCK.REPL key LEASE <fence>;<expires-at> [FLOOR n]
//! LOCK.REPL key DROP <fence>
//! DEL key                       (the last holder is gone)
//! PEXPIREAT key <ms>            (a classic string lock extended)
//! ```
//!
//! A replica (and an AOF replay) also accepts the 0.1 release's `LOCK.SYNC`, which
//! carried the token in clear; it stores only the digest.

use std::cell::Cell;

use crate::args::hex;
use crate::engine::value::{Addr, Holder, LockValue, Mode};
use crate::engine::Repl;
use crate::ffi::blocked::Timer;
use crate::ffi::{self, emit, Ctx, Emit, MainThread, Str};

// ---- whether anything can receive the stream ------------------------------------------
//
// Building the replicated command costs a third of a grant, and on a server with no AOF,
// no replica and no replication backlog nothing ever reads it: the server drops it. It is
// then skipped, which is safe because of how a replica can start listening:
//
// - a replica that connects to a server without a backlog gets a full sync: an RDB
//   snapshot taken by a fork, which holds every write made before the fork. The fork is a
//   server event (FORK_CHILD born, fired in the parent before any other command runs):
//   from then on every change is replicated again;
// - while a backlog exists (created when a replica first syncs, kept `repl-backlog-ttl`
//   after the last one left, restored from the RDB at start-up) a replica may resume
//   from it, so everything is replicated: `STREAM` is only ever cleared by the periodic
//   check below, which sees the backlog, and it starts out set;
// - an AOF is checked on every change (the context's AOF flag), and turning it on forks
//   a rewrite, which also sets `STREAM`.

static STREAM: MainThread<Cell<bool>> = MainThread(Cell::new(true));
/// How often the backlog and the replicas are looked at again.
const STREAM_CHECK_MS: i64 = 1000;

/// Something may listen from now on (a fork, a replica came or went).
pub fn stream_may_listen() {
    STREAM.set(true);
}

/// Starts the periodic check of whether a replica or a backlog can receive the stream.
pub fn start_stream_check(ctx: Ctx<'_>) {
    Timer::start(ctx, STREAM_CHECK_MS, stream_check, ());
}

fn stream_check(ctx: Ctx<'_>, (): ()) {
    let v = ctx.info_fields(
        c"replication",
        &[c"connected_slaves", c"repl_backlog_active"],
    );
    STREAM.set(v.iter().any(|&n| n != 0));
    start_stream_check(ctx);
}

fn wanted(ctx: Ctx<'_>) -> bool {
    STREAM.get() || ctx.flags() & ffi::FLAG_AOF != 0
}

/// A command argument formatted on the stack, digit by digit (no allocation, and none of
/// `core::fmt`'s machinery on the grant path).
struct Packed {
    buf: [u8; 384],
    len: usize,
}

impl Packed {
    fn new() -> Packed {
        Packed {
            buf: [0; 384],
            len: 0,
        }
    }

    /// Appends what fits; every field is bounded well below the buffer's size (an
    /// address to 128 bytes), so nothing is cut in practice.
    fn bytes_(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
        self
    }

    fn u64_(&mut self, mut v: u64) -> &mut Self {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.bytes_(&digits[i..])
    }

    fn i64_(&mut self, v: i64) -> &mut Self {
        if v < 0 {
            self.bytes_(b"-");
        }
        self.u64_(v.unsigned_abs())
    }

    fn sep(&mut self) -> &mut Self {
        self.bytes_(b";")
    }

    fn addr(&mut self, a: &Addr) -> &mut Self {
        match a {
            Addr::None => self,
            Addr::V4(ip, port) => {
                for (i, octet) in ip.iter().enumerate() {
                    if i > 0 {
                        self.bytes_(b".");
                    }
                    self.u64_(u64::from(*octet));
                }
                self.bytes_(b":").u64_(u64::from(*port))
            }
            Addr::Text(t) => self.bytes_(t),
            v6 => {
                let text = v6.to_string();
                self.bytes_(text.as_bytes())
            }
        }
    }

    fn mode(&mut self, m: Mode) -> &mut Self {
        match m {
            Mode::Exclusive => self.bytes_(b"exclusive"),
            Mode::Shared => self.bytes_(b"shared"),
            Mode::Counted(n) => self.bytes_(b"limit=").u64_(u64::from(n)),
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn grant_fields(mode: Mode, h: &Holder) -> Packed {
    let mut p = Packed::new();
    p.mode(mode)
        .sep()
        .bytes_(&hex(&h.digest))
        .sep()
        .u64_(h.fence)
        .sep()
        .i64_(h.expires_at)
        .sep()
        .i64_(h.acquired_at)
        .sep()
        .u64_(h.client_id)
        .sep()
        .addr(&h.addr());
    p
}

fn number(v: u64) -> Packed {
    let mut p = Packed::new();
    p.u64_(v);
    p
}

/// Builds the command for `op` and hands it to `out(cmd, args)`.
fn build(op: &Repl<'_>, out: &mut dyn FnMut(&std::ffi::CStr, &[&[u8]])) {
    match *op {
        Repl::Grant {
            mode,
            holder,
            floor,
        } => {
            let fields = grant_fields(mode, holder);
            let fl = number(floor);
            let mut args: [&[u8]; 6] = [b"GRANT", fields.bytes(), &[], &[], &[], &[]];
            let mut n = 2;
            if let Some(o) = holder.owner() {
                (args[n], args[n + 1]) = (b"OWNER", o);
                n += 2;
            }
            if floor > holder.fence {
                (args[n], args[n + 1]) = (b"FLOOR", fl.bytes());
                n += 2;
            }
            out(c"LOCK.REPL", &args[..n]);
        }
        Repl::Lease {
            fence,
            expires_at,
            floor,
        } => {
            let mut p = Packed::new();
            p.u64_(fence).sep().i64_(expires_at);
            let fl = number(floor);
            if floor > 0 {
                out(c"LOCK.REPL", &[b"LEASE", p.bytes(), b"FLOOR", fl.bytes()]);
            } else {
                out(c"LOCK.REPL", &[b"LEASE", p.bytes()]);
            }
        }
        Repl::Drop { fence } => out(c"LOCK.REPL", &[b"DROP", number(fence).bytes()]),
        Repl::Delete => out(c"DEL", &[]),
        Repl::ExpireAt(at) => {
            let mut p = Packed::new();
            p.i64_(at);
            out(c"PEXPIREAT", &[p.bytes()]);
        }
    }
}

/// Sends one change of `key` to replicas and the AOF (when anything can receive it).
pub fn send(ctx: Ctx<'_>, key: Str<'_>, op: Repl<'_>) {
    if wanted(ctx) {
        build(&op, &mut |cmd, args| ctx.replicate(cmd, key, args));
    }
}

/// Writes a held lock into an AOF being rewritten: one GRANT per holder, the first
/// carrying the fence counter when it is above the lock's own fences.
pub fn rewrite(
    io: *mut redis_module::raw::RedisModuleIO,
    key: Str<'_>,
    v: &LockValue,
    counter: u64,
) {
    for (i, h) in v.holders().iter().enumerate() {
        let op = Repl::Grant {
            mode: v.mode(),
            holder: h,
            floor: if i == 0 { counter } else { 0 },
        };
        build(&op, &mut |cmd, args| emit(Emit::Aof(io), cmd, key, args));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{parse_repl, ReplCmd};
    use crate::engine::value::{digest, Addr};

    fn collect(op: Repl<'_>) -> (String, Vec<Vec<u8>>) {
        let mut got = None;
        build(&op, &mut |cmd, args| {
            got = Some((
                cmd.to_string_lossy().into_owned(),
                args.iter().map(|a| a.to_vec()).collect(),
            ))
        });
        got.unwrap()
    }

    #[test]
    fn grants_round_trip_through_the_parser() {
        for (mode, owner, addr) in [
            (Mode::Exclusive, None, Addr::V4([127, 0, 0, 1], 5000)),
            (Mode::Shared, Some(b"o;w n\0er".to_vec()), Addr::None),
            (
                Mode::Counted(7),
                None,
                Addr::Text(b"/tmp/a;b.sock:0".to_vec().into()),
            ),
        ] {
            let h = Holder::new(
                digest(b"tok"),
                1_883_234_272_951_664_640,
                1_795_992_217_911,
                1_795_992_157_904,
                42,
                addr,
                owner.map(Into::into),
            );
            let (cmd, args) = collect(Repl::Grant {
                mode,
                holder: &h,
                floor: h.fence + 5,
            });
            assert_eq!(cmd, "LOCK.REPL");
            let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
            assert_eq!(
                parse_repl(&slices).unwrap(),
                ReplCmd::Grant {
                    mode,
                    holder: h.clone(),
                    floor: h.fence + 5
                }
            );
            assert!(!args.iter().any(|a| a.windows(3).any(|w| w == b"tok")));
        }
    }

    #[test]
    fn numbers_and_addresses_format_like_std() {
        for v in [
            0i64,
            7,
            -7,
            10,
            1_883_234_272_951_664_640,
            i64::MAX,
            i64::MIN,
            -1,
        ] {
            let mut p = Packed::new();
            p.i64_(v);
            assert_eq!(p.bytes(), v.to_string().as_bytes());
        }
        for a in [
            Addr::V4([10, 0, 255, 1], 65535),
            Addr::V6([0; 16], 1),
            Addr::Text(b"x".to_vec().into()),
            Addr::None,
        ] {
            let mut p = Packed::new();
            p.addr(&a);
            assert_eq!(p.bytes(), a.to_string().as_bytes());
        }
    }

    #[test]
    fn leases_drops_and_deletes() {
        let (cmd, args) = collect(Repl::Lease {
            fence: 9,
            expires_at: 100,
            floor: 0,
        });
        assert_eq!((cmd.as_str(), args.len()), ("LOCK.REPL", 2));
        let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        assert_eq!(
            parse_repl(&slices).unwrap(),
            ReplCmd::Lease {
                fence: 9,
                expires_at: 100,
                floor: 0
            }
        );
        let (_, args) = collect(Repl::Lease {
            fence: 9,
            expires_at: -1,
            floor: 50,
        });
        let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        assert!(matches!(
            parse_repl(&slices).unwrap(),
            ReplCmd::Lease { floor: 50, .. }
        ));
        let (_, args) = collect(Repl::Drop { fence: 77 });
        let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        assert_eq!(parse_repl(&slices).unwrap(), ReplCmd::Drop { fence: 77 });
        assert_eq!(collect(Repl::Delete).0, "DEL");
        assert_eq!(collect(Repl::ExpireAt(5)).1, vec![b"5".to_vec()]);
    }
}
