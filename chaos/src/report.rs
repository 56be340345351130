//! `report.html`: one self-contained file (no network, no scripts): the verdict
//! and anomalies first, then counts, latency over time with fault windows
//! shaded, throughput, effect lag, deliveries over time (applications,
//! redeliveries and the duplicates the inbox absorbed), the delivery-attempt
//! histogram, and the faults: one row per window with what it caused, and a
//! line for every enabled fault that never fired. Plots are inline SVG.
//!
//! Everything beyond `results.json` and the history is optional, so that a run
//! directory another tool wrote (no `run.json`, no delivery evidence, no `meta`
//! line) still gives a readable page: what is missing is said, not drawn as 0.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::Path;

use anyhow::Context;
use haunt_checker::results::{Delivery, FaultWindow};
use haunt_checker::{Results, Verdict};
use haunt_format::{FINAL_STATE_FILE, FinalLine, HISTORY_FILE, Op, OpType, Process, RESULTS_FILE, RUN_FILE};
use serde::Deserialize;

/// Points drawn in the latency plot at most; beyond that every n-th op is
/// drawn, which keeps the file small and the browser responsive.
const POINTS_MAX: usize = 20_000;

/// Buckets of the deliveries-over-time plot at most: about one per 4 px of
/// plot width, so bars stay apart; longer runs get wider buckets.
const BUCKETS_MAX: usize = 200;

/// Lanes of fault labels above a time plot at most. Windows that overlap (with
/// `--faults-at-once` above 1) or come in quick succession take a lane each;
/// beyond this many a window is still shaded and listed in the table, but its
/// label is left out rather than drawn over another.
const FAULT_LANES_MAX: usize = 4;

/// The width of one character of an SVG label in px, a little over the average
/// of a sans-serif face at 10 px, so estimated label extents err wide.
const LABEL_CHAR_PX: f64 = 6.0;

/// What the report reads from `run.json`: which enabled faults fired. Both are
/// absent for a run directory another tool (or an older haunt) wrote.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Coverage {
    /// How often each enabled fault started.
    #[serde(default)]
    pub faults_fired: Option<BTreeMap<String, u32>>,
    /// The enabled faults that never started.
    #[serde(default)]
    pub faults_never_fired: Option<Vec<String>>,
}

/// Everything one page is made of.
#[derive(Debug, Clone, Copy)]
pub struct Page<'a> {
    pub results: &'a Results,
    /// `history.jsonl` (empty when there is none).
    pub history: &'a str,
    /// `final-state.jsonl` (empty when there is none).
    pub final_state: &'a str,
    pub coverage: &'a Coverage,
    /// Names the run (directory, seed, revision, options).
    pub subtitle: &'a str,
}

/// The page for a run directory that has been checked (`results.json`); the
/// history, final state and `run.json` are used when they are there.
pub fn render_dir(dir: &Path, subtitle: &str) -> anyhow::Result<String> {
    let path = dir.join(RESULTS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let results: Results = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let history = std::fs::read_to_string(dir.join(HISTORY_FILE)).unwrap_or_default();
    let final_state = std::fs::read_to_string(dir.join(FINAL_STATE_FILE)).unwrap_or_default();
    // A run.json without the coverage fields, or of another shape, only means
    // the report cannot say which faults never fired.
    let coverage = std::fs::read_to_string(dir.join(RUN_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<Coverage>(&t).ok())
        .unwrap_or_default();
    Ok(render(&Page { results: &results, history: &history, final_state: &final_state, coverage: &coverage, subtitle }))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn outcome_color(kind: OpType) -> &'static str {
    match kind {
        OpType::Ok => "#2e7d32",
        OpType::Fail => "#c62828",
        OpType::Info => "#ef6c00",
        OpType::Invoke => "#777",
    }
}

fn fault_color(fault: &str) -> &'static str {
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
        _ => "#bdbdbd",
    }
}

/// Applications on the first delivery, applications on a redelivery, and the
/// duplicates the inbox absorbed, in the deliveries-over-time plot.
const APPLIED_COLOR: &str = "#3949ab";
const REDELIVERED_COLOR: &str = "#ef6c00";
const ABSORBED_COLOR: &str = "#8e24aa";

/// A completed client op: when it was invoked, how long it took, how it ended.
#[derive(Debug, Clone, Copy)]
struct Point {
    start_s: f64,
    end_s: f64,
    latency_ms: f64,
    kind: OpType,
}

fn points(history: &str) -> Vec<Point> {
    let mut invoked: HashMap<Process, u64> = HashMap::new();
    let mut out = Vec::new();
    for line in history.lines() {
        let Ok(op) = serde_json::from_str::<Op>(line) else {
            continue;
        };
        if op.process.is_nemesis() {
            continue;
        }
        if op.kind == OpType::Invoke {
            invoked.insert(op.process, op.time_ns);
        } else if let Some(t0) = invoked.remove(&op.process) {
            out.push(Point {
                start_s: t0 as f64 / 1e9,
                end_s: op.time_ns as f64 / 1e9,
                latency_ms: op.time_ns.saturating_sub(t0) as f64 / 1e6,
                kind: op.kind,
            });
        }
    }
    out
}

/// The applications of the final state placed on the history's clock.
#[derive(Debug, Default)]
struct Applications {
    /// Seconds since the history's start of each application on a first
    /// delivery (`delivery_attempt` 1).
    first: Vec<f64>,
    /// The same for applications on a redelivery (`delivery_attempt` above 1).
    redelivered: Vec<f64>,
    /// Per event whose inbox absorbed duplicates: the time of its first
    /// application and how many duplicates. The final state does not say when
    /// a duplicate came, only that it came after the event was applied, so it
    /// is drawn at the application it repeated.
    absorbed: Vec<(f64, u64)>,
    /// Whether any `order` line carries `duplicates_absorbed`.
    absorbed_known: bool,
}

