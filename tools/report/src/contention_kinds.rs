//! The readers/writers and semaphore cells of the contention section and
//! docs/contention-kinds.png: `SHARED` and `LIMIT n` against the client-side recipes.

use std::path::Path;

use minijinja::context;
use minijinja::value::{Serde, Value};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::chart::{category, decades, first_seen, holds, legend, tick, FONT, PALETTE};
use crate::contention::{by_method, two_commands, within, Cell, ContentionRun};
use crate::Error;

/// Pause between two attempts of node-redlock's `SET NX` and of the client-side read-write
/// locks: uniform in this range of µs (10 ms ± 5 ms, node-redlock's jitter).
pub const JITTER_US: (u64, u64) = (5_000, 14_999);
/// Pause between two attempts of the sorted-set semaphore (npm redis-semaphore's default).
pub const SEM_POLL_MS: u64 = 10;
/// Lease of a waiting writer's note in the writer-first recipe (renewed at each attempt).
pub const INTENT_MS: u64 = 1_000;

fn find<'a>(cells: &[&'a Cell], method: &str, hold_ms: u64) -> Option<&'a Cell> {
    cells
        .iter()
        .copied()
        .find(|c| c.method == method && c.hold_ms == hold_ms)
}

/// The module's readers/writers goals (None without `shared` cells).
fn rw_goals(rw: &[&Cell]) -> Option<Value> {
    let shared = by_method(rw, "shared");
    let first = shared.first()?;
    let writers = |c: &Cell| c.summary.writers.clone();
    let reads = |c: &Cell| c.summary.readers.as_ref().map_or(0.0, |r| r.per_second);
    // Bounded bypass ("no starvation"): while a writer waits, each reader passes it once.
    let fed = shared.iter().all(|c| {
        c.summary.overtakes_most <= c.readers as u64
            && writers(c).is_some_and(|w| w.gave_up == 0 && w.acquisitions > 0)
    });
    // Reads/s of each `shared` cell against another method's at the same c.
    let vs = |c: &Cell, other| find(rw, other, c.hold_ms).map(|m| reads(c) / reads(m));
    let cells = shared.iter().map(|c| {
        let (vs_mutex, vs_wfirst) = (vs(c, "module"), vs(c, "rw-script-wfirst"));
        context! { vs_mutex, vs_wfirst, ..Value::from(Serde(c)) }
    });
    let wait = |c: &&&Cell| writers(c).map_or(0.0, |w| w.wait_max_ms);
    let lua = by_method(rw, "rw-script");
    let starved = lua.iter().max_by(|a, b| wait(a).total_cmp(&wait(b)));
    let reads = shared.iter().filter_map(|c| c.summary.readers.as_ref());
    Some(context! {
        readers => first.readers,
        fed,
        overtakes => shared.iter().map(|c| c.summary.overtakes).sum::<u64>(),
        reads => reads.map(|r| r.acquisitions).sum::<u64>(),
        peak => shared.iter().map(|c| c.summary.peak_holders).max().unwrap_or(0),
        shared => cells.collect::<Vec<_>>(),
        starved => Serde(starved.filter(|c| c.summary.writers.is_some())),
        wfirst => rw.iter().any(|c| c.method == "rw-script-wfirst"),
    })
}

/// The module's semaphore goals (None without `limit` cells).
fn sem_goals(sem: &[&Cell]) -> Option<Value> {
    let limit = by_method(sem, "limit");
    if limit.is_empty() {
        return None;
    }
    // FIFO's bound: the clients ahead go through the n permits in turns of c + 1 ms.
    let (over, p99_met) = within(&limit, |c| {
        let n = c.limit.unwrap_or(1).max(1) as usize;
        c.clients.div_ceil(n) as f64 * (c.hold_ms as f64 + 1.0)
    });
    let zset = by_method(sem, "zset");
    Some(context! {
        over,
        p99_met,
        limit => Serde(&limit),
        zset_violations => zset.iter().map(|c| c.summary.violations).sum::<u64>(),
        zset_peak => zset.iter().map(|c| c.summary.peak_holders).max().unwrap_or(0),
        zset => Serde(&zset),
    })
}

