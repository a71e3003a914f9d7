//! What one cell's clients recorded, and the figures derived from it (pure).

pub use redis_lock_report::contention::{RoleStats, Summary};

/// One critical section, ns since the cell started (one monotonic clock for all threads):
/// wanted (about to send the first attempt), asked (that request written: the thread can
/// be descheduled in between), granted (reply), releasing (about to send), released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquisition {
    pub client: usize,
    pub wanted: u64,
    pub asked: u64,
    pub granted: u64,
    pub releasing: u64,
    pub released: u64,
}

/// One client thread's record: its commands (every attempt, wait and release), round
/// trips (a MULTI ... EXEC in one write is one), and how long it had waited if it gave up.
#[derive(Debug, Clone, Default)]
pub struct ClientLog {
    pub acquisitions: Vec<Acquisition>,
    pub commands: u64,
    pub round_trips: u64,
    pub gave_up_after: Option<u64>,
}

/// Nearest-rank percentile (`p` in 0..=100) of a sorted slice; 0 for an empty one.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Jain's index (Σx)² / (n·Σx²); 1.0 for no clients or nothing acquired.
pub fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    div_or(sum * sum, counts.len() as f64 * sq, 1.0)
}

/// `a / b`, or `none` when `b` is not positive.
fn div_or(a: f64, b: f64, none: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        none
    }
}

/// What a client asks for: a shared (read) hold, an exclusive one, a semaphore's permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Reader,
    Writer,
    Permit,
}

/// What may hold the lock at once (a grant that breaks it is a violation): any readers or
/// one writer alone (a `Permit` counts as a writer), or at most `n` of any kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    ReadWrite,
    Limit(u32),
}

/// Holders at once: the most at one instant, grants against the rule, and on average
/// (the critical sections' total length ÷ `elapsed_ns`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Concurrency {
    pub peak: u64,
    pub violations: u64,
    pub mean: f64,
}

/// Sweeps `[granted, releasing]` of every acquisition: the server held the lock for the
/// client at least over that span, so two that overlap are two holders at once (a grant
/// and a release at the same instant do not overlap).
pub fn concurrency(acqs: &[(Acquisition, Role)], rule: Rule, elapsed_ns: u64) -> Concurrency {
    // (time, order, role, +1/-1): at one instant releases of real spans first, then
    // grants, then the releases of zero-length spans (which hold for that instant).
    let mut events: Vec<(u64, u8, Role, bool)> = Vec::with_capacity(acqs.len() * 2);
    for &(a, role) in acqs {
        let end = a.releasing.max(a.granted);
        events.push((a.granted, 1, role, true));
        events.push((end, if end == a.granted { 2 } else { 0 }, role, false));
    }
    events.sort_by_key(|e| (e.0, e.1));
    let (mut readers, mut writers, mut peak, mut violations) = (0u64, 0u64, 0u64, 0u64);
    for (_, _, role, grant) in events {
        let reader = role == Role::Reader;
        if grant {
            let broken = match rule {
                Rule::ReadWrite if reader => writers > 0,
                Rule::ReadWrite => readers + writers > 0,
                Rule::Limit(n) => readers + writers >= u64::from(n),
            };
            violations += u64::from(broken);
        }
        let count = if reader { &mut readers } else { &mut writers };
        *count = if grant {
            *count + 1
        } else {
            count.saturating_sub(1)
        };
        peak = peak.max(readers + writers);
    }
    let held: u64 = acqs
        .iter()
        .map(|(a, _)| a.releasing.saturating_sub(a.granted))
        .sum();
    let mean = div_or(held as f64, elapsed_ns as f64, 0.0);
    Concurrency {
        peak,
        violations,
        mean,
    }
}

/// How much later than a writer's written request a reader must have started to ask to
/// overtake it: covers the server reading requests that arrived together in another order.
pub const OVERTAKE_MARGIN_NS: u64 = 1_000_000;

