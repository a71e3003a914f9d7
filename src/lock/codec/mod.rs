//! The one codec of a lock value: every encoding it has ever had, as decode/encode pairs
//! side by side, each decode ending in the one validity rule ([`value::build`]).
//!
//! RDB values (also DUMP payloads and the RDB preamble of an AOF), by encoding version:
//!
//! ```text
//! v1 (release 0.1): token fence expires-at acquired-at has-owner [owner] client-id addr
//! v2 (0.2):         mode [limit] n, n x (digest fence expires-at acquired-at client-id addr has-owner [owner])
//! v3 (0.3):         mode [limit] n, n x (digest fence remaining acquired-at client-id addr has-owner [owner] lock-delay), delay-left
//! v4 (this one):    as v3, each holder followed by has-session [session-digest]
//! ```
//!
//! `mode` is 0 exclusive, 1 shared, 2 counted. v1 and v2 carry the lease as an absolute
//! unix-ms deadline; v3 carries the time left, in ms rounded up, so that a value moved to
//! another server (a replica, a restarted server, another node) never needs two clocks to
//! agree and never comes back with a shorter lease. v3 also carries each holder's
//! lock-delay (ms, 0 for none) and the time left of a running lock-delay (ms, 0 for
//! none). v4 adds the session a holder belongs to (the digest of the session's id; its
//! lease, carried as for any holder, is the session's). The module's auxiliary RDB data
//! (the fence counter, and from v4 the open sessions) is in [`aux`]. The commands of the
//! replication stream and the AOF are in [`repl`].

pub mod repl;

use crate::lock::value::{self, digest, Addr, Holder, LockValue, Mode, Problem};

/// The encoding this release writes.
pub const ENCODING: i32 = 4;

/// The two clocks a conversion needs: the server's monotonic clock (what leases are
/// kept on) and its wall clock (what older encodings and `acquired-at` use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    /// Monotonic microseconds.
    pub mono: i64,
    /// Unix milliseconds.
    pub wall: i64,
}

impl Clock {
    /// Milliseconds left until `deadline`, rounded up (never shorter); negative once over.
    pub fn remaining_ms(self, deadline: i64) -> i64 {
        let left = deadline.saturating_sub(self.mono);
        if left > 0 {
            left.saturating_add(999) / 1000
        } else {
            left / 1000
        }
    }

    /// The monotonic deadline `ms` from now.
    pub fn after_ms(self, ms: i64) -> i64 {
        self.mono.saturating_add(ms.saturating_mul(1000))
    }

    /// A monotonic deadline from an absolute unix-ms one (older encodings).
    pub fn from_wall(self, at_ms: i64) -> i64 {
        self.after_ms(at_ms.saturating_sub(self.wall))
    }

    /// The unix-ms estimate of a monotonic deadline (LOCK.INFO, older encodings).
    pub fn to_wall(self, deadline: i64) -> i64 {
        self.wall.saturating_add(self.remaining_ms(deadline))
    }
}

/// Where the values of a server's own files and a primary's snapshot may come from: the
/// fence ceiling, and whether refused holders are dropped (loading) or refuse the value
/// (RESTORE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub ceiling: u64,
    pub repair: bool,
}

/// What reading an RDB value gave.
#[derive(Debug)]
pub struct Decoded {
    pub value: LockValue,
    /// The holders the validity rule dropped (only with `Policy::repair`).
    pub repaired: Vec<Problem>,
}

/// Reading the fields of an RDB value.
pub trait Source {
    fn u64(&mut self) -> Option<u64>;
    fn i64(&mut self) -> Option<i64>;
    fn bytes(&mut self) -> Option<Vec<u8>>;
}

/// Writing the fields of an RDB value.
pub trait Sink {
    fn u64(&mut self, v: u64);
    fn i64(&mut self, v: i64);
    fn bytes(&mut self, b: &[u8]);
}

