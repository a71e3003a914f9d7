//! `redis-lock-bench guard`: the instruction-count check `make test` runs. Instructions
//! are deterministic where wall time is not: the same binary, inputs and server give the
//! same count whatever else the machine does. The guard measures, under callgrind on one
//! server, the instructions a command costs inside the server's `call()` (the command and
//! its propagation, without the event loop and the time-driven cron, which under
//! valgrind's slowdown run far more often per command than natively), and fails when
//! LOCK.ACQUIRE, LOCK.RELEASE or LOCK.EXTEND costs more than 10% above the baseline
//! checked into `bench/callgrind-guard.tsv`. The baseline is updated on purpose, with the
//! reason, in the same commit: `make perf-guard-baseline REASON="..."`.

use std::fs;
use std::io;
use std::path::Path;

use crate::callgrind::{executing, Session};
use crate::config::Config;
use crate::ops::{flushall, Op, OpLoad, Scripts};

/// Commands per phase: enough to average out a phase's fixed costs, small enough that the
/// whole guard runs in well under a minute.
pub const OPS: u64 = 2_000;
/// Allowed rise over the baseline.
pub const TOLERANCE: f64 = 0.10;

/// The guarded commands (with the recipe commands measured beside them for reference),
/// each on keys in the state it needs: ACQUIRE/SET on free keys, EXTEND/RELEASE on the
/// keys the ACQUIRE phase holds.
const PHASES: [(&str, Op, &[u8], bool); 5] = [
    ("SET NX PX", Op::SetNx, b"gs", false),
    ("LOCK.ACQUIRE", Op::Acquire, b"gm", true),
    ("LOCK.EXTEND", Op::Extend, b"gm", true),
    ("LOCK.RELEASE", Op::Release, b"gm", true),
    ("EVALSHA release", Op::EvalRelease, b"gs", false),
];

pub fn path(cfg: &Config) -> std::path::PathBuf {
    cfg.root.join("bench/callgrind-guard.tsv")
}

/// `name<TAB>instructions` lines; `#` lines are comments.
fn read(path: &Path) -> io::Result<Vec<(String, f64)>> {
    let text = fs::read_to_string(path)
        .map_err(|e| io::Error::other(format!("{}: {e}", path.display())))?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.split_once('\t')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect())
}

/// Compares `now` with `baseline`; the failures, as lines to print.
pub fn regressions(baseline: &[(String, f64)], now: &[(String, f64, bool)]) -> Vec<String> {
    now.iter()
        .filter(|(_, _, guarded)| *guarded)
        .filter_map(|(name, ir, _)| {
            let Some((_, base)) = baseline.iter().find(|(n, _)| n == name) else {
                return Some(format!("{name}: no baseline"));
            };
            let rise = ir / base - 1.0;
            (!ir.is_finite() || rise > TOLERANCE).then(|| {
                format!(
                    "{name}: {ir:.0} instructions, {:+.1}% over the baseline {base:.0} (allowed {:+.0}%)",
                    rise * 100.0,
                    TOLERANCE * 100.0
                )
            })
        })
        .collect()
}

/// Runs the phases; with `reason`, writes them as the new baseline instead of checking.
pub fn run(bin: &Path, cfg: &Config, reason: Option<&str>) -> io::Result<()> {
    let mut session = Session::start(bin, cfg, "guard")?;
    let label = session.server.label.clone();
    let mut c = session.server.conn()?;
    flushall(&mut c)?;
    let scripts = Scripts::load(&mut c)?;
    let mut now = vec![];
    for (name, op, prefix, guarded) in PHASES {
        let w = OpLoad {
            op,
            prefix,
            scripts: &scripts,
            wrap: 0,
        };
        let (dump, _) = session.measure(&w, OPS, name)?;
        let ir = executing(&dump, OPS)?;
        eprintln!("  [guard {label}] {name}: {ir:.0} instructions in call()");
        now.push((name.to_string(), ir, guarded));
    }
    let file = path(cfg);
    if let Some(reason) = reason {
        let mut s = format!(
            "# {}: {label}, {OPS} commands per phase, instructions inside call() per command.\n# Why this baseline: {reason}\n",
            redis_lock_report::fmt::now_utc()
        );
        for (name, ir, _) in &now {
            s.push_str(&format!("{name}\t{ir:.0}\n"));
        }
        fs::write(&file, s)?;
        eprintln!("baseline written to {}", file.display());
        return Ok(());
    }
    let baseline = read(&file)?;
    for (name, ir, _) in &now {
        if let Some((_, base)) = baseline.iter().find(|(n, _)| n == name) {
            eprintln!(
                "  {name}: {ir:.0} now, {base:.0} baseline ({:+.1}%)",
                (ir / base - 1.0) * 100.0
            );
        }
    }
    let bad = regressions(&baseline, &now);
    if bad.is_empty() {
        eprintln!(
            "perf guard: every guarded command within {:.0}% of its baseline",
            TOLERANCE * 100.0
        );
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "perf guard failed ({}):\n  {}",
            file.display(),
            bad.join("\n  ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rise_over_ten_percent_fails() {
        let base = vec![("A".to_string(), 1000.0), ("B".to_string(), 1000.0)];
        let ok = vec![
            ("A".to_string(), 1099.0, true),
            ("B".to_string(), 900.0, true),
        ];
        assert!(regressions(&base, &ok).is_empty());
        let bad = vec![
            ("A".to_string(), 1101.0, true),
            ("B".to_string(), 5000.0, false),
        ];
        let r = regressions(&base, &bad);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].starts_with("A: 1101"), "{r:?}");
        let missing = vec![("C".to_string(), 1.0, true)];
        assert_eq!(
            regressions(&base, &missing),
            vec!["C: no baseline".to_string()]
        );
        let nan = vec![("A".to_string(), f64::NAN, true)];
        assert_eq!(regressions(&base, &nan).len(), 1);
    }
}
