//! What happened inside each fault window: the events whose life in the queue
//! overlaps it, and the client ops invoked inside it.
//!
//! A run has a few dozen windows and millions of events and ops, so each event
//! and op is placed by a search, not by a pass over every window. The window
//! ends and starts cut the history's clock into segments, and each segment
//! lists the windows that cover it whole (a sort and a sweep, once). An op's
//! invoke time is then a binary search and the few windows of its segment; an
//! event's life, which is short, spans one or two segments. That stays true
//! when a window that was never stopped is open from early on. A run without
//! fault windows does none of it. The lists hold, per segment, the windows open
//! over it, at most one per fault and target: a few dozen times the number of
//! windows at most.

use crate::fold::{Fold, Order};
use crate::results::{FaultWindow, Quantiles};
use crate::stats::quantiles;

/// The windows of a run as segments of the history's clock, for overlap
/// queries.
#[derive(Debug, Default)]
pub struct WindowIndex {
    /// Segment `k` runs from `bounds[k]` up to `bounds[k + 1]` (excluded), the
    /// last one to the end of time. Before `bounds[0]` no window is open.
    bounds: Vec<u64>,
    /// The windows covering segment `k`: `covering[offsets[k]..offsets[k + 1]]`.
    offsets: Vec<usize>,
    covering: Vec<usize>,
    /// Each window's first segment: a window covers a run of segments, so a
    /// span reports it once, at the first of its segments the span reaches.
    first_segment: Vec<usize>,
}

impl WindowIndex {
    pub fn new(windows: &[FaultWindow]) -> Self {
        // A window covers [start_ns, end_ns] on the clock: [start, end + 1) as
        // segments, to the end of time when never stopped.
        let end_excluded = |w: &FaultWindow| w.end_ns.and_then(|e| e.checked_add(1));
        let mut bounds: Vec<u64> =
            windows.iter().flat_map(|w| std::iter::once(w.start_ns).chain(end_excluded(w))).collect();
        bounds.sort_unstable();
        bounds.dedup();
        let segment_of = |t: u64| bounds.partition_point(|&b| b <= t) - 1;
        let mut per_segment: Vec<Vec<usize>> = vec![Vec::new(); bounds.len()];
        let mut first_segment = Vec::with_capacity(windows.len());
        for (w, window) in windows.iter().enumerate() {
            let first = segment_of(window.start_ns);
            let after = end_excluded(window).map_or(bounds.len(), &segment_of);
            for segment in &mut per_segment[first..after] {
                segment.push(w);
            }
            first_segment.push(first);
        }
        let mut offsets = Vec::with_capacity(bounds.len() + 1);
        offsets.push(0);
        let mut covering = Vec::new();
        for segment in per_segment {
            covering.extend(segment);
            offsets.push(covering.len());
        }
        WindowIndex { bounds, offsets, covering, first_segment }
    }

    pub fn is_empty(&self) -> bool {
        self.bounds.is_empty()
    }

    /// The segment holding `t`, if any window was open by then. `hint` is the
    /// answer to the previous query: events and ops come roughly in time
    /// order, so it is usually right, and a binary search is the fallback.
    #[inline]
    fn segment(&self, t: u64, hint: &mut usize) -> Option<usize> {
        let b = &self.bounds;
        let k = *hint;
        if k < b.len() && b[k] <= t && b.get(k + 1).is_none_or(|&next| t < next) {
            return Some(k);
        }
        let k = b.partition_point(|&bound| bound <= t).checked_sub(1)?;
        *hint = k;
        Some(k)
    }

    /// Calls `f` once with the position of each window that overlaps the
    /// closed span `[from, to]` (a window is closed at both ends too). `hint`:
    /// see [`WindowIndex::segment`]; start it at 0.
    #[inline]
    pub fn overlapping(&self, from: u64, to: u64, hint: &mut usize, mut f: impl FnMut(usize)) {
        // The segments the span reaches: from the one holding `from` (or the
        // first) to the one holding `to`; the same one for most spans.
        let Some(last) = self.segment(to, hint) else { return };
        let first = if self.bounds[last] <= from {
            last
        } else {
            self.bounds[..last].partition_point(|&b| b <= from).max(1) - 1
        };
        for k in first..=last {
            for &w in &self.covering[self.offsets[k]..self.offsets[k + 1]] {
                if k == first || self.first_segment[w] == k {
                    f(w);
                }
            }
        }
    }
}

