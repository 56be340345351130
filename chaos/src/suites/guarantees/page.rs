//! `guarantees.html`: the measured table as one self-contained page. Bars per
//! row for what was lost, delivered twice and applied twice; each row's
//! events/s against its p99 effect lag; and the fault windows of the worst
//! fault run, drawn by the run report's own plots.

use std::fmt::Write as _;
use std::path::Path;

use haunt_checker::Results;
use haunt_report::page::esc;
use haunt_report::plots::{self, TimeAxis};

use crate::suites::guarantees::table::label;
use crate::suites::guarantees::{FaultRun, Row};

fn row_name(r: &Row) -> String {
    format!("{} {}", label(r), if r.inbox { "inbox" } else { "no inbox" })
}

const LOST_COLOR: &str = "#c62828";
const DELIVERED_COLOR: &str = "#ef6c00";
const APPLIED_COLOR: &str = "#6a1b9a";

/// Three bars per row on one scale (the largest count across the table).
fn bars(rows: &[Row]) -> String {
    const LABEL_PX: usize = 230;
    const BAR_MAX_PX: f64 = 560.0;
    const BAR_PX: usize = 7;
    const ROW_PX: usize = 3 * BAR_PX + 8;
    let max = rows
        .iter()
        .flat_map(|r| [r.lost, r.delivered_more_than_once.unwrap_or(0), r.applied_more_than_once])
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let height = rows.len() * ROW_PX + 30;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">",
        LABEL_PX + BAR_MAX_PX as usize + 80
    );
    for (i, r) in rows.iter().enumerate() {
        let y = i * ROW_PX + 4;
        let _ = write!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            LABEL_PX - 6,
            y + 2 * BAR_PX,
            esc(&row_name(r))
        );
        let values = [
            (Some(r.lost), LOST_COLOR),
            (r.delivered_more_than_once, DELIVERED_COLOR),
            (Some(r.applied_more_than_once), APPLIED_COLOR),
        ];
        for (k, (value, color)) in values.into_iter().enumerate() {
            let by = y + k * BAR_PX;
            match value {
                Some(v) => {
                    let w = (v as f64 / max * BAR_MAX_PX).max(if v > 0 { 1.0 } else { 0.0 });
                    let _ = write!(
                        s,
                        "<rect x=\"{LABEL_PX}\" y=\"{by}\" width=\"{w:.1}\" height=\"{}\" fill=\"{color}\"/>\
                         <text x=\"{:.1}\" y=\"{}\" font-size=\"9\">{v}</text>",
                        BAR_PX - 1,
                        LABEL_PX as f64 + w + 3.0,
                        by + BAR_PX - 1
                    );
                }
                None => {
                    let _ = write!(
                        s,
                        "<text x=\"{}\" y=\"{}\" font-size=\"9\" fill=\"#777\">not recorded</text>",
                        LABEL_PX + 3,
                        by + BAR_PX - 1
                    );
                }
            }
        }
    }
    let ly = rows.len() * ROW_PX + 20;
    for (k, (name, color)) in [
        ("lost effects", LOST_COLOR),
        ("events delivered more than once", DELIVERED_COLOR),
        ("events applied twice", APPLIED_COLOR),
    ]
    .into_iter()
    .enumerate()
    {
        let x = LABEL_PX + k * 200;
        let _ = write!(
            s,
            "<rect x=\"{x}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{color}\"/><text x=\"{}\" y=\"{ly}\">{name}</text>",
            ly - 9,
            x + 14
        );
    }
    s.push_str("</svg>");
    s
}

/// Events/s (x) against the p99 effect lag (y), a labelled point per row.
fn scatter(rows: &[Row]) -> String {
    let points: Vec<(f64, f64, String, bool)> =
        rows.iter().filter_map(|r| Some((r.events_per_s?, r.effect_lag_ms_p99?, row_name(r), r.inbox))).collect();
    if points.is_empty() {
        return "<p>No fault-free run finished.</p>".into();
    }
    let (w, h, left, bottom, top, right) = (900.0, 420.0, 70.0, 40.0, 10.0, 200.0);
    let x_max = points.iter().map(|p| p.0).fold(0.0_f64, f64::max).max(1.0) * 1.05;
    let y_max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0) * 1.05;
    let x = |v: f64| left + v / x_max * (w - left - right);
    let y = |v: f64| h - bottom - v / y_max * (h - bottom - top);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">"
    );
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{}\" stroke=\"#444\"/>",
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for k in 0..=4 {
        let (xv, yv) = (x_max * k as f64 / 4.0, y_max * k as f64 / 4.0);
        let _ = write!(s, "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{xv:.0}</text>", x(xv), h - bottom + 14.0);
        let _ = write!(s, "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{yv:.0}</text>", left - 4.0, y(yv) + 4.0);
    }
    let _ = write!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">events/s end to end, no faults</text>",
        (left + w - right) / 2.0,
        h - 6.0
    );
    let _ = write!(
        s,
        "<text x=\"14\" y=\"{}\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">p99 effect lag, ms</text>",
        h / 2.0,
        h / 2.0
    );
    for (ex, ly, name, inbox) in &points {
        let color = if *inbox { "#1565c0" } else { "#9e9e9e" };
        let _ = write!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\">{}</text>",
            x(*ex),
            y(*ly),
            x(*ex) + 6.0,
            y(*ly) + 3.0,
            esc(name)
        );
    }
    s.push_str("</svg>");
    s
}

