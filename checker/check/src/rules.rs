//! The anomaly definitions of `RUN-FORMAT.md` and the verdict rules.
//!
//! One reading of the contract needs stating. `projection-mismatch` compares the
//! projection with the orders "that are neither pending nor dead_letter"; an
//! order whose event was applied but whose message is still queued or parked (an
//! ack lost on the last allowed delivery) has its effect in the projection, so it
//! is counted with the applied orders. Reading the rule literally would fail a
//! correct system whose acks were lost.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::final_state::FinalFold;
use crate::history::HistoryFold;
use crate::results::{ANOMALIES, AnomalyReport, Counts, Delivery, EXAMPLES_MAX, Example, Latency, Results, Verdict};
use crate::stats::quantiles;

#[derive(Debug, Default)]
struct Anomalies {
    reports: BTreeMap<String, AnomalyReport>,
}

impl Anomalies {
    fn new() -> Self {
        let reports = ANOMALIES.iter().map(|name| (name.to_string(), AnomalyReport::default())).collect();
        Anomalies { reports }
    }

    fn add(&mut self, name: &str, example: Example) {
        let report = self.reports.get_mut(name).expect("anomaly names come from ANOMALIES");
        report.count += 1;
        if let Some(t) = example.time_ns {
            report.first_time_ns = Some(report.first_time_ns.map_or(t, |f| f.min(t)));
        }
        if report.examples.len() < EXAMPLES_MAX {
            report.examples.push(example);
        }
    }
}