/// Decodes a value of encoding `encver`. None: the payload cannot be parsed (or, without
/// repair, breaks the validity rule).
pub fn decode(src: &mut dyn Source, encver: i32, clock: Clock, policy: Policy) -> Option<Decoded> {
    let (mode, holders, delay) = match encver {
        1 => (Mode::Exclusive, vec![holder_v1(src, clock)?], 0),
        2..=4 => {
            let mode = load_mode(src)?;
            let n = src.u64()?;
            let mut holders = Vec::new();
            for _ in 0..n {
                holders.push(load_holder(src, encver, clock)?);
            }
            let delay = if encver >= 3 { src.i64()? } else { 0 };
            (mode, holders, delay)
        }
        _ => return None,
    };
    if holders.is_empty() && delay > 0 {
        let value = LockValue::delayed(mode, clock.after_ms(delay));
        return Some(Decoded {
            value,
            repaired: Vec::new(),
        });
    }
    let (mut value, repaired) = value::build(mode, holders, policy.ceiling, policy.repair).ok()?;
    if delay > 0 && !value.set_delay(clock.after_ms(delay)) {
        // An exclusive holder and a delay: the holder wins (the delay follows its lease).
        value = value::build(mode, value.iter().cloned().collect(), policy.ceiling, true)
            .ok()?
            .0;
    }
    Some(Decoded { value, repaired })
}

/// Encodes a value as this release does (v4).
pub fn encode(v: &LockValue, out: &mut dyn Sink, clock: Clock) {
    encode_as(v, out, clock, ENCODING);
}

/// Encodes a value as encoding `encver` (2, 3 or 4) has it: this release writes v4; the
/// older ones are for tests of the upgrade path (what releases 0.2 and 0.3 wrote).
pub fn encode_as(v: &LockValue, out: &mut dyn Sink, clock: Clock, encver: i32) {
    save_mode(out, v.mode());
    out.u64(v.len() as u64);
    for h in v.iter() {
        out.bytes(&h.digest);
        out.u64(h.fence);
        out.i64(if encver == 2 {
            clock.to_wall(h.deadline)
        } else {
            clock.remaining_ms(h.deadline)
        });
        save_rest(out, h);
        if encver >= 3 {
            out.u64(u64::from(h.lock_delay()));
        }
        if encver >= 4 {
            match h.session() {
                Some(s) => {
                    out.u64(1);
                    out.bytes(s);
                }
                None => out.u64(0),
            }
        }
    }
    if encver >= 3 {
        out.i64(v.delay_until().map_or(0, |t| clock.remaining_ms(t).max(0)));
    }
}

/// Encodes an exclusive lock as release 0.1 did (v1, token in clear); for tests.
pub fn encode_v1(token: &[u8], h: &Holder, out: &mut dyn Sink, clock: Clock) {
    out.bytes(token);
    out.u64(h.fence);
    out.i64(clock.to_wall(h.deadline));
    out.i64(h.acquired_at());
    save_owner(out, h.owner());
    out.u64(h.client_id());
    out.bytes(h.addr().to_string().as_bytes());
}

fn load_mode(src: &mut dyn Source) -> Option<Mode> {
    match src.u64()? {
        0 => Some(Mode::Exclusive),
        1 => Some(Mode::Shared),
        2 => Some(Mode::Counted(u32::try_from(src.u64()?).ok()?)),
        _ => None,
    }
}

fn save_mode(out: &mut dyn Sink, m: Mode) {
    match m {
        Mode::Exclusive => out.u64(0),
        Mode::Shared => out.u64(1),
        Mode::Counted(n) => {
            out.u64(2);
            out.u64(u64::from(n));
        }
    }
}

fn load_owner(src: &mut dyn Source) -> Option<Option<Box<[u8]>>> {
    match src.u64()? {
        0 => Some(None),
        1 => Some(Some(src.bytes()?.into_boxed_slice())),
        _ => None,
    }
}

fn save_owner(out: &mut dyn Sink, owner: Option<&[u8]>) {
    match owner {
        Some(o) => {
            out.u64(1);
            out.bytes(o);
        }
        None => out.u64(0),
    }
}