/// The fault run with the most lost and doubled effects (the first, on a tie).
fn worst(rows: &[Row]) -> Option<(&Row, &FaultRun)> {
    rows.iter()
        .flat_map(|r| r.runs.iter().map(move |run| (r, run)))
        .filter(|(_, run)| run.run_dir.is_some())
        .max_by_key(|(_, run)| (run.lost + run.applied_more_than_once, std::cmp::Reverse(run.seed)))
}

fn worst_run(rows: &[Row]) -> String {
    let Some((row, run)) = worst(rows) else {
        return "<p>No fault run finished.</p>".into();
    };
    let dir = run.run_dir.as_deref().unwrap_or_default();
    let results: Option<Results> = std::fs::read_to_string(Path::new(dir).join(haunt_format::RESULTS_FILE))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut h = format!(
        "<p>{}, seed {}: {} lost, {} applied twice. Run directory <code>{}</code> (its own <code>report.html</code> has the rest).</p>",
        esc(&row_name(row)),
        run.seed,
        run.lost,
        run.applied_more_than_once,
        esc(dir)
    );
    match results {
        Some(results) => {
            let axis = TimeAxis::of(&results);
            for svg in [plots::throughput(&results, &axis), plots::latency(&results, &axis)] {
                match svg {
                    Ok(svg) => h.push_str(&svg),
                    Err(e) => {
                        let _ = write!(h, "<p>plot failed: {}</p>", esc(&e.to_string()));
                    }
                }
            }
        }
        None => h.push_str("<p>Its results.json could not be read.</p>"),
    }
    h
}

fn table(rows: &[Row]) -> String {
    let mut h = String::from(
        "<table><tr><th>transport</th><th>inbox</th><th>claim</th><th>lost</th><th>delivered &gt;1</th>\
         <th>applied twice</th><th>order kept?</th><th>events/s</th><th>speed</th><th>bare events/s</th><th>p99 lag ms</th><th>reconcile</th><th>matches claim</th></tr>",
    );
    for r in rows {
        let reconcile = match &r.repaired_by_reconcile {
            Some(p) => format!(
                "{} re-enqueued, {} items corrected; after: {} lost, {} mismatched",
                p.requeued, p.projection_corrected, p.lost_after, p.projection_mismatch_after
            ),
            None if r.inbox => "–".into(),
            None => "not applicable: reconcile reads the inbox".into(),
        };
        let matches = match r.matches_claim {
            Some(true) => "<td class=\"ok\">yes</td>",
            Some(false) => "<td class=\"bad\">NO</td>",
            None => "<td>not measured</td>",
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{matches}</tr>",
            esc(&label(r)),
            if r.inbox { "yes" } else { "no" },
            r.claim,
            r.lost,
            r.delivered_more_than_once.map_or("–".into(), |d| d.to_string()),
            r.applied_more_than_once,
            esc(&super::table::order_kept(r)),
            r.events_per_s.map_or("–".into(), |e| format!("{e:.0}")),
            r.speed.map_or("–".into(), |s| format!("{s:.2}")),
            super::table::bare_rate(r),
            r.effect_lag_ms_p99.map_or("–".into(), |l| format!("{l:.0}")),
            esc(&reconcile)
        );
    }
    h.push_str("</table>");
    let findings: Vec<&Row> = rows.iter().filter(|r| r.finding.is_some()).collect();
    if !findings.is_empty() {
        h.push_str("<h2>Findings</h2><ul>");
        for r in findings {
            let _ =
                write!(h, "<li><b>{}</b>: {}</li>", esc(&row_name(r)), esc(r.finding.as_deref().unwrap_or_default()));
        }
        h.push_str("</ul>");
    }
    h
}

/// The whole page.
pub fn render(rows: &[Row], command: &str) -> String {
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>haunt guarantees</title><style>\
         body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;font-size:13px}\
         td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,th:first-child{text-align:left}\
         .ok{background:#e8f5e9}.bad{background:#ffebee;font-weight:bold}code{font-size:12px}</style></head><body>",
    );
    let _ = write!(h, "<h1>Delivery guarantees, measured</h1><p><code>{}</code></p>", esc(command));
    h.push_str(
        "<p>Every fault run of a row had the same seeded schedule: a consumer kill, a broker restart (where the \
         broker keeps data through one), a consumer&lt;-&gt;broker partition, ack loss, and a kill of the relay. \
         Lost: acknowledged orders whose effect never happened, after the queue drained and before any \
         reconciliation. Events/s: a fault-free run end to end, through the API. Speed (with <code>--speed-db</code>): \
         haunt's relay and workers over the transport's own client doing the same without the database \
         (<code>haunt bench transport</code>), the lower of the two; bare events/s: that client's rate in the \
         row's mode, published and drained.</p>",
    );
    h.push_str(&table(rows));
    h.push_str("<h2>Lost, delivered twice, applied twice</h2>");
    h.push_str(&bars(rows));
    h.push_str("<h2>Throughput against lag</h2><p>Blue: with the inbox; grey: without.</p>");
    h.push_str(&scatter(rows));
    h.push_str("<h2>The worst fault run</h2>");
    h.push_str(&worst_run(rows));
    h.push_str("</body></html>\n");
    h
}
