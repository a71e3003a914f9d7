//! The charts' shared parts and docs/perf.png, drawn with plotters in a font that ships
//! inside a crate (no system font libraries needed).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, FontTransform};

use crate::perf::{before, inside, pair, Latency, Level, Memory, PerfRun, ServerResults};
use crate::perf::{ACQUIRE, EXTEND, FLOOR, FLOOR_ROWS, PIPELINES, RELEASE, RELEASE_DELIFEQ};
use crate::Error;

pub const FONT: &str = "sans-serif";
const SERVER_COLORS: [RGBColor; 4] = [
    RGBColor(200, 50, 45),
    RGBColor(235, 140, 20),
    RGBColor(40, 100, 200),
    RGBColor(120, 60, 160),
];
/// The colours of the contention charts' methods (Okabe–Ito).
pub const PALETTE: [RGBColor; 4] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
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

/// The distinct items, in the order first seen (the order the run measured them).
pub fn first_seen<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for m in items {
        if !v.contains(&m) {
            v.push(m);
        }
    }
    v
}

/// The distinct critical-section lengths, shortest first.
pub fn holds(items: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = items.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// A label of a log axis: `2k`, `15`, `0.01`.
pub fn tick(y: f64) -> String {
    if y >= 1000.0 {
        format!("{:.0}k", y / 1000.0)
    } else if y >= 1.0 {
        format!("{y:.0}")
    } else {
        // 0.001, 0.01, 0.1 without float noise.
        let digits = (-y.log10().floor()) as usize;
        format!("{y:.digits$}")
    }
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
    crate::fmt::scaled(
        v,
        &[
            (1e4, 1e3, 1, "k"),
            (10.0, 1.0, 0, ""),
            (f64::MIN, 1.0, 2, ""),
        ],
    )
}

/// One series: one value per category (NaN = missing), bars (`width` 0) or a line.
struct Series {
    label: String,
    color: RGBColor,
    values: Vec<f64>,
    width: u32,
}

fn ser(label: impl Into<String>, color: RGBColor, values: Vec<f64>, width: u32) -> Series {
    let label = label.into();
    Series {
        label,
        color,
        values,
        width,
    }
}

/// One panel: categories along x, the series, a goal segment per category and a dashed
/// parity line where given, value labels on the bars if asked.
#[derive(Default)]
struct Panel<'a> {
    title: &'a str,
    ylabel: &'a str,
    xlabels: Vec<String>,
    series: Vec<Series>,
    goals: Vec<Option<f64>>,
    parity: Option<f64>,
    value_labels: bool,
}

/// A rectangle in pixels of a panel's plotting area (y grows downwards).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Px {
    x0: i32,
    y0: i32,
    x1: i32,
    y1: i32,
}

impl Px {
    fn overlaps(&self, o: &Px) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }
}

/// What a panel drew, in pixels of its plotting area: its bars, its goal segments and
/// its value labels (each label's text and box), so that a test can check that no label
/// covers another label, a bar or a goal line.
#[derive(Debug, Default)]
struct Drawn {
    bars: Vec<Px>,
    goals: Vec<Px>,
    labels: Vec<(String, Px)>,
}

