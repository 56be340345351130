//! The anomaly definitions of `docs/run-format.md` and the verdict rules, over
//! the folded run.
//!
//! `projection-mismatch` compares the projection with the present orders that
//! are not dead letters and are either not pending or already applied. The
//! second half is for an order whose event was applied but whose message is
//! still queued (its ack was lost and the run ended before the redelivery): its
//! effect is in the projection, and leaving it out would fail a correct system
//! whose acks were lost. A dead letter is left out even when applied: a message
//! is parked because its event could not be applied, so an applied event that
//! is also parked is a mismatch (a correct consumer acks a message whose event
//! its inbox already holds instead of parking it).
//!
//! A truncated final state proves nothing by absence: the rules that rest on a
//! line being absent ([`ABSENCE_RULES`]) are not evaluated, the others are.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::fold::{Fold, Order};
use crate::key::Key;
use crate::order::{Claim, OrderReport, REORDERED};
use crate::results::{ANOMALIES, AnomalyReport, Counts, Delivery, EXAMPLES_MAX, Example, Latency, Results, Verdict};
use crate::series::ApplicationSeries;
use crate::stats::{quantiles, quantiles_of};
use crate::windows::Attribution;

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

fn example(fold: &Fold, order: &Order, event_id: Option<Key>, why: String) -> Example {
    Example {
        order_id: Some(fold.text(order.id)),
        event_id: event_id.map(|e| fold.text(e)),
        item_id: None,
        time_ns: order.invoked.then_some(order.first_invoke_ns),
        direction: None,
        why,
    }
}

/// Per-order counts, gathered in the one pass over the orders.
#[derive(Debug, Default)]
struct Tally {
    attempted: u64,
    acknowledged: u64,
    failed: u64,
    indeterminate: u64,
    present: u64,
    applied_events: u64,
    redelivered: u64,
    recovered: u64,
    dead_lettered: u64,
    pending: u64,
    applied_more_than_once: u64,
    /// From the rows that carry `deliveries`; `None` when none does.
    deliveries: Option<DeliveryTally>,
    /// The sum of `duplicates_absorbed`; `None` when no row carries it.
    duplicates_absorbed: Option<u64>,
    /// Events by their `deliveries`; `None` when no row carries it.
    events_by_deliveries: Option<BTreeMap<u32, u64>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct DeliveryTally {
    total: u64,
    redeliveries: u64,
    more_than_once: u64,
    three_or_more: u64,
    max: u64,
}

impl Tally {
    fn count(&mut self, o: &Order) {
        if o.invoked {
            self.attempted += 1;
            self.acknowledged += u64::from(o.acknowledged());
            self.failed += u64::from(o.failed());
            self.indeterminate += u64::from(o.indeterminate());
        }
        if o.applied.count > 0 {
            self.applied_events += 1;
            self.redelivered += u64::from(o.applied.min_attempt > 1);
            self.applied_more_than_once += u64::from(o.applied.count > 1);
        }
        if let Some(row) = &o.row {
            if let Some(d) = row.deliveries.get() {
                *self.events_by_deliveries.get_or_insert_default().entry(d).or_default() += 1;
                let d = u64::from(d);
                let t = self.deliveries.get_or_insert_default();
                t.total += d;
                t.redeliveries += d.saturating_sub(1);
                t.more_than_once += u64::from(d > 1);
                t.three_or_more += u64::from(d > 2);
                t.max = t.max.max(d);
            }
            if let Some(d) = row.duplicates_absorbed.get() {
                *self.duplicates_absorbed.get_or_insert_default() += u64::from(d);
            }
            self.present += 1;
            self.dead_lettered += u64::from(o.dead);
            self.pending += u64::from(o.pending);
            self.recovered += u64::from(o.indeterminate() && o.applied.count == 1);
        }
    }
}

/// The anomalies that rest on a line being absent from the final state, which
/// a truncated final state cannot show.
pub const ABSENCE_RULES: [&str; 3] = ["lost-order", "lost-effect", "projection-mismatch"];

/// The rules that need a ledger of applications (`applied` lines): without one
/// (`"ledger": false` on the meta line) they are not evaluated, and the
/// projection is judged against the orders alone.
pub const LEDGER_RULES: [&str; 2] = ["lost-effect", "double-applied"];

/// The rules that need every message the system still holds named: with
/// `unlisted` above 0 on the meta line they are not evaluated.
pub const UNLISTED_RULES: [&str; 2] = ["lost-effect", "projection-mismatch"];

/// An item's sums: the applied effects, the orders whose effect must be in,
/// and, without a ledger, the orders still queued, whose effect may or may not be.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    applied: i128,
    orders: i128,
    maybe: i128,
}

