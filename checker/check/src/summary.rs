//! The human summary `haunt check` prints: verdict first.

use std::fmt::Write;

use crate::results::{Delivery, FaultWindow, Quantiles, Results, Verdict};

/// The delivery evidence in one line, when the final state carries it: how
/// often the queue redelivered, how much of it the inbox absorbed, and whether
/// anything got through twice.
fn delivery_line(d: &Delivery) -> Option<String> {
    let (redeliveries, max) = (d.redeliveries?, d.deliveries_max?);
    let mut line = format!("{} redeliveries", thousands(redeliveries));
    if let Some(events) = d.redelivered_events {
        line.push_str(&format!(" of {} events", thousands(events)));
    }
    if let Some(absorbed) = d.duplicates_absorbed {
        // A redelivery the inbox did not absorb came after a delivery that
        // never finished (a kill, a pause, a lost lease, a failed transaction).
        let unfinished = redeliveries.saturating_sub(absorbed);
        line.push_str(&format!(
            ": {} absorbed by the inbox, {} after a delivery that never finished",
            thousands(absorbed),
            thousands(unfinished)
        ));
    }
    line.push_str(&format!("; {} applied more than once", thousands(d.applied_more_than_once)));
    let most = match (max, d.delivered_three_times_or_more) {
        (0, _) => "no event was delivered".to_owned(),
        (1, _) => "no event took more than one delivery".to_owned(),
        (n, Some(1)) => format!("one event delivered {} times", thousands(n)),
        (n, Some(three)) if three > 1 => {
            format!("{} events delivered 3 or more times, one {} times", thousands(three), thousands(n))
        }
        (n, _) => format!("one event took {} deliveries", thousands(n)),
    };
    Some(format!("{line}; {most}"))
}

/// Each fault window and what the record shows of it, by start; the windows
/// that left no trace are marked and named in the heading.
fn faults_table(out: &mut String, results: &Results) {
    if results.faults.is_empty() {
        return;
    }
    let mut windows: Vec<&FaultWindow> = results.faults.iter().collect();
    windows.sort_by_key(|w| w.start_ns);
    let quiet: Vec<String> =
        windows.iter().filter(|w| w.left_no_trace()).map(|w| format!("{} {}", w.fault, w.target)).collect();
    let _ = match quiet.len() {
        0 => writeln!(out, "\nfaults: every window left a trace in the record"),
        n => writeln!(
            out,
            "\nfaults: {n} of {} windows left no trace in the record: {}",
            windows.len(),
            quiet.join(", ")
        ),
    };
    // With the order check, a column of the orders overtaken in each window.
    let order = windows.iter().any(|w| w.overtaken.is_some());
    let _ = writeln!(
        out,
        "  {:<28} {:>13} {:>6} {:>6} {:>6} {:>8} {:>7} {:>7} {:>8} {:>5}{}",
        "fault target",
        "from-to (s)",
        "ops",
        "failed",
        "indet",
        "p99 ms",
        "events",
        "redeliv",
        "absorbed",
        "twice",
        if order { " overtaken" } else { "" }
    );
    let figure = |n: Option<u64>| n.map_or("-".to_owned(), thousands);
    for w in &windows {
        let span = match w.end_ns {
            Some(end) => format!("{:.1}-{:.1}", w.start_ns as f64 / 1e9, end as f64 / 1e9),
            None => format!("{:.1}-open", w.start_ns as f64 / 1e9),
        };
        let _ = writeln!(
            out,
            "  {:<28} {span:>13} {:>6} {:>6} {:>6} {:>8} {:>7} {:>7} {:>8} {:>5}{}{}",
            format!("{} {}", w.fault, w.target),
            thousands(w.ops_invoked),
            figure(w.ops_failed),
            figure(w.ops_indeterminate),
            w.latency_ms_p99.map_or("-".to_owned(), |ms| format!("{ms:.1}")),
            figure(w.events),
            figure(w.redelivered_events),
            figure(w.duplicates_absorbed),
            figure(w.applied_more_than_once),
            if order { format!(" {:>9}", figure(w.overtaken)) } else { String::new() },
            if w.left_no_trace() { "  no trace" } else { "" },
        );
    }
    if let Some(outside) = results.faults.iter().find_map(|w| w.latency_ms_p99_outside) {
        let _ = writeln!(out, "  (p99 of the ops outside every window: {outside:.1} ms)");
    }
    let led: Vec<String> = windows
        .iter()
        .filter_map(|w| {
            Some(format!(
                "  {} {} at {:.1} s: {}",
                w.fault,
                w.target,
                w.start_ns as f64 / 1e9,
                led(w.leaders.as_ref()?)?
            ))
        })
        .collect();
    if !led.is_empty() {
        let _ = writeln!(out, "partition leaders as each fault struck:");
        for line in led {
            let _ = writeln!(out, "{line}");
        }
    }
}