fn draw(area: &DrawingArea<BitMapBackend, Shift>, p: &Panel) -> Result<Drawn, Error> {
    let values = p.series.iter().flat_map(|s| s.values.iter().copied());
    let finite = values
        .chain(p.goals.iter().flatten().copied())
        .filter(|v| v.is_finite());
    let max = finite.fold(p.parity.unwrap_or(0.0), f64::max).max(1e-9) * 1.5;
    let n = p.xlabels.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(p.title, (FONT, 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..n - 0.5, 0f64..max)?;
    let category = |x: &f64| category(&p.xlabels, *x).cloned().unwrap_or_default();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(p.xlabels.len())
        .x_label_formatter(&category)
        .y_desc(p.ylabel)
        .y_label_formatter(&|v| short(*v).trim_end_matches(".00").to_string())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let bw = 0.84 / p.series.iter().filter(|s| s.width == 0).count().max(1) as f64;
    let mut drawn = Drawn::default();
    // (text, its bar): placed once every bar and goal line is known.
    let mut value_labels: Vec<(String, Px)> = Vec::new();
    let base = chart.plotting_area().get_base_pixel();
    let coord = chart.as_coord_spec().clone();
    let px = |x: f64, y: f64| {
        let (a, b) = coord.translate(&(x, y));
        (a - base.0, b - base.1)
    };
    let rect = |(x0, y0): (f64, f64), (x1, y1): (f64, f64)| {
        let ((a, b), (c, d)) = (px(x0, y0), px(x1, y1));
        Px {
            x0: a.min(c),
            y0: b.min(d),
            x1: a.max(c),
            y1: b.max(d),
        }
    };
    for (si, s) in p.series.iter().enumerate() {
        let (color, width) = (s.color, s.width);
        let pts = s.values.iter().enumerate().filter(|(_, v)| v.is_finite());
        let pts: Vec<(f64, f64)> = pts.map(|(g, &v)| (g as f64, v)).collect();
        if width > 0 {
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(width)))?
                .label(s.label.clone())
                .legend(line_key(color.stroke_width(width), 12));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            continue;
        }
        let x0 = |g: f64| g - 0.42 + si as f64 * bw;
        drawn.bars.extend(
            pts.iter()
                .map(|&(g, v)| rect((x0(g), 0.0), (x0(g) + bw * 0.92, v))),
        );
        let rects = pts
            .iter()
            .map(|&(g, v)| Rectangle::new([(x0(g), 0.0), (x0(g) + bw * 0.92, v)], color.filled()));
        chart
            .draw_series(rects)?
            .label(s.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        if p.value_labels {
            let bars = &drawn.bars[drawn.bars.len() - pts.len()..];
            let texts = pts.iter().map(|&(_, v)| short(v));
            let labelled: Vec<(String, Px)> = texts.zip(bars.iter().copied()).collect();
            value_labels.extend(labelled);
        }
    }
    for (g, goal) in p.goals.iter().enumerate() {
        if let Some(v) = goal {
            let seg = [(g as f64 - 0.46, *v), (g as f64 + 0.46, *v)];
            let line = rect(seg[0], seg[1]);
            drawn.goals.push(Px {
                y0: line.y0 - 1,
                y1: line.y1 + 2,
                ..line
            });
            chart.draw_series(LineSeries::new(seg, GOAL.stroke_width(3)))?;
        }
    }
    if p.goals.iter().any(Option::is_some) {
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label("goal")
            .legend(line_key(GOAL.stroke_width(3), 12));
    }
    if let Some(v) = p.parity {
        let seg = [(-0.5, v), (n - 0.5, v)];
        chart.draw_series(DashedLineSeries::new(seg, 6, 4, GREY.stroke_width(1)))?;
    }
    let plot = chart.plotting_area().strip_coord_spec();
    drawn.labels = place_labels(&plot, &value_labels, &drawn.goals)?;
    legend(&mut chart, SeriesLabelPosition::UpperLeft, 13)?;
    Ok(drawn)
}

/// Draws the value labels of a panel's bars on its plotting area (pixels) and returns
/// their boxes: each centred over its bar, 3 px above it, or just above a goal line that
/// would cross it; all of them turned upright (reading upwards) when one is wider than
/// its bar, so that neighbours never run into each other.
fn place_labels(
    plot: &DrawingArea<BitMapBackend, Shift>,
    labels: &[(String, Px)],
    goals: &[Px],
) -> Result<Vec<(String, Px)>, Error> {
    const GAP: i32 = 3;
    let desc = (FONT, 12).into_font();
    let sized = labels
        .iter()
        .map(|(text, bar)| {
            let (w, h) = desc.box_size(text).map_err(|e| format!("{e:?}"))?;
            Ok((text, *bar, w as i32, h as i32))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let upright = sized.iter().any(|(_, bar, w, _)| *w > bar.x1 - bar.x0);
    let mut out = Vec::new();
    for (text, bar, w, h) in sized {
        let (w, h) = if upright { (h, w) } else { (w, h) };
        let cx = (bar.x0 + bar.x1) / 2;
        let mut b = Px {
            x0: cx - w / 2,
            x1: cx - w / 2 + w,
            y0: bar.y0 - GAP - h,
            y1: bar.y0 - GAP,
        };
        if let Some(g) = goals.iter().find(|g| g.overlaps(&b)) {
            b.y1 = g.y0 - GAP;
            b.y0 = b.y1 - h;
        }
        let style = desc.color(&DARK);
        if upright {
            // Turned 270°, the text's start (its left edge) is at the anchor and it runs
            // upwards from it: anchor it at the box's bottom left.
            let style = style.transform(FontTransform::Rotate270);
            plot.draw(&Text::new(text.clone(), (b.x0, b.y1), style))?;
        } else {
            let style = style.pos(Pos::new(HPos::Left, VPos::Top));
            plot.draw(&Text::new(text.clone(), (b.x0, b.y0), style))?;
        }
        out.push((text.clone(), b));
    }
    Ok(out)
}

/// The legend box of every chart, at `pos`, its labels `size` px.
pub fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    pos: SeriesLabelPosition,
    size: u32,
) -> Result<(), Error> {
    let drawn = chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .label_font((FONT, size))
        .draw();
    Ok(drawn.map_err(|e| e.to_string())?)
}

/// A legend's key for a line: `len` px of it.
pub fn line_key(style: ShapeStyle, len: i32) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new([(x, y), (x + len, y)], style)
}

