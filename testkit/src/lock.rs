//! Typed lock commands over a [`RawConn`], for callers that want replies as values.

use std::collections::HashMap;
use std::io;
use std::time::{Duration, Instant};

use crate::resp::{RawConn, Resp};

/// A grant: the token to release with and the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub token: Vec<u8>,
    pub fence: u64,
}

/// `LOCK.INFO` of a held lock, typed (`None` where the reply has no such field).
#[derive(Debug, Clone, PartialEq)]
pub struct LockInfo {
    pub ttl: Option<i64>,
    pub fence: Option<u64>,
    pub owner: Option<String>,
    pub waiters: Option<i64>,
}

impl LockInfo {
    fn from_reply(r: &Resp) -> Option<LockInfo> {
        let fields = r.try_pairs()?;
        let get = |k: &str| fields.iter().find(|(n, _)| n == k).map(|(_, v)| v);
        let int = |k| get(k).and_then(Resp::as_int);
        Some(LockInfo {
            ttl: int("ttl"),
            fence: int("fence").and_then(|f| u64::try_from(f).ok()),
            owner: get("owner").and_then(Resp::as_text),
            waiters: int("waiters"),
        })
    }
}

fn other(what: &str, r: &Resp) -> io::Error {
    io::Error::other(format!("{what} answered {r:?}"))
}

/// `LOCK.ACQUIRE key [extra args...]`: `Some(grant)`, or `None` when not acquired.
pub fn acquire<A: AsRef<[u8]>>(
    c: &mut RawConn,
    key: &str,
    extra: &[A],
) -> io::Result<Option<Grant>> {
    let mut cmd: Vec<Vec<u8>> = vec![b"LOCK.ACQUIRE".to_vec(), key.as_bytes().to_vec()];
    cmd.extend(extra.iter().map(|a| a.as_ref().to_vec()));
    match c.call(&cmd)? {
        Resp::Nil => Ok(None),
        r => r
            .grant()
            .map(|(token, fence)| Some(Grant { token, fence }))
            .ok_or_else(|| other("LOCK.ACQUIRE", &r)),
    }
}

/// `LOCK.ACQUIRE key args...` as a cluster client sends it: resent every 5 ms for up to
/// `patience` while TRYAGAIN (the node confirms the fences of a slot it just took over).
pub fn acquire_in_cluster(c: &mut RawConn, key: &str, args: &[&str], patience: Duration) -> Resp {
    let deadline = Instant::now() + patience;
    let mut cmd = vec!["LOCK.ACQUIRE", key];
    cmd.extend_from_slice(args);
    loop {
        let r = c.cmd(&cmd);
        match &r {
            Resp::Error(e) if e.starts_with("TRYAGAIN") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => return r,
        }
    }
}

/// `LOCK.INFO key`: `None` when free.
pub fn info(c: &mut RawConn, key: &str) -> io::Result<Option<LockInfo>> {
    match c.call(&["LOCK.INFO", key])? {
        Resp::Nil => Ok(None),
        r => LockInfo::from_reply(&r)
            .map(Some)
            .ok_or_else(|| other("LOCK.INFO", &r)),
    }
}

/// `INFO <section>` of a server as `field -> value`; panics on an I/O error.
pub fn info_map(c: &mut RawConn, section: &str) -> HashMap<String, String> {
    c.info(section)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
        .into_iter()
        .collect()
}

/// One numeric field of `INFO lock` (`lock_` prefix optional); panics when missing.
pub fn lock_stat(c: &mut RawConn, field: &str) -> i64 {
    let name = format!("lock_{}", field.strip_prefix("lock_").unwrap_or(field));
    c.info_u64("lock", &name).unwrap_or_else(|e| panic!("{e}")) as i64
}

/// The digest the module stores instead of a token (keyed BLAKE3, 16 bytes, as
/// `src/engine/value.rs`; pinned by the test below), to find a holder in DUMP/RDB/AOF.
pub fn token_digest(token: &[u8]) -> [u8; 16] {
    const KEY: [u8; 32] = *b"redis-lock token digest, v1.....";
    let full = blake3::keyed_hash(&KEY, token);
    let mut d = [0u8; 16];
    d.copy_from_slice(&full.as_bytes()[..16]);
    d
}

/// The fence clock term the module uses on a new deployment: `unix_ms << FENCE_SHIFT`.
pub const FENCE_SHIFT: u32 = 10;

#[cfg(test)]
mod digest_tests {
    #[test]
    fn the_digest_is_the_modules() {
        assert_eq!(
            super::token_digest(b"token"),
            [227, 227, 21, 212, 75, 13, 78, 245, 149, 30, 189, 29, 58, 80, 77, 46]
        );
    }
}
