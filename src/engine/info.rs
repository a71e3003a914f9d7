//! LOCK.INFO: who holds a lock, its leases and waiters, and a page of its holders (never a
//! token). Read-only: a lease that is over shows as free; nothing is removed.

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
        let waiters = self.queued(ks.db(), ks.name());
        let v = match ks.read()? {
            Slot::Free => return Ok(Reply::Nil),
            Slot::Classic(expiry) => return Ok(info_classic(clock.wall, expiry, waiters)),
            Slot::Lock(v) => v,
        };
        let now = clock.mono;
        let holders = v.live_count(now);
        let delay = v.delay_until().map_or(0, |t| clock.remaining_ms(t).max(0));
        if holders == 0 {
            if delay == 0 {
                return Ok(Reply::Nil);
            }
            // A lock-delay runs: nobody holds it, nobody gets it before it ends.
            return Ok(Reply::Map(vec![
                ("state", Reply::text("delayed")),
                ("kind", Reply::text("module")),
                ("mode", Reply::text(v.mode().name())),
                ("lock-delay", Reply::Int(delay)),
                ("holders", Reply::Int(0)),
                ("waiters", Reply::Int(waiters as i64)),
                ("holder-list", Reply::Array(Vec::new())),
                ("cursor", Reply::Int(0)),
            ]));
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
            m.push(("acquired-at", Reply::Int(h.acquired_at)));
            m.push(("client-id", Reply::Int(h.client_id as i64)));
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
        m.push(("waiters", Reply::Int(waiters as i64)));
        m.push(("holder-list", Reply::Array(list)));
        m.push(("cursor", Reply::Int(cursor)));
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
        ("acquired-at", Reply::Int(h.acquired_at)),
        ("client-id", Reply::Int(h.client_id as i64)),
        (
            "client-addr",
            Reply::Bulk(Bytes::Own(h.addr().to_string().into_bytes())),
        ),
    ])
}

fn info_classic<'a>(wall: i64, expiry: Option<i64>, waiters: usize) -> Reply<'a> {
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
    m.push(("waiters", Reply::Int(waiters as i64)));
    Reply::Map(m)
}
