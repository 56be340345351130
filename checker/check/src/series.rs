//! Bounded time series for the report's plots, gathered during the one pass:
//! client ops by the bucket of their invoke (how many ended `ok`, `fail` or
//! `info`, and their latency quantiles), and the final state's applications by
//! the bucket of their `applied_at_ms` on the history's clock.
//!
//! A run's length is not known until its last line, so a series starts with
//! buckets of [`BUCKET_NS_MIN`] and, when a time falls past the last of
//! [`BUCKETS_MAX`] buckets, merges every two neighbours and doubles the width.
//! Memory is then bounded by the number of buckets, not of ops: each bucket
//! keeps, per outcome, a count, the extreme latencies and a log-scaled
//! histogram of [`LATENCY_BINS`] counters, from which the quantiles are read
//! (within about 6 % of the exact value; the max is exact).

use crate::fold::{Fold, Order};
use crate::results::{ApplicationsBucket, OpsBucket, OutcomeBucket, Series};

/// Most buckets a series holds. A series of any length ends with between
/// half of this and this many: a few hundred points, about what a plot 900 px
/// wide can show.
pub const BUCKETS_MAX: usize = 600;

/// The width of a bucket before any merge: a run of under 0.6 s keeps
/// millisecond resolution, finer than any op latency a plot needs to place.
pub const BUCKET_NS_MIN: u64 = 1_000_000;

/// Bins of a latency histogram per doubling of the latency: each bin is at
/// most 1/8 of its lower edge wide, so its midpoint is within 6.25 % of any
/// latency in it.
const BINS_PER_OCTAVE: u64 = 8;

/// Bins of a latency histogram: latencies in µs, the first 8 exact, then 8 per
/// octave up to the largest `u64`.
pub const LATENCY_BINS: usize = 8 + 61 * BINS_PER_OCTAVE as usize;

/// A bucket's contents: anything that two neighbours can be merged into.
pub trait Bucket: Default {
    fn merge(&mut self, other: &Self);
}

/// Buckets of equal width from time 0 on the history's clock.
#[derive(Debug, Clone)]
pub struct Timeline<B> {
    width_ns: u64,
    buckets: Vec<B>,
}

impl<B: Bucket> Default for Timeline<B> {
    fn default() -> Self {
        Timeline { width_ns: BUCKET_NS_MIN, buckets: Vec::new() }
    }
}

impl<B: Bucket> Timeline<B> {
    /// An empty timeline whose buckets start `width_ns` wide (a power of two
    /// times [`BUCKET_NS_MIN`], so that it can be brought to another's width).
    pub fn with_width(width_ns: u64) -> Self {
        Timeline { width_ns, buckets: Vec::new() }
    }

    pub fn width_ns(&self) -> u64 {
        self.width_ns
    }

    pub fn buckets(&self) -> &[B] {
        &self.buckets
    }

    /// The bucket holding `t_ns`, widening the buckets until it fits.
    pub fn at(&mut self, t_ns: u64) -> &mut B {
        // Bounded: each merge doubles the width, and from 1 ms 45 doublings
        // pass the largest u64, so this runs at most 45 times over a run.
        while t_ns / self.width_ns >= BUCKETS_MAX as u64 {
            self.widen();
        }
        let i = (t_ns / self.width_ns) as usize;
        if self.buckets.len() <= i {
            self.buckets.resize_with(i + 1, B::default);
        }
        &mut self.buckets[i]
    }

    /// Merges every two neighbours: the width doubles.
    fn widen(&mut self) {
        self.width_ns = self.width_ns.saturating_mul(2);
        let old = std::mem::take(&mut self.buckets);
        let mut pairs = old.into_iter();
        while let Some(mut first) = pairs.next() {
            if let Some(second) = pairs.next() {
                first.merge(&second);
            }
            self.buckets.push(first);
        }
    }

    /// Widens the buckets to at least `width_ns`, so that two timelines share
    /// one width.
    pub fn widen_to(&mut self, width_ns: u64) {
        // Bounded as in `at`.
        while self.width_ns < width_ns {
            self.widen();
        }
    }
}

/// One outcome's ops in one bucket.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    count: u64,
    min_ns: u64,
    max_ns: u64,
    /// Allocated with the first op: most buckets see no `fail` or `info`.
    bins: Option<Box<[u32; LATENCY_BINS]>>,
}

/// The bin of a latency of `us` microseconds.
fn bin(us: u64) -> usize {
    if us < BINS_PER_OCTAVE {
        return us as usize;
    }
    let octave = u64::from(63 - us.leading_zeros()); // at least 3
    let sub = (us >> (octave - 3)) & (BINS_PER_OCTAVE - 1);
    (BINS_PER_OCTAVE + (octave - 3) * BINS_PER_OCTAVE + sub) as usize
}

