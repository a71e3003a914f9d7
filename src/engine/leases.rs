//! The lease index: lock keys by the end of their earliest lease (or lock-delay), so that
//! the engine reaps each ended lease and serves the key's waiters on time.
//!
//! A timing wheel of one-millisecond buckets covering the next `SLOTS` ms (the default
//! lease fits): filing, finding and removing an entry costs a bucket index and a short
//! scan of that bucket. Entries further ahead wait in an ordered overflow map and move
//! into the wheel as it turns. An entry may be early (a lease was lengthened since): the
//! sweep then finds the lease still running and files the key again at its real end, so
//! lengthening a lease touches nothing here.

use std::collections::BTreeMap;

/// Buckets of the wheel: about 32.8 s ahead.
const SLOTS: usize = 1 << 15;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Monotonic µs.
    pub at: i64,
    pub db: i32,
    pub name: KeyName,
}

/// A key's name as filed: inline up to 22 bytes (most lock names), else on the heap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyName {
    Inline(u8, [u8; 22]),
    Heap(Box<[u8]>),
}

impl KeyName {
    fn of(b: &[u8]) -> KeyName {
        let mut buf = [0u8; 22];
        match buf.get_mut(..b.len()) {
            Some(dst) => {
                dst.copy_from_slice(b);
                KeyName::Inline(b.len() as u8, buf)
            }
            None => KeyName::Heap(b.into()),
        }
    }
}

impl std::ops::Deref for KeyName {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            KeyName::Inline(n, b) => &b[..usize::from(*n)],
            KeyName::Heap(h) => h,
        }
    }
}

const NIL: u32 = u32::MAX;

/// An entry in the slab, linked into its bucket.
#[derive(Debug)]
struct Node {
    lease: Lease,
    prev: u32,
    next: u32,
}

#[derive(Debug)]
pub struct Leases {
    /// The first node of each bucket (NIL: empty). Nodes live in `slab`, so a bucket
    /// costs no allocation of its own.
    wheel: Vec<u32>,
    slab: Vec<Node>,
    /// Free nodes of the slab, linked by `next`.
    free: u32,
    /// One bit per bucket that holds something, and one per word of those bits that has
    /// one set (to find the next bucket in use in a few steps).
    used: Vec<u64>,
    summary: Vec<u64>,
    /// No entry falls due before this (a lower bound, made exact at each sweep).
    hint: i64,
    /// The bucket (ms) the sweep has reached; every earlier bucket is empty.
    cursor: i64,
    overflow: BTreeMap<(i64, i32, Box<[u8]>), ()>,
    len: usize,
}

impl Default for Leases {
    fn default() -> Self {
        Leases {
            wheel: Vec::new(),
            slab: Vec::new(),
            free: NIL,
            used: Vec::new(),
            summary: Vec::new(),
            hint: i64::MAX,
            cursor: i64::MIN,
            overflow: BTreeMap::new(),
            len: 0,
        }
    }
}

fn ms(at: i64) -> i64 {
    at.div_euclid(1000)
}

fn slot(ms: i64) -> usize {
    ms.rem_euclid(SLOTS as i64) as usize
}

impl Leases {
    fn bucket_of(&self, at: i64) -> Option<usize> {
        let m = ms(at).max(self.cursor);
        (m < self.cursor.saturating_add(SLOTS as i64)).then(|| slot(m))
    }

    fn mark(&mut self, s: usize, on: bool) {
        let (w, bit) = (s / 64, 1u64 << (s % 64));
        if on {
            self.used[w] |= bit;
            self.summary[w / 64] |= 1 << (w % 64);
        } else {
            self.used[w] &= !bit;
            if self.used[w] == 0 {
                self.summary[w / 64] &= !(1 << (w % 64));
            }
        }
    }

