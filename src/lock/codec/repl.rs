//! The commands a primary sends to its replicas and writes to the AOF, one change of one
//! lock key each, and those older releases sent (still read from their AOF files and from
//! a primary not yet upgraded). Deterministic: the token's digest (never the token), the
//! fence as issued, and the lease as the time left when it was written.
//!
//! ```text
//! this release:
//!   LOCK.REPL key ADD;<mode>;<digest>;<fence>;<ttl-ms>;<acquired-at>;<client-id>;<addr> [OWNER o] [FLOOR n] [LOCKDELAY ms] [SESSION <session-digest>]
//!   LOCK.REPL key RENEW;<fence>;<ttl-ms> [FLOOR n]
//!   LOCK.REPL key DROP;<fence>
//!   LOCK.REPL key DELAY;<ms>                  (a lock-delay runs; an exclusive holder is gone)
//!   DEL key                                   (the last holder is gone)
//!   PEXPIREAT key <unix-ms>                   (a classic string lock extended)
//!   LOCK.SREPL OPEN;<session-digest>;<lease-ms>;<ttl-ms> [OWNER o]   (a session opened, or renewed with a new lease)
//!   LOCK.SREPL RENEW;<session-digest>;<lease-ms>;<ttl-ms>           (a keepalive: the session and all its locks)
//!   LOCK.SREPL END;<session-digest>                                  (a session is gone; its locks' ends came before)
//!   LOCK.SREPL MOVED;<session-digest>                                (a lock of the session left with its slot: no longer kept alive)
//!   LOCK.SREPL SEEN;<session-digest>;<lease-ms>;<ttl-ms> [OWNER o]   (an AOF rewrite: the session of the holder that follows; its locks untouched)
//! the builds before this one (still read): the op as an argument of its own,
//!   LOCK.REPL key ADD <mode>;... / RENEW <fence>;<ttl-ms> / DROP <fence> / DELAY <ms>
//!   LOCK.SREPL OPEN|RENEW|SEEN <session-digest> <lease-ms> <ttl-ms> [OWNER o] / END|MOVED <session-digest>
//! release 0.2 (absolute unix-ms deadlines; the op as an argument of its own):
//!   LOCK.REPL key GRANT <mode>;<digest>;<fence>;<expires-at>;<acquired-at>;<client-id>;<addr> [OWNER o] [FLOOR n]
//!   LOCK.REPL key LEASE <fence>;<expires-at> [FLOOR n]
//! release 0.1 (token in clear; turned into its digest on the way in):
//!   LOCK.SYNC key token fence expires-at acquired-at client-id client-addr [OWNER o] [FLOOR n]
//! ```
//!
//! `mode` is `exclusive`, `shared` or `limit=<n>`; `digest` is 32 lowercase hex digits.
//! One packed argument per change, the op word first, keeps the stream cheap to build and
//! to write and readable in an AOF: each argument costs the server's AOF and replication
//! writers ~700 instructions (Redis 7.0.15), so the op word in the fields' argument
//! instead of its own saves as much per grant and per extend.

use std::ffi::CStr;

use super::Clock;
use crate::error::LockError;
use crate::lock::fence::MAX_FENCE;
use crate::lock::value::{
    digest, Addr, Digest, Holder, Mode, MAX_ADDR_LEN, MAX_LIMIT, MAX_OWNER_LEN, MAX_TOKEN_LEN,
};
use crate::syntax::{options, parse_i64, positive};

/// One change of a lock key, as the engine makes it.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// A new holder (for an exclusive lock: the whole value).
    Add {
        mode: Mode,
        holder: &'a Holder,
        /// The fence counter, when it is above this holder's fence (0: not sent).
        floor: u64,
    },
    /// A holder's new lease (a renew, an extend).
    Renew {
        fence: u64,
        deadline: i64,
        floor: u64,
    },
    /// One holder of a shared or counted lock is gone (the others stay).
    Drop { fence: u64 },
    /// A lock-delay runs until `until` (an exclusive lock's holder is gone with it).
    Delay { until: i64 },
    /// The key is gone.
    Delete,
    /// A classic string lock's new absolute deadline (unix ms).
    ClassicExpireAt(i64),
}

