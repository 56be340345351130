//! The metrics of the contract: names start with `haunt_`, counters end in
//! `_total`, durations are in seconds.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::{CounterWithExemplar, HistogramWithExemplars};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The exemplar attached to delivery metrics: which order, which trace.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceExemplar {
    pub correlation_id: String,
    pub trace_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: &'static str,
    pub status: u16,
}

/// `state`: visible, leased, delayed (waiting out a retry backoff), dead_letter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub state: &'static str,
}

/// Latency buckets in seconds, from a fast commit to a request that waited out a
/// lock or a pause.
const SECONDS_BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

fn seconds_buckets() -> impl Iterator<Item = f64> {
    SECONDS_BUCKETS.into_iter()
}

/// Delivery counts: every attempt up to the usual dead-letter limits.
const ATTEMPT_BUCKETS: [f64; 10] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0];

fn attempt_buckets() -> impl Iterator<Item = f64> {
    ATTEMPT_BUCKETS.into_iter()
}

/// The API's metrics.
#[derive(Debug)]
pub struct ApiMetrics {
    pub registry: Registry,
    /// `outcome`: created, replayed, conflict, rejected, not_committed, unknown.
    pub orders: Family<OutcomeLabels, Counter>,
    pub messages_enqueued: Counter,
    pub http_request_duration: Family<HttpLabels, Histogram>,
}

impl Default for ApiMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("haunt");
        let orders = Family::<OutcomeLabels, Counter>::default();
        registry.register("orders", "Order requests by outcome", orders.clone());
        let messages_enqueued = Counter::default();
        registry.register("messages_enqueued", "Messages enqueued with a new order", messages_enqueued.clone());
        let http_request_duration =
            Family::<HttpLabels, Histogram>::new_with_constructor(|| Histogram::new(seconds_buckets()));
        registry.register(
            "http_request_duration_seconds",
            "HTTP request duration by route and status",
            http_request_duration.clone(),
        );
        ApiMetrics { registry, orders, messages_enqueued, http_request_duration }
    }
}

/// The worker's metrics.
#[derive(Debug)]
pub struct WorkerMetrics {
    pub registry: Registry,
    /// `outcome`: applied, duplicate, failed, dead_lettered, lease_lost.
    pub deliveries: Family<OutcomeLabels, CounterWithExemplar<TraceExemplar>>,
    /// The delivery count of each message when it is processed.
    pub delivery_attempt: HistogramWithExemplars<TraceExemplar>,
    pub ack_failures: Counter,
    /// Deliveries after the first.
    pub redeliveries: Counter,
    pub queue_messages: Family<QueueLabels, Gauge>,
    pub oldest_message_age_seconds: Gauge<f64, AtomicU64>,
    pub processing_duration: HistogramWithExemplars<TraceExemplar>,
    /// From enqueue to the application of the event.
    pub effect_lag: HistogramWithExemplars<TraceExemplar>,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("haunt");
        let deliveries = Family::<OutcomeLabels, CounterWithExemplar<TraceExemplar>>::default();
        registry.register("deliveries", "Deliveries processed by outcome", deliveries.clone());
        let delivery_attempt = HistogramWithExemplars::new(attempt_buckets());
        registry.register(
            "delivery_attempt",
            "Delivery count of each message when processed",
            delivery_attempt.clone(),
        );
        let ack_failures = Counter::default();
        registry.register("ack_failures", "Acks that did not delete their message", ack_failures.clone());
        let redeliveries = Counter::default();
        registry.register("redeliveries", "Deliveries after the first of a message", redeliveries.clone());
        let queue_messages = Family::<QueueLabels, Gauge>::default();
        registry.register("queue_messages", "Messages in the queue by state", queue_messages.clone());
        let oldest_message_age_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "oldest_message_age_seconds",
            "Age of the oldest message in the queue",
            oldest_message_age_seconds.clone(),
        );
        let processing_duration = HistogramWithExemplars::new(seconds_buckets());
        registry.register("processing_duration_seconds", "Time to apply one delivery", processing_duration.clone());
        let effect_lag = HistogramWithExemplars::new(seconds_buckets());
        registry.register("effect_lag_seconds", "From enqueue to applied", effect_lag.clone());
        WorkerMetrics {
            registry,
            deliveries,
            delivery_attempt,
            ack_failures,
            redeliveries,
            queue_messages,
            oldest_message_age_seconds,
            processing_duration,
            effect_lag,
        }
    }
}

/// One batch's deliveries, tallied as each is settled and added to the
/// worker's metrics once the batch is done ([`WorkerMetrics::record_batch`]).
/// Each entry names its delivery by its place in the batch, so that an
/// exemplar is made only for the deliveries whose exemplar is kept.
#[derive(Debug, Default)]
pub struct BatchTally {
    /// Each delivery's count.
    attempts: Vec<(f64, usize)>,
    /// Each delivery's outcome, in the order they were settled.
    outcomes: Vec<(&'static str, usize)>,
    /// Each application's lag from enqueue, in seconds.
    lags: Vec<(f64, usize)>,
}

impl BatchTally {
    pub fn with_capacity(n: usize) -> BatchTally {
        BatchTally { attempts: Vec::with_capacity(n), outcomes: Vec::with_capacity(n), lags: Vec::with_capacity(n) }
    }

