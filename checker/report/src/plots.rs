//! The plots, drawn by plotters into SVG strings that the page inlines.
//!
//! Text: plotters is built without a font backend, so its naive font only
//! estimates label extents for the layout, and the SVG backend writes every
//! label as a `<text>` element that the browser sets in its own sans-serif.
//! No font file is embedded, and nothing rasterizes glyphs.
//!
//! Every time plot shares one x axis (seconds since the run started, to
//! [`TimeAxis::end_s`]) and shades the fault windows; the first of each
//! section names them in lanes above its plot area.

use std::error::Error;

use haunt_checker::Results;
use haunt_checker::results::{ApplicationsBucket, FaultWindow, OpsBucket, OutcomeBucket};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, Ranged, SegmentValue, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub(crate) type Drawn = Result<(), Box<dyn Error>>;
type Chart<'a, 'b, Y> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, Y>>;

/// Width of every time plot, px.
pub(crate) const WIDTH_PX: u32 = 900;
/// The y axis' labels and description, left of the plot area.
pub(crate) const Y_LABEL_AREA_PX: u32 = 60;
/// The x axis' labels and description, under the plot area.
pub(crate) const X_LABEL_AREA_PX: u32 = 40;
pub(crate) const MARGIN_PX: u32 = 10;
/// Height of one lane of fault labels.
const LANE_PX: u32 = 14;
/// Lanes of fault labels above a time plot at most. Windows that overlap (with
/// `--faults-at-once` above 1) or come in quick succession take a lane each;
/// beyond this many a window is still shaded and listed in the table, but its
/// label is left out rather than drawn over another.
pub const FAULT_LANES_MAX: usize = 4;
/// The width of one character of a fault label in px, a little over the
/// average of a sans-serif face at 10 px, so estimated label extents err wide.
const LABEL_CHAR_PX: f64 = 6.0;
/// Bars of the redeliveries plot at most: about one pair per 6 px, so that
/// bars stay apart; the series' buckets are merged in runs to fit.
const BARS_MAX: usize = 150;

/// Font sizes as plotters takes them: the SVG backend writes `size / 1.24`
/// px, so these come out at about 11 px (labels) and 10 px (fault names).
pub(crate) const LABEL_FONT: f64 = 14.0;
const FAULT_FONT: f64 = 12.5;

/// Applications on the first delivery, applications on a redelivery, and the
/// duplicates the inbox absorbed.
pub const APPLIED_COLOR: &str = "#3949ab";
pub const REDELIVERED_COLOR: &str = "#ef6c00";
pub const ABSORBED_COLOR: &str = "#8e24aa";
const BAR_COLOR: &str = "#5c6bc0";

/// The three outcomes of a client op, as the page names and colours them.
pub const OUTCOMES: [(&str, &str); 3] = [("ok", "#2e7d32"), ("fail", "#c62828"), ("info", "#ef6c00")];

pub fn fault_color(fault: &str) -> &'static str {
    match fault {
        "kill" => "#e57373",
        "pause" => "#64b5f6",
        "partition" => "#ffb74d",
        "ack-loss" => "#ba68c8",
        "clock-skew" => "#4db6ac",
        "db-error" => "#a1887f",
        "delay" => "#dce775",
        "stall" => "#90a4ae",
        "db-restart" => "#f06292",
        "loss" => "#7986cb",
        "broker-restart" => "#d32f2f",
        "relay-kill" => "#8d6e63",
        _ => "#bdbdbd",
    }
}

/// `#rrggbb` as plotters' colour; grey for anything else.
pub(crate) fn rgb(hex: &str) -> RGBColor {
    let channel = |i: usize| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()).unwrap_or(0x99);
    RGBColor(channel(1), channel(3), channel(5))
}

fn outcome(b: &OpsBucket, i: usize) -> Option<&OutcomeBucket> {
    [&b.ok, &b.fail, &b.info][i].as_ref()
}

/// The time axis the time plots share.
#[derive(Debug, Clone, Copy)]
pub struct TimeAxis {
    pub end_s: f64,
    pub bucket_s: f64,
}

