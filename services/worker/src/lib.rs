//! The worker of the reference pipeline: lease a batch, apply each delivery
//! through the inbox in one transaction with its effect, then ack.
//!
//! At-least-once is the premise: an ack can be lost (the fault switch drops it
//! on purpose, after the effect committed, exactly like the naive tutorial
//! version), a worker can pause past its lease, a process can die between the
//! commit and the ack. The inbox makes every redelivery a counted duplicate.
//!
//! # Layout
//!
//! - [`run`] and [`RunConfig`]: a whole worker process over an open store (the
//!   fault switches wired to the store, the loops, the HTTP side, the
//!   shutdown), for `haunt worker` and for tests on `127.0.0.1:0`.
//! - [`Worker`] and [`WorkerConfig`]: the receive/apply/ack loop and its
//!   bounds, one loop and one apply path whatever the source.
//! - `source`: where deliveries come from and where they are settled, the
//!   database queue (leased under a token that fences the apply and the
//!   ack) or, with a broker transport ([`WorkerConfig::broker`]), a
//!   consumer of the broker (its own lease and ack); the apply through the
//!   inbox is the same transaction.
//! - [`Spans`] and `trace`: how a batch's deliveries are traced, a span each
//!   or one span per batch.
//! - [`faults`]: the switches the nemesis flips at run time (ack loss, clock
//!   offset, database errors, a stall after a lease).
//! - [`http`]: `/metrics`, `/healthz` and the token-guarded fault endpoint.

pub mod faults;
pub mod http;
mod run;
mod source;
mod trace;

use std::sync::Arc;
use std::time::{Duration, Instant};

use haunt_store::{AckMode, Applied, Backoff, Bug, ErrorWait, Failed, Leased, OrderEvent, Rng, Store, StoreError};
use haunt_telemetry::metrics::{BatchTally, OutcomeLabels, TraceExemplar, WorkerMetrics};
use haunt_telemetry::tracing_context;
use haunt_transport::{Links, TransportSpec};
use source::{Polled, Received, Source};
use tokio::sync::watch;
use trace::BatchTrace;
use tracing::Instrument;

pub use faults::{Faults, Held, HoldPoint};
pub use run::{RunConfig, RunError, run};

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Names this worker in the ledger and in logs.
    pub worker_id: String,
    /// How long a lease hides a message from other workers.
    pub visibility_timeout: Duration,
    /// Messages leased at once by one lease loop.
    pub batch_size_max: u32,
    /// Deliveries a message gets before it is dead-lettered.
    pub delivery_attempts_max: u32,
    /// How long an idle lease loop waits before asking again.
    pub poll_interval: Duration,
    /// Lease loops running side by side.
    pub concurrency: usize,
    pub backoff: Backoff,
    /// Where the ack commits: after the apply (the default, broker-like) or
    /// in its transaction (`--ack-in-txn`), where the `ack-loss` fault has no
    /// ack to drop.
    pub ack: AckMode,
    pub bug: Option<Bug>,
    /// Where messages come from: the database queue (`None`, the default) or
    /// a broker.
    pub broker: Option<BrokerSource>,
    /// How the batch path traces its deliveries.
    pub spans: Spans,
}

/// How a worker traces the deliveries of a batch. Either way each delivery
/// is in its order's trace when spans are recorded (`info`) and exported;
/// what differs is what it costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Spans {
    /// A `tracing` span per delivery (a child of its order's span) and a log
    /// line per delivery at `info`: every delivery in the logs too, for
    /// reading a run one order at a time (its cost is in
    /// docs/performance.md).
    Delivery,
    /// One span per batch with a link to each message's producer, as the
    /// OpenTelemetry messaging conventions allow; each delivery's own span
    /// (its outcome, and whether its ack was dropped, as attributes) is sent
    /// straight to the OpenTelemetry SDK, only when exporting, and its log
    /// line is at `debug`. Lost leases, dropped acks and dead letters are
    /// still logged at `warn` with the delivery's ids; a failed batch at
    /// `warn` once, before each of its deliveries is tried alone. Its
    /// exemplars carry the order's trace id at any level. The default.
    #[default]
    Batch,
}