/// The event figures of each window, gathered in the one pass over the orders.
#[derive(Debug)]
pub struct Attribution {
    index: WindowIndex,
    /// `run_started_at_ms` of the meta line: without it, applications cannot
    /// be placed on the history clock and nothing is attributed.
    run_started_at_ms: Option<i64>,
    per_window: Vec<EventFigures>,
    hint: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct EventFigures {
    events: u64,
    redelivered_events: u64,
    duplicates_absorbed: u64,
    applied_more_than_once: u64,
}

/// Nanoseconds in a millisecond.
const NS_PER_MS: i128 = 1_000_000;

/// A database clock's `ms` on the history's clock, whose 0 is
/// `run_started_at_ms`: in i128, since a foreign run's clocks can be
/// anything an i64 holds, and before the start counts as the start.
pub fn history_ns(ms: i64, run_started_at_ms: i64) -> u64 {
    ((i128::from(ms) - i128::from(run_started_at_ms)) * NS_PER_MS).clamp(0, i128::from(u64::MAX)) as u64
}

impl Attribution {
    pub fn new(fold: &Fold) -> Self {
        Attribution {
            index: WindowIndex::new(&fold.faults),
            run_started_at_ms: fold.meta.as_ref().map(|m| m.run_started_at_ms),
            per_window: vec![EventFigures::default(); fold.faults.len()],
            hint: 0,
        }
    }

    /// Attributes one order's event to the windows its life overlaps.
    #[inline]
    pub fn count(&mut self, o: &Order) {
        let (Some(run_started_at_ms), Some(row)) = (self.run_started_at_ms, &o.row) else { return };
        if self.index.is_empty() || !o.invoked {
            return;
        }
        let (from, to) = match o.applied.count {
            // Never applied: in the queue (or parked, or lost) until the final read.
            0 => (o.first_ok_ns.unwrap_or(o.first_invoke_ns), u64::MAX),
            _ => {
                let applied_ns = history_ns(o.applied.min_applied_at_ms, run_started_at_ms);
                match o.first_ok_ns {
                    Some(ok) if ok <= applied_ns => (ok, applied_ns),
                    // Applied before the ok arrived (or never acknowledged): the
                    // event was committed after the invoke.
                    _ => (o.first_invoke_ns.min(applied_ns), o.first_invoke_ns.max(applied_ns)),
                }
            }
        };
        let deliveries = row.deliveries.get();
        let duplicates = row.duplicates_absorbed.get();
        let per_window = &mut self.per_window;
        self.index.overlapping(from, to, &mut self.hint, |w| {
            let figures = &mut per_window[w];
            figures.events += 1;
            figures.redelivered_events += u64::from(deliveries.is_some_and(|d| d > 1));
            figures.duplicates_absorbed += u64::from(duplicates.unwrap_or(0));
            figures.applied_more_than_once += u64::from(o.applied.count > 1);
        });
    }