/// Adds an order's qty to its item's sums, if it has a row.
fn sum_order(sums: &mut [Option<Sums>], o: &Order, ledger: bool) {
    if let Some(row) = &o.row {
        let entry = sums[row.item as usize].get_or_insert_default();
        // Pending but applied (its ack lost): its effect is in; parked: it must not be.
        if !o.dead && (!o.pending || o.applied.count > 0) {
            entry.orders += i128::from(row.qty);
        } else if !o.dead && !ledger {
            entry.maybe += i128::from(row.qty);
        }
    }
}

/// What the final state can prove, which decides the rules that are evaluated.
#[derive(Debug, Clone, Copy)]
struct Evidence {
    final_present: bool,
    /// A cut final state proves nothing by absence: a row not read may simply
    /// not have been written. The rules that rest on absence wait for a whole one.
    absence_proves: bool,
    /// Without a ledger no event can be followed: only the projection speaks.
    ledger: bool,
    /// Messages held but not named (a broker that only counts): an order
    /// without an effect may be one of them, so neither its absence from the
    /// ledger nor the projection's shortfall proves a loss.
    unlisted: u64,
    held_all_named: bool,
}

impl Evidence {
    fn of(fold: &Fold) -> Evidence {
        let final_present = fold.final_present;
        let absence_proves = final_present && !fold.final_truncated;
        let unlisted = fold.meta.as_ref().and_then(|m| m.unlisted).unwrap_or(0);
        Evidence {
            final_present,
            absence_proves,
            ledger: fold.meta.as_ref().and_then(|m| m.ledger) != Some(false),
            unlisted,
            held_all_named: absence_proves && unlisted == 0,
        }
    }
}

/// Decides the run. The ops' latencies are used up: selected in place, and
/// their room reused.
pub fn check(fold: &mut Fold, claim: Claim) -> Results {
    let latency_ms = latency(fold);
    let fold = &*fold;
    let mut rules = Rules::new(fold);
    let evidence = rules.evidence;

    // One pass over the orders (millions of them, a gigabyte at 10M ops) does
    // the anomalies, the counts and the projection's order sums together.
    let mut tally = Tally::default();
    let mut attribution = Attribution::new(fold);
    let mut applications = ApplicationSeries::new(fold);
    // Sums in i128: the qty of a foreign run can be anything an i64 holds, and
    // an i64 sum that wraps could turn a mismatch into a match. i128 holds the
    // sum of up to 2^64 of them.
    let mut sums: Vec<Option<Sums>> = vec![None; fold.strings.names.len()];
    for (i, o) in fold.orders.iter().enumerate() {
        tally.count(&o);
        attribution.count(&o);
        applications.count(fold, i, &o);
        sum_order(&mut sums, &o, evidence.ledger);
        rules.order(i, &o);
    }

    // Applications that joined no row: grouped by event for double application,
    // judged by their order id otherwise.
    let mut stray_events: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (n, a) in fold.stray_applied.iter().enumerate() {
        stray_events.entry(&*a.event).or_default().push(n);
    }
    rules.double_applied_stray(&stray_events);
    rules.unexpected_effect_stray(&stray_events);
    rules.projection_mismatch(sums);

    // Reported, not failures: recovered, dead_lettered and pending, in the tally.
    let counts = counts(fold, &tally, &stray_events);
    let delivery = delivery(fold, &mut tally, &stray_events);
    let (order, overtaken_at_ms) = match crate::order::check(fold, claim) {
        Some(c) => (Some(c.report), Some(c.overtaken_at_ms)),
        None => (None, None),
    };
    let overtaken_at_ms = overtaken_at_ms.as_deref();
    let series = applications.finish(fold, tally.duplicates_absorbed.is_some(), overtaken_at_ms);

    let mut faults = fold.faults.clone();
    let ops_outside_faults =
        attribution.finish(fold, &mut faults, tally.deliveries.is_some(), tally.duplicates_absorbed.is_some());
    if let Some(at) = overtaken_at_ms {
        crate::windows::count_overtaken(fold, &mut faults, at);
    }
    let latency_ms = Latency { ops_outside_faults, ..latency_ms };

    rules.reordered(claim, order.as_ref());
    let anomalies = rules.anomalies.reports;
    let failing = anomalies.values().any(|r| r.count > 0);
    let mut unknown_reasons = unknown_reasons(fold, &evidence);
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
        not_evaluated: not_evaluated(&evidence, claim, order.is_some()),
        ledger: evidence.ledger,
        counts,
        anomalies,
        recovered: tally.recovered,
        dead_lettered: tally.dead_lettered,
        pending: tally.pending,
        delivery,
        latency_ms,
        faults,
        order,
        series,
    }
}

