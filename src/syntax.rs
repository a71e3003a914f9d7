//! The text rules every command argument follows: Redis integers, and options as
//! `NAME value` pairs or bare flags. Pure, and a leaf: the parsers of the commands
//! (`args`) and of the replication stream (`lock::codec::repl`) both build on it.

use crate::error::LockError;

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

pub fn show(opt: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(opt).chars().take(32).collect();
    shown.replace(['\r', '\n'], " ")
}

/// Walks options: `NAME value` pairs, and bare flags (names listed in `flags`),
/// rejecting unknown and repeated options. PX and EX are one setting. `handle` gets the
/// option's name, its value and the value's index in `args`.
pub fn options<'a>(
    args: &[&'a [u8]],
    known: &[&'static str],
    flags: &[&'static str],
    mut handle: impl FnMut(&'static str, &'a [u8]) -> Result<(), LockError>,
) -> Result<(), LockError> {
    let flag_bits = known
        .iter()
        .enumerate()
        .filter(|(_, k)| flags.contains(k))
        .fold(0u32, |bits, (i, _)| bits | 1 << i);
    let find = |opt: &[u8]| find_name(known, opt);
    walk(args, known, find, flag_bits, |i, v, _| handle(known[i], v))
}

/// The walk under [`options`], by index: `find` tells an option's index in `known` (a
/// command's own lookup may be quicker than [`find_name`]'s scan), `handle(option index,
/// value, value's index in args)`; `flags` has a bit per bare flag of `known`. No
/// allocation on success.
pub fn walk<'a>(
    args: &[&'a [u8]],
    known: &[&'static str],
    find: impl Fn(&[u8]) -> Option<usize>,
    flags: u32,
    mut handle: impl FnMut(usize, &'a [u8], usize) -> Result<(), LockError>,
) -> Result<(), LockError> {
    let mut seen = 0u32;
    let mut expiry_seen = None;
    let mut i = 0;
    while let Some(&opt) = args.get(i) {
        let Some(idx) = find(opt).filter(|i| *i < known.len()) else {
            return Err(unknown_option(opt));
        };
        // PX and EX are one setting: both take the bit of the first of them.
        let expiry = is_expiry(known[idx]);
        let slot = if expiry {
            known.iter().position(|k| is_expiry(k)).unwrap_or(idx)
        } else {
            idx
        };
        if seen & (1 << slot) != 0 {
            return Err(given_twice(known, idx, expiry_seen.filter(|_| expiry)));
        }
        if expiry {
            expiry_seen = Some(idx);
        }
        seen |= 1 << slot;
        if flags & (1 << idx) != 0 {
            handle(idx, b"", i)?;
            i += 1;
            continue;
        }
        let Some(&value) = args.get(i + 1) else {
            return Err(LockError::Syntax(format!(
                "option '{}' needs a value",
                known[idx]
            )));
        };
        handle(idx, value, i + 1)?;
        i += 2;
    }
    Ok(())
}

fn is_expiry(name: &str) -> bool {
    matches!(name.as_bytes(), b"PX" | b"EX")
}

#[cold]
fn unknown_option(opt: &[u8]) -> LockError {
    LockError::Syntax(format!("unknown option '{}'", show(opt)))
}

/// Option `idx` came again; `first_expiry`: the PX or EX given before, if this is one.
#[cold]
fn given_twice(known: &[&str], idx: usize, first_expiry: Option<usize>) -> LockError {
    LockError::Syntax(match first_expiry {
        Some(first) if first != idx => "PX and EX exclude each other".into(),
        _ => format!("option '{}' given twice", known[idx]),
    })
}

/// The index of `opt` in `known` (names in upper case), without regard to case: byte by
/// byte, so that a candidate of the same length usually fails at its first byte.
pub fn find_name(known: &[&str], opt: &[u8]) -> Option<usize> {
    known.iter().position(|k| {
        debug_assert!(!k.bytes().any(|c| c.is_ascii_lowercase()), "{k}");
        k.len() == opt.len() && k.bytes().zip(opt).all(|(a, b)| a == b.to_ascii_uppercase())
    })
}

/// An integer from 1 to `max` (a fence), else `err`.
pub fn positive(v: &[u8], max: u64, err: LockError) -> Result<u64, LockError> {
    match parse_i64(v) {
        Some(n) if n >= 1 && n as u64 <= max => Ok(n as u64),
        _ => Err(err),
    }
}