impl std::str::FromStr for Spans {
    type Err = String;

    fn from_str(s: &str) -> Result<Spans, String> {
        match s {
            "delivery" => Ok(Spans::Delivery),
            "batch" => Ok(Spans::Batch),
            _ => Err(format!("unknown span form {s:?}; expected delivery or batch")),
        }
    }
}

/// A broker the worker consumes from.
#[derive(Debug, Clone)]
pub struct BrokerSource {
    pub spec: TransportSpec,
    /// The broker's URL as this worker reaches it (through its fault proxy).
    pub url: String,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            worker_id: "worker".into(),
            // Long against a batch's processing time (milliseconds), short enough
            // that a dead worker's messages come back within seconds.
            visibility_timeout: Duration::from_secs(5),
            // Large enough that a transaction's fixed cost is spread thin, small
            // enough that one batch is milliseconds of work, far inside a lease.
            batch_size_max: 500,
            // Ten deliveries survive a long run of transient errors; a message that
            // fails ten times is poison, and keeping it blocks nothing but itself.
            delivery_attempts_max: 10,
            poll_interval: Duration::from_millis(50),
            concurrency: 2,
            backoff: Backoff::default(),
            ack: AckMode::Separate,
            bug: None,
            broker: None,
            spans: Spans::Batch,
        }
    }
}

/// A delivery on the batch path: a leased message, or a broker's delivery.
trait Delivered {
    fn leased(&self) -> &Leased;
}

impl Delivered for &Leased {
    fn leased(&self) -> &Leased {
        self
    }
}

/// One worker process's loops over a store.
#[derive(Debug, Clone)]
pub struct Worker {
    store: Store,
    config: Arc<WorkerConfig>,
    faults: Arc<Faults>,
    metrics: Arc<WorkerMetrics>,
    /// Its consumers' connections to the broker (none on the database queue).
    links: Arc<Links>,
}

impl Worker {
    pub fn new(store: Store, config: WorkerConfig, faults: Arc<Faults>, metrics: Arc<WorkerMetrics>) -> Worker {
        let consumers = if config.broker.is_some() { config.concurrency.max(1) } else { 0 };
        let links = Arc::new(Links::new(consumers));
        Worker { store, config: Arc::new(config), faults, metrics, links }
    }

    /// Ready while every consume loop is connected to the broker.
    pub fn links(&self) -> &Arc<Links> {
        &self.links
    }

    pub fn metrics(&self) -> &Arc<WorkerMetrics> {
        &self.metrics
    }

    /// Runs the delivery loops until `shutdown` turns true; a loop that has
    /// a batch finishes it first (no new batch is taken after shutdown).
    pub async fn run(&self, shutdown: watch::Receiver<bool>) {
        let mut loops = tokio::task::JoinSet::new();
        for slot in 0..self.config.concurrency.max(1) {
            let worker = self.clone();
            let shutdown = shutdown.clone();
            loops.spawn(async move { worker.delivery_loop(slot, shutdown).await });
        }
        while loops.join_next().await.is_some() {}
    }

