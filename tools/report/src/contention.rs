//! The contention section of docs/BENCHMARKS.md and docs/contention.png, from
//! docs/data/contention.json (`make bench-contention`).

use std::path::Path;

use minijinja::context;
use minijinja::value::{Serde, Value};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::chart::{decades, first_seen, holds, legend, line_key, tick, FONT, PALETTE};
use crate::template::render;
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

impl RunInfo {
    /// A white chart: `title` (text, size px) over a grey subtitle (server, time per cell,
    /// date) in its top 70 px, then 2 rows of `cols` panels of `panel` px.
    pub fn grid<'a>(
        &self,
        path: &'a Path,
        panel: (u32, u32),
        (title, size): (&str, u32),
        cols: usize,
    ) -> Result<Grid<'a>, Error> {
        let root = BitMapBackend::new(path, (panel.0 * cols as u32, panel.1)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, body) = root.split_vertically(70);
        top.draw(&Text::new(
            title,
            (20, 10),
            (FONT, size).into_font().color(&BLACK),
        ))?;
        let (server, secs, date) = (&self.server, self.secs_per_cell, &self.date_utc);
        let subtitle = format!("{server}, {secs} s per cell, loopback; {date}");
        let grey = (FONT, 17).into_font().color(&RGBColor(80, 80, 80));
        top.draw(&Text::new(subtitle, (20, 44), grey))?;
        let panels = body.split_evenly((2, cols));
        Ok((body, panels))
    }
}

/// A chart's whole drawing area and its panels, row by row.
pub type Grid<'a> = (Area<'a>, Vec<Area<'a>>);
type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// Throughput, waits (first attempt to grant, or to giving up) and fairness (Jain's index
/// over acquisitions per client) of a cell's readers, writers, or all clients.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleStats {
    pub clients: usize,
    pub acquisitions: u64,
    pub per_second: f64,
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub wait_max_ms: f64,
    pub jain: f64,
    pub gave_up: u64,
}

/// The figures of one cell, as tools/contention/src/stats.rs defines them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub elapsed_s: f64,
    pub all: RoleStats,
    /// A readers/writers cell's readers and writers.
    pub readers: Option<RoleStats>,
    pub writers: Option<RoleStats>,
    pub commands_per_acquisition: f64,
    pub round_trips_per_acquisition: f64,
    pub peak_holders: u64,
    pub mean_holders: f64,
    pub violations: u64,
    pub overtakes: u64,
    pub overtakes_most: u64,
    /// Release -> the next grant of another client (alone: its own), µs; the share of
    /// grants that went straight back to the releaser.
    pub handoff_p50_us: f64,
    pub handoff_p99_us: f64,
    pub handoffs: u64,
    pub same_client_again: f64,
    /// Critical sections, grant to release, ms.
    pub hold_mean_ms: f64,
    pub hold_max_ms: f64,
}

/// One cell: a method's clients (`family` `mutex`, `rw`, `sem`), each holding `hold_ms`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cell {
    pub family: String,
    pub method: String,
    pub label: String,
    pub clients: usize,
    /// Readers and writers of an rw cell (0 elsewhere), permits of a sem cell.
    pub readers: usize,
    pub writers: usize,
    pub limit: Option<u32>,
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
}

impl ContentionRun {
    /// The cells of one family (`mutex`, `rw`, `sem`), critical-section length first,
    /// then in the order the run measured them.
    pub fn family(&self, id: &str) -> Vec<&Cell> {
        let mut v: Vec<&Cell> = self.cells.iter().filter(|c| c.family == id).collect();
        v.sort_by_key(|c| c.hold_ms); // stable: the run's order within one c
        v
    }
}

pub(crate) fn by_method<'a>(cells: &[&'a Cell], method: &str) -> Vec<&'a Cell> {
    cells
        .iter()
        .copied()
        .filter(|c| c.method == method)
        .collect()
}

/// Whether every cell took exactly 2 commands per acquisition.
pub(crate) fn two_commands(cells: &[&Cell]) -> bool {
    cells
        .iter()
        .all(|c| (c.summary.commands_per_acquisition - 2.0).abs() < 1e-9)
}

/// FIFO's bound on the waits of `cells`: the cells over it, whether every p99 is within.
pub(crate) fn within(cells: &[&Cell], bound: impl Fn(&Cell) -> f64) -> (Vec<Value>, bool) {
    let over = cells
        .iter()
        .filter(|c| c.summary.all.wait_max_ms > bound(c));
    let over = over.map(|c| context! { bound => bound(c), ..Value::from(Serde(c)) });
    let met = cells.iter().all(|c| c.summary.all.wait_p99_ms <= bound(c));
    (over.collect(), met)
}

