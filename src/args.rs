//! Pure argument parsing for every command: `&[&[u8]]` in, a typed request out.
//! Knows nothing of Redis; the slices are the arguments after the command name and key.

use crate::engine::value::{Addr, Digest, Holder, Mode};
use crate::error::LockError;

/// Longest TOKEN and OWNER accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;
pub const MAX_OWNER_LEN: usize = 256;
/// Fences are replied as signed 64-bit integers; keep one value of head-room for `+1`.
pub const MAX_FENCE: u64 = i64::MAX as u64 - 1;
/// The largest `LIMIT` (permits of a counted lock).
pub const MAX_LIMIT: u32 = 1_000_000;
/// Longest client address kept from a replicated or loaded value.
pub const MAX_ADDR_LEN: usize = 128;

/// The configuration values the parser needs to resolve defaults and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub default_ttl: u64,
    pub max_ttl: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire<'a> {
    /// Exclusive (no option), `SHARED`, or `LIMIT n`.
    pub mode: Mode,
    /// Lease length in ms, already checked against `1..=max_ttl`.
    pub ttl: u64,
    pub token: Option<&'a [u8]>,
    pub owner: Option<&'a [u8]>,
    /// `Some(0)` waits without limit.
    pub block: Option<u64>,
    /// Lowest fence this grant may carry (0: no floor). Used by quorum clients.
    pub min_fence: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extend<'a> {
    pub token: &'a [u8],
    pub ttl: u64,
}

/// The full state of a lock, as the primary sends it to replicas and the AOF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sync<'a> {
    pub token: &'a [u8],
    pub fence: u64,
    pub expires_at: i64,
    pub acquired_at: i64,
    pub client_id: u64,
    pub client_addr: &'a [u8],
    pub owner: Option<&'a [u8]>,
    /// The primary's fence counter when it is above this lock's fence (0: not sent).
    pub floor: u64,
}

/// Parses a base-10 signed 64-bit integer the way Redis does: no sign other than a
/// leading `-`, no spaces, no leading zeros, no overflow.
pub fn parse_i64(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    if digits.len() > 1 && digits[0] == b'0' {
        return None;
    }
    if neg && digits == b"0" {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let digit = i64::from(d - b'0');
        v = v.checked_mul(10)?;
        v = if neg {
            v.checked_sub(digit)?
        } else {
            v.checked_add(digit)?
        };
    }
    Some(v)
}

fn ttl_ms(value: &[u8], unit_ms: i64, max_ttl: u64, cmd: &'static str) -> Result<u64, LockError> {
    let n = parse_i64(value).ok_or(LockError::NotInteger)?;
    if n <= 0 {
        return Err(LockError::InvalidExpire(cmd));
    }
    let ms = n
        .checked_mul(unit_ms)
        .ok_or(LockError::InvalidExpire(cmd))?;
    let ms = u64::try_from(ms).map_err(|_| LockError::InvalidExpire(cmd))?;
    if ms > max_ttl {
        return Err(LockError::InvalidExpire(cmd));
    }
    Ok(ms)
}

fn bounded<'a>(value: &'a [u8], what: &'static str, max: usize) -> Result<&'a [u8], LockError> {
    if value.is_empty() || value.len() > max {
        return Err(LockError::BadLength { what, max });
    }
    Ok(value)
}

fn show(opt: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(opt).chars().take(32).collect();
    shown.replace(['\r', '\n'], " ")
}

