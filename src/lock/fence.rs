//! The per-server fencing counter.
//!
//! A new fence is the largest of: the last fence + 1; the clock term `unix_ms << shift`;
//! the start-up floor `(start_ms + FENCE_LEAD_MS) << shift`; and a floor the caller asks
//! for (MINFENCE). The clock term keeps fences rising after a restart or failover that
//! lost the counter's latest value, provided the new clock is ahead of the old one. The
//! start-up floor (taken at module load and at every promotion to primary) covers what
//! can lead the clock: a MINFENCE lift (at most `FENCE_LEAD_MS` ahead) and bursts of
//! more than `2^shift` grants in one millisecond.
//!
//! `shift` is 10 on a new deployment, so fences stay below 2^53 (exact in JavaScript and
//! Lua) until the year 2248. A server that already issued fences with the 0.1 release's
//! shift of 20 (its counter is above 2^53) keeps that shift, so that its clock term still
//! covers what it issued; `fence-shift 20` at load time keeps the old scale for a server
//! that restarts without its data.

use crate::error::LockError;

/// Fences are replied as signed 64-bit integers; keep one value of head-room for `+1`.
pub const MAX_FENCE: u64 = i64::MAX as u64 - 1;

/// The shift of a new deployment.
pub const SHIFT: u32 = 10;
/// The shift of the 0.1 release, kept by servers whose fences are already that large.
pub const LEGACY_SHIFT: u32 = 20;
/// The largest integer a double holds exactly; counters above it use `LEGACY_SHIFT`.
pub const MAX_EXACT: u64 = (1 << 53) - 1;

/// How far ahead of this server's clock MINFENCE may push the counter, and how far the
/// counter jumps ahead at start-up and promotion.
pub const FENCE_LEAD_MS: i64 = 3600 * 1000;
/// How far ahead of the clock term a fence arriving from elsewhere (RESTORE, RDB and AOF
/// files, the replication stream) may be. It only keeps a hostile value from exhausting
/// the counter for good.
pub const LOADED_FENCE_MAX_LEAD_MS: i64 = 10 * 365 * 24 * 3600 * 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceClock {
    last: u64,
    /// Unix ms of the module load or the latest promotion; 0 for none.
    start_ms: i64,
    /// The configured shift (`fence-shift`), 10 or 20.
    min_shift: u32,
}

impl Default for FenceClock {
    fn default() -> Self {
        FenceClock::new()
    }
}

/// `ms << shift`, saturating at `MAX_FENCE`; negative times count as 0.
pub fn clock_term(ms: i64, shift: u32) -> u64 {
    let ms = u64::try_from(ms).unwrap_or(0);
    ms.checked_shl(shift)
        .filter(|c| c >> shift == ms)
        .map_or(MAX_FENCE, |c| c.min(MAX_FENCE))
}

impl FenceClock {
    pub const fn new() -> Self {
        FenceClock {
            last: 0,
            start_ms: 0,
            min_shift: SHIFT,
        }
    }

    pub fn last(&self) -> u64 {
        self.last
    }

    pub fn set_min_shift(&mut self, shift: u32) {
        self.min_shift = shift;
    }

    /// The shift in use: the legacy one once the counter is past 2^53.
    pub fn shift(&self) -> u32 {
        if self.last > MAX_EXACT {
            self.min_shift.max(LEGACY_SHIFT)
        } else {
            self.min_shift
        }
    }

    /// Marks a fresh start of granting (module load, promotion to primary).
    pub fn start(&mut self, now_ms: i64) {
        self.start_ms = self.start_ms.max(now_ms);
    }

    /// The largest fence acceptable at `now_ms` with the given lead.
    pub fn ceiling(&self, now_ms: i64, lead_ms: i64) -> u64 {
        clock_term(now_ms.saturating_add(lead_ms), self.shift())
    }

    /// The largest fence a value or change from elsewhere may carry. On the scale in use
    /// (RESTORE, the live replication stream), so that no payload moves a server from
    /// exact fences to the 0.1 release's scale; while the server loads its own files or
    /// its primary's snapshot (`loading`), on the 0.1 scale, so that a server upgraded
    /// from 0.1 keeps loading what it wrote.
    pub fn loaded_ceiling(&self, now_ms: i64, loading: bool) -> u64 {
        let shift = if loading {
            self.shift().max(LEGACY_SHIFT)
        } else {
            self.shift()
        };
        clock_term(now_ms.saturating_add(LOADED_FENCE_MAX_LEAD_MS), shift)
    }

    /// The lowest fence the next grant may carry, before the caller's floor.
    fn base(&self, now_ms: i64) -> u64 {
        let shift = self.shift();
        let start = if self.start_ms > 0 {
            clock_term(self.start_ms.saturating_add(FENCE_LEAD_MS), shift)
        } else {
            0
        };
        clock_term(now_ms, shift).max(start)
    }