impl TimeAxis {
    /// To the last op, fault window or application (the queue drains after
    /// the workload stops).
    pub fn of(results: &Results) -> TimeAxis {
        let s = &results.series;
        let bucket_s = s.bucket_ns.max(1) as f64 / 1e9;
        let mut end_s = s.history_end_ns as f64 / 1e9;
        for w in &results.faults {
            end_s = end_s.max(w.end_ns.unwrap_or(w.start_ns) as f64 / 1e9);
        }
        if let Some(last) = s.applications.as_ref().and_then(|a| a.last()) {
            end_s = end_s.max(last.start_ns as f64 / 1e9 + bucket_s);
        }
        TimeAxis { end_s: if end_s > 0.0 { end_s } else { bucket_s.max(1e-3) }, bucket_s }
    }

    /// The x of a time on a plot area from `Y_LABEL_AREA_PX` to the right
    /// margin, as plotters will place it (for the label lanes, which are laid
    /// out before the chart is built).
    fn px(&self, t_s: f64) -> f64 {
        let plot = f64::from(WIDTH_PX - Y_LABEL_AREA_PX - 2 * MARGIN_PX);
        f64::from(MARGIN_PX + Y_LABEL_AREA_PX) + t_s / self.end_s * plot
    }

    fn window_s(&self, w: &FaultWindow) -> (f64, f64) {
        (w.start_ns as f64 / 1e9, w.end_ns.map_or(self.end_s, |e| e as f64 / 1e9))
    }
}

fn fault_label(w: &FaultWindow) -> String {
    format!("{} {}", w.fault, w.target)
}

/// Which lane each window's label goes in (`None`: no room for its label),
/// and how many lanes there are: each window takes the first lane where
/// neither its bar nor its label would touch the one before.
pub fn fault_lanes(axis: &TimeAxis, windows: &[FaultWindow]) -> (Vec<Option<usize>>, usize) {
    let mut order: Vec<usize> = (0..windows.len()).collect();
    order.sort_by_key(|&i| windows[i].start_ns);
    let mut lane_ends: Vec<f64> = Vec::new();
    let mut out = vec![None; windows.len()];
    for i in order {
        let w = &windows[i];
        let (t0, t1) = axis.window_s(w);
        let (x0, x1) = (axis.px(t0), axis.px(t1));
        let extent = x1.max(x0 + 2.0 + LABEL_CHAR_PX * fault_label(w).chars().count() as f64) + 6.0;
        let lane = match lane_ends.iter().position(|end| *end <= x0) {
            Some(lane) => Some(lane),
            None if lane_ends.len() < FAULT_LANES_MAX => {
                lane_ends.push(0.0);
                Some(lane_ends.len() - 1)
            }
            None => None,
        };
        if let Some(lane) = lane {
            lane_ends[lane] = extent;
        }
        out[i] = lane;
    }
    (out, lane_ends.len())
}

/// A time plot: its height without the label lanes, axis descriptions, and
/// whether it names the fault windows above its plot area.
pub(crate) struct TimePlot<'a> {
    pub(crate) height_px: u32,
    pub(crate) x_desc: &'a str,
    pub(crate) y_desc: &'a str,
    /// About how many y labels: a log axis needs more asked of it than it
    /// shows, since plotters keeps to round values of each decade.
    pub(crate) y_labels: usize,
    pub(crate) name_faults: bool,
}

