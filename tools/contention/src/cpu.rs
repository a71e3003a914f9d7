//! Cores kept busy by other work during a cell (a client waiting for a core shows up as
//! hand-off latency): machine CPU time (/proc/stat) minus this process's and the server's.

use std::fs;
use std::time::Instant;

/// Linux reports CPU times in USER_HZ ticks, 100 per second on every mainstream arch.
const TICKS_PER_SEC: f64 = 100.0;

#[derive(Debug, Clone, Copy)]
pub struct Sample {
    at: Instant,
    machine_busy: u64,
    ours: u64,
}

/// Busy ticks from the `cpu` line of /proc/stat (not idle, iowait; guest is in user).
pub fn parse_machine_busy(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    Some(get(0) + get(1) + get(2) + get(5) + get(6) + get(7))
}

/// utime + stime of a process, from /proc/<pid>/stat (all its threads).
pub fn parse_process_ticks(stat: &str) -> Option<u64> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

pub fn sample(server_pid: u32) -> Option<Sample> {
    let machine_busy = parse_machine_busy(&fs::read_to_string("/proc/stat").ok()?)?;
    let me = parse_process_ticks(&fs::read_to_string("/proc/self/stat").ok()?)?;
    let server =
        parse_process_ticks(&fs::read_to_string(format!("/proc/{server_pid}/stat")).ok()?)?;
    Some(Sample {
        at: Instant::now(),
        machine_busy,
        ours: me + server,
    })
}

/// Cores kept busy by other processes between two samples.
pub fn other_cores(a: Sample, b: Sample) -> f64 {
    let wall = b.at.duration_since(a.at).as_secs_f64();
    if wall <= 0.0 {
        return 0.0;
    }
    let busy = b.machine_busy.saturating_sub(a.machine_busy) as f64;
    let ours = b.ours.saturating_sub(a.ours) as f64;
    ((busy - ours) / TICKS_PER_SEC / wall).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_and_pid_stat() {
        let stat = "cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        assert_eq!(parse_machine_busy(stat), Some(161));
        let pid = "1234 (redis server) S 1 1234 1234 0 -1 4194560 500 0 0 0 77 23 0 0 20 0 5";
        assert_eq!(parse_process_ticks(pid), Some(100));
        assert_eq!(parse_process_ticks("garbage"), None);
    }
}
