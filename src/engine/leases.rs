//! The lease index: lock keys by the end of their earliest lease (or lock-delay), so that
//! the engine reaps each ended lease and serves the key's waiters on time.
//!
//! A timing wheel in two levels, both in one slab of nodes (filing, finding and removing
//! an entry costs a bucket index and a short scan of that bucket, and no allocation once
//! the slab has grown): one-millisecond buckets for the block of [`BLOCK`] ms the wheel
//! is in and the next one, then one bucket per block for the next [`COARSE`] blocks
//! (about 18 h: any lease a lock is given in practice). When the wheel enters a block,
//! the coarse bucket of the block after it moves, whole, into the millisecond buckets.
//! Only entries further ahead than that wait in an ordered overflow map. An entry may be
//! early (a lease was lengthened since): the sweep then finds the lease still running and
//! files the key again at its real end, so lengthening a lease touches nothing here.

use std::collections::BTreeMap;

/// Millisecond buckets: two blocks, about 32.8 s.
const SLOTS: usize = 1 << 15;
/// A block of the coarse level, in ms (half the millisecond level).
const BLOCK: i64 = (SLOTS / 2) as i64;
/// Coarse buckets, one block each: about 18.6 h ahead.
const COARSE: usize = 1 << 12;

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
/// `prev` of a node on the free list.
const FREE: u32 = u32::MAX - 1;

/// An entry in the slab, linked into its bucket and into its chain of the index.
#[derive(Debug)]
struct Node {
    at: i64,
    db: i32,
    /// The next node of the same index chain.
    hnext: u32,
    name: KeyName,
    prev: u32,
    next: u32,
}

/// The nodes, in chunks of [`Slab::CHUNK`]: growing adds a chunk (no copy of the nodes
/// there are, and at most one chunk's worth of room unused), and the whole slab goes when
/// the index is emptied.
#[derive(Debug, Default)]
struct Slab(Vec<Vec<Node>>);

impl Slab {
    const CHUNK: u32 = 1024;

    fn len(&self) -> u32 {
        self.0.last().map_or(0, |c| {
            (self.0.len() as u32 - 1) * Self::CHUNK + c.len() as u32
        })
    }

    /// Adds a node; its number.
    fn push(&mut self, node: Node) -> u32 {
        let n = self.len();
        match self.0.last_mut() {
            Some(c) if c.len() < Self::CHUNK as usize => c.push(node),
            _ => {
                let mut c = Vec::with_capacity(Self::CHUNK as usize);
                c.push(node);
                self.0.push(c);
            }
        }
        n
    }
}

impl std::ops::Index<u32> for Slab {
    type Output = Node;
    fn index(&self, n: u32) -> &Node {
        &self.0[(n / Self::CHUNK) as usize][(n % Self::CHUNK) as usize]
    }
}

impl std::ops::IndexMut<u32> for Slab {
    fn index_mut(&mut self, n: u32) -> &mut Node {
        &mut self.0[(n / Self::CHUNK) as usize][(n % Self::CHUNK) as usize]
    }
}

/// Where an entry is filed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// A bucket of the wheel: `< SLOTS` a millisecond, else a coarse block.
    Bucket(usize),
    Overflow,
}

