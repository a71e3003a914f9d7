//! Every chart of the docs, drawn with plotters; text in a font that ships inside a
//! crate (no system font libraries needed). docs/perf.png is here; docs/contention.png
//! is drawn in contention.rs.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::perf::{PerfRun, ACQUIRE, CYCLE, EXTEND, RELEASE};
use crate::Error;

pub const FONT: &str = "sans-serif";
const SERVER_COLORS: [RGBColor; 4] = [
    RGBColor(200, 50, 45),
    RGBColor(235, 140, 20),
    RGBColor(40, 100, 200),
    RGBColor(120, 60, 160),
];
const GOAL: RGBColor = RGBColor(0, 150, 60);
const DARK: RGBColor = RGBColor(60, 60, 60);
const GREY: RGBColor = RGBColor(170, 170, 170);

pub fn register_fonts() -> Result<(), Error> {
    for style in [FontStyle::Normal, FontStyle::Bold] {
        plotters::style::register_font(FONT, style, epaint_default_fonts::UBUNTU_LIGHT)
            .map_err(|_| "cannot load the chart font")?;
    }
    Ok(())
}

/// Bounds of a log axis around `values` (positive), widened to whole decades.
pub fn decades(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return (1.0, 10.0);
    }
    (
        10f64.powf(lo.log10().floor()),
        10f64.powf(hi.log10().ceil().max(lo.log10().floor() + 1.0)),
    )
}

fn server_color(i: usize) -> RGBColor {
    SERVER_COLORS[i % SERVER_COLORS.len()]
}

fn pale(c: RGBColor) -> RGBColor {
    let mix = |v: u8| ((u16::from(v) + 255) / 2) as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

/// A value label above a bar: `321`, `17.6k`, `0.95`.
fn short(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// One bar series: legend label, colour, one value per group (NaN = missing).
struct Series {
    label: String,
    color: RGBColor,
    values: Vec<f64>,
}

/// Grouped bars; `goals` draws a goal segment over each group, `parity` a dashed line.
#[allow(clippy::too_many_arguments)]
fn bars(
    area: &DrawingArea<BitMapBackend, Shift>,
    title: &str,
    ylabel: &str,
    groups: &[String],
    series: &[Series],
    goals: &[Option<f64>],
    parity: Option<f64>,
    value_labels: bool,
) -> Result<(), Error> {
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .chain(goals.iter().flatten().copied())
        .filter(|v| v.is_finite())
        .fold(parity.unwrap_or(0.0), f64::max)
        .max(1e-9)
        * 1.45;
    let n = groups.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len())
        .x_label_formatter(&|x| {
            let g = x.round();
            let name = (g >= 0.0 && (x - g).abs() < 0.01)
                .then(|| groups.get(g as usize))
                .flatten();
            name.cloned().unwrap_or_default()
        })
        .y_desc(ylabel)
        .y_label_formatter(&|v| short(*v).trim_end_matches(".00").to_string())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let k = series.len().max(1) as f64;
    let bw = 0.84 / k;
    for (si, s) in series.iter().enumerate() {
        let color = s.color;
        let rects = s
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(move |(g, &v)| {
                let x0 = g as f64 - 0.42 + si as f64 * bw;
                Rectangle::new([(x0, 0.0), (x0 + bw * 0.92, v)], color.filled())
            });
        chart
            .draw_series(rects)?
            .label(s.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        if value_labels {
            let texts = s
                .values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .map(move |(g, &v)| {
                    let x = g as f64 - 0.42 + (si as f64 + 0.1) * bw;
                    Text::new(
                        short(v),
                        (x, v + max * 0.01),
                        (FONT, 12).into_font().color(&DARK),
                    )
                });
            chart.draw_series(texts)?;
        }
    }
    for (g, goal) in goals.iter().enumerate() {
        if let Some(v) = goal {
            let seg = [(g as f64 - 0.46, *v), (g as f64 + 0.46, *v)];
            chart.draw_series(LineSeries::new(seg, GOAL.stroke_width(3)))?;
        }
    }
    if goals.iter().any(Option::is_some) {
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label("goal")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], GOAL.stroke_width(3)));
    }
    if let Some(p) = parity {
        chart.draw_series(DashedLineSeries::new(
            [(-0.5, p), (n - 0.5, p)],
            6,
            4,
            GREY.stroke_width(1),
        ))?;
    }
    legend(&mut chart)
}

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

fn legend<'a>(chart: &mut Chart<'a, 'a>) -> Result<(), Error> {
    let r: Result<(), String> = {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font((FONT, 13))
            .draw()
            .map_err(|e| e.to_string())
    };
    Ok(r?)
}

