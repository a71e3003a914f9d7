//! LOCK.INFO: who holds a lock, its leases and waiters, and a page of its holders (never a
//! token). Read-only: a lease that is over shows as free; nothing is removed.

use super::queue::Wait;
use super::{Engine, Keyspace, Slot};
use crate::args::Info;
use crate::error::LockError;
use crate::lock::value::{self, Mode};
use crate::reply::{Bytes, Reply};

impl<W> Engine<W> {
    pub(super) fn info<'a>(
        &self,
        ks: &mut impl Keyspace,
        page: Info,
    ) -> Result<Reply<'a>, LockError> {
        let clock = ks.clock();
        let (db, name) = (ks.db(), ks.name());
        let waiters = self.queued(db, name);
        // `waiters`, then `longest-wait` (ms) right after it in every shape of the reply;
        // the `waiter-list` asked for with WAITERS goes last.
        let queue = [
            ("waiters", Reply::Int(waiters as i64)),
            (
                "longest-wait",
                Reply::Int(self.longest_wait(db, name, clock.mono) / 1000),
            ),
        ];
        let waiter_list = (page.waiters > 0).then(|| {
            let list = self.first_waiters(db, name, page.waiters).into_iter();
            let list = list.map(|w| waiter_map(w, clock.mono)).collect();
            ("waiter-list", Reply::Array(list))
        });
        let v = match ks.read()? {
            Slot::Free => return Ok(Reply::Nil),
            Slot::Classic(expiry) => {
                let mut m = info_classic(clock.wall, expiry);
                m.extend(queue);
                m.extend(waiter_list);
                return Ok(Reply::Map(m));
            }
            Slot::Lock(v) => v,
        };
        let now = clock.mono;
        let holders = v.live_count(now);
        // A holder whose lease is over but not yet removed leaves its lock-delay behind
        // (what the next write to the key will find), as one already removed has.
        let delay = v
            .iter()
            .filter(|h| !h.live(now))
            .filter_map(|h| h.delay_end())
            .chain(v.delay_until())
            .max()
            .map_or(0, |t| clock.remaining_ms(t).max(0));
        if holders == 0 {
            if delay == 0 {
                return Ok(Reply::Nil);
            }
            // A lock-delay runs: nobody holds it, nobody gets it before it ends.
            let mut m = vec![
                ("state", Reply::text("delayed")),
                ("kind", Reply::text("module")),
                ("mode", Reply::text(v.mode().name())),
                ("lock-delay", Reply::Int(delay)),
                ("holders", Reply::Int(0)),
            ];
            m.extend(queue);
            m.push(("holder-list", Reply::Array(Vec::new())));
            m.push(("cursor", Reply::Int(0)));
            m.extend(waiter_list);
            return Ok(Reply::Map(m));
        }
        // Some holder is live, so the latest lease is.
        let last = v.last_lease_end().unwrap_or(now);
        let mut m: Vec<(&'static str, Reply<'a>)> = vec![
            ("state", Reply::text("held")),
            ("kind", Reply::text("module")),
            ("mode", Reply::text(v.mode().name())),
            ("ttl", Reply::Int(clock.remaining_ms(last).max(0))),
            ("expires-at", Reply::Int(clock.to_wall(last))),
        ];
        if let (Mode::Exclusive, Some(h)) = (v.mode(), v.iter().next()) {
            m.push(("fence", Reply::Int(h.fence as i64)));
            m.push(("owner", owned(h.owner())));
            m.push(("acquired-at", Reply::Int(h.acquired_at())));
            m.push(("client-id", Reply::Int(h.client_id() as i64)));
            m.push((
                "client-addr",
                Reply::Bulk(Bytes::Own(h.addr().to_string().into_bytes())),
            ));
        }
        if let Mode::Counted(n) = v.mode() {
            m.push(("limit", Reply::Int(i64::from(n))));
        }
        let mut live = v.iter_after(page.after).filter(|h| h.live(now));
        let list: Vec<Reply<'a>> = live
            .by_ref()
            .take(page.count)
            .map(|h| holder_map(h, clock))
            .collect();
        let cursor = match (live.next(), list.last()) {
            (Some(_), Some(Reply::Map(fields))) => match fields.first() {
                Some((_, Reply::Int(f))) => *f,
                _ => 0,
            },
            _ => 0,
        };
        m.push(("lock-delay", Reply::Int(delay)));
        m.push(("holders", Reply::Int(holders as i64)));
        m.extend(queue);
        m.push(("holder-list", Reply::Array(list)));
        m.push(("cursor", Reply::Int(cursor)));
        m.extend(waiter_list);
        Ok(Reply::Map(m))
    }
}

fn owned<'a>(b: Option<&[u8]>) -> Reply<'a> {
    b.map_or(Reply::Nil, |b| Reply::Bulk(Bytes::Own(b.to_vec())))
}

/// One holder's fields (never its token); `fence` first (the page cursor reads it).
fn holder_map<'a>(h: &value::Holder, clock: crate::lock::codec::Clock) -> Reply<'a> {
    Reply::Map(vec![
        ("fence", Reply::Int(h.fence as i64)),
        ("owner", owned(h.owner())),
        ("ttl", Reply::Int(clock.remaining_ms(h.deadline).max(0))),
        ("expires-at", Reply::Int(clock.to_wall(h.deadline))),
        ("acquired-at", Reply::Int(h.acquired_at())),
        ("client-id", Reply::Int(h.client_id() as i64)),
        (
            "client-addr",
            Reply::Bulk(Bytes::Own(h.addr().to_string().into_bytes())),
        ),
    ])
}

/// One waiter's fields (never its token): who, what it asked for, and how long it has
/// waited (ms) at `now` (µs).
fn waiter_map<'a, W>(w: &Wait<W>, now: i64) -> Reply<'a> {
    Reply::Map(vec![
        ("client-id", Reply::Int(w.client_id as i64)),
        (
            "client-addr",
            Reply::Bulk(Bytes::Own(w.addr.to_string().into_bytes())),
        ),
        ("owner", owned(w.owner.as_deref())),
        ("mode", Reply::text(w.mode.name())),
        (
            "waited",
            Reply::Int(now.saturating_sub(w.since).max(0) / 1000),
        ),
    ])
}

/// A string lock's fields before its waiters'.
fn info_classic<'a>(wall: i64, expiry: Option<i64>) -> Vec<(&'static str, Reply<'a>)> {
    let mut m = vec![
        ("state", Reply::text("held")),
        ("kind", Reply::text("string")),
        (
            "ttl",
            Reply::Int(expiry.map_or(-1, |at| at.saturating_sub(wall).max(0))),
        ),
        ("expires-at", expiry.map_or(Reply::Nil, Reply::Int)),
    ];
    for f in ["fence", "owner", "acquired-at", "client-id", "client-addr"] {
        m.push((f, Reply::Nil));
    }
    m
}