    /// One loop over the source of `slot` (the database queue, or a consumer
    /// of the broker), until `shutdown` turns true.
    async fn delivery_loop(&self, slot: usize, mut shutdown: watch::Receiver<bool>) {
        let mut rng = Rng::from_entropy();
        rng.next_u64();
        // Consecutive errors stretch the wait (up to a second), so a database
        // or broker that is down is not hammered by every loop of every worker.
        let mut error_wait = ErrorWait::new(self.config.poll_interval);
        let mut source = Source::of(self, slot);
        while !*shutdown.borrow() {
            let wait = match source.receive(self, slot).await {
                Polled::Empty(wait) => {
                    error_wait.succeeded();
                    wait
                }
                Polled::Failed => error_wait.failed(),
                Polled::Batch(batch) => {
                    error_wait.succeeded();
                    if let Some(stall) = self.faults.take_stall() {
                        // The `stall` fault: a pause at the worst moment, with
                        // the batch in hand. Past the visibility timeout this
                        // loop is a zombie: another worker (or consumer) holds
                        // its messages when it wakes.
                        tracing::warn!(worker_id = %self.config.worker_id, slot, messages = batch.len(),
                            stall_ms = stall.as_millis() as u64, "stalling after a lease (stall fault)");
                        tokio::select! {
                            _ = tokio::time::sleep(stall) => {}
                            _ = shutdown.changed() => continue,
                        }
                    }
                    if source.acked_in_apply(self) {
                        // The ack commits with the apply: the costly crash is
                        // with the lease in hand, before it.
                        self.faults.at_hold_point(HoldPoint::AfterLease, batch.len()).await;
                    }
                    self.process_batch(&mut source, &batch, &mut rng).await;
                    Duration::ZERO
                }
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
        source.settle().await;
    }

    /// A batch: applied in one transaction and acked at once. Deliveries
    /// past the delivery limit and unreadable ones are settled one by one;
    /// if the batch's transaction fails, each delivery is tried again alone
    /// (a batch of one, through the same path), and one that fails alone is
    /// retried later with backoff or dead-lettered.
    async fn process_batch(&self, source: &mut Source, batch: &[Received], rng: &mut Rng) {
        let max = i64::from(self.config.delivery_attempts_max);
        let mut ready = Ready::with_capacity(batch.len());
        for received in batch {
            match received.leased.event() {
                Ok(event) if received.leased.delivery_count <= max => ready.push(received, event),
                Ok(_) => {
                    let why = format!("exceeded {} deliveries", self.config.delivery_attempts_max);
                    self.park(source, received, &why).await
                }
                Err(e) if source.is_broker() => self.park(source, received, &format!("unreadable payload: {e}")).await,
                Err(e) => {
                    self.retry(source, received, &format!("unreadable payload: {e}"), rng).await;
                }
            }
        }
        if ready.is_empty() {
            return;
        }
        let Err(e) = self.apply_and_ack(source, &ready, rng).await else { return };
        if ready.len() == 1 {
            let error = format!("{e}: {:?}", std::error::Error::source(&e));
            self.retry(source, ready.from[0], &error, rng).await;
            return;
        }
        // On a broker that keeps each key's order, a delivery that failed
        // holds back the rest of its key in this batch: they go back to the
        // broker unapplied, after it, and come again behind it. Applying
        // them while it waits out its backoff would let a key's later order
        // take effect first.
        let mut failed_keys: Vec<&str> = Vec::new();
        for one in ready.one_by_one() {
            let received = one.from[0];
            let key = received.key.as_deref();
            if let Some(key) = key
                && failed_keys.contains(&key)
                && self.config.bug != Some(Bug::RetryAfterNext)
            {
                self.hold_back(source, received).await;
                continue;
            }
            // BUG MODE retry-after-next: the failed delivery waits out its
            // backoff while the next of its key is applied.
            if let Err(e) = self.apply_and_ack(source, &one, rng).await {
                let error = format!("{e}: {:?}", std::error::Error::source(&e));
                // Parked, it holds nothing back: its key goes on without it.
                if self.retry(source, received, &error, rng).await {
                    failed_keys.extend(key);
                }
            }
        }
    }

    /// A delivery behind a failed one of its key: handed back unapplied.
    async fn hold_back(&self, source: &mut Source, received: &Received) {
        let span = self.delivery_span(&received.leased);
        let exemplar = self.observe_delivery(&received.leased, tracing_context::trace_id(&span));
        self.count("held_back", &exemplar);
        span.in_scope(|| tracing::info!("an earlier delivery of its key failed: handed back behind it, unapplied"));
        source.hand_back(received).instrument(span).await;
    }

    /// Applies deliveries of one receive in one transaction, then acks those
    /// that were applied or duplicates (less the acks the `ack-loss` fault
    /// drops; with the ack in the apply's transaction, nothing is left to
    /// ack). On a failed transaction it records the failure on each
    /// delivery's span and returns the error; nothing was written and
    /// nothing is acked.
    async fn apply_and_ack(&self, source: &mut Source, ready: &Ready<'_>, rng: &mut Rng) -> Result<(), StoreError> {
        let started = Instant::now();
        // Open across the batch's transaction and the sending of its ack.
        let trace = BatchTrace::new(self, ready.batch.iter().map(|(leased, _)| *leased));
        let auto_ack = self.config.bug == Some(Bug::AckBeforeProcess);
        if auto_ack {
            // BUG MODE ack-before-process: acked on receipt. If this worker
            // dies or fails before the effect commits, the events are gone.
            let kept = self.kept(ready.from.iter().copied().enumerate(), &trace, rng);
            source.ack_on_receipt(self, &kept).await;
            self.faults.at_hold_point(HoldPoint::AckedNotApplied, ready.len()).await;
        } else if source.settled_on_receipt() {
            // An at-most-once broker's consumer settled the batch as it
            // received it: a crash here loses it, as above.
            self.faults.at_hold_point(HoldPoint::AckedNotApplied, ready.len()).await;
        }
        let outcomes = match source.apply(self, &ready.batch).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                trace.failed(&e);
                return Err(e);
            }
        };
        let (settled, tally) = self.record(ready.batch.iter().map(|(l, _)| *l), outcomes, &trace);
        // From the batch's start to its apply's commit (its ack is in flight after).
        let elapsed = started.elapsed().as_secs_f64();
        self.metrics.record_batch(&tally, elapsed, |i| exemplar(ready.batch[i].0, trace.trace_id(i)));
        if !auto_ack && !source.acked_in_apply(self) {
            // The effect committed and the ack is not sent: a crash here
            // makes the queue or the broker deliver the batch again. Not
            // where a consumer settled on receipt: its ack went before the
            // effect, and a batch held here would be one a kill cannot lose
            // (an aimed kill of a Kafka at-most-once worker held here, after
            // the effect, and the run lost nothing).
            if !source.settled_on_receipt() {
                self.faults.at_hold_point(HoldPoint::BeforeAck, settled.len()).await;
            }
            let kept = self.kept(settled.iter().map(|&i| (i, ready.from[i])), &trace, rng);
            source.ack(self, &kept).await;
        }
        trace.finish(self.system());
        Ok(())
    }