    pub fn next(&mut self, now_ms: i64, floor: u64) -> Result<u64, LockError> {
        let candidate = self
            .last
            .checked_add(1)
            .ok_or(LockError::FenceExhausted)?
            .max(self.base(now_ms))
            .max(floor);
        if candidate > MAX_FENCE {
            return Err(LockError::FenceExhausted);
        }
        self.last = candidate;
        Ok(candidate)
    }

    /// Learns a fence issued elsewhere (replication, AOF, RDB, RESTORE) or a floor.
    pub fn observe(&mut self, fence: u64) {
        self.last = self.last.max(fence.min(MAX_FENCE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fences_follow_the_hybrid_rule() {
        let mut c = FenceClock::new();
        let a = c.next(1000, 0).unwrap();
        assert_eq!(a, 1000 << SHIFT);
        assert_eq!(c.next(1000, 0).unwrap(), a + 1);
        // A clock that goes back does not make fences go back.
        assert_eq!(c.next(10, 0).unwrap(), a + 2);
        // A floor lifts the counter.
        assert_eq!(c.next(1000, a + 100).unwrap(), a + 100);
        c.observe(a + 500);
        assert_eq!(c.next(1000, 0).unwrap(), a + 501);
        let mut z = FenceClock::new();
        assert_eq!(z.next(-5, 0).unwrap(), 1);
        let mut full = FenceClock::new();
        full.observe(MAX_FENCE);
        assert_eq!(full.next(0, 0), Err(LockError::FenceExhausted));
    }

    #[test]
    fn a_start_jumps_ahead_by_the_lead() {
        let mut c = FenceClock::new();
        c.start(1_000_000);
        let f = c.next(1_000_000, 0).unwrap();
        assert_eq!(f, clock_term(1_000_000 + FENCE_LEAD_MS, SHIFT));
        // Anything MINFENCE could have lifted the counter to before a restart at 999_999
        // is below the first fence after it.
        let old = FenceClock::new();
        assert!(old.ceiling(999_999, FENCE_LEAD_MS) < f);
    }

    #[test]
    fn counters_past_2_pow_53_keep_the_legacy_shift() {
        let mut c = FenceClock::new();
        let now = 1_800_000_000_000;
        assert!(c.next(now, 0).unwrap() <= MAX_EXACT);
        c.observe(clock_term(now - 5000, LEGACY_SHIFT));
        assert_eq!(c.shift(), LEGACY_SHIFT);
        assert_eq!(c.next(now, 0).unwrap(), clock_term(now, LEGACY_SHIFT));
        let mut forced = FenceClock::new();
        forced.set_min_shift(LEGACY_SHIFT);
        assert_eq!(forced.next(now, 0).unwrap(), clock_term(now, LEGACY_SHIFT));
    }

    #[test]
    fn new_fences_fit_in_a_double_until_2248() {
        let year_2248_ms = (2248 - 1970) * 365 * 24 * 3600 * 1000i64;
        assert!(clock_term(year_2248_ms, SHIFT) <= MAX_EXACT);
    }

    proptest! {
        #[test]
        fn strictly_increasing(steps in proptest::collection::vec(
            (-1000i64..4_000_000_000_000, 0u64..(1u64 << 55), 0u8..4), 1..100)) {
            let mut c = FenceClock::new();
            let mut prev = 0;
            for (now, floor, what) in steps {
                match what {
                    0 => {
                        c.observe(floor);
                        prev = prev.max(c.last());
                    }
                    1 => c.start(now),
                    _ => {
                        let f = c.next(now, floor).unwrap();
                        prop_assert!(f > prev && f >= floor);
                        prev = f;
                    }
                }
            }
        }

        /// A restart that loses the counter (keeping at most an older value) still issues
        /// fences above everything issued before, as long as the new clock is not behind
        /// the old one and at most 2^shift grants were made per ms.
        #[test]
        fn a_lossy_restart_never_goes_back(
            t0 in 1_000_000i64..4_000_000_000_000,
            steps in proptest::collection::vec((0i64..5000, any::<bool>()), 1..60),
            restart_after in 1i64..10_000,
        ) {
            let mut c = FenceClock::new();
            c.start(t0);
            let mut now = t0;
            let mut highest = 0;
            for (dt, lift) in steps {
                now += dt;
                let floor = if lift { c.ceiling(now, FENCE_LEAD_MS) } else { 0 };
                highest = c.next(now, floor).unwrap();
            }
            let mut fresh = FenceClock::new();
            fresh.start(now + restart_after);
            prop_assert!(fresh.next(now + restart_after, 0).unwrap() > highest);
        }
    }
}
