//! Order: whether each key's orders took effect in the order the clients
//! fixed in real time.
//!
//! A key is an order's item. Two orders A and B on one key are fixed in real
//! time when A's first `ok` precedes B's first invoke: no system may apply B
//! before A and still claim to keep the key's order. B is **overtaken** when
//! some such A first took effect after B did, by the applications' places in
//! their key's order (`key_seq` on `applied` lines, never `applied_at_ms`,
//! which two workers' clocks can disagree on). `inversions` counts each
//! overtaken B once. An order acknowledged and never applied (lost, or parked
//! as a dead letter) while a later order on its key was applied is
//! **skipped**: Jepsen's poll-skip.
//!
//! Each overtaken order is attributed as far as the record allows: when the
//! order that overtook it took effect only on a redelivery (every one of its
//! applications has a delivery attempt above 1), its first delivery never
//! took effect (a failed apply, a consumer that died or was cut off holding
//! it, a delivery held back behind a failed one) and came back after the
//! order behind it: `overtaken_after_redelivery`. Where the applications
//! carry the relay's publish sequence, an order whose message was published
//! before its overtaker's was reordered by the relay (a lease held back, a
//! batch published again): `overtaken_in_publish`. The two can overlap. An
//! inversion in neither was published in order and took effect on first
//! deliveries: the broker delivered out of order, or competing consumers
//! applied side by side.
//!
//! The pass is per key and never quadratic: a key's applied orders walked in
//! reverse application order, keeping the earliest `ok` of those applied
//! after, show every overtaken order; the pairs fixed in real time are
//! counted by binary search over the key's sorted `ok` times.

use serde::{Deserialize, Serialize};

use crate::fold::{Fold, Order};

/// What a run claims about the order of a key's events: data the harness
/// writes into `run.json` (`order_claim`), or `haunt check --claim-order`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Claim {
    /// No order: inversions are figures.
    #[default]
    None,
    /// Within a key, in the order fixed in real time: an inversion is the
    /// anomaly `reordered`.
    PerKey,
}

impl std::str::FromStr for Claim {
    type Err = String;

    fn from_str(s: &str) -> Result<Claim, String> {
        match s {
            "none" => Ok(Claim::None),
            "per-key" => Ok(Claim::PerKey),
            other => Err(format!("order claim {other:?} is neither \"none\" nor \"per-key\"")),
        }
    }
}

/// The anomaly an inversion is when the run claims order.
pub const REORDERED: &str = "reordered";

/// The `order` section of `results.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OrderReport {
    /// What the run claimed; with `per-key`, every inversion is also the
    /// anomaly `reordered`.
    #[serde(default)]
    pub claim: Claim,
    /// Keys (items) with at least one order applied and numbered.
    pub keys: u64,
    /// Pairs of applied orders on one key whose order was fixed in real time.
    pub pairs_checked: u64,
    /// Applied orders that some order fixed before them overtook.
    pub inversions: u64,
    /// Of those, the ones whose overtaking order took effect only on a
    /// redelivery (its first delivery never took effect). Absent from
    /// results written before it was counted.
    #[serde(default)]
    pub overtaken_after_redelivery: u64,
    /// Of those, the ones whose own message was published before the
    /// overtaking order's (by the relay's publish sequence); `None` when no
    /// application carries one (no relay: the database queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overtaken_in_publish: Option<u64>,
    /// Acknowledged orders never applied while a later order on their key was.
    pub skipped: u64,
    /// Up to [`crate::results::EXAMPLES_MAX`] overtaken orders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inversion_examples: Vec<Inversion>,
    /// Up to [`crate::results::EXAMPLES_MAX`] skipped orders.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_examples: Vec<Skipped>,
    /// One key's orders as the report plots them: the key with the most
    /// overtaken orders (the busiest when none was), up to
    /// [`KEY_TRACE_MAX`] of its orders around its first overtaken one (its
    /// first when none was), the first acknowledged first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_trace: Option<KeyTrace>,
}

/// The order check of a run: its report, and when each overtaken order
/// first took effect (`applied_at_ms`), which the fault windows and the
/// time series count.
#[derive(Debug, Default)]
pub struct Checked {
    pub report: OrderReport,
    pub overtaken_at_ms: Vec<i64>,
}

/// How many of a key's orders [`OrderReport::key_trace`] keeps.
pub const KEY_TRACE_MAX: usize = 400;