/// Decides the run. `final_state` is `None` when the run directory has none.
pub fn check(history: &HistoryFold, final_state: Option<&FinalFold>) -> Results {
    let empty = FinalFold::default();
    let fs = final_state.unwrap_or(&empty);
    let mut anomalies = Anomalies::new();
    let time_of = |order_id: &str| history.order(order_id).map(|o| o.first_invoke_ns);
    let example = |order_id: &str, event_id: Option<&str>, why: String| Example {
        order_id: Some(order_id.to_owned()),
        event_id: event_id.map(str::to_owned),
        item_id: None,
        time_ns: time_of(order_id),
        why,
    };

    // Presence as an effect counts too: an applied line whose order row is gone.
    let mut applied_order_ids: HashSet<&str> = HashSet::new();
    for (_, lines) in &fs.applied {
        for a in lines {
            applied_order_ids.insert(a.order_id.as_str());
        }
    }

    // Judged from the history's side: what the clients were told.
    if final_state.is_some() {
        for order in &history.orders {
            let row = fs.order(&order.order_id);
            if order.acknowledged() && row.is_none() {
                anomalies.add(
                    "lost-order",
                    example(
                        &order.order_id,
                        order.event_id(),
                        format!(
                            "acknowledged ({} ok of {} attempts) but absent from the final orders",
                            order.ok, order.attempts
                        ),
                    ),
                );
            }
            if order.failed() && (row.is_some() || applied_order_ids.contains(order.order_id.as_str())) {
                let what = if row.is_some() { "its order row" } else { "an applied effect" };
                anomalies.add(
                    "failed-but-present",
                    example(
                        &order.order_id,
                        row.map(|r| r.event_id.as_str()),
                        format!("all {} attempts failed, yet the final state holds {what}", order.attempts),
                    ),
                );
            }
        }
    }

    // Judged from the final state's side: every order row and every applied line.
    let mut unexpected: HashSet<&str> = HashSet::new();
    for row in fs.orders.iter().chain(&fs.repeated_orders) {
        if history.order(&row.order_id).is_none() {
            if unexpected.insert(row.order_id.as_str()) {
                anomalies.add(
                    "unexpected-effect",
                    example(&row.order_id, Some(&row.event_id), "order present but never invoked".into()),
                );
            }
        }
    }
    for row in &fs.repeated_orders {
        if unexpected.insert(row.order_id.as_str()) {
            anomalies.add(
                "unexpected-effect",
                example(&row.order_id, Some(&row.event_id), "order present more than once".into()),
            );
        }
    }
    for row in &fs.orders {
        let applied = fs.applied_for(&row.event_id);
        if applied.is_empty() && !fs.pending.contains_key(&row.event_id) && !fs.dead_letters.contains_key(&row.event_id)
        {
            anomalies.add(
                "lost-effect",
                example(
                    &row.order_id,
                    Some(&row.event_id),
                    "order present but its event was never applied, is not queued and not dead-lettered".into(),
                ),
            );
        }
    }
    for (event_id, lines) in &fs.applied {
        if lines.len() > 1 {
            let attempts: Vec<String> = lines.iter().map(|a| a.delivery_attempt.to_string()).collect();
            let workers: BTreeSet<&str> = lines.iter().map(|a| a.worker_id.as_str()).collect();
            anomalies.add(
                "double-applied",
                example(
                    &lines[0].order_id,
                    Some(event_id),
                    format!(
                        "applied {} times (delivery attempts {}; workers {})",
                        lines.len(),
                        attempts.join(", "),
                        workers.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                ),
            );
        }
        for a in lines {
            let why = match (history.order(&a.order_id), fs.order(&a.order_id)) {
                (None, _) => Some("applied for an order that was never invoked".to_owned()),
                // Reported as lost-order or failed-but-present; not counted again.
                (Some(o), None) if !o.indeterminate() => None,
                (Some(_), None) => Some("applied, but the order is absent from the final orders".to_owned()),
                (Some(_), Some(row)) => {
                    let mut diffs = Vec::new();
                    if row.event_id != a.event_id {
                        diffs.push(format!("event_id {} (order has {})", a.event_id, row.event_id));
                    }
                    if row.item_id != a.item_id {
                        diffs.push(format!("item_id {} (order has {})", a.item_id, row.item_id));
                    }
                    if row.qty != a.qty {
                        diffs.push(format!("qty {} (order has {})", a.qty, row.qty));
                    }
                    (!diffs.is_empty()).then(|| format!("applied line does not match its order: {}", diffs.join(", ")))
                }
            };
            if let Some(why) = why {
                if unexpected.insert(a.order_id.as_str()) {
                    anomalies.add("unexpected-effect", example(&a.order_id, Some(&a.event_id), why));
                }
            }
        }
    }

    // The projection against both of its sources.
    let mut items: BTreeMap<&str, (i64, i64)> = BTreeMap::new(); // item -> (applied sum, orders sum)
    for (_, lines) in &fs.applied {
        for a in lines {
            items.entry(a.item_id.as_str()).or_default().0 += a.qty;
        }
    }
    for row in &fs.orders {
        let parked = fs.pending.contains_key(&row.event_id) || fs.dead_letters.contains_key(&row.event_id);
        let entry = items.entry(row.item_id.as_str()).or_default();
        if !parked || !fs.applied_for(&row.event_id).is_empty() {
            entry.1 += row.qty;
        }
    }
    for item in fs.projection.keys() {
        items.entry(item.as_str()).or_default();
    }
    for (item, (applied_sum, orders_sum)) in items {
        let reserved = fs.projection.get(item).copied().unwrap_or(0);
        if reserved != applied_sum || reserved != orders_sum {
            anomalies.add(
                "projection-mismatch",
                Example {
                    order_id: None,
                    event_id: None,
                    item_id: Some(item.to_owned()),
                    time_ns: None,
                    why: format!(
                        "reserved_qty {reserved}, but applied effects sum to {applied_sum} \
                         and the orders to {orders_sum}"
                    ),
                },
            );
        }
    }

    // Reported, not failures.
    let mut recovered = 0;
    let mut dead_lettered = 0;
    let mut pending = 0;
    for row in &fs.orders {
        if fs.dead_letters.contains_key(&row.event_id) {
            dead_lettered += 1;
        }
        if fs.pending.contains_key(&row.event_id) {
            pending += 1;
        }
        if let Some(order) = history.order(&row.order_id) {
            if order.indeterminate() && fs.applied_for(&row.event_id).len() == 1 {
                recovered += 1;
            }
        }
    }

    let counts = Counts {
        ops: history.ops,
        client_ops: history.client_ops,
        nemesis_ops: history.nemesis_ops,
        attempted: history.orders.len() as u64,
        acknowledged: history.orders.iter().filter(|o| o.acknowledged()).count() as u64,
        failed: history.orders.iter().filter(|o| o.failed()).count() as u64,
        indeterminate: history.orders.iter().filter(|o| o.indeterminate()).count() as u64,
        open_invokes: history.open_invokes,
        present: fs.orders.len() as u64,
        applied_events: fs.applied.len() as u64,
        applied_lines: fs.applied_lines,
        pending_messages: fs.pending_lines,
        dead_letters: fs.dead_letter_lines,
    };

    let mut delivery = Delivery::default();
    for (_, lines) in &fs.applied {
        for a in lines {
            *delivery.histogram.entry(a.delivery_attempt).or_default() += 1;
        }
        if lines.iter().map(|a| a.delivery_attempt).min().unwrap_or(1) > 1 {
            delivery.redelivered_events += 1;
        }
    }

    let latency_ms = latency(history, fs);

    let failing = anomalies.reports.values().any(|r| r.count > 0);
    let mut unknown_reasons = Vec::new();
    if final_state.is_none() {
        unknown_reasons.push("the final state is missing".to_owned());
    } else if fs.truncated {
        unknown_reasons.push("the final state is truncated".to_owned());
    }
    if history.truncated {
        unknown_reasons.push("the history is truncated".to_owned());
    }
    if final_state.is_some() && fs.pending_lines > 0 {
        match &fs.meta {
            Some(meta) if meta.quiesced => {}
            Some(_) => {
                unknown_reasons.push(format!("the queue did not drain: {} messages still pending", fs.pending_lines))
            }
            None => unknown_reasons
                .push(format!("{} messages pending and no meta line says the queue had drained", fs.pending_lines)),
        }
    }
    let valid = if failing {
        Verdict::Invalid
    } else if !unknown_reasons.is_empty() {
        Verdict::Unknown
    } else {
        Verdict::Valid
    };
    if valid != Verdict::Unknown {
        unknown_reasons.clear();
    }

    Results {
        valid,
        unknown_reasons,
        counts,
        anomalies: anomalies.reports,
        recovered,
        dead_lettered,
        pending,
        delivery,
        latency_ms,
        faults: history.faults.clone(),
    }
}

fn latency(history: &HistoryFold, fs: &FinalFold) -> Latency {
    const NS_PER_MS: f64 = 1e6;
    let to_ms = |v: &[f64]| v.iter().map(|ns| ns / NS_PER_MS).collect::<Vec<_>>();
    let mut ops = BTreeMap::new();
    for (name, values) in
        [("ok", &history.latency_ok_ns), ("fail", &history.latency_fail_ns), ("info", &history.latency_info_ns)]
    {
        ops.insert(name.to_owned(), quantiles(&mut to_ms(values)));
    }

    let mut lags = Vec::new();
    if let Some(meta) = &fs.meta {
        let first_applied: HashMap<&str, i64> = fs
            .applied
            .iter()
            .filter_map(|(e, lines)| lines.iter().map(|a| a.applied_at_ms).min().map(|t| (e.as_str(), t)))
            .collect();
        for order in &history.orders {
            let (Some(ok_ns), Some(row)) = (order.first_ok_ns, fs.order(&order.order_id)) else {
                continue;
            };
            if let Some(&applied_at_ms) = first_applied.get(row.event_id.as_str()) {
                let applied_ms = (applied_at_ms - meta.run_started_at_ms) as f64;
                lags.push(applied_ms - ok_ns as f64 / NS_PER_MS);
            }
        }
    }
    Latency { ops, effect_lag: quantiles(&mut lags) }
}