impl Rules<'_> {
    /// Under a claim of order, each overtaken order is the anomaly
    /// `reordered`, which is then reported (with a count of 0 when none was);
    /// without one, it is not an anomaly of the run at all.
    fn reordered(&mut self, claim: Claim, order: Option<&OrderReport>) {
        if claim != Claim::PerKey {
            return;
        }
        let report = self.anomalies.reports.entry(REORDERED.to_owned()).or_default();
        let Some(order) = order else { return };
        report.count = order.inversions;
        for ex in &order.inversion_examples {
            let later = self.fold.order(&ex.later);
            report.first_time_ns = Some(report.first_time_ns.map_or(ex.later_invoke_ns, |t| t.min(ex.later_invoke_ns)));
            report.examples.push(Example {
                order_id: Some(ex.later.clone()),
                event_id: later.and_then(|o| o.event()).map(|e| self.fold.text(e)),
                item_id: Some(ex.key.clone()),
                time_ns: Some(ex.later_invoke_ns),
                direction: None,
                why: format!(
                    "invoked after {} was acknowledged on key {}, it took effect first ({} of the key's applications, {} {})",
                    ex.earlier,
                    ex.key,
                    ordinal(ex.later_key_seq),
                    ex.earlier,
                    ordinal(ex.earlier_key_seq)
                ),
            });
        }
    }
}

fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// The anomaly rules, one method each, and what they share: the run, what its
/// final state can prove, and the anomalies found so far.
#[derive(Debug)]
struct Rules<'f> {
    fold: &'f Fold,
    evidence: Evidence,
    anomalies: Anomalies,
    /// Applied lines that joined no order row name their order by id only; an
    /// order with such a line is present as an effect.
    stray_orders: HashSet<&'f str>,
    /// The orders reported as an unexpected effect: one example each, for the
    /// first reason found.
    unexpected: HashSet<String>,
}

impl<'f> Rules<'f> {
    fn new(fold: &'f Fold) -> Self {
        Rules {
            fold,
            evidence: Evidence::of(fold),
            anomalies: Anomalies::new(),
            stray_orders: fold.stray_applied.iter().map(|a| &*a.order_id).collect(),
            unexpected: HashSet::new(),
        }
    }

    /// The rules that judge one order, the `i`th, in the one pass over them.
    fn order(&mut self, i: usize, o: &Order) {
        self.lost_order(o);
        self.failed_but_present(o);
        self.unexpected_effect(i, o);
        self.lost_effect(o);
        self.double_applied(i, o);
    }

    /// An acknowledged order absent from the final orders.
    fn lost_order(&mut self, o: &Order) {
        if self.evidence.absence_proves && o.acknowledged() && o.row.is_none() {
            let why = format!("acknowledged ({} ok of {} attempts) but absent from the final orders", o.ok, o.attempts);
            self.anomalies.add("lost-order", example(self.fold, o, o.ack_event, why));
        }
    }

    /// An order whose every attempt failed, yet whose row or effect is in the
    /// final state.
    fn failed_but_present(&mut self, o: &Order) {
        if self.evidence.final_present
            && o.failed()
            && (o.row.is_some() || self.stray_orders.contains(&*self.fold.keys.str(&o.id)))
        {
            let what = if o.row.is_some() { "its order row" } else { "an applied effect" };
            let why = format!("all {} attempts failed, yet the final state holds {what}", o.attempts);
            self.anomalies.add("failed-but-present", example(self.fold, o, o.row.map(|r| r.event), why));
        }
    }