/// Walks options: `NAME value` pairs, and bare flags (names listed in `flags`),
/// rejecting unknown and repeated options. PX and EX are one setting.
fn options<'a>(
    args: &[&'a [u8]],
    known: &[&'static str],
    flags: &[&'static str],
    mut handle: impl FnMut(&'static str, &'a [u8]) -> Result<(), LockError>,
) -> Result<(), LockError> {
    let mut seen = 0u32;
    let mut i = 0;
    while i < args.len() {
        let opt = args[i];
        let idx = known
            .iter()
            .position(|k| k.as_bytes().eq_ignore_ascii_case(opt))
            .ok_or_else(|| LockError::Syntax(format!("unknown option '{}'", show(opt))))?;
        let name = known[idx];
        let slot = if name == "EX" {
            known.iter().position(|k| *k == "PX").unwrap_or(idx)
        } else {
            idx
        };
        if seen & (1 << slot) != 0 {
            return Err(LockError::Syntax(format!(
                "option '{name}' given twice (or both PX and EX)"
            )));
        }
        seen |= 1 << slot;
        if flags.contains(&name) {
            handle(name, b"")?;
            i += 1;
            continue;
        }
        let value = args
            .get(i + 1)
            .ok_or_else(|| LockError::Syntax(format!("option '{name}' needs a value")))?;
        handle(name, value)?;
        i += 2;
    }
    Ok(())
}

fn positive_fence(v: &[u8], err: LockError) -> Result<u64, LockError> {
    match parse_i64(v) {
        Some(n) if n >= 1 && n as u64 <= MAX_FENCE => Ok(n as u64),
        _ => Err(err),
    }
}

/// The BLOCK deadline in unix ms (None: wait without limit). A wait the server cannot
/// schedule (its timer adds the time in microseconds to the clock) is refused, as
/// BLPOP refuses such timeouts.
pub fn block_deadline(now_ms: i64, block_ms: u64) -> Result<Option<i64>, LockError> {
    if block_ms == 0 {
        return Ok(None);
    }
    let ms = i64::try_from(block_ms).map_err(|_| LockError::BlockOutOfRange)?;
    let at = now_ms.checked_add(ms).ok_or(LockError::BlockOutOfRange)?;
    // The timer works in microseconds; keep a day of head-room on top.
    at.checked_add(24 * 3600 * 1000)
        .and_then(|t| t.checked_mul(1000))
        .ok_or(LockError::BlockOutOfRange)?;
    Ok(Some(at))
}

/// `LOCK.ACQUIRE key [SHARED | LIMIT n] [PX ms | EX s] [TOKEN t] [OWNER o] [BLOCK ms] [MINFENCE n]`
pub fn parse_acquire<'a>(args: &[&'a [u8]], lim: &Limits) -> Result<Acquire<'a>, LockError> {
    const CMD: &str = "lock.acquire";
    let mut req = Acquire {
        mode: Mode::Exclusive,
        ttl: 0,
        token: None,
        owner: None,
        block: None,
        min_fence: 0,
    };
    let mut ttl = None;
    let mut kinds = 0;
    options(
        args,
        &[
            "PX", "EX", "TOKEN", "OWNER", "BLOCK", "MINFENCE", "SHARED", "LIMIT",
        ],
        &["SHARED"],
        |name, v| {
            match name {
                "PX" => ttl = Some(ttl_ms(v, 1, lim.max_ttl, CMD)?),
                "EX" => ttl = Some(ttl_ms(v, 1000, lim.max_ttl, CMD)?),
                "TOKEN" => req.token = Some(bounded(v, "TOKEN", MAX_TOKEN_LEN)?),
                "OWNER" => req.owner = Some(bounded(v, "OWNER", MAX_OWNER_LEN)?),
                "BLOCK" => {
                    let n = parse_i64(v).ok_or(LockError::InvalidTimeout(
                        "is not an integer or out of range",
                    ))?;
                    if n < 0 {
                        return Err(LockError::InvalidTimeout("is negative"));
                    }
                    req.block = Some(n as u64);
                }
                "SHARED" => {
                    kinds += 1;
                    req.mode = Mode::Shared;
                }
                "LIMIT" => {
                    kinds += 1;
                    let n = parse_i64(v)
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or(LockError::InvalidLimit)?;
                    req.mode = Mode::Counted(n);
                }
                _ => req.min_fence = positive_fence(v, LockError::InvalidFence)?,
            }
            Ok(())
        },
    )?;
    if kinds > 1 {
        return Err(LockError::Syntax(
            "SHARED and LIMIT exclude each other".into(),
        ));
    }
    req.ttl = match ttl {
        Some(t) => t,
        None => default_ttl(lim, CMD)?,
    };
    Ok(req)
}

fn default_ttl(lim: &Limits, cmd: &'static str) -> Result<u64, LockError> {
    // The configs are checked against each other when set; this guards the window
    // where a loadmodule argument and a config-file line disagree.
    if lim.default_ttl == 0 || lim.default_ttl > lim.max_ttl {
        return Err(LockError::InvalidExpire(cmd));
    }
    Ok(lim.default_ttl)
}

/// `LOCK.RELEASE key token`
pub fn parse_release<'a>(args: &[&'a [u8]]) -> Result<&'a [u8], LockError> {
    match args {
        [token] => Ok(token),
        _ => Err(LockError::WrongArity("lock.release")),
    }
}