#[derive(Debug)]
pub struct Leases {
    /// The first node of each bucket (NIL: empty): the millisecond buckets, then the
    /// coarse ones. Nodes live in `slab`, so a bucket costs no allocation of its own.
    heads: Vec<u32>,
    slab: Slab,
    /// Free nodes of the slab, linked by `next`.
    free: u32,
    /// The nodes by `(at, db, name)`: chains through `hnext`, a power of two of them
    /// (at least half as many as nodes), so that finding an entry to remove costs the same in a
    /// millisecond bucket and in a coarse one holding thousands.
    index: Vec<u32>,
    /// One bit per millisecond bucket that holds something, and one per word of those
    /// bits that has one set (to find the next bucket in use in a few steps); one bit per
    /// coarse bucket.
    used: Vec<u64>,
    summary: Vec<u64>,
    coarse_used: Vec<u64>,
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
            heads: Vec::new(),
            slab: Slab::default(),
            free: NIL,
            index: Vec::new(),
            used: Vec::new(),
            summary: Vec::new(),
            coarse_used: Vec::new(),
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

fn block(ms: i64) -> i64 {
    ms.div_euclid(BLOCK)
}

fn coarse_bucket(block: i64) -> usize {
    SLOTS + block.rem_euclid(COARSE as i64) as usize
}

/// Chain of `hash` in an index of `size` chains (a power of two).
fn chain_index(hash: u64, size: usize) -> usize {
    (hash >> (64 - size.trailing_zeros())) as usize
}

/// The index's hash of an entry.
fn hash(at: i64, db: i32, name: &[u8]) -> u64 {
    let seed = (at as u64).rotate_left(20) ^ (db as u64) ^ ((name.len() as u64) << 56);
    super::word_hash(seed, name)
}

impl Leases {
    /// Where an entry due at `at` goes with the wheel where it is now: the millisecond
    /// buckets hold this block and the next (an entry already due goes to the cursor's
    /// bucket), the coarse ones the [`COARSE`] blocks after those.
    fn place(&self, at: i64) -> Place {
        let m = ms(at).max(self.cursor);
        let ahead = block(m) - block(self.cursor);
        if ahead <= 1 {
            Place::Bucket(slot(m))
        } else if ahead < 2 + COARSE as i64 {
            Place::Bucket(coarse_bucket(block(m)))
        } else {
            Place::Overflow
        }
    }

    fn mark(&mut self, b: usize, on: bool) {
        if b >= SLOTS {
            let (w, bit) = ((b - SLOTS) / 64, 1u64 << ((b - SLOTS) % 64));
            if on {
                self.coarse_used[w] |= bit;
            } else {
                self.coarse_used[w] &= !bit;
            }
            return;
        }
        let (w, bit) = (b / 64, 1u64 << (b % 64));
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

    /// The nodes of bucket `b`, in list order.
    fn nodes(&self, b: usize) -> impl Iterator<Item = u32> + '_ {
        let mut at = self.heads[b];
        std::iter::from_fn(move || {
            let n = at;
            (n != NIL).then(|| {
                at = self.slab[n].next;
                n
            })
        })
    }

    fn chain_of(&self, at: i64, db: i32, name: &[u8]) -> usize {
        self.chain(hash(at, db, name))
    }

    /// The chain of a hash: its top bits (a multiplicative hash mixes into those).
    fn chain(&self, hash: u64) -> usize {
        chain_index(hash, self.index.len())
    }

    /// Puts `lease` (whose [`hash`] is `hash`) in a new node at the head of bucket `b`
    /// and into the index (which has room: see [`Leases::insert`]).
    fn link(&mut self, b: usize, hash: u64, lease: Lease) {
        let h = self.chain(hash);
        let hnext = self.index[h];
        let n = if self.free != NIL {
            let n = self.free;
            let node = &mut self.slab[n];
            self.free = node.next;
            (node.at, node.db, node.hnext, node.name) = (lease.at, lease.db, hnext, lease.name);
            n
        } else {
            self.slab.push(Node {
                at: lease.at,
                db: lease.db,
                hnext,
                name: lease.name,
                prev: NIL,
                next: NIL,
            })
        };
        self.index[h] = n;
        self.len += 1;
        self.attach(b, n);
    }

    /// Links node `n` at the head of bucket `b`.
    fn attach(&mut self, b: usize, n: u32) {
        let head = self.heads[b];
        let node = &mut self.slab[n];
        (node.prev, node.next) = (NIL, head);
        if head != NIL {
            self.slab[head].prev = n;
        } else {
            self.mark(b, true);
        }
        self.heads[b] = n;
    }

    /// Takes node `n` out of bucket `b` (it stays in the slab and the index).
    fn detach(&mut self, b: usize, n: u32) {
        let (prev, next) = {
            let node = &self.slab[n];
            (node.prev, node.next)
        };
        if prev != NIL {
            self.slab[prev].next = next;
        } else {
            self.heads[b] = next;
        }
        if next != NIL {
            self.slab[next].prev = prev;
        }
        if self.heads[b] == NIL {
            self.mark(b, false);
        }
    }