/// A key's acknowledged and applied orders: when each was acknowledged,
/// and its place in the key's order of applications.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTrace {
    pub key: String,
    /// `[ok_ns, key_seq, overtaken (0 or 1)]`, by `ok_ns`.
    pub orders: Vec<[u64; 3]>,
    /// Orders of the key acknowledged and applied, of which `orders` holds
    /// at most [`KEY_TRACE_MAX`].
    pub of: u64,
    /// The place of `orders`' first among them, from 1.
    #[serde(default = "one")]
    pub from: u64,
}

fn one() -> u64 {
    1
}

/// An overtaken order: `later` was invoked after `earlier` was acknowledged,
/// and took effect first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inversion {
    pub key: String,
    pub earlier: String,
    pub later: String,
    pub earlier_ok_ns: u64,
    pub later_invoke_ns: u64,
    /// Where each first took effect in the key's order.
    pub earlier_key_seq: u64,
    pub later_key_seq: u64,
    /// The lowest delivery attempt of `earlier`'s applications: above 1,
    /// it took effect only on a redelivery.
    #[serde(default = "one_u32")]
    pub earlier_attempt: u32,
    /// When the relay published each one's message, where recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earlier_publish_seq: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub later_publish_seq: Option<i64>,
}

fn one_u32() -> u32 {
    1
}

/// A skipped order: acknowledged, never applied, and `later` (invoked after
/// its acknowledgement) was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    pub key: String,
    pub order: String,
    pub later: String,
    /// `lost` or `dead-lettered`.
    pub fate: String,
}

/// One applied order of a key, as the pass needs it.
#[derive(Debug, Clone, Copy)]
struct Applied {
    order: u32,
    invoke_ns: u64,
    ok_ns: Option<u64>,
    key_seq: u64,
    applied_at_ms: i64,
    /// The lowest delivery attempt of its applications.
    attempt: u32,
    /// When the relay published the message of its first application.
    publish_seq: Option<i64>,
    overtaken: bool,
}

/// The order figures of a checked run, or `None` when its applications
/// carry no place in their key's order (nothing to judge from).
pub fn check(fold: &Fold, claim: Claim) -> Option<Checked> {
    if fold.key_seq_lines == 0 {
        return None;
    }
    // Per key: its applied orders, and its acknowledged orders that never
    // took effect (an order counts once, by its first invoke's item).
    let keys = fold.strings.names.len();
    let mut applied: Vec<Vec<Applied>> = vec![Vec::new(); keys];
    let mut unapplied: Vec<Vec<u32>> = vec![Vec::new(); keys];
    for (i, o) in fold.orders.iter().enumerate() {
        if !o.invoked {
            continue;
        }
        let key = o.item as usize;
        match o.applied.min_key_seq {
            Some(key_seq) if o.applied.count > 0 => applied[key].push(Applied {
                order: i as u32,
                invoke_ns: o.first_invoke_ns,
                ok_ns: o.first_ok_ns,
                key_seq,
                applied_at_ms: o.applied.min_applied_at_ms,
                attempt: o.applied.min_attempt,
                publish_seq: o.applied.first_publish_seq,
                overtaken: false,
            }),
            _ if o.acknowledged() && o.applied.count == 0 && !o.pending => unapplied[key].push(i as u32),
            _ => {}
        }
    }
    let mut checked = Checked { report: OrderReport { claim, ..OrderReport::default() }, ..Checked::default() };
    if fold.publish_seq_lines > 0 {
        checked.report.overtaken_in_publish = Some(0);
    }
    // The key the report plots: the most overtaken, then the most orders.
    let mut traced: Option<((u64, usize), u32, Vec<Applied>)> = None;
    for (key, mut orders) in applied.into_iter().enumerate() {
        if orders.is_empty() {
            continue;
        }
        checked.report.keys += 1;
        let name = fold.strings.name(key as u32);
        let before = checked.report.inversions;
        pairs_and_inversions(fold, name, &mut orders, &mut checked);
        skipped(fold, name, &orders, &unapplied[key], &mut checked.report);
        let rank = (checked.report.inversions - before, orders.len());
        if traced.as_ref().is_none_or(|(best, _, _)| rank > *best) {
            traced = Some((rank, key as u32, orders));
        }
    }
    checked.report.key_trace = traced.map(|(_, key, orders)| key_trace(fold.strings.name(key), orders));
    Some(checked)
}

