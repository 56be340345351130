//! Quantiles by nearest rank.

use crate::results::Quantiles;

/// Quantiles of `values` (any unit), which this sorts in place.
pub fn quantiles(values: &mut [f64]) -> Quantiles {
    if values.is_empty() {
        return Quantiles::default();
    }
    values.sort_unstable_by(f64::total_cmp);
    let at = |q: f64| {
        // Nearest rank: the smallest value with at least q of the values at or below it.
        let rank = (q * values.len() as f64).ceil() as usize;
        round3(values[rank.clamp(1, values.len()) - 1])
    };
    Quantiles {
        count: values.len() as u64,
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
        max: round3(values[values.len() - 1]),
    }
}

/// Three decimals keep results.json readable and stable across platforms.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let q = quantiles(&mut v);
        assert_eq!((q.count, q.p50, q.p95, q.p99, q.max), (100, 50.0, 95.0, 99.0, 100.0));
    }

    #[test]
    fn one_value() {
        let q = quantiles(&mut [7.0]);
        assert_eq!((q.p50, q.p99, q.max), (7.0, 7.0, 7.0));
    }

    #[test]
    fn empty_is_zero() {
        assert_eq!(quantiles(&mut []), Quantiles::default());
    }
}