/// The midpoint of bin `i`, in µs.
fn bin_mid_us(i: usize) -> f64 {
    let i = i as u64;
    if i < BINS_PER_OCTAVE {
        return i as f64 + 0.5;
    }
    let (octave, sub) = ((i - BINS_PER_OCTAVE) / BINS_PER_OCTAVE + 3, (i - BINS_PER_OCTAVE) % BINS_PER_OCTAVE);
    let step = (1u64 << (octave - 3)) as f64;
    (BINS_PER_OCTAVE + sub) as f64 * step + step / 2.0
}

impl Latencies {
    pub fn push(&mut self, latency_ns: u64) {
        if self.count == 0 {
            self.min_ns = latency_ns;
            self.max_ns = latency_ns;
        } else {
            self.min_ns = self.min_ns.min(latency_ns);
            self.max_ns = self.max_ns.max(latency_ns);
        }
        self.count += 1;
        let bins = self.bins.get_or_insert_with(|| Box::new([0; LATENCY_BINS]));
        // A count of 4 billion ops of one outcome in one bin of one bucket is
        // far past any run; saturating keeps such a foreign history checkable.
        let slot = &mut bins[bin(latency_ns / 1000)];
        *slot = slot.saturating_add(1);
    }

    /// The latency (ns) at quantile `q` by nearest rank over the bins: the
    /// bin's midpoint, kept within the exact extremes.
    fn quantile_ns(&self, q: f64) -> f64 {
        let Some(bins) = &self.bins else {
            return 0.0;
        };
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (i, n) in bins.iter().enumerate() {
            seen += u64::from(*n);
            if seen >= rank {
                return (bin_mid_us(i) * 1000.0).clamp(self.min_ns as f64, self.max_ns as f64);
            }
        }
        self.max_ns as f64
    }

    fn summary(&self) -> Option<OutcomeBucket> {
        (self.count > 0).then(|| OutcomeBucket {
            count: self.count,
            latency_ms_p50: round3(self.quantile_ns(0.50) / 1e6),
            latency_ms_p99: round3(self.quantile_ns(0.99) / 1e6),
            latency_ms_max: round3(self.max_ns as f64 / 1e6),
        })
    }
}

impl Bucket for Latencies {
    fn merge(&mut self, other: &Self) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = other.clone();
            return;
        }
        self.count += other.count;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        if let (Some(mine), Some(theirs)) = (&mut self.bins, &other.bins) {
            for (a, b) in mine.iter_mut().zip(theirs.iter()) {
                *a = a.saturating_add(*b);
            }
        }
    }
}

/// Three decimals, as the other figures of results.json.
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The client ops of one bucket: `ok`, `fail`, `info`.
#[derive(Debug, Clone, Default)]
pub struct OpsAt([Latencies; 3]);

impl Bucket for OpsAt {
    fn merge(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            a.merge(b);
        }
    }
}

/// What ended how: the index of an outcome in [`OpsAt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok = 0,
    Fail = 1,
    Info = 2,
}

impl Timeline<OpsAt> {
    /// One completed client op, by its invoke time.
    pub fn push_op(&mut self, invoke_ns: u64, outcome: Outcome, latency_ns: u64) {
        self.at(invoke_ns).0[outcome as usize].push(latency_ns);
    }
}

/// The applications of one bucket.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplicationsAt {
    applied: u64,
    on_redelivery: u64,
    duplicates_absorbed: u64,
    overtaken: u64,
}

impl Bucket for ApplicationsAt {
    fn merge(&mut self, other: &Self) {
        self.applied += other.applied;
        self.on_redelivery += other.on_redelivery;
        self.duplicates_absorbed += other.duplicates_absorbed;
        self.overtaken += other.overtaken;
    }
}

/// Gathers the applications over the rules' pass over the orders. Without a
/// `meta` line there is no `run_started_at_ms` to place them on the
/// history's clock, and nothing is gathered.
#[derive(Debug)]
pub struct ApplicationSeries {
    started_at_ms: Option<i64>,
    timeline: Timeline<ApplicationsAt>,
}

impl ApplicationSeries {
    pub fn new(fold: &Fold) -> Self {
        ApplicationSeries {
            started_at_ms: fold.meta.as_ref().map(|m| m.run_started_at_ms),
            timeline: Timeline::with_width(fold.ops_series.width_ns()),
        }
    }

    /// The history time of `applied_at_ms`: before the run started (a skewed
    /// clock) counts as its start.
    fn at(&mut self, applied_at_ms: i64) -> Option<&mut ApplicationsAt> {
        let t0 = self.started_at_ms?;
        Some(self.timeline.at(crate::windows::history_ns(applied_at_ms, t0)))
    }

    fn application(&mut self, applied_at_ms: i64, attempt: u32) {
        if let Some(b) = self.at(applied_at_ms) {
            b.applied += 1;
            b.on_redelivery += u64::from(attempt > 1);
        }
    }

