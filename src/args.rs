//! Pure argument parsing for every command: `&[&[u8]]` in, a typed request out.
//! Knows nothing of Redis; the slices are the arguments after the command name and key.

use crate::error::LockError;
use crate::lock::fence::MAX_FENCE;
use crate::lock::value::{Mode, MAX_LIMIT, MAX_OWNER_LEN, MAX_TOKEN_LEN};
use crate::syntax::{options, parse_i64, positive, walk};

fn positive_fence(v: &[u8], err: LockError) -> Result<u64, LockError> {
    positive(v, MAX_FENCE, err)
}

/// The configuration values the parser needs to resolve defaults and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub default_ttl: u64,
    pub max_ttl: u64,
    pub min_token_len: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire<'a> {
    /// Exclusive (no option), `SHARED`, or `LIMIT n`.
    pub mode: Mode,
    /// Lease length in ms, already checked against `1..=max_ttl`.
    pub ttl: u64,
    pub token: Option<&'a [u8]>,
    /// Where the token is among the arguments after the key (to redact it from logs).
    pub token_at: Option<usize>,
    pub owner: Option<&'a [u8]>,
    /// `Some(0)` waits without limit.
    pub block: Option<u64>,
    /// Lowest fence this grant may carry (0: no floor). Used by quorum clients.
    pub min_fence: u64,
    /// LOCKDELAY ms (None: the `lock.lock-delay` setting).
    pub lock_delay: Option<u32>,
    /// SESSION: the id of the session the grant is to belong to.
    pub session: Option<&'a [u8]>,
    /// Where the session id is among the arguments after the key (to redact it).
    pub session_at: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extend<'a> {
    pub token: &'a [u8],
    pub ttl: u64,
    /// OWNER: a new label for the holder (the term is kept).
    pub owner: Option<&'a [u8]>,
}

/// `LOCK.WATCH key [FENCE f [OWNER label]] [BLOCK ms]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch<'a> {
    /// Wait until this fence no longer holds the key (None: until anyone holds it).
    pub fence: Option<u64>,
    /// With FENCE: also answer when that holder's label is no longer this one.
    pub owner: Option<&'a [u8]>,
    /// BLOCK ms (None or `Some(0)`: wait without limit).
    pub block: Option<u64>,
}

/// `LOCK.INFO key [COUNT n] [AFTER fence] [WAITERS n]`: a page of the holder list, and
/// the first `waiters` waiters (0: no waiter list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Info {
    pub count: usize,
    pub after: u64,
    pub waiters: usize,
}

/// Holders LOCK.INFO shows when COUNT is not given, and the most it shows at once.
pub const INFO_COUNT: usize = 10;
pub const INFO_MAX_COUNT: usize = 1000;

fn ttl_ms(value: &[u8], unit_ms: i64, max_ttl: u64, cmd: &'static str) -> Result<u64, LockError> {
    let n = parse_i64(value).ok_or(LockError::NotInteger)?;
    if n <= 0 {
        return Err(LockError::InvalidExpire(cmd));
    }
    let ms = n
        .checked_mul(unit_ms)
        .and_then(|ms| u64::try_from(ms).ok())
        .ok_or(LockError::InvalidExpire(cmd))?;
    if ms > max_ttl {
        return Err(LockError::AboveMaxTtl {
            cmd,
            ms,
            max: max_ttl,
        });
    }
    Ok(ms)
}

fn bounded<'a>(
    value: &'a [u8],
    what: &'static str,
    min: usize,
    max: usize,
) -> Result<&'a [u8], LockError> {
    if value.len() < min.max(1) || value.len() > max {
        return Err(LockError::BadLength {
            what,
            min: min.max(1),
            max,
        });
    }
    Ok(value)
}

/// The BLOCK deadline on the monotonic clock, in µs (None: wait without limit). A wait
/// whose deadline cannot be represented with a day of head-room is refused, as BLPOP
/// refuses such timeouts.
pub fn block_deadline(now_us: i64, block_ms: u64) -> Result<Option<i64>, LockError> {
    if block_ms == 0 {
        return Ok(None);
    }
    let us = i64::try_from(block_ms)
        .ok()
        .and_then(|ms| ms.checked_mul(1000))
        .ok_or(LockError::BlockOutOfRange)?;
    let at = now_us.checked_add(us).ok_or(LockError::BlockOutOfRange)?;
    at.checked_add(24 * 3600 * 1_000_000)
        .and_then(|t| t.checked_mul(1000))
        .ok_or(LockError::BlockOutOfRange)?;
    Ok(Some(at))
}

