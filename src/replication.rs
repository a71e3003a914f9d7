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

use std::io::Write;

use crate::args::{hex, mode_text};
use crate::engine::value::{Holder, LockValue, Mode};
use crate::engine::Repl;
use crate::ffi::{emit, Ctx, Emit, Str};

/// A command argument formatted on the stack (no allocation on the grant path).
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

    fn fmt(&mut self, args: std::fmt::Arguments<'_>) {
        let mut w = &mut self.buf[self.len..];
        let room = w.len();
        // A write that does not fit is cut short; every field is bounded well below the
        // buffer's size (addresses to 128 bytes), so this cannot happen in practice.
        let _ = w.write_fmt(args);
        self.len += room - w.len();
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn grant_fields(mode: Mode, h: &Holder) -> Packed {
    let mut p = Packed::new();
    let digest = hex(&h.digest);
    p.fmt(format_args!(
        "{};{};{};{};{};{};{}",
        mode_text(mode),
        std::str::from_utf8(&digest).unwrap_or(""),
        h.fence,
        h.expires_at,
        h.acquired_at,
        h.client_id,
        h.addr
    ));
    p
}

fn number(v: u64) -> Packed {
    let mut p = Packed::new();
    p.fmt(format_args!("{v}"));
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
            if let Some(o) = &holder.owner {
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
            p.fmt(format_args!("{fence};{expires_at}"));
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
            p.fmt(format_args!("{at}"));
            out(c"PEXPIREAT", &[p.bytes()]);
        }
    }
}

/// Sends one change of `key` to replicas and the AOF.
pub fn send(ctx: Ctx<'_>, key: Str<'_>, op: Repl<'_>) {
    build(&op, &mut |cmd, args| ctx.replicate(cmd, key, args));
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
            let h = Holder {
                digest: digest(b"tok"),
                fence: 1_883_234_272_951_664_640,
                expires_at: 1_795_992_217_911,
                acquired_at: 1_795_992_157_904,
                client_id: 42,
                addr,
                owner: owner.map(Into::into),
            };
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
