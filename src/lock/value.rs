//! What a lock key holds: its mode and its holders, and the one validity rule for them.
//!
//! Every way a value comes to exist goes through [`LockValue::insert`] (a grant, a
//! replicated change, a value decoded from RDB, DUMP or the AOF), and that is where the
//! rule lives: one holder per token digest, one holder per fence, fields in range, at most
//! one holder of an exclusive lock and at most `n` of a counted one. So the engine cannot
//! make a value its own loader would refuse.
//!
//! Leases are deadlines on the server's monotonic clock, in microseconds: no wall-clock
//! step shortens or stretches them. Shared and counted locks with many holders keep them
//! indexed, so that every operation costs O(log holders).

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use super::holder::{
    digest, Addr, Digest, Holder, Problem, MAX_ADDR_LEN, MAX_LIMIT, MAX_OWNER_LEN, MAX_TOKEN_LEN,
};

/// Shared and counted locks keep up to this many holders in a plain list.
const SMALL_MAX: usize = 16;

/// The three kinds of lock. The first acquire of a free key (with no waiters) picks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One holder (the default).
    Exclusive,
    /// A reader of a read-write lock: any number at once, never beside an exclusive one.
    Shared,
    /// A semaphore with this many permits (>= 1).
    Counted(u32),
}

/// Exclusive and shared holders can meet on one key (a read-write lock); a counted key
/// is a semaphore and takes only counted requests with the same limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    ReadWrite,
    Semaphore(u32),
}

impl Mode {
    pub fn family(self) -> Family {
        match self {
            Mode::Exclusive | Mode::Shared => Family::ReadWrite,
            Mode::Counted(n) => Family::Semaphore(n),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Counted(_) => "counted",
        }
    }

    /// The most holders a lock of this mode may have.
    pub fn capacity(self) -> usize {
        match self {
            Mode::Exclusive => 1,
            Mode::Shared => MAX_LIMIT as usize,
            Mode::Counted(n) => n as usize,
        }
    }
}

/// A request whose family does not match the key's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// Exclusive/SHARED on a semaphore, or LIMIT on a read-write lock.
    Mode,
    /// LIMIT n on a semaphore of another size.
    Limit(u32),
}

pub fn check_family(have: Family, want: Mode) -> Result<(), Mismatch> {
    match (have, want.family()) {
        (Family::ReadWrite, Family::ReadWrite) => Ok(()),
        (Family::Semaphore(a), Family::Semaphore(b)) if a == b => Ok(()),
        (Family::Semaphore(a), Family::Semaphore(_)) => Err(Mismatch::Limit(a)),
        _ => Err(Mismatch::Mode),
    }
}

pub fn check_mode(m: Mode) -> Result<(), Problem> {
    match m {
        Mode::Counted(n) if !(1..=MAX_LIMIT).contains(&n) => Err(Problem::BadMode),
        _ => Ok(()),
    }
}

/// A lock as stored in a key. The exclusive case, by far the most common, keeps its one
/// holder inline (one heap block per lock); shared and counted locks keep a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockValue {
    Exclusive(Holder),
    Many(Box<ManyHolders>),
}

/// The holders of a shared or counted lock, in fence order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManyHolders {
    mode: Mode,
    set: HolderSet,
    /// A running lock-delay: nothing is granted before this instant (µs; 0: none).
    delay_until: i64,
}

