//! docs/perf.png: six panels (throughput ratios, latency, memory, scaling of command
//! cost, scaling of hand-off time, instructions per command).

use crate::png::{Canvas, Rgb};
use crate::throughput::PAIRS;
use crate::Run;

const W: i32 = 1500;
const H: i32 = 1040;
const WHITE: Rgb = [255, 255, 255];
const BLACK: Rgb = [20, 20, 20];
const GREY: Rgb = [150, 150, 150];
const LIGHT: Rgb = [228, 228, 228];
const GOAL: Rgb = [0, 150, 60];
const SERVER_COLORS: [Rgb; 4] = [
    [200, 50, 45],
    [235, 140, 20],
    [40, 100, 200],
    [120, 60, 160],
];

fn server_color(i: usize) -> Rgb {
    SERVER_COLORS[i % SERVER_COLORS.len()]
}

/// The colour mixed half-way to white.
fn pale(c: Rgb) -> Rgb {
    [
        ((u16::from(c[0]) + 255) / 2) as u8,
        ((u16::from(c[1]) + 255) / 2) as u8,
        ((u16::from(c[2]) + 255) / 2) as u8,
    ]
}

/// A round axis top and tick step for values up to `max`.
fn nice(max: f64) -> (f64, f64) {
    if max.is_nan() || max <= 0.0 {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

fn fmt_tick(v: f64, step: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if v >= 1e3 && step >= 100.0 {
        format!("{}k", trim(v / 1e3))
    } else if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn trim(v: f64) -> String {
    let s = format!("{v:.1}");
    s.trim_end_matches(".0").to_string()
}

/// A panel's plot area and its y scale.
struct Plot {
    x: i32,
    y: i32,
    w: i32,
    h: i32,
    top: f64,
}

impl Plot {
    fn py(&self, v: f64) -> i32 {
        let v = if v.is_finite() {
            v.clamp(0.0, self.top)
        } else {
            0.0
        };
        self.y + self.h - (v / self.top * f64::from(self.h)).round() as i32
    }
}

/// Draws the frame, title, y label and y grid of a panel; returns its plot area.
fn panel(c: &mut Canvas, col: i32, row: i32, title: &str, ylabel: &str, ymax: f64) -> Plot {
    let (pw, ph) = (W / 3, (H - 40) / 2);
    let (x0, y0) = (col * pw, 40 + row * ph);
    c.text(x0 + 14, y0 + 10, title, BLACK, 1);
    let p = Plot {
        x: x0 + 62,
        y: y0 + 36,
        w: pw - 80,
        h: ph - 110,
        top: 0.0,
    };
    let (top, step) = nice(ymax * 1.08);
    let p = Plot { top, ..p };
    let mut v = 0.0;
    while v <= top + step / 2.0 {
        let y = p.py(v);
        c.rect(p.x, y, p.w, 1, LIGHT);
        c.text_r(p.x - 4, y - 4, &fmt_tick(v, step), BLACK, 1);
        v += step;
    }
    c.rect(p.x, p.y, 1, p.h + 1, GREY);
    c.rect(p.x, p.y + p.h, p.w, 1, GREY);
    c.text_up(x0 + 6, p.y + p.h / 2, ylabel, BLACK);
    p
}

/// A small legend: coloured boxes with labels, in a row starting at (x, y).
fn legend(c: &mut Canvas, mut x: i32, y: i32, items: &[(Rgb, String)]) {
    for (col, label) in items {
        c.rect(x, y, 10, 10, *col);
        c.text(x + 14, y + 1, label, BLACK, 1);
        x += 14 + Canvas::text_width(label, 1) + 14;
    }
}

/// Grouped bars. `groups[g].1[b]` is bar b's value (NaN = missing) of group g.
/// `labelled` lists the bars (by index within a group) that get their value printed.
fn bars(
    c: &mut Canvas,
    p: &Plot,
    groups: &[(String, Vec<f64>)],
    colors: &[Rgb],
    labelled: &[usize],
) {
    let n = groups.len().max(1) as i32;
    let gw = p.w / n;
    for (g, (name, vals)) in groups.iter().enumerate() {
        let gx = p.x + g as i32 * gw;
        let k = vals.len().max(1) as i32;
        let bw = ((gw - 16) / k).max(2);
        for (b, v) in vals.iter().enumerate() {
            if !v.is_finite() {
                continue;
            }
            let x = gx + 8 + b as i32 * bw;
            let y = p.py(*v);
            c.rect(x, y, bw - 2, p.y + p.h - y, colors[b % colors.len()]);
            if labelled.contains(&b) {
                let t = if *v >= 10_000.0 {
                    format!("{:.1}k", v / 1000.0)
                } else if *v >= 10.0 {
                    format!("{v:.0}")
                } else {
                    format!("{v:.2}")
                };
                c.text_c(x + bw / 2, y - 10, &t, BLACK, 1);
            }
        }
        c.text_c(gx + gw / 2, p.y + p.h + 8, name, BLACK, 1);
    }
}

fn throughput_panel(c: &mut Canvas, run: &Run) {
    let mut max: f64 = 1.4;
    let mut groups = vec![];
    for pair in PAIRS {
        let mut vals = vec![];
        for s in &run.servers {
            for pl in [1, 16] {
                let v = s
                    .throughput
                    .as_ref()
                    .and_then(|t| t.get(pair.name, pl))
                    .map_or(f64::NAN, |r| r.ratio());
                if v.is_finite() {
                    max = max.max(v);
                }
                vals.push(v);
            }
        }
        let short = pair
            .name
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches(':');
        groups.push((short.to_uppercase(), vals));
    }
    let p = panel(
        c,
        0,
        0,
        "1. Throughput: module / recipe (median ratio)",
        "ratio, 1.0 = same speed",
        max,
    );
    let colors: Vec<Rgb> = (0..run.servers.len())
        .flat_map(|i| [pale(server_color(i)), server_color(i)])
        .collect();
    bars(c, &p, &groups, &colors, &[]);
    // Parity line and the goals.
    c.dashed(p.x, p.x + p.w, p.py(1.0), GREY);
    let gw = p.w / groups.len().max(1) as i32;
    for (g, pair) in PAIRS.iter().enumerate() {
        if let Some(goal) = pair.goal {
            let y = p.py(goal);
            let x = p.x + g as i32 * gw;
            c.rect(x + 4, y - 1, gw - 8, 3, GOAL);
            c.text(x + 6, y - 11, &format!("goal {goal}"), GOAL, 1);
        }
    }
    let mut items: Vec<(Rgb, String)> = vec![];
    for (i, s) in run.servers.iter().enumerate() {
        items.push((server_color(i), short_label(&s.label)));
    }
    legend(c, p.x, p.y + p.h + 24, &items);
    c.text(
        p.x,
        p.y + p.h + 40,
        "pale bar: pipeline 1, full bar: pipeline 16",
        BLACK,
        1,
    );
}

fn short_label(l: &str) -> String {
    l.to_string()
}

fn latency_panel(c: &mut Canvas, run: &Run) {
    let mut groups = vec![];
    let mut max: f64 = 1.0;
    for s in &run.servers {
        if let Some(l) = &s.latency {
            let vals = vec![
                l.acquire.p50,
                l.set_nx.p50,
                l.release.p50,
                l.eval_release.p50,
            ];
            max = max.max(vals.iter().cloned().fold(0.0, f64::max));
            groups.push((short_label(&s.label), vals));
        }
    }
    let p = panel(
        c,
        1,
        0,
        "2. Latency p50, one client, unpipelined",
        "microseconds",
        max,
    );
    let colors = [
        [60, 60, 60],
        [170, 170, 170],
        [30, 110, 60],
        [150, 205, 165],
    ];
    bars(c, &p, &groups, &colors, &[0, 1, 2, 3]);
    legend(
        c,
        p.x,
        p.y + p.h + 24,
        &[
            (colors[0], "ACQUIRE".into()),
            (colors[1], "SET NX PX".into()),
            (colors[2], "RELEASE".into()),
            (colors[3], "EVALSHA rel.".into()),
        ],
    );
    c.text(
        p.x,
        p.y + p.h + 40,
        "p99 and p99.9 are in the tables",
        BLACK,
        1,
    );
}

fn memory_panel(c: &mut Canvas, run: &Run) {
    let mut groups = vec![];
    let mut max: f64 = 10.0;
    for s in &run.servers {
        if let Some(m) = &s.memory {
            max = max.max(m.module_per_lock).max(m.string_per_lock * 1.5);
            groups.push((
                short_label(&s.label),
                vec![m.module_per_lock, m.string_per_lock],
            ));
        }
    }
    let p = panel(
        c,
        2,
        0,
        "3. Memory per held lock (used_memory delta / locks)",
        "bytes per lock",
        max,
    );
    let colors = [[60, 60, 60], [170, 170, 170]];
    bars(c, &p, &groups, &colors, &[0, 1]);
    // 1.5 x string lock, per server group.
    let gw = p.w / groups.len().max(1) as i32;
    for (g, (_, v)) in groups.iter().enumerate() {
        let y = p.py(v[1] * 1.5);
        let x = p.x + g as i32 * gw;
        c.rect(x + 4, y - 1, gw - 8, 3, GOAL);
    }
    legend(
        c,
        p.x,
        p.y + p.h + 24,
        &[
            (colors[0], "module lock".into()),
            (colors[1], "SET NX PX string".into()),
            (GOAL, "goal 1.5x string".into()),
        ],
    );
}

/// X positions of the scaling levels (log10 of held locks, then "+waiters").
fn level_labels(run: &Run) -> Vec<String> {
    let Some(s) = run.servers.iter().find_map(|s| s.scaling.as_ref()) else {
        return vec![];
    };
    s.levels
        .iter()
        .map(|l| {
            let held = pow10_label(l.held);
            if l.waiters > 0 {
                format!("{held}+{}w", pow10_label(l.waiters))
            } else {
                held
            }
        })
        .collect()
}

fn pow10_label(n: u64) -> String {
    let mut e = 0;
    let mut v = n;
    while v >= 10 && v.is_multiple_of(10) {
        v /= 10;
        e += 1;
    }
    if v == 1 && e >= 3 {
        format!("1e{e}")
    } else {
        n.to_string()
    }
}

/// A series value at one level, given also the first level.
type LevelValue = dyn Fn(&crate::scaling::Level, &crate::scaling::Level) -> f64;

/// Lines over the scaling levels; `value` picks the series value per level (NaN skips),
/// `dashed` draws a second series per server with thin lines.
fn level_lines(
    c: &mut Canvas,
    p: &Plot,
    run: &Run,
    labels: &[String],
    series: &[(&LevelValue, i32)],
) {
    let n = labels.len().max(1) as i32;
    let step = p.w / n;
    let xs: Vec<i32> = (0..n).map(|i| p.x + step / 2 + i * step).collect();
    for (i, l) in labels.iter().enumerate() {
        c.text_c(xs[i], p.y + p.h + 8, l, BLACK, 1);
    }
    for (si, s) in run.servers.iter().enumerate() {
        let Some(sc) = &s.scaling else { continue };
        let Some(first) = sc.levels.first() else {
            continue;
        };
        for (f, thick) in series {
            let pts: Vec<(i32, i32)> = sc
                .levels
                .iter()
                .enumerate()
                .filter_map(|(i, l)| {
                    let v = f(l, first);
                    v.is_finite().then(|| (xs[i.min(xs.len() - 1)], p.py(v)))
                })
                .collect();
            for w in pts.windows(2) {
                c.line(w[0].0, w[0].1, w[1].0, w[1].1, *thick, server_color(si));
            }
            for (x, y) in &pts {
                c.rect(x - 3, y - 3, 7, 7, server_color(si));
            }
        }
    }
}

fn scaling_cost_panel(c: &mut Canvas, run: &Run) {
    let labels = level_labels(run);
    let mut max: f64 = 1.2;
    for s in &run.servers {
        if let Some(sc) = &s.scaling {
            for l in &sc.levels {
                max = max.max(l.cycle_vs_recipe).max(l.extend_vs_pexpire);
            }
        }
    }
    let p = panel(
        c,
        0,
        1,
        "4. Scaling: module rate / native rate, same keys",
        "ratio (flat line = O(1))",
        max,
    );
    c.dashed(p.x, p.x + p.w, p.py(1.0), GREY);
    let cyc = |l: &crate::scaling::Level, _: &crate::scaling::Level| l.cycle_vs_recipe;
    let ext = |l: &crate::scaling::Level, _: &crate::scaling::Level| l.extend_vs_pexpire;
    level_lines(c, &p, run, &labels, &[(&cyc, 3), (&ext, 1)]);
    c.text(
        p.x,
        p.y + p.h + 24,
        "thick: cycle / SET+EVALSHA cycle",
        BLACK,
        1,
    );
    c.text(
        p.x,
        p.y + p.h + 40,
        "thin: EXTEND / PEXPIRE; x: locks held (+waiters)",
        BLACK,
        1,
    );
}

fn scaling_handoff_panel(c: &mut Canvas, run: &Run) {
    let labels = level_labels(run);
    let mut max: f64 = 1.0;
    for s in &run.servers {
        if let Some(sc) = &s.scaling {
            for l in &sc.levels {
                max = max.max(l.handoff_p50).max(l.expiry_p50);
            }
        }
    }
    let p = panel(
        c,
        1,
        1,
        "5. Scaling: time to hand a lock to a waiter",
        "milliseconds (p50)",
        max,
    );
    let rel = |l: &crate::scaling::Level, _: &crate::scaling::Level| l.handoff_p50;
    let exp = |l: &crate::scaling::Level, _: &crate::scaling::Level| l.expiry_p50;
    level_lines(c, &p, run, &labels, &[(&rel, 3), (&exp, 1)]);
    c.text(
        p.x,
        p.y + p.h + 24,
        "thick: RELEASE -> waiter granted",
        BLACK,
        1,
    );
    c.text(
        p.x,
        p.y + p.h + 40,
        "thin: lease deadline -> waiter granted",
        BLACK,
        1,
    );
}

fn callgrind_panel(c: &mut Canvas, run: &Run) {
    let Some(cg) = &run.callgrind else {
        panel(c, 2, 1, "6. Instructions per command (not run)", "Ir", 1.0);
        return;
    };
    let baseline = crate::callgrind::read_baseline(&run.cfg.baseline);
    let mut max: f64 = 1.0;
    let mut groups = vec![];
    for ph in &cg.phases {
        let before = baseline
            .as_ref()
            .and_then(|(_, rows)| rows.iter().find(|(n, _)| n == ph.name).map(|(_, v)| *v))
            .unwrap_or(f64::NAN);
        max = max
            .max(ph.per_cmd)
            .max(if before.is_finite() { before } else { 0.0 });
        groups.push((short_phase(ph.name).to_string(), vec![before, ph.per_cmd]));
    }
    let p = panel(
        c,
        2,
        1,
        &format!("6. Instructions per command ({}, callgrind)", cg.server),
        "instructions (Ir) per command",
        max,
    );
    let colors = [[190, 190, 190], [40, 40, 40]];
    bars(c, &p, &groups, &colors, &[1]);
    legend(
        c,
        p.x,
        p.y + p.h + 24,
        &[
            (colors[0], "before (baseline)".into()),
            (colors[1], "now".into()),
        ],
    );
}

fn short_phase(name: &str) -> &str {
    match name {
        "PING" => "PING",
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

pub fn render(run: &Run) -> Vec<u8> {
    let mut c = Canvas::new(W, H, WHITE);
    c.text(
        14,
        10,
        &format!(
            "redis-lock vs SET NX PX + EVALSHA -- make bench, {}",
            run.date
        ),
        BLACK,
        2,
    );
    throughput_panel(&mut c, run);
    latency_panel(&mut c, run);
    memory_panel(&mut c, run);
    scaling_cost_panel(&mut c, run);
    scaling_handoff_panel(&mut c, run);
    callgrind_panel(&mut c, run);
    for col in 1..3 {
        c.rect(col * W / 3, 40, 1, H - 40, LIGHT);
    }
    c.rect(0, 40 + (H - 40) / 2, W, 1, LIGHT);
    c.png()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axes() {
        assert_eq!(nice(0.93), (1.0, 0.2));
        for max in [0.07, 1.3, 7.0, 480.0, 23_456.0, 1.9e6] {
            let (top, step) = nice(max);
            let steps = (top / step).round();
            assert!(
                top >= max && (3.0..=6.0).contains(&steps),
                "{max}: {top} {step}"
            );
        }
        assert_eq!(pow10_label(1_000_000), "1e6");
        assert_eq!(pow10_label(1234), "1234");
    }
}
