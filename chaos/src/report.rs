//! `report.html`: one self-contained file (no network, no scripts): the verdict
//! and anomalies first, then counts, latency over time with fault windows
//! shaded, throughput, effect lag, the delivery-attempt histogram and the faults.
//! Plots are inline SVG.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use haunt_checker::{Results, Verdict};
use haunt_format::{Op, OpType, Process};

/// Points drawn in the latency plot at most; beyond that every n-th op is
/// drawn, which keeps the file small and the browser responsive.
const POINTS_MAX: usize = 20_000;

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
        "delay" => "#fff176",
        _ => "#bdbdbd",
    }
}

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
                latency_ms: (op.time_ns - t0) as f64 / 1e6,
                kind: op.kind,
            });
        }
    }
    out
}

/// Plot area and scales.
struct Frame {
    width: f64,
    height: f64,
    left: f64,
    bottom: f64,
    x_max: f64,
    y_min: f64,
    y_max: f64,
    log_y: bool,
    /// One label per unit of x, centred on it (bars of a histogram); `None`:
    /// six evenly spaced ticks of a continuous x.
    x_labels: Option<Vec<String>>,
}

/// A tick label: at most two decimals, none that are zero (`0.25`, `1`, `40`).
fn tick_label(v: f64) -> String {
    let text = format!("{v:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

impl Frame {
    const TOP: f64 = 10.0;
    const RIGHT: f64 = 10.0;

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
        self.height - self.bottom - ((v - lo) / span) * (self.height - self.bottom - Self::TOP)
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
        let (x0, x1, y0, y1) = (self.left, self.width - Self::RIGHT, self.height - self.bottom, Self::TOP);
        let _ = write!(out, r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333"/>"##);
        let _ = write!(out, r##"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/>"##);
        let x_ticks: Vec<(f64, String)> = match &self.x_labels {
            Some(labels) => labels.iter().enumerate().map(|(i, l)| (i as f64 + 0.5, l.clone())).collect(),
            None => (0..=5).map(|i| self.x_max * f64::from(i) / 5.0).map(|v| (v, format!("{v:.0}"))).collect(),
        };
        for (v, label) in x_ticks {
            let x = self.x(v);
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
            (0..=4).map(|i| self.y_min + (self.y_max - self.y_min) * f64::from(i) / 4.0).collect()
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
            r#"<text transform="translate(12 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (y0 + y1) / 2.0,
            esc(y_label)
        );
    }

    fn shade_faults(&self, out: &mut String, results: &Results, end_s: f64) {
        for w in &results.faults {
            let x0 = self.x(w.start_ns as f64 / 1e9);
            let x1 = self.x(w.end_ns.map_or(end_s, |e| e as f64 / 1e9));
            let _ = write!(
                out,
                r#"<rect x="{x0:.1}" y="{}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.25"><title>{} {}</title></rect>"#,
                Self::TOP,
                (x1 - x0).max(1.0),
                self.height - self.bottom - Self::TOP,
                fault_color(&w.fault),
                esc(&w.fault),
                esc(&w.target)
            );
        }
    }
}

fn latency_plot(points: &[Point], results: &Results, end_s: f64) -> String {
    let y_max = points.iter().map(|p| p.latency_ms).fold(1.0f64, f64::max) * 1.2;
    let frame = Frame {
        width: 900.0,
        height: 320.0,
        left: 60.0,
        bottom: 34.0,
        x_max: end_s,
        y_min: 0.1,
        y_max,
        log_y: true,
        x_labels: None,
    };
    let mut out = String::new();
    frame.open(&mut out, "client op latency over time");
    frame.shade_faults(&mut out, results, end_s);
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
    frame.axes(&mut out, "time since start (s)", "latency (ms, log)");
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
        let bucket = (p.end_s as usize).min(seconds);
        if let Some(v) = per_second.get_mut(p.kind.as_str()) {
            v[bucket] += 1.0;
        }
    }
    let y_max = per_second.values().flatten().copied().fold(1.0f64, f64::max) * 1.1;
    let frame = Frame {
        width: 900.0,
        height: 240.0,
        left: 60.0,
        bottom: 34.0,
        x_max: end_s,
        y_min: 0.0,
        y_max,
        log_y: false,
        x_labels: None,
    };
    let mut out = String::new();
    frame.open(&mut out, "completed ops per second by outcome");
    frame.shade_faults(&mut out, results, end_s);
    for kind in [OpType::Ok, OpType::Fail, OpType::Info] {
        let series = &per_second[kind.as_str()];
        let path: Vec<String> = series
            .iter()
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
    frame.axes(&mut out, "time since start (s)", "ops/s");
    out.push_str("</svg>");
    out
}

/// One bar per delivery attempt that occurs, labelled on the x axis with the
/// attempt's number, and above with how many applications it had.
fn delivery_plot(delivery: &haunt_checker::results::Delivery) -> String {
    let hist = &delivery.histogram;
    let bars = hist.len().max(1) as f64;
    let y_max = hist.values().copied().max().unwrap_or(1).max(1) as f64 * 1.1;
    let frame = Frame {
        width: 420.0,
        height: 220.0,
        left: 60.0,
        bottom: 34.0,
        x_max: bars,
        y_min: 0.0,
        y_max,
        log_y: false,
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
            frame.y(0.0) - y
        );
        let _ = write!(out, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{n}</text>"#, (x0 + x1) / 2.0, y - 3.0);
    }
    frame.axes(&mut out, "delivery attempt", "applications");
    out.push_str("</svg>");
    out
}

fn legend() -> String {
    let mut out = String::from(r#"<p class="legend">"#);
    for kind in [OpType::Ok, OpType::Fail, OpType::Info] {
        let _ = write!(out, r#"<span style="color:{}">● {}</span> "#, outcome_color(kind), kind.as_str());
    }
    for fault in ["kill", "pause", "partition", "delay", "ack-loss", "clock-skew", "db-error"] {
        let _ = write!(out, r#"<span class="swatch" style="background:{}"></span>{fault} "#, fault_color(fault));
    }
    out.push_str("</p>");
    out
}

/// The whole page. `subtitle` names the run (directory, seed, revision, options).
pub fn render(results: &Results, history: &str, subtitle: &str) -> String {
    let points = points(history);
    let end_s = points.iter().map(|p| p.end_s).fold(1.0f64, f64::max);
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
table{{border-collapse:collapse}} td,th{{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:.9em}}
.legend span{{margin-right:.8em}} .swatch{{display:inline-block;width:.9em;height:.9em;margin-right:.3em;opacity:.5}}
.sub{{color:#666;font-size:.85em}} code{{font-size:.9em}}
</style></head><body>
<h1>haunt report</h1><p class="sub">{subtitle}</p>
<p class="verdict {verdict_class}">{verdict_text}</p>"#,
        verdict = results.valid.as_str(),
        subtitle = esc(subtitle),
    );
    for reason in &results.unknown_reasons {
        let _ = write!(h, "<p>because {}</p>", esc(reason));
    }
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
    h.push_str(&legend());
    h.push_str(&latency_plot(&points, results, end_s));
    h.push_str("<h2>Throughput</h2>");
    h.push_str(&throughput_plot(&points, results, end_s));
    h.push_str("<h2>Latency and effect lag (ms)</h2><table><tr><th></th><th>count</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>");
    let mut rows: Vec<(String, &haunt_checker::results::Quantiles)> =
        results.latency_ms.ops.iter().map(|(k, q)| (format!("op {k}"), q)).collect();
    rows.push(("effect lag (ok → applied)".into(), &results.latency_ms.effect_lag));
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
    h.push_str("</table><h2>Delivery attempt of each application</h2>");
    h.push_str(&delivery_plot(&results.delivery));
    let _ = write!(h, "<p>{} events first applied on a redelivery.</p>", results.delivery.redelivered_events);
    h.push_str("<h2>Faults</h2><table><tr><th>fault</th><th>target</th><th>start (s)</th><th>end (s)</th></tr>");
    for w in &results.faults {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td></tr>",
            esc(&w.fault),
            esc(&w.target),
            w.start_ns as f64 / 1e9,
            w.end_ns.map_or("still open".to_owned(), |e| format!("{:.2}", e as f64 / 1e9))
        );
    }
    h.push_str("</table></body></html>\n");
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
        let delivery = haunt_checker::results::Delivery {
            histogram: [(1, 900), (2, 80), (3, 5), (7, 1)].into_iter().collect(),
            ..Default::default()
        };
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
}
