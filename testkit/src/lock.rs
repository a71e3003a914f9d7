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

/// A cluster client over one [`RawConn`] per node (the kit's [`crate::Cluster`] or any
/// ports): sends a key's command to the node serving its slot and follows `MOVED`, `ASK`
/// and `TRYAGAIN` (resent 1 ms later), counting each.
pub struct Routed {
    conns: Vec<RawConn>,
    ports: Vec<u16>,
    /// The node index serving each slot, as last learned.
    slots: Vec<usize>,
    pub moved: u64,
    pub ask: u64,
    pub tryagain: u64,
}

impl Routed {
    pub fn connect(ports: &[u16]) -> io::Result<Routed> {
        let conns = (ports.iter())
            .map(|&p| RawConn::open(([127, 0, 0, 1], p).into(), crate::IO_TIMEOUT))
            .collect::<io::Result<Vec<_>>>()?;
        let mut r = Routed {
            conns,
            ports: ports.to_vec(),
            slots: vec![0; 16384],
            moved: 0,
            ask: 0,
            tryagain: 0,
        };
        r.load_slots()?;
        Ok(r)
    }

    /// The slot table from `CLUSTER SLOTS` of the first node.
    fn load_slots(&mut self) -> io::Result<()> {
        let r = self.conns[0].call(&["CLUSTER", "SLOTS"])?;
        for range in r.as_items().unwrap_or_default() {
            let Some([lo, hi, master, ..]) = range.as_items() else {
                continue;
            };
            let port = master.as_items().and_then(|m| m.get(1)?.as_int());
            let node = self.ports.iter().position(|&p| Some(i64::from(p)) == port);
            if let (Some(lo), Some(hi), Some(n)) = (lo.as_int(), hi.as_int(), node) {
                for s in lo.max(0)..=hi.min(16383) {
                    self.slots[s as usize] = n;
                }
            }
        }
        Ok(())
    }

    /// The node index of `host:port` in a redirect.
    fn node_of(&self, addr: Option<&str>) -> Option<usize> {
        let port: u16 = addr?.rsplit_once(':')?.1.parse().ok()?;
        self.ports.iter().position(|&p| p == port)
    }

    /// Sends `args` (whose key is `key`) until a reply other than a redirect or TRYAGAIN
    /// comes, or `patience` has passed (the last such reply is returned).
    pub fn call<A: AsRef<[u8]>>(
        &mut self,
        key: &[u8],
        args: &[A],
        patience: Duration,
    ) -> io::Result<Resp> {
        let deadline = Instant::now() + patience;
        let mut asking = None;
        loop {
            let node = asking.unwrap_or(self.slots[usize::from(crate::key_slot(key))]);
            let c = &mut self.conns[node];
            let r = if asking.take().is_some() {
                c.queue(&["ASKING"]);
                c.queue(args);
                c.flush()?;
                c.read()?;
                c.read()?
            } else {
                c.call(args)?
            };
            let Resp::Error(e) = &r else { return Ok(r) };
            if Instant::now() >= deadline {
                return Ok(r);
            }
            let mut words = e.split(' ');
            match words.next() {
                Some("MOVED") => {
                    self.moved += 1;
                    let slot = words.next().and_then(|s| s.parse::<usize>().ok());
                    match (slot, self.node_of(words.next())) {
                        (Some(s), Some(n)) if s < self.slots.len() => self.slots[s] = n,
                        _ => self.load_slots()?,
                    }
                }
                Some("ASK") => {
                    self.ask += 1;
                    asking = self.node_of(words.nth(1));
                }
                Some("TRYAGAIN") => {
                    self.tryagain += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                _ => return Ok(r),
            }
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