    /// Delivery `i` of the batch, delivered for the `delivery_count`th time,
    /// settled as `outcome`; `lag_s` for an application.
    pub fn settled(&mut self, i: usize, delivery_count: i64, outcome: &'static str, lag_s: Option<f64>) {
        self.attempts.push((delivery_count as f64, i));
        self.outcomes.push((outcome, i));
        if let Some(lag) = lag_s {
            self.lags.push((lag, i));
        }
    }

    pub fn len(&self) -> usize {
        self.outcomes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outcomes.is_empty()
    }
}

impl WorkerMetrics {
    /// Adds a batch: each delivery's attempt, outcome and lag, and
    /// `processing_s` as each one's processing time. What the registry holds
    /// after it is what observing each delivery in turn would leave, the
    /// exemplars included (each bucket and each outcome keeps its last
    /// delivery's); the difference is the cost: `exemplar(i)` is called only
    /// for the deliveries whose exemplar is kept, and each counter is added
    /// to once or twice a batch.
    pub fn record_batch(&self, tally: &BatchTally, processing_s: f64, exemplar: impl Fn(usize) -> TraceExemplar) {
        observe_all(&self.delivery_attempt, &ATTEMPT_BUCKETS, &tally.attempts, &exemplar);
        let redeliveries = tally.attempts.iter().filter(|(count, _)| *count > 1.0).count() as u64;
        if redeliveries > 0 {
            self.redeliveries.inc_by(redeliveries);
        }
        let mut done: Vec<&'static str> = Vec::new();
        for &(outcome, _) in &tally.outcomes {
            if done.contains(&outcome) {
                continue;
            }
            done.push(outcome);
            let of_it = || tally.outcomes.iter().filter(|(o, _)| *o == outcome);
            let n = of_it().count() as u64;
            let last = of_it().next_back().map(|&(_, i)| i).expect("this outcome was seen");
            let counter = self.deliveries.get_or_create(&OutcomeLabels { outcome });
            // As n increments of one: the first n - 1 leave no exemplar, the
            // last sets it (an increment without one clears it).
            if n > 1 {
                counter.inc_by(n - 1, None, None);
            }
            counter.inc_by(1, Some(exemplar(last)), None);
        }
        observe_all(&self.effect_lag, &SECONDS_BUCKETS, &tally.lags, &exemplar);
        let processing: Vec<(f64, usize)> = tally.outcomes.iter().map(|&(_, i)| (processing_s, i)).collect();
        observe_all(&self.processing_duration, &SECONDS_BUCKETS, &processing, &exemplar);
    }
}

/// Observes each value in turn; the last value of each bucket carries its
/// exemplar, which is the one an observation per value would leave.
fn observe_all(
    histogram: &HistogramWithExemplars<TraceExemplar>,
    bounds: &[f64],
    values: &[(f64, usize)],
    exemplar: &impl Fn(usize) -> TraceExemplar,
) {
    // The bucket prometheus-client puts a value in: the first bound at or
    // above it, else the last (+Inf).
    let bucket = |v: f64| bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
    let mut last = vec![usize::MAX; bounds.len() + 1];
    for (k, &(v, _)) in values.iter().enumerate() {
        last[bucket(v)] = k;
    }
    for (k, &(v, i)) in values.iter().enumerate() {
        let kept = last[bucket(v)] == k;
        histogram.observe(v, kept.then(|| exemplar(i)), None);
    }
}

/// Renders a registry in OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_attempt_carries_its_exemplar() {
        let m = WorkerMetrics::default();
        let ex = TraceExemplar { correlation_id: "c-1".into(), trace_id: "abc".into() };
        m.delivery_attempt.observe(2.0, Some(ex.clone()), None);
        m.deliveries.get_or_create(&OutcomeLabels { outcome: "applied" }).inc_by(1, Some(ex), None);
        let text = encode(&m.registry);
        assert!(
            text.contains(
                "haunt_delivery_attempt_bucket{le=\"2.0\"} 1 # {correlation_id=\"c-1\",trace_id=\"abc\"} 2.0"
            ),
            "{text}"
        );
        assert!(text.contains("haunt_deliveries_total{outcome=\"applied\"} 1 # {correlation_id=\"c-1\""), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    /// A batch recorded at once leaves the registry as a delivery at a time
    /// would: counts, sums, and which exemplar each bucket and outcome keeps.
    #[test]
    fn a_batch_recorded_at_once_reads_as_its_deliveries_one_by_one() {
        let deliveries: [(i64, &str, Option<f64>); 7] = [
            (1, "applied", Some(0.004)),
            (2, "duplicate", None),
            (1, "applied", Some(0.004)),
            (1, "applied", Some(0.3)),
            (3, "lease_lost", None),
            (25, "duplicate", None),
            (1, "applied", Some(42.0)),
        ];
        let exemplar = |i: usize| TraceExemplar { correlation_id: format!("c-{i}"), trace_id: format!("t{i}") };
        let processing = 0.012;
        let one_by_one = WorkerMetrics::default();
        for (i, &(count, outcome, lag)) in deliveries.iter().enumerate() {
            let m = &one_by_one;
            m.delivery_attempt.observe(count as f64, Some(exemplar(i)), None);
            if count > 1 {
                m.redeliveries.inc();
            }
            m.deliveries.get_or_create(&OutcomeLabels { outcome }).inc_by(1, Some(exemplar(i)), None);
            if let Some(lag) = lag {
                m.effect_lag.observe(lag, Some(exemplar(i)), None);
            }
        }
        for i in 0..deliveries.len() {
            one_by_one.processing_duration.observe(processing, Some(exemplar(i)), None);
        }
        let at_once = WorkerMetrics::default();
        let mut tally = BatchTally::with_capacity(deliveries.len());
        for (i, &(count, outcome, lag)) in deliveries.iter().enumerate() {
            tally.settled(i, count, outcome, lag);
        }
        let made = std::cell::Cell::new(0);
        at_once.record_batch(&tally, processing, |i| {
            made.set(made.get() + 1);
            exemplar(i)
        });
        // Families list their labels in hash order: compare the lines as sets.
        let lines = |m: &WorkerMetrics| {
            let mut l: Vec<String> = encode(&m.registry).lines().map(str::to_owned).collect();
            l.sort();
            l
        };
        assert_eq!(lines(&at_once), lines(&one_by_one));
        assert!(
            encode(&at_once.registry)
                .contains("haunt_deliveries_total{outcome=\"applied\"} 4 # {correlation_id=\"c-6\"")
        );
        // Attempts in 4 buckets (1, 2, 3, +Inf), 3 outcomes, lags in 3
        // buckets, processing in 1.
        assert_eq!(made.get(), 11, "an exemplar only where one is kept");
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabels {
    pub fault: String,
    pub target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientOpLabels {
    /// `ok`, `fail` or `info`.
    pub r#type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnomalyLabels {
    pub anomaly: String,
}

/// The harness's own metrics, so dashboards can shade fault windows and show
/// what the clients saw and what the check concluded.
#[derive(Debug)]
pub struct HarnessMetrics {
    pub registry: Registry,
    /// 1 while a fault is active on a target, 0 after.
    pub fault_active: Family<FaultLabels, Gauge>,
    pub client_ops: Family<ClientOpLabels, Counter>,
    pub client_op_duration: Family<ClientOpLabels, Histogram>,
    /// Per anomaly, the count of the last check.
    pub check_anomalies: Family<AnomalyLabels, Gauge>,
    /// The last check's verdict: 1 true, 0 false, -1 unknown.
    pub check_valid: Gauge,
}

impl Default for HarnessMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("haunt");
        let fault_active = Family::<FaultLabels, Gauge>::default();
        registry.register("fault_active", "Whether a fault is active on a target", fault_active.clone());
        let client_ops = Family::<ClientOpLabels, Counter>::default();
        registry.register("client_ops", "Completed client ops by outcome", client_ops.clone());
        let client_op_duration =
            Family::<ClientOpLabels, Histogram>::new_with_constructor(|| Histogram::new(seconds_buckets()));
        registry.register(
            "client_op_duration_seconds",
            "Client op duration, invoke to completion, by outcome",
            client_op_duration.clone(),
        );
        let check_anomalies = Family::<AnomalyLabels, Gauge>::default();
        registry.register("check_anomalies", "Anomalies found by the last check", check_anomalies.clone());
        let check_valid = Gauge::default();
        registry.register("check_valid", "Verdict of the last check: 1 true, 0 false, -1 unknown", check_valid.clone());
        HarnessMetrics { registry, fault_active, client_ops, client_op_duration, check_anomalies, check_valid }
    }
}

/// The relay's metrics: what it moved from the outbox to the broker.
#[derive(Debug)]
pub struct RelayMetrics {
    pub registry: Registry,
    /// Messages the broker confirmed (each publication: a message published
    /// again after a relay crash counts again).
    pub published: Counter,
    /// Messages of batches the broker did not confirm: they stay in the
    /// outbox and are published again.
    pub publish_failures: Counter,
    /// Outbox rows the relay leased, published and could not delete: the
    /// next relay publishes them again.
    pub outbox_delete_failures: Counter,
}

impl Default for RelayMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("haunt_relay");
        let published = Counter::default();
        registry.register("published", "Messages published and confirmed by the broker", published.clone());
        let publish_failures = Counter::default();
        registry.register(
            "publish_failures",
            "Messages whose publish the broker did not confirm",
            publish_failures.clone(),
        );
        let outbox_delete_failures = Counter::default();
        registry.register(
            "outbox_delete_failures",
            "Published messages whose outbox row could not be deleted",
            outbox_delete_failures.clone(),
        );
        RelayMetrics { registry, published, publish_failures, outbox_delete_failures }
    }
}
