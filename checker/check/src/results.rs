//! What the checker concludes, as data. Serialized as `results.json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The anomalies of the contract, in the order they are reported. Every one of
/// them fails the run.
pub const ANOMALIES: [&str; 6] =
    ["lost-order", "lost-effect", "double-applied", "unexpected-effect", "failed-but-present", "projection-mismatch"];

/// How many examples each anomaly keeps: enough to debug from, small enough to
/// read in a terminal.
pub const EXAMPLES_MAX: usize = 10;

/// `true`, `false` or `"unknown"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Valid,
    Invalid,
    Unknown,
}

impl Verdict {
    /// The exit status of `haunt check` for this verdict.
    pub fn exit_code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Valid => "true",
            Verdict::Invalid => "false",
            Verdict::Unknown => "unknown",
        }
    }
}

impl Serialize for Verdict {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Verdict::Valid => s.serialize_bool(true),
            Verdict::Invalid => s.serialize_bool(false),
            Verdict::Unknown => s.serialize_str("unknown"),
        }
    }
}

impl<'de> Deserialize<'de> for Verdict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::Bool(true) => Ok(Verdict::Valid),
            serde_json::Value::Bool(false) => Ok(Verdict::Invalid),
            serde_json::Value::String(s) if s == "unknown" => Ok(Verdict::Unknown),
            other => Err(serde::de::Error::custom(format!("not a verdict: {other}"))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub valid: Verdict,
    /// Why the verdict is `"unknown"` (empty otherwise).
    pub unknown_reasons: Vec<String>,
    /// Anomalies that were not evaluated, whatever the verdict: the rules that
    /// rest on absence when the final state is truncated. Their count is 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_evaluated: Vec<String>,
    /// Whether the final state had a ledger of applications. Without one
    /// (`false`) the per-event rules ([`crate::rules::LEDGER_RULES`]) are in
    /// `not_evaluated` and the projection was compared with the orders alone.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ledger: bool,
    pub counts: Counts,
    /// Every anomaly of [`ANOMALIES`], with a count of zero when absent.
    pub anomalies: BTreeMap<String, AnomalyReport>,
    /// Indeterminate orders that are present and applied exactly once.
    pub recovered: u64,
    /// Present orders whose message is parked in the dead-letter table.
    pub dead_lettered: u64,
    /// Present orders whose message is still queued.
    pub pending: u64,
    pub delivery: Delivery,
    pub latency_ms: Latency,
    pub faults: Vec<FaultWindow>,
    /// Order within each key (an order's item), where the final state numbers
    /// each key's applications (`key_seq`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<crate::order::OrderReport>,
    /// The run over time, for plots. Absent from a results.json written
    /// before it was added.
    #[serde(default)]
    pub series: Series,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Results {
    pub fn failing_anomalies(&self) -> impl Iterator<Item = (&str, &AnomalyReport)> {
        self.anomalies.iter().filter(|(_, report)| report.count > 0).map(|(name, report)| (name.as_str(), report))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Lines of the history.
    pub ops: u64,
    pub client_ops: u64,
    pub nemesis_ops: u64,
    /// Logical orders (distinct order ids invoked).
    pub attempted: u64,
    pub acknowledged: u64,
    pub failed: u64,
    pub indeterminate: u64,
    /// Invokes with no completion when the history ended.
    pub open_invokes: u64,
    /// `order` lines in the final state.
    pub present: u64,
    /// Distinct events with at least one `applied` line.
    pub applied_events: u64,
    pub applied_lines: u64,
    pub pending_messages: u64,
    pub dead_letters: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AnomalyReport {
    pub count: u64,
    /// History time of the earliest op involved in any instance (the order's
    /// first invoke), when the instance names an invoked order.
    pub first_time_ns: Option<u64>,
    pub examples: Vec<Example>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Example {
    pub order_id: Option<String>,
    pub event_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_id: Option<String>,
    /// The first invoke of the order, on the history clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    /// For a `projection-mismatch`: `over` (the projection holds more than
    /// the orders: an effect applied more than once somewhere) or `under`
    /// (less: an effect lost somewhere); absent when only the ledger disagrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    pub why: String,
}

/// How events were delivered. The figures from the `order` lines' `deliveries`
/// and `duplicates_absorbed` are absent (`None`, omitted from results.json)
/// when no `order` line carries the field: a system that does not count its
/// deliveries is not one that delivered nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// `delivery_attempt` of every `applied` line -> number of lines.
    pub histogram: BTreeMap<u32, u64>,
    /// Applied events whose (first) application came on a redelivery (from the
    /// `applied` lines' `delivery_attempt`).
    pub applied_on_redelivery: u64,
    /// Deliveries of all events (the sum of `deliveries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<u64>,
    /// Deliveries beyond each event's first (the sum of `deliveries - 1` over
    /// events delivered at least once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redeliveries: Option<u64>,
    /// Events with `deliveries` above 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redelivered_events: Option<u64>,
    /// Events with `deliveries` above 2: the tutorial's scenario (delivered
    /// three times, applied once) when none of them was applied twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_three_times_or_more: Option<u64>,
    /// The sum of `duplicates_absorbed`: deliveries the inbox refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicates_absorbed: Option<u64>,
    /// The most deliveries any one event took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliveries_max: Option<u64>,
    /// Events with more than one `applied` line (from the ledger: always known).
    #[serde(default)]
    pub applied_more_than_once: u64,
    /// `deliveries` of every `order` line that carries it -> number of events
    /// (the events still queued included: 0 for one never delivered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_by_deliveries: Option<BTreeMap<u32, u64>>,
}

/// The run over time in buckets of `bucket_ns` from time 0 of the history's
/// clock (bucket `k` holds `[k * bucket_ns, (k + 1) * bucket_ns)`). The width
/// is chosen from the run's span, so that there are at most a few hundred
/// buckets (`series::BUCKETS_MAX`); only the buckets that hold something are
/// listed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub bucket_ns: u64,
    /// `time_ns` of the history's last op.
    pub history_end_ns: u64,
    /// Completed client ops by the bucket of their invoke (an invoke with no
    /// completion is left out: it has no outcome and no latency).
    pub ops: Vec<OpsBucket>,
    /// The final state's `applied` lines by the bucket of their
    /// `applied_at_ms`, placed on the history's clock by the `meta` line's
    /// `run_started_at_ms` (before time 0: in the first bucket). Absent
    /// without a `meta` line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applications: Option<Vec<ApplicationsBucket>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpsBucket {
    pub start_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<OutcomeBucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail: Option<OutcomeBucket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<OutcomeBucket>,
}

/// The ops of one outcome invoked in one bucket. The quantiles come from a
/// log-scaled histogram (within about 6 % of the exact value); the max is
/// exact.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutcomeBucket {
    pub count: u64,
    pub latency_ms_p50: f64,
    pub latency_ms_p99: f64,
    pub latency_ms_max: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplicationsBucket {
    pub start_ns: u64,
    /// `applied` lines.
    pub applied: u64,
    /// Of those, lines whose `delivery_attempt` is above 1.
    pub applied_on_redelivery: u64,
    /// The `duplicates_absorbed` of the events first applied in this bucket
    /// (the final state does not say when a duplicate came, only that it came
    /// after its event was applied); absent when no `order` line carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicates_absorbed: Option<u64>,
    /// Orders first applied in this bucket that an order acknowledged before
    /// them overtook; absent without the order check (no `key_seq`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overtaken: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Client op latency (invoke to completion) by outcome: `ok`, `fail`, `info`.
    pub ops: BTreeMap<String, Quantiles>,
    /// From an order's `ok` to the first application of its event. Can be
    /// negative: a worker may apply the event before the client reads the answer.
    pub effect_lag: Quantiles,
    /// Client op latency (any outcome) of the ops invoked outside every fault
    /// window; absent when the history has no fault window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_outside_faults: Option<Quantiles>,
}

/// One fault on one target, from its first start op to the stop that stopped
/// it, with what happened to the events and ops it overlapped.
///
/// An event is affected when its life in the queue overlaps the window: from
/// its order's `ok` (its first invoke if it was never acknowledged, or applied
/// before the `ok` arrived) to its first application (`applied_at_ms` placed on
/// the history clock by `run_started_at_ms`), or to the final read if it was
/// never applied. The event figures are absent without a `meta` line (no clock
/// to place the applications on); those from `deliveries` and
/// `duplicates_absorbed` also when no `order` line carries the field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultWindow {
    pub fault: String,
    pub target: String,
    pub start_ns: u64,
    /// `None`: still open when the history ended (never stopped successfully).
    pub end_ns: Option<u64>,
    /// Events whose life in the queue overlaps the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<u64>,
    /// Of those, events with `deliveries` above 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redelivered_events: Option<u64>,
    /// Of those, the sum of `duplicates_absorbed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicates_absorbed: Option<u64>,
    /// Of those, events with more than one `applied` line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_more_than_once: Option<u64>,
    /// Client ops (any outcome) invoked inside the window and completed.
    #[serde(default)]
    pub ops_invoked: u64,
    /// Of those, the ops that failed (certainly no effect) and the ones whose
    /// outcome is unknown (`info`: a timeout, a dropped connection); absent
    /// from the results of a checker before they were counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_failed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops_indeterminate: Option<u64>,
    /// p99 latency of those ops; absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p99: Option<f64>,
    /// p99 latency of the ops invoked outside every window, to compare with;
    /// absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p99_outside: Option<f64>,
    /// Median latency of the ops invoked inside, and of those outside every
    /// window: what [`FaultWindow::slower_inside`] compares. Absent when
    /// there are none, and from the results of a checker before them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p50: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms_p50_outside: Option<f64>,
    /// Overtaken orders (the `order` section's) that first took effect
    /// inside the window; absent without the order check or the run's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overtaken: Option<u64>,
    /// Which node led which partition as the fault struck, as the start op
    /// recorded it (a Kafka cluster's `{"broker-2": [0, 3]}`); absent where
    /// the history has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaders: Option<serde_json::Value>,
}

impl FaultWindow {
    /// A window with no figures yet.
    pub fn new(fault: &str, target: &str, start_ns: u64, end_ns: Option<u64>) -> Self {
        FaultWindow {
            fault: fault.to_owned(),
            target: target.to_owned(),
            start_ns,
            end_ns,
            events: None,
            redelivered_events: None,
            duplicates_absorbed: None,
            applied_more_than_once: None,
            ops_invoked: 0,
            ops_failed: None,
            ops_indeterminate: None,
            latency_ms_p99: None,
            latency_ms_p99_outside: None,
            latency_ms_p50: None,
            latency_ms_p50_outside: None,
            overtaken: None,
            leaders: None,
        }
    }

    /// The ops invoked inside were slow as a body: their median more than
    /// twice that of the ops outside every window, and above the p99 outside.
    /// A fault that slows the client (a pause of the API, a delay on its
    /// link) holds every op invoked inside it, and moves the median past
    /// nearly every op outside. One stall of a loaded machine moves only the
    /// tail, and a window's p99 is its largest op or two where outside it is
    /// the 99th percentile of many: compared tail to tail, a single stall
    /// inside a clock-skew window once called the window slow. Compared
    /// median to median alone, a suite's neighbours loading the machine for
    /// most of a 3 s clock-skew window did it again (medians of a few ms
    /// double easily; the p99 outside is the run's own measure of its noise).
    /// Results from before the medians were kept compare the p99s.
    pub fn slower_inside(&self) -> bool {
        let twice = |inside: Option<f64>, outside: Option<f64>| matches!((inside, outside), (Some(inside), Some(outside)) if inside > outside * 2.0);
        match (self.latency_ms_p50, self.latency_ms_p50_outside) {
            (Some(inside), Some(_)) => {
                twice(self.latency_ms_p50, self.latency_ms_p50_outside)
                    && self.latency_ms_p99_outside.is_none_or(|tail| inside > tail)
            }
            _ => twice(self.latency_ms_p99, self.latency_ms_p99_outside),
        }
    }

    /// Nothing in the record shows the fault: it was stopped, and inside it
    /// no op failed or went indeterminate (both counted), none was slow, and no event it
    /// overlapped was delivered again, absorbed as a copy or applied twice.
    /// Overtaken orders are not counted: a transport that claims no order
    /// overtakes some in any window, and under a claim they are the anomaly
    /// `reordered` already. A
    /// kill or a pause of a worker that held no lease at that moment looks
    /// like this; so does a fault the pipeline simply withstands (a clock skew).
    /// Delivery figures the record does not hold (a final state without
    /// delivery counts, as without an inbox) show nothing, so count as none:
    /// the record has no trace of the fault, whatever happened outside it.
    pub fn left_no_trace(&self) -> bool {
        self.end_ns.is_some()
            && self.ops_failed == Some(0)
            && self.ops_indeterminate == Some(0)
            && !self.slower_inside()
            && [self.redelivered_events, self.duplicates_absorbed, self.applied_more_than_once]
                .iter()
                .all(|n| n.unwrap_or(0) == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::FaultWindow;

    /// A window that ended with every figure known and zero.
    fn quiet() -> FaultWindow {
        FaultWindow {
            ops_failed: Some(0),
            ops_indeterminate: Some(0),
            redelivered_events: Some(0),
            duplicates_absorbed: Some(0),
            applied_more_than_once: Some(0),
            latency_ms_p99: Some(10.0),
            latency_ms_p99_outside: Some(8.0),
            latency_ms_p50: Some(3.0),
            latency_ms_p50_outside: Some(2.0),
            ..FaultWindow::new("kill", "worker-1", 1, Some(2))
        }
    }

    #[test]
    fn a_window_is_slow_when_its_median_is_not_when_its_tail_alone_is() {
        let stall = FaultWindow { latency_ms_p99: Some(248.0), latency_ms_p99_outside: Some(54.0), ..quiet() };
        assert!(!stall.slower_inside(), "one stall moves the tail only");
        let held = FaultWindow { latency_ms_p50: Some(400.0), ..quiet() };
        assert!(held.slower_inside(), "every op inside held");
        // A loaded machine doubles a median of a few ms; the body stays
        // inside the tail outside.
        let loaded = FaultWindow {
            latency_ms_p50: Some(30.0),
            latency_ms_p50_outside: Some(10.0),
            latency_ms_p99_outside: Some(115.0),
            ..quiet()
        };
        assert!(!loaded.slower_inside(), "a doubled median within the tail outside");
        // Results from before the medians: the tails compared.
        let old = FaultWindow { latency_ms_p50: None, latency_ms_p50_outside: None, ..stall };
        assert!(old.slower_inside());
    }

    #[test]
    fn a_window_leaves_no_trace_only_when_every_known_figure_is_quiet() {
        assert!(quiet().left_no_trace());
        let traced: [(&str, FaultWindow); 8] = [
            ("still on", FaultWindow { end_ns: None, ..quiet() }),
            ("a failed op", FaultWindow { ops_failed: Some(1), ..quiet() }),
            ("an indeterminate op", FaultWindow { ops_indeterminate: Some(2), ..quiet() }),
            ("op counts unknown", FaultWindow { ops_failed: None, ops_indeterminate: None, ..quiet() }),
            ("slow inside", FaultWindow { latency_ms_p50: Some(12.0), ..quiet() }),
            ("a redelivery", FaultWindow { redelivered_events: Some(1), ..quiet() }),
            ("a copy absorbed", FaultWindow { duplicates_absorbed: Some(1), ..quiet() }),
            ("applied twice", FaultWindow { applied_more_than_once: Some(1), ..quiet() }),
        ];
        for (why, w) in traced {
            assert!(!w.left_no_trace(), "{why}");
        }
        let overtaken = FaultWindow { overtaken: Some(3), ..quiet() };
        assert!(overtaken.left_no_trace(), "overtaken orders are figures (or the anomaly), not a trace");
        let no_deliveries = FaultWindow { redelivered_events: None, duplicates_absorbed: None, ..quiet() };
        assert!(no_deliveries.left_no_trace(), "delivery figures the record lacks show nothing");
    }
}