    /// The applications joined to order `i`, and the duplicates its inbox
    /// absorbed, at its first application: the final state does not say when
    /// a duplicate came, only that it came after the event was applied.
    pub fn count(&mut self, fold: &Fold, i: usize, o: &Order) {
        if self.started_at_ms.is_none() || o.applied.count == 0 {
            return;
        }
        match fold.applications.get(&(i as u32)) {
            Some(all) => all.iter().for_each(|a| self.application(a.applied_at_ms, a.attempt)),
            // Applied once: its one application is the least of each.
            None => self.application(o.applied.min_applied_at_ms, o.applied.min_attempt),
        }
        if let Some(n) = o.row.and_then(|r| r.duplicates_absorbed.get()).filter(|&n| n > 0)
            && let Some(b) = self.at(o.applied.min_applied_at_ms)
        {
            b.duplicates_absorbed += u64::from(n);
        }
    }

    /// Adds the applications that joined no order row, and the overtaken
    /// orders at their first application (`None`: no order check), and
    /// makes the series of the results, the ops' and the applications'
    /// buckets brought to one width.
    pub fn finish(mut self, fold: &Fold, absorbed_known: bool, overtaken_at_ms: Option<&[i64]>) -> Series {
        for &ms in overtaken_at_ms.unwrap_or_default() {
            if let Some(b) = self.at(ms) {
                b.overtaken += 1;
            }
        }
        for a in &fold.stray_applied {
            self.application(a.application.applied_at_ms, a.application.attempt);
        }
        let mut ops = fold.ops_series.clone();
        let width_ns = ops.width_ns().max(self.timeline.width_ns());
        ops.widen_to(width_ns);
        self.timeline.widen_to(width_ns);
        let start = |i: usize| i as u64 * width_ns;
        let ops = ops
            .buckets()
            .iter()
            .enumerate()
            .filter(|(_, b)| b.0.iter().any(|l| l.count > 0))
            .map(|(i, b)| OpsBucket {
                start_ns: start(i),
                ok: b.0[Outcome::Ok as usize].summary(),
                fail: b.0[Outcome::Fail as usize].summary(),
                info: b.0[Outcome::Info as usize].summary(),
            })
            .collect();
        let applications = self.started_at_ms.is_some().then(|| {
            self.timeline
                .buckets()
                .iter()
                .enumerate()
                .filter(|(_, b)| b.applied > 0 || b.duplicates_absorbed > 0)
                .map(|(i, b)| ApplicationsBucket {
                    start_ns: start(i),
                    applied: b.applied,
                    applied_on_redelivery: b.on_redelivery,
                    duplicates_absorbed: absorbed_known.then_some(b.duplicates_absorbed),
                    overtaken: overtaken_at_ms.map(|_| b.overtaken),
                })
                .collect()
        });
        Series { bucket_ns: width_ns, history_end_ns: fold.last_time_ns(), ops, applications }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bin_holds_latencies_within_an_eighth_of_its_edge() {
        for us in [0u64, 1, 7, 8, 9, 15, 16, 17, 100, 1_000, 12_345, 1 << 40, u64::MAX] {
            let i = bin(us);
            assert!(i < LATENCY_BINS, "{us}");
            let mid = bin_mid_us(i);
            assert!((mid - us as f64).abs() <= (us as f64 / 16.0).max(0.5), "{us} in bin {i} (mid {mid})");
        }
        // Bins are ordered as their latencies.
        let mut last = 0;
        for us in 0..5000 {
            assert!(bin(us) >= last);
            last = bin(us);
        }
    }

    #[test]
    fn quantiles_from_the_bins_are_close_and_the_max_exact() {
        let mut l = Latencies::default();
        for ms in 1..=100u64 {
            l.push(ms * 1_000_000 + 123);
        }
        let s = l.summary().unwrap();
        assert_eq!(s.count, 100);
        assert!((s.latency_ms_p50 - 50.0).abs() <= 50.0 / 16.0, "{s:?}");
        assert!((s.latency_ms_p99 - 99.0).abs() <= 99.0 / 16.0, "{s:?}");
        assert_eq!(s.latency_ms_max, 100.0);
    }

    #[test]
    fn a_long_run_keeps_at_most_the_bucket_bound() {
        let mut t: Timeline<OpsAt> = Timeline::default();
        // An hour of ops, one every 10 ms.
        for k in 0..360_000u64 {
            t.push_op(k * 10_000_000, Outcome::Ok, 5_000_000);
        }
        assert!(t.buckets().len() <= BUCKETS_MAX && t.buckets().len() > BUCKETS_MAX / 2, "{}", t.buckets().len());
        let total: u64 = t.buckets().iter().map(|b| b.0[0].count).sum();
        assert_eq!(total, 360_000, "merging loses no op");
        assert_eq!(t.width_ns() % BUCKET_NS_MIN, 0);
    }

    #[test]
    fn widening_merges_neighbours() {
        let mut t: Timeline<ApplicationsAt> = Timeline::default();
        t.at(0).applied += 1;
        t.at(BUCKET_NS_MIN).applied += 2;
        t.at(2 * BUCKET_NS_MIN).applied += 4;
        t.widen_to(2 * BUCKET_NS_MIN);
        let applied: Vec<u64> = t.buckets().iter().map(|b| b.applied).collect();
        assert_eq!(applied, [3, 4]);
    }
}