/// The holders of a value in fence order ([`LockValue::iter`]).
pub enum Holders<'a> {
    One(Option<&'a Holder>),
    Small(std::slice::Iter<'a, Holder>),
    Large(std::collections::btree_map::Values<'a, u64, Holder>),
}

impl<'a> Iterator for Holders<'a> {
    type Item = &'a Holder;

    fn next(&mut self) -> Option<&'a Holder> {
        match self {
            Holders::One(h) => h.take(),
            Holders::Small(it) => it.next(),
            Holders::Large(it) => it.next(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HolderSet {
    /// Few holders: a list in fence order, searched linearly.
    Small(Vec<Holder>),
    /// Many: by fence, by digest and by deadline.
    Large(Box<Indexed>),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Indexed {
    by_fence: BTreeMap<u64, Holder>,
    by_digest: HashMap<Digest, u64>,
    by_deadline: BTreeSet<(i64, u64)>,
}

impl Indexed {
    fn from_list(list: Vec<Holder>) -> Indexed {
        let mut x = Indexed::default();
        for h in list {
            x.by_digest.insert(h.digest, h.fence);
            x.by_deadline.insert((h.deadline, h.fence));
            x.by_fence.insert(h.fence, h);
        }
        x
    }

    fn remove(&mut self, fence: u64) -> Option<Holder> {
        let h = self.by_fence.remove(&fence)?;
        self.by_digest.remove(&h.digest);
        self.by_deadline.remove(&(h.deadline, h.fence));
        Some(h)
    }
}

impl ManyHolders {
    fn len(&self) -> usize {
        match &self.set {
            HolderSet::Small(v) => v.len(),
            HolderSet::Large(x) => x.by_fence.len(),
        }
    }
}

impl LockValue {
    /// A value with its first holder (which the caller checked with [`Holder::check`]).
    pub fn new(mode: Mode, first: Holder) -> LockValue {
        match mode {
            Mode::Exclusive => LockValue::Exclusive(first),
            m => LockValue::Many(Box::new(ManyHolders {
                mode: m,
                set: HolderSet::Small(vec![first]),
                delay_until: 0,
            })),
        }
    }

    /// A shared or counted value with no holder yet (what a loader fills, and what is
    /// left when a loader dropped every holder of a value it could read).
    pub fn empty(mode: Mode) -> LockValue {
        LockValue::Many(Box::new(ManyHolders {
            mode,
            set: HolderSet::Small(Vec::new()),
            delay_until: 0,
        }))
    }

    /// A key whose holders are gone while a lock-delay runs until `until` (µs).
    pub fn delayed(mode: Mode, until: i64) -> LockValue {
        let mut v = LockValue::empty(mode);
        v.set_delay(until);
        v
    }

    /// The end of a running lock-delay, if one was set.
    pub fn delay_until(&self) -> Option<i64> {
        match self {
            LockValue::Many(m) if m.delay_until != 0 => Some(m.delay_until),
            _ => None,
        }
    }

    /// Sets (or lengthens) the lock-delay of a shared, counted or emptied value; an
    /// exclusive value with its holder cannot carry one (the caller makes it `delayed`).
    pub fn set_delay(&mut self, until: i64) -> bool {
        match self {
            LockValue::Many(m) => {
                m.delay_until = m.delay_until.max(until);
                true
            }
            LockValue::Exclusive(_) => false,
        }
    }

    /// Forgets a lock-delay that has ended by `now`; true if there was one.
    pub fn clear_ended_delay(&mut self, now: i64) -> bool {
        match self {
            LockValue::Many(m) if m.delay_until != 0 && m.delay_until <= now => {
                m.delay_until = 0;
                true
            }
            _ => false,
        }
    }

    /// Whether a lock-delay still runs at `now`.
    pub fn delaying(&self, now: i64) -> bool {
        self.delay_until().is_some_and(|t| now < t)
    }

    pub fn mode(&self) -> Mode {
        match self {
            LockValue::Exclusive(_) => Mode::Exclusive,
            LockValue::Many(m) => m.mode,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            LockValue::Exclusive(_) => 1,
            LockValue::Many(m) => m.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every holder, in fence order, without allocating (the release path walks it).
    pub fn iter(&self) -> Holders<'_> {
        match self {
            LockValue::Exclusive(h) => Holders::One(Some(h)),
            LockValue::Many(m) => match &m.set {
                HolderSet::Small(v) => Holders::Small(v.iter()),
                HolderSet::Large(x) => Holders::Large(x.by_fence.values()),
            },
        }
    }

    /// The holders with a fence above `after`, in fence order (O(log n) to the first).
    pub fn iter_after(&self, after: u64) -> Box<dyn Iterator<Item = &Holder> + '_> {
        match self {
            LockValue::Many(m) => match &m.set {
                HolderSet::Large(x) => {
                    Box::new(x.by_fence.range(after.saturating_add(1)..).map(|(_, h)| h))
                }
                HolderSet::Small(v) => Box::new(v.iter().filter(move |h| h.fence > after)),
            },
            LockValue::Exclusive(h) => {
                Box::new(std::iter::once(h).filter(move |h| h.fence > after))
            }
        }
    }

    pub fn find(&self, d: &Digest) -> Option<&Holder> {
        match self {
            LockValue::Exclusive(h) => (h.digest == *d).then_some(h),
            LockValue::Many(m) => match &m.set {
                HolderSet::Small(v) => v.iter().find(|h| h.digest == *d),
                HolderSet::Large(x) => x.by_digest.get(d).and_then(|f| x.by_fence.get(f)),
            },
        }
    }

    pub fn find_fence(&self, fence: u64) -> Option<&Holder> {
        match self {
            LockValue::Exclusive(h) => (h.fence == fence).then_some(h),
            LockValue::Many(m) => match &m.set {
                HolderSet::Small(v) => v.iter().find(|h| h.fence == fence),
                HolderSet::Large(x) => x.by_fence.get(&fence),
            },
        }
    }

    /// The structural half of the validity rule: whether `h` may join this value. A
    /// value's holders are always ones this accepted.
    pub fn admissible(&self, h: &Holder) -> Result<(), Problem> {
        if self.find(&h.digest).is_some() {
            return Err(Problem::SameToken);
        }
        if self.find_fence(h.fence).is_some() {
            return Err(Problem::SameFence);
        }
        if self.len() >= self.mode().capacity() {
            return Err(Problem::Full);
        }
        Ok(())
    }

    /// Adds a holder to a shared or counted lock, if the validity rule allows it (for an
    /// exclusive lock the rule always says `Full`: a new holder means a new value).
    pub fn insert(&mut self, h: Holder, ceiling: u64) -> Result<(), Problem> {
        h.check(ceiling)?;
        self.admissible(&h)?;
        let LockValue::Many(m) = self else {
            return Err(Problem::Full);
        };
        match &mut m.set {
            HolderSet::Small(v) => {
                let at = v.partition_point(|x| x.fence < h.fence);
                v.insert(at, h);
                if v.len() > SMALL_MAX {
                    let list = std::mem::take(v);
                    m.set = HolderSet::Large(Box::new(Indexed::from_list(list)));
                }
            }
            HolderSet::Large(x) => {
                x.by_digest.insert(h.digest, h.fence);
                x.by_deadline.insert((h.deadline, h.fence));
                x.by_fence.insert(h.fence, h);
            }
        }
        Ok(())
    }

    /// Removes the holder with this fence; returns it. An exclusive value is left as it
    /// is (its one holder is the value: the caller deletes the key).
    pub fn remove_fence(&mut self, fence: u64) -> Option<Holder> {
        match self {
            LockValue::Exclusive(h) => (h.fence == fence).then(|| h.clone()),
            LockValue::Many(m) => match &mut m.set {
                HolderSet::Small(v) => {
                    let at = v.iter().position(|h| h.fence == fence)?;
                    Some(v.remove(at))
                }
                HolderSet::Large(x) => x.remove(fence),
            },
        }
    }

    /// Sets the owner label of the holder with this fence; returns it (None: no such
    /// holder).
    pub fn set_owner(&mut self, fence: u64, owner: Option<Box<[u8]>>) -> Option<&Holder> {
        let h = match self {
            LockValue::Exclusive(h) => Some(h).filter(|h| h.fence == fence),
            LockValue::Many(m) => match &mut m.set {
                HolderSet::Small(v) => v.iter_mut().find(|h| h.fence == fence),
                HolderSet::Large(x) => x.by_fence.get_mut(&fence),
            },
        }?;
        h.set_owner(owner);
        Some(h)
    }

    /// Sets the lease of the holder with this fence; false if there is none.
    pub fn set_deadline(&mut self, fence: u64, deadline: i64) -> bool {
        match self {
            LockValue::Exclusive(h) if h.fence == fence => {
                h.deadline = deadline;
                true
            }
            LockValue::Exclusive(_) => false,
            LockValue::Many(m) => match &mut m.set {
                HolderSet::Small(v) => match v.iter_mut().find(|h| h.fence == fence) {
                    Some(h) => {
                        h.deadline = deadline;
                        true
                    }
                    None => false,
                },
                HolderSet::Large(x) => match x.by_fence.get_mut(&fence) {
                    Some(h) => {
                        x.by_deadline.remove(&(h.deadline, fence));
                        h.deadline = deadline;
                        x.by_deadline.insert((deadline, fence));
                        true
                    }
                    None => false,
                },
            },
        }
    }

    /// The first instant at which a lease or the lock-delay ends (None for an empty
    /// value without a delay).
    pub fn next_lease_end(&self) -> Option<i64> {
        match self {
            LockValue::Exclusive(h) => Some(h.deadline),
            LockValue::Many(m) => {
                let lease = match &m.set {
                    HolderSet::Small(v) => v.iter().map(|h| h.deadline).min(),
                    HolderSet::Large(x) => x.by_deadline.first().map(|(d, _)| *d),
                };
                let delay = (m.delay_until != 0).then_some(m.delay_until);
                [lease, delay].into_iter().flatten().min()
            }
        }
    }

    /// The latest lease deadline (the lock is held until then, if nobody releases).
    pub fn last_lease_end(&self) -> Option<i64> {
        match self {
            LockValue::Exclusive(h) => Some(h.deadline),
            LockValue::Many(m) => match &m.set {
                HolderSet::Small(v) => v.iter().map(|h| h.deadline).max(),
                HolderSet::Large(x) => x.by_deadline.last().map(|(d, _)| *d),
            },
        }
    }

    /// Fences of the holders whose lease is over at `now`, earliest lease first.
    pub fn ended(&self, now: i64) -> Vec<u64> {
        match self {
            LockValue::Exclusive(h) => {
                if h.live(now) {
                    Vec::new()
                } else {
                    vec![h.fence]
                }
            }
            LockValue::Many(m) => match &m.set {
                HolderSet::Small(v) => v.iter().filter(|h| !h.live(now)).map(|h| h.fence).collect(),
                HolderSet::Large(x) => x
                    .by_deadline
                    .iter()
                    .take_while(|(d, _)| *d <= now)
                    .map(|(_, f)| *f)
                    .collect(),
            },
        }
    }

    /// How many holders are live at `now`.
    pub fn live_count(&self, now: i64) -> usize {
        match self {
            LockValue::Exclusive(h) => usize::from(h.live(now)),
            LockValue::Many(m) => match &m.set {
                HolderSet::Small(v) => v.iter().filter(|h| h.live(now)).count(),
                HolderSet::Large(x) => {
                    let ended = x.by_deadline.range(..(now, u64::MAX)).count();
                    x.by_fence.len() - ended.min(x.by_fence.len())
                }
            },
        }
    }

    /// Whether a new holder of `want` fits beside the live holders at `now` (the family
    /// was checked before).
    pub fn admits(&self, want: Mode, now: i64) -> bool {
        if self.delaying(now) {
            return false;
        }
        let live = self.live_count(now);
        if live == 0 {
            return true;
        }
        match (self.mode(), want) {
            (Mode::Shared, Mode::Shared) => true,
            (Mode::Counted(n), Mode::Counted(_)) => live < n as usize,
            _ => false,
        }
    }

    /// Heap bytes of the value (for MEMORY USAGE).
    pub fn heap_bytes(&self) -> usize {
        let holder = std::mem::size_of::<Holder>();
        let set = match self {
            LockValue::Exclusive(_) => 0,
            LockValue::Many(m) => {
                std::mem::size_of::<ManyHolders>()
                    + match &m.set {
                        HolderSet::Small(v) => v.capacity() * holder,
                        // B-tree nodes run about two thirds full; the digest map and the
                        // deadline index add their entries.
                        HolderSet::Large(x) => {
                            x.by_fence.len() * (holder + 8) * 3 / 2
                                + x.by_fence.len() * (24 + 16) * 3 / 2
                        }
                    }
            }
        };
        std::mem::size_of::<LockValue>() + set + self.iter().map(Holder::extra_bytes).sum::<usize>()
    }
}

impl LockValue {
    /// A value made without the validity rule: only `LOCK.DEBUG INJECT` makes one, to
    /// test that the loader repairs what it refuses.
    pub fn unchecked(mode: Mode, mut holders: Vec<Holder>) -> LockValue {
        if mode == Mode::Exclusive && holders.len() == 1 {
            if let Some(h) = holders.pop() {
                return LockValue::Exclusive(h);
            }
        }
        LockValue::Many(Box::new(ManyHolders {
            mode,
            set: HolderSet::Small(holders),
            delay_until: 0,
        }))
    }
}

/// Builds a value from loaded holders with the validity rule: in `repair` mode a holder
/// the rule refuses is dropped (its problem reported), otherwise the first refusal fails
/// the whole value. An exclusive value keeps its first acceptable holder.
pub fn build(
    mode: Mode,
    holders: Vec<Holder>,
    ceiling: u64,
    repair: bool,
) -> Result<(LockValue, Vec<Problem>), Problem> {
    check_mode(mode)?;
    let mut problems = Vec::new();
    let mut value = match mode {
        Mode::Exclusive => None,
        m => Some(LockValue::empty(m)),
    };
    for h in holders {
        let verdict = match &mut value {
            None => h
                .check(ceiling)
                .map(|()| value = Some(LockValue::Exclusive(h))),
            Some(v) => v.insert(h, ceiling),
        };
        if let Err(p) = verdict {
            if !repair {
                return Err(p);
            }
            problems.push(p);
        }
    }
    let value = value.unwrap_or_else(|| LockValue::empty(Mode::Shared));
    if value.is_empty() && !repair {
        return Err(Problem::Full);
    }
    Ok((value, problems))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn holder(fence: u64, deadline: i64) -> Holder {
        Holder::new(
            digest(&fence.to_le_bytes()),
            fence,
            deadline,
            0,
            1,
            Addr::None,
            None,
        )
    }

    const CEIL: u64 = u64::MAX;

    #[test]
    fn digests_are_stable_and_distinct() {
        assert_eq!(digest(b"abc"), digest(b"abc"));
        assert_ne!(digest(b"abc"), digest(b"abd"));
        // Pinned: the digest is part of the RDB/AOF/replication format (cross-checked
        // with the reference implementation: Python's `blake3` package, keyed mode).
        assert_eq!(
            digest(b"token"),
            [227, 227, 21, 212, 75, 13, 78, 245, 149, 30, 189, 29, 58, 80, 77, 46]
        );
    }

    #[test]
    fn addresses_pack_and_print_back() {
        for text in [
            "127.0.0.1:6379",
            "10.1.2.3:1",
            "::1:50000",
            "fe80::1:2",
            "/tmp/redis.sock:0",
            "weird",
        ] {
            let a = Addr::parse(text.as_bytes());
            assert_eq!(a.to_string(), text, "{a:?}");
        }
        assert!(matches!(Addr::parse(b"127.0.0.1:6379"), Addr::V4(..)));
        assert!(matches!(Addr::parse(b"::1:5"), Addr::V6(..)));
        assert_eq!(Addr::parse(b""), Addr::None);
        assert!(std::mem::size_of::<Addr>() <= 24);
    }

    #[test]
    fn an_exclusive_lock_is_one_48_byte_block() {
        assert_eq!(std::mem::size_of::<Holder>(), 48);
        assert_eq!(std::mem::size_of::<LockValue>(), 48);
    }

    #[test]
    fn a_holder_keeps_every_field_in_either_form() {
        let v4 = Addr::V4([10, 1, 2, 3], 65535);
        let v6 = Addr::parse(b"[::1]:5");
        let now = 1_800_000_000_000i64;
        let f = |ms: i64, shift: u32| (ms as u64) << shift;
        let cases = [
            // Compact: a fence from the clock (shift 10 and 20), MINFENCE an hour ahead.
            (f(now, 10), now, 7u64, v4.clone(), None),
            (f(now, 20), now - 5, u64::from(u32::MAX), Addr::None, None),
            (f(now + 3_600_000, 10), now, 1, v4.clone(), None),
            // Boxed: a grant time far from the fence, a large client id, an IPv6 or text
            // address, an owner label.
            (1, now, 1, v4.clone(), None),
            (f(now, 10), -1, 1, v4.clone(), None),
            (f(now, 10), now, u64::from(u32::MAX) + 1, v4.clone(), None),
            (f(now, 10), now, 3, v6, None),
            (f(now, 10), now, 3, Addr::parse(b"/tmp/s.sock:0"), None),
            (
                f(now, 10),
                now,
                3,
                v4.clone(),
                Some(b"me".to_vec().into_boxed_slice()),
            ),
        ];
        for (i, (fence, at, client, addr, owner)) in cases.into_iter().enumerate() {
            let h = Holder::new([1; 16], fence, 99, at, client, addr.clone(), owner.clone());
            let check = |h: &Holder| {
                assert_eq!(
                    (h.fence, h.deadline, h.acquired_at(), h.client_id()),
                    (fence, 99, at, client)
                );
                assert_eq!((h.addr(), h.owner()), (addr.clone(), owner.as_deref()));
            };
            assert_eq!(h.extra_bytes() == 0, i < 3, "case {i}: compact");
            check(&h);
            check(&h.clone());
            // Into the boxed form and back to equal.
            let s = h.clone().with_session(Some([2; 16])).with_lock_delay(5);
            check(&s);
            assert_eq!((s.session(), s.lock_delay()), (Some(&[2; 16]), 5));
            let back = s.with_session(None).with_lock_delay(0);
            assert_eq!(back, h);
            let mut o = h.clone();
            o.set_owner(Some(b"x".to_vec().into_boxed_slice()));
            assert_eq!(o.owner(), Some(&b"x"[..]));
            o.set_owner(owner.clone());
            assert_eq!(o, h);
        }
    }

    #[test]
    fn addresses_and_owners_round_trip_through_a_holder() {
        for (addr, owner) in [
            (Addr::V4([1, 2, 3, 4], 5), None),
            (
                Addr::V4([1, 2, 3, 4], 5),
                Some(b"o".to_vec().into_boxed_slice()),
            ),
            (Addr::V6([9; 16], 7), None),
            (
                Addr::Text(b"/s:0".to_vec().into()),
                Some(b"x".to_vec().into()),
            ),
            (Addr::None, None),
        ] {
            let h = Holder::new([1; 16], 2, 3, 4, 5, addr.clone(), owner.clone());
            assert_eq!(h.addr(), addr);
            assert_eq!(h.owner(), owner.as_deref());
        }
        assert_eq!(
            holder(1, 1).extra_bytes(),
            0,
            "no second block without owner"
        );
    }

    #[test]
    fn families() {
        use Mode::*;
        assert_eq!(check_family(Family::ReadWrite, Shared), Ok(()));
        assert_eq!(check_family(Family::ReadWrite, Exclusive), Ok(()));
        assert_eq!(
            check_family(Family::ReadWrite, Counted(2)),
            Err(Mismatch::Mode)
        );
        assert_eq!(
            check_family(Family::Semaphore(2), Shared),
            Err(Mismatch::Mode)
        );
        assert_eq!(
            check_family(Family::Semaphore(2), Counted(3)),
            Err(Mismatch::Limit(2))
        );
        assert_eq!(check_family(Family::Semaphore(2), Counted(2)), Ok(()));
    }

    #[test]
    fn the_rule_refuses_duplicates_and_overflow() {
        let mut s = LockValue::new(Mode::Shared, holder(1, 100));
        let mut twin = holder(2, 100);
        twin.digest = holder(1, 0).digest;
        assert_eq!(s.insert(twin, CEIL), Err(Problem::SameToken));
        let mut same_fence = holder(1, 100);
        same_fence.digest = [7; 16];
        assert_eq!(s.insert(same_fence, CEIL), Err(Problem::SameFence));
        assert_eq!(s.insert(holder(0, 1), CEIL), Err(Problem::FenceOutOfRange));
        assert_eq!(s.insert(holder(9, 1), 8), Err(Problem::FenceOutOfRange));
        let mut c = LockValue::new(Mode::Counted(2), holder(1, 100));
        c.insert(holder(2, 100), CEIL).unwrap();
        assert_eq!(c.insert(holder(3, 100), CEIL), Err(Problem::Full));
        let mut x = LockValue::new(Mode::Exclusive, holder(1, 100));
        assert_eq!(x.insert(holder(2, 100), CEIL), Err(Problem::Full));
        let mut long_owner = holder(5, 1);
        long_owner = Holder::new(
            long_owner.digest,
            5,
            1,
            0,
            1,
            Addr::None,
            Some(vec![b'o'; MAX_OWNER_LEN + 1].into()),
        );
        assert_eq!(s.insert(long_owner, CEIL), Err(Problem::OwnerLength));
    }

    #[test]
    fn admission_and_leases() {
        let x = LockValue::new(Mode::Exclusive, holder(1, 100));
        assert!(!x.admits(Mode::Shared, 50));
        assert!(x.admits(Mode::Shared, 100), "an ended lease admits anyone");
        let mut s = LockValue::new(Mode::Shared, holder(1, 100));
        assert!(s.admits(Mode::Shared, 50));
        assert!(!s.admits(Mode::Exclusive, 50));
        s.insert(holder(2, 200), CEIL).unwrap();
        assert_eq!(s.last_lease_end(), Some(200));
        assert_eq!(s.next_lease_end(), Some(100));
        assert_eq!(s.ended(150), vec![1]);
        assert!(s.set_deadline(1, 300));
        assert_eq!(s.next_lease_end(), Some(200));
        assert_eq!(s.remove_fence(2).map(|h| h.fence), Some(2));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn many_holders_are_indexed_and_paged() {
        let mut s = LockValue::new(Mode::Shared, holder(1, 1000));
        for f in 2..=100u64 {
            s.insert(holder(f, 1000 + f as i64), CEIL).unwrap();
        }
        assert!(matches!(&s, LockValue::Many(m) if matches!(m.set, HolderSet::Large(_))));
        assert_eq!(s.len(), 100);
        assert_eq!(s.find(&holder(50, 0).digest).map(|h| h.fence), Some(50));
        assert_eq!(s.next_lease_end(), Some(1000));
        assert_eq!(s.live_count(1050), 50);
        assert_eq!(s.ended(1002), vec![1, 2]);
        let page: Vec<u64> = s.iter_after(0).take(10).map(|h| h.fence).collect();
        assert_eq!(page, (1..=10).collect::<Vec<_>>());
        assert_eq!(s.iter_after(95).count(), 5);
        assert!(s.set_deadline(1, 5000));
        assert_eq!(s.next_lease_end(), Some(1002));
        assert_eq!(s.remove_fence(1).map(|h| h.fence), Some(1));
        assert!(s.find_fence(1).is_none());
        let mut twin = holder(500, 1);
        twin.digest = holder(7, 0).digest;
        assert_eq!(s.insert(twin, CEIL), Err(Problem::SameToken));
    }

    #[test]
    fn build_repairs_or_refuses() {
        let mut dup = holder(2, 1);
        dup.digest = holder(1, 1).digest;
        let hs = vec![holder(1, 1), dup.clone(), holder(3, 1)];
        assert_eq!(
            build(Mode::Shared, hs.clone(), CEIL, false),
            Err(Problem::SameToken)
        );
        let (v, problems) = build(Mode::Shared, hs, CEIL, true).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(problems, vec![Problem::SameToken]);
        let (v, problems) = build(
            Mode::Exclusive,
            vec![holder(1, 1), holder(2, 1)],
            CEIL,
            true,
        )
        .unwrap();
        assert_eq!((v.len(), v.mode()), (1, Mode::Exclusive));
        assert_eq!(problems, vec![Problem::Full]);
        let (v, _) = build(Mode::Exclusive, vec![holder(0, 1)], CEIL, true).unwrap();
        assert!(v.is_empty());
        assert!(build(Mode::Counted(0), vec![], CEIL, true).is_err());
    }
}