    /// Unlinks node `n` of bucket `b` (from the bucket, the index and the slab) and
    /// returns its lease.
    fn unlink(&mut self, b: usize, n: u32) -> Lease {
        self.detach(b, n);
        let (at, db) = (self.slab[n].at, self.slab[n].db);
        let h = self.chain_of(at, db, &self.slab[n].name);
        let after = self.slab[n].hnext;
        if self.index[h] == n {
            self.index[h] = after;
        } else {
            let mut p = self.index[h];
            while p != NIL && self.slab[p].hnext != n {
                p = self.slab[p].hnext;
            }
            if p != NIL {
                self.slab[p].hnext = after;
            }
        }
        let name = std::mem::replace(&mut self.slab[n].name, KeyName::Inline(0, [0; 22]));
        self.slab[n].prev = FREE;
        self.slab[n].next = self.free;
        self.free = n;
        self.len -= 1;
        Lease { at, db, name }
    }

    /// Doubles the index (at least 1,024 chains), rebuilt from the nodes in use.
    fn grow_index(&mut self) {
        let size = (self.index.len() * 2).max(1024);
        self.index = vec![NIL; size];
        for n in 0..self.slab.len() {
            let node = &mut self.slab[n];
            if node.prev != FREE {
                let h = chain_index(hash(node.at, node.db, &node.name), size);
                node.hnext = self.index[h];
                self.index[h] = n;
            }
        }
    }

    fn find(&self, hash: u64, at: i64, db: i32, name: &[u8]) -> Option<u32> {
        if self.index.is_empty() {
            return None;
        }
        let mut n = self.index[self.chain(hash)];
        while n != NIL {
            let node = &self.slab[n];
            if node.at == at && node.db == db && *node.name == *name {
                return Some(n);
            }
            n = node.hnext;
        }
        None
    }

    /// Files `name` (in `db`) to fall due at `at`; `now` is the engine's clock (the wheel
    /// starts turning there). An entry already due goes into the current bucket.
    pub fn insert(&mut self, at: i64, db: i32, name: &[u8], now: i64) {
        if self.heads.is_empty() {
            self.heads = vec![NIL; SLOTS + COARSE];
            self.used = vec![0; SLOTS / 64];
            self.summary = vec![0; SLOTS / 64 / 64];
            self.coarse_used = vec![0; COARSE / 64];
        }
        if self.cursor == i64::MIN {
            self.cursor = ms(now);
        }
        self.hint = self.hint.min(at);
        match self.place(at) {
            Place::Bucket(b) => {
                // Chains of two on average at most.
                if self.len >= 2 * self.index.len() {
                    self.grow_index();
                }
                let h = hash(at, db, name);
                if self.find(h, at, db, name).is_none() {
                    let name = KeyName::of(name);
                    self.link(b, h, Lease { at, db, name });
                }
            }
            Place::Overflow => {
                if self.overflow.insert((at, db, name.into()), ()).is_none() {
                    self.len += 1;
                }
            }
        }
    }

    pub fn put_back(&mut self, l: Lease) {
        let cursor = self.cursor.saturating_mul(1000);
        self.insert(l.at, l.db, &l.name, cursor);
    }

