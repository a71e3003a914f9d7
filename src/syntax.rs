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
    walk(args, known, flag_bits, |i, v, _| handle(known[i], v))
}

/// The walk under [`options`], by index: `handle(option index, value, value's index in
/// args)`; `flags` has a bit per bare flag of `known`. No allocation on success.
pub fn walk<'a>(
    args: &[&'a [u8]],
    known: &[&'static str],
    flags: u32,
    mut handle: impl FnMut(usize, &'a [u8], usize) -> Result<(), LockError>,
) -> Result<(), LockError> {
    // Which options are PX or EX (one setting), decided once per walk.
    let expiries = known
        .iter()
        .enumerate()
        .filter(|(_, k)| matches!(**k, "PX" | "EX"))
        .fold(0u32, |bits, (i, _)| bits | 1 << i);
    let expiry = |i: usize| expiries & (1 << i) != 0;
    let mut seen = 0u32;
    let mut expiry_seen = None;
    let mut i = 0;
    while i < args.len() {
        let opt = args[i];
        let idx = known
            .iter()
            .position(|k| k.len() == opt.len() && k.as_bytes().eq_ignore_ascii_case(opt))
            .ok_or_else(|| LockError::Syntax(format!("unknown option '{}'", show(opt))))?;
        // PX and EX are one setting: both take the bit of the first of them.
        let slot = if expiry(idx) {
            expiries.trailing_zeros() as usize
        } else {
            idx
        };
        if seen & (1 << slot) != 0 {
            return Err(LockError::Syntax(match expiry_seen {
                Some(first) if expiry(idx) && first != idx => "PX and EX exclude each other".into(),
                _ => format!("option '{}' given twice", known[idx]),
            }));
        }
        if expiry(idx) {
            expiry_seen = Some(idx);
        }
        seen |= 1 << slot;
        if flags & (1 << idx) != 0 {
            handle(idx, b"", i)?;
            i += 1;
            continue;
        }
        let value = args
            .get(i + 1)
            .ok_or_else(|| LockError::Syntax(format!("option '{}' needs a value", known[idx])))?;
        handle(idx, value, i + 1)?;
        i += 2;
    }
    Ok(())
}

/// An integer from 1 to `max` (a fence), else `err`.
pub fn positive(v: &[u8], max: u64, err: LockError) -> Result<u64, LockError> {
    match parse_i64(v) {
        Some(n) if n >= 1 && n as u64 <= max => Ok(n as u64),
        _ => Err(err),
    }
}