    /// An order present but never invoked, present more than once, or applied
    /// by a line that does not match it.
    fn unexpected_effect(&mut self, i: usize, o: &Order) {
        let Some(row) = &o.row else {
            return;
        };
        let why = if !o.invoked {
            "order present but never invoked".to_owned()
        } else if o.extra_rows > 0 {
            "order present more than once".to_owned()
        } else if o.applied.mismatch {
            self.fold.mismatches[&(i as u32)].clone()
        } else {
            return;
        };
        if self.unexpected.insert(self.fold.text(o.id)) {
            self.anomalies.add("unexpected-effect", example(self.fold, o, Some(row.event), why));
        }
    }

    /// An order present whose event was never applied, is not queued and not
    /// dead-lettered.
    fn lost_effect(&mut self, o: &Order) {
        let Some(row) = &o.row else {
            return;
        };
        let Evidence { ledger, held_all_named, .. } = self.evidence;
        if ledger && held_all_named && o.applied.count == 0 && !o.pending && !o.dead {
            let why = "order present but its event was never applied, is not queued and not dead-lettered";
            self.anomalies.add("lost-effect", example(self.fold, o, Some(row.event), why.into()));
        }
    }

    /// An order row's event applied more than once.
    fn double_applied(&mut self, i: usize, o: &Order) {
        let Some(row) = &o.row else {
            return;
        };
        if !self.evidence.ledger || o.applied.count <= 1 {
            return;
        }
        let fold = self.fold;
        let all = &fold.applications[&(i as u32)];
        let attempts: Vec<String> = all.iter().map(|a| a.attempt.to_string()).collect();
        let workers: BTreeSet<&str> = all.iter().map(|a| fold.workers.name(a.worker)).collect();
        let why = format!(
            "applied {} times (delivery attempts {}; workers {})",
            o.applied.count,
            attempts.join(", "),
            workers.into_iter().collect::<Vec<_>>().join(", ")
        );
        self.anomalies.add("double-applied", example(fold, o, Some(row.event), why));
    }

    /// An event that joined no order row, applied more than once: the stray
    /// applications are grouped by event.
    fn double_applied_stray(&mut self, stray_events: &BTreeMap<&str, Vec<usize>>) {
        let fold = self.fold;
        for (event, lines) in stray_events {
            if lines.len() <= 1 {
                continue;
            }
            let first = &fold.stray_applied[lines[0]];
            let attempts: Vec<String> =
                lines.iter().map(|&n| fold.stray_applied[n].application.attempt.to_string()).collect();
            let ex = Example {
                order_id: Some(first.order_id.to_string()),
                event_id: Some(event.to_string()),
                item_id: None,
                time_ns: fold.order(&first.order_id).filter(|o| o.invoked).map(|o| o.first_invoke_ns),
                direction: None,
                why: format!("applied {} times (delivery attempts {})", lines.len(), attempts.join(", ")),
            };
            self.anomalies.add("double-applied", ex);
        }
    }

    /// An application that joined no order row, judged by its order id: the
    /// order was never invoked, is absent, or has another event.
    fn unexpected_effect_stray(&mut self, stray_events: &BTreeMap<&str, Vec<usize>>) {
        let fold = self.fold;
        for &n in stray_events.values().flatten() {
            let a = &fold.stray_applied[n];
            let why = match fold.order(&a.order_id) {
                None => Some("applied for an order that was never invoked".to_owned()),
                Some(o) if !o.invoked => Some("applied for an order that was never invoked".to_owned()),
                // Reported as lost-order or failed-but-present; not counted again.
                Some(o) if o.row.is_none() && !o.indeterminate() => None,
                // Its row may be in the part of a cut final state never written.
                Some(o) if o.row.is_none() && !self.evidence.absence_proves => None,
                Some(o) if o.row.is_none() => Some("applied, but the order is absent from the final orders".to_owned()),
                Some(o) => Some(format!(
                    "applied line does not match its order: event_id {} (order has {})",
                    a.event,
                    o.row.map_or_else(String::new, |r| fold.text(r.event))
                )),
            };
            if let Some(why) = why
                && self.unexpected.insert(a.order_id.to_string())
            {
                let ex = Example {
                    order_id: Some(a.order_id.to_string()),
                    event_id: Some(a.event.to_string()),
                    item_id: None,
                    time_ns: fold.order(&a.order_id).filter(|o| o.invoked).map(|o| o.first_invoke_ns),
                    direction: None,
                    why,
                };
                self.anomalies.add("unexpected-effect", ex);
            }
        }
    }