/// `acquired-at client-id addr has-owner [owner]`: the tail shared by v2 and v3.
fn save_rest(out: &mut dyn Sink, h: &Holder) {
    out.i64(h.acquired_at());
    out.u64(h.client_id());
    out.bytes(h.addr().to_string().as_bytes());
    save_owner(out, h.owner());
}

fn load_holder(src: &mut dyn Source, encver: i32, clock: Clock) -> Option<Holder> {
    let d: [u8; 16] = src.bytes()?.as_slice().try_into().ok()?;
    let fence = src.u64()?;
    let lease = src.i64()?;
    let deadline = if encver == 2 {
        clock.from_wall(lease)
    } else {
        clock.after_ms(lease)
    };
    let acquired_at = src.i64()?;
    let client_id = src.u64()?;
    let addr = Addr::parse(&src.bytes()?);
    let owner = load_owner(src)?;
    let lock_delay = if encver >= 3 {
        u32::try_from(src.u64()?).unwrap_or(u32::MAX)
    } else {
        0
    };
    let session = if encver >= 4 {
        match src.u64()? {
            0 => None,
            1 => Some(src.bytes()?.as_slice().try_into().ok()?),
            _ => return None,
        }
    } else {
        None
    };
    let h = Holder::new(d, fence, deadline, acquired_at, client_id, addr, owner);
    Some(h.with_lock_delay(lock_delay).with_session(session))
}

fn holder_v1(src: &mut dyn Source, clock: Clock) -> Option<Holder> {
    let token = src.bytes()?;
    if token.is_empty() || token.len() > value::MAX_TOKEN_LEN {
        return None;
    }
    let fence = src.u64()?;
    let expires_at = src.i64()?;
    let acquired_at = src.i64()?;
    let owner = load_owner(src)?;
    let client_id = src.u64()?;
    let addr = Addr::parse(&src.bytes()?);
    Some(Holder::new(
        digest(&token),
        fence,
        clock.from_wall(expires_at),
        acquired_at,
        client_id,
        addr,
        owner,
    ))
}

/// A session as the module's auxiliary RDB data keeps it (v4): its digest, its lease
/// (ms), the time left (ms, rounded up) and its label; whether it lost a lock to a slot
/// move (no longer kept alive where the file was written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub digest: value::Digest,
    pub ttl: u64,
    pub deadline: i64,
    pub owner: Option<Box<[u8]>>,
    pub moved: bool,
}

/// The sessions after the fence counter in the auxiliary data: `n, n x (digest ttl left
/// has-owner [owner])`. A session that lost a lock to a slot move is written with a
/// lease of 0, which no release writes otherwise (a lease is 1 ms or more): the same
/// fields, so that the files of every release read alike. Its lease is of no use any
/// more (nothing renews it).
pub fn encode_sessions(list: &[SessionRecord], out: &mut dyn Sink, clock: Clock) {
    out.u64(list.len() as u64);
    for s in list {
        out.bytes(&s.digest);
        out.u64(if s.moved { 0 } else { s.ttl });
        out.i64(clock.remaining_ms(s.deadline).max(0));
        save_owner(out, s.owner.as_deref());
    }
}

pub fn decode_sessions(src: &mut dyn Source, clock: Clock) -> Option<Vec<SessionRecord>> {
    let n = src.u64()?;
    let mut list = Vec::new();
    for _ in 0..n {
        let digest = src.bytes()?.as_slice().try_into().ok()?;
        let ttl = src.u64()?;
        let deadline = clock.after_ms(src.i64()?.max(0));
        let owner = load_owner(src)?;
        if owner
            .as_ref()
            .is_some_and(|o| o.is_empty() || o.len() > value::MAX_OWNER_LEN)
        {
            return None;
        }
        list.push(SessionRecord {
            digest,
            ttl,
            deadline,
            owner,
            moved: ttl == 0,
        });
    }
    Some(list)
}