/// `LOCK.EXTEND key token [PX ms | EX s]`
pub fn parse_extend<'a>(args: &[&'a [u8]], lim: &Limits) -> Result<Extend<'a>, LockError> {
    const CMD: &str = "lock.extend";
    let (token, rest) = args.split_first().ok_or(LockError::WrongArity(CMD))?;
    let mut ttl = None;
    options(rest, &["PX", "EX"], &[], |name, v| {
        let unit = if name == "PX" { 1 } else { 1000 };
        ttl = Some(ttl_ms(v, unit, lim.max_ttl, CMD)?);
        Ok(())
    })?;
    let ttl = match ttl {
        Some(t) => t,
        None => default_ttl(lim, CMD)?,
    };
    Ok(Extend { token, ttl })
}

impl Sync<'_> {
    /// The holder it describes; the token is kept only as its digest.
    pub fn holder(&self) -> Holder {
        Holder::new(
            crate::engine::value::digest(self.token),
            self.fence,
            self.expires_at,
            self.acquired_at,
            self.client_id,
            Addr::parse(self.client_addr),
            self.owner.map(Into::into),
        )
    }
}

/// `LOCK.SYNC key token fence expires-at acquired-at client-id client-addr [OWNER o] [FLOOR n]`
pub fn parse_sync<'a>(args: &[&'a [u8]]) -> Result<Sync<'a>, LockError> {
    const CMD: &str = "lock.sync";
    if args.len() < 6 {
        return Err(LockError::WrongArity(CMD));
    }
    let int = |i: usize| parse_i64(args[i]).ok_or(LockError::NotInteger);
    let fence = int(1)?;
    if fence < 1 || fence as u64 > MAX_FENCE {
        return Err(LockError::InvalidFence);
    }
    let client_id = int(4)?;
    let mut s = Sync {
        token: bounded(args[0], "TOKEN", MAX_TOKEN_LEN)?,
        fence: fence as u64,
        expires_at: int(2)?,
        acquired_at: int(3)?,
        client_id: u64::try_from(client_id).map_err(|_| LockError::NotInteger)?,
        client_addr: args[5],
        owner: None,
        floor: 0,
    };
    options(&args[6..], &["OWNER", "FLOOR"], &[], |name, v| {
        if name == "OWNER" {
            s.owner = Some(bounded(v, "OWNER", MAX_OWNER_LEN)?);
        } else {
            s.floor = positive_fence(v, LockError::InvalidFence)?;
        }
        Ok(())
    })?;
    Ok(s)
}

/// `LOCK.FORCERELEASE key [FENCE f]`: None removes every holder.
pub fn parse_forcerelease(args: &[&[u8]]) -> Result<Option<u64>, LockError> {
    let mut fence = None;
    options(args, &["FENCE"], &[], |_, v| {
        fence = Some(positive_fence(v, LockError::InvalidFenceArg)?);
        Ok(())
    })?;
    Ok(fence)
}

// ---- LOCK.REPL: what a primary sends to replicas and the AOF ---------------------------
//
//   LOCK.REPL key GRANT <mode>;<digest>;<fence>;<expires-at>;<acquired-at>;<client-id>;<addr> [OWNER o] [FLOOR n]
//   LOCK.REPL key LEASE <fence>;<expires-at> [FLOOR n]
//   LOCK.REPL key DROP <fence>
//
// mode is `exclusive`, `shared` or `limit=<n>`; digest is 32 hex digits. One packed
// argument per change keeps the stream cheap to build and still readable in an AOF.

/// A parsed LOCK.REPL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplCmd {
    Grant {
        mode: Mode,
        holder: Holder,
        floor: u64,
    },
    Lease {
        fence: u64,
        expires_at: i64,
        floor: u64,
    },
    Drop {
        fence: u64,
    },
}

pub fn mode_text(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "exclusive".into(),
        Mode::Shared => "shared".into(),
        Mode::Counted(n) => format!("limit={n}"),
    }
}

fn parse_mode(v: &[u8]) -> Option<Mode> {
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

pub fn hex(d: &Digest) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, b) in d.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 15)];
    }
    out
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

fn bad_repl() -> LockError {
    LockError::Syntax("malformed LOCK.REPL".into())
}