/// Reader grants that overtook a waiting writer (asked [`OVERTAKE_MARGIN_NS`] after the
/// writer's request was written, granted before it): the total, and the most in one
/// writer's wait. A FIFO queue bounds the latter by the readers (one request in flight
/// each); a lock that lets readers in while a writer waits does not (starvation).
pub fn overtakes(acqs: &[(Acquisition, Role)]) -> (u64, u64) {
    let mut readers: Vec<(u64, u64)> = acqs
        .iter()
        .filter(|(_, r)| *r == Role::Reader)
        .map(|(a, _)| (a.granted, a.wanted))
        .collect();
    readers.sort_unstable();
    let (mut total, mut most) = (0, 0);
    for (w, _) in acqs.iter().filter(|(_, r)| *r == Role::Writer) {
        // A reader that asked after the writer was granted after it asked, too.
        let after = w.asked.max(w.wanted) + OVERTAKE_MARGIN_NS;
        let from = readers.partition_point(|&(granted, _)| granted < after);
        let to = readers.partition_point(|&(granted, _)| granted < w.granted);
        let window = readers.get(from..to).unwrap_or(&[]);
        let past = window
            .iter()
            .filter(|&&(_, wanted)| wanted >= after)
            .count() as u64;
        total += past;
        most = most.max(past);
    }
    (total, most)
}

/// Throughput, waits and fairness of some of a cell's clients; `elapsed_s` is the cell's.
pub fn role_stats(logs: &[&ClientLog], elapsed_s: f64) -> RoleStats {
    let acquisitions: u64 = logs.iter().map(|l| l.acquisitions.len() as u64).sum();
    let mut waits: Vec<u64> = logs
        .iter()
        .flat_map(|l| l.acquisitions.iter())
        .map(|a| a.granted.saturating_sub(a.wanted))
        .chain(logs.iter().filter_map(|l| l.gave_up_after))
        .collect();
    waits.sort_unstable();
    let counts: Vec<u64> = logs.iter().map(|l| l.acquisitions.len() as u64).collect();
    let ms = |ns: u64| ns as f64 / 1e6;
    RoleStats {
        clients: logs.len(),
        acquisitions,
        per_second: div_or(acquisitions as f64, elapsed_s, 0.0),
        wait_p50_ms: ms(percentile(&waits, 50.0)),
        wait_p99_ms: ms(percentile(&waits, 99.0)),
        wait_max_ms: ms(waits.last().copied().unwrap_or(0)),
        jain: jain(&counts),
        gave_up: logs.iter().filter(|l| l.gave_up_after.is_some()).count() as u64,
    }
}