/// One change of a session (it has no key of its own: `LOCK.SREPL`).
#[derive(Debug, Clone, Copy)]
pub enum SessionChange<'a> {
    /// Opened, or renewed with its lease set to `ttl` (ms) and a new label.
    Open {
        digest: &'a Digest,
        ttl: u64,
        deadline: i64,
        owner: Option<&'a [u8]>,
    },
    /// A keepalive: the session, and every lock it holds, end at `deadline`.
    Renew {
        digest: &'a Digest,
        ttl: u64,
        deadline: i64,
    },
    /// The session is gone (the end of each of its locks was sent before).
    End { digest: &'a Digest },
    /// A lock of the session left this server with its slot: it is no longer kept alive
    /// here (its locks here end with their current lease).
    Moved { digest: &'a Digest },
    /// An AOF rewrite names the session of the holder it writes next: known from then
    /// on with this lease and label, lasting at least to `deadline`; its locks are not
    /// touched (an `Open` renews every lock the session holds: one per holder of a
    /// rewrite would open every lock of the session once per lock at load).
    Seen {
        digest: &'a Digest,
        ttl: u64,
        deadline: i64,
        owner: Option<&'a [u8]>,
    },
}

/// Builds `LOCK.SREPL` for `change` and hands it to `out(command, args)`: the op word and
/// its fields in one argument (`RENEW;<digest>;<lease-ms>;<ttl-ms>`), as `LOCK.REPL`.
pub fn encode_session(
    change: &SessionChange<'_>,
    clock: Clock,
    out: &mut dyn FnMut(&CStr, &[&[u8]]),
) {
    let left = |deadline: i64| u64::try_from(clock.remaining_ms(deadline).max(0)).unwrap_or(0);
    let mut p = Packed::new();
    match *change {
        SessionChange::Open {
            digest,
            ttl,
            deadline,
            owner,
        }
        | SessionChange::Seen {
            digest,
            ttl,
            deadline,
            owner,
        } => {
            let op: &[u8] = match change {
                SessionChange::Seen { .. } => b"SEEN;",
                _ => b"OPEN;",
            };
            p.put(op)
                .hex(digest)
                .sep()
                .u64(ttl)
                .sep()
                .u64(left(deadline));
            match owner {
                Some(o) => out(c"LOCK.SREPL", &[p.bytes(), b"OWNER", o]),
                None => out(c"LOCK.SREPL", &[p.bytes()]),
            }
        }
        SessionChange::Renew {
            digest,
            ttl,
            deadline,
        } => {
            p.put(b"RENEW;")
                .hex(digest)
                .sep()
                .u64(ttl)
                .sep()
                .u64(left(deadline));
            out(c"LOCK.SREPL", &[p.bytes()]);
        }
        SessionChange::End { digest } => {
            p.put(b"END;").hex(digest);
            out(c"LOCK.SREPL", &[p.bytes()]);
        }
        SessionChange::Moved { digest } => {
            p.put(b"MOVED;").hex(digest);
            out(c"LOCK.SREPL", &[p.bytes()]);
        }
    }
}

/// `LOCK.SREPL` (everything after the command name), in `clock`: the op word and its
/// fields in the first argument, `;`-separated, or (as the builds before wrote them) as
/// arguments of their own; an `OWNER label` pair follows either.
pub fn decode_session(
    args: &[&[u8]],
    clock: Clock,
) -> Result<crate::engine::SessionApply, LockError> {
    match args {
        [first, rest @ ..] if first.contains(&b';') => {
            let mut all: Vec<&[u8]> = first.split(|&b| b == b';').collect();
            all.extend_from_slice(rest);
            decode_session_args(&all, clock)
        }
        _ => decode_session_args(args, clock),
    }
}

fn decode_session_args(
    args: &[&[u8]],
    clock: Clock,
) -> Result<crate::engine::SessionApply, LockError> {
    use crate::engine::SessionApply;
    let bad = || LockError::Syntax("malformed LOCK.SREPL".into());
    let ms = |v: &[u8]| {
        parse_i64(v)
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(bad)
    };
    match args {
        [op, d, ttl, left, rest @ ..] if *op == b"OPEN" || *op == b"RENEW" || *op == b"SEEN" => {
            let digest = unhex(d).ok_or_else(bad)?;
            let (ttl, left) = (ms(ttl)?, ms(left)?);
            let deadline = clock.after_ms(i64::try_from(left).map_err(|_| bad())?);
            if *op == b"RENEW" {
                if !rest.is_empty() {
                    return Err(bad());
                }
                return Ok(SessionApply::Renew {
                    digest,
                    ttl,
                    deadline,
                });
            }
            let owner = match rest {
                [] => None,
                [o, label] if o.eq_ignore_ascii_case(b"OWNER") => {
                    Some(bounded(label, MAX_OWNER_LEN)?.into())
                }
                _ => return Err(bad()),
            };
            if *op == b"SEEN" {
                return Ok(SessionApply::Seen {
                    digest,
                    ttl,
                    deadline,
                    owner,
                });
            }
            Ok(SessionApply::Open {
                digest,
                ttl,
                deadline,
                owner,
            })
        }
        [op, d] if *op == b"END" => Ok(SessionApply::End {
            digest: unhex(d).ok_or_else(bad)?,
        }),
        [op, d] if *op == b"MOVED" => Ok(SessionApply::Moved {
            digest: unhex(d).ok_or_else(bad)?,
        }),
        _ => Err(bad()),
    }
}

/// A change read back from the stream or an AOF, in this server's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplCmd {
    Add {
        mode: Mode,
        holder: Holder,
        floor: u64,
    },
    Renew {
        fence: u64,
        deadline: i64,
        floor: u64,
    },
    Drop {
        fence: u64,
    },
    Delay {
        until: i64,
    },
}