    /// Counts each delivery's outcome in its trace and in the batch's tally
    /// (added to the metrics once the batch's transaction has committed,
    /// before its ack); returns the indices
    /// of those to ack (all but lost leases) and the tally.
    fn record<'a>(
        &self,
        leased: impl Iterator<Item = &'a Leased>,
        outcomes: Vec<Applied>,
        trace: &BatchTrace<'_>,
    ) -> (Vec<usize>, BatchTally) {
        let mut settled = Vec::with_capacity(outcomes.len());
        let mut tally = BatchTally::with_capacity(outcomes.len());
        for (i, (leased, outcome)) in leased.zip(outcomes).enumerate() {
            trace.settled(i, leased, &outcome);
            let count = leased.delivery_count;
            match outcome {
                Applied::Applied { applied_at_ms } => {
                    let lag = (applied_at_ms - leased.enqueued_at_ms).max(0) as f64 / 1000.0;
                    tally.settled(i, count, "applied", Some(lag));
                }
                Applied::Duplicate => tally.settled(i, count, "duplicate", None),
                Applied::LeaseLost => {
                    tally.settled(i, count, "lease_lost", None);
                    trace.warn(i, leased, "lease lost before the apply committed: the message's new holder applies it");
                }
            }
            if outcome != Applied::LeaseLost {
                settled.push(i);
            }
        }
        assert_eq!(tally.len(), trace.len(), "one outcome per delivery");
        (settled, tally)
    }

    /// The deliveries to ack (with their place in the batch), less those
    /// whose ack the `ack-loss` fault drops.
    fn kept<T: Delivered>(
        &self,
        deliveries: impl Iterator<Item = (usize, T)>,
        trace: &BatchTrace<'_>,
        rng: &mut Rng,
    ) -> Vec<T> {
        let mut acks = Vec::new();
        for (i, delivery) in deliveries {
            if self.faults.drop_ack(rng) {
                self.metrics.ack_failures.inc();
                trace.ack_dropped(i, delivery.leased());
            } else {
                acks.push(delivery);
            }
        }
        acks
    }

    /// Acks the messages of one lease (each id with where the lease left its
    /// row, when it said); an ack that finds its lease gone, or a failed
    /// statement, means redeliveries (which the inbox absorbs).
    async fn ack_all(&self, acks: &[(&str, Option<&str>)], token: &str) {
        if acks.is_empty() {
            return;
        }
        let m = &self.metrics;
        match self.store.ack_leased(acks, token).await {
            Ok(deleted) if deleted < acks.len() as u64 => {
                m.ack_failures.inc_by(acks.len() as u64 - deleted);
                tracing::warn!(lost = acks.len() as u64 - deleted, "acks found their lease gone");
            }
            Ok(_) => tracing::debug!(acked = acks.len(), "acked"),
            Err(e) => {
                m.ack_failures.inc_by(acks.len() as u64);
                tracing::warn!(error = ?e, "ack failed: expect redeliveries");
            }
        }
    }

    /// `messaging.system`: haunt's own queue, or the broker's name.
    fn system(&self) -> &'static str {
        self.config.broker.as_ref().map_or("haunt", |b| b.spec.name())
    }

    /// The delivery's span, continuing the trace of the API request that
    /// enqueued its event.
    fn delivery_span(&self, leased: &Leased) -> tracing::Span {
        let worker_id = self.config.worker_id.as_str();
        let system = self.system();
        let span = tracing::info_span!(
            "order.deliver",
            otel.kind = "consumer",
            otel.name = "orders process",
            messaging.system = system,
            messaging.operation.type = "process",
            messaging.message.id = %leased.message_id,
            messaging.message.conversation_id = %leased.headers.correlation_id,
            haunt.delivery_count = leased.delivery_count,
            correlation_id = %leased.headers.correlation_id,
            event_id = %leased.event_id,
            message_id = %leased.message_id,
            delivery_attempt = leased.delivery_count,
            worker_id,
        );
        if !span.is_disabled() {
            tracing_context::continue_from(&span, leased.headers.traceparent.as_deref());
        }
        span
    }

    /// Counts one delivery in the attempt histogram (and as a redelivery after
    /// the first); returns the exemplar, with `trace_id`, for its other metrics.
    fn observe_delivery(&self, leased: &Leased, trace_id: String) -> TraceExemplar {
        let exemplar = exemplar(leased, trace_id);
        self.metrics.delivery_attempt.observe(leased.delivery_count as f64, Some(exemplar.clone()), None);
        if leased.delivery_count > 1 {
            self.metrics.redeliveries.inc();
        }
        exemplar
    }

    fn count(&self, outcome: &'static str, exemplar: &TraceExemplar) {
        self.metrics.deliveries.get_or_create(&OutcomeLabels { outcome }).inc_by(1, Some(exemplar.clone()), None);
    }

    /// A delivery past the limit, or unreadable from a broker: parked in the
    /// dead-letter table rather than looped forever; or, when the inbox
    /// holds its event (an ack was lost), settled.
    async fn park(&self, source: &mut Source, received: &Received, why: &str) {
        let span = self.delivery_span(&received.leased);
        let exemplar = self.observe_delivery(&received.leased, tracing_context::trace_id(&span));
        match source.park(self, received, why).instrument(span.clone()).await {
            Ok(Failed::Settled) => {
                self.count("duplicate", &exemplar);
                span.in_scope(|| {
                    tracing::info!("{why}, but its event was applied (an ack was lost): acked, not parked")
                });
            }
            Ok(Failed::DeadLettered) => {
                self.count("dead_lettered", &exemplar);
                span.in_scope(|| tracing::warn!("dead-lettered: {why}"));
            }
            Ok(_) => {}
            Err(e) => span.in_scope(|| tracing::warn!(error = ?e, "dead-lettering failed; it will be delivered again")),
        }
    }

    /// A delivery that failed: retried later with backoff, or dead-lettered
    /// after its last delivery. Returns whether it is to come again.
    async fn retry(&self, source: &mut Source, received: &Received, error: &str, rng: &mut Rng) -> bool {
        let started = Instant::now();
        let leased = &received.leased;
        if source.is_broker() && leased.delivery_count >= i64::from(self.config.delivery_attempts_max) {
            self.park(source, received, error).await;
            return false;
        }
        let span = self.delivery_span(leased);
        let exemplar = self.observe_delivery(leased, tracing_context::trace_id(&span));
        self.count("failed", &exemplar);
        let delay = self.config.backoff.delay(leased.delivery_count as u32, rng.unit());
        let retry_in_ms = delay.as_millis() as u64;
        let outcome = source.retry(self, received, error, delay).instrument(span.clone()).await;
        // An error leaves it to its lease, which brings it back too.
        let again = matches!(outcome, Ok(Failed::Retrying | Failed::LeaseLost) | Err(_));
        match outcome {
            Ok(Failed::DeadLettered) => {
                self.count("dead_lettered", &exemplar);
                span.in_scope(|| tracing::warn!(%error, "dead-lettered"));
            }
            Ok(Failed::Retrying) => span.in_scope(|| tracing::warn!(%error, retry_in_ms, "apply failed")),
            Ok(Failed::LeaseLost) => span.in_scope(|| tracing::warn!(%error, "apply failed and the lease was lost")),
            Ok(Failed::Settled) => span.in_scope(
                || tracing::info!(%error, "apply failed on the last delivery, but an earlier one applied it: acked"),
            ),
            Err(e) => span.in_scope(|| tracing::warn!(%error, fail_error = ?e, "apply failed; the lease will expire")),
        }
        // A broker's retry waited out the backoff: no processing time.
        if !source.is_broker() {
            self.metrics.processing_duration.observe(started.elapsed().as_secs_f64(), Some(exemplar), None);
        }
        again
    }
}

/// A delivery's exemplar: its order's correlation id and trace.
fn exemplar(leased: &Leased, trace_id: String) -> TraceExemplar {
    TraceExemplar { correlation_id: leased.headers.correlation_id.clone(), trace_id }
}

/// The deliveries of a batch that go to the apply, with the receipts they
/// came with (`from[i]` is `batch[i]`'s).
struct Ready<'a> {
    from: Vec<&'a Received>,
    batch: Vec<(&'a Leased, OrderEvent)>,
}

impl<'a> Ready<'a> {
    fn with_capacity(n: usize) -> Ready<'a> {
        Ready { from: Vec::with_capacity(n), batch: Vec::with_capacity(n) }
    }

    fn push(&mut self, received: &'a Received, event: OrderEvent) {
        self.from.push(received);
        self.batch.push((&received.leased, event));
    }

    fn len(&self) -> usize {
        self.batch.len()
    }

    fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Each delivery as a batch of its own (after a batch failed).
    fn one_by_one(&self) -> impl Iterator<Item = Ready<'a>> + '_ {
        self.from
            .iter()
            .zip(&self.batch)
            .map(|(from, (leased, event))| Ready { from: vec![*from], batch: vec![(*leased, event.clone())] })
    }
}