/// The figures of a cell: `roles[i]` is what client `i` (its index in `logs`) asked for,
/// `rule` what may hold the lock at once.
pub fn summarize(logs: &[ClientLog], roles: &[Role], rule: Rule) -> Summary {
    let role_of = |i: usize| roles.get(i).copied().unwrap_or(Role::Writer);
    let mut acqs: Vec<(Acquisition, Role)> = logs
        .iter()
        .flat_map(|l| l.acquisitions.iter())
        .map(|&a| (a, role_of(a.client)))
        .collect();
    acqs.sort_by_key(|(a, _)| a.granted);
    let end = acqs.iter().map(|(a, _)| a.released).max().unwrap_or(0);
    let elapsed_s = end as f64 / 1e9;
    let some = |want: Role| {
        let group: Vec<&ClientLog> = (logs.iter().enumerate())
            .filter_map(|(i, l)| (role_of(i) == want).then_some(l))
            .collect();
        (!group.is_empty()).then(|| role_stats(&group, elapsed_s))
    };
    // A hand-off: a release, then the next grant, when that went to another client (at
    // one client alone, its own next grant).
    let single_client = logs.iter().filter(|l| !l.acquisitions.is_empty()).count() <= 1;
    let pairs: Vec<&[(Acquisition, Role)]> = acqs.windows(2).collect();
    let same = pairs
        .iter()
        .filter(|w| w[1].0.client == w[0].0.client)
        .count();
    let mut handoffs: Vec<u64> = (pairs.iter())
        .filter(|w| single_client || w[1].0.client != w[0].0.client)
        .map(|w| w[1].0.granted.saturating_sub(w[0].0.released))
        .collect();
    handoffs.sort_unstable();
    let holds: Vec<f64> = (acqs.iter())
        .map(|(a, _)| a.releasing.saturating_sub(a.granted) as f64 / 1e6)
        .collect();
    let all: Vec<&ClientLog> = logs.iter().collect();
    let acquisitions = acqs.len() as u64;
    let per_acq = |total: u64| div_or(total as f64, acquisitions as f64, f64::INFINITY);
    let c = concurrency(&acqs, rule, end);
    let (overtakes, overtakes_most) = overtakes(&acqs);
    let us = |p: f64| percentile(&handoffs, p) as f64 / 1e3;
    Summary {
        elapsed_s,
        all: role_stats(&all, elapsed_s),
        readers: some(Role::Reader),
        writers: some(Role::Writer),
        commands_per_acquisition: per_acq(logs.iter().map(|l| l.commands).sum()),
        round_trips_per_acquisition: per_acq(logs.iter().map(|l| l.round_trips).sum()),
        peak_holders: c.peak,
        mean_holders: c.mean,
        violations: c.violations,
        overtakes,
        overtakes_most,
        handoff_p50_us: us(50.0),
        handoff_p99_us: us(99.0),
        handoffs: handoffs.len() as u64,
        same_client_again: same as f64 / pairs.len().max(1) as f64,
        hold_mean_ms: holds.iter().sum::<f64>() / holds.len().max(1) as f64,
        hold_max_ms: holds.iter().copied().fold(0.0, f64::max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(acquisitions: Vec<Acquisition>, commands: u64, gave_up_after: Option<u64>) -> ClientLog {
        let round_trips = commands;
        ClientLog {
            acquisitions,
            commands,
            round_trips,
            gave_up_after,
        }
    }

    /// A mutex cell's figures (every client a writer, one holder at a time).
    fn mutex(logs: &[ClientLog]) -> Summary {
        summarize(logs, &vec![Role::Writer; logs.len()], Rule::Limit(1))
    }

    /// One client's log with 4 commands.
    fn single(acquisitions: Vec<Acquisition>) -> Vec<ClientLog> {
        vec![log(acquisitions, 4, None)]
    }

    /// A critical section (client, wanted, granted, releasing, released) whose first
    /// request was written as soon as it was wanted.
    fn span(client: usize, [wanted, granted, releasing, released]: [u64; 4]) -> Acquisition {
        let asked = wanted;
        Acquisition {
            client,
            wanted,
            asked,
            granted,
            releasing,
            released,
        }
    }

    /// The release sent 10 ns before its reply.
    fn acq(client: usize, wanted: u64, granted: u64, released: u64) -> Acquisition {
        let releasing = released.saturating_sub(10);
        span(client, [wanted, granted, releasing, released])
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn jain_is_one_when_even_and_one_over_n_when_one_client_takes_all() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[8, 0, 0, 0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn summary_pairs_each_grant_with_the_previous_release() {
        let logs = [
            log(
                vec![acq(0, 0, 1_000, 2_000), acq(0, 2_000, 5_500, 6_000)],
                5,
                None,
            ),
            log(vec![acq(1, 0, 2_500, 5_000)], 3, Some(9_000_000)),
        ];
        let s = mutex(&logs);
        assert_eq!(s.all.acquisitions, 3);
        // Grants at 1000, 2500, 5500; releases before them at 2000 and 5000.
        assert_eq!(s.handoff_p50_us, 0.5);
        assert_eq!(s.handoff_p99_us, 0.5);
        assert_eq!(s.commands_per_acquisition, 8.0 / 3.0);
        assert_eq!(s.all.wait_max_ms, 9.0, "the given-up wait counts");
        assert_eq!(s.handoffs, 2);
        assert_eq!(s.same_client_again, 0.0);
        assert_eq!(s.all.gave_up, 1);
        assert_eq!(s.violations, 0);
        assert!((s.elapsed_s - 6e-6).abs() < 1e-12);
    }

    #[test]
    fn a_releaser_that_takes_the_lock_again_is_not_a_handoff() {
        let mut logs = single(vec![acq(0, 0, 1_000, 2_000), acq(0, 2_000, 2_100, 3_000)]);
        logs.push(log(vec![acq(1, 0, 8_000, 9_000)], 9, None));
        let s = mutex(&logs);
        assert_eq!(s.handoffs, 1);
        assert_eq!(s.handoff_p99_us, 5.0);
        assert_eq!(s.same_client_again, 0.5);
        assert_eq!(s.all.wait_max_ms, 0.008);
    }

    #[test]
    fn one_client_counts_its_own_reacquires() {
        let logs = single(vec![acq(0, 0, 1_000, 2_000), acq(0, 2_000, 2_300, 3_000)]);
        let s = mutex(&logs);
        assert_eq!(s.handoffs, 1);
        assert_eq!(s.handoff_p50_us, 0.3);
    }

    #[test]
    fn a_grant_before_the_previous_holder_released_is_an_overlap() {
        let logs = single(vec![acq(0, 0, 1_000, 3_000), acq(1, 0, 2_000, 4_000)]);
        assert_eq!(mutex(&logs).violations, 1);
    }

    #[test]
    fn a_grant_reply_that_beats_the_release_reply_counts_as_zero() {
        let logs = single(vec![
            span(0, [0, 100, 200, 400]),
            span(1, [0, 300, 500, 600]),
        ]);
        let s = mutex(&logs);
        assert_eq!(s.handoff_p99_us, 0.0);
        assert_eq!(s.violations, 0);
    }

    fn rw(client: usize, granted: u64, releasing: u64) -> Acquisition {
        span(client, [0, granted, releasing, releasing + 5])
    }

    #[test]
    fn readers_may_overlap_but_not_a_writer() {
        let r = |client, g, r| (rw(client, g, r), Role::Reader);
        let w = |client, g, r| (rw(client, g, r), Role::Writer);
        // Two readers together, then a writer after both left: no violation.
        let ok = [r(0, 10, 50), r(1, 20, 60), w(2, 60, 90)];
        let c = concurrency(&ok, Rule::ReadWrite, 100);
        assert_eq!((c.peak, c.violations), (2, 0));
        assert!((c.mean - 1.1).abs() < 1e-12, "40 + 40 + 30 ns of 100");
        // A writer granted while a reader holds, and a reader granted inside a write.
        let bad = [r(0, 10, 50), w(2, 40, 80), r(1, 70, 75)];
        let c = concurrency(&bad, Rule::ReadWrite, 100);
        assert_eq!((c.peak, c.violations), (2, 2));
        // The same spans under a limit of 2 break nothing; under a limit of 1, both.
        assert_eq!(concurrency(&bad, Rule::Limit(2), 100).violations, 0);
        assert_eq!(concurrency(&bad, Rule::Limit(1), 100).violations, 2);
    }

    #[test]
    fn a_limit_counts_every_holder_and_touching_spans_do_not_overlap() {
        let p = |client, g, r| (rw(client, g, r), Role::Permit);
        let three = [p(0, 0, 30), p(1, 10, 40), p(2, 20, 50), p(3, 30, 60)];
        let c = concurrency(&three, Rule::Limit(3), 60);
        assert_eq!(c.peak, 3, "the fourth grant comes as the first release");
        assert_eq!(c.violations, 0);
        assert_eq!(concurrency(&three, Rule::Limit(2), 60).violations, 2);
        // A zero-length hold still holds for its instant.
        let instant = [p(0, 10, 40), p(1, 20, 20)];
        let c = concurrency(&instant, Rule::Limit(1), 40);
        assert_eq!((c.peak, c.violations), (2, 1));
        assert_eq!(concurrency(&[], Rule::ReadWrite, 0).mean, 0.0);
    }

    #[test]
    fn readers_that_ask_after_a_waiting_writer_and_get_in_first_overtake_it() {
        const MS: u64 = 1_000_000;
        let a = |wanted, granted| span(0, [wanted, granted, granted + 1, granted + 2]);
        let acqs = [
            // The writer waits from 10 to 50 ms.
            (a(10 * MS, 50 * MS), Role::Writer),
            // Asked before it: not an overtake, even if granted while it waits.
            (a(5 * MS, 20 * MS), Role::Reader),
            // Asked less than the margin after it: not counted either.
            (a(10 * MS + 999_999, 12 * MS), Role::Reader),
            // Asked while it waits, granted before it: two overtakes.
            (a(11 * MS, 30 * MS), Role::Reader),
            (a(40 * MS, 50 * MS - 1), Role::Reader),
            // Asked while it waits, granted after it (or with it): none.
            (a(20 * MS, 50 * MS), Role::Reader),
            (a(45 * MS, 90 * MS), Role::Reader),
            // Another writer waiting from 60 to 70 ms is not a reader.
            (a(60 * MS, 70 * MS), Role::Writer),
        ];
        assert_eq!(overtakes(&acqs), (2, 2));
        assert_eq!(overtakes(&acqs[1..]), (0, 0), "without the first writer");

        // A writer thread descheduled for 3 ms between taking its start time and writing
        // its request: readers that asked in between reached the server first.
        let stalled = Acquisition {
            asked: 13 * MS,
            ..a(10 * MS, 20 * MS)
        };
        let acqs = [
            (stalled, Role::Writer),
            (a(12 * MS, 15 * MS), Role::Reader),
            (a(13 * MS + 500_000, 16 * MS), Role::Reader),
            (a(14 * MS, 17 * MS), Role::Reader),
        ];
        assert_eq!(
            overtakes(&acqs),
            (1, 1),
            "only the reader that asked at 14 ms"
        );
        // Two writers' waits, passed by 1 and 2 readers: the most for one is 2.
        let two = [
            (a(10 * MS, 20 * MS), Role::Writer),
            (a(12 * MS, 15 * MS), Role::Reader),
            (a(30 * MS, 40 * MS), Role::Writer),
            (a(32 * MS, 35 * MS), Role::Reader),
            (a(33 * MS, 36 * MS), Role::Reader),
        ];
        assert_eq!(overtakes(&two), (3, 2));
    }

    #[test]
    fn kind_summary_splits_readers_from_writers() {
        let reader = |client, wanted, granted, releasing| {
            span(client, [wanted, granted, releasing, releasing + 1_000])
        };
        let logs = vec![
            log(
                vec![
                    reader(0, 0, 1_000, 3_000_000),
                    reader(0, 6_000_000, 6_001_000, 9_000_000),
                ],
                4,
                None,
            ),
            ClientLog {
                round_trips: 3,
                ..log(vec![reader(1, 0, 2_000, 3_000_000)], 6, None)
            },
            log(
                vec![reader(2, 1_000, 3_001_000, 6_000_000)],
                5,
                Some(4_000_000),
            ),
        ];
        let roles = [Role::Reader, Role::Reader, Role::Writer];
        let s = summarize(&logs, &roles, Rule::ReadWrite);
        assert!((s.elapsed_s - 0.009_001).abs() < 1e-12);
        assert_eq!(s.all.acquisitions, 4);
        let r = s.readers.expect("readers");
        let w = s.writers.expect("writers");
        assert_eq!((r.clients, r.acquisitions), (2, 3));
        assert_eq!((w.clients, w.acquisitions), (1, 1));
        assert!((r.per_second - 3.0 / 0.009_001).abs() < 1e-6);
        // The writer waited 3 ms for its grant, then 4 ms before giving up.
        assert_eq!(w.wait_p50_ms, 3.0);
        assert_eq!(w.wait_max_ms, 4.0);
        assert_eq!(w.gave_up, 1);
        assert_eq!(r.wait_max_ms, 0.002);
        assert!(
            (r.jain - 0.9).abs() < 1e-12,
            "2 and 1 acquisitions: 9 / (2 · 5)"
        );
        assert_eq!(s.commands_per_acquisition, 15.0 / 4.0);
        assert_eq!(s.round_trips_per_acquisition, 3.0);
        assert_eq!((s.peak_holders, s.violations), (2, 0));
        assert_eq!(
            s.overtakes, 0,
            "the writer asked at 1 µs, after both readers"
        );
        // A semaphore cell has no readers and no writers, only clients.
        let permits = [Role::Permit; 3];
        let s = summarize(&logs, &permits, Rule::Limit(1));
        assert!(s.readers.is_none() && s.writers.is_none());
        assert_eq!(s.all.clients, 3);
        assert_eq!(s.violations, 1, "the two first readers overlapped");
    }
}