/// Draws one time plot: the mesh, the fault windows shaded (and named, if
/// asked), then `draw`'s series.
pub(crate) fn time_plot<R, Y, V>(
    plot: &TimePlot,
    axis: &TimeAxis,
    faults: &[FaultWindow],
    y_range: R,
    y_label: &dyn Fn(&V) -> String,
    draw: impl FnOnce(&mut Chart<'_, '_, Y>) -> Drawn,
) -> Result<String, Box<dyn Error>>
where
    R: AsRangedCoord<CoordDescType = Y, Value = V>,
    Y: Ranged<ValueType = V> + ValueFormatter<V>,
    V: Clone + 'static,
{
    let (lanes, lane_count) = if plot.name_faults { fault_lanes(axis, faults) } else { (Vec::new(), 0) };
    let strip_px = if lane_count > 0 { 4 + lane_count as u32 * LANE_PX } else { 0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, plot.height_px + strip_px)).into_drawing_area();
        root.fill(&WHITE)?;
        let (_, area) = root.split_vertically(strip_px);
        let mut chart = ChartBuilder::on(&area)
            .margin(MARGIN_PX)
            .x_label_area_size(X_LABEL_AREA_PX)
            .y_label_area_size(Y_LABEL_AREA_PX)
            .build_cartesian_2d(0.0..axis.end_s, y_range)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .x_labels(10)
            .y_labels(plot.y_labels)
            .x_label_formatter(&|t| number(*t))
            .y_label_formatter(y_label)
            .x_desc(plot.x_desc)
            .y_desc(plot.y_desc)
            .label_style(("sans-serif", LABEL_FONT))
            .axis_desc_style(("sans-serif", LABEL_FONT))
            .draw()?;
        let y = chart.y_range();
        chart.draw_series(faults.iter().map(|w| {
            let (t0, t1) = axis.window_s(w);
            Rectangle::new(
                [(t0, y.start.clone()), (t1.max(t0), y.end.clone())],
                rgb(fault_color(&w.fault)).mix(0.25).filled(),
            )
        }))?;
        draw(&mut chart)?;
        for (w, lane) in faults.iter().zip(&lanes) {
            let Some(lane) = lane else {
                continue;
            };
            let (t0, t1) = axis.window_s(w);
            let x0 = chart.backend_coord(&(t0, y.end.clone())).0;
            let x1 = chart.backend_coord(&(t1, y.end.clone())).0.max(x0 + 1);
            let top = 2 + *lane as i32 * LANE_PX as i32;
            let color = rgb(fault_color(&w.fault));
            root.draw(&Rectangle::new(
                [(x0, top + LANE_PX as i32 - 4), (x1, top + LANE_PX as i32 - 1)],
                color.filled(),
            ))?;
            let style = ("sans-serif", FAULT_FONT).into_font().color(&RGBColor(0x33, 0x33, 0x33));
            root.draw(&Text::new(fault_label(w), (x0 + 1, top + LANE_PX as i32 - 6), style))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// Where a bucket's figure is drawn: its middle, in seconds.
pub(crate) fn mid_s(start_ns: u64, axis: &TimeAxis) -> f64 {
    start_ns as f64 / 1e9 + axis.bucket_s / 2.0
}

/// Latency over time: per outcome, the p99 of each bucket's ops as a line and
/// their max as dots; for `ok` also the p50, thinner.
pub fn latency(results: &Results, axis: &TimeAxis) -> Result<String, Box<dyn Error>> {
    let ops = &results.series.ops;
    let values = ops.iter().flat_map(|b| (0..3).filter_map(|i| outcome(b, i)));
    let (lo, hi) = values.fold((f64::MAX, 0.0f64), |(lo, hi), o| {
        (lo.min(o.latency_ms_p50).min(o.latency_ms_p99), hi.max(o.latency_ms_max))
    });
    // Log scale: from a little under the fastest to a little over the slowest.
    let lo = if lo < f64::MAX { (lo / 1.5).max(1e-3) } else { 0.1 };
    let hi = (hi * 1.5).max(lo * 10.0);
    let plot = TimePlot {
        height_px: 320,
        x_desc: "time since start (s), at the op's invoke",
        y_desc: "latency (ms, log)",
        y_labels: 12,
        name_faults: true,
    };
    time_plot(&plot, axis, &results.faults, (lo..hi).log_scale(), &|v| number(*v), |chart| {
        for (i, (name, hex)) in OUTCOMES.iter().enumerate() {
            let color = rgb(hex);
            let of = |f: fn(&OutcomeBucket) -> f64| {
                ops.iter().filter_map(move |b| outcome(b, i).map(|o| (mid_s(b.start_ns, axis), f(o).max(lo))))
            };
            if *name == "ok" {
                chart.draw_series(LineSeries::new(of(|o| o.latency_ms_p50), color.mix(0.6).stroke_width(1)))?;
            }
            chart.draw_series(LineSeries::new(of(|o| o.latency_ms_p99), color.stroke_width(2)))?;
            chart.draw_series(of(|o| o.latency_ms_max).map(|p| Circle::new(p, 2, color.mix(0.7).filled())))?;
        }
        Ok(())
    })
}

/// Per-bucket figures in every bucket from the first to `last`, 0 where the
/// series lists none.
fn dense<T: Copy + Default>(listed: impl Iterator<Item = (u64, T)>, bucket_ns: u64, buckets: usize) -> Vec<T> {
    let mut out = vec![T::default(); buckets];
    for (start_ns, v) in listed {
        if let Some(slot) = out.get_mut((start_ns / bucket_ns.max(1)) as usize) {
            *slot = v;
        }
    }
    out
}

/// Ops invoked per second by outcome. The bucket the history ends in is cut
/// short; drawn, it would look like a collapse of throughput, so it is left
/// out.
pub fn throughput(results: &Results, axis: &TimeAxis) -> Result<String, Box<dyn Error>> {
    let s = &results.series;
    let bucket_ns = s.bucket_ns.max(1);
    let whole = (s.history_end_ns / bucket_ns) as usize;
    let buckets = s.ops.last().map_or(0, |b| (b.start_ns / bucket_ns) as usize + 1).min(whole.max(1));
    let rates: Vec<Vec<f64>> = (0..3)
        .map(|i| {
            let counts = s.ops.iter().map(|b| (b.start_ns, outcome(b, i).map_or(0, |o| o.count)));
            dense(counts, bucket_ns, buckets).into_iter().map(|n| n as f64 / axis.bucket_s).collect()
        })
        .collect();
    let y_max = rates.iter().flatten().copied().fold(1.0f64, f64::max) * 1.1;
    let plot = TimePlot {
        height_px: 240,
        x_desc: "time since start (s), at the op's invoke",
        y_desc: "ops invoked per s",
        y_labels: 5,
        name_faults: true,
    };
    time_plot(&plot, axis, &results.faults, 0.0..y_max, &|v| number(*v), |chart| {
        for ((_, hex), series) in OUTCOMES.iter().zip(&rates) {
            let points = series.iter().enumerate().map(|(k, r)| (mid_s(k as u64 * bucket_ns, axis), *r));
            chart.draw_series(LineSeries::new(points, rgb(hex).stroke_width(2)))?;
        }
        Ok(())
    })
}

/// A tick label: three significant digits at most, no trailing zeros
/// (`0.3`, not `0.30000000000000004`; `6000`, not `6000.0`).
pub fn number(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".to_owned();
    }
    let decimals = (2 - v.abs().log10().floor() as i32).max(0) as usize;
    let text = format!("{v:.decimals$}");
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_owned() } else { text }
}