    /// Writes the figures into the windows (`deliveries_known`,
    /// `duplicates_known`: some `order` line carries the field) and returns the
    /// latency quantiles of the ops invoked outside every window.
    pub fn finish(
        self,
        fold: &Fold,
        windows: &mut [FaultWindow],
        deliveries_known: bool,
        duplicates_known: bool,
    ) -> Option<Quantiles> {
        let clock = self.run_started_at_ms.is_some();
        for (w, figures) in windows.iter_mut().zip(&self.per_window) {
            w.events = clock.then_some(figures.events);
            w.applied_more_than_once = clock.then_some(figures.applied_more_than_once);
            w.redelivered_events = (clock && deliveries_known).then_some(figures.redelivered_events);
            w.duplicates_absorbed = (clock && duplicates_known).then_some(figures.duplicates_absorbed);
        }
        op_latencies(fold, &self.index, windows)
    }
}

/// Counts in each window the overtaken orders whose first application
/// (`applied_at_ms`) fell inside it. Without the run's clock (no `meta`
/// line) the windows get no count.
pub fn count_overtaken(fold: &Fold, windows: &mut [FaultWindow], overtaken_at_ms: &[i64]) {
    let Some(t0) = fold.meta.as_ref().map(|m| m.run_started_at_ms) else { return };
    let index = WindowIndex::new(windows);
    for w in windows.iter_mut() {
        w.overtaken = Some(0);
    }
    let mut hint = 0;
    for &ms in overtaken_at_ms {
        let ns = history_ns(ms, t0);
        index.overlapping(ns, ns, &mut hint, |w| {
            if let Some(n) = windows[w].overtaken.as_mut() {
                *n += 1;
            }
        });
    }
}

/// The median and p99 latency of the client ops invoked inside each window,
/// and of those invoked outside every window. Returns the latter's quantiles (ms), `None`
/// when there are no windows.
fn op_latencies(fold: &Fold, index: &WindowIndex, windows: &mut [FaultWindow]) -> Option<Quantiles> {
    if index.is_empty() {
        return None;
    }
    const NS_PER_MS: f64 = 1e6;
    let mut inside: Vec<Vec<f64>> = vec![Vec::new(); windows.len()];
    let mut outside: Vec<f64> = fold.latency_before_faults_ns.iter().map(|ns| ns / NS_PER_MS).collect();
    let mut hint = 0;
    for &(invoked_ns, latency_ns) in &fold.latency_timed_ns {
        let mut placed = false;
        index.overlapping(invoked_ns, invoked_ns, &mut hint, |w| {
            inside[w].push(latency_ns / NS_PER_MS);
            placed = true;
        });
        if !placed {
            outside.push(latency_ns / NS_PER_MS);
        }
    }
    let outside = quantiles(&mut outside);
    for (w, mut latencies) in windows.iter_mut().zip(inside) {
        w.ops_invoked = latencies.len() as u64;
        w.ops_failed = Some(0);
        w.ops_indeterminate = Some(0);
        let q = quantiles(&mut latencies);
        w.latency_ms_p99 = (q.count > 0).then_some(q.p99);
        w.latency_ms_p50 = (q.count > 0).then_some(q.p50);
        w.latency_ms_p99_outside = (outside.count > 0).then_some(outside.p99);
        w.latency_ms_p50_outside = (outside.count > 0).then_some(outside.p50);
    }
    for (times, failed) in [(&fold.failed_timed_ns, true), (&fold.info_timed_ns, false)] {
        let mut hint = 0;
        for &invoked_ns in times {
            index.overlapping(invoked_ns, invoked_ns, &mut hint, |w| {
                let w = &mut windows[w];
                let count = if failed { &mut w.ops_failed } else { &mut w.ops_indeterminate };
                *count = Some(count.unwrap_or(0) + 1);
            });
        }
    }
    Some(outside)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start_ns: u64, end_ns: Option<u64>) -> FaultWindow {
        FaultWindow::new("f", "t", start_ns, end_ns)
    }

    fn hits(index: &WindowIndex, from: u64, to: u64) -> Vec<usize> {
        let mut got = Vec::new();
        // A stale hint must not change the answer.
        let mut hint = (from as usize) % 7;
        index.overlapping(from, to, &mut hint, |w| got.push(w));
        got.sort();
        got
    }

    #[test]
    fn overlap_is_closed_at_both_ends() {
        let index = WindowIndex::new(&[window(10, Some(20)), window(30, Some(40))]);
        assert_eq!(hits(&index, 0, 9), Vec::<usize>::new());
        assert_eq!(hits(&index, 0, 10), vec![0]);
        assert_eq!(hits(&index, 20, 25), vec![0]);
        assert_eq!(hits(&index, 21, 29), Vec::<usize>::new());
        assert_eq!(hits(&index, 15, 35), vec![0, 1]);
        assert_eq!(hits(&index, 41, u64::MAX), Vec::<usize>::new());
    }

    #[test]
    fn a_window_never_stopped_overlaps_everything_after_its_start() {
        // Listed out of start order on purpose: positions are the caller's.
        let index = WindowIndex::new(&[window(30, Some(40)), window(5, None), window(50, Some(60))]);
        assert_eq!(hits(&index, 0, 4), Vec::<usize>::new());
        assert_eq!(hits(&index, 45, 45), vec![1]);
        assert_eq!(hits(&index, 35, 55), vec![0, 1, 2]);
        assert_eq!(hits(&index, 1000, 2000), vec![1]);
    }

    #[test]
    fn the_search_agrees_with_a_loop_over_every_window() {
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |bound: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % bound
        };
        for _ in 0..200 {
            let windows: Vec<FaultWindow> = (0..next(12))
                .map(|_| {
                    let start = next(100);
                    window(start, (next(5) > 0).then(|| start + next(30)))
                })
                .collect();
            let index = WindowIndex::new(&windows);
            for _ in 0..20 {
                let from = next(150);
                let to = from + next(20);
                let want: Vec<usize> = (0..windows.len())
                    .filter(|&w| windows[w].start_ns <= to && windows[w].end_ns.is_none_or(|e| e >= from))
                    .collect();
                assert_eq!(hits(&index, from, to), want, "{windows:?} [{from}, {to}]");
            }
        }
    }
}