// ---- encoding ----------------------------------------------------------------------------

/// A command argument formatted on the stack, digit by digit.
pub struct Packed {
    buf: [u8; 160],
    len: usize,
    /// What did not fit (a long text address or owner).
    spill: Vec<u8>,
}

const DIGIT_PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

impl Packed {
    fn new() -> Packed {
        Packed {
            buf: [0; 160],
            len: 0,
            spill: Vec::new(),
        }
    }

    /// `n` bytes at the end of the buffer to write into, if they fit there (else the
    /// caller formats elsewhere and [`Packed::put`]s it).
    fn room(&mut self, n: usize) -> Option<&mut [u8]> {
        if !self.spill.is_empty() {
            return None;
        }
        let at = self.len;
        let dst = self.buf.get_mut(at..at.checked_add(n)?)?;
        self.len = at + n;
        Some(dst)
    }

    fn put(&mut self, b: &[u8]) -> &mut Self {
        match self.room(b.len()) {
            Some(dst) => dst.copy_from_slice(b),
            None => {
                if self.spill.is_empty() {
                    self.spill.extend_from_slice(&self.buf[..self.len]);
                }
                self.spill.extend_from_slice(b);
            }
        }
        self
    }

    fn byte(&mut self, c: u8) -> &mut Self {
        match self.room(1) {
            Some(dst) => {
                dst[0] = c;
                self
            }
            None => self.put(&[c]),
        }
    }

    /// Decimal digits written in place, two at a time from the right.
    fn u64(&mut self, v: u64) -> &mut Self {
        let n = decimal_digits(v);
        let mut tmp = [0u8; 20];
        let dst = match self.room(n) {
            Some(dst) => dst,
            None => &mut tmp[..n],
        };
        let (mut v, mut i) = (v, n);
        while v >= 100 {
            let pair = (v % 100) as usize * 2;
            v /= 100;
            i -= 2;
            dst[i] = DIGIT_PAIRS[pair];
            dst[i + 1] = DIGIT_PAIRS[pair + 1];
        }
        if v >= 10 {
            let pair = v as usize * 2;
            dst[0] = DIGIT_PAIRS[pair];
            dst[1] = DIGIT_PAIRS[pair + 1];
        } else {
            dst[0] = b'0' + v as u8;
        }
        if tmp[0] != 0 {
            self.put(&tmp[..n]);
        }
        self
    }

    fn i64(&mut self, v: i64) -> &mut Self {
        if v < 0 {
            self.byte(b'-');
        }
        self.u64(v.unsigned_abs())
    }

    fn sep(&mut self) -> &mut Self {
        self.byte(b';')
    }

    fn addr(&mut self, a: &Addr) -> &mut Self {
        match a {
            Addr::None => self,
            Addr::V4(ip, port) => {
                for (i, octet) in ip.iter().enumerate() {
                    if i > 0 {
                        self.byte(b'.');
                    }
                    self.u64(u64::from(*octet));
                }
                self.byte(b':').u64(u64::from(*port))
            }
            Addr::Text(t) => self.put(t),
            v6 => self.put(v6.to_string().as_bytes()),
        }
    }

    fn mode(&mut self, m: Mode) -> &mut Self {
        match m {
            Mode::Exclusive => self.put(b"exclusive"),
            Mode::Shared => self.put(b"shared"),
            Mode::Counted(n) => self.put(b"limit=").u64(u64::from(n)),
        }
    }

    fn hex(&mut self, d: &Digest) -> &mut Self {
        match self.room(32) {
            Some(dst) => hex_into(d, dst),
            None => {
                self.put(&hex(d));
            }
        }
        self
    }

    pub fn bytes(&self) -> &[u8] {
        if self.spill.is_empty() {
            &self.buf[..self.len]
        } else {
            &self.spill
        }
    }
}

/// How many decimal digits `v` has: from its bit length (log10 2 ~ 1233 / 4096), then
/// one comparison.
fn decimal_digits(v: u64) -> usize {
    const POW10: [u64; 20] = {
        let mut p = [1u64; 20];
        let mut i = 1;
        while i < 20 {
            p[i] = p[i - 1] * 10;
            i += 1;
        }
        p
    };
    let bits = 64 - (v | 1).leading_zeros() as usize;
    let t = (bits * 1233) >> 12;
    (t + usize::from(v >= POW10[t])).max(1)
}

pub fn hex(d: &Digest) -> [u8; 32] {
    let mut out = [0u8; 32];
    hex_into(d, &mut out);
    out
}