/// Lines over the scaling levels; `thick` series are drawn wider.
fn lines(
    area: &DrawingArea<BitMapBackend, Shift>,
    title: &str,
    ylabel: &str,
    xlabels: &[String],
    series: &[(Series, bool)],
    parity: Option<f64>,
) -> Result<(), Error> {
    let max = series
        .iter()
        .flat_map(|(s, _)| s.values.iter().copied())
        .filter(|v| v.is_finite())
        .fold(parity.unwrap_or(0.0), f64::max)
        .max(1e-9)
        * 1.6;
    let n = xlabels.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.3f64..n as f64 - 0.7, 0f64..max)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| xlabels.get(x.round() as usize).cloned().unwrap_or_default())
        .y_desc(ylabel)
        .y_label_formatter(&|v| short(*v).trim_end_matches(".00").to_string())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (s, thick) in series {
        let (color, width) = (s.color, if *thick { 3 } else { 1 });
        let pts: Vec<(f64, f64)> = s
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64, *v))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(width)))?
            .label(s.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], color.stroke_width(width))
            });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    if let Some(p) = parity {
        let seg = [(-0.3, p), (n as f64 - 0.7, p)];
        chart.draw_series(DashedLineSeries::new(seg, 6, 4, GREY.stroke_width(1)))?;
    }
    legend(&mut chart)
}

fn pow10(n: u64) -> String {
    let e = (n as f64).log10();
    if n > 0 && (e - e.round()).abs() < 1e-9 {
        format!("1e{}", e.round())
    } else {
        n.to_string()
    }
}