    /// An item whose projection disagrees with its applied effects or its
    /// orders, given `sums` of the orders by item.
    fn projection_mismatch(&mut self, mut sums: Vec<Option<Sums>>) {
        if !self.evidence.held_all_named {
            return;
        }
        // The projection against both of its sources, summed by interned item
        // (one array slot each, no lookup per order), then named.
        let fold = self.fold;
        for (&item, &sum) in &fold.applied_sum {
            sums[item as usize].get_or_insert_default().applied += sum;
        }
        for &item in fold.projection.keys() {
            sums[item as usize].get_or_insert_default();
        }
        let items: BTreeMap<&str, Sums> =
            sums.iter().enumerate().filter_map(|(i, s)| Some((fold.strings.name(i as u32), (*s)?))).collect();
        let projection: HashMap<&str, i64> = fold.projection.iter().map(|(&i, &q)| (fold.strings.name(i), q)).collect();
        for (item, sum) in items {
            let reserved = i128::from(projection.get(item).copied().unwrap_or(0));
            let Some((why, direction)) = projection_disagreement(reserved, sum, self.evidence.ledger) else {
                continue;
            };
            let ex = Example {
                order_id: None,
                event_id: None,
                item_id: Some(item.to_owned()),
                time_ns: None,
                direction: direction.map(str::to_owned),
                why,
            };
            self.anomalies.add("projection-mismatch", ex);
        }
    }
}

/// How an item's `reserved` qty disagrees with its sums, and in which
/// direction against the orders; `None` when it agrees.
fn projection_disagreement(reserved: i128, sum: Sums, ledger: bool) -> Option<(String, Option<&'static str>)> {
    if ledger {
        let Sums { applied, orders, .. } = sum;
        if reserved == applied && reserved == orders {
            return None;
        }
        let direction = (reserved != orders).then_some(if reserved > orders { "over" } else { "under" });
        let why = format!("reserved_qty {reserved}, but applied effects sum to {applied} and the orders to {orders}");
        return Some((why, direction));
    }
    // Queued orders may be in or not: any reserved_qty between counts.
    let (low, high) = (sum.orders, sum.orders + sum.maybe);
    let queued = if sum.maybe > 0 { format!(" (and {} more queued)", sum.maybe) } else { String::new() };
    if reserved > high {
        let why = format!(
            "reserved_qty {reserved}, but the orders sum to {low}{queued}: over by {}, an effect applied more than \
             once somewhere",
            reserved - high
        );
        Some((why, Some("over")))
    } else if reserved < low {
        let why = format!(
            "reserved_qty {reserved}, but the orders sum to {low}: under by {}, an effect lost somewhere",
            low - reserved
        );
        Some((why, Some("under")))
    } else {
        None
    }
}

fn counts(fold: &Fold, tally: &Tally, stray_events: &BTreeMap<&str, Vec<usize>>) -> Counts {
    Counts {
        ops: fold.ops,
        client_ops: fold.client_ops,
        nemesis_ops: fold.nemesis_ops,
        attempted: tally.attempted,
        acknowledged: tally.acknowledged,
        failed: tally.failed,
        indeterminate: tally.indeterminate,
        open_invokes: fold.open_invokes,
        present: tally.present,
        applied_events: tally.applied_events + stray_events.len() as u64,
        applied_lines: fold.applied_lines,
        pending_messages: fold.pending_lines,
        dead_letters: fold.dead_letter_lines,
    }
}

/// How the events were delivered, from the joined orders' tally (whose
/// events by deliveries it takes) and the stray applications.
fn delivery(fold: &Fold, tally: &mut Tally, stray_events: &BTreeMap<&str, Vec<usize>>) -> Delivery {
    let redelivered_joined = tally.redelivered;
    let redelivered_stray = stray_events
        .values()
        .filter(|lines| lines.iter().map(|&n| fold.stray_applied[n].application.attempt).min().unwrap_or(1) > 1)
        .count();
    let deliveries = tally.deliveries;
    Delivery {
        histogram: fold.delivery_histogram.clone(),
        applied_on_redelivery: redelivered_joined + redelivered_stray as u64,
        deliveries: deliveries.map(|d| d.total),
        redeliveries: deliveries.map(|d| d.redeliveries),
        redelivered_events: deliveries.map(|d| d.more_than_once),
        delivered_three_times_or_more: deliveries.map(|d| d.three_or_more),
        duplicates_absorbed: tally.duplicates_absorbed,
        deliveries_max: deliveries.map(|d| d.max),
        applied_more_than_once: tally.applied_more_than_once
            + stray_events.values().filter(|lines| lines.len() > 1).count() as u64,
        events_by_deliveries: tally.events_by_deliveries.take(),
    }
}

