//! The pure lock state machine and the fencing rule. No FFI: the shell reads the key,
//! asks these functions what to do, and applies the answer.

use crate::args::MAX_FENCE;
use crate::error::LockError;

/// What a held module lock stores. The key's own expiry equals `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    pub token: Vec<u8>,
    pub fence: u64,
    /// Absolute lease deadline, unix ms.
    pub expires_at: i64,
    /// When this grant was made, unix ms.
    pub acquired_at: i64,
    pub owner: Option<Vec<u8>>,
    pub client_id: u64,
    pub client_addr: Vec<u8>,
}

/// What the lock key holds right now (Redis has already dropped it if expired).
#[derive(Debug, Clone, Copy)]
pub enum Current<'a> {
    Free,
    Module(&'a LockState),
    /// A classic `SET key token NX PX` lock: the string is the token.
    Classic(&'a [u8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireDecision {
    /// Free and nobody queued: make a new grant with a new fence.
    Grant,
    /// The caller's token already holds it: reset the lease, keep the fence.
    Renew,
    /// Held by someone else, or free with a queue that must be served first.
    Busy,
}

pub fn decide_acquire(
    current: Current<'_>,
    token: Option<&[u8]>,
    queued: usize,
) -> AcquireDecision {
    match current {
        Current::Free if queued == 0 => AcquireDecision::Grant,
        Current::Free => AcquireDecision::Busy,
        Current::Module(s) if token == Some(s.token.as_slice()) => AcquireDecision::Renew,
        Current::Module(_) | Current::Classic(_) => AcquireDecision::Busy,
    }
}

/// Whether `token` is the capability that holds this lock (RELEASE and EXTEND).
pub fn holds(current: Current<'_>, token: &[u8]) -> bool {
    match current {
        Current::Free => false,
        Current::Module(s) => s.token == token,
        Current::Classic(v) => v == token,
    }
}

/// `now + ttl`, refusing overflow.
pub fn lease_deadline(now: i64, ttl: u64, cmd: &'static str) -> Result<i64, LockError> {
    i64::try_from(ttl)
        .ok()
        .and_then(|t| now.checked_add(t))
        .ok_or(LockError::InvalidExpire(cmd))
}

/// Bits below the millisecond in the hybrid fence: about a million grants per ms.
pub const FENCE_SHIFT: u32 = 20;

/// How far ahead of this server's clock a client may push fences with MINFENCE. A
/// counter pushed far ahead of the clock loses the protection of the clock term after a
/// restart that lost it, so quorum clients (whose MINFENCE comes from other servers'
/// clocks) get a day of skew and no more.
pub const MINFENCE_MAX_LEAD_MS: i64 = 24 * 3600 * 1000;
/// How far ahead fences arriving from RESTORE, RDB files or the replication stream may
/// be. It only keeps a hostile value from exhausting the counter for good.
pub const LOADED_FENCE_MAX_LEAD_MS: i64 = 10 * 365 * 24 * 3600 * 1000;

/// The largest fence acceptable at `now_ms` with the given lead.
pub fn fence_ceiling(now_ms: i64, lead_ms: i64) -> u64 {
    let ms = u64::try_from(now_ms.saturating_add(lead_ms)).unwrap_or(0);
    ms.checked_shl(FENCE_SHIFT)
        .filter(|c| c >> FENCE_SHIFT == ms)
        .map_or(MAX_FENCE, |c| c.min(MAX_FENCE))
}

/// The per-server fencing counter. A new fence is the largest of: the last fence + 1,
/// the wall clock in ms shifted left by 20 bits, and a floor the caller asks for.
/// The clock term keeps fences rising after a restart or failover that lost the
/// counter's latest value, provided the new clock is ahead of the old one.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FenceClock {
    last: u64,
}

impl FenceClock {
    pub const fn new_const() -> Self {
        FenceClock { last: 0 }
    }

    pub fn last(&self) -> u64 {
        self.last
    }

    pub fn next(&mut self, now_ms: i64, floor: u64) -> Result<u64, LockError> {
        let clock = u64::try_from(now_ms)
            .ok()
            .and_then(|ms| ms.checked_shl(FENCE_SHIFT))
            .filter(|c| c >> FENCE_SHIFT == u64::try_from(now_ms).unwrap_or(0))
            .unwrap_or(0);
        let candidate = self
            .last
            .checked_add(1)
            .ok_or(LockError::FenceExhausted)?
            .max(clock)
            .max(floor);
        if candidate > MAX_FENCE {
            return Err(LockError::FenceExhausted);
        }
        self.last = candidate;
        Ok(candidate)
    }