fn hex_into(d: &Digest, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(d) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

fn unhex(v: &[u8]) -> Option<Digest> {
    if v.len() != 32 {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut d = [0u8; 16];
    for (i, pair) in v.chunks(2).enumerate() {
        d[i] = nib(pair[0])? << 4 | nib(pair[1])?;
    }
    Some(d)
}

fn number(v: u64) -> Packed {
    let mut p = Packed::new();
    p.u64(v);
    p
}

/// Builds the command for `change` (its time left counted from `clock`) and hands it to
/// `out(command, args-after-the-key)`.
pub fn encode(change: &Change<'_>, clock: Clock, out: &mut dyn FnMut(&CStr, &[&[u8]])) {
    match *change {
        Change::Add {
            mode,
            holder: h,
            floor,
        } => {
            let mut p = Packed::new();
            p.put(b"ADD;")
                .mode(mode)
                .sep()
                .hex(&h.digest)
                .sep()
                .u64(h.fence)
                .sep()
                .i64(clock.remaining_ms(h.deadline))
                .sep()
                .i64(h.acquired_at())
                .sep()
                .u64(h.client_id())
                .sep()
                .addr(&h.addr());
            let fl = if floor > h.fence {
                number(floor)
            } else {
                Packed::new()
            };
            let delay = match h.lock_delay() {
                0 => Packed::new(),
                ms => number(u64::from(ms)),
            };
            let session = h.session().map(hex);
            let mut args: [&[u8]; 9] = [p.bytes(), &[], &[], &[], &[], &[], &[], &[], &[]];
            let mut n = 1;
            if let Some(o) = h.owner() {
                (args[n], args[n + 1]) = (b"OWNER", o);
                n += 2;
            }
            if floor > h.fence {
                (args[n], args[n + 1]) = (b"FLOOR", fl.bytes());
                n += 2;
            }
            if h.lock_delay() > 0 {
                (args[n], args[n + 1]) = (b"LOCKDELAY", delay.bytes());
                n += 2;
            }
            if let Some(s) = &session {
                (args[n], args[n + 1]) = (b"SESSION", s);
                n += 2;
            }
            out(c"LOCK.REPL", &args[..n]);
        }
        Change::Renew {
            fence,
            deadline,
            floor,
        } => {
            let mut p = Packed::new();
            p.put(b"RENEW;")
                .u64(fence)
                .sep()
                .i64(clock.remaining_ms(deadline));
            let fl = number(floor);
            if floor > 0 {
                out(c"LOCK.REPL", &[p.bytes(), b"FLOOR", fl.bytes()]);
            } else {
                out(c"LOCK.REPL", &[p.bytes()]);
            }
        }
        Change::Drop { fence } => {
            let mut p = Packed::new();
            p.put(b"DROP;").u64(fence);
            out(c"LOCK.REPL", &[p.bytes()]);
        }
        Change::Delay { until } => {
            let ms = u64::try_from(clock.remaining_ms(until).max(0)).unwrap_or(0);
            let mut p = Packed::new();
            p.put(b"DELAY;").u64(ms);
            out(c"LOCK.REPL", &[p.bytes()]);
        }
        Change::Delete => out(c"DEL", &[]),
        Change::ClassicExpireAt(at) => {
            let mut p = Packed::new();
            p.i64(at);
            out(c"PEXPIREAT", &[p.bytes()]);
        }
    }
}

// ---- decoding ------------------------------------------------------------------------------

fn positive_fence(v: &[u8], err: LockError) -> Result<u64, LockError> {
    positive(v, MAX_FENCE, err)
}

fn bad() -> LockError {
    LockError::Syntax("malformed LOCK.REPL".into())
}

fn mode_of(v: &[u8]) -> Option<Mode> {
    match v {
        b"exclusive" => Some(Mode::Exclusive),
        b"shared" => Some(Mode::Shared),
        _ => {
            let n = parse_i64(v.strip_prefix(b"limit=")?)?;
            let n = u32::try_from(n)
                .ok()
                .filter(|n| (1..=MAX_LIMIT).contains(n))?;
            Some(Mode::Counted(n))
        }
    }
}

fn bounded(v: &[u8], max: usize) -> Result<&[u8], LockError> {
    if v.is_empty() || v.len() > max {
        return Err(bad());
    }
    Ok(v)
}

/// `LOCK.REPL` (everything after the key), of this release or an earlier one, in
/// `clock`: `<op>;<fields> [options]`, or `<op> <fields> [options]` as 0.2 and the builds
/// before the op moved into the fields' argument wrote it (an op word never holds a `;`,
/// so the two cannot be confused).
pub fn decode(args: &[&[u8]], clock: Clock) -> Result<ReplCmd, LockError> {
    let (op, packed, opts) = match args {
        [first, opts @ ..] if first.contains(&b';') => {
            let (op, packed) = split_once(first, b';').ok_or_else(bad)?;
            (op, packed, opts)
        }
        [op, packed, opts @ ..] => (*op, *packed, opts),
        _ => return Err(LockError::WrongArity("lock.repl")),
    };
    let (mut floor, mut owner, mut lock_delay, mut session) = (0, None, 0, None);
    let allowed: &[&str] = match op {
        b"ADD" => &["OWNER", "FLOOR", "LOCKDELAY", "SESSION"],
        b"GRANT" => &["OWNER", "FLOOR"],
        b"RENEW" | b"LEASE" => &["FLOOR"],
        _ => &[],
    };
    options(opts, allowed, &[], |name, v| {
        match name {
            "OWNER" => owner = Some(bounded(v, MAX_OWNER_LEN)?),
            "SESSION" => session = Some(unhex(v).ok_or_else(bad)?),
            "LOCKDELAY" => {
                lock_delay = parse_i64(v)
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(bad)?
            }
            _ => floor = positive_fence(v, LockError::InvalidFence)?,
        }
        Ok(())
    })?;
    let int = |v: &[u8]| parse_i64(v).ok_or_else(bad);
    let fence = |v: &[u8]| positive_fence(v, LockError::InvalidFence);
    // 0.2 sent absolute deadlines; this release sends the time left.
    let lease = |v: &[u8]| -> Result<i64, LockError> {
        let n = int(v)?;
        Ok(match op {
            b"GRANT" | b"LEASE" => clock.from_wall(n),
            _ => clock.after_ms(n),
        })
    };
    match op {
        b"ADD" | b"GRANT" => {
            let mut f = packed.splitn(7, |&b| b == b';');
            let mut next = || f.next().ok_or_else(bad);
            let mode = mode_of(next()?).ok_or_else(bad)?;
            let d = unhex(next()?).ok_or_else(bad)?;
            let fence = fence(next()?)?;
            let deadline = lease(next()?)?;
            let acquired_at = int(next()?)?;
            let client_id = u64::try_from(int(next()?)?).map_err(|_| bad())?;
            let addr = next()?;
            if addr.len() > MAX_ADDR_LEN {
                return Err(bad());
            }
            let holder = Holder::new(
                d,
                fence,
                deadline,
                acquired_at,
                client_id,
                Addr::parse(addr),
                owner.map(Into::into),
            )
            .with_lock_delay(lock_delay)
            .with_session(session);
            Ok(ReplCmd::Add {
                mode,
                holder,
                floor,
            })
        }
        b"RENEW" | b"LEASE" => {
            let (f, e) = split_once(packed, b';').ok_or_else(bad)?;
            Ok(ReplCmd::Renew {
                fence: fence(f)?,
                deadline: lease(e)?,
                floor,
            })
        }
        b"DROP" => Ok(ReplCmd::Drop {
            fence: fence(packed)?,
        }),
        b"DELAY" => Ok(ReplCmd::Delay {
            until: clock.after_ms(int(packed)?.max(0)),
        }),
        _ => Err(bad()),
    }
}

fn split_once(v: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = v.iter().position(|&b| b == sep)?;
    Some((&v[..i], &v[i + 1..]))
}

/// `LOCK.SYNC` of release 0.1 (everything after the key): an exclusive grant, its token
/// kept only as its digest.
pub fn decode_sync(args: &[&[u8]], clock: Clock) -> Result<ReplCmd, LockError> {
    if args.len() < 6 {
        return Err(LockError::WrongArity("lock.sync"));
    }
    let int = |i: usize| parse_i64(args[i]).ok_or(LockError::NotInteger);
    let token = args[0];
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(LockError::BadLength {
            what: "TOKEN",
            min: 1,
            max: MAX_TOKEN_LEN,
        });
    }
    let fence = positive_fence(args[1], LockError::InvalidFence)?;
    let client_id = u64::try_from(int(4)?).map_err(|_| LockError::NotInteger)?;
    let (expires_at, acquired_at) = (int(2)?, int(3)?);
    let (mut owner, mut floor) = (None, 0);
    options(&args[6..], &["OWNER", "FLOOR"], &[], |name, v| {
        if name == "OWNER" {
            owner = Some(bounded(v, MAX_OWNER_LEN)?);
        } else {
            floor = positive_fence(v, LockError::InvalidFence)?;
        }
        Ok(())
    })?;
    let holder = Holder::new(
        digest(token),
        fence,
        clock.from_wall(expires_at),
        acquired_at,
        client_id,
        Addr::parse(args[5]),
        owner.map(Into::into),
    );
    Ok(ReplCmd::Add {
        mode: Mode::Exclusive,
        holder,
        floor,
    })
}

/// The 0.1 `LOCK.SYNC` command for a holder and its token (the upgrade tests write it).
pub fn encode_sync(token: &[u8], h: &Holder, clock: Clock) -> Vec<Vec<u8>> {
    let mut args = vec![
        token.to_vec(),
        h.fence.to_string().into_bytes(),
        clock.to_wall(h.deadline).to_string().into_bytes(),
        h.acquired_at().to_string().into_bytes(),
        h.client_id().to_string().into_bytes(),
        h.addr().to_string().into_bytes(),
    ];
    if let Some(o) = h.owner() {
        args.push(b"OWNER".to_vec());
        args.push(o.to_vec());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Clock = Clock {
        mono: 9_000_000_000,
        wall: 1_800_000_000_000,
    };

    fn collect(c: Change<'_>, clock: Clock) -> (String, Vec<Vec<u8>>) {
        let mut got = None;
        encode(&c, clock, &mut |cmd, args| {
            got = Some((
                cmd.to_string_lossy().into_owned(),
                args.iter().map(|a| a.to_vec()).collect(),
            ))
        });
        got.unwrap()
    }

    fn slices(v: &[Vec<u8>]) -> Vec<&[u8]> {
        v.iter().map(|a| a.as_slice()).collect()
    }

    #[test]
    fn adds_round_trip_with_their_time_left() {
        for (mode, owner, addr) in [
            (Mode::Exclusive, None, Addr::V4([127, 0, 0, 1], 5000)),
            (Mode::Shared, Some(b"o;w n\0er".to_vec()), Addr::None),
            (
                Mode::Counted(7),
                None,
                Addr::Text(b"/tmp/a;b.sock:0".to_vec().into()),
            ),
            (Mode::Exclusive, None, Addr::V6([0xfe; 16], 1)),
        ] {
            let h = Holder::new(
                digest(b"tok"),
                1_883_234_272_951_664,
                NOW.after_ms(30_000),
                1_795_992_157_904,
                42,
                addr,
                owner.map(Into::into),
            );
            let (cmd, args) = collect(
                Change::Add {
                    mode,
                    holder: &h,
                    floor: h.fence + 5,
                },
                NOW,
            );
            assert_eq!(cmd, "LOCK.REPL");
            assert!(!args.iter().any(|a| a.windows(3).any(|w| w == b"tok")));
            // Applied later on another server: the same 30 s from its own now.
            let there = Clock {
                mono: 17,
                wall: NOW.wall + 999_999,
            };
            let back = decode(&slices(&args), there).unwrap();
            let mut want = h.clone();
            want.deadline = there.after_ms(30_000);
            assert_eq!(
                back,
                ReplCmd::Add {
                    mode,
                    holder: want,
                    floor: h.fence + 5
                }
            );
        }
    }

    #[test]
    fn each_change_is_one_argument_and_the_old_form_still_decodes() {
        let h = Holder::new(
            digest(b"tok"),
            77,
            NOW.after_ms(30_000),
            1_795_992_157_904,
            42,
            Addr::V4([10, 0, 0, 1], 6379),
            None,
        );
        let changes = [
            Change::Add {
                mode: Mode::Counted(MAX_LIMIT),
                holder: &h,
                floor: 0,
            },
            Change::Renew {
                fence: 77,
                deadline: NOW.after_ms(5_000),
                floor: 0,
            },
            Change::Drop { fence: 77 },
            Change::Delay {
                until: NOW.after_ms(250),
            },
        ];
        for (c, op) in changes.iter().zip(["ADD", "RENEW", "DROP", "DELAY"]) {
            let (cmd, args) = collect(*c, NOW);
            assert_eq!(cmd, "LOCK.REPL");
            assert_eq!(args.len(), 1, "{op}: {args:?}");
            let packed = args[0].strip_prefix(format!("{op};").as_bytes());
            let packed = packed.unwrap_or_else(|| panic!("{op}: {:?}", args[0]));
            let new = decode(&slices(&args), NOW).unwrap();
            // What the builds before wrote: the op word as an argument of its own.
            let old = decode(&[op.as_bytes(), packed], NOW).unwrap();
            assert_eq!(new, old, "{op}");
        }
        // Options follow the packed argument as before.
        let (_, args) = collect(
            Change::Renew {
                fence: 77,
                deadline: NOW.after_ms(5_000),
                floor: 90,
            },
            NOW,
        );
        assert_eq!(slices(&args)[1..], [&b"FLOOR"[..], b"90"]);
        assert_eq!(
            decode(&slices(&args), NOW).unwrap(),
            decode(&[b"RENEW", &args[0][6..], b"FLOOR", b"90"], NOW).unwrap()
        );
        // An op this release does not know is refused in either form.
        for bad in [
            &[&b"GRAB;77"[..]][..],
            &[b"GRAB", b"77"],
            &[b";77"],
            &[b"77"],
        ] {
            assert!(decode(bad, NOW).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn digits_are_counted_like_std() {
        let mut vs = vec![0u64, 1, 9, u64::MAX];
        for p in 0..20 {
            let x = 10u64.pow(p);
            vs.extend([x - 1, x, x + 1]);
        }
        for v in vs {
            assert_eq!(decimal_digits(v), v.to_string().len(), "{v}");
        }
    }

    #[test]
    fn numbers_format_like_std() {
        for v in [
            0i64,
            7,
            -7,
            10,
            99,
            100,
            101,
            1_883_234_272_951_664_640,
            i64::MAX,
            i64::MIN,
            -1,
        ] {
            let mut p = Packed::new();
            p.i64(v);
            assert_eq!(p.bytes(), v.to_string().as_bytes());
        }
        for a in [
            Addr::V4([10, 0, 255, 1], 65535),
            Addr::V6([0; 16], 1),
            Addr::Text(vec![b'x'; 300].into()),
            Addr::None,
        ] {
            let mut p = Packed::new();
            p.put(b"prefix;").addr(&a);
            assert_eq!(p.bytes(), format!("prefix;{a}").as_bytes());
        }
        // Past the buffer, everything goes on in the spill.
        for fill in [140, 150, 158, 159, 160, 170] {
            let mut p = Packed::new();
            p.put(&vec![b'f'; fill])
                .sep()
                .u64(u64::MAX)
                .sep()
                .i64(-1234)
                .sep()
                .hex(&[0xab; 16]);
            let want = format!(
                "{};{};-1234;{}",
                "f".repeat(fill),
                u64::MAX,
                "ab".repeat(16)
            );
            assert_eq!(p.bytes(), want.as_bytes(), "{fill}");
        }
    }

    #[test]
    fn renews_drops_and_the_old_forms() {
        let (_, args) = collect(
            Change::Renew {
                fence: 9,
                deadline: NOW.after_ms(100),
                floor: 50,
            },
            NOW,
        );
        assert_eq!(
            decode(&slices(&args), NOW).unwrap(),
            ReplCmd::Renew {
                fence: 9,
                deadline: NOW.after_ms(100),
                floor: 50
            }
        );
        let (_, args) = collect(Change::Drop { fence: 77 }, NOW);
        assert_eq!(
            decode(&slices(&args), NOW).unwrap(),
            ReplCmd::Drop { fence: 77 }
        );
        assert_eq!(collect(Change::Delete, NOW).0, "DEL");
        assert_eq!(
            collect(Change::ClassicExpireAt(5), NOW).1,
            vec![b"5".to_vec()]
        );
        // 0.2's absolute forms.
        let at = (NOW.wall + 2000).to_string();
        let grant = format!("shared;00112233445566778899aabbccddeeff;5;{at};9;1;127.0.0.1:1");
        match decode(&[b"GRANT", grant.as_bytes()], NOW).unwrap() {
            ReplCmd::Add { mode, holder, .. } => {
                assert_eq!(mode, Mode::Shared);
                assert_eq!(holder.deadline, NOW.after_ms(2000));
            }
            other => panic!("{other:?}"),
        }
        let lease = format!("5;{at}");
        assert!(matches!(
            decode(&[b"LEASE", lease.as_bytes()], NOW).unwrap(),
            ReplCmd::Renew { fence: 5, .. }
        ));
        // 0.1's LOCK.SYNC.
        let h = Holder::new(
            digest(b"t"),
            3,
            NOW.after_ms(5000),
            1,
            2,
            Addr::None,
            Some(b"o".to_vec().into()),
        );
        let args = encode_sync(b"t", &h, NOW);
        match decode_sync(&slices(&args), NOW).unwrap() {
            ReplCmd::Add { holder, .. } => {
                assert_eq!(
                    (holder.digest, holder.fence, holder.owner()),
                    (h.digest, 3, h.owner())
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn session_changes_round_trip_in_both_forms() {
        use crate::engine::SessionApply;
        let d = [0xab; 16];
        let deadline = NOW.after_ms(4_000);
        let owner = Some(&b"svc;a b"[..]);
        let cases = [
            (
                SessionChange::Open {
                    digest: &d,
                    ttl: 10_000,
                    deadline,
                    owner,
                },
                SessionApply::Open {
                    digest: d,
                    ttl: 10_000,
                    deadline,
                    owner: owner.map(Into::into),
                },
            ),
            (
                SessionChange::Seen {
                    digest: &d,
                    ttl: 10_000,
                    deadline,
                    owner: None,
                },
                SessionApply::Seen {
                    digest: d,
                    ttl: 10_000,
                    deadline,
                    owner: None,
                },
            ),
            (
                SessionChange::Renew {
                    digest: &d,
                    ttl: 10_000,
                    deadline,
                },
                SessionApply::Renew {
                    digest: d,
                    ttl: 10_000,
                    deadline,
                },
            ),
            (
                SessionChange::End { digest: &d },
                SessionApply::End { digest: d },
            ),
            (
                SessionChange::Moved { digest: &d },
                SessionApply::Moved { digest: d },
            ),
        ];
        for (change, want) in cases {
            let mut sent = Vec::new();
            encode_session(&change, NOW, &mut |cmd, args| {
                assert_eq!(cmd, c"LOCK.SREPL");
                sent = args.iter().map(|a| a.to_vec()).collect::<Vec<_>>();
            });
            // One argument, and an OWNER pair only with a label.
            assert_eq!(sent.len(), if owner_of(&want) { 3 } else { 1 }, "{sent:?}");
            assert_eq!(decode_session(&slices(&sent), NOW).unwrap(), want);
            // What the builds before wrote: every field an argument of its own.
            let mut old: Vec<&[u8]> = sent[0].split(|&b| b == b';').collect();
            old.extend(sent[1..].iter().map(Vec::as_slice));
            assert_eq!(decode_session(&old, NOW).unwrap(), want, "{old:?}");
        }
        let moved = hex(&d);
        assert!(decode_session(&[b"MOVED"], NOW).is_err());
        assert!(decode_session(&[b"MOVED;"], NOW).is_err());
        assert!(decode_session(&[b"MOVED", &moved, b"x"], NOW).is_err());
        assert!(decode_session(&[&[b"MOVED;", &moved[..], b";x"].concat()], NOW).is_err());
        assert!(decode_session(&[b"RENEW;", b"OWNER", b"o"], NOW).is_err());
    }

    fn owner_of(a: &crate::engine::SessionApply) -> bool {
        matches!(
            a,
            crate::engine::SessionApply::Open { owner: Some(_), .. }
                | crate::engine::SessionApply::Seen { owner: Some(_), .. }
        )
    }

    #[test]
    fn malformed_changes_are_refused() {
        for bad in [
            &[&b"ADD"[..], b"shared;0011;5;10;9;1;a"][..],
            &[b"ADD", b"nope;00112233445566778899aabbccddeeff;5;10;9;1;a"],
            &[
                b"ADD",
                b"limit=0;00112233445566778899aabbccddeeff;5;10;9;1;a",
            ],
            &[
                b"ADD",
                b"exclusive;00112233445566778899aabbccddeeff;0;10;9;1;a",
            ],
            &[b"ADD", b"exclusive;00112233445566778899aabbccddeeff;5;10;9"],
            &[
                b"ADD",
                b"exclusive;00112233445566778899AABBCCDDEEFF;5;10;9;1;a",
            ],
            &[b"RENEW", b"5"],
            &[b"RENEW", b"5;x"],
            &[b"DROP", b"0"],
            &[b"DROP"],
            &[b"FOO", b"1"],
            &[b"RENEW", b"5;10", b"OWNER", b"o"],
        ] {
            assert!(decode(bad, NOW).is_err(), "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn decoding_never_panics(args in proptest::collection::vec(
            proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 0..6)) {
            let s: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
            let _ = decode(&s, NOW);
            let _ = decode_sync(&s, NOW);
            let _ = decode_session(&s, NOW);
        }

        /// Changes built from the words the forms are made of (op words, modes, options,
        /// digests, numbers at the edges, addresses with a `;`), joined by `;` into the
        /// first argument: never a panic, and whatever the packed form reads as, the form
        /// with the op word (LOCK.REPL) or every field (LOCK.SREPL) as arguments of their
        /// own reads the same.
        #[test]
        fn packed_and_split_forms_read_alike(
            first in proptest::collection::vec(0..WORDS.len(), 1..10),
            rest in proptest::collection::vec(0..WORDS.len(), 0..5),
        ) {
            let packed = first.iter().map(|&i| WORDS[i]).collect::<Vec<_>>().join(";");
            let mut args: Vec<&[u8]> = vec![packed.as_bytes()];
            args.extend(rest.iter().map(|&i| WORDS[i].as_bytes()));
            let (new, session) = (decode(&args, NOW), decode_session(&args, NOW));
            if let Some((op, fields)) = packed.split_once(';') {
                let mut old: Vec<&[u8]> = vec![op.as_bytes(), fields.as_bytes()];
                old.extend_from_slice(&args[1..]);
                proptest::prop_assert_eq!(&new, &decode(&old, NOW));
                let mut old: Vec<&[u8]> = packed.split(';').map(str::as_bytes).collect();
                old.extend_from_slice(&args[1..]);
                proptest::prop_assert_eq!(&session, &decode_session(&old, NOW));
            }
        }
    }

    const WORDS: &[&str] = &[
        "ADD",
        "RENEW",
        "DROP",
        "DELAY",
        "GRANT",
        "LEASE",
        "OPEN",
        "SEEN",
        "END",
        "MOVED",
        "add",
        "OWNER",
        "FLOOR",
        "LOCKDELAY",
        "SESSION",
        "exclusive",
        "shared",
        "limit=3",
        "limit=0",
        "00112233445566778899aabbccddeeff",
        "0",
        "1",
        "-1",
        "60000",
        "9223372036854775807",
        "18446744073709551616",
        "",
        "127.0.0.1:1",
        "/a;b",
        ";",
    ];
}