/// `args`: everything after the key.
pub fn parse_repl(args: &[&[u8]]) -> Result<ReplCmd, LockError> {
    let (op, rest) = match args {
        [op, packed, rest @ ..] => (*op, (*packed, rest)),
        _ => return Err(LockError::WrongArity("lock.repl")),
    };
    let (packed, opts) = rest;
    let mut floor = 0;
    let mut owner = None;
    let allowed: &[&str] = match op {
        b"GRANT" => &["OWNER", "FLOOR"],
        b"LEASE" => &["FLOOR"],
        _ => &[],
    };
    options(opts, allowed, &[], |name, v| {
        if name == "OWNER" {
            owner = Some(bounded(v, "OWNER", MAX_OWNER_LEN)?);
        } else {
            floor = positive_fence(v, LockError::InvalidFence)?;
        }
        Ok(())
    })?;
    let int = |v: &[u8]| parse_i64(v).ok_or_else(bad_repl);
    let fence = |v: &[u8]| positive_fence(v, LockError::InvalidFence);
    match op {
        b"GRANT" => {
            let mut f = packed.splitn(7, |&b| b == b';');
            let mut next = || f.next().ok_or_else(bad_repl);
            let mode = parse_mode(next()?).ok_or_else(bad_repl)?;
            let digest = unhex(next()?).ok_or_else(bad_repl)?;
            let fence = fence(next()?)?;
            let expires_at = int(next()?)?;
            let acquired_at = int(next()?)?;
            let client_id = u64::try_from(int(next()?)?).map_err(|_| bad_repl())?;
            let addr = next()?;
            if addr.len() > MAX_ADDR_LEN {
                return Err(bad_repl());
            }
            Ok(ReplCmd::Grant {
                mode,
                holder: Holder::new(
                    digest,
                    fence,
                    expires_at,
                    acquired_at,
                    client_id,
                    Addr::parse(addr),
                    owner.map(Into::into),
                ),
                floor,
            })
        }
        b"LEASE" => {
            let (f, e) = split_once(packed, b';').ok_or_else(bad_repl)?;
            Ok(ReplCmd::Lease {
                fence: fence(f)?,
                expires_at: int(e)?,
                floor,
            })
        }
        b"DROP" => Ok(ReplCmd::Drop {
            fence: fence(packed)?,
        }),
        _ => Err(bad_repl()),
    }
}