/// The item of `items` whose category axis position `x` is (None between them).
pub fn category<T>(items: &[T], x: f64) -> Option<&T> {
    let g = x.round();
    (g >= 0.0 && (x - g).abs() < 0.01).then(|| items.get(g as usize))?
}

fn pow10(n: u64) -> String {
    let e = (n as f64).log10();
    if n > 0 && (e - e.round()).abs() < 1e-9 {
        format!("1e{}", e.round())
    } else {
        n.to_string()
    }
}

/// docs/perf.png: throughput ratios, latency, memory, scaling, instructions per command.
pub fn perf(path: &Path, run: &PerfRun) -> Result<(), Error> {
    draw_perf(path, run).map(|_| ())
}

/// [`perf`], and what each panel drew.
fn draw_perf(path: &Path, run: &PerfRun) -> Result<Vec<Drawn>, Error> {
    register_fonts()?;
    let root = BitMapBackend::new(path, (1500, 1040)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(44);
    let (date, font) = (&run.date, (FONT, 24).into_font().color(&BLACK));
    let text = format!("redis-lock vs SET NX PX + EVALSHA — make bench, {date}");
    title.draw(&Text::new(text, (14, 10), font))?;
    let areas = body.split_evenly((2, 3));
    let mut drawn = Vec::new();
    for (area, panel) in areas.iter().zip(perf_panels(run)) {
        drawn.push(draw(area, &panel)?);
    }
    root.present()?;
    Ok(drawn)
}

fn perf_panels(run: &PerfRun) -> Vec<Panel<'static>> {
    let servers = &run.servers;
    let labels: Vec<String> = servers.iter().map(|s| s.label.clone()).collect();
    let per_server = |f: &dyn Fn(&ServerResults) -> Option<f64>| -> Vec<f64> {
        servers.iter().map(|s| f(s).unwrap_or(f64::NAN)).collect()
    };
    let grey = |v: u8| RGBColor(v, v, v);

    // 1. Throughput ratios: a pale (pipeline 1) and a full (pipeline 16) bar per server.
    let names = [ACQUIRE, FLOOR, RELEASE, EXTEND, RELEASE_DELIFEQ];
    let mut series = Vec::new();
    for (i, s) in servers.iter().enumerate() {
        for p in PIPELINES {
            let ratio = |n: &&str| pair(s, n, p).map_or(f64::NAN, |r| r.ratio);
            let color = if p > 1 {
                server_color(i)
            } else {
                pale(server_color(i))
            };
            let label = format!("{} P{p}", s.label);
            series.push(ser(label, color, names.iter().map(ratio).collect(), 0));
        }
    }
    let goal = |n: &&str| servers.iter().find_map(|s| pair(s, n, 1)?.goal);
    let throughput = Panel {
        title: "1. Throughput, module / replaced command (pale: pipeline 1, full: 16)",
        ylabel: "ratio, 1.0 = same speed",
        xlabels: ["ACQUIRE", "floor", "RELEASE", "EXTEND", "REL/DELIFEQ"]
            .map(String::from)
            .to_vec(),
        series,
        goals: names.iter().map(goal).collect(),
        parity: Some(1.0),
        ..Panel::default()
    };

    // 2. Latency p50; 3. memory per held lock, with the goal (1.5x a string lock).
    let lat = |f: fn(&Latency) -> f64| per_server(&|s| s.latency.as_ref().map(f));
    let by_server = |title, ylabel, series| Panel {
        title,
        ylabel,
        xlabels: labels.clone(),
        series,
        value_labels: true,
        ..Panel::default()
    };
    let green = (RGBColor(30, 110, 60), RGBColor(150, 205, 165));
    let lat_series = vec![
        ser("ACQUIRE", grey(50), lat(|l| l.acquire.p50), 0),
        ser("SET NX PX", grey(170), lat(|l| l.set_nx.p50), 0),
        ser("RELEASE", green.0, lat(|l| l.release.p50), 0),
        ser("EVALSHA release", green.1, lat(|l| l.eval_release.p50), 0),
    ];
    let title = "2. Latency p50, one client, unpipelined";
    let latency = by_server(title, "microseconds", lat_series);
    let mem = |f: fn(&Memory) -> f64| per_server(&|s| s.memory.as_ref().map(f));
    let mem_series = vec![
        ser("module lock", grey(50), mem(|m| m.module_per_lock), 0),
        ser("SET NX PX string", grey(170), mem(|m| m.string_per_lock), 0),
    ];
    let goals = mem(|m| m.string_per_lock * 1.5).into_iter();
    let title = "3. Memory per held lock (used_memory delta / locks)";
    let memory = Panel {
        goals: goals.map(|v| v.is_finite().then_some(v)).collect(),
        ..by_server(title, "bytes per lock", mem_series)
    };

    // 4 and 5. Scaling over the levels of held locks (+ waiters): thick and thin lines.
    let first = servers.iter().find_map(|s| s.scaling.as_ref());
    let level = |l: &Level| match l.waiters {
        0 => pow10(l.held),
        w => format!("{}+{}w", pow10(l.held), pow10(w)),
    };
    let levels: Vec<String> = first.map_or(vec![], |sc| sc.levels.iter().map(level).collect());
    type Curve = (&'static str, fn(&Level) -> f64);
    let lines = |thick: Curve, thin: Curve| {
        let mut v = Vec::new();
        for (i, s) in servers.iter().enumerate() {
            for ((name, f), width) in [(thick, 3), (thin, 1)] {
                let sc = s.scaling.as_ref();
                let values = sc.map_or(vec![], |sc| sc.levels.iter().map(f).collect());
                let label = format!("{} {name}", s.label);
                v.push(ser(label, server_color(i), values, width));
            }
        }
        v
    };
    let cost = Panel {
        title: "4. Scaling: module / native rate (thick: cycle, thin: EXTEND)",
        ylabel: "ratio (flat line = O(1))",
        xlabels: levels.clone(),
        series: lines(
            ("cycle", |l| l.cycle_vs_recipe),
            ("EXTEND", |l| l.extend_vs_pexpire),
        ),
        parity: Some(1.0),
        ..Panel::default()
    };
    let handoff = Panel {
        title: "5. Scaling: time to hand a lock to a waiter (thick: RELEASE, thin: expiry)",
        ylabel: "milliseconds (p50)",
        xlabels: levels,
        series: lines(
            ("hand-off", |l| l.handoff_p50),
            ("expiry", |l| l.expiry_p50),
        ),
        ..Panel::default()
    };

    // 6. Instructions inside call(), before (baseline) and now: the module beside its floor.
    let mut callgrind = Panel {
        title: "6. Instructions inside call() (callgrind)",
        ylabel: "instructions (Ir) per command",
        value_labels: true,
        ..Panel::default()
    };
    if let Some(cg) = run.callgrind.first() {
        // SET NX PX without and with the module, the floor, the module's commands.
        let shown = &FLOOR_ROWS[..8];
        let short = [
            "SET", "SET+m", "floor", "floor0", "ACQ", "ACQg", "EXT", "REL",
        ];
        callgrind.xlabels = short.map(String::from).to_vec();
        let of = |f: &dyn Fn(&str) -> f64| shown.iter().map(|n| f(n)).collect();
        let before = of(&|n| before(cg, n).unwrap_or(f64::NAN));
        let now = of(&|n| inside(cg, n, false));
        callgrind.series = vec![
            ser("before (baseline)", grey(185), before, 0),
            ser(format!("now ({})", cg.server), grey(40), now, 0),
        ];
    }
    vec![throughput, latency, memory, cost, handoff, callgrind]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/perf.png from the measurements saved in docs/data/perf.json: no value label
    /// covers another label, a bar or a goal line, and each stays inside its panel.
    #[test]
    fn perf_value_labels_do_not_overlap() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let run: PerfRun = crate::load(&root.join(crate::PERF_JSON)).expect("docs/data/perf.json");
        let path = std::env::temp_dir().join(format!("perf-labels-{}.png", std::process::id()));
        let panels = draw_perf(&path, &run).expect("drawn");
        let _ = std::fs::remove_file(&path);
        let mut bad = Vec::new();
        let mut labels = 0;
        for (i, d) in panels.iter().enumerate() {
            for (j, (text, b)) in d.labels.iter().enumerate() {
                labels += 1;
                let at = format!("panel {}: label {text:?} at {b:?}", i + 1);
                if b.x0 < 0 || b.y0 < 0 {
                    bad.push(format!("{at} leaves the plot"));
                }
                for (t, o) in &d.labels[j + 1..] {
                    if b.overlaps(o) {
                        bad.push(format!("{at} overlaps label {t:?} at {o:?}"));
                    }
                }
                if let Some(bar) = d.bars.iter().find(|bar| b.overlaps(bar)) {
                    bad.push(format!("{at} overlaps a bar at {bar:?}"));
                }
                if let Some(g) = d.goals.iter().find(|g| b.overlaps(g)) {
                    bad.push(format!("{at} crosses a goal line at {g:?}"));
                }
            }
        }
        // A full run draws more than 30; one without latency and scaling (issue 29's run:
        // throughput, memory, callgrind) draws 24.
        assert!(labels >= 20, "only {labels} value labels drawn");
        assert!(
            bad.is_empty(),
            "{} overlaps:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }
}
