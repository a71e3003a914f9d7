//! docs/contention.png: hand-off latency p99 (top) and throughput (bottom) against N,
//! one panel per critical-section length, one line per method. Text uses a font that
//! ships inside a crate (no system font libraries needed).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::methods::{Method, ALL};
use crate::run::CellResult;
use crate::Error;

const FONT: &str = "sans-serif";

fn color(m: Method) -> RGBColor {
    match m {
        Method::Module => RGBColor(0, 114, 178),
        Method::Poll100 => RGBColor(213, 94, 0),
        Method::PollJitter => RGBColor(0, 158, 115),
        Method::Blpop => RGBColor(204, 121, 167),
    }
}

fn register_fonts() -> Result<(), Error> {
    plotters::style::register_font(FONT, FontStyle::Normal, epaint_default_fonts::UBUNTU_LIGHT)
        .map_err(|_| "cannot load the chart font")?;
    plotters::style::register_font(FONT, FontStyle::Bold, epaint_default_fonts::UBUNTU_LIGHT)
        .map_err(|_| "cannot load the chart font")?;
    Ok(())
}

/// Bounds of a log axis around `values` (positive), widened to whole decades.
fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (1.0, 10.0);
    }
    (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
    )
}

pub fn draw(path: &Path, cells: &[CellResult], subtitle: &str) -> Result<(), Error> {
    register_fonts()?;
    let mut holds: Vec<u64> = cells.iter().map(|c| c.hold_ms).collect();
    holds.sort_unstable();
    holds.dedup();
    let cols = holds.len().max(1);
    let root = BitMapBackend::new(path, (700 * cols as u32, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(70);
    title.draw(&Text::new(
        "Lock contention: N clients, one lock, each holds it c ms",
        (20, 10),
        (FONT, 28).into_font().color(&BLACK),
    ))?;
    title.draw(&Text::new(
        subtitle.to_string(),
        (20, 44),
        (FONT, 17).into_font().color(&RGBColor(80, 80, 80)),
    ))?;
    let panels = body.split_evenly((2, cols));
    let max_n = cells.iter().map(|c| c.n).max().unwrap_or(64).max(2) as f64;
    let x_max = max_n.log2();
    // In ms. Latency can be 0 (grant reply before the release reply): plot it at 1 µs.
    let lat = |c: &CellResult| c.summary.handoff_p99_us.max(1.0) / 1000.0;
    let thr = |c: &CellResult| c.summary.per_second.max(0.1);

    for (row, metric) in [
        ("hand-off latency p99 (ms, log)", 0),
        ("critical sections / s (log)", 1),
    ]
    .iter()
    .enumerate()
    {
        let value = |c: &CellResult| if metric.1 == 0 { lat(c) } else { thr(c) };
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
            for m in ALL {
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
                chart
                    .draw_series(LineSeries::new(pts.clone(), col_m.stroke_width(3)))?
                    .label(m.label())
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
    root.present()?;
    Ok(())
}
