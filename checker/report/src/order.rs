//! The report's section on order within a key: the figures of the check,
//! the overtaken orders over time under the fault windows, and one key's
//! orders, the order they were acknowledged in against the order they took
//! effect in.

use std::error::Error;
use std::fmt::Write;

use haunt_checker::Results;
use haunt_checker::order::{Claim, KeyTrace, OrderReport};
use plotters::prelude::*;

use crate::page::esc;
use crate::plots::{
    self, LABEL_FONT, MARGIN_PX, TimeAxis, TimePlot, WIDTH_PX, X_LABEL_AREA_PX, Y_LABEL_AREA_PX, mid_s, rgb, time_plot,
};

/// Overtaken orders, and a key's orders that kept their place.
pub const OVERTAKEN_COLOR: &str = "#c62828";
const IN_PLACE_COLOR: &str = "#3949ab";

/// The section, when the results have the order check.
pub fn section(h: &mut String, results: &Results, axis: &TimeAxis) {
    let Some(order) = &results.order else { return };
    h.push_str("<h2>Order within a key</h2>");
    let claim = match order.claim {
        Claim::PerKey => {
            "The run claims each key's order (<code>per-key</code>): every overtaken order is the anomaly <code>reordered</code>."
        }
        Claim::None => "The run claims no order (<code>none</code>): overtaken orders are figures, not anomalies.",
    };
    let _ = write!(
        h,
        "<p>{claim} {} pairs of orders on one key were fixed in real time (the first acknowledged before the second \
         was placed) over {} keys; <b>{}</b> orders were overtaken by an order acknowledged before them, and {} \
         acknowledged orders were skipped (never applied while a later one on their key was).</p>",
        order.pairs_checked, order.keys, order.inversions, order.skipped
    );
    if order.inversions > 0 {
        let _ = write!(
            h,
            "<p>Of the overtaken orders, {} were overtaken by an order that took effect only on a redelivery: its first \
             delivery never took effect (a failed apply, a consumer that died or was cut off holding it) and came \
             back after the order behind it. The other {} were overtaken on first deliveries: published or delivered \
             out of order, or applied side by side by competing consumers.</p>",
            order.overtaken_after_redelivery,
            order.inversions.saturating_sub(order.overtaken_after_redelivery)
        );
        if let Some(n) = order.overtaken_in_publish {
            let _ = write!(
                h,
                "<p>By the relay's publish sequence, {n} of the overtaken orders were published ahead of the order \
                 acknowledged before them: the relay reordered those. The others were published in order.</p>"
            );
        }
    }
    if let Some(apps) = &results.series.applications
        && order.inversions > 0
    {
        h.push_str(&crate::page::figure("overtaken orders over time", overtaken(apps, results, axis)));
    }
    if let Some(trace) = &order.key_trace {
        let _ = write!(
            h,
            "<p class=\"note\">Key <code>{}</code> ({}): its orders in the order they were acknowledged \
             (x) against their place among the key's applications (y). A key whose order was kept is the diagonal; \
             an overtaken order is red, below the orders acknowledged before it.</p>",
            esc(&trace.key),
            if trace.of > trace.orders.len() as u64 {
                format!(
                    "its {}th to {}th of {} acknowledged orders, around its first overtaken one",
                    trace.from,
                    trace.from + trace.orders.len() as u64 - 1,
                    trace.of
                )
            } else {
                format!("{} acknowledged orders", trace.of)
            }
        );
        h.push_str(&crate::page::figure("one key: acknowledged against applied", key_plot(trace)));
    }
    examples(h, order);
}

/// Overtaken orders per bucket, at their first application.
fn overtaken(
    apps: &[haunt_checker::results::ApplicationsBucket],
    results: &Results,
    axis: &TimeAxis,
) -> Result<String, Box<dyn Error>> {
    let bucket_s = axis.bucket_s;
    let y_max = (apps.iter().filter_map(|b| b.overtaken).max().unwrap_or(0).max(1) as f64 * 1.15).ceil() as u64;
    let y_desc = format!("per {}", plots::width_label(bucket_s));
    let plot =
        TimePlot { height_px: 180, x_desc: "time since start (s)", y_desc: &y_desc, y_labels: 4, name_faults: true };
    time_plot(&plot, axis, &results.faults, 0u64..y_max, &u64::to_string, |chart| {
        let half = bucket_s * 0.45;
        let bars = apps.iter().filter_map(|b| {
            let n = b.overtaken.filter(|&n| n > 0)?;
            let x = mid_s(b.start_ns, axis);
            Some(Rectangle::new([(x - half, 0), (x + half, n)], rgb(OVERTAKEN_COLOR).filled()))
        });
        chart.draw_series(bars)?;
        Ok(())
    })
}

/// One key: acknowledgement rank against application rank.
fn key_plot(trace: &KeyTrace) -> Result<String, Box<dyn Error>> {
    let (from, n) = (trace.from.max(1), trace.orders.len().max(1) as u64);
    let y_lo = trace.orders.iter().map(|o| o[1]).min().unwrap_or(1).min(from);
    let y_hi = trace.orders.iter().map(|o| o[1]).max().unwrap_or(1).max(from + n - 1);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH_PX, 320)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(MARGIN_PX)
            .x_label_area_size(X_LABEL_AREA_PX)
            .y_label_area_size(Y_LABEL_AREA_PX)
            .build_cartesian_2d(from - 1..from + n, y_lo - 1..y_hi + 1)?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .x_desc("acknowledged (n-th of the key)")
            .y_desc("took effect (key_seq)")
            .label_style(("sans-serif", LABEL_FONT))
            .axis_desc_style(("sans-serif", LABEL_FONT))
            .draw()?;
        let points = |overtaken: u64, color: &str| {
            let color = rgb(color);
            trace
                .orders
                .iter()
                .enumerate()
                .filter(move |(_, o)| o[2] == overtaken)
                .map(move |(i, o)| Circle::new((from + i as u64, o[1]), 2, color.filled()))
        };
        chart.draw_series(points(0, IN_PLACE_COLOR))?;
        chart.draw_series(points(1, OVERTAKEN_COLOR))?;
        root.present()?;
    }
    Ok(svg)
}

/// The examples of each kind, as a list.
fn examples(h: &mut String, order: &OrderReport) {
    if !order.inversion_examples.is_empty() {
        h.push_str("<h3>Overtaken orders (examples)</h3><ul>");
        for ex in &order.inversion_examples {
            let _ = write!(
                h,
                "<li><code>{}</code> on key <code>{}</code> took effect {} in the key's order, before <code>{}</code> \
                 ({}), which was acknowledged before it was placed</li>",
                esc(&ex.later),
                esc(&ex.key),
                ex.later_key_seq,
                esc(&ex.earlier),
                ex.earlier_key_seq
            );
        }
        h.push_str("</ul>");
    }
    if !order.skipped_examples.is_empty() {
        h.push_str("<h3>Skipped orders (examples)</h3><ul>");
        for ex in &order.skipped_examples {
            let _ = write!(
                h,
                "<li><code>{}</code> on key <code>{}</code>: {}, while <code>{}</code>, placed after it was \
                 acknowledged, took effect</li>",
                esc(&ex.order),
                esc(&ex.key),
                esc(&ex.fate),
                esc(&ex.later)
            );
        }
        h.push_str("</ul>");
    }
}