/// The readers/writers and semaphore cells and their goals, for contention-kinds.md.j2.
pub fn context(run: &ContentionRun) -> Value {
    let (rw, sem) = (run.family("rw"), run.family("sem"));
    // Goals both families share: 2 commands per acquisition, no grant against the rule.
    let module = [by_method(&rw, "shared"), by_method(&sem, "limit")].concat();
    let common = (!module.is_empty()).then(|| {
        context! {
            exact => two_commands(&module),
            bad => module.iter().map(|c| c.summary.violations).sum::<u64>(),
            acquisitions => module.iter().map(|c| c.summary.all.acquisitions).sum::<u64>(),
        }
    });
    let (lo, hi) = JITTER_US;
    context! {
        rw_goals => rw_goals(&rw),
        sem_goals => sem_goals(&sem),
        common,
        rw => Serde(rw),
        sem => Serde(sem),
        jitter => Serde([(lo + hi + 1) as f64 / 2e3, (hi + 1 - lo) as f64 / 2e3]),
        INTENT_MS,
        SEM_POLL_MS,
    }
}

/// A method's name on the chart's axis.
fn short_label(method: &str) -> &str {
    match method {
        "shared" => "module SHARED",
        "module" => "one mutex: module",
        "jitter" => "one mutex: SET NX",
        "rw-script" => "Lua, readers first",
        "rw-script-wfirst" => "Lua, writer first",
        "limit" => "module LIMIT",
        "zset" => "sorted set",
        other => other,
    }
}

/// A panel of the chart: its title after the family's heading, its figure, its unit.
type PanelSpec = (&'static str, fn(&Cell) -> f64, &'static str);
const RW_PANELS: [PanelSpec; 2] = [
    (
        "reads / s (log)",
        |c| c.summary.readers.as_ref().map_or(0.0, |r| r.per_second),
        "reads / s",
    ),
    (
        "writer's longest wait (ms, log)",
        |c| c.summary.writers.as_ref().map_or(0.0, |w| w.wait_max_ms),
        "ms",
    ),
];
const SEM_PANELS: [PanelSpec; 2] = [
    (
        "acquisitions / s (log)",
        |c| c.summary.all.per_second,
        "acquisitions / s",
    ),
    ("wait p99 (ms, log)", |c| c.summary.all.wait_p99_ms, "ms"),
];

fn bar_label(v: f64) -> String {
    crate::fmt::scaled(
        v,
        &[
            (1e4, 1e3, 0, "k"),
            (1e3, 1e3, 1, "k"),
            (10.0, 1.0, 0, ""),
            (f64::MIN, 1.0, 1, ""),
        ],
    )
}

/// One panel: a group of bars per method, a bar per critical-section length, log axis.
fn draw_panel(
    area: &DrawingArea<BitMapBackend, Shift>,
    title: &str,
    cells: &[&Cell],
    (value, unit): (fn(&Cell) -> f64, &str),
    color: RGBColor,
) -> Result<(), Error> {
    let methods = first_seen(cells.iter().map(|c| c.method.as_str()));
    let holds = holds(cells.iter().map(|c| c.hold_ms));
    // Bars start at the axis' floor; a 0 (nothing measured) sits on it.
    let (lo, hi) = decades(cells.iter().map(|c| value(c)).filter(|v| *v > 0.0));
    let floor = |v: f64| v.max(lo);
    let n = methods.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 20).into_font())
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5f64..n - 0.5, (lo..hi * 1.8).log_scale())?;
    let category = |x: &f64| {
        category(&methods, *x)
            .map_or("", |m| short_label(m))
            .to_string()
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(methods.len())
        .x_label_formatter(&category)
        .y_desc(unit)
        .y_label_formatter(&|y| tick(*y))
        .label_style((FONT, 14).into_font())
        .axis_desc_style((FONT, 15).into_font())
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let bw = 0.8 / holds.len().max(1) as f64;
    for (hi_i, &hold) in holds.iter().enumerate() {
        // Shorter critical sections pale, the longest in full colour.
        let t = if holds.len() > 1 {
            hi_i as f64 / (holds.len() - 1) as f64
        } else {
            1.0
        };
        let mix = |v: u8| (255.0 - (255.0 - f64::from(v)) * (0.4 + 0.6 * t)) as u8;
        let shade = RGBColor(mix(color.0), mix(color.1), mix(color.2));
        let bars: Vec<(f64, f64)> = methods
            .iter()
            .enumerate()
            .filter_map(|(g, m)| {
                find(cells, m, hold).map(|c| (g as f64 - 0.4 + hi_i as f64 * bw, value(c)))
            })
            .collect();
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Rectangle::new([(x, lo), (x + bw * 0.9, floor(v))], shade.filled())
            }))?
            .label(format!("c = {hold} ms"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], shade.filled()));
        let font = (FONT, 13)
            .into_font()
            .color(&RGBColor(60, 60, 60))
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(bars.iter().map(|&(x, v)| {
            Text::new(bar_label(v), (x + bw * 0.45, floor(v) * 1.04), font.clone())
        }))?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight, 14)
}