/// `{"broker-2": [0, 3]}` as "broker-2 led 0,3"; `None` if not that shape.
fn led(leaders: &serde_json::Value) -> Option<String> {
    let nodes: Vec<String> = leaders
        .as_object()?
        .iter()
        .map(|(node, parts)| {
            let parts: Vec<String> = parts.as_array().into_iter().flatten().map(ToString::to_string).collect();
            format!("{node} led {}", parts.join(","))
        })
        .collect();
    Some(nodes.join("; "))
}

/// What the order check found, in one line.
fn order_line(o: &crate::order::OrderReport) -> String {
    let mut line = format!(
        "order: {} pairs fixed in real time checked over {} keys, {} orders overtaken",
        thousands(o.pairs_checked),
        thousands(o.keys),
        thousands(o.inversions)
    );
    if let Some(ex) = o.inversion_examples.first() {
        line.push_str(&format!(
            " (first: {} before {} on {}; {} behind an order that took effect only on a redelivery{})",
            ex.later,
            ex.earlier,
            ex.key,
            thousands(o.overtaken_after_redelivery),
            o.overtaken_in_publish.map_or(String::new(), |n| format!(
                ", {} published by the relay ahead of the order acknowledged before them",
                thousands(n)
            ))
        ));
    }
    line.push_str(&format!(", {} skipped", thousands(o.skipped)));
    line.push_str(match o.claim {
        crate::order::Claim::PerKey => " (order claimed per key: an overtaken order is reordered)",
        crate::order::Claim::None => " (no order claimed: figures)",
    });
    line
}

/// `1204` as `1,204`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The verdict in words, the first line of the summary and of the report.
pub fn headline(results: &Results) -> &'static str {
    match results.valid {
        Verdict::Valid if !results.ledger => {
            "VALID, from the projection alone: every item's projection matches its orders"
        }
        Verdict::Valid => "VALID: no acknowledged order lost, no event applied twice",
        Verdict::Invalid => "INVALID: anomalies found",
        Verdict::Unknown => "UNKNOWN: the run cannot be decided",
    }
}

/// What the verdict could not look at because the system keeps no ledger, if so.
pub fn no_ledger(results: &Results) -> Option<String> {
    (!results.ledger).then(|| {
        format!(
            "no ledger: the system keeps no record of each application, so per-event anomalies were not \
             available ({} not evaluated); the projection was compared with the orders alone, where an effect \
             lost and another applied twice on the same item cancel out",
            results.not_evaluated.join(", ")
        )
    })
}

pub fn render(results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", headline(results));
    for reason in &results.unknown_reasons {
        let _ = writeln!(out, "  because {reason}");
    }
    if let Some(note) = no_ledger(results) {
        let _ = writeln!(out, "  {note}");
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

    if let Some(line) = delivery_line(&results.delivery) {
        let _ = writeln!(out, "delivery: {line}");
    }
    if let Some(order) = &results.order {
        let _ = writeln!(out, "{}", order_line(order));
    }
    faults_table(&mut out, results);

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
                    (None, _, Some(i)) => match &ex.direction {
                        Some(d) => format!("item {i} ({d})"),
                        None => format!("item {i}"),
                    },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_204), "1,204");
        assert_eq!(thousands(12_345_678), "12,345,678");
    }

    #[test]
    fn the_delivery_line_needs_the_evidence() {
        let mut d = Delivery { applied_more_than_once: 0, ..Delivery::default() };
        assert_eq!(delivery_line(&d), None);
        d.deliveries = Some(5_204);
        d.redeliveries = Some(1_204);
        d.deliveries_max = Some(5);
        d.duplicates_absorbed = Some(1_190);
        d.redelivered_events = Some(1_100);
        d.delivered_three_times_or_more = Some(40);
        assert_eq!(
            delivery_line(&d).unwrap(),
            "1,204 redeliveries of 1,100 events: 1,190 absorbed by the inbox, 14 after a delivery that never \
             finished; 0 applied more than once; 40 events delivered 3 or more times, one 5 times"
        );
        d.delivered_three_times_or_more = Some(0);
        d.deliveries_max = Some(2);
        assert!(delivery_line(&d).unwrap().ends_with("; one event took 2 deliveries"));
        d.duplicates_absorbed = None;
        d.redelivered_events = None;
        d.deliveries_max = Some(1);
        d.redeliveries = Some(0);
        assert_eq!(
            delivery_line(&d).unwrap(),
            "0 redeliveries; 0 applied more than once; no event took more than one delivery"
        );
    }
}