/// What keeps the run from a verdict, should no anomaly be found.
fn unknown_reasons(fold: &Fold, evidence: &Evidence) -> Vec<String> {
    let mut reasons = Vec::new();
    if !evidence.final_present {
        reasons.push("the final state is missing".to_owned());
    } else if fold.final_truncated {
        reasons.push(format!(
            "the final state is truncated (line {} is cut off), so {} were not evaluated",
            fold.final_truncated_line,
            ABSENCE_RULES.join(", ")
        ));
    }
    if fold.history_truncated {
        reasons.push("the history is truncated".to_owned());
    }
    if evidence.final_present && evidence.unlisted > 0 {
        reasons.push(format!(
            "the system still held {} messages it could not name, so {} were not evaluated",
            evidence.unlisted,
            UNLISTED_RULES.join(" and ")
        ));
    }
    if evidence.final_present && fold.pending_lines > 0 {
        match &fold.meta {
            Some(meta) if meta.quiesced => {}
            Some(_) => reasons.push(format!("the queue did not drain: {} messages still pending", fold.pending_lines)),
            None => reasons
                .push(format!("{} messages pending and no meta line says the queue had drained", fold.pending_lines)),
        }
    }
    reasons
}

/// The rules that the final state could not support, each named once.
fn not_evaluated(evidence: &Evidence, claim: Claim, order_recorded: bool) -> Vec<String> {
    let final_present = evidence.final_present;
    let mut not_evaluated: Vec<String> =
        if final_present && !evidence.absence_proves { ABSENCE_RULES.map(str::to_owned).to_vec() } else { Vec::new() };
    let not_named = if final_present && evidence.unlisted > 0 { &UNLISTED_RULES[..] } else { &[] };
    if !evidence.ledger || !not_named.is_empty() {
        let ledger_rules = if evidence.ledger { &[][..] } else { &LEDGER_RULES[..] };
        for rule in ledger_rules.iter().chain(not_named) {
            if !not_evaluated.iter().any(|n| n == rule) {
                not_evaluated.push((*rule).to_owned());
            }
        }
    }
    // A claim of order with no record of the order things took effect in.
    if claim == Claim::PerKey && final_present && !order_recorded {
        not_evaluated.push(REORDERED.to_owned());
    }
    not_evaluated
}

/// The ops' latency quantiles, in ms, and the effect lag's. Each quantile is
/// selected among the ns and then divided, which picks the same value as
/// dividing all first (the division is monotonic) without a copy of them;
/// the lags then take the room of the ok latencies, which outnumber them.
fn latency(fold: &mut Fold) -> Latency {
    const NS_PER_MS: f64 = 1e6;
    let mut ops = BTreeMap::new();
    for (name, values) in
        [("ok", &mut fold.latency_ok_ns), ("fail", &mut fold.latency_fail_ns), ("info", &mut fold.latency_info_ns)]
    {
        ops.insert(name.to_owned(), quantiles_of(values, |ns| ns / NS_PER_MS));
    }
    let mut lags = std::mem::take(&mut fold.latency_ok_ns);
    lags.clear();
    let fold = &*fold;
    if let Some(meta) = &fold.meta {
        for o in fold.orders.iter() {
            if let (Some(ok_ns), true) = (o.first_ok_ns, o.row.is_some() && o.applied.count > 0) {
                // i128: a foreign run's clocks can be anything an i64 holds.
                let applied_ms = (i128::from(o.applied.min_applied_at_ms) - i128::from(meta.run_started_at_ms)) as f64;
                lags.push(applied_ms - ok_ns as f64 / NS_PER_MS);
            }
        }
    }
    Latency { ops, effect_lag: quantiles(&mut lags), ops_outside_faults: None }
}
