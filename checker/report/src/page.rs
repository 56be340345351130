//! The page around the plots: the verdict and anomalies first, then counts,
//! latency and throughput over time, the latency table, deliveries over time,
//! the delivery figures and histograms, and the faults (a row per window with
//! what it caused, and a line for every enabled fault that never fired).
//!
//! What the results or `run.json` do not hold is said, not drawn as 0.

use std::fmt::Write;

use haunt_checker::results::{Delivery, FaultWindow, Quantiles};
use haunt_checker::{Results, Verdict};

use crate::plots::{self, ABSORBED_COLOR, APPLIED_COLOR, OUTCOMES, REDELIVERED_COLOR, TimeAxis, fault_color};
use crate::run_info::RunInfo;

/// `s` made safe for HTML text and attribute values; every page of haunt's
/// (the run report, the guarantees page) escapes through this one.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A plot in its figure, named for screen readers; a plot that could not be
/// drawn says why instead.
pub(crate) fn figure(label: &str, svg: Result<String, Box<dyn std::error::Error>>) -> String {
    match svg {
        Ok(svg) => format!(r#"<figure class="plot" aria-label="{}">{svg}</figure>"#, esc(label)),
        Err(e) => {
            format!(r#"<p class="warn">The plot “{}” could not be drawn: {}</p>"#, esc(label), esc(&e.to_string()))
        }
    }
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

/// A figure that may be absent: unknown is not zero.
fn figure_or_dash(v: Option<u64>) -> String {
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
        let _ =
            write!(h, "<tr><th>{name}</th><td{class}>{}</td><td class=\"note\">{note}</td></tr>", figure_or_dash(v));
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
         <th>ops invoked inside</th><th>failed</th><th>indeterminate</th><th>events affected</th>\
         <th>events redelivered</th><th>duplicates absorbed</th><th>applied twice</th><th>op p99 inside (ms)</th>\
         <th>op p99 outside (ms)</th><th>trace</th>",
    );
    // Only with the order check: a column of overtaken orders.
    let order = results.faults.iter().any(|w| w.overtaken.is_some());
    h.push_str(if order { "<th>overtaken</th></tr>" } else { "</tr>" });
    let mut windows: Vec<&FaultWindow> = results.faults.iter().collect();
    windows.sort_by_key(|w| w.start_ns);
    for w in windows {
        let twice = if w.applied_more_than_once.unwrap_or(0) > 0 { " class=\"bad\"" } else { "" };
        let slower = if w.slower_inside() { " class=\"slow\"" } else { "" };
        let _ = write!(
            h,
            "<tr><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td><td>{}</td><td>{:.2}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td{twice}>{}</td><td{slower}>{}</td>\
             <td>{}</td><td>{}</td>",
            fault_color(&w.fault),
            esc(&w.fault),
            esc(&w.target),
            w.start_ns as f64 / 1e9,
            w.end_ns.map_or("still open".to_owned(), |e| format!("{:.2}", e as f64 / 1e9)),
            w.ops_invoked,
            figure_or_dash(w.ops_failed),
            figure_or_dash(w.ops_indeterminate),
            figure_or_dash(w.events),
            figure_or_dash(w.redelivered_events),
            figure_or_dash(w.duplicates_absorbed),
            figure_or_dash(w.applied_more_than_once),
            ms(w.latency_ms_p99),
            ms(w.latency_ms_p99_outside),
            if w.left_no_trace() { "<span class=\"na\">none</span>" } else { "" },
        );
        if order {
            let bad = if w.overtaken.unwrap_or(0) > 0 { " class=\"bad\"" } else { "" };
            let _ = write!(h, "<td{bad}>{}</td>", figure_or_dash(w.overtaken));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    h.push_str(
        "<p class=\"note\">An event is affected by a window when its life in the queue (from its order's \
         acknowledgement to its first application) overlaps it; the delivery figures are those of the affected \
         events. A window whose median latency is more than twice the median outside every window, and above the p99 \
         outside, was slow, and is shaded. A window \
         left no trace (<em>none</em>) when it ended and nothing inside it failed, went indeterminate, was slow, \
         or was delivered again: a kill or pause that caught no delivery in flight, or a fault the pipeline \
         withstood. – : not in this run directory's results.</p>",
    );
    h
}

/// The enabled faults that never fired, one warning each; nothing when
/// `run.json` does not say which faults were enabled.
fn never_fired(run: &RunInfo) -> String {
    let faults = run.never_fired().unwrap_or_default();
    if faults.is_empty() {
        return String::new();
    }
    let mut h = String::from("<div class=\"warn\">");
    for fault in faults {
        let _ = write!(
            h,
            "<div class=\"never-fired\">{} was enabled but never fired: this run says nothing about it.</div>",
            esc(&fault)
        );
    }
    h.push_str("</div>");
    h
}

/// The buckets of the redeliveries plot that hold anything, as a table: the
/// exact figures behind its bars.
fn redeliveries_table(bars: &[plots::Bar], absorbed_known: bool) -> String {
    if bars.is_empty() {
        return "<p class=\"note\">No application came on a redelivery and no duplicate was absorbed.</p>".to_owned();
    }
    let mut h = String::from(
        "<details><summary>the figures behind the bars</summary><table class=\"redeliveries\">\
         <tr><th>from (s)</th><th>to (s)</th><th>applied on a redelivery</th><th>duplicates absorbed</th></tr>",
    );
    for (start_s, end_s, redelivered, absorbed) in bars {
        let absorbed = if absorbed_known { absorbed.to_string() } else { r#"<span class="na">–</span>"#.to_owned() };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{redelivered}</td><td>{absorbed}</td></tr>",
            plots::seconds(*start_s),
            plots::seconds(*end_s)
        );
    }
    h.push_str("</table></details>");
    h
}

const STYLE: &str = "
body{font-family:sans-serif;margin:2em;max-width:960px;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em}
figure.plot{margin:0}
.verdict{padding:.6em 1em;border-radius:4px;font-weight:bold}
.valid{background:#e8f5e9;color:#1b5e20} .invalid{background:#ffebee;color:#b71c1c} .unknown{background:#fff8e1;color:#e65100}
.warn{background:#fff8e1;color:#8a4b00;padding:.4em .8em;margin:1em 0;border-left:4px solid #ef6c00;line-height:1.5}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;font-size:.9em}
table.faults td,table.faults th{text-align:right} table.faults td:nth-child(-n+2),table.faults th:nth-child(-n+2){text-align:left}
table.faults th{vertical-align:bottom;max-width:6em} table.faults td{white-space:nowrap;font-size:.85em}
td.bad{background:#ffebee;color:#b71c1c;font-weight:bold} td.slow{background:#fff3e0}
.legend{font-size:.9em;line-height:1.6} .legend .key{margin-right:1.1em;white-space:nowrap}
.swatch{display:inline-block;width:.9em;height:.9em;margin-right:.3em;vertical-align:-.1em;opacity:.6}
.sub{color:#666;font-size:.85em} .note{color:#666;font-size:.85em} .na{color:#999} code{font-size:.9em}
";

fn anomalies(h: &mut String, results: &Results) {
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
}

fn counts(h: &mut String, results: &Results) {
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
}

fn latency_table(h: &mut String, results: &Results) {
    h.push_str(
        "<h2>Latency and effect lag (ms)</h2><table><tr><th></th><th>count</th><th>p50</th><th>p95</th><th>p99</th><th>max</th></tr>",
    );
    let mut rows: Vec<(String, &Quantiles)> =
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
    h.push_str("</table>");
}

fn deliveries(h: &mut String, results: &Results, axis: &TimeAxis) {
    h.push_str("<h2>Deliveries over time</h2>");
    let absorbed_known = results.delivery.duplicates_absorbed.is_some();
    match &results.series.applications {
        _ if results.counts.applied_lines == 0 => h.push_str("<p>No application in the final state.</p>"),
        None => h.push_str(
            "<p>The final state has no <code>meta</code> line with <code>run_started_at_ms</code>, so its \
             applications cannot be placed on the history's clock.</p>",
        ),
        Some(apps) => {
            let mut series =
                vec![(APPLIED_COLOR, "━", "applications (all)"), (REDELIVERED_COLOR, "■", "applied on a redelivery")];
            if absorbed_known {
                series.push((
                    ABSORBED_COLOR,
                    "■",
                    "duplicates absorbed by the inbox, at the application they repeated",
                ));
            }
            h.push_str(&legend(&series, results));
            let bars = plots::redelivery_bars(apps, results.series.bucket_ns, axis);
            match plots::deliveries(apps, results, axis, &bars) {
                Ok((all, rare)) => {
                    h.push_str(&figure("applications over time", Ok(all)));
                    h.push_str(&figure("redeliveries and absorbed duplicates over time", Ok(rare)));
                }
                Err(e) => h.push_str(&figure("deliveries over time", Err(e))),
            }
            h.push_str(&redeliveries_table(&bars, absorbed_known));
            if !absorbed_known {
                h.push_str(
                    "<p class=\"note\">The final state does not record the duplicates the inbox absorbed, so none are drawn.</p>",
                );
            }
        }
    }
    h.push_str("<h3>Delivery figures</h3>");
    h.push_str(&delivery_table(&results.delivery));
    h.push_str("<h2>Delivery attempt of each application</h2>");
    if results.delivery.histogram.is_empty() {
        h.push_str("<p>No application in the final state.</p>");
    } else {
        let svg = plots::histogram(&results.delivery.histogram, "delivery attempt", "applications");
        h.push_str(&figure("applications by delivery attempt", svg));
    }
    h.push_str("<h2>Deliveries of each event</h2>");
    match &results.delivery.events_by_deliveries {
        Some(events) => {
            let svg = plots::histogram(events, "deliveries of the event", "events");
            h.push_str(&figure("events by their number of deliveries", svg));
        }
        None => h.push_str(
            "<p class=\"note\">The final state records no delivery evidence (<code>deliveries</code> on its \
             order lines), so how often each event was delivered is not known.</p>",
        ),
    }
}

fn faults(h: &mut String, results: &Results, run: &RunInfo, never: &str) {
    h.push_str("<h2>Faults</h2>");
    match (&run.faults_fired, &run.faults_enabled) {
        (Some(fired), _) => {
            let list: Vec<String> = fired.iter().map(|(f, n)| format!("{} ×{n}", esc(f))).collect();
            let _ = write!(h, "<p>Enabled faults, and how often each started: {}.</p>", list.join(", "));
        }
        (None, Some(enabled)) => {
            let list: Vec<String> = enabled.iter().map(|f| esc(f)).collect();
            let _ = write!(
                h,
                "<p>Enabled faults: {}. <code>run.json</code> does not say how often each started.</p>",
                if list.is_empty() { "none".to_owned() } else { list.join(", ") }
            );
        }
        (None, None) => {}
    }
    h.push_str(never);
    if results.faults.is_empty() {
        h.push_str("<p>No fault window in the history.</p>");
    } else {
        h.push_str(&faults_table(results));
    }
}

/// The whole page.
pub fn render(results: &Results, run: &RunInfo) -> String {
    let axis = TimeAxis::of(results);
    let verdict_class = match results.valid {
        Verdict::Valid => "valid",
        Verdict::Invalid => "invalid",
        Verdict::Unknown => "unknown",
    };
    let verdict_text = haunt_checker::summary::headline(results);
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>haunt report: {verdict}</title><style>{STYLE}</style></head><body>
<h1>haunt report</h1><p class="sub">{subtitle}</p>
<p class="verdict {verdict_class}">{verdict_text}</p>"#,
        verdict = results.valid.as_str(),
        subtitle = esc(&run.subtitle),
    );
    for reason in &results.unknown_reasons {
        let _ = write!(h, "<p>because {}</p>", esc(reason));
    }
    if let Some(note) = haunt_checker::summary::no_ledger(results) {
        let _ = write!(h, r#"<div class="never-fired">{}</div>"#, esc(&note));
    }
    let never = never_fired(run);
    h.push_str(&never);
    anomalies(&mut h, results);
    counts(&mut h, results);
    let outcomes = |glyph: &'static str| -> Vec<(&str, &str, &str)> {
        OUTCOMES.iter().map(|(name, color)| (*color, glyph, *name)).collect()
    };
    let bucket = plots::width_label(axis.bucket_s);
    h.push_str("<h2>Latency over time</h2>");
    h.push_str(&legend(&outcomes("━"), results));
    let _ = write!(
        h,
        "<p class=\"note\">Per {bucket} of invokes: the p99 of the ops' latency (line), the slowest (dots), and for \
         <code>ok</code> the p50 (thin line). An invoke that never completed has no latency and is not drawn.</p>"
    );
    h.push_str(&figure("client op latency over time", plots::latency(results, &axis)));
    h.push_str("<h2>Throughput</h2>");
    h.push_str(&legend(&outcomes("━"), results));
    h.push_str(&figure("ops invoked per second by outcome", plots::throughput(results, &axis)));
    latency_table(&mut h, results);
    deliveries(&mut h, results, &axis);
    crate::order::section(&mut h, results, &axis);
    faults(&mut h, results, run, &never);
    h.push_str("</body></html>\n");
    h
}