    /// The nodes of bucket `s`, in list order.
    fn nodes(&self, s: usize) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.wheel[s];
        std::iter::from_fn(move || {
            let n = at;
            (n != NIL).then(|| {
                at = self.slab[n as usize].next;
                n
            })
        })
    }

    fn link(&mut self, s: usize, lease: Lease) {
        let head = self.wheel[s];
        let node = Node {
            lease,
            prev: NIL,
            next: head,
        };
        let n = if self.free != NIL {
            let n = self.free;
            self.free = self.slab[n as usize].next;
            self.slab[n as usize] = node;
            n
        } else {
            self.slab.push(node);
            (self.slab.len() - 1) as u32
        };
        if head != NIL {
            self.slab[head as usize].prev = n;
        }
        self.wheel[s] = n;
        self.mark(s, true);
    }

    /// Unlinks node `n` of bucket `s` and returns its lease.
    fn unlink(&mut self, s: usize, n: u32) -> Lease {
        let (prev, next) = {
            let node = &self.slab[n as usize];
            (node.prev, node.next)
        };
        if prev != NIL {
            self.slab[prev as usize].next = next;
        } else {
            self.wheel[s] = next;
        }
        if next != NIL {
            self.slab[next as usize].prev = prev;
        }
        let empty = Lease {
            at: 0,
            db: 0,
            name: KeyName::Inline(0, [0; 22]),
        };
        let lease = std::mem::replace(&mut self.slab[n as usize].lease, empty);
        self.slab[n as usize].next = self.free;
        self.free = n;
        if self.wheel[s] == NIL {
            self.mark(s, false);
        }
        self.len -= 1;
        lease
    }

    fn find(&self, s: usize, at: i64, db: i32, name: &[u8]) -> Option<u32> {
        self.nodes(s).find(|&n| {
            let l = &self.slab[n as usize].lease;
            l.at == at && l.db == db && *l.name == *name
        })
    }

    /// Files `name` (in `db`) to fall due at `at`; `now` is the engine's clock (the wheel
    /// starts turning there). An entry already due goes into the current bucket.
    pub fn insert(&mut self, at: i64, db: i32, name: &[u8], now: i64) {
        if self.wheel.is_empty() {
            self.wheel = vec![NIL; SLOTS];
            self.used = vec![0; SLOTS / 64];
            self.summary = vec![0; SLOTS / 64 / 64];
        }
        if self.cursor == i64::MIN {
            self.cursor = ms(now);
        }
        self.hint = self.hint.min(at);
        match self.bucket_of(at) {
            Some(s) => {
                if self.find(s, at, db, name).is_some() {
                    return;
                }
                let lease = Lease {
                    at,
                    db,
                    name: KeyName::of(name),
                };
                self.link(s, lease);
            }
            None => {
                if self.overflow.insert((at, db, name.into()), ()).is_some() {
                    return;
                }
            }
        }
        self.len += 1;
    }

    pub fn put_back(&mut self, l: Lease) {
        let cursor = self.cursor.saturating_mul(1000);
        self.insert(l.at, l.db, &l.name, cursor);
    }

    /// Removes the entry, if it is filed at exactly `at`.
    pub fn remove(&mut self, at: i64, db: i32, name: &[u8]) {
        if let Some(s) = self.bucket_of(at) {
            if let Some(n) = self.find(s, at, db, name) {
                self.unlink(s, n);
                return;
            }
        }
        // Look the overflow up by range (no copy of the name unless it is there).
        let found = self
            .overflow
            .range((at, db, Box::<[u8]>::default())..)
            .take_while(|((a, d, _), ())| *a == at && *d == db)
            .find(|((_, _, n), ())| **n == *name)
            .map(|(k, ())| k.clone());
        if let Some(k) = found {
            self.overflow.remove(&k);
            self.len -= 1;
        }
    }

    /// The first bucket in use at or after bucket `from` (by slot, not wrapping).
    fn used_from(&self, from: usize) -> Option<usize> {
        let w0 = from / 64;
        let bits = self.used[w0] & (!0u64 << (from % 64));
        if bits != 0 {
            return Some(w0 * 64 + bits.trailing_zeros() as usize);
        }
        // The next word with a bit set, found by the summary.
        let next = w0 + 1;
        let mut sw = next / 64;
        let mut sbits = *self.summary.get(sw)? & (!0u64 << (next % 64));
        loop {
            if sbits != 0 {
                let w = sw * 64 + sbits.trailing_zeros() as usize;
                return Some(w * 64 + self.used[w].trailing_zeros() as usize);
            }
            sw += 1;
            sbits = *self.summary.get(sw)?;
        }
    }

    /// The next bucket in use at or after the cursor (within one turn), as a millisecond.
    fn next_used(&self) -> Option<i64> {
        if self.used.is_empty() {
            return None;
        }
        let start = slot(self.cursor);
        let s = self.used_from(start).or_else(|| self.used_from(0))?;
        let ahead = (s + SLOTS - start) % SLOTS;
        Some(self.cursor + ahead as i64)
    }

    /// The exact earliest entry (a scan; the sweep calls it once it is done).
    pub fn settle_hint(&mut self) {
        let wheel = self.next_used().and_then(|m| {
            self.nodes(slot(m))
                .map(|n| self.slab[n as usize].lease.at)
                .min()
        });
        let over = self.overflow.keys().next().map(|(at, _, _)| *at);
        self.hint = [wheel, over]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(i64::MAX);
    }

    /// No entry falls due before this (None: empty). Early after removals, exact after
    /// [`Leases::settle_hint`].
    pub fn first_at(&self) -> Option<i64> {
        (self.len > 0).then_some(self.hint)
    }

    /// Takes out an entry due by `now` (µs), if there is one.
    pub fn pop_due(&mut self, now: i64) -> Option<Lease> {
        if self.len == 0 {
            return None;
        }
        for turned in [false, true] {
            if let Some(m) = self.next_used().filter(|m| *m <= ms(now)) {
                self.cursor = m;
                let s = slot(m);
                let due = self
                    .nodes(s)
                    .find(|&n| self.slab[n as usize].lease.at <= now);
                if let Some(n) = due {
                    return Some(self.unlink(s, n));
                }
                // Only this millisecond's bucket can hold entries not yet due.
                break;
            }
            if turned {
                break;
            }
            // Nothing in the wheel is due: it turns on to now and takes in what it reaches.
            self.cursor = self.cursor.max(ms(now));
            self.refill();
        }
        self.pop_overflow(now)
    }

    fn pop_overflow(&mut self, now: i64) -> Option<Lease> {
        let first = self.overflow.keys().next()?;
        if first.0 > now {
            return None;
        }
        let ((at, db, name), ()) = self.overflow.pop_first()?;
        self.len -= 1;
        Some(Lease {
            at,
            db,
            name: KeyName::of(&name),
        })
    }

    /// Moves the overflow entries the wheel now reaches into it.
    fn refill(&mut self) {
        let horizon = self.cursor.saturating_add(SLOTS as i64);
        while let Some((at, _, _)) = self.overflow.keys().next() {
            if ms(*at) >= horizon {
                break;
            }
            let Some(((at, db, name), ())) = self.overflow.pop_first() else {
                break;
            };
            self.len -= 1;
            self.put_back(Lease {
                at,
                db,
                name: KeyName::of(&name),
            });
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn drain(&mut self) -> Vec<Lease> {
        let mut all = Vec::with_capacity(self.len);
        for s in 0..self.wheel.len() {
            while self.wheel[s] != NIL {
                let n = self.wheel[s];
                all.push(self.unlink(s, n));
            }
        }
        let over = std::mem::take(&mut self.overflow);
        self.len -= over.len();
        all.extend(over.into_keys().map(|(at, db, name)| Lease {
            at,
            db,
            name: KeyName::of(&name),
        }));
        self.hint = i64::MAX;
        all
    }

    /// Forgets the entries of `db` (or of every db).
    pub fn forget_db(&mut self, db: Option<i32>) {
        for l in self.drain() {
            if db.is_some_and(|x| x != l.db) {
                self.put_back(l);
            }
        }
    }

    /// SWAPDB: the entries of `a` and `b` change places.
    pub fn swap_dbs(&mut self, a: i32, b: i32) {
        for mut l in self.drain() {
            l.db = if l.db == a {
                b
            } else if l.db == b {
                a
            } else {
                l.db
            };
            self.put_back(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn entries_come_out_in_time() {
        let mut l = Leases::default();
        l.insert(5_000, 0, b"b", 0);
        l.insert(3_000, 1, b"a", 0);
        l.insert(5_000, 0, b"a", 0);
        l.insert(5_000, 0, b"a", 0);
        l.insert(100_000_000, 0, b"far", 0);
        assert_eq!(l.len(), 4);
        l.settle_hint();
        assert_eq!(l.first_at(), Some(3_000));
        l.remove(5_000, 0, b"b");
        l.remove(5_000, 0, b"zzz");
        assert_eq!(l.len(), 3);
        assert!(l.pop_due(2_999).is_none());
        assert_eq!(l.pop_due(4_000).map(|x| x.at), Some(3_000));
        assert_eq!(
            l.pop_due(6_000).map(|x| (x.at, x.name.to_vec())),
            Some((5_000, b"a".to_vec()))
        );
        assert!(l.pop_due(6_000).is_none());
        l.swap_dbs(0, 1);
        assert_eq!(
            l.pop_due(200_000_000).map(|x| (x.db, x.at)),
            Some((1, 100_000_000))
        );
        assert_eq!(l.len(), 0);
    }

    proptest! {
        /// Against a sorted list: every entry comes out once, no earlier than due, and
        /// none due is left behind.
        #[test]
        fn the_wheel_agrees_with_a_sorted_list(
            ops in proptest::collection::vec((0u8..4, 0i64..200_000_000, 0u8..3), 1..300)
        ) {
            let mut l = Leases::default();
            let mut model: Vec<(i64, i32, Vec<u8>)> = Vec::new();
            let mut now = 0i64;
            for (op, t, k) in ops {
                let name = vec![b'k', k];
                match op {
                    0 | 1 => {
                        // Some entries are filed already due (a value loaded late).
                        let at = (now + t / 4).saturating_sub(if k == 2 { 5_000_000 } else { 0 });
                        l.insert(at, 0, &name, now);
                        if !model.contains(&(at, 0, name.clone())) {
                            model.push((at, 0, name));
                        }
                    }
                    2 => {
                        if let Some(e) = model.first().cloned() {
                            l.remove(e.0, e.1, &e.2);
                            model.retain(|x| *x != e);
                        }
                    }
                    _ => {
                        now += t / 100;
                        while let Some(x) = l.pop_due(now) {
                            prop_assert!(x.at <= now);
                            let e = (x.at, x.db, x.name.to_vec());
                            prop_assert!(model.contains(&e), "{e:?} not filed");
                            model.retain(|y| *y != e);
                        }
                        prop_assert!(model.iter().all(|e| e.0 > now), "left due: {model:?}");
                    }
                }
                prop_assert_eq!(l.len(), model.len());
                let first = model.iter().map(|e| e.0).min();
                prop_assert!(l.first_at() <= first || first.is_none(), "the hint must not be late");
                l.settle_hint();
                prop_assert_eq!(l.first_at(), first);
            }
        }
    }
}