/// The goals of the issue, checked against the module's cells (None without them).
fn goals(cells: &[&Cell]) -> Option<Value> {
    let module = by_method(cells, "module");
    let p99 = |c: &&&Cell| c.summary.handoff_p99_us;
    let worst = module.iter().max_by(|a, b| p99(a).total_cmp(&p99(b)))?;
    let cpa = module.iter().map(|c| c.summary.commands_per_acquisition);
    // FIFO's bound: every client ahead holds once before you, plus one hand-off each,
    // the overhead budgeted at the p99 goal (1 ms).
    let (over, wait_p99_met) = within(&module, |c| c.clients as f64 * (c.hold_ms as f64 + 1.0));
    Some(context! {
        module => module.len(),
        worst => Serde(worst),
        handoff_met => module.iter().all(|c| c.summary.handoff_p99_us <= 1000.0),
        exact => two_commands(&module),
        range => Serde(cpa.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))),
        over,
        wait_p99_met,
    })
}

/// The contention section of docs/BENCHMARKS.md, readers/writers and semaphore included.
pub fn section(run: &ContentionRun) -> Result<String, Error> {
    let cells = run.family("mutex");
    let holds = holds(cells.iter().map(|c| c.hold_ms));
    let ctx = context! {
        info => Serde(&run.info),
        methods => Serde(first_seen(cells.iter().map(|c| c.method.as_str()))),
        holds,
        goals => goals(&cells),
        cells => Serde(cells),
        ..crate::contention_kinds::context(run)
    };
    render("contention.md.j2", ctx)
}

/// docs/contention.png: hand-off latency p99 (top) and throughput (bottom) against N,
/// one panel per critical-section length, one line per method.
pub fn draw(path: &Path, run: &ContentionRun) -> Result<(), Error> {
    crate::chart::register_fonts()?;
    let cells = &run.family("mutex");
    let holds = holds(cells.iter().map(|c| c.hold_ms));
    let cols = holds.len().max(1);
    let title = "Lock contention: N clients, one lock, each holds it c ms";
    let (body, panels) = run.info.grid(path, (700, 1000), (title, 28), cols)?;
    let max_n = cells.iter().map(|c| c.clients).max().unwrap_or(64).max(2) as f64;
    let x_max = max_n.log2();
    // In ms. Latency can be 0 (grant reply before the release reply): plot it at 1 µs.
    let lat = |c: &Cell| c.summary.handoff_p99_us.max(1.0) / 1000.0;
    let thr = |c: &Cell| c.summary.all.per_second.max(0.1);

    use SeriesLabelPosition::{LowerLeft, UpperLeft};
    let rows = [
        ("hand-off latency p99 (ms, log)", UpperLeft),
        ("critical sections / s (log)", LowerLeft),
    ];
    for (row, (metric, pos)) in rows.into_iter().enumerate() {
        let value = |c: &Cell| if row == 0 { lat(c) } else { thr(c) };
        let (y_lo, y_hi) = decades(cells.iter().map(|c| value(c)));
        for (col, &hold) in holds.iter().enumerate() {
            let area = &panels[row * cols + col];
            let mut chart = ChartBuilder::on(area)
                .caption(format!("{metric} — c = {hold} ms"), (FONT, 21).into_font())
                .margin(18)
                .x_label_area_size(45)
                .y_label_area_size(80)
                .build_cartesian_2d(-0.25f64..x_max + 0.25, (y_lo..y_hi).log_scale())?;
            chart
                .configure_mesh()
                .x_desc("clients N (log₂)")
                .x_labels(x_max as usize + 1)
                .x_label_formatter(&|x| format!("{}", 2f64.powf(*x).round()))
                .y_label_formatter(&|y| tick(*y))
                .label_style((FONT, 16).into_font())
                .axis_desc_style((FONT, 16).into_font())
                .light_line_style(RGBColor(235, 235, 235))
                .draw()?;
            if row == 0 {
                // The module's goal: p99 <= 1 ms.
                let goal = RGBColor(200, 30, 30);
                let seg = [(-0.25, 1.0), (x_max + 0.25, 1.0)];
                chart
                    .draw_series(DashedLineSeries::new(seg, 8, 6, goal.stroke_width(2)))?
                    .label("goal for the module: p99 ≤ 1 ms")
                    .legend(line_key(goal.stroke_width(2), 20));
            }
            for m in first_seen(cells.iter().map(|c| c.method.as_str())) {
                let mut pts: Vec<(f64, f64)> = cells
                    .iter()
                    .filter(|c| c.method == m && c.hold_ms == hold)
                    .map(|c| ((c.clients as f64).log2(), value(c)))
                    .collect();
                if pts.is_empty() {
                    continue;
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                let i = ["module", "poll100", "jitter"].iter().position(|x| *x == m);
                let col_m = PALETTE[i.unwrap_or(3)];
                let label = cells.iter().find(|c| c.method == m).map_or(m, |c| &c.label);
                chart
                    .draw_series(LineSeries::new(pts.clone(), col_m.stroke_width(3)))?
                    .label(label)
                    .legend(line_key(col_m.stroke_width(3), 20));
                chart.draw_series(
                    pts.iter()
                        .map(|&(x, y)| Circle::new((x, y), 5, col_m.filled())),
                )?;
            }
            legend(&mut chart, pos.clone(), 15)?;
        }
    }
    body.present()?;
    Ok(())
}