    /// Removes the entry, if it is filed at exactly `at`.
    pub fn remove(&mut self, at: i64, db: i32, name: &[u8]) {
        if self.heads.is_empty() {
            return;
        }
        if let Place::Bucket(b) = self.place(at) {
            if let Some(n) = self.find(hash(at, db, name), at, db, name) {
                self.unlink(b, n);
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

    /// The first bucket in use among `bits` at or after `from` (not wrapping); `summary`
    /// (one bit per word of `bits`), when given, skips empty words.
    fn used_from(bits: &[u64], summary: Option<&[u64]>, from: usize) -> Option<usize> {
        let w0 = from / 64;
        let first = *bits.get(w0)? & (!0u64 << (from % 64));
        if first != 0 {
            return Some(w0 * 64 + first.trailing_zeros() as usize);
        }
        let next = w0 + 1;
        let Some(summary) = summary else {
            let (w, word) = bits.iter().enumerate().skip(next).find(|(_, b)| **b != 0)?;
            return Some(w * 64 + word.trailing_zeros() as usize);
        };
        let mut sw = next / 64;
        let mut sbits = *summary.get(sw)? & (!0u64 << (next % 64));
        loop {
            if sbits != 0 {
                let w = sw * 64 + sbits.trailing_zeros() as usize;
                return Some(w * 64 + bits[w].trailing_zeros() as usize);
            }
            sw += 1;
            sbits = *summary.get(sw)?;
        }
    }

    /// The next millisecond bucket in use at or after the cursor (within one turn), as a
    /// millisecond.
    fn next_used(&self) -> Option<i64> {
        if self.used.is_empty() {
            return None;
        }
        let start = slot(self.cursor);
        let (bits, summary) = (&self.used[..], Some(&self.summary[..]));
        let s =
            Self::used_from(bits, summary, start).or_else(|| Self::used_from(bits, summary, 0))?;
        let ahead = (s + SLOTS - start) % SLOTS;
        Some(self.cursor + ahead as i64)
    }

    /// The next coarse bucket in use, in block order from the first the level holds.
    fn next_coarse(&self) -> Option<usize> {
        if self.coarse_used.is_empty() {
            return None;
        }
        let start = coarse_bucket(block(self.cursor) + 2) - SLOTS;
        let bits = &self.coarse_used[..];
        let b = Self::used_from(bits, None, start).or_else(|| Self::used_from(bits, None, 0))?;
        Some(SLOTS + b)
    }

    /// The exact earliest entry (a scan; the sweep calls it once it is done). The
    /// millisecond level holds the earliest entries, the coarse level the next ones.
    pub fn settle_hint(&mut self) {
        let earliest = |b: usize| self.nodes(b).map(|n| self.slab[n].at).min();
        let wheel = match self.next_used() {
            Some(m) => earliest(slot(m)),
            None => self.next_coarse().and_then(earliest),
        };
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

    /// Turns the wheel on to millisecond `to`: the coarse buckets of the blocks it now
    /// holds to the millisecond come down whole, and the overflow entries it now reaches
    /// come in.
    fn advance(&mut self, to: i64) {
        let (from, to) = (self.cursor, to.max(self.cursor));
        self.cursor = to;
        let (b0, b1) = (block(from), block(to));
        // The blocks that move from the coarse level to the millisecond one: those after
        // `from`'s next one up to `to`'s next one (at most every coarse bucket once).
        let first = b0 + 2;
        let last = (b1 + 1).min(b0 + 1 + COARSE as i64);
        for blk in first..=last {
            let b = coarse_bucket(blk);
            while self.heads[b] != NIL {
                let n = self.heads[b];
                self.detach(b, n);
                // Every entry of these blocks now belongs to the millisecond buckets.
                let to = match self.place(self.slab[n].at) {
                    Place::Bucket(to) => to,
                    Place::Overflow => slot(self.cursor),
                };
                self.attach(to, n);
            }
        }
        let horizon = (b1 + 2 + COARSE as i64).saturating_mul(BLOCK);
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

    /// Takes out an entry due by `now` (µs), if there is one.
    pub fn pop_due(&mut self, now: i64) -> Option<Lease> {
        if self.len == 0 || self.heads.is_empty() {
            return self.pop_overflow(now);
        }
        for turned in [false, true] {
            if let Some(m) = self.next_used().filter(|m| *m <= ms(now)) {
                self.advance(m);
                let s = slot(m);
                let due = self.nodes(s).find(|&n| self.slab[n].at <= now);
                if let Some(n) = due {
                    return Some(self.unlink(s, n));
                }
                // Only this millisecond's bucket can hold entries not yet due.
                break;
            }
            if turned {
                break;
            }
            // Nothing in the millisecond level is due: the wheel turns on to now and takes
            // in what it reaches.
            self.advance(ms(now));
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

    pub fn len(&self) -> usize {
        self.len
    }

    fn drain(&mut self) -> Vec<Lease> {
        let mut all = Vec::with_capacity(self.len);
        for b in 0..self.heads.len() {
            while self.heads[b] != NIL {
                let n = self.heads[b];
                all.push(self.unlink(b, n));
            }
        }
        // Every node is free: the memory goes back (FLUSHALL, FLUSHDB, SWAPDB are rare).
        (self.slab, self.free, self.index) = (Slab::default(), NIL, Vec::new());
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

    #[test]
    fn long_leases_come_down_the_levels_on_time() {
        let mut l = Leases::default();
        let min = 60_000_000;
        // 10 min and 5 h (the coarse level), 3 days (the overflow), 20 s (milliseconds).
        for (at, name) in [
            (10 * min, &b"ten"[..]),
            (300 * min, b"five-h"),
            (4320 * min, b"days"),
            (20_000_000, b"soon"),
        ] {
            l.insert(at, 0, name, 0);
        }
        l.insert(10 * min, 0, b"removed", 0);
        l.remove(10 * min, 0, b"removed");
        assert_eq!(l.len(), 4);
        l.settle_hint();
        assert_eq!(l.first_at(), Some(20_000_000));
        assert_eq!(l.pop_due(20_000_000).map(|x| x.at), Some(20_000_000));
        l.settle_hint();
        assert_eq!(l.first_at(), Some(10 * min), "the earliest coarse entry");
        assert!(l.pop_due(10 * min - 1).is_none());
        // Removable from the millisecond level once it came down.
        l.insert(11 * min, 0, b"later", 9 * min);
        l.remove(11 * min, 0, b"later");
        assert_eq!(
            l.pop_due(10 * min).map(|x| x.name.to_vec()),
            Some(b"ten".to_vec())
        );
        assert!(l.pop_due(299 * min).is_none());
        // A jump of days takes in everything due on the way, in one sweep (overdue
        // entries in no particular order).
        let mut out = vec![];
        while let Some(x) = l.pop_due(5000 * min) {
            out.push(x.name.to_vec());
        }
        out.sort();
        assert_eq!(out, [b"days".to_vec(), b"five-h".to_vec()]);
        assert_eq!(l.len(), 0);
    }

    #[test]
    fn thousands_in_one_coarse_bucket_are_found_and_removed() {
        let mut l = Leases::default();
        let base = 600_000_000; // 10 min: all in one or two coarse buckets
        let name = |i: u32| format!("lock:{i:08}").into_bytes();
        for i in 0..5_000 {
            l.insert(base + i64::from(i), i as i32 % 3, &name(i), 0);
        }
        // Filed twice: still one entry.
        l.insert(base + 7, 7 % 3, &name(7), 0);
        assert_eq!(l.len(), 5_000);
        for i in (0..5_000).step_by(2) {
            l.remove(base + i64::from(i), i as i32 % 3, &name(i));
        }
        assert_eq!(l.len(), 2_500);
        l.settle_hint();
        assert_eq!(l.first_at(), Some(base + 1));
        let mut out = vec![];
        while let Some(x) = l.pop_due(base + 10_000) {
            out.push(x.at - base);
        }
        out.sort();
        assert_eq!(out, (1..5_000).step_by(2).collect::<Vec<i64>>());
        assert_eq!(l.len(), 0);
    }

    proptest! {
        /// Against a sorted list: every entry comes out once, no earlier than due, and
        /// none due is left behind.
        #[test]
        fn the_wheel_agrees_with_a_sorted_list(
            ops in proptest::collection::vec((0u8..4, 0i64..200_000_000, 0u8..3, 0usize..3), 1..300)
        ) {
            let mut l = Leases::default();
            let mut model: Vec<(i64, i32, Vec<u8>)> = Vec::new();
            let mut now = 0i64;
            for (op, t, k, scale) in ops {
                // Leases of seconds (the millisecond level), hours (the coarse level) and
                // days (the overflow), and time passing as fast.
                let t = t * [1, 1_000, 10_000][scale];
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
