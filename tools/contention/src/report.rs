//! The Markdown section written into docs/BENCHMARKS.md between this tool's markers,
//! and the splice that replaces only that section. Pure: unit-tested.

use std::fmt::Write as _;

use crate::methods::{Method, ALL, SIGNAL_EXPIRE_MS};
use crate::run::CellResult;

pub const BEGIN: &str = "<!-- contention:begin -->";
pub const END: &str = "<!-- contention:end -->";

/// Facts about the run printed above the tables.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub date_utc: String,
    pub command: String,
    pub server: String,
    pub machine: String,
    pub secs_per_cell: f64,
    pub wall_secs: f64,
}

/// Replaces what lies between [`BEGIN`] and [`END`] in `doc` (markers kept), or appends
/// a new marked section when the markers are missing. Everything else is untouched.
pub fn splice(doc: &str, section: &str) -> Result<String, String> {
    let body = format!("{BEGIN}\n{}\n{END}", section.trim_end());
    match (doc.find(BEGIN), doc.find(END)) {
        (Some(b), Some(e)) if b < e => Ok(format!("{}{body}{}", &doc[..b], &doc[e + END.len()..])),
        (None, None) => {
            let mut out = doc.trim_end().to_string();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(&body);
            out.push('\n');
            Ok(out)
        }
        _ => Err(format!(
            "docs/BENCHMARKS.md has a broken {BEGIN} / {END} pair; fix it by hand"
        )),
    }
}

fn us(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1} ms", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.2} ms", v / 1000.0)
    } else {
        format!("{v:.0} µs")
    }
}

fn ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} s", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A hand-off percentile, marked when it rests on few samples.
fn handoff(samples: u64, v: f64) -> String {
    match samples {
        0 => "none".to_string(),
        1..=99 => format!("{} ({samples} h.o.)", us(v)),
        _ => us(v),
    }
}

fn table(out: &mut String, cells: &[CellResult], hold_ms: u64) {
    let _ = writeln!(
        out,
        "| method | N | critical sections/s | hand-off p50 | hand-off p99 | same client again | commands/acq. | wait p99 | longest wait | N × c | Jain | other load |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for m in ALL {
        for c in cells
            .iter()
            .filter(|c| c.method == m && c.hold_ms == hold_ms)
        {
            let s = &c.summary;
            let mut flags = String::new();
            if s.gave_up > 0 {
                let _ = write!(flags, " ({} gave up)", s.gave_up);
            }
            if s.overlaps > 0 {
                let _ = write!(flags, " **{} OVERLAPS**", s.overlaps);
            }
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {}{} | {} ms | {:.3} | {} |",
                m.label(),
                c.n,
                rate(s.per_second),
                handoff(s.handoffs, s.handoff_p50_us),
                handoff(s.handoffs, s.handoff_p99_us),
                if c.n > 1 {
                    format!("{:.0} %", s.same_client_again * 100.0)
                } else {
                    "–".to_string()
                },
                s.commands_per_acquisition,
                ms(s.wait_p99_ms),
                ms(s.max_wait_ms),
                flags,
                c.n as u64 * hold_ms,
                s.jain,
                c.other_cores
                    .map_or_else(|| "?".to_string(), |v| format!("{v:.1}"))
            );
        }
    }
}

/// The goals of the issue, checked against the module's cells.
fn goals(out: &mut String, cells: &[CellResult]) {
    let module: Vec<&CellResult> = cells
        .iter()
        .filter(|c| c.method == Method::Module)
        .collect();
    if module.is_empty() {
        return;
    }
    let worst_p99 = module.iter().max_by(|a, b| {
        a.summary
            .handoff_p99_us
            .total_cmp(&b.summary.handoff_p99_us)
    });
    if let Some(w) = worst_p99 {
        let met = module.iter().all(|c| c.summary.handoff_p99_us <= 1000.0);
        let _ = writeln!(
            out,
            "- Hand-off p99 ≤ 1 ms at every N: **{}**; worst cell N = {}, c = {} ms: p99 {}, while other processes kept {} cores busy.",
            if met { "met" } else { "not met" },
            w.n,
            w.hold_ms,
            us(w.summary.handoff_p99_us),
            w.other_cores
                .map_or_else(|| "?".to_string(), |v| format!("{v:.1}"))
        );
    }
    let exact = module
        .iter()
        .all(|c| (c.summary.commands_per_acquisition - 2.0).abs() < 1e-9);
    let range = module
        .iter()
        .map(|c| c.summary.commands_per_acquisition)
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let _ = writeln!(
        out,
        "- Exactly 2 commands per acquisition: **{}** (from {:.3} to {:.3} over all cells).",
        if exact { "met" } else { "not met" },
        range.0,
        range.1
    );
    // FIFO's bound: every client ahead holds once before you, plus one hand-off each,
    // the overhead budgeted at the p99 goal (1 ms).
    let bound = |c: &CellResult| c.n as f64 * (c.hold_ms as f64 + 1.0);
    let over: Vec<&&CellResult> = module
        .iter()
        .filter(|c| c.summary.max_wait_ms > bound(c))
        .collect();
    let p99_met = module.iter().all(|c| c.summary.wait_p99_ms <= bound(c));
    let _ = write!(
        out,
        "- Longest wait within FIFO's bound N × (c + 1 ms overhead): **{}** (within it in {} of {} cells)",
        if over.is_empty() { "met" } else { "not met" },
        module.len() - over.len(),
        module.len()
    );
    if over.is_empty() {
        let _ = writeln!(out, ".");
    } else {
        let _ = write!(out, "; over it:");
        for (i, c) in over.iter().enumerate() {
            let _ = write!(
                out,
                "{} N = {}, c = {} ms: longest {} against {} (p99 {}, longest critical section {})",
                if i == 0 { "" } else { ";" },
                c.n,
                c.hold_ms,
                ms(c.summary.max_wait_ms),
                ms(bound(c)),
                ms(c.summary.wait_p99_ms),
                ms(c.summary.hold_max_ms)
            );
        }
        let _ = writeln!(
            out,
            ". The p99 and the longest critical section tell a one-off stall of a client \
             thread (the machine is shared) from a queueing problem."
        );
    }
    let _ = writeln!(
        out,
        "- 99th-percentile wait within the same bound: **{}**.",
        if p99_met {
            "met in every cell"
        } else {
            "not met"
        }
    );
}