/// The options of LOCK.ACQUIRE, most used first (the walk looks them up in order), and
/// what each one is, at the same index.
const ACQUIRE_OPTIONS: [&str; 10] = [
    "PX",
    "EX",
    "TOKEN",
    "OWNER",
    "BLOCK",
    "MINFENCE",
    "SHARED",
    "LIMIT",
    "LOCKDELAY",
    "SESSION",
];
const ACQUIRE_KINDS: [AcquireOpt; 10] = {
    use AcquireOpt::*;
    [
        Px, Ex, Token, Owner, Block, MinFence, Shared, Limit, LockDelay, Session,
    ]
};

/// Up to the first 8 bytes of `b` as a little-endian word with the case bit (0x20) of
/// every byte cleared: for a name of ASCII letters, equal words mean equal names without
/// regard to case (only a letter's two cases map onto a letter).
const fn folded(b: &[u8]) -> u64 {
    let mut w = 0u64;
    let mut i = 0;
    while i < b.len() && i < 8 {
        w |= ((b[i] & !0x20) as u64) << (8 * i);
        i += 1;
    }
    w
}

/// The index of a LOCK.ACQUIRE option in `ACQUIRE_OPTIONS` (all letters), without regard
/// to case: what `syntax::find_name` finds (a test checks), in a few instructions.
fn acquire_option(opt: &[u8]) -> Option<usize> {
    use AcquireOpt::*;
    const fn w(i: AcquireOpt) -> u64 {
        folded(ACQUIRE_OPTIONS[i as usize].as_bytes())
    }
    const PX: u64 = w(Px);
    const EX: u64 = w(Ex);
    const TOKEN: u64 = w(Token);
    const OWNER: u64 = w(Owner);
    const BLOCK: u64 = w(Block);
    const LIMIT: u64 = w(Limit);
    const SHARED: u64 = w(Shared);
    const MINFENCE: u64 = w(MinFence);
    const LOCKDELA: u64 = w(LockDelay);
    const SESSION: u64 = w(Session);
    let kind = match (opt.len(), folded(opt)) {
        (2, PX) => Px,
        (2, EX) => Ex,
        (5, TOKEN) => Token,
        (5, OWNER) => Owner,
        (5, BLOCK) => Block,
        (5, LIMIT) => Limit,
        (6, SHARED) => Shared,
        (7, SESSION) => Session,
        (8, MINFENCE) => MinFence,
        (9, LOCKDELA) if opt[8] & !0x20 == b'Y' => LockDelay,
        _ => return None,
    };
    Some(kind as usize)
}

/// In the order of `ACQUIRE_OPTIONS` (a test checks), so a variant's value is its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AcquireOpt {
    Px,
    Ex,
    Token,
    Owner,
    Block,
    MinFence,
    Shared,
    Limit,
    LockDelay,
    Session,
}