/// An in-memory [`Source`]/[`Sink`] (the model test and the unit tests; an RDB field
/// stream without the server's framing).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Fields {
    pub items: Vec<Field>,
    pos: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    U(u64),
    I(i64),
    B(Vec<u8>),
}

impl Fields {
    pub fn reader(&self) -> Fields {
        Fields {
            items: self.items.clone(),
            pos: 0,
        }
    }

    fn next(&mut self) -> Option<Field> {
        let f = self.items.get(self.pos).cloned();
        self.pos += 1;
        f
    }
}

impl Source for Fields {
    fn u64(&mut self) -> Option<u64> {
        match self.next()? {
            Field::U(v) => Some(v),
            _ => None,
        }
    }
    fn i64(&mut self) -> Option<i64> {
        match self.next()? {
            Field::I(v) => Some(v),
            _ => None,
        }
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        match self.next()? {
            Field::B(v) => Some(v),
            _ => None,
        }
    }
}

impl Sink for Fields {
    fn u64(&mut self, v: u64) {
        self.items.push(Field::U(v));
    }
    fn i64(&mut self, v: i64) {
        self.items.push(Field::I(v));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.items.push(Field::B(b.to_vec()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Clock = Clock {
        mono: 5_000_000_000,
        wall: 1_800_000_000_000,
    };
    const STRICT: Policy = Policy {
        ceiling: u64::MAX,
        repair: false,
    };
    const REPAIR: Policy = Policy {
        ceiling: u64::MAX,
        repair: true,
    };

    fn h(fence: u64, ms_left: i64, owner: Option<&[u8]>, addr: Addr) -> Holder {
        Holder::new(
            digest(&fence.to_be_bytes()),
            fence,
            NOW.after_ms(ms_left),
            NOW.wall - 10,
            42,
            addr,
            owner.map(Into::into),
        )
    }

    fn round_trip(v: &LockValue, later: Clock) -> LockValue {
        let mut f = Fields::default();
        encode(v, &mut f, NOW);
        decode(&mut f.reader(), ENCODING, later, STRICT)
            .unwrap()
            .value
    }

    #[test]
    fn values_round_trip_and_leases_never_shrink() {
        let mut s = LockValue::new(
            Mode::Shared,
            h(1, 100, Some(b"o"), Addr::V4([1, 2, 3, 4], 5)),
        );
        s.insert(
            h(2, 200, None, Addr::Text(b"/sock:0".to_vec().into())),
            u64::MAX,
        )
        .unwrap();
        assert_eq!(round_trip(&s, NOW), s);
        // Read back on another clock (a replica, a restart): the same time left.
        let later = Clock {
            mono: NOW.mono + 7_777_777,
            wall: NOW.wall - 3_600_000,
        };
        let back = round_trip(&s, later);
        for (a, b) in s.iter().zip(back.iter()) {
            assert_eq!(b.deadline - later.mono, a.deadline - NOW.mono);
        }
        // Rounding is upward: a lease 1.5 ms from its end comes back with 2 ms.
        let odd = LockValue::new(
            Mode::Exclusive,
            Holder::new([1; 16], 9, NOW.mono + 1500, 0, 0, Addr::None, None),
        );
        let back = round_trip(&odd, NOW);
        assert!(back.iter().next().unwrap().deadline >= NOW.mono + 1500);
    }

    #[test]
    fn lock_delays_round_trip() {
        let h = h(1, 100, None, Addr::None).with_lock_delay(5000);
        let x = LockValue::new(Mode::Exclusive, h);
        assert_eq!(round_trip(&x, NOW), x);
        let d = LockValue::delayed(Mode::Shared, NOW.after_ms(700));
        let back = round_trip(&d, NOW);
        assert_eq!(back.delay_until(), Some(NOW.after_ms(700)));
        assert!(back.is_empty());
    }

    #[test]
    fn older_encodings_still_load() {
        let x = LockValue::new(Mode::Counted(3), h(7, 5000, None, Addr::V6([1; 16], 2)));
        let mut f = Fields::default();
        encode_as(&x, &mut f, NOW, 2);
        let back = decode(&mut f.reader(), 2, NOW, STRICT).unwrap().value;
        assert_eq!(back.mode(), Mode::Counted(3));
        let (a, b) = (x.iter().next().unwrap(), back.iter().next().unwrap());
        assert!((a.deadline - b.deadline).abs() <= 1000, "ms precision");
        let one = h(9, 3000, Some(b"srv"), Addr::V4([127, 0, 0, 1], 1));
        let mut f = Fields::default();
        encode_v1(b"tok", &one, &mut f, NOW);
        let back = decode(&mut f.reader(), 1, NOW, STRICT).unwrap().value;
        let b = back.iter().next().unwrap();
        assert_eq!(
            (b.digest, b.fence, b.owner()),
            (digest(b"tok"), 9, Some(&b"srv"[..]))
        );
        assert!(decode(&mut Fields::default(), 5, NOW, STRICT).is_none());
        // What 0.3 wrote (v3, no session) loads; v4 carries a holder's session.
        let s = LockValue::new(
            Mode::Shared,
            h(3, 900, None, Addr::None).with_session(Some([7; 16])),
        );
        let mut f = Fields::default();
        encode_as(&s, &mut f, NOW, 3);
        let back = decode(&mut f.reader(), 3, NOW, STRICT).unwrap().value;
        assert_eq!(back.iter().next().unwrap().session(), None);
        assert_eq!(round_trip(&s, NOW), s);
    }

    #[test]
    fn session_records_round_trip_and_a_moved_one_is_written_with_a_lease_of_zero() {
        let rec = |d: u8, ttl: u64, moved: bool| SessionRecord {
            digest: [d; 16],
            ttl,
            deadline: NOW.after_ms(4000),
            owner: (d == 1).then(|| b"svc".to_vec().into()),
            moved,
        };
        let list = vec![rec(1, 30_000, false), rec(2, 5000, true)];
        let mut f = Fields::default();
        encode_sessions(&list, &mut f, NOW);
        // The fields every release writes: a moved session's lease is 0 (never written
        // otherwise: a lease is 1 ms or more).
        assert_eq!(f.items[0], Field::U(2));
        assert_eq!(f.items[2], Field::U(30_000));
        assert!(f.items.contains(&Field::U(0)));
        let back = decode_sessions(&mut f.reader(), NOW).unwrap();
        assert_eq!(back[0], list[0]);
        assert!(back[1].moved);
        assert_eq!(
            (back[1].digest, back[1].deadline, back[1].ttl),
            ([2; 16], list[1].deadline, 0)
        );
    }

    #[test]
    fn bad_values_are_repaired_when_loading_and_refused_otherwise() {
        // Two holders with one digest, as release 0.2's same-token waiters could make.
        let a = h(1, 100, None, Addr::None);
        let mut b = h(2, 100, None, Addr::None);
        b.digest = a.digest;
        let mut f = Fields::default();
        let out: &mut dyn Sink = &mut f;
        out.u64(1);
        out.u64(2);
        for x in [&a, &b] {
            out.bytes(&x.digest);
            out.u64(x.fence);
            out.i64(100);
            save_rest(out, x);
            out.u64(0);
        }
        out.i64(0);
        assert!(decode(&mut f.reader(), 3, NOW, STRICT).is_none());
        let d = decode(&mut f.reader(), 3, NOW, REPAIR).unwrap();
        assert_eq!(d.value.len(), 1);
        assert_eq!(d.repaired, vec![Problem::SameToken]);
        // Truncated: cannot be parsed, repair or not.
        let mut short = f.clone();
        short.items.pop();
        assert!(decode(&mut short.reader(), 3, NOW, REPAIR).is_none());
        // A fence above the ceiling.
        let low = Policy {
            ceiling: 0,
            repair: true,
        };
        let d = decode(&mut f.reader(), 3, NOW, low).unwrap();
        assert!(d.value.is_empty());
    }
}