pub fn section(info: &RunInfo, cells: &[CellResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Lock contention: waiting in the server against waiting in the client\n"
    );
    let _ = writeln!(
        out,
        "*Generated by `{}` on {} (wall time {:.0} s); do not edit by hand, run it again.*\n",
        info.command, info.date_utc, info.wall_secs
    );
    let _ = writeln!(
        out,
        "Server: {} with the module, spawned by the tool on 127.0.0.1 (no persistence). \
         Machine: {}. Every cell runs {:.1} s.\n",
        info.server, info.machine, info.secs_per_cell
    );
    let _ = writeln!(
        out,
        "N client threads in one process, one connection each, loop: acquire one lock, hold \
         it c ms (`thread::sleep`), release, repeat, with no pause between a release and the \
         next attempt. When the cell's time is up each client finishes the attempt it is in \
         (so every command belongs to an acquisition) and stops; throughput counts until the \
         last release. Leases are 10 s, so no lock ever expires and every hand-off is a \
         release.\n"
    );
    let _ = writeln!(out, "Methods, each as the library documents it:\n");
    let _ = writeln!(
        out,
        "- **module**: `LOCK.ACQUIRE k PX 10000 BLOCK 10000`, then `LOCK.RELEASE k token`. The server queues waiters in arrival order and hands the lock to the head of the queue inside the release."
    );
    let _ = writeln!(
        out,
        "- **(a)** redis-py `Lock` defaults: `SET k token NX PX 10000`; if busy sleep 100 ms and retry; release with a compare-and-delete Lua script (`EVALSHA`)."
    );
    let _ = writeln!(
        out,
        "- **(b)** node-redlock / redsync style: the same `SET NX PX` and release, retry after 10 ms ± 5 ms uniform jitter (node-redlock's `retryDelay + (2·random − 1)·retryJitter`), retrying without a count limit."
    );
    let _ = writeln!(
        out,
        "- **(c)** python-redis-lock: `SET k token NX EX 10`; if busy `BLPOP lock-signal:k 10` and retry the `SET`; release with its script (if the token matches: `DEL` signal, `LPUSH` signal 1, `PEXPIRE` signal {SIGNAL_EXPIRE_MS}, `DEL` lock).\n"
    );
    let _ = writeln!(
        out,
        "Columns: *critical sections/s*: acquisitions ÷ time to the last release. *Hand-off*: \
         from the previous holder's release reply to the next holder's grant reply, for \
         consecutive grants that went to a different client, on one monotonic clock \
         (`Instant`) shared by all client threads; 0 when the grant reply arrived first (the \
         module grants inside the release, so the two replies leave together); \"(k h.o.)\" \
         marks a percentile over fewer than 100 hand-offs. At N = 1 there is no other \
         client: the figure is the client's own next acquire, one uncontended round trip. \
         *Same client again*: share of grants that went straight back to the client that \
         had just released: it asked again before anyone else was waiting (FIFO allows \
         that), or it beat clients that were waiting but asleep between polls (barging). \
         *Commands/acq.*: every command the clients sent ÷ acquisitions (checked against \
         the server's `INFO commandstats`). *Wait*: from a client's first attempt to its \
         grant; p99 and the maximum over all acquisitions. *N × c*: the FIFO bound without \
         overhead. *Jain*: Jain's index over acquisitions per client (1 = even, 1/N = one \
         client got all). *Other load*: cores kept busy by other processes on the machine \
         during the cell (/proc/stat minus this tool and the server); the clients share the \
         cores with the server and with that load, and a client thread that waits for a \
         core shows up as hand-off latency and wait.\n"
    );
    let mut holds: Vec<u64> = cells.iter().map(|c| c.hold_ms).collect();
    holds.sort_unstable();
    holds.dedup();
    for h in holds {
        let _ = writeln!(out, "### Critical section c = {h} ms\n");
        table(&mut out, cells, h);
        out.push('\n');
    }
    let _ = writeln!(out, "### Goals (module)\n");
    goals(&mut out, cells);
    out.push('\n');
    let _ = writeln!(
        out,
        "![Hand-off latency p99 and throughput against N, per method](contention.png)\n"
    );
    let _ = writeln!(
        out,
        "Reproduce: `make bench-contention` (env: `CONTENTION_SECS` per cell, \
         `CONTENTION_N` e.g. `1,2,8,64`, `CONTENTION_HOLD_MS` e.g. `0,1`, \
         `CONTENTION_METHODS` e.g. `module,poll100,jitter,blpop`)."
    );
    out
}

