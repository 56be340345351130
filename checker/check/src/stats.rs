//! Quantiles by nearest rank.

use crate::results::Quantiles;

/// Quantiles of `values` (any unit), which this reorders in place. Each rank
/// is selected, not sorted for: linear time over millions of latencies.
pub fn quantiles(values: &mut [f64]) -> Quantiles {
    quantiles_of(values, |v| v)
}

/// Quantiles of `values` mapped by `unit`, a monotonic function (a change of
/// unit): the ranks are selected among `values` as they are and then mapped,
/// which picks what selecting among the mapped values would, without a
/// mapped copy of them.
pub fn quantiles_of(values: &mut [f64], unit: impl Fn(f64) -> f64) -> Quantiles {
    let n = values.len();
    if n == 0 {
        return Quantiles::default();
    }
    let ranks = [rank(n, 0.50), rank(n, 0.95), rank(n, 0.99), n - 1];
    let mut picked = [0.0; 4];
    let mut from = 0;
    for (k, &r) in ranks.iter().enumerate() {
        // Everything past the previous pick is at least as large: select in the rest.
        let (_, value, _) = values[from..].select_nth_unstable_by(r - from, f64::total_cmp);
        picked[k] = round3(unit(*value));
        from = r;
    }
    Quantiles { count: n as u64, p50: picked[0], p95: picked[1], p99: picked[2], max: picked[3] }
}

/// One quantile `q` of `values` by nearest rank (one selection: for the
/// fault windows, which report only their p99), `None` when there are none.
pub fn quantile(values: &mut [f64], q: f64) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let (_, value, _) = values.select_nth_unstable_by(rank(n, q), f64::total_cmp);
    Some(round3(*value))
}

/// The high-water mark of this process's resident memory in MiB (Linux's
/// `VmHWM`), `None` elsewhere: what the checker's benchmarks report beside
/// their rates.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Nearest rank (0-based) of `q` among `n > 0` values: the smallest value with
/// at least `q` of the values at or below it.
fn rank(n: usize, q: f64) -> usize {
    ((q * n as f64).ceil() as usize).clamp(1, n) - 1
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
    fn selection_agrees_with_sorting() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        for n in [2, 3, 19, 20, 21, 100, 1001] {
            let mut v: Vec<f64> = (0..n)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    (rng % 500) as f64 / 7.0
                })
                .collect();
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let at = |q: f64| round3(sorted[((q * n as f64).ceil() as usize).clamp(1, n) - 1]);
            let q = quantiles(&mut v);
            assert_eq!((q.p50, q.p95, q.p99, q.max), (at(0.5), at(0.95), at(0.99), round3(sorted[n - 1])), "{n}");
        }
    }

    #[test]
    fn one_rank_agrees_with_all_of_them() {
        let mut v: Vec<f64> = (1..=1000).rev().map(|x| f64::from(x) / 3.0).collect();
        let p99 = quantile(&mut v.clone(), 0.99);
        assert_eq!(p99, Some(quantiles(&mut v).p99));
        assert_eq!(quantile(&mut [], 0.99), None);
    }

    #[test]
    fn mapping_after_selection_agrees_with_mapping_first() {
        let ns: Vec<f64> = (0..997u64).map(|i| ((i * 7919) % 1009) as f64 * 1234.567 + 0.5).collect();
        let mut ms: Vec<f64> = ns.iter().map(|v| v / 1e6).collect();
        assert_eq!(quantiles_of(&mut ns.clone(), |v| v / 1e6), quantiles(&mut ms));
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