/// Up to [`KEY_TRACE_MAX`] acknowledged orders of a key, by their `ok`:
/// those around its first overtaken order (half before it), or its first.
fn key_trace(key: &str, mut orders: Vec<Applied>) -> KeyTrace {
    orders.retain(|a| a.ok_ns.is_some());
    orders.sort_unstable_by_key(|a| a.ok_ns);
    let of = orders.len() as u64;
    let first_overtaken = orders.iter().position(|a| a.overtaken).unwrap_or(0);
    let start = first_overtaken.saturating_sub(KEY_TRACE_MAX / 2).min(orders.len().saturating_sub(KEY_TRACE_MAX));
    orders.drain(..start);
    orders.truncate(KEY_TRACE_MAX);
    KeyTrace {
        key: key.to_owned(),
        orders: orders.iter().map(|a| [a.ok_ns.unwrap_or_default(), a.key_seq, u64::from(a.overtaken)]).collect(),
        of,
        from: start as u64 + 1,
    }
}

/// Counts a key's pairs fixed in real time and its overtaken orders.
fn pairs_and_inversions(fold: &Fold, key: &str, orders: &mut [Applied], checked: &mut Checked) {
    let report = &mut checked.report;
    let mut oks: Vec<u64> = orders.iter().filter_map(|a| a.ok_ns).collect();
    oks.sort_unstable();
    for b in orders.iter() {
        // Every A acknowledged before B was invoked (B's own ok is after its invoke).
        report.pairs_checked += oks.partition_point(|&ok| ok < b.invoke_ns) as u64;
    }
    orders.sort_unstable_by_key(|a| std::cmp::Reverse(a.key_seq));
    // The earliest ok among the orders applied after this one, and whose.
    let mut earliest_ok_after: Option<Applied> = None;
    for b in orders.iter_mut() {
        if let Some(a) = earliest_ok_after
            && a.ok_ns.is_some_and(|ok| ok < b.invoke_ns)
        {
            report.inversions += 1;
            report.overtaken_after_redelivery += u64::from(a.attempt > 1);
            if let (Some(n), Some(a_pub), Some(b_pub)) =
                (report.overtaken_in_publish.as_mut(), a.publish_seq, b.publish_seq)
            {
                *n += u64::from(b_pub < a_pub);
            }
            checked.overtaken_at_ms.push(b.applied_at_ms);
            b.overtaken = true;
            if report.inversion_examples.len() < crate::results::EXAMPLES_MAX {
                report.inversion_examples.push(Inversion {
                    key: key.to_owned(),
                    earlier: order_id(fold, a.order),
                    later: order_id(fold, b.order),
                    earlier_ok_ns: a.ok_ns.unwrap_or_default(),
                    later_invoke_ns: b.invoke_ns,
                    earlier_key_seq: a.key_seq,
                    later_key_seq: b.key_seq,
                    earlier_attempt: a.attempt,
                    earlier_publish_seq: a.publish_seq,
                    later_publish_seq: b.publish_seq,
                });
            }
        }
        if b.ok_ns.is_some_and(|ok| earliest_ok_after.and_then(|a| a.ok_ns).is_none_or(|e| ok < e)) {
            earliest_ok_after = Some(*b);
        }
    }
}

/// Counts a key's acknowledged orders that never took effect though an
/// order invoked after their acknowledgement did.
fn skipped(fold: &Fold, key: &str, applied: &[Applied], unapplied: &[u32], report: &mut OrderReport) {
    let Some(last) = applied.iter().max_by_key(|a| a.invoke_ns) else { return };
    for &i in unapplied {
        let o: Order = fold.orders.get(i);
        if o.first_ok_ns.is_some_and(|ok| ok < last.invoke_ns) {
            report.skipped += 1;
            if report.skipped_examples.len() < crate::results::EXAMPLES_MAX {
                report.skipped_examples.push(Skipped {
                    key: key.to_owned(),
                    order: fold.text(o.id),
                    later: order_id(fold, last.order),
                    fate: if o.dead { "dead-lettered" } else { "lost" }.to_owned(),
                });
            }
        }
    }
}

fn order_id(fold: &Fold, i: u32) -> String {
    fold.text(fold.orders.id(i))
}