    /// Learns a fence issued elsewhere (replication, AOF, RDB, RESTORE).
    pub fn observe(&mut self, fence: u64) {
        self.last = self.last.max(fence.min(MAX_FENCE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, VecDeque};

    fn state(token: &[u8], fence: u64) -> LockState {
        LockState {
            token: token.to_vec(),
            fence,
            expires_at: 10,
            acquired_at: 0,
            owner: None,
            client_id: 1,
            client_addr: b"127.0.0.1:1".to_vec(),
        }
    }

    #[test]
    fn acquire_decisions() {
        let s = state(b"a", 1);
        assert_eq!(
            decide_acquire(Current::Free, None, 0),
            AcquireDecision::Grant
        );
        assert_eq!(
            decide_acquire(Current::Free, Some(b"a"), 2),
            AcquireDecision::Busy
        );
        assert_eq!(
            decide_acquire(Current::Module(&s), Some(b"a"), 0),
            AcquireDecision::Renew
        );
        assert_eq!(
            decide_acquire(Current::Module(&s), Some(b"a"), 5),
            AcquireDecision::Renew
        );
        assert_eq!(
            decide_acquire(Current::Module(&s), Some(b"b"), 0),
            AcquireDecision::Busy
        );
        assert_eq!(
            decide_acquire(Current::Module(&s), None, 0),
            AcquireDecision::Busy
        );
        assert_eq!(
            decide_acquire(Current::Classic(b"a"), Some(b"a"), 0),
            AcquireDecision::Busy
        );
    }

    #[test]
    fn holds_checks_the_token() {
        let s = state(b"a", 1);
        assert!(holds(Current::Module(&s), b"a"));
        assert!(!holds(Current::Module(&s), b"A"));
        assert!(holds(Current::Classic(b"x"), b"x"));
        assert!(!holds(Current::Classic(b"x"), b"y"));
        assert!(!holds(Current::Free, b"x"));
    }

    #[test]
    fn fence_ceiling_tracks_the_clock() {
        let now = 1_800_000_000_000;
        assert_eq!(fence_ceiling(now, 1000), (now as u64 + 1000) << FENCE_SHIFT);
        assert!(fence_ceiling(now, LOADED_FENCE_MAX_LEAD_MS) < MAX_FENCE);
        assert_eq!(fence_ceiling(i64::MAX, 5), MAX_FENCE);
        assert_eq!(fence_ceiling(-10, 5), 0);
    }

    #[test]
    fn deadlines_refuse_overflow() {
        assert_eq!(lease_deadline(5, 10, "c"), Ok(15));
        assert!(lease_deadline(i64::MAX - 1, 10, "c").is_err());
        assert!(lease_deadline(0, u64::MAX, "c").is_err());
    }

    #[test]
    fn fences_follow_the_hybrid_rule() {
        let mut c = FenceClock::default();
        let a = c.next(1000, 0).unwrap();
        assert_eq!(a, 1000 << FENCE_SHIFT);
        assert_eq!(c.next(1000, 0).unwrap(), a + 1);
        // A clock that goes back does not make fences go back.
        assert_eq!(c.next(10, 0).unwrap(), a + 2);
        // A floor lifts the counter.
        assert_eq!(c.next(1000, a + 100).unwrap(), a + 100);
        c.observe(a + 500);
        assert_eq!(c.next(1000, 0).unwrap(), a + 501);
        // Negative clocks count as zero.
        let mut z = FenceClock::default();
        assert_eq!(z.next(-5, 0).unwrap(), 1);
        // Exhaustion is an error, never a wrap.
        let mut full = FenceClock::default();
        full.observe(MAX_FENCE);
        assert_eq!(full.next(0, 0), Err(LockError::FenceExhausted));
    }

    /// A tiny in-memory server built only from the functions above, to check the
    /// properties the module promises: one holder at a time, rising fences, FIFO.
    #[derive(Default)]
    struct Sim {
        now: i64,
        clock: FenceClock,
        keys: HashMap<u8, LockState>,
        queues: HashMap<u8, VecDeque<(u8, u64)>>,
        last_fence: u64,
        /// For each key, the (client, deadline) that the checker believes holds it.
        holder: HashMap<u8, (u8, i64)>,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire {
            key: u8,
            client: u8,
            ttl: u64,
            block: bool,
        },
        Release {
            key: u8,
            client: u8,
        },
        Extend {
            key: u8,
            client: u8,
            ttl: u64,
        },
        Force {
            key: u8,
        },
        Tick(u16),
    }

    fn token(client: u8) -> Vec<u8> {
        vec![b'c', client]
    }

    impl Sim {
        fn expire(&mut self) {
            let now = self.now;
            let gone: Vec<u8> = self
                .keys
                .iter()
                .filter(|(_, s)| s.expires_at <= now)
                .map(|(k, _)| *k)
                .collect();
            for k in gone {
                self.keys.remove(&k);
                self.handoff(k);
            }
        }

        fn grant(&mut self, key: u8, client: u8, ttl: u64, floor: u64) {
            // The checker's own view: nobody may hold a live lease at a grant.
            if let Some((c, until)) = self.holder.get(&key) {
                assert!(
                    *until <= self.now,
                    "grant to {client} while {c} holds key {key}"
                );
            }
            let fence = self.clock.next(self.now, floor).unwrap();
            assert!(fence > self.last_fence, "fence went back");
            self.last_fence = fence;
            let expires_at = lease_deadline(self.now, ttl, "t").unwrap();
            self.keys.insert(
                key,
                LockState {
                    token: token(client),
                    fence,
                    expires_at,
                    acquired_at: self.now,
                    owner: None,
                    client_id: u64::from(client),
                    client_addr: Vec::new(),
                },
            );
            self.holder.insert(key, (client, expires_at));
        }

        fn handoff(&mut self, key: u8) {
            if self.keys.contains_key(&key) {
                return;
            }
            if let Some((client, ttl)) = self.queues.get_mut(&key).and_then(|q| q.pop_front()) {
                self.grant(key, client, ttl, 0);
            }
        }

        fn current(&self, key: u8) -> Current<'_> {
            self.keys.get(&key).map_or(Current::Free, Current::Module)
        }

        fn apply(&mut self, op: Op) {
            self.expire();
            match op {
                Op::Acquire {
                    key,
                    client,
                    ttl,
                    block,
                } => {
                    let queued = self.queues.get(&key).map_or(0, |q| q.len());
                    let tok = token(client);
                    match decide_acquire(self.current(key), Some(&tok), queued) {
                        AcquireDecision::Grant => self.grant(key, client, ttl, 0),
                        AcquireDecision::Renew => {
                            let deadline = lease_deadline(self.now, ttl, "t").unwrap();
                            let s = self.keys.get_mut(&key).unwrap();
                            s.expires_at = deadline;
                            self.holder.insert(key, (client, deadline));
                        }
                        AcquireDecision::Busy => {
                            let q = self.queues.entry(key).or_default();
                            if block && !q.iter().any(|(c, _)| *c == client) {
                                q.push_back((client, ttl));
                            }
                        }
                    }
                }
                Op::Release { key, client } => {
                    if holds(self.current(key), &token(client)) {
                        self.keys.remove(&key);
                        self.holder.remove(&key);
                        self.handoff(key);
                    }
                }
                Op::Extend { key, client, ttl } => {
                    if holds(self.current(key), &token(client)) {
                        let deadline = lease_deadline(self.now, ttl, "t").unwrap();
                        let s = self.keys.get_mut(&key).unwrap();
                        s.expires_at = deadline;
                        self.holder.insert(key, (client, deadline));
                    }
                }
                Op::Force { key } => {
                    if self.keys.remove(&key).is_some() {
                        self.holder.remove(&key);
                        self.handoff(key);
                    }
                }
                Op::Tick(ms) => self.now += i64::from(ms),
            }
            // A held key never coexists with a queue that could have been served.
            for (k, q) in &self.queues {
                if !q.is_empty() {
                    assert!(self.keys.contains_key(k), "waiters starve on a free key");
                }
            }
        }
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..3, 0u8..6, 1u64..50, any::<bool>()).prop_map(|(key, client, ttl, block)| {
                Op::Acquire {
                    key,
                    client,
                    ttl,
                    block,
                }
            }),
            (0u8..3, 0u8..6).prop_map(|(key, client)| Op::Release { key, client }),
            (0u8..3, 0u8..6, 1u64..50).prop_map(|(key, client, ttl)| Op::Extend {
                key,
                client,
                ttl
            }),
            (0u8..3).prop_map(|key| Op::Force { key }),
            (0u16..40).prop_map(Op::Tick),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn one_holder_and_rising_fences(ops in proptest::collection::vec(op(), 1..200),
                                        start in 0i64..5_000_000_000_000) {
            let mut sim = Sim { now: start, ..Sim::default() };
            for o in ops {
                sim.apply(o);
            }
        }

        #[test]
        fn fence_clock_is_strictly_increasing(steps in proptest::collection::vec(
            (-1000i64..1_000_000_000_000, 0u64..(1u64 << 50), any::<bool>()), 1..100)) {
            let mut c = FenceClock::default();
            let mut prev = 0;
            for (now, floor, observe) in steps {
                if observe {
                    c.observe(floor);
                    prop_assert!(c.last() >= floor.min(MAX_FENCE));
                    prev = prev.max(c.last());
                } else {
                    let f = c.next(now, floor).unwrap();
                    prop_assert!(f > prev && f >= floor);
                    prev = f;
                }
            }
        }
    }
}