/// `LOCK.ACQUIRE key [SHARED | LIMIT n] [PX ms | EX s | SESSION id] [TOKEN t] [OWNER o] [BLOCK ms] [MINFENCE n] [LOCKDELAY ms]`
pub fn parse_acquire<'a>(args: &[&'a [u8]], lim: &Limits) -> Result<Acquire<'a>, LockError> {
    if let Some(req) = common_acquire(args, lim) {
        return Ok(req);
    }
    const CMD: &str = "lock.acquire";
    let mut req = Acquire::exclusive();
    let mut ttl = None;
    let mut kinds = 0;
    walk(
        args,
        &ACQUIRE_OPTIONS,
        acquire_option,
        1 << AcquireOpt::Shared as u32,
        |opt, v, at| {
            use AcquireOpt::*;
            match ACQUIRE_KINDS[opt] {
                Px => ttl = Some(ttl_ms(v, 1, lim.max_ttl, CMD)?),
                Ex => ttl = Some(ttl_ms(v, 1000, lim.max_ttl, CMD)?),
                Token => {
                    req.token = Some(bounded(v, "TOKEN", lim.min_token_len, MAX_TOKEN_LEN)?);
                    req.token_at = Some(at);
                }
                Owner => req.owner = Some(bounded(v, "OWNER", 1, MAX_OWNER_LEN)?),
                Block => req.block = Some(block_ms(v)?),
                Shared => {
                    kinds += 1;
                    req.mode = Mode::Shared;
                }
                Limit => {
                    kinds += 1;
                    let n = parse_i64(v)
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or(LockError::InvalidLimit(MAX_LIMIT))?;
                    req.mode = Mode::Counted(n);
                }
                LockDelay => {
                    let n = parse_i64(v).ok_or(LockError::NotInteger)?;
                    let ms = u32::try_from(n)
                        .ok()
                        .filter(|ms| u64::from(*ms) <= lim.max_ttl)
                        .ok_or(LockError::InvalidLockDelay)?;
                    req.lock_delay = Some(ms);
                }
                MinFence => req.min_fence = positive_fence(v, LockError::InvalidFence)?,
                Session => {
                    req.session = Some(bounded(v, "SESSION", lim.min_token_len, MAX_TOKEN_LEN)?);
                    req.session_at = Some(at);
                }
            }
            Ok(())
        },
    )?;
    if req.session.is_some() && ttl.is_some() {
        return Err(LockError::Syntax(
            "SESSION and PX/EX exclude each other: a lock taken in a session has the session's lease".into(),
        ));
    }
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

impl Acquire<'_> {
    /// An exclusive acquire with no option given (both parses start from it).
    fn exclusive() -> Self {
        Acquire {
            mode: Mode::Exclusive,
            ttl: 0,
            token: None,
            token_at: None,
            owner: None,
            block: None,
            min_fence: 0,
            lock_delay: None,
            session: None,
            session_at: None,
        }
    }
}

/// The forms most acquires take, `[TOKEN t] [PX ms]` in either order, valid as given: what
/// the general parse makes of them (a test checks), without its walk. None for anything
/// else, an invalid value included (the general parse then says what is wrong).
fn common_acquire<'a>(args: &[&'a [u8]], lim: &Limits) -> Option<Acquire<'a>> {
    use AcquireOpt::{Px, Token};
    let mut req = Acquire::exclusive();
    let mut ttl = None;
    for (i, pair) in args.chunks(2).enumerate() {
        let [opt, v] = pair else { return None };
        match acquire_option(opt).map(|k| ACQUIRE_KINDS[k]) {
            Some(Px) if ttl.is_none() => ttl = Some(ttl_ms(v, 1, lim.max_ttl, "").ok()?),
            Some(Token) if req.token.is_none() => {
                req.token = Some(bounded(v, "TOKEN", lim.min_token_len, MAX_TOKEN_LEN).ok()?);
                req.token_at = Some(2 * i + 1);
            }
            _ => return None,
        }
    }
    req.ttl = match ttl {
        Some(t) => t,
        None => default_ttl(lim, "").ok()?,
    };
    Some(req)
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
    let mut owner = None;
    options(rest, &["PX", "EX", "OWNER"], &[], |name, v| {
        match name {
            "OWNER" => owner = Some(bounded(v, "OWNER", 1, MAX_OWNER_LEN)?),
            "PX" => ttl = Some(ttl_ms(v, 1, lim.max_ttl, CMD)?),
            _ => ttl = Some(ttl_ms(v, 1000, lim.max_ttl, CMD)?),
        }
        Ok(())
    })?;
    let ttl = match ttl {
        Some(t) => t,
        None => default_ttl(lim, CMD)?,
    };
    Ok(Extend { token, ttl, owner })
}

fn block_ms(v: &[u8]) -> Result<u64, LockError> {
    let n = parse_i64(v).ok_or(LockError::InvalidTimeout(
        "is not an integer or out of range",
    ))?;
    if n < 0 {
        return Err(LockError::InvalidTimeout("is negative"));
    }
    Ok(n as u64)
}

