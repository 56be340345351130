//! The human summary `haunt check` prints: verdict first.

use std::fmt::Write;

use crate::results::{Quantiles, Results, Verdict};

pub fn render(results: &Results) -> String {
    let mut out = String::new();
    let verdict = match results.valid {
        Verdict::Valid => "VALID: no acknowledged order lost, no event applied twice",
        Verdict::Invalid => "INVALID: anomalies found",
        Verdict::Unknown => "UNKNOWN: the run cannot be decided",
    };
    let _ = writeln!(out, "{verdict}");
    for reason in &results.unknown_reasons {
        let _ = writeln!(out, "  because {reason}");
    }
    let c = &results.counts;
    let _ = writeln!(
        out,
        "\norders: {} attempted, {} acknowledged, {} failed, {} indeterminate ({} recovered)",
        c.attempted, c.acknowledged, c.failed, c.indeterminate, results.recovered
    );
    let _ = writeln!(
        out,
        "final state: {} orders present, {} events applied ({} applications), {} pending, {} dead letters",
        c.present, c.applied_events, c.applied_lines, c.pending_messages, c.dead_letters
    );
    let _ = writeln!(
        out,
        "history: {} ops ({} client, {} nemesis), {} fault windows",
        c.ops,
        c.client_ops,
        c.nemesis_ops,
        results.faults.len()
    );

    let failing: Vec<_> = results.failing_anomalies().collect();
    if failing.is_empty() {
        let _ = writeln!(out, "\nanomalies: none");
    } else {
        let _ = writeln!(out, "\nanomalies:");
        for (name, report) in failing {
            let _ = writeln!(out, "  {name}: {}", report.count);
            for ex in &report.examples {
                let subject = match (&ex.order_id, &ex.event_id, &ex.item_id) {
                    (Some(o), Some(e), _) => format!("order {o} event {e}"),
                    (Some(o), None, _) => format!("order {o}"),
                    (None, _, Some(i)) => format!("item {i}"),
                    _ => String::from("-"),
                };
                let _ = writeln!(out, "    {subject}: {}", ex.why);
            }
            if report.count as usize > report.examples.len() {
                let _ = writeln!(out, "    … and {} more", report.count as usize - report.examples.len());
            }
        }
    }

    if !results.delivery.histogram.is_empty() {
        let _ = writeln!(out, "\ndelivery attempt of each application:");
        let max = results.delivery.histogram.values().copied().max().unwrap_or(1).max(1);
        for (attempt, n) in &results.delivery.histogram {
            // Forty columns is wide enough to compare bars, narrow enough for any terminal.
            let bar = "#".repeat(((n * 40).div_ceil(max)) as usize);
            let _ = writeln!(out, "  {attempt:>3} {n:>9} {bar}");
        }
    }

    let _ = writeln!(out, "\nlatency (ms)        count      p50      p95      p99      max");
    let row = |out: &mut String, name: &str, q: &Quantiles| {
        let _ =
            writeln!(out, "  {name:<14} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>8.1}", q.count, q.p50, q.p95, q.p99, q.max);
    };
    for (outcome, q) in &results.latency_ms.ops {
        row(&mut out, &format!("op {outcome}"), q);
    }
    row(&mut out, "effect lag", &results.latency_ms.effect_lag);
    out
}