/// docs/contention-kinds.png: throughput (top) and waits (bottom), rw and sem columns.
pub fn draw(path: &Path, run: &ContentionRun) -> Result<(), Error> {
    crate::chart::register_fonts()?;
    let (rw, sem) = (run.family("rw"), run.family("sem"));
    let rw_who = rw
        .first()
        .map(|f| format!("{} readers + {} writer", f.readers, f.writers));
    let sem_who = sem.first().map(|f| {
        let permits = f.limit.unwrap_or(0);
        format!("{} clients, {permits} permits", f.clients)
    });
    // A column for each family with cells, its colours by family and row.
    let families = [(rw_who, &rw, RW_PANELS), (sem_who, &sem, SEM_PANELS)];
    let columns: Vec<_> = (families.into_iter().enumerate())
        .filter_map(|(i, (who, cells, specs))| Some((i, who?, cells, specs)))
        .collect();
    if columns.is_empty() {
        return Ok(());
    }
    let cols = columns.len();
    let title = "Readers/writers and semaphore: the module's queue against client-side recipes";
    let (body, areas) = run.info.grid(path, (760, 900), (title, 26), cols)?;
    for (col, (i, who, cells, specs)) in columns.iter().enumerate() {
        for (row, &(title, value, unit)) in specs.iter().enumerate() {
            let (area, title) = (&areas[row * cols + col], format!("{who}: {title}"));
            draw_panel(area, &title, cells, (value, unit), PALETTE[2 * i + row])?;
        }
    }
    body.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contention::{section, RoleStats, Summary};

    fn group(clients: usize, acquisitions: u64, wait_max_ms: f64) -> RoleStats {
        RoleStats {
            clients,
            acquisitions,
            per_second: acquisitions as f64 / 3.0,
            wait_p50_ms: wait_max_ms / 4.0,
            wait_p99_ms: wait_max_ms / 2.0,
            wait_max_ms,
            jain: 1.0,
            gave_up: 0,
        }
    }

    /// A cell of `family` with `all` as its figures for every client; the rest plain.
    fn cell(family: &str, method: &str, all: RoleStats) -> Cell {
        Cell {
            family: family.into(),
            method: method.into(),
            label: format!("label of {method}"),
            clients: all.clients,
            hold_ms: 1,
            summary: Summary {
                elapsed_s: 3.0,
                all,
                commands_per_acquisition: 2.0,
                round_trips_per_acquisition: 2.0,
                peak_holders: 4,
                mean_holders: 3.5,
                handoff_p50_us: 10.0,
                handoff_p99_us: 20.0,
                handoffs: 100,
                hold_mean_ms: 1.0,
                hold_max_ms: 2.0,
                ..Summary::default()
            },
            other_cores: Some(0.1),
            ..Cell::default()
        }
    }

    fn rw_cell(method: &str, reads: u64, writes: u64, writer_wait_ms: f64) -> Cell {
        let mut c = cell("rw", method, group(9, reads + writes, writer_wait_ms));
        (c.readers, c.writers, c.summary.peak_holders) = (8, 1, 8);
        c.summary.readers = Some(group(8, reads, 2.0));
        c.summary.writers = Some(group(1, writes, writer_wait_ms));
        c
    }

    fn sem_cell(method: &str, wait_max_ms: f64, violations: u64) -> Cell {
        let mut c = cell("sem", method, group(16, 9000, wait_max_ms));
        c.limit = Some(4);
        c.summary.peak_holders = 4 + violations.min(1);
        c.summary.violations = violations;
        c
    }

    fn cells() -> Vec<Cell> {
        vec![
            rw_cell("shared", 9000, 1000, 1.7),
            rw_cell("module", 2000, 250, 14.0),
            rw_cell("rw-script", 16000, 1, 3000.0),
            sem_cell("limit", 6.0, 0),
            sem_cell("zset", 300.0, 12),
        ]
    }

    /// A run with no cells, as docs/data/contention.json holds it.
    const EMPTY: &str = r#"{"info": {"date_utc": "d", "command": "c", "server": "s", "machine": "m",
        "secs_per_cell": 3.0, "wall_secs": 1.0, "signal_expire_ms": 1000}, "cells": []}"#;

    fn run(cells: Vec<Cell>) -> ContentionRun {
        let run: ContentionRun = serde_json::from_str(EMPTY).expect("a run");
        ContentionRun { cells, ..run }
    }

    fn render(kinds: &[Cell]) -> String {
        section(&run(kinds.to_vec())).expect("rendered")
    }

    #[test]
    fn tables_and_goals_follow_the_cells() {
        let mut kinds = cells();
        let text = render(&kinds);
        assert!(text.contains("### Readers and writers: 8 readers + 1 writer, one lock"));
        assert!(text.contains("### Semaphore: 16 clients, 4 permits"));
        assert!(text.contains(
            "than there are readers, 8): **met**. The most readers past one waiting writer: 0 at c = 1 ms; 0 of 9000 reader grants"
        ));
        assert!(text.contains("which waited up to 3.00 s (1 write in the 3.00 s the cell ran)"));
        assert!(text.contains("mutex for everybody: 4.5× at c = 1 ms."));
        assert!(text.contains("FIFO's bound ⌈N / n⌉ × (c + 1 ms): **met** (6.0 ms at c = 1 ms)"));
        assert!(text.contains("which gave out 12 permits beyond n (up to 5 holders at once)"));
        assert!(text.contains("| label of zset | 1 ms | 3000 | 3.50 of 4 | 5 | **12** |"));
        assert!(text.contains("rule (a writer beside another holder, a reader beside a writer, more than n permits): **met** (0 violations"));

        // One reader past a waiting writer, a semaphore wait over the bound, a
        // violation in a module cell: each turns its goal.
        kinds[0].summary.overtakes = 12;
        kinds[0].summary.overtakes_most = 8;
        assert!(render(&kinds).contains("readers, 8): **met**. The most readers past one waiting writer: 8 at c = 1 ms; 12 of 9000"));
        kinds[0].summary.overtakes_most = 9;
        kinds[3].summary.all.wait_max_ms = 8.5;
        kinds[3].summary.violations = 2;
        let text = render(&kinds);
        assert!(
            text.contains("readers, 8): **not met**. The most readers past one waiting writer: 9")
        );
        assert!(text.contains("**not met**; over it: c = 1 ms: longest 8.50 ms against 8.00 ms"));
        assert!(text.contains("more than n permits): **not met** (2 violations over 19000"));
        kinds[0].summary.violations = 3;
        assert!(render(&kinds).contains("| label of shared **3 VIOLATIONS** | 1 ms |"));
    }

    #[test]
    fn a_run_without_these_cells_renders_without_their_part() {
        let text = section(&run(vec![])).expect("rendered");
        assert!(!text.contains("Readers and writers") && !text.contains("SHARED and LIMIT"));
        assert!(text.contains("Reproduce: `make bench-contention`"));
    }

    #[test]
    fn the_chart_is_drawn() {
        let run = run(cells());
        let path = std::env::temp_dir().join(format!(
            "redis-lock-contention-kinds-{}.png",
            std::process::id()
        ));
        draw(&path, &run).expect("draw");
        let bytes = std::fs::read(&path).expect("png written");
        let _ = std::fs::remove_file(&path);
        assert!(bytes.starts_with(b"\x89PNG"), "a PNG file");
        assert!(bytes.len() > 10_000, "with something drawn on it");
    }
}