/// `LOCK.CHECK key fence`
pub fn parse_check(args: &[&[u8]]) -> Result<u64, LockError> {
    match args {
        [fence] => positive_fence(fence, LockError::InvalidFenceArg),
        _ => Err(LockError::WrongArity("lock.check")),
    }
}

/// `LOCK.WATCH key [FENCE f [OWNER label]] [BLOCK ms]`
pub fn parse_watch<'a>(args: &[&'a [u8]]) -> Result<Watch<'a>, LockError> {
    let mut w = Watch {
        fence: None,
        owner: None,
        block: None,
    };
    options(args, &["FENCE", "OWNER", "BLOCK"], &[], |name, v| {
        match name {
            "FENCE" => w.fence = Some(positive_fence(v, LockError::InvalidFenceArg)?),
            "OWNER" => w.owner = Some(bounded(v, "OWNER", 1, MAX_OWNER_LEN)?),
            _ => w.block = Some(block_ms(v)?),
        }
        Ok(())
    })?;
    if w.owner.is_some() && w.fence.is_none() {
        return Err(LockError::Syntax(
            "OWNER needs FENCE (it names the label of the holder with that fence)".into(),
        ));
    }
    Ok(w)
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

/// `LOCK.INFO key [COUNT n] [AFTER fence] [WAITERS n]`
pub fn parse_info(args: &[&[u8]]) -> Result<Info, LockError> {
    let mut info = Info {
        count: INFO_COUNT,
        after: 0,
        waiters: 0,
    };
    options(args, &["COUNT", "AFTER", "WAITERS"], &[], |name, v| {
        let n = parse_i64(v).ok_or(LockError::NotInteger)?;
        let page = || {
            usize::try_from(n)
                .ok()
                .filter(|n| (1..=INFO_MAX_COUNT).contains(n))
                .ok_or(LockError::InvalidCount(name, INFO_MAX_COUNT))
        };
        match name {
            "COUNT" => info.count = page()?,
            "WAITERS" => info.waiters = page()?,
            _ => {
                info.after = u64::try_from(n)
                    .ok()
                    .filter(|f| *f <= MAX_FENCE)
                    .ok_or(LockError::InvalidAfter)?
            }
        }
        Ok(())
    })?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIM: Limits = Limits {
        default_ttl: 30_000,
        max_ttl: 86_400_000,
        min_token_len: 1,
    };

    fn acq(args: &[&str]) -> Result<Acquire<'static>, LockError> {
        acq_with(args, &LIM)
    }

    fn acq_with(args: &[&str], lim: &Limits) -> Result<Acquire<'static>, LockError> {
        let owned: Vec<&'static [u8]> = args
            .iter()
            .map(|s| &*Box::leak(s.as_bytes().to_vec().into_boxed_slice()))
            .collect();
        parse_acquire(&owned, lim)
    }

    proptest::proptest! {
        /// The common forms' shortcut parses what the general parse does, where it
        /// parses at all.
        #[test]
        fn the_common_forms_parse_as_the_general_parse_does(
            words in proptest::collection::vec(
                proptest::sample::select(vec!["TOKEN", "px", "PX", "EX", "tok", "", "0", "600000", "-1", "99999999999999", "SHARED", "x"]),
                0..6,
            ),
            min_token_len in 1usize..4,
        ) {
            let lim = Limits { default_ttl: 30_000, max_ttl: 86_400_000, min_token_len };
            let args: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
            if let Some(fast) = common_acquire(&args, &lim) {
                let general = general_acquire(&args, &lim).expect("valid for the general parse too");
                proptest::prop_assert_eq!(fast, general);
            }
        }
    }

    /// `parse_acquire` without its shortcut.
    fn general_acquire<'a>(args: &[&'a [u8]], lim: &Limits) -> Result<Acquire<'a>, LockError> {
        // An option the shortcut never takes (SHARED is a flag) sends the same words down
        // the general walk: the result must be the same but for the mode.
        let mut with: Vec<&[u8]> = args.to_vec();
        with.push(b"SHARED");
        let mut r = parse_acquire(&with, lim)?;
        r.mode = Mode::Exclusive;
        Ok(r)
    }

    #[test]
    fn the_acquire_lookup_agrees_with_the_table_scan() {
        let mut words: Vec<Vec<u8>> = ACQUIRE_OPTIONS
            .iter()
            .map(|o| o.as_bytes().to_vec())
            .collect();
        for o in ACQUIRE_OPTIONS {
            words.push(o.to_ascii_lowercase().into_bytes());
            words.push(format!("{o}X").into_bytes());
            let mut near = o.as_bytes().to_vec();
            near[o.len() - 1] ^= 1;
            words.push(near);
        }
        words.extend([
            b"".to_vec(),
            b"P".to_vec(),
            b"pX".to_vec(),
            b"TOKEM".to_vec(),
            vec![0xff; 5],
        ]);
        for w in words {
            assert_eq!(
                acquire_option(&w),
                crate::syntax::find_name(&ACQUIRE_OPTIONS, &w),
                "{:?}",
                String::from_utf8_lossy(&w)
            );
        }
    }

    #[test]
    fn acquire_kinds_follow_the_option_table() {
        assert_eq!(ACQUIRE_KINDS.len(), ACQUIRE_OPTIONS.len());
        for (i, k) in ACQUIRE_KINDS.iter().enumerate() {
            assert_eq!(*k as usize, i);
            let name = format!("{k:?}").to_ascii_uppercase();
            assert_eq!(name, ACQUIRE_OPTIONS[i]);
        }
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
        assert_eq!((r.token, r.token_at), (Some(&b"t1"[..]), Some(3)));
        assert_eq!(r.owner, Some(&b"srv"[..]));
        assert_eq!(r.block, Some(0));
        assert_eq!(r.min_fence, 7);
        assert_eq!(acq(&["LOCKDELAY", "500"]).unwrap().lock_delay, Some(500));
        assert_eq!(acq(&["LOCKDELAY", "0"]).unwrap().lock_delay, Some(0));
        assert_eq!(acq(&["LOCKDELAY", "-1"]), Err(LockError::InvalidLockDelay));
        assert_eq!(
            acq(&["LOCKDELAY", "86400001"]),
            Err(LockError::InvalidLockDelay)
        );
    }

    #[test]
    fn acquire_errors() {
        let inv = LockError::InvalidExpire("lock.acquire");
        assert_eq!(acq(&["PX", "0"]), Err(inv.clone()));
        assert_eq!(acq(&["PX", "-1"]), Err(inv.clone()));
        let above = |ms| LockError::AboveMaxTtl {
            cmd: "lock.acquire",
            ms,
            max: 86_400_000,
        };
        assert_eq!(acq(&["PX", "86400001"]), Err(above(86_400_001)));
        assert_eq!(acq(&["EX", "86401"]), Err(above(86_401_000)));
        assert_eq!(
            above(518_400_000).to_string(),
            "ERR invalid expire time in 'lock.acquire' command: 518400000 ms is above \
             lock.max-ttl (86400000 ms)"
        );
        assert_eq!(acq(&["EX", "9223372036854775807"]), Err(inv));
        assert_eq!(acq(&["PX", "x"]), Err(LockError::NotInteger));
        assert_eq!(
            acq(&["PX", "1", "EX", "1"]),
            Err(LockError::Syntax("PX and EX exclude each other".into()))
        );
        assert_eq!(
            acq(&["PX", "1", "PX", "1"]),
            Err(LockError::Syntax("option 'PX' given twice".into()))
        );
        assert_eq!(
            acq(&["SHARED", "SHARED"]),
            Err(LockError::Syntax("option 'SHARED' given twice".into()))
        );
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
        assert!(matches!(
            acq(&["SHARED", "LIMIT", "2"]),
            Err(LockError::Syntax(_))
        ));
    }

    #[test]
    fn tokens_have_a_minimum_length() {
        let lim = Limits {
            min_token_len: 16,
            ..LIM
        };
        assert_eq!(
            acq_with(&["TOKEN", &"a".repeat(15)], &lim),
            Err(LockError::BadLength {
                what: "TOKEN",
                min: 16,
                max: 256
            })
        );
        assert!(acq_with(&["TOKEN", &"a".repeat(16)], &lim).is_ok());
        // RELEASE and EXTEND take any token (a classic string lock's value, say).
        assert_eq!(parse_release(&[b"abc"]), Ok(&b"abc"[..]));
    }

    #[test]
    fn default_ttl_above_max_is_refused() {
        let lim = Limits {
            default_ttl: 10,
            max_ttl: 5,
            min_token_len: 1,
        };
        assert_eq!(
            parse_acquire(&[], &lim),
            Err(LockError::InvalidExpire("lock.acquire"))
        );
    }

    #[test]
    fn release_extend_info() {
        assert!(parse_release(&[]).is_err());
        assert!(parse_release(&[b"t", b"u"]).is_err());
        let e = parse_extend(&[b"t", b"EX", b"3"], &LIM).unwrap();
        assert_eq!((e.token, e.ttl), (&b"t"[..], 3000));
        assert_eq!(parse_extend(&[b"t"], &LIM).unwrap().ttl, 30_000);
        assert!(parse_extend(&[], &LIM).is_err());
        assert!(parse_extend(&[b"t", b"TOKEN", b"x"], &LIM).is_err());
        assert_eq!(
            parse_info(&[]),
            Ok(Info {
                count: 10,
                after: 0,
                waiters: 0
            })
        );
        assert_eq!(
            parse_info(&[b"after", b"99", b"COUNT", b"1000", b"waiters", b"5"]),
            Ok(Info {
                count: 1000,
                after: 99,
                waiters: 5
            })
        );
        for bad in [&b"0"[..], b"1001", b"-1"] {
            assert_eq!(
                parse_info(&[b"WAITERS", bad]),
                Err(LockError::InvalidCount("WAITERS", INFO_MAX_COUNT))
            );
        }
        assert_eq!(
            parse_info(&[b"COUNT", b"0"]),
            Err(LockError::InvalidCount("COUNT", INFO_MAX_COUNT))
        );
        assert_eq!(
            parse_info(&[b"COUNT", b"1001"]),
            Err(LockError::InvalidCount("COUNT", INFO_MAX_COUNT))
        );
        assert!(parse_info(&[b"AFTER", b"-1"]).is_err());
    }

    #[test]
    fn kinds_of_lock() {
        assert_eq!(acq(&["shared"]).unwrap().mode, Mode::Shared);
        assert_eq!(acq(&["LIMIT", "3"]).unwrap().mode, Mode::Counted(3));
        for bad in [
            &["LIMIT", "0"][..],
            &["LIMIT", "1000001"],
            &["LIMIT", "-2"],
            &["LIMIT", "x"],
        ] {
            assert_eq!(acq(bad), Err(LockError::InvalidLimit(MAX_LIMIT)), "{bad:?}");
        }
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
    }

    #[test]
    fn block_deadlines_must_be_representable() {
        let now = 1_800_000_000_000;
        assert_eq!(block_deadline(now, 0), Ok(None));
        assert_eq!(block_deadline(now, 5), Ok(Some(now + 5000)));
        assert!(block_deadline(now, 100_000_000_000).is_ok());
        for bad in [
            u64::MAX,
            i64::MAX as u64,
            9_223_372_036_854_775,
            9_000_000_000_000_000,
        ] {
            assert_eq!(
                block_deadline(now, bad),
                Err(LockError::BlockOutOfRange),
                "{bad}"
            );
        }
    }

    proptest! {
        #[test]
        fn parser_never_panics(args in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..12), 0..10)) {
            let slices: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
            let _ = parse_acquire(&slices, &LIM);
            let _ = parse_extend(&slices, &LIM);
            let _ = parse_release(&slices);
            let _ = parse_forcerelease(&slices);
            let _ = parse_info(&slices);
        }

        #[test]
        fn parse_i64_agrees_with_std_on_canonical_numbers(n in any::<i64>()) {
            prop_assert_eq!(parse_i64(n.to_string().as_bytes()), Some(n));
        }

        #[test]
        fn accepted_ttls_are_in_range(opt in prop_oneof![Just("PX"), Just("EX")], v in any::<i64>()) {
            let vs = v.to_string();
            if let Ok(r) = acq(&[opt, &vs]) {
                prop_assert!(r.ttl >= 1 && r.ttl <= LIM.max_ttl);
            }
        }
    }
}