/// `YYYY-MM-DD HH:MM UTC` for a unix time in seconds (proleptic Gregorian).
pub fn utc_date(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        secs / 3600,
        (secs % 3600) / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_its_own_section() {
        let doc = "# Benchmarks\n\n<!-- perf:begin -->\nperf stuff\n<!-- perf:end -->\n\n\
                   <!-- contention:begin -->\nold\n<!-- contention:end -->\n\ntail\n";
        let out = splice(doc, "new table\n").unwrap();
        assert_eq!(
            out,
            "# Benchmarks\n\n<!-- perf:begin -->\nperf stuff\n<!-- perf:end -->\n\n\
             <!-- contention:begin -->\nnew table\n<!-- contention:end -->\n\ntail\n"
        );
        // Idempotent.
        assert_eq!(splice(&out, "new table").unwrap(), out);
    }

    #[test]
    fn splice_appends_when_the_markers_are_missing() {
        let out = splice(
            "# Benchmarks\n\n<!-- perf:begin -->\nx\n<!-- perf:end -->\n",
            "t",
        )
        .unwrap();
        assert!(out.starts_with("# Benchmarks\n\n<!-- perf:begin -->\nx\n<!-- perf:end -->\n\n"));
        assert!(out.ends_with("<!-- contention:begin -->\nt\n<!-- contention:end -->\n"));
        assert_eq!(
            splice("", "t").unwrap(),
            "<!-- contention:begin -->\nt\n<!-- contention:end -->\n"
        );
    }

    #[test]
    fn splice_refuses_a_broken_pair() {
        assert!(splice("<!-- contention:begin -->\nno end\n", "t").is_err());
        assert!(splice("<!-- contention:end -->\n<!-- contention:begin -->\n", "t").is_err());
    }

    fn cell(method: Method, n: usize, hold_ms: u64, max_wait_ms: f64) -> CellResult {
        CellResult {
            method,
            n,
            hold_ms,
            summary: crate::stats::Summary {
                acquisitions: 100,
                elapsed_s: 1.0,
                per_second: 100.0,
                handoff_p50_us: 0.0,
                handoff_p99_us: 25.0,
                handoffs: 99,
                same_client_again: 0.0,
                commands_per_acquisition: 2.0,
                max_wait_ms,
                wait_p99_ms: 1.0,
                hold_mean_ms: 1.1,
                hold_max_ms: 4.0,
                jain: 1.0,
                overlaps: 0,
                gave_up: 0,
            },
            server_commands: 200,
            client_commands: 200,
            other_cores: Some(0.5),
        }
    }

    #[test]
    fn goals_name_the_cells_over_the_fifo_bound() {
        let cells = [
            cell(Method::Module, 8, 1, 10.0),
            cell(Method::Module, 2, 1, 30.0),
            cell(Method::Poll100, 8, 1, 3000.0),
        ];
        let mut out = String::new();
        goals(&mut out, &cells);
        assert!(
            out.contains("Hand-off p99 ≤ 1 ms at every N: **met**"),
            "{out}"
        );
        assert!(
            out.contains("Exactly 2 commands per acquisition: **met**"),
            "{out}"
        );
        assert!(out.contains("**not met** (within it in 1 of 2 cells); over it: N = 2, c = 1 ms: longest 30 ms against 4.0 ms"), "{out}");
        assert!(
            !out.contains("3.00 s"),
            "baselines are not goal cells: {out}"
        );
        let doc = section(
            &RunInfo {
                date_utc: "2026-01-01 00:00 UTC".into(),
                command: "make bench-contention".into(),
                server: "Redis 7.0.15".into(),
                machine: "test".into(),
                secs_per_cell: 3.0,
                wall_secs: 10.0,
            },
            &cells,
        );
        assert!(doc.contains("### Critical section c = 1 ms"));
        assert!(!doc.contains(BEGIN) && !doc.contains(END));
    }

    #[test]
    fn dates_are_utc_civil_dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14 22:13 UTC");
    }
}
