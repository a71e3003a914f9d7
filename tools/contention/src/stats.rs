//! What one cell's clients recorded, and the figures derived from it. Pure: unit-tested
//! without a server.

pub use redis_lock_report::contention::Summary;

/// One critical section, times in ns since the cell started (one monotonic clock for
/// every client thread of the process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquisition {
    pub client: usize,
    /// The client started to want the lock (sent its first acquire attempt).
    pub wanted: u64,
    /// The grant reply arrived.
    pub granted: u64,
    /// The release command was about to be sent (end of the critical section).
    pub releasing: u64,
    /// The release reply arrived.
    pub released: u64,
}

/// Everything one client thread reports.
#[derive(Debug, Clone, Default)]
pub struct ClientLog {
    pub acquisitions: Vec<Acquisition>,
    /// Commands this client sent (every attempt, wait and release).
    pub commands: u64,
    /// An attempt still not granted when the client gave up: how long it had waited.
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
    let n = counts.len() as f64;
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if n == 0.0 || sq == 0.0 {
        1.0
    } else {
        sum * sum / (n * sq)
    }
}

pub fn summarize(logs: &[ClientLog]) -> Summary {
    let mut all: Vec<Acquisition> = logs
        .iter()
        .flat_map(|l| l.acquisitions.iter().copied())
        .collect();
    all.sort_by_key(|a| a.granted);

    let single_client = logs.iter().filter(|l| !l.acquisitions.is_empty()).count() <= 1;
    let mut handoffs: Vec<u64> = all
        .windows(2)
        .filter(|w| single_client || w[1].client != w[0].client)
        .map(|w| w[1].granted.saturating_sub(w[0].released))
        .collect();
    handoffs.sort_unstable();
    let pairs = all.len().saturating_sub(1);
    let same = all
        .windows(2)
        .filter(|w| w[1].client == w[0].client)
        .count();
    let overlaps = all
        .windows(2)
        .filter(|w| w[1].granted < w[0].releasing)
        .count() as u64;

    let acquisitions = all.len() as u64;
    let end = all.iter().map(|a| a.released).max().unwrap_or(0);
    let elapsed_s = end as f64 / 1e9;
    let commands: u64 = logs.iter().map(|l| l.commands).sum();
    let mut waits: Vec<u64> = all
        .iter()
        .map(|a| a.granted.saturating_sub(a.wanted))
        .chain(logs.iter().filter_map(|l| l.gave_up_after))
        .collect();
    waits.sort_unstable();
    let max_wait = waits.last().copied().unwrap_or(0);
    let counts: Vec<u64> = logs.iter().map(|l| l.acquisitions.len() as u64).collect();

    Summary {
        acquisitions,
        elapsed_s,
        per_second: if elapsed_s > 0.0 {
            acquisitions as f64 / elapsed_s
        } else {
            0.0
        },
        handoff_p50_us: percentile(&handoffs, 50.0) as f64 / 1e3,
        handoff_p99_us: percentile(&handoffs, 99.0) as f64 / 1e3,
        handoffs: handoffs.len() as u64,
        same_client_again: if pairs > 0 {
            same as f64 / pairs as f64
        } else {
            0.0
        },
        commands_per_acquisition: if acquisitions > 0 {
            commands as f64 / acquisitions as f64
        } else {
            f64::INFINITY
        },
        max_wait_ms: max_wait as f64 / 1e6,
        wait_p99_ms: percentile(&waits, 99.0) as f64 / 1e6,
        hold_max_ms: all
            .iter()
            .map(|a| a.releasing.saturating_sub(a.granted))
            .max()
            .unwrap_or(0) as f64
            / 1e6,
        hold_mean_ms: if all.is_empty() {
            0.0
        } else {
            all.iter()
                .map(|a| a.releasing.saturating_sub(a.granted) as f64)
                .sum::<f64>()
                / all.len() as f64
                / 1e6
        },
        jain: jain(&counts),
        overlaps,
        gave_up: logs.iter().filter(|l| l.gave_up_after.is_some()).count() as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(acquisitions: Vec<Acquisition>, commands: u64, gave_up_after: Option<u64>) -> ClientLog {
        ClientLog {
            acquisitions,
            commands,
            gave_up_after,
        }
    }

    /// One client's log with 4 commands.
    fn single(acquisitions: Vec<Acquisition>) -> Vec<ClientLog> {
        vec![log(acquisitions, 4, None)]
    }

    fn acq(client: usize, wanted: u64, granted: u64, released: u64) -> Acquisition {
        Acquisition {
            client,
            wanted,
            granted,
            releasing: released.saturating_sub(10),
            released,
        }
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
        let s = summarize(&logs);
        assert_eq!(s.acquisitions, 3);
        // Grants at 1000, 2500, 5500; releases before them at 2000 and 5000.
        assert_eq!(s.handoff_p50_us, 0.5);
        assert_eq!(s.handoff_p99_us, 0.5);
        assert_eq!(s.commands_per_acquisition, 8.0 / 3.0);
        assert_eq!(s.max_wait_ms, 9.0, "the given-up wait counts");
        assert_eq!(s.handoffs, 2);
        assert_eq!(s.same_client_again, 0.0);
        assert_eq!(s.gave_up, 1);
        assert_eq!(s.overlaps, 0);
        assert!((s.elapsed_s - 6e-6).abs() < 1e-12);
    }

    #[test]
    fn a_releaser_that_takes_the_lock_again_is_not_a_handoff() {
        let mut logs = single(vec![acq(0, 0, 1_000, 2_000), acq(0, 2_000, 2_100, 3_000)]);
        logs.push(log(vec![acq(1, 0, 8_000, 9_000)], 9, None));
        let s = summarize(&logs);
        assert_eq!(s.handoffs, 1);
        assert_eq!(s.handoff_p99_us, 5.0);
        assert_eq!(s.same_client_again, 0.5);
        assert_eq!(s.max_wait_ms, 0.008);
    }

    #[test]
    fn one_client_counts_its_own_reacquires() {
        let logs = single(vec![acq(0, 0, 1_000, 2_000), acq(0, 2_000, 2_300, 3_000)]);
        let s = summarize(&logs);
        assert_eq!(s.handoffs, 1);
        assert_eq!(s.handoff_p50_us, 0.3);
    }

    #[test]
    fn a_grant_before_the_previous_holder_released_is_an_overlap() {
        let logs = single(vec![acq(0, 0, 1_000, 3_000), acq(1, 0, 2_000, 4_000)]);
        assert_eq!(summarize(&logs).overlaps, 1);
    }

    #[test]
    fn a_grant_reply_that_beats_the_release_reply_counts_as_zero() {
        let logs = single(vec![
            Acquisition {
                client: 0,
                wanted: 0,
                granted: 100,
                releasing: 200,
                released: 400,
            },
            Acquisition {
                client: 1,
                wanted: 0,
                granted: 300,
                releasing: 500,
                released: 600,
            },
        ]);
        let s = summarize(&logs);
        assert_eq!(s.handoff_p99_us, 0.0);
        assert_eq!(s.overlaps, 0);
    }
}
