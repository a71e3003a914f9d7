//! Medians and percentiles, and the A/B alternation every comparison is measured in.

use std::io;

/// Median of the values (mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// The `q` quantile (0..=1) of sorted values, nearest-rank.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sorts the samples and returns their `qs` quantiles.
pub fn quantiles<const N: usize>(v: &mut [f64], qs: [f64; N]) -> [f64; N] {
    v.sort_by(f64::total_cmp);
    qs.map(|q| quantile_sorted(v, q))
}

/// Measures side A (`side(true)`) and side B (`side(false)`) of a comparison: A first in
/// even rounds, B first in odd ones (ABBA), so that drift favours neither. Returns (A, B).
pub fn ab<T>(round: usize, mut side: impl FnMut(bool) -> io::Result<T>) -> io::Result<(T, T)> {
    if round.is_multiple_of(2) {
        let a = side(true)?;
        Ok((a, side(false)?))
    } else {
        let b = side(false)?;
        Ok((side(true)?, b))
    }
}

/// Of (A, B) rounds: the median of A, the median of B and the median per-round A/B.
pub fn pair_medians(rounds: &[(f64, f64)]) -> [f64; 3] {
    let col = |f: fn(&(f64, f64)) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    [col(|r| r.0), col(|r| r.1), col(|r| r.0 / r.1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_quantiles() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        let s: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(quantile_sorted(&s, 0.5), 500.0);
        assert_eq!(quantile_sorted(&s, 0.99), 990.0);
        assert_eq!(quantile_sorted(&s, 0.999), 999.0);
        assert_eq!(quantile_sorted(&s, 1.0), 1000.0);
        assert_eq!(quantiles(&mut [2.0, -1.0, 5.0], [0.0, 1.0]), [-1.0, 5.0]);
        let rounds = [(2.0, 1.0), (9.0, 3.0), (4.0, 4.0)];
        assert_eq!(pair_medians(&rounds), [4.0, 3.0, 2.0]);
    }

    #[test]
    fn sides_alternate() {
        let mut order = vec![];
        for round in 0..2 {
            let got = ab(round, |a| {
                order.push(a);
                Ok(a)
            });
            assert_eq!(got.unwrap(), (true, false));
        }
        assert_eq!(order, [true, false, false, true]);
    }
}
