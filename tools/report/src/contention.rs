//! The contention section of docs/BENCHMARKS.md (between `<!-- contention:begin -->`
//! and `<!-- contention:end -->`) and docs/contention.png, rendered from
//! docs/data/contention.json, which `make bench-contention` writes.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::chart::{decades, FONT};
use crate::contention_kinds::KindCell;
use crate::fmt::scaled;
use crate::Error;

/// Facts about the run printed above the tables.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunInfo {
    pub date_utc: String,
    pub command: String,
    pub server: String,
    pub machine: String,
    pub secs_per_cell: f64,
    pub wall_secs: f64,
    /// python-redis-lock's `signal_expire`, as the (c) method used it.
    pub signal_expire_ms: u64,
}

/// The figures reported for one (method, N, c) cell (see tools/contention/src/stats.rs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub acquisitions: u64,
    pub elapsed_s: f64,
    pub per_second: f64,
    pub handoff_p50_us: f64,
    pub handoff_p99_us: f64,
    pub handoffs: u64,
    pub same_client_again: f64,
    pub commands_per_acquisition: f64,
    pub max_wait_ms: f64,
    pub wait_p99_ms: f64,
    pub hold_mean_ms: f64,
    pub hold_max_ms: f64,
    pub jain: f64,
    pub overlaps: u64,
    pub gave_up: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    /// `module`, `poll100`, `jitter`, `blpop`.
    pub method: String,
    pub label: String,
    pub n: usize,
    pub hold_ms: u64,
    pub summary: Summary,
    /// Calls of the clients' commands from INFO commandstats, and the clients' own count.
    pub server_commands: u64,
    pub client_commands: u64,
    /// Cores kept busy by other processes during the cell.
    pub other_cores: Option<f64>,
}

/// docs/data/contention.json: one `make bench-contention` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ContentionRun {
    pub info: RunInfo,
    pub cells: Vec<Cell>,
    /// The readers/writers and semaphore cells (absent from runs before they existed).
    #[serde(default)]
    pub kinds: Vec<KindCell>,
}

/// The methods in the order the run measured them.
fn methods(cells: &[Cell]) -> Vec<&str> {
    let mut v: Vec<&str> = Vec::new();
    for c in cells {
        if !v.contains(&c.method.as_str()) {
            v.push(&c.method);
        }
    }
    v
}

fn us(v: f64) -> String {
    scaled(
        v,
        &[
            (1e4, 1e3, 1, " ms"),
            (1e3, 1e3, 2, " ms"),
            (f64::MIN, 1.0, 0, " µs"),
        ],
    )
}

pub(crate) fn ms(v: f64) -> String {
    scaled(
        v,
        &[
            (1e3, 1e3, 2, " s"),
            (10.0, 1.0, 0, " ms"),
            (f64::MIN, 1.0, 1, " ms"),
        ],
    )
}

pub(crate) fn per_sec(v: f64) -> String {
    scaled(v, &[(100.0, 1.0, 0, ""), (f64::MIN, 1.0, 1, "")])
}

/// A hand-off percentile, marked when it rests on few samples.
fn handoff(samples: u64, v: f64) -> String {
    match samples {
        0 => "none".to_string(),
        1..=99 => format!("{} ({samples} h.o.)", us(v)),
        _ => us(v),
    }
}