/// A bucket width for labels: `1 s`, `250 ms`, `1.024 s`.
pub fn width_label(width_s: f64) -> String {
    if width_s < 1.0 { format!("{} ms", seconds(width_s * 1e3)) } else { format!("{} s", seconds(width_s)) }
}

/// At most three decimals, none that are zero: `0.045`, `1`, `8.192`.
pub fn seconds(v: f64) -> String {
    let text = format!("{v:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The redeliveries plot's bars: `(start_s, end_s, applied on a
/// redelivery, duplicates absorbed)` for every run of buckets that has any.
pub type Bar = (f64, f64, u64, u64);

/// The series' application buckets merged in runs of as many as it takes to
/// stay within [`BARS_MAX`]; only runs with a redelivery or an absorbed
/// duplicate.
pub fn redelivery_bars(apps: &[ApplicationsBucket], bucket_ns: u64, axis: &TimeAxis) -> Vec<Bar> {
    let buckets = (axis.end_s / axis.bucket_s).ceil().max(1.0) as usize;
    let per_bar = buckets.div_ceil(BARS_MAX).max(1) as u64;
    let width_ns = bucket_ns.max(1) * per_bar;
    let mut bars: Vec<Bar> = Vec::new();
    for b in apps {
        let (redelivered, absorbed) = (b.applied_on_redelivery, b.duplicates_absorbed.unwrap_or(0));
        if redelivered == 0 && absorbed == 0 {
            continue;
        }
        let start_s = (b.start_ns / width_ns * width_ns) as f64 / 1e9;
        match bars.last_mut() {
            Some(last) if last.0 == start_s => {
                last.2 += redelivered;
                last.3 += absorbed;
            }
            _ => bars.push((start_s, start_s + width_ns as f64 / 1e9, redelivered, absorbed)),
        }
    }
    bars
}

/// Deliveries over time, two plots on the same time axis: every application
/// per second (a line), then the rarer ones that say what the faults did:
/// applications on a redelivery and duplicates the inbox absorbed (bars side
/// by side, counts on their own scale so that a handful shows).
pub fn deliveries(
    apps: &[ApplicationsBucket],
    results: &Results,
    axis: &TimeAxis,
    bars: &[Bar],
) -> Result<(String, String), Box<dyn Error>> {
    let bucket_ns = results.series.bucket_ns.max(1);
    let buckets = apps.last().map_or(0, |b| (b.start_ns / bucket_ns) as usize + 1);
    let rate: Vec<f64> = dense(apps.iter().map(|b| (b.start_ns, b.applied)), bucket_ns, buckets)
        .into_iter()
        .map(|n| n as f64 / axis.bucket_s)
        .collect();
    let y_max = rate.iter().copied().fold(1.0f64, f64::max) * 1.1;
    let plot = TimePlot {
        height_px: 220,
        x_desc: "time since start (s)",
        y_desc: "applications per s",
        y_labels: 5,
        name_faults: true,
    };
    let all = time_plot(&plot, axis, &results.faults, 0.0..y_max, &|v| number(*v), |chart| {
        let points = rate.iter().enumerate().map(|(k, r)| (mid_s(k as u64 * bucket_ns, axis), *r));
        chart.draw_series(LineSeries::new(points, rgb(APPLIED_COLOR).stroke_width(2)))?;
        Ok(())
    })?;

    let bar_s = bars.first().map_or(axis.bucket_s, |b| b.1 - b.0);
    let y_max = (bars.iter().map(|b| b.2.max(b.3)).max().unwrap_or(0).max(1) as f64 * 1.15).ceil() as u64;
    let y_desc = format!("per {}", width_label(bar_s));
    let plot =
        TimePlot { height_px: 180, x_desc: "time since start (s)", y_desc: &y_desc, y_labels: 4, name_faults: false };
    let rare = time_plot(&plot, axis, &results.faults, 0u64..y_max, &u64::to_string, |chart| {
        // Two bars side by side in each bar's span, centred; no wider than
        // 12 px, so that a short run's few bars do not turn into blocks that
        // hide the fault windows behind them.
        let px_per_s = f64::from(WIDTH_PX - Y_LABEL_AREA_PX - 2 * MARGIN_PX) / axis.end_s;
        let bar_w = (bar_s * 0.45).min(12.0 / px_per_s);
        for (color, pick) in [(REDELIVERED_COLOR, 0usize), (ABSORBED_COLOR, 1)] {
            let rects = bars.iter().filter_map(|b| {
                let n = if pick == 0 { b.2 } else { b.3 };
                let x0 = (b.0 + b.1) / 2.0 - bar_w + pick as f64 * bar_w;
                (n > 0).then(|| Rectangle::new([(x0, 0), (x0 + bar_w, n)], rgb(color).filled()))
            });
            chart.draw_series(rects)?;
        }
        Ok(())
    })?;
    Ok((all, rare))
}

/// A histogram: one bar per key that occurs, labelled under the x axis with
/// the key and above the bar with its count; `x_desc` names what the keys
/// count and `y_desc` what the bars count.
pub fn histogram(
    bars: &std::collections::BTreeMap<u32, u64>,
    x_desc: &str,
    y_desc: &str,
) -> Result<String, Box<dyn Error>> {
    let keys: Vec<u32> = bars.keys().copied().collect();
    let n = keys.len().max(1) as u32;
    let y_max = (bars.values().copied().max().unwrap_or(1).max(1) as f64 * 1.15).ceil() as u64;
    let mut svg = String::new();
    {
        let width = (Y_LABEL_AREA_PX + 2 * MARGIN_PX + 60 * n).clamp(420, WIDTH_PX);
        let root = SVGBackend::with_string(&mut svg, (width, 240)).into_drawing_area();
        root.fill(&WHITE)?;
        draw_histogram(&root, &keys, bars, y_max, x_desc, y_desc)?;
        root.present()?;
    }
    Ok(svg)
}

fn draw_histogram(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    keys: &[u32],
    bars: &std::collections::BTreeMap<u32, u64>,
    y_max: u64,
    x_desc: &str,
    y_desc: &str,
) -> Drawn {
    let n = keys.len().max(1) as u32;
    let mut chart = ChartBuilder::on(root)
        .margin(MARGIN_PX)
        .x_label_area_size(X_LABEL_AREA_PX)
        .y_label_area_size(Y_LABEL_AREA_PX)
        .build_cartesian_2d((0u32..n - 1).into_segmented(), 0u64..y_max)?;
    // The x axis is the bars' index: each is labelled with its key, once, at
    // its centre; the segment edges are not labelled.
    let label = |v: &SegmentValue<u32>| match v {
        SegmentValue::CenterOf(i) => keys.get(*i as usize).map_or_else(String::new, u32::to_string),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .x_labels(keys.len() + 1)
        .y_labels(5)
        .x_label_formatter(&label)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", LABEL_FONT))
        .axis_desc_style(("sans-serif", LABEL_FONT))
        .draw()?;
    let color = rgb(BAR_COLOR);
    chart.draw_series(keys.iter().enumerate().map(|(i, k)| {
        let i = i as u32;
        let mut bar =
            Rectangle::new([(SegmentValue::Exact(i), 0), (SegmentValue::Exact(i + 1), bars[k])], color.filled());
        bar.set_margin(0, 0, 6, 6);
        bar
    }))?;
    let style = ("sans-serif", LABEL_FONT)
        .into_font()
        .color(&RGBColor(0x22, 0x22, 0x22))
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(
        keys.iter()
            .enumerate()
            .map(|(i, k)| Text::new(bars[k].to_string(), (SegmentValue::CenterOf(i as u32), bars[k]), style.clone())),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axis(end_s: f64) -> TimeAxis {
        TimeAxis { end_s, bucket_s: 0.001 }
    }

    fn window(fault: &str, start_s: f64, end_s: f64) -> FaultWindow {
        FaultWindow::new(fault, "worker-1", (start_s * 1e9) as u64, Some((end_s * 1e9) as u64))
    }

    #[test]
    fn fault_labels_that_would_touch_take_another_lane() {
        // The first window is short: its label runs past its end into the
        // second, which starts right after; the third starts well after both.
        let windows = [window("kill", 1.0, 2.0), window("pause", 2.5, 10.0), window("delay", 30.0, 35.0)];
        let (lanes, count) = fault_lanes(&axis(60.0), &windows);
        assert_eq!(lanes, [Some(0), Some(1), Some(0)]);
        assert_eq!(count, 2);
        // Past the last lane a label is left out, not drawn over another.
        let crowded: Vec<FaultWindow> = (0..6).map(|i| window("kill", 1.0 + f64::from(i) * 0.1, 20.0)).collect();
        let (lanes, count) = fault_lanes(&axis(60.0), &crowded);
        assert_eq!(count, FAULT_LANES_MAX);
        assert_eq!(lanes.iter().filter(|l| l.is_none()).count(), 6 - FAULT_LANES_MAX);
    }

    #[test]
    fn bars_merge_buckets_to_stay_within_the_bound() {
        let apps: Vec<ApplicationsBucket> = (0..600u64)
            .map(|k| ApplicationsBucket {
                start_ns: k * 1_000_000,
                applied: 2,
                applied_on_redelivery: 1,
                duplicates_absorbed: Some(k % 2),
                overtaken: None,
            })
            .collect();
        let bars = redelivery_bars(&apps, 1_000_000, &axis(0.6));
        assert!(bars.len() <= BARS_MAX, "{}", bars.len());
        assert_eq!(bars.iter().map(|b| b.2).sum::<u64>(), 600, "merging loses no redelivery");
        assert_eq!(bars.iter().map(|b| b.3).sum::<u64>(), 300);
        assert_eq!(bars[0], (0.0, 0.004, 4, 2));
    }

    #[test]
    fn tick_labels_keep_three_significant_digits() {
        assert_eq!(
            [0.0, 0.30000000000000004, 0.05, 1.0, 12.5, 6000.0, 1234.5678].map(number),
            ["0", "0.3", "0.05", "1", "12.5", "6000", "1235"]
        );
    }

    #[test]
    fn widths_and_seconds_read_as_people_write_them() {
        assert_eq!([0.0, 0.045, 1.0, 8.192, 0.12345].map(seconds), ["0", "0.045", "1", "8.192", "0.123"]);
        assert_eq!([0.001, 0.128, 1.0, 2.048].map(width_label), ["1 ms", "128 ms", "1 s", "2.048 s"]);
    }
}