/// Why the deliveries-over-time plot cannot be drawn.
#[derive(Debug, PartialEq, Eq)]
enum NoApplications {
    /// No `applied` line.
    None,
    /// No `meta` line: no `run_started_at_ms` to place `applied_at_ms` on the
    /// history's clock.
    NoClock,
}

fn applications(final_state: &str) -> Result<Applications, NoApplications> {
    // Two passes so that only the few events with absorbed duplicates are
    // held by id, not every event of a long run. Lines are parsed only where
    // the text says they can matter; serde decides what they are.
    let mut started_at_ms = None;
    let mut duplicates: HashMap<String, u64> = HashMap::new();
    let mut absorbed_known = false;
    for line in final_state.lines().filter(|l| l.contains("run_started_at_ms") || l.contains("duplicates_absorbed")) {
        match serde_json::from_str::<FinalLine>(line) {
            Ok(FinalLine::Meta(meta)) => started_at_ms = Some(meta.run_started_at_ms),
            Ok(FinalLine::Order(order)) => {
                if let Some(n) = order.duplicates_absorbed {
                    absorbed_known = true;
                    if n > 0 {
                        *duplicates.entry(order.event_id).or_default() += u64::from(n);
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = Applications { absorbed_known, ..Applications::default() };
    let mut first_applied_ms: HashMap<String, i64> = HashMap::new();
    let mut any = false;
    for line in final_state.lines().filter(|l| l.contains("applied_at_ms")) {
        let Ok(FinalLine::Applied(applied)) = serde_json::from_str::<FinalLine>(line) else {
            continue;
        };
        any = true;
        let Some(t0) = started_at_ms else {
            continue;
        };
        let at_s = (applied.applied_at_ms - t0) as f64 / 1e3;
        if applied.delivery_attempt > 1 {
            out.redelivered.push(at_s);
        } else {
            out.first.push(at_s);
        }
        if duplicates.contains_key(&applied.event_id) {
            let first = first_applied_ms.entry(applied.event_id).or_insert(applied.applied_at_ms);
            *first = (*first).min(applied.applied_at_ms);
        }
    }
    match (any, started_at_ms) {
        (false, _) => Err(NoApplications::None),
        (true, None) => Err(NoApplications::NoClock),
        (true, Some(t0)) => {
            let mut absorbed: Vec<(f64, u64)> = first_applied_ms
                .iter()
                .map(|(event, ms)| ((ms - t0) as f64 / 1e3, duplicates.get(event).copied().unwrap_or(0)))
                .collect();
            absorbed.sort_by(|a, b| a.0.total_cmp(&b.0));
            out.absorbed = absorbed;
            Ok(out)
        }
    }
}

/// The smallest of 1, 2 or 5 times a power of ten that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 || !raw.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= raw * 0.999_999).unwrap_or(10.0 * magnitude)
}

/// Round ticks from `lo` to `hi`, about `count` of them, no finer than `step_min`.
fn linear_ticks(lo: f64, hi: f64, count: u32, step_min: f64) -> Vec<f64> {
    // Rounded up from a little under the even split, so that the ticks come
    // close to `count` rather than well under it (4,492 in 4 gives steps of
    // 1,000, not 2,000).
    let step = nice_step(0.75 * (hi - lo) / f64::from(count.max(1))).max(step_min);
    let mut v = (lo / step).ceil() * step;
    let mut out = Vec::new();
    // Bounded: (hi - lo) / step is at most about `count` by the choice of step.
    while v <= hi * (1.0 + 1e-9) + 1e-12 && out.len() <= 2 * count as usize + 2 {
        out.push(v);
        v += step;
    }
    out
}

/// Plot area and scales.
struct Frame {
    width: f64,
    height: f64,
    /// Space above the plot area (fault labels go there).
    top: f64,
    left: f64,
    bottom: f64,
    x_max: f64,
    y_min: f64,
    y_max: f64,
    log_y: bool,
    /// Whether y counts things, so its ticks are whole numbers.
    y_integer: bool,
    /// One label per unit of x, centred on it (bars of a histogram); `None`:
    /// round ticks of a continuous x.
    x_labels: Option<Vec<String>>,
}

/// A tick label: at most two decimals, none that are zero (`0.25`, `1`, `40`).
fn tick_label(v: f64) -> String {
    let text = format!("{v:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

impl Frame {
    const RIGHT: f64 = 14.0;

    /// A plot over time: seconds since the run started on x, linear y.
    fn over_time(height: f64, x_max: f64, y_max: f64, y_integer: bool) -> Frame {
        Frame {
            width: 900.0,
            height,
            top: 10.0,
            left: 60.0,
            bottom: 36.0,
            x_max,
            y_min: 0.0,
            y_max,
            log_y: false,
            y_integer,
            x_labels: None,
        }
    }

    fn x(&self, v: f64) -> f64 {
        self.left + (v / self.x_max.max(1e-9)) * (self.width - self.left - Self::RIGHT)
    }

    fn y(&self, v: f64) -> f64 {
        let (lo, hi, v) = if self.log_y {
            (self.y_min.log10(), self.y_max.log10(), v.max(self.y_min).log10())
        } else {
            (self.y_min, self.y_max, v)
        };
        let span = (hi - lo).max(1e-9);
        self.height - self.bottom - ((v - lo) / span) * (self.height - self.bottom - self.top)
    }

    fn open(&self, out: &mut String, title: &str) {
        let _ = write!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}" font-family="sans-serif" font-size="11">"#,
            esc(title),
            self.width,
            self.height,
            self.width,
            self.height
        );
    }

    fn axes(&self, out: &mut String, x_label: &str, y_label: &str) {
        let (x0, x1, y0, y1) = (self.left, self.width - Self::RIGHT, self.height - self.bottom, self.top);
        let _ = write!(out, r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/>"##);
        let _ = write!(out, r##"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>"##);
        let x_ticks: Vec<(f64, String)> = match &self.x_labels {
            Some(labels) => labels.iter().enumerate().map(|(i, l)| (i as f64 + 0.5, l.clone())).collect(),
            // Whole seconds, except for a run too short to have a few.
            None => linear_ticks(0.0, self.x_max, 10, if self.x_max >= 5.0 { 1.0 } else { 0.0 })
                .into_iter()
                .map(|v| (v, tick_label(v)))
                .collect(),
        };
        for (v, label) in x_ticks {
            let x = self.x(v);
            let _ = write!(out, r##"<line x1="{x:.1}" y1="{y0}" x2="{x:.1}" y2="{:.1}" stroke="#333"/>"##, y0 + 3.0);
            let _ = write!(out, r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, y0 + 14.0, esc(&label));
        }
        let ticks: Vec<f64> = if self.log_y {
            let mut t = Vec::new();
            let mut v = 10f64.powf(self.y_min.log10().floor());
            while v <= self.y_max * 1.0001 {
                if v >= self.y_min {
                    t.push(v);
                }
                v *= 10.0;
            }
            t
        } else {
            linear_ticks(self.y_min, self.y_max, 4, if self.y_integer { 1.0 } else { 0.0 })
        };
        for v in ticks {
            let y = self.y(v);
            let label = if v >= 10.0 { format!("{v:.0}") } else { tick_label(v) };
            let _ = write!(out, r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#eee"/>"##);
            let _ = write!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#, x0 - 4.0, y + 4.0);
        }
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            (x0 + x1) / 2.0,
            self.height - 4.0,
            esc(x_label)
        );
        let _ = write!(
            out,
            r#"<text transform="translate(13 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (y0 + y1) / 2.0,
            esc(y_label)
        );
    }

    fn shade_faults(&self, out: &mut String, windows: &[FaultWindow], end_s: f64) {
        for w in windows {
            let (x0, x1) = window_px(self, w, end_s);
            let _ = write!(
                out,
                r#"<rect x="{x0:.1}" y="{}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.25"><title>{} {}</title></rect>"#,
                self.top,
                (x1 - x0).max(1.0),
                self.height - self.bottom - self.top,
                fault_color(&w.fault),
                esc(&w.fault),
                esc(&w.target)
            );
        }
    }
}

fn window_px(frame: &Frame, w: &FaultWindow, end_s: f64) -> (f64, f64) {
    let x0 = frame.x(w.start_ns as f64 / 1e9);
    let x1 = frame.x(w.end_ns.map_or(end_s, |e| e as f64 / 1e9));
    (x0, x1.max(x0 + 1.0))
}

/// Height of one lane of fault labels.
const LANE_PX: f64 = 14.0;

/// Which lane each window's label goes in (`None`: no room for its label),
/// and how many lanes there are: each window takes the first lane where
/// neither its bar nor its label would touch the one before.
fn fault_lanes(frame: &Frame, windows: &[FaultWindow], end_s: f64) -> (Vec<Option<usize>>, usize) {
    let mut order: Vec<usize> = (0..windows.len()).collect();
    order.sort_by_key(|&i| windows[i].start_ns);
    let mut lane_ends: Vec<f64> = Vec::new();
    let mut out = vec![None; windows.len()];
    for i in order {
        let w = &windows[i];
        let (x0, x1) = window_px(frame, w, end_s);
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

fn fault_label(w: &FaultWindow) -> String {
    format!("{} {}", w.fault, w.target)
}

/// The lanes of fault labels above the plot area: a bar over each window's
/// span and its fault and target written from its start.
fn fault_strip(frame: &Frame, out: &mut String, windows: &[FaultWindow], lanes: &[Option<usize>], end_s: f64) {
    for (w, lane) in windows.iter().zip(lanes) {
        let Some(lane) = lane else {
            continue;
        };
        let (x0, x1) = window_px(frame, w, end_s);
        let y = 4.0 + *lane as f64 * LANE_PX;
        let _ = write!(
            out,
            r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="3" fill="{}"/>"#,
            y + LANE_PX - 4.0,
            x1 - x0,
            fault_color(&w.fault)
        );
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#333">{}</text>"##,
            x0 + 1.0,
            y + LANE_PX - 6.0,
            esc(&fault_label(w))
        );
    }
}

/// A time plot's frame with room above the plot area for the fault labels.
fn time_frame(
    height: f64,
    x_max: f64,
    y_max: f64,
    y_integer: bool,
    results: &Results,
    end_s: f64,
) -> (Frame, Vec<Option<usize>>) {
    let mut frame = Frame::over_time(height, x_max, y_max, y_integer);
    let (lanes, count) = fault_lanes(&frame, &results.faults, end_s);
    frame.top = 10.0 + count as f64 * LANE_PX;
    frame.height += count as f64 * LANE_PX;
    (frame, lanes)
}

fn latency_plot(points: &[Point], results: &Results, end_s: f64) -> String {
    let y_max = points.iter().map(|p| p.latency_ms).fold(1.0f64, f64::max) * 1.2;
    let (mut frame, lanes) = time_frame(320.0, end_s, y_max, false, results, end_s);
    frame.y_min = 0.1;
    frame.log_y = true;
    let mut out = String::new();
    frame.open(&mut out, "client op latency over time");
    frame.shade_faults(&mut out, &results.faults, end_s);
    fault_strip(&frame, &mut out, &results.faults, &lanes, end_s);
    let step = points.len().div_ceil(POINTS_MAX).max(1);
    for p in points.iter().step_by(step) {
        let _ = write!(
            out,
            r#"<circle cx="{:.1}" cy="{:.1}" r="1.6" fill="{}" fill-opacity="0.7"/>"#,
            frame.x(p.start_s),
            frame.y(p.latency_ms),
            outcome_color(p.kind)
        );
    }
    frame.axes(&mut out, "time since start (s), at the op's invoke", "latency (ms, log)");
    out.push_str("</svg>");
    out
}

fn throughput_plot(points: &[Point], results: &Results, end_s: f64) -> String {
    let seconds = end_s.ceil().max(1.0) as usize;
    let mut per_second: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for kind in [OpType::Ok, OpType::Fail, OpType::Info] {
        per_second.insert(kind.as_str(), vec![0.0; seconds + 1]);
    }
    for p in points {
        let bucket = (p.end_s.max(0.0) as usize).min(seconds);
        if let Some(v) = per_second.get_mut(p.kind.as_str()) {
            v[bucket] += 1.0;
        }
    }
    let y_max = per_second.values().flatten().copied().fold(1.0f64, f64::max) * 1.1;
    let (frame, lanes) = time_frame(240.0, end_s, y_max, true, results, end_s);
    let mut out = String::new();
    frame.open(&mut out, "completed ops per second by outcome");
    frame.shade_faults(&mut out, &results.faults, end_s);
    fault_strip(&frame, &mut out, &results.faults, &lanes, end_s);
    // The last second is cut short by the end of the workload; drawn, it would
    // look like a collapse of throughput.
    let whole_seconds = (points.iter().map(|p| p.end_s).fold(0.0f64, f64::max).floor() as usize).max(1);
    for kind in [OpType::Ok, OpType::Fail, OpType::Info] {
        let series = &per_second[kind.as_str()];
        let path: Vec<String> = series
            .iter()
            .take(whole_seconds)
            .enumerate()
            .map(|(s, v)| format!("{:.1},{:.1}", frame.x(s as f64 + 0.5), frame.y(*v)))
            .collect();
        let _ = write!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5"/>"#,
            path.join(" "),
            outcome_color(kind)
        );
    }
    frame.axes(&mut out, "time since start (s), at the op's completion", "ops/s");
    out.push_str("</svg>");
    out
}

/// Counts per bucket of `width_s` seconds, `buckets` of them.
fn bucketed(times: impl Iterator<Item = (f64, u64)>, width_s: f64, buckets: usize) -> Vec<u64> {
    let mut out = vec![0u64; buckets];
    for (t, n) in times {
        let i = ((t.max(0.0) / width_s) as usize).min(buckets.saturating_sub(1));
        if let Some(slot) = out.get_mut(i) {
            *slot += n;
        }
    }
    out
}

/// Deliveries over time: two plots on the same time axis. The first shows
/// every application per bucket (a line), the second the rarer ones that say
/// what the faults did: applications on a redelivery and duplicates the inbox
/// absorbed (bars side by side, on their own scale so that a handful shows).
fn deliveries_plot(apps: &Applications, results: &Results, end_s: f64) -> String {
    let width_s = nice_step(end_s / BUCKETS_MAX as f64).max(1.0);
    let buckets = (end_s / width_s).ceil().max(1.0) as usize;
    let all = bucketed(apps.first.iter().chain(&apps.redelivered).map(|t| (*t, 1)), width_s, buckets);
    let redelivered = bucketed(apps.redelivered.iter().map(|t| (*t, 1)), width_s, buckets);
    let absorbed = bucketed(apps.absorbed.iter().copied(), width_s, buckets);
    let per = if width_s == 1.0 { "per s".to_owned() } else { format!("per {} s", tick_label(width_s)) };
    let x_label = "time since start (s)";

    let y_max = all.iter().copied().max().unwrap_or(0).max(1) as f64 * 1.1;
    let (frame, lanes) = time_frame(220.0, end_s, y_max, true, results, end_s);
    let mut out = String::new();
    frame.open(&mut out, "applications over time");
    frame.shade_faults(&mut out, &results.faults, end_s);
    fault_strip(&frame, &mut out, &results.faults, &lanes, end_s);
    let path: Vec<String> = all
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{:.1},{:.1}", frame.x((i as f64 + 0.5) * width_s), frame.y(*n as f64)))
        .collect();
    let _ = write!(
        out,
        r#"<polyline points="{}" fill="none" stroke="{APPLIED_COLOR}" stroke-width="1.5"/>"#,
        path.join(" ")
    );
    frame.axes(&mut out, x_label, &format!("applications {per}"));
    out.push_str("</svg>");

    let y_max = redelivered.iter().chain(&absorbed).copied().max().unwrap_or(0).max(1) as f64 * 1.15;
    let frame = Frame::over_time(180.0, end_s, y_max, true);
    frame.open(&mut out, "redeliveries and absorbed duplicates over time");
    frame.shade_faults(&mut out, &results.faults, end_s);
    // Two bars side by side in each bucket, centred; no wider than 12 px, so
    // that a short run's few buckets do not turn into blocks that hide the
    // fault windows behind them.
    let bucket_px = frame.x(width_s) - frame.x(0.0);
    let bar_px = (bucket_px * 0.45).clamp(1.0, 12.0);
    for (i, (r, a)) in redelivered.iter().zip(&absorbed).enumerate() {
        let x = frame.x(i as f64 * width_s) + (bucket_px - 2.0 * bar_px) / 2.0;
        let t0 = i as f64 * width_s;
        for (n, color, what, dx) in [
            (*r, REDELIVERED_COLOR, "applied on a redelivery", 0.0),
            (*a, ABSORBED_COLOR, "absorbed as duplicates", bar_px),
        ] {
            if n == 0 {
                continue;
            }
            let y = frame.y(n as f64);
            let _ = write!(
                out,
                r#"<rect x="{:.1}" y="{y:.1}" width="{bar_px:.1}" height="{:.1}" fill="{color}"><title>{} to {} s: {n} {what}</title></rect>"#,
                x + dx,
                (frame.y(0.0) - y).max(1.0),
                tick_label(t0),
                tick_label(t0 + width_s)
            );
        }
    }
    frame.axes(&mut out, x_label, &format!("redeliveries {per}"));
    out.push_str("</svg>");
    out
}

/// One bar per delivery attempt that occurs, labelled on the x axis with the
/// attempt's number, and above with how many applications it had.
fn delivery_plot(delivery: &Delivery) -> String {
    let hist = &delivery.histogram;
    let bars = hist.len().max(1) as f64;
    let y_max = hist.values().copied().max().unwrap_or(1).max(1) as f64 * 1.15;
    let frame = Frame {
        width: 420.0,
        height: 220.0,
        top: 10.0,
        left: 60.0,
        bottom: 34.0,
        x_max: bars,
        y_min: 0.0,
        y_max,
        log_y: false,
        y_integer: true,
        x_labels: Some(hist.keys().map(u32::to_string).collect()),
    };
    let mut out = String::new();
    frame.open(&mut out, "applications by delivery attempt");
    for (i, (attempt, n)) in hist.iter().enumerate() {
        let (x0, x1) = (frame.x(i as f64 + 0.1), frame.x(i as f64 + 0.9));
        let y = frame.y(*n as f64);
        let _ = write!(
            out,
            r##"<rect x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#5c6bc0"><title>attempt {attempt}: {n}</title></rect>"##,
            x1 - x0,
            (frame.y(0.0) - y).max(1.0)
        );
        let _ = write!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{n}</text>"#, (x0 + x1) / 2.0, y - 3.0);
    }
    frame.axes(&mut out, "delivery attempt", "applications");
    out.push_str("</svg>");
    out
}

/// The faults of the run, each once, in the order they first started.
fn faults_present(results: &Results) -> Vec<&str> {
    let mut windows: Vec<&FaultWindow> = results.faults.iter().collect();
    windows.sort_by_key(|w| w.start_ns);
    let mut out: Vec<&str> = Vec::new();
    for w in windows {
        if !out.contains(&w.fault.as_str()) {
            out.push(&w.fault);
        }
    }
    out
}

/// A legend line: `series` (colour, glyph, name) and a swatch for every fault
/// the run shaded.
fn legend(series: &[(&str, &str, &str)], results: &Results) -> String {
    let mut out = String::from(r#"<p class="legend">"#);
    for (color, glyph, name) in series {
        let _ = write!(out, r#"<span class="key"><span style="color:{color}">{glyph}</span> {}</span>"#, esc(name));
    }
    let faults = faults_present(results);
    if !faults.is_empty() {
        out.push_str(r#"<br><span class="key">fault windows, shaded and named above the plot:</span>"#);
    }
    for fault in faults {
        let _ = write!(
            out,
            r#"<span class="key"><span class="swatch" style="background:{}"></span>{}</span>"#,
            fault_color(fault),
            esc(fault)
        );
    }
    out.push_str("</p>");
    out
}

fn outcome_series(glyph: &'static str) -> Vec<(&'static str, &'static str, &'static str)> {
    [OpType::Ok, OpType::Fail, OpType::Info].into_iter().map(|k| (outcome_color(k), glyph, k.as_str())).collect()
}

/// A figure that may be absent: unknown is not zero.
fn figure(v: Option<u64>) -> String {
    v.map_or_else(|| r#"<span class="na">–</span>"#.to_owned(), |n| n.to_string())
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| r#"<span class="na">–</span>"#.to_owned(), |v| format!("{v:.1}"))
}

fn delivery_table(d: &Delivery) -> String {
    let mut h = String::from("<table class=\"figures\">");
    let rows: [(&str, Option<u64>, &str); 8] = [
        ("deliveries", d.deliveries, "times the queue handed an event to a worker"),
        ("redeliveries", d.redeliveries, "deliveries beyond each event's first"),
        ("events delivered more than once", d.redelivered_events, ""),
        ("events delivered three times or more", d.delivered_three_times_or_more, ""),
        ("duplicates absorbed by the inbox", d.duplicates_absorbed, "deliveries refused as already processed"),
        ("most deliveries of one event", d.deliveries_max, ""),
        (
            "events first applied on a redelivery",
            Some(d.applied_on_redelivery),
            "from the applications' delivery attempt",
        ),
        ("events applied more than once", Some(d.applied_more_than_once), "a bug, always"),
    ];
    for (name, v, note) in rows {
        let class = if name == "events applied more than once" && v.unwrap_or(0) > 0 { " class=\"bad\"" } else { "" };
        let _ = write!(h, "<tr><th>{name}</th><td{class}>{}</td><td class=\"note\">{note}</td></tr>", figure(v));
    }
    h.push_str("</table>");
    if d.deliveries.is_none() {
        h.push_str(
            "<p class=\"note\">– : the final state records no delivery evidence (<code>deliveries</code>, \
             <code>duplicates_absorbed</code> on its order lines).</p>",
        );
    }
    h
}

fn faults_table(results: &Results) -> String {
    let mut h = String::from(
        "<table class=\"faults\"><tr><th>fault</th><th>target</th><th>start (s)</th><th>end (s)</th>\
         <th>ops invoked inside</th><th>events affected</th><th>events redelivered</th>\
         <th>duplicates absorbed</th><th>applied twice</th><th>op p99 inside (ms)</th><th>op p99 outside (ms)</th></tr>",
    );
    let mut windows: Vec<&FaultWindow> = results.faults.iter().collect();
    windows.sort_by_key(|w| w.start_ns);
    for w in windows {
        let twice = if w.applied_more_than_once.unwrap_or(0) > 0 { " class=\"bad\"" } else { "" };
        let slower = match (w.latency_ms_p99, w.latency_ms_p99_outside) {
            (Some(inside), Some(outside)) if inside > outside * 2.0 => " class=\"slow\"",
            _ => "",
        };
        let _ = write!(
            h,
            "<tr><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td><td>{}</td><td>{:.2}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td{twice}>{}</td><td{slower}>{}</td><td>{}</td></tr>",
            fault_color(&w.fault),
            esc(&w.fault),
            esc(&w.target),
            w.start_ns as f64 / 1e9,
            w.end_ns.map_or("still open".to_owned(), |e| format!("{:.2}", e as f64 / 1e9)),
            w.ops_invoked,
            figure(w.events),
            figure(w.redelivered_events),
            figure(w.duplicates_absorbed),
            figure(w.applied_more_than_once),
            ms(w.latency_ms_p99),
            ms(w.latency_ms_p99_outside),
        );
    }
    h.push_str("</table>");
    h.push_str(
        "<p class=\"note\">An event is affected by a window when its life in the queue (from its order's \
         acknowledgement to its first application) overlaps it; the delivery figures are those of the affected \
         events. A p99 inside a window more than twice the p99 outside every window is shaded. – : not in \
         this run directory's results.</p>",
    );
    h
}

/// The enabled faults that never fired, one warning each; nothing when
/// `run.json` does not say.
fn never_fired(coverage: &Coverage) -> String {
    let faults = coverage.faults_never_fired.as_deref().unwrap_or_default();
    if faults.is_empty() {
        return String::new();
    }
    let mut h = String::from("<div class=\"warn\">");
    for fault in faults {
        let _ = write!(
            h,
            "<div class=\"never-fired\">{} was enabled but never fired: this run says nothing about it.</div>",
            esc(fault)
        );
    }
    h.push_str("</div>");
    h
}

/// The whole page.
pub fn render(page: &Page) -> String {
    let results = page.results;
    let points = points(page.history);
    let apps = applications(page.final_state);
    // Every time plot shares one x axis: to the last op, fault window or
    // application (the queue drains after the workload stops).
    let mut end_s = points.iter().map(|p| p.end_s).fold(1.0f64, f64::max);
    for w in &results.faults {
        end_s = end_s.max(w.end_ns.unwrap_or(w.start_ns) as f64 / 1e9);
    }
    if let Ok(apps) = &apps {
        end_s = apps.first.iter().chain(&apps.redelivered).copied().fold(end_s, f64::max);
    }
    let (verdict_class, verdict_text) = match results.valid {
        Verdict::Valid => ("valid", "VALID: no acknowledged order lost, no event applied twice"),
        Verdict::Invalid => ("invalid", "INVALID: anomalies found"),
        Verdict::Unknown => ("unknown", "UNKNOWN: the run cannot be decided"),
    };
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>haunt report: {verdict}</title><style>
body{{font-family:sans-serif;margin:2em;max-width:960px;color:#222}}
h1{{font-size:1.4em}} h2{{font-size:1.1em;margin-top:1.6em}}
.verdict{{padding:.6em 1em;border-radius:4px;font-weight:bold}}
.valid{{background:#e8f5e9;color:#1b5e20}} .invalid{{background:#ffebee;color:#b71c1c}} .unknown{{background:#fff8e1;color:#e65100}}
.warn{{background:#fff8e1;color:#8a4b00;padding:.4em .8em;margin:1em 0;border-left:4px solid #ef6c00;line-height:1.5}}
table{{border-collapse:collapse}} td,th{{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:.9em}}
table.faults td,table.faults th{{text-align:right}} table.faults td:nth-child(-n+2),table.faults th:nth-child(-n+2){{text-align:left}}
table.faults th{{vertical-align:bottom;max-width:6em}} table.faults td{{white-space:nowrap;font-size:.85em}}
td.bad{{background:#ffebee;color:#b71c1c;font-weight:bold}} td.slow{{background:#fff3e0}}
.legend{{font-size:.9em;line-height:1.6}} .legend .key{{margin-right:1.1em;white-space:nowrap}}
.swatch{{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:-.1em;opacity:.6}}
.sub{{color:#666;font-size:.85em}} .note{{color:#666;font-size:.85em}} .na{{color:#999}} code{{font-size:.9em}}
</style></head><body>
<h1>haunt report</h1><p class="sub">{subtitle}</p>
<p class="verdict {verdict_class}">{verdict_text}</p>"#,
        verdict = results.valid.as_str(),
        subtitle = esc(page.subtitle),
    );
    for reason in &results.unknown_reasons {
        let _ = write!(h, "<p>because {}</p>", esc(reason));
    }
    let never = never_fired(page.coverage);
    h.push_str(&never);
    h.push_str("<h2>Anomalies</h2>");
    let failing: Vec<_> = results.failing_anomalies().collect();
    if failing.is_empty() {
        h.push_str("<p>none</p>");
    }
    for (name, report) in failing {
        let _ = write!(
            h,
            "<h3>{} ({})</h3><table><tr><th>order</th><th>event</th><th>item</th><th>why</th></tr>",
            esc(name),
            report.count
        );
        for ex in &report.examples {
            let _ = write!(
                h,
                "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
                esc(ex.order_id.as_deref().unwrap_or("")),
                esc(ex.event_id.as_deref().unwrap_or("")),
                esc(ex.item_id.as_deref().unwrap_or("")),
                esc(&ex.why)
            );
        }
        h.push_str("</table>");
    }
    let c = &results.counts;
    let _ = write!(
        h,
        "<h2>Counts</h2><table>\
         <tr><th>orders attempted</th><td>{}</td><th>acknowledged</th><td>{}</td></tr>\
         <tr><th>failed</th><td>{}</td><th>indeterminate</th><td>{} ({} recovered)</td></tr>\
         <tr><th>present in final state</th><td>{}</td><th>events applied</th><td>{} ({} applications)</td></tr>\
         <tr><th>pending</th><td>{}</td><th>dead letters</th><td>{}</td></tr>\
         <tr><th>history ops</th><td>{}</td><th>nemesis ops</th><td>{}</td></tr></table>",
        c.attempted,
        c.acknowledged,
        c.failed,
        c.indeterminate,
        results.recovered,
        c.present,
        c.applied_events,
        c.applied_lines,
        c.pending_messages,
        c.dead_letters,
        c.ops,
        c.nemesis_ops
    );
    h.push_str("<h2>Latency over time</h2>");
    h.push_str(&legend(&outcome_series("●"), results));
    h.push_str(&latency_plot(&points, results, end_s));
    h.push_str("<h2>Throughput</h2>");
    h.push_str(&legend(&outcome_series("━"), results));
    h.push_str(&throughput_plot(&points, results, end_s));
    h.push_str("<h2>Latency and effect lag (ms)</h2><table><tr><th></th><th>count</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>");
    let mut rows: Vec<(String, &haunt_checker::results::Quantiles)> =
        results.latency_ms.ops.iter().map(|(k, q)| (format!("op {k}"), q)).collect();
    rows.push(("effect lag (ok → applied)".into(), &results.latency_ms.effect_lag));
    if let Some(q) = &results.latency_ms.ops_outside_faults {
        rows.push(("ops outside every fault window".into(), q));
    }
    for (name, q) in rows {
        let _ = write!(
            h,
            "<tr><th>{}</th><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
            esc(&name),
            q.count,
            q.p50,
            q.p95,
            q.p99,
            q.max
        );
    }
    h.push_str("</table><h2>Deliveries over time</h2>");
    match &apps {
        Ok(apps) => {
            let mut series =
                vec![(APPLIED_COLOR, "━", "applications (all)"), (REDELIVERED_COLOR, "■", "applied on a redelivery")];
            if apps.absorbed_known {
                series.push((
                    ABSORBED_COLOR,
                    "■",
                    "duplicates absorbed by the inbox, at the application they repeated",
                ));
            }
            h.push_str(&legend(&series, results));
            h.push_str(&deliveries_plot(apps, results, end_s));
            if !apps.absorbed_known {
                h.push_str(
                    "<p class=\"note\">The final state does not record the duplicates the inbox absorbed, so none are drawn.</p>",
                );
            }
        }
        Err(NoApplications::None) => h.push_str("<p>No application in the final state.</p>"),
        Err(NoApplications::NoClock) => h.push_str(
            "<p>The final state has no <code>meta</code> line with <code>run_started_at_ms</code>, so its \
             applications cannot be placed on the history's clock.</p>",
        ),
    }
    h.push_str("<h3>Delivery figures</h3>");
    h.push_str(&delivery_table(&results.delivery));
    h.push_str("<h2>Delivery attempt of each application</h2>");
    h.push_str(&delivery_plot(&results.delivery));
    h.push_str("<h2>Faults</h2>");
    if let Some(fired) = &page.coverage.faults_fired {
        let list: Vec<String> = fired.iter().map(|(f, n)| format!("{} ×{n}", esc(f))).collect();
        let _ = write!(h, "<p>Enabled faults, and how often each started: {}.</p>", list.join(", "));
    }
    h.push_str(&never);
    if results.faults.is_empty() {
        h.push_str("<p>No fault window in the history.</p>");
    } else {
        h.push_str(&faults_table(results));
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of every `<text>` element on the x axis of `svg` (the row of
    /// labels just under the plot area).
    fn x_axis_labels(svg: &str, axis_y: f64) -> Vec<String> {
        let want = format!(r#"y="{:.1}""#, axis_y + 14.0);
        svg.split("<text ")
            .skip(1)
            .filter(|t| t.contains(&want))
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.to_owned()))
            .collect()
    }

    #[test]
    fn the_delivery_histogram_labels_each_attempt_once() {
        let delivery =
            Delivery { histogram: [(1, 900), (2, 80), (3, 5), (7, 1)].into_iter().collect(), ..Default::default() };
        let svg = delivery_plot(&delivery);
        // 220 high, 34 below the axis.
        assert_eq!(x_axis_labels(&svg, 186.0), vec!["1", "2", "3", "7"]);
        assert!(svg.contains(">delivery attempt<"), "{svg}");
    }

    #[test]
    fn linear_ticks_have_at_most_two_decimals() {
        // 0.8250000000000001 is what a quarter of 1.1 × 3 came out as before.
        assert_eq!([0.0, 0.25, 0.8250000000000001, 1.0, 2.5].map(tick_label), ["0", "0.25", "0.83", "1", "2.5"]);
    }

    #[test]
    fn ticks_are_round_numbers() {
        // 4,492 applications (× 1.1 headroom) used to be ticked 1123, 2246, …
        assert_eq!(linear_ticks(0.0, 4492.0, 4, 1.0), [0.0, 1000.0, 2000.0, 3000.0, 4000.0]);
        assert_eq!(linear_ticks(0.0, 52.3, 10, 1.0), [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0]);
        // A count axis whose largest value is 1 is not ticked in fifths.
        assert_eq!(linear_ticks(0.0, 1.15, 4, 1.0), [0.0, 1.0]);
        assert_eq!(linear_ticks(0.0, 0.9, 4, 0.0).len(), 5);
    }

    fn window(fault: &str, start_s: f64, end_s: f64) -> FaultWindow {
        FaultWindow::new(fault, "worker-1", (start_s * 1e9) as u64, Some((end_s * 1e9) as u64))
    }

    #[test]
    fn fault_labels_that_would_touch_take_another_lane() {
        let frame = Frame::over_time(200.0, 60.0, 1.0, false);
        // The first window is short: its label runs past its end into the
        // second, which starts right after; the third starts well after both.
        let windows = [window("kill", 1.0, 2.0), window("pause", 2.5, 10.0), window("delay", 30.0, 35.0)];
        let (lanes, count) = fault_lanes(&frame, &windows, 60.0);
        assert_eq!(lanes, [Some(0), Some(1), Some(0)]);
        assert_eq!(count, 2);
        // Past the last lane a label is left out, not drawn over another.
        let crowded: Vec<FaultWindow> = (0..6).map(|i| window("kill", 1.0 + f64::from(i) * 0.1, 20.0)).collect();
        let (lanes, count) = fault_lanes(&frame, &crowded, 60.0);
        assert_eq!(count, FAULT_LANES_MAX);
        assert_eq!(lanes.iter().filter(|l| l.is_none()).count(), 6 - FAULT_LANES_MAX);
    }

    const FINAL_STATE: &str = r#"{"kind":"order","order_id":"o1","item_id":"i","qty":1,"event_id":"e1","deliveries":1,"duplicates_absorbed":0}
{"kind":"order","order_id":"o2","item_id":"i","qty":1,"event_id":"e2","deliveries":4,"duplicates_absorbed":3}
{"kind":"order","order_id":"o3","item_id":"i","qty":1,"event_id":"e3","deliveries":2,"duplicates_absorbed":0}
{"kind":"applied","event_id":"e1","order_id":"o1","item_id":"i","qty":1,"delivery_attempt":1,"worker_id":"w","applied_at_ms":10500}
{"kind":"applied","event_id":"e2","order_id":"o2","item_id":"i","qty":1,"delivery_attempt":1,"worker_id":"w","applied_at_ms":12250}
{"kind":"applied","event_id":"e3","order_id":"o3","item_id":"i","qty":1,"delivery_attempt":2,"worker_id":"w","applied_at_ms":14000}
{"kind":"projection","item_id":"i","reserved_qty":3}
{"kind":"meta","quiesced":true,"read_at_ns":5000000000,"run_started_at_ms":10000}
"#;

    /// Three orders, an ack-loss window from 1 s to 3 s.
    const ACK_LOSS_HISTORY: &str = r#"{"index":0,"time_ns":0,"process":0,"type":"invoke","f":"order","value":{"order_id":"o1","item_id":"i","qty":1}}
{"index":1,"time_ns":100000000,"process":0,"type":"ok","f":"order","value":{"order_id":"o1","item_id":"i","qty":1,"event_id":"e1"}}
{"index":2,"time_ns":1000000000,"process":"nemesis","type":"info","f":"start-ack-loss","value":{"target":"workers"}}
{"index":3,"time_ns":1001000000,"process":"nemesis","type":"info","f":"start-ack-loss","value":{"target":"workers","result":"ok"}}
{"index":4,"time_ns":2000000000,"process":0,"type":"invoke","f":"order","value":{"order_id":"o2","item_id":"i","qty":1}}
{"index":5,"time_ns":2100000000,"process":0,"type":"ok","f":"order","value":{"order_id":"o2","item_id":"i","qty":1,"event_id":"e2"}}
{"index":6,"time_ns":2500000000,"process":1,"type":"invoke","f":"order","value":{"order_id":"o3","item_id":"i","qty":1}}
{"index":7,"time_ns":2600000000,"process":1,"type":"ok","f":"order","value":{"order_id":"o3","item_id":"i","qty":1,"event_id":"e3"}}
{"index":8,"time_ns":3000000000,"process":"nemesis","type":"info","f":"stop-ack-loss","value":{"target":"workers"}}
{"index":9,"time_ns":3001000000,"process":"nemesis","type":"info","f":"stop-ack-loss","value":{"target":"workers","result":"ok"}}
"#;

    /// What the checker makes of a run directory of these two files.
    fn checked(history: &str, final_state: &str) -> Results {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(HISTORY_FILE), history).unwrap();
        std::fs::write(dir.path().join(FINAL_STATE_FILE), final_state).unwrap();
        haunt_checker::check_dir(dir.path()).unwrap()
    }

    #[test]
    fn applications_are_placed_on_the_history_clock() {
        let apps = applications(FINAL_STATE).unwrap();
        assert_eq!(apps.first, [0.5, 2.25]);
        assert_eq!(apps.redelivered, [4.0]);
        // e2's three duplicates, at e2's application.
        assert_eq!(apps.absorbed, [(2.25, 3)]);
        assert!(apps.absorbed_known);
    }

    #[test]
    fn without_a_meta_line_or_evidence_the_plot_says_what_is_missing() {
        let no_meta: String = FINAL_STATE.lines().filter(|l| !l.contains("meta")).map(|l| format!("{l}\n")).collect();
        assert_eq!(applications(&no_meta).unwrap_err(), NoApplications::NoClock);
        assert_eq!(applications("").unwrap_err(), NoApplications::None);
        let foreign = FINAL_STATE
            .replace(r#","deliveries":4,"duplicates_absorbed":3"#, "")
            .replace(r#","deliveries":1,"duplicates_absorbed":0"#, "");
        let foreign = foreign.replace(r#","deliveries":2,"duplicates_absorbed":0"#, "");
        let apps = applications(&foreign).unwrap();
        assert!(!apps.absorbed_known);
        assert!(apps.absorbed.is_empty());
    }

    #[test]
    fn the_deliveries_plot_counts_each_bucket() {
        let apps = applications(FINAL_STATE).unwrap();
        let results = checked(ACK_LOSS_HISTORY, FINAL_STATE);
        let svg = deliveries_plot(&apps, &results, 5.0);
        assert!(svg.contains("4 to 5 s: 1 applied on a redelivery"), "{svg}");
        assert!(svg.contains("2 to 3 s: 3 absorbed as duplicates"), "{svg}");
        assert!(svg.contains(">ack-loss workers</text>"), "{svg}");
        assert!(svg.contains(">applications per s<") && svg.contains(">redeliveries per s<"), "{svg}");
    }
}