/// docs/perf.png: throughput ratios, latency, memory, scaling (cost and hand-off) and
/// instructions per command.
pub fn perf(path: &Path, run: &PerfRun) -> Result<(), Error> {
    register_fonts()?;
    let root = BitMapBackend::new(path, (1500, 1040)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(44);
    title.draw(&Text::new(
        format!(
            "redis-lock vs SET NX PX + EVALSHA — make bench, {}",
            run.date
        ),
        (14, 10),
        (FONT, 24).into_font().color(&BLACK),
    ))?;
    let panels = body.split_evenly((2, 3));
    let servers = &run.servers;
    let labels: Vec<String> = servers.iter().map(|s| s.label.clone()).collect();

    // 1. Throughput ratios: a pale (pipeline 1) and a full (pipeline 16) bar per server.
    let names = [ACQUIRE, RELEASE, EXTEND, CYCLE];
    let mut series = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        for p in crate::perf::PIPELINES {
            let values = names
                .iter()
                .map(|n| {
                    s.throughput
                        .as_ref()
                        .and_then(|t| t.get(n, p))
                        .map_or(f64::NAN, |r| r.ratio)
                })
                .collect();
            let color = if p == 1 {
                pale(server_color(i))
            } else {
                server_color(i)
            };
            series.push(Series {
                label: format!("{} P{p}", s.label),
                color,
                values,
            });
        }
    }
    let goals: Vec<Option<f64>> = names
        .iter()
        .map(|n| {
            servers
                .iter()
                .find_map(|s| s.throughput.as_ref()?.get(n, 1)?.goal)
        })
        .collect();
    let groups: Vec<String> = ["ACQUIRE", "RELEASE", "EXTEND", "CYCLE"]
        .map(String::from)
        .to_vec();
    let t = "1. Throughput, module / recipe (pale: pipeline 1, full: 16)";
    bars(
        &panels[0],
        t,
        "ratio, 1.0 = same speed",
        &groups,
        &series,
        &goals,
        Some(1.0),
        false,
    )?;

    // 2. Latency p50.
    let lat = |f: fn(&crate::perf::Latency) -> f64| -> Vec<f64> {
        servers
            .iter()
            .map(|s| s.latency.as_ref().map_or(f64::NAN, f))
            .collect()
    };
    let series = vec![
        Series {
            label: "ACQUIRE".into(),
            color: RGBColor(50, 50, 50),
            values: lat(|l| l.acquire.p50),
        },
        Series {
            label: "SET NX PX".into(),
            color: RGBColor(170, 170, 170),
            values: lat(|l| l.set_nx.p50),
        },
        Series {
            label: "RELEASE".into(),
            color: RGBColor(30, 110, 60),
            values: lat(|l| l.release.p50),
        },
        Series {
            label: "EVALSHA release".into(),
            color: RGBColor(150, 205, 165),
            values: lat(|l| l.eval_release.p50),
        },
    ];
    let t = "2. Latency p50, one client, unpipelined";
    bars(
        &panels[1],
        t,
        "microseconds",
        &labels,
        &series,
        &[],
        None,
        true,
    )?;

    // 3. Memory per held lock, with the goal (1.5x a string lock).
    let mem = |f: fn(&crate::perf::Memory) -> f64| -> Vec<f64> {
        servers
            .iter()
            .map(|s| s.memory.as_ref().map_or(f64::NAN, f))
            .collect()
    };
    let series = vec![
        Series {
            label: "module lock".into(),
            color: RGBColor(50, 50, 50),
            values: mem(|m| m.module_per_lock),
        },
        Series {
            label: "SET NX PX string".into(),
            color: RGBColor(170, 170, 170),
            values: mem(|m| m.string_per_lock),
        },
    ];
    let goals: Vec<Option<f64>> = mem(|m| m.string_per_lock * 1.5)
        .into_iter()
        .map(|v| v.is_finite().then_some(v))
        .collect();
    let t = "3. Memory per held lock (used_memory delta / locks)";
    bars(
        &panels[2],
        t,
        "bytes per lock",
        &labels,
        &series,
        &goals,
        None,
        true,
    )?;

    // 4 and 5. Scaling over the levels of held locks (+ waiters).
    let levels: Vec<String> = servers
        .iter()
        .find_map(|s| s.scaling.as_ref())
        .map(|sc| {
            sc.levels
                .iter()
                .map(|l| {
                    if l.waiters > 0 {
                        format!("{}+{}w", pow10(l.held), pow10(l.waiters))
                    } else {
                        pow10(l.held)
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let per_level = |f: fn(&crate::perf::Level) -> f64| -> Vec<Vec<f64>> {
        servers
            .iter()
            .map(|s| {
                s.scaling
                    .as_ref()
                    .map_or(vec![], |sc| sc.levels.iter().map(f).collect())
            })
            .collect()
    };
    let two = |a: Vec<Vec<f64>>, b: Vec<Vec<f64>>, la: &str, lb: &str| -> Vec<(Series, bool)> {
        let mut v = Vec::new();
        for (i, (va, vb)) in a.into_iter().zip(b).enumerate() {
            let c = server_color(i);
            v.push((
                Series {
                    label: format!("{} {la}", labels[i]),
                    color: c,
                    values: va,
                },
                true,
            ));
            v.push((
                Series {
                    label: format!("{} {lb}", labels[i]),
                    color: c,
                    values: vb,
                },
                false,
            ));
        }
        v
    };
    let series = two(
        per_level(|l| l.cycle_vs_recipe),
        per_level(|l| l.extend_vs_pexpire),
        "cycle",
        "EXTEND",
    );
    let t = "4. Scaling: module / native rate (thick: cycle, thin: EXTEND)";
    lines(
        &panels[3],
        t,
        "ratio (flat line = O(1))",
        &levels,
        &series,
        Some(1.0),
    )?;
    let series = two(
        per_level(|l| l.handoff_p50),
        per_level(|l| l.expiry_p50),
        "hand-off",
        "expiry",
    );
    let t = "5. Scaling: time to hand a lock to a waiter (thick: RELEASE, thin: expiry)";
    lines(&panels[4], t, "milliseconds (p50)", &levels, &series, None)?;

    // 6. Instructions per command, before (baseline) and now.
    if let Some(cg) = &run.callgrind {
        let groups: Vec<String> = cg
            .phases
            .iter()
            .map(|p| short_phase(&p.name).to_string())
            .collect();
        let before = cg.phases.iter().map(|p| {
            cg.baseline
                .as_ref()
                .and_then(|(_, rows)| rows.iter().find(|(n, _)| *n == p.name).map(|(_, v)| *v))
                .unwrap_or(f64::NAN)
        });
        let series = vec![
            Series {
                label: "before (baseline)".into(),
                color: RGBColor(185, 185, 185),
                values: before.collect(),
            },
            Series {
                label: "now".into(),
                color: RGBColor(40, 40, 40),
                values: cg.phases.iter().map(|p| p.per_cmd).collect(),
            },
        ];
        let t = format!("6. Instructions per command ({}, callgrind)", cg.server);
        bars(
            &panels[5],
            &t,
            "instructions (Ir) per command",
            &groups,
            &series,
            &[],
            None,
            true,
        )?;
    }
    root.present()?;
    Ok(())
}

fn short_phase(name: &str) -> &str {
    match name {
        "SET NX PX" => "SET",
        "LOCK.ACQUIRE (TOKEN)" => "ACQ",
        "LOCK.ACQUIRE (generated token)" => "ACQg",
        "LOCK.EXTEND" => "EXT",
        "EVALSHA extend" => "EVext",
        "LOCK.RELEASE" => "REL",
        "EVALSHA release" => "EVrel",
        other => other,
    }
}