fn split_once(v: &[u8], sep: u8) -> Option<(&[u8], &[u8])> {
    let i = v.iter().position(|&b| b == sep)?;
    Some((&v[..i], &v[i + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIM: Limits = Limits {
        default_ttl: 30_000,
        max_ttl: 86_400_000,
    };

    fn acq(args: &[&str]) -> Result<Acquire<'static>, LockError> {
        let owned: Vec<&'static [u8]> = args
            .iter()
            .map(|s| &*Box::leak(s.as_bytes().to_vec().into_boxed_slice()))
            .collect();
        parse_acquire(&owned, &LIM)
    }

    #[test]
    fn integers_follow_redis_rules() {
        assert_eq!(parse_i64(b"0"), Some(0));
        assert_eq!(parse_i64(b"-5"), Some(-5));
        assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1 ",
            b"01",
            b"-0",
            b"1.5",
            b"9223372036854775808",
            b"12a",
        ] {
            assert_eq!(parse_i64(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn acquire_defaults_and_options() {
        let r = acq(&[]).unwrap();
        assert_eq!(r.ttl, 30_000);
        assert_eq!(
            (r.token, r.owner, r.block, r.min_fence),
            (None, None, None, 0)
        );
        let r = acq(&[
            "ex", "2", "Token", "t1", "OWNER", "srv", "block", "0", "MINFENCE", "7",
        ])
        .unwrap();
        assert_eq!(r.ttl, 2000);
        assert_eq!(r.token, Some(&b"t1"[..]));
        assert_eq!(r.owner, Some(&b"srv"[..]));
        assert_eq!(r.block, Some(0));
        assert_eq!(r.min_fence, 7);
    }

    #[test]
    fn acquire_errors() {
        let inv = LockError::InvalidExpire("lock.acquire");
        assert_eq!(acq(&["PX", "0"]), Err(inv.clone()));
        assert_eq!(acq(&["PX", "-1"]), Err(inv.clone()));
        assert_eq!(acq(&["PX", "86400001"]), Err(inv.clone()));
        assert_eq!(acq(&["EX", "86401"]), Err(inv.clone()));
        assert_eq!(acq(&["EX", "9223372036854775807"]), Err(inv));
        assert_eq!(acq(&["PX", "x"]), Err(LockError::NotInteger));
        assert!(matches!(
            acq(&["PX", "1", "EX", "1"]),
            Err(LockError::Syntax(_))
        ));
        assert!(matches!(
            acq(&["PX", "1", "PX", "1"]),
            Err(LockError::Syntax(_))
        ));
        assert!(matches!(acq(&["NX"]), Err(LockError::Syntax(_))));
        assert!(matches!(acq(&["PX"]), Err(LockError::Syntax(_))));
        assert!(matches!(
            acq(&["TOKEN", ""]),
            Err(LockError::BadLength { .. })
        ));
        let long = "a".repeat(257);
        assert!(matches!(
            acq(&["OWNER", &long]),
            Err(LockError::BadLength { .. })
        ));
        assert!(acq(&["TOKEN", &"a".repeat(256)]).is_ok());
        assert_eq!(
            acq(&["BLOCK", "-1"]),
            Err(LockError::InvalidTimeout("is negative"))
        );
        assert!(matches!(
            acq(&["BLOCK", "1x"]),
            Err(LockError::InvalidTimeout(_))
        ));
        assert_eq!(acq(&["MINFENCE", "0"]), Err(LockError::InvalidFence));
    }

    #[test]
    fn default_ttl_above_max_is_refused() {
        let lim = Limits {
            default_ttl: 10,
            max_ttl: 5,
        };
        assert_eq!(
            parse_acquire(&[], &lim),
            Err(LockError::InvalidExpire("lock.acquire"))
        );
    }

    #[test]
    fn release_and_extend() {
        assert_eq!(parse_release(&[b"t"]), Ok(&b"t"[..]));
        assert!(parse_release(&[]).is_err());
        assert!(parse_release(&[b"t", b"u"]).is_err());
        let e = parse_extend(&[b"t", b"EX", b"3"], &LIM).unwrap();
        assert_eq!((e.token, e.ttl), (&b"t"[..], 3000));
        assert_eq!(parse_extend(&[b"t"], &LIM).unwrap().ttl, 30_000);
        assert!(parse_extend(&[], &LIM).is_err());
        assert!(parse_extend(&[b"t", b"TOKEN", b"x"], &LIM).is_err());
    }

    #[test]
    fn sync_round_trip() {
        let s = parse_sync(&[
            b"tok",
            b"42",
            b"1000",
            b"900",
            b"7",
            b"127.0.0.1:1",
            b"OWNER",
            b"o",
        ])
        .unwrap();
        assert_eq!(s.fence, 42);
        assert_eq!(s.owner, Some(&b"o"[..]));
        assert_eq!(s.floor, 0);
        let s = parse_sync(&[b"tok", b"42", b"1000", b"900", b"7", b"a", b"FLOOR", b"99"]).unwrap();
        assert_eq!((s.owner, s.floor), (None, 99));
        assert!(parse_sync(&[b"tok", b"42", b"1000", b"900", b"7", b"a", b"o"]).is_err());
        assert!(parse_sync(&[b"tok", b"42", b"1000", b"900", b"7", b"a", b"FLOOR", b"0"]).is_err());
        assert!(parse_sync(&[b"tok", b"0", b"1", b"1", b"1", b"a"]).is_err());
        assert!(parse_sync(&[b"tok", b"1", b"1", b"1", b"-1", b"a"]).is_err());
    }

    #[test]
    fn kinds_of_lock() {
        assert_eq!(acq(&[]).unwrap().mode, Mode::Exclusive);
        assert_eq!(acq(&["shared"]).unwrap().mode, Mode::Shared);
        assert_eq!(
            acq(&["PX", "5", "SHARED", "BLOCK", "0"]).unwrap().mode,
            Mode::Shared
        );
        assert_eq!(acq(&["LIMIT", "3"]).unwrap().mode, Mode::Counted(3));
        assert_eq!(
            acq(&["LIMIT", "1000000"]).unwrap().mode,
            Mode::Counted(MAX_LIMIT)
        );
        for bad in [
            &["LIMIT", "0"][..],
            &["LIMIT", "1000001"],
            &["LIMIT", "-2"],
            &["LIMIT", "x"],
        ] {
            assert_eq!(acq(bad), Err(LockError::InvalidLimit), "{bad:?}");
        }
        assert!(matches!(acq(&["LIMIT"]), Err(LockError::Syntax(_))));
        assert!(matches!(
            acq(&["SHARED", "LIMIT", "2"]),
            Err(LockError::Syntax(_))
        ));
        assert!(matches!(
            acq(&["SHARED", "SHARED"]),
            Err(LockError::Syntax(_))
        ));
    }

    #[test]
    fn forcerelease_fence() {
        assert_eq!(parse_forcerelease(&[]), Ok(None));
        assert_eq!(parse_forcerelease(&[b"fence", b"42"]), Ok(Some(42)));
        assert_eq!(
            parse_forcerelease(&[b"FENCE", b"0"]),
            Err(LockError::InvalidFenceArg)
        );
        assert!(parse_forcerelease(&[b"FENCE"]).is_err());
        assert!(parse_forcerelease(&[b"FENCE", b"1", b"FENCE", b"2"]).is_err());
        assert!(parse_forcerelease(&[b"x"]).is_err());
    }

    #[test]
    fn block_deadlines_must_be_schedulable() {
        let now = 1_800_000_000_000;
        assert_eq!(block_deadline(now, 0), Ok(None));
        assert_eq!(block_deadline(now, 5), Ok(Some(now + 5)));
        assert!(block_deadline(now, 100_000_000_000).is_ok());
        for bad in [
            u64::MAX,
            i64::MAX as u64,
            18_000_000_000_000_000,
            9_223_372_036_854_775,
        ] {
            assert_eq!(
                block_deadline(now, bad),
                Err(LockError::BlockOutOfRange),
                "{bad}"
            );
        }
    }

    #[test]
    fn repl_parsing_refuses_what_it_cannot_apply() {
        let ok: &[&[u8]] = &[
            b"GRANT",
            b"shared;00112233445566778899aabbccddeeff;5;10;9;1;127.0.0.1:1",
        ];
        assert!(matches!(
            parse_repl(ok),
            Ok(ReplCmd::Grant {
                mode: Mode::Shared,
                ..
            })
        ));
        for bad in [
            &[&b"GRANT"[..], b"shared;0011;5;10;9;1;a"][..],
            &[
                b"GRANT",
                b"nope;00112233445566778899aabbccddeeff;5;10;9;1;a",
            ],
            &[
                b"GRANT",
                b"limit=0;00112233445566778899aabbccddeeff;5;10;9;1;a",
            ],
            &[
                b"GRANT",
                b"exclusive;00112233445566778899aabbccddeeff;0;10;9;1;a",
            ],
            &[
                b"GRANT",
                b"exclusive;00112233445566778899aabbccddeeff;5;10;9",
            ],
            &[
                b"GRANT",
                b"exclusive;00112233445566778899AABBCCDDEEFF;5;10;9;1;a",
            ],
            &[b"LEASE", b"5"],
            &[b"LEASE", b"5;x"],
            &[b"DROP", b"0"],
            &[b"DROP"],
            &[b"FOO", b"1"],
            &[b"LEASE", b"5;10", b"OWNER", b"o"],
        ] {
            assert!(parse_repl(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn repl_parser_never_panics(args in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..40), 0..6)) {
            let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
            let _ = parse_repl(&slices);
            let _ = parse_forcerelease(&slices);
        }

        #[test]
        fn parse_i64_agrees_with_std_on_canonical_numbers(n in any::<i64>()) {
            prop_assert_eq!(parse_i64(n.to_string().as_bytes()), Some(n));
        }

        #[test]
        fn parser_never_panics(args in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..12), 0..10)) {
            let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
            let _ = parse_acquire(&slices, &LIM);
            let _ = parse_extend(&slices, &LIM);
            let _ = parse_release(&slices);
            let _ = parse_sync(&slices);
        }

        #[test]
        fn accepted_ttls_are_in_range(opt in prop_oneof![Just("PX"), Just("EX")],
                                      v in any::<i64>()) {
            let vs = v.to_string();
            if let Ok(r) = acq(&[opt, &vs]) {
                prop_assert!(r.ttl >= 1 && r.ttl <= LIM.max_ttl);
            }
        }

        #[test]
        fn option_order_does_not_matter(ttl in 1u64..100_000, swap in any::<bool>()) {
            let t = ttl.to_string();
            let a = if swap { acq(&["TOKEN", "x", "PX", &t]) } else { acq(&["PX", &t, "TOKEN", "x"]) };
            let a = a.unwrap();
            prop_assert_eq!(a.ttl, ttl);
            prop_assert_eq!(a.token, Some(&b"x"[..]));
        }
    }
}
