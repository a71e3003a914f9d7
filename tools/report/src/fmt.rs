//! Number and date formats shared by every document.

/// A unit to print a number in: (smallest value, divisor, decimals, suffix).
pub type Unit = (f64, f64, usize, &'static str);

/// `v` in the first of `units` whose smallest value it reaches; `–` when not a number.
pub fn scaled(v: f64, units: &[Unit]) -> String {
    let unit = units.iter().find(|u| v >= u.0).or(units.last());
    match unit {
        Some(&(_, div, dec, suffix)) if v.is_finite() => format!("{:.dec$}{suffix}", v / div),
        _ => "–".into(),
    }
}

/// `153.4k`, `1.87M`, `999`.
pub fn rate(v: f64) -> String {
    let k = [(1e6, 1e6, 2, "M"), (1e3, 1e3, 1, "k")];
    scaled(v, &[k[0], k[1], (f64::MIN, 1.0, 0, "")])
}

/// A ratio: `0.95×`.
pub fn x(r: f64) -> String {
    scaled(r, &[(f64::MIN, 1.0, 2, "×")])
}

/// A ratio held against a goal a hundredth away: `1.014×`.
pub fn x3(r: f64) -> String {
    scaled(r, &[(f64::MIN, 1.0, 3, "×")])
}

/// An instruction count with thousands separators: `1,234,567`.
pub fn ir(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    let n = v.round() as i64;
    let sign = if n < 0 { "-" } else { "" };
    format!("{sign}{}", thousands(n.unsigned_abs()))
}

/// `1234567` -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `12.34%` of `whole`, `n/a` for nothing.
pub fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "n/a".into();
    }
    format!("{:.2}%", part as f64 * 100.0 / whole as f64)
}

/// Microseconds: `695 µs`, `1.23 ms`, `12.3 ms`.
pub fn us(v: f64) -> String {
    let ms = [(1e4, 1e3, 1, " ms"), (1e3, 1e3, 2, " ms")];
    scaled(v, &[ms[0], ms[1], (f64::MIN, 1.0, 0, " µs")])
}

/// Milliseconds: `0.7 ms`, `14 ms`, `3.00 s`.
pub fn ms(v: f64) -> String {
    let s = [(1e3, 1e3, 2, " s"), (10.0, 1.0, 0, " ms")];
    scaled(v, &[s[0], s[1], (f64::MIN, 1.0, 1, " ms")])
}

/// A rate: `2910`, `7.5`.
pub fn per_sec(v: f64) -> String {
    scaled(v, &[(100.0, 1.0, 0, ""), (f64::MIN, 1.0, 1, "")])
}

pub fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

/// (`YYYY-MM-DD`, `HH:MM`) in UTC of a unix time in ms (proleptic Gregorian calendar,
/// Howard Hinnant's days-to-civil algorithm).
pub fn utc(unix_ms: i64) -> (String, String) {
    let secs = unix_ms.div_euclid(1000);
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}", sod / 3600, sod % 3600 / 60),
    )
}

/// This machine: `2 cores, <CPU model>`.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        let model = s.lines().find_map(|l| l.strip_prefix("model name"))?;
        Some(model.trim_start_matches([' ', '\t', ':']).to_string())
    });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores, {}", cpu.as_deref().unwrap_or("unknown CPU"))
}

/// The machine's load averages over 1, 5 and 15 minutes (`?` when unknown).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Now, as `YYYY-MM-DD HH:MM UTC`.
pub fn now_utc() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let (d, t) = utc(ms);
    format!("{d} {t} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_dates_format() {
        assert_eq!(ir(1234567.4), "1,234,567");
        assert_eq!(ir(-999.0), "-999");
        assert_eq!(rate(153_400.0), "153.4k");
        assert_eq!(x(0.954), "0.95×");
        assert_eq!((x3(1.0149), x3(f64::NAN)), ("1.015×".into(), "–".into()));
        assert_eq!(pct(1, 3), "33.33%");
        assert_eq!(
            (us(695.6), us(1234.0), us(f64::NAN)),
            ("696 µs".into(), "1.23 ms".into(), "–".into())
        );
        assert_eq!(
            (ms(0.69), ms(14.2), ms(3000.0)),
            ("0.7 ms".into(), "14 ms".into(), "3.00 s".into())
        );
        assert_eq!(utc(0), ("1970-01-01".into(), "00:00".into()));
        assert_eq!(utc(951_782_400_000).0, "2000-02-29");
        assert_eq!(
            utc(1_700_000_000_000),
            ("2023-11-14".into(), "22:13".into())
        );
    }
}