fn table(out: &mut String, cells: &[Cell], hold_ms: u64) {
    let _ = writeln!(
        out,
        "| method | N | critical sections/s | hand-off p50 | hand-off p99 | same client again | commands/acq. | wait p99 | longest wait | N × c | Jain | other load |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for m in methods(cells) {
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
                c.label,
                c.n,
                per_sec(s.per_second),
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
fn goals(out: &mut String, cells: &[Cell]) {
    let module: Vec<&Cell> = cells.iter().filter(|c| c.method == "module").collect();
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
    let bound = |c: &Cell| c.n as f64 * (c.hold_ms as f64 + 1.0);
    let over: Vec<&&Cell> = module
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

pub fn section(info: &RunInfo, cells: &[Cell], kinds: &[KindCell]) -> String {
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
        "- **(c)** python-redis-lock: `SET k token NX EX 10`; if busy `BLPOP lock-signal:k 10` and retry the `SET`; release with its script (if the token matches: `DEL` signal, `LPUSH` signal 1, `PEXPIRE` signal {}, `DEL` lock).\n",
        info.signal_expire_ms
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
    crate::contention_kinds::section(&mut out, kinds);
    let _ = writeln!(
        out,
        "Reproduce: `make bench-contention` (env: `CONTENTION_SECS` per cell, \
         `CONTENTION_N` e.g. `1,2,8,64`, `CONTENTION_HOLD_MS` e.g. `0,1`, \
         `CONTENTION_METHODS` e.g. `module,poll100,jitter,blpop`; `CONTENTION_CELLS` e.g. \
         `mutex,rw,sem`, `CONTENTION_RW` readers,writers e.g. `8,1`, `CONTENTION_RW_METHODS` \
         e.g. `shared,module,jitter,rw-script,rw-script-wfirst`, `CONTENTION_SEM` \
         clients,permits e.g. `16,4`, `CONTENTION_SEM_METHODS` e.g. `limit,zset`)."
    );
    out
}

/// docs/contention.png: hand-off latency p99 (top) and throughput (bottom) against N,
/// one panel per critical-section length, one line per method.
pub fn draw(path: &Path, run: &ContentionRun) -> Result<(), Error> {
    crate::chart::register_fonts()?;
    let cells = &run.cells;
    let subtitle = format!(
        "{}, {} s per cell, loopback; {}",
        run.info.server, run.info.secs_per_cell, run.info.date_utc
    );
    let mut holds: Vec<u64> = cells.iter().map(|c| c.hold_ms).collect();
    holds.sort_unstable();
    holds.dedup();
    let cols = holds.len().max(1);
    let body = crate::chart::titled(
        path,
        (700 * cols as u32, 1000),
        (
            "Lock contention: N clients, one lock, each holds it c ms",
            28,
        ),
        subtitle,
    )?;
    let panels = body.split_evenly((2, cols));
    let max_n = cells.iter().map(|c| c.n).max().unwrap_or(64).max(2) as f64;
    let x_max = max_n.log2();
    // In ms. Latency can be 0 (grant reply before the release reply): plot it at 1 µs.
    let lat = |c: &Cell| c.summary.handoff_p99_us.max(1.0) / 1000.0;
    let thr = |c: &Cell| c.summary.per_second.max(0.1);

    for (row, metric) in [
        ("hand-off latency p99 (ms, log)", 0),
        ("critical sections / s (log)", 1),
    ]
    .iter()
    .enumerate()
    {
        let value = |c: &Cell| if metric.1 == 0 { lat(c) } else { thr(c) };
        let (y_lo, y_hi) = decades(cells.iter().map(value));
        for (col, &hold) in holds.iter().enumerate() {
            let area = &panels[row * cols + col];
            let mut chart = ChartBuilder::on(area)
                .caption(
                    format!("{} — c = {hold} ms", metric.0),
                    (FONT, 21).into_font(),
                )
                .margin(18)
                .x_label_area_size(45)
                .y_label_area_size(80)
                .build_cartesian_2d(-0.25f64..x_max + 0.25, (y_lo..y_hi).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("clients N (log₂)")
                .x_labels(x_max as usize + 1)
                .x_label_formatter(&|x| format!("{}", 2f64.powf(*x).round()))
                .y_label_formatter(&|y| {
                    if *y >= 1000.0 {
                        format!("{:.0}k", y / 1000.0)
                    } else if *y >= 1.0 {
                        format!("{y:.0}")
                    } else {
                        // 0.001, 0.01, 0.1 without float noise.
                        let digits = (-y.log10().floor()) as usize;
                        format!("{y:.digits$}")
                    }
                })
                .label_style((FONT, 16).into_font())
                .axis_desc_style((FONT, 16).into_font())
                .light_line_style(RGBColor(235, 235, 235))
                .draw()?;
            if metric.1 == 0 {
                // The module's goal: p99 <= 1 ms.
                let goal = RGBColor(200, 30, 30);
                chart
                    .draw_series(DashedLineSeries::new(
                        [(-0.25, 1.0), (x_max + 0.25, 1.0)],
                        8,
                        6,
                        goal.stroke_width(2),
                    ))?
                    .label("goal for the module: p99 ≤ 1 ms")
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], goal.stroke_width(2))
                    });
            }
            for m in methods(cells) {
                let mut pts: Vec<(f64, f64)> = cells
                    .iter()
                    .filter(|c| c.method == m && c.hold_ms == hold)
                    .map(|c| ((c.n as f64).log2(), value(c)))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let col_m = color(m);
                let label = cells.iter().find(|c| c.method == m).map_or(m, |c| &c.label);
                chart
                    .draw_series(LineSeries::new(pts.clone(), col_m.stroke_width(3)))?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], col_m.stroke_width(3))
                    });
                chart.draw_series(
                    pts.iter()
                        .map(|&(x, y)| Circle::new((x, y), 5, col_m.filled())),
                )?;
            }
            chart
                .configure_series_labels()
                .position(if metric.1 == 0 {
                    SeriesLabelPosition::UpperLeft
                } else {
                    SeriesLabelPosition::LowerLeft
                })
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(200, 200, 200))
                .label_font((FONT, 15).into_font())
                .draw()?;
        }
    }
    body.present()?;
    Ok(())
}

fn color(method: &str) -> RGBColor {
    match method {
        "module" => RGBColor(0, 114, 178),
        "poll100" => RGBColor(213, 94, 0),
        "jitter" => RGBColor(0, 158, 115),
        _ => RGBColor(204, 121, 167),
    }
}
