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
//! - [`Worker`] and [`WorkerConfig`]: the lease/apply/ack loop and its bounds.
//! - [`faults`]: the switches the nemesis flips at run time (ack loss, clock offset).
//! - [`http`]: `/metrics`, `/healthz` and the token-guarded fault endpoint.

pub mod faults;
pub mod http;

use std::sync::Arc;
use std::time::{Duration, Instant};

use haunt_store::{Applied, Backoff, Bug, Failed, LeaseClock, Leased, Rng, Store};
use haunt_telemetry::metrics::{OutcomeLabels, TraceExemplar, WorkerMetrics};
use haunt_telemetry::tracing_context;
use tokio::sync::watch;
use tracing::Instrument;

pub use faults::Faults;

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
    pub bug: Option<Bug>,
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
            bug: None,
        }
    }
}

/// One worker process's loops over a store.
#[derive(Debug, Clone)]
pub struct Worker {
    store: Store,
    config: Arc<WorkerConfig>,
    faults: Arc<Faults>,
    metrics: Arc<WorkerMetrics>,
}

impl Worker {
    pub fn new(store: Store, config: WorkerConfig, faults: Arc<Faults>, metrics: Arc<WorkerMetrics>) -> Worker {
        Worker { store, config: Arc::new(config), faults, metrics }
    }

    pub fn metrics(&self) -> &Arc<WorkerMetrics> {
        &self.metrics
    }

    /// Runs the lease loops until `shutdown` turns true; a loop that has a batch
    /// finishes it first (no new lease is taken after shutdown).
    pub async fn run(&self, shutdown: watch::Receiver<bool>) {
        let mut loops = tokio::task::JoinSet::new();
        for slot in 0..self.config.concurrency.max(1) {
            let worker = self.clone();
            let shutdown = shutdown.clone();
            loops.spawn(async move { worker.lease_loop(slot, shutdown).await });
        }
        while loops.join_next().await.is_some() {}
    }

    async fn lease_loop(&self, slot: usize, mut shutdown: watch::Receiver<bool>) {
        let mut rng = Rng::from_entropy();
        rng.next_u64();
        // Consecutive lease errors stretch the wait up to 5 s, so a database that
        // is down is not hammered by every loop of every worker.
        const ERROR_WAIT_MAX: Duration = Duration::from_secs(5);
        let mut error_wait = self.config.poll_interval;
        while !*shutdown.borrow() {
            let clock = match self.config.bug {
                // BUG MODE worker-clock-lease: the lease is computed from this
                // worker's clock, which a skew fault can move.
                Some(Bug::WorkerClockLease) => LeaseClock::Worker { now_ms: self.faults.worker_now_ms() },
                _ => LeaseClock::Database,
            };
            let wait = match self.store.lease(self.config.batch_size_max, self.config.visibility_timeout, clock).await {
                Ok(batch) if batch.is_empty() => {
                    error_wait = self.config.poll_interval;
                    self.config.poll_interval
                }
                Ok(batch) => {
                    error_wait = self.config.poll_interval;
                    self.process_batch(&batch, &mut rng).await;
                    Duration::ZERO
                }
                Err(e) => {
                    tracing::warn!(worker_id = %self.config.worker_id, slot, error = ?e, "lease failed");
                    error_wait = (error_wait * 2).min(ERROR_WAIT_MAX);
                    error_wait
                }
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => {}
                }
            }
        }
    }

    /// A leased batch: applied in one transaction and acked in one statement.
    /// Deliveries that need handling of their own (past the delivery limit,
    /// unreadable), every delivery of a batch whose transaction failed, and all
    /// deliveries under a bug mode go one by one through [`Worker::process`],
    /// which retries, backs off and dead-letters each on its own.
    async fn process_batch(&self, batch: &[Leased], rng: &mut Rng) {
        let max = i64::from(self.config.delivery_attempts_max);
        if batch.len() == 1 || self.config.bug.is_some() {
            for leased in batch {
                self.process(leased, rng).await;
            }
            return;
        }
        let mut ready = Vec::with_capacity(batch.len());
        for leased in batch {
            match leased.event() {
                Ok(event) if leased.delivery_count <= max => ready.push((leased, event)),
                _ => self.process(leased, rng).await,
            }
        }
        if ready.is_empty() {
            return;
        }
        let started = Instant::now();
        // One span per delivery, open across the batch's transaction and ack.
        let spans: Vec<tracing::Span> = ready.iter().map(|(leased, _)| self.delivery_span(leased)).collect();
        let outcomes = match self.store.apply_batch(&ready, &self.config.worker_id).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                // Each delivery's span ends with the failed attempt on record;
                // the retry alone gets a span of its own.
                for span in &spans {
                    span.in_scope(|| tracing::warn!(error = ?e, "batch apply failed; retrying this delivery alone"));
                }
                drop(spans);
                for (leased, _) in &ready {
                    self.process(leased, rng).await;
                }
                return;
            }
        };
        let m = &self.metrics;
        let mut acks: Vec<&str> = Vec::with_capacity(ready.len());
        let mut exemplars = Vec::with_capacity(ready.len());
        for (((leased, _), outcome), span) in ready.iter().zip(outcomes).zip(&spans) {
            let exemplar = self.observe_delivery(leased, span);
            span.in_scope(|| match outcome {
                Applied::Applied { applied_at_ms } => {
                    self.count("applied", &exemplar);
                    let lag = (applied_at_ms - leased.enqueued_at_ms).max(0) as f64 / 1000.0;
                    m.effect_lag.observe(lag, Some(exemplar.clone()), None);
                    tracing::info!("applied");
                }
                Applied::Duplicate => {
                    self.count("duplicate", &exemplar);
                    tracing::info!("duplicate skipped");
                }
                Applied::LeaseLost => self.lease_lost(&exemplar),
            });
            if outcome != Applied::LeaseLost {
                if self.faults.drop_ack(rng) {
                    m.ack_failures.inc();
                    span.in_scope(|| tracing::warn!("ack dropped (ack-loss fault): expect a redelivery"));
                } else {
                    acks.push(leased.message_id.as_str());
                }
            }
            exemplars.push(exemplar);
        }
        let token = ready[0].0.lease_token.as_str();
        match self.store.ack_batch(&acks, token).await {
            Ok(deleted) if deleted < acks.len() as u64 => {
                m.ack_failures.inc_by(acks.len() as u64 - deleted);
                tracing::warn!(lost = acks.len() as u64 - deleted, "acks found their lease gone");
            }
            Ok(_) => {}
            Err(e) => {
                m.ack_failures.inc_by(acks.len() as u64);
                tracing::warn!(error = ?e, "batch ack failed: expect redeliveries");
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        for exemplar in exemplars {
            m.processing_duration.observe(elapsed, Some(exemplar), None);
        }
    }

    /// The delivery's span, continuing the trace of the API request that
    /// enqueued its event.
    fn delivery_span(&self, leased: &Leased) -> tracing::Span {
        let worker_id = self.config.worker_id.as_str();
        let span = tracing::info_span!(
            "order.deliver",
            otel.kind = "consumer",
            otel.name = "orders process",
            messaging.system = "haunt",
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
        tracing_context::continue_from(&span, leased.headers.traceparent.as_deref());
        span
    }

    /// Counts one delivery in the attempt histogram (and as a redelivery after
    /// the first); returns the exemplar for its other metrics.
    fn observe_delivery(&self, leased: &Leased, span: &tracing::Span) -> TraceExemplar {
        let exemplar = TraceExemplar {
            correlation_id: leased.headers.correlation_id.clone(),
            trace_id: tracing_context::trace_id(span),
        };
        self.metrics.delivery_attempt.observe(leased.delivery_count as f64, Some(exemplar.clone()), None);
        if leased.delivery_count > 1 {
            self.metrics.redeliveries.inc();
        }
        exemplar
    }

    /// A zombie's delivery: its lease expired and another worker took the
    /// message, so this one writes and acks nothing.
    fn lease_lost(&self, exemplar: &TraceExemplar) {
        self.count("lease_lost", exemplar);
        tracing::warn!("lease lost before the apply committed: the message's new holder applies it");
    }

    fn count(&self, outcome: &'static str, exemplar: &TraceExemplar) {
        self.metrics.deliveries.get_or_create(&OutcomeLabels { outcome }).inc_by(1, Some(exemplar.clone()), None);
    }

    /// One delivery: apply through the inbox, then ack; or retry later.
    async fn process(&self, leased: &Leased, rng: &mut Rng) {
        let started = Instant::now();
        let span = self.delivery_span(leased);
        // Instrumented, not entered: an entered guard held across an await would
        // leave the span (and its OpenTelemetry context) on whichever thread
        // resumes the task.
        self.deliver(leased, rng, started, &span).instrument(span.clone()).await;
    }

    async fn deliver(&self, leased: &Leased, rng: &mut Rng, started: Instant, span: &tracing::Span) {
        let worker_id = self.config.worker_id.as_str();
        let exemplar = self.observe_delivery(leased, span);
        let m = &self.metrics;
        let count = |outcome: &'static str| self.count(outcome, &exemplar);
        if leased.delivery_count > i64::from(self.config.delivery_attempts_max) {
            // Delivered past the limit without ever failing cleanly: the workers
            // holding it died. Park it rather than loop forever.
            let why = format!("exceeded {} deliveries", self.config.delivery_attempts_max);
            match self.store.dead_letter(&leased.message_id, Some(&leased.lease_token), &why).await {
                Ok(Failed::DeadLettered) => {
                    count("dead_lettered");
                    tracing::warn!("dead-lettered: {why}");
                }
                Ok(Failed::Settled) => {
                    count("duplicate");
                    tracing::info!("{why}, but its event was applied (an ack was lost): acked, not parked");
                }
                _ => {}
            }
            return;
        }

        if self.config.bug == Some(Bug::AckBeforeProcess) {
            // BUG MODE ack-before-process: auto-ack on receipt. If this worker dies
            // or fails before the effect commits, the event is gone.
            self.ack(leased, rng).await;
        }

        let outcome = match leased.event() {
            Ok(event) => self
                .store
                .apply(leased, &event, worker_id)
                .await
                .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e))),
            Err(e) => Err(format!("unreadable payload: {e}")),
        };
        match outcome {
            Ok(Applied::Applied { applied_at_ms }) => {
                count("applied");
                let lag = (applied_at_ms - leased.enqueued_at_ms).max(0) as f64 / 1000.0;
                m.effect_lag.observe(lag, Some(exemplar.clone()), None);
                tracing::info!("applied");
            }
            Ok(Applied::Duplicate) => {
                count("duplicate");
                tracing::info!("duplicate skipped");
            }
            Ok(Applied::LeaseLost) => {
                self.lease_lost(&exemplar);
                m.processing_duration.observe(started.elapsed().as_secs_f64(), Some(exemplar), None);
                return;
            }
            Err(error) => {
                count("failed");
                let delay = self.config.backoff.delay(leased.delivery_count as u32, rng.unit());
                match self.store.fail(leased, &error, delay, self.config.delivery_attempts_max).await {
                    Ok(Failed::DeadLettered) => {
                        count("dead_lettered");
                        tracing::warn!(%error, "dead-lettered");
                    }
                    Ok(Failed::Retrying) => {
                        tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "apply failed")
                    }
                    Ok(Failed::LeaseLost) => {
                        tracing::warn!(%error, "apply failed and the lease was lost")
                    }
                    Ok(Failed::Settled) => {
                        tracing::info!(%error, "apply failed on the last delivery, but an earlier one applied it: acked")
                    }
                    Err(e) => {
                        tracing::warn!(%error, fail_error = ?e, "apply failed; the lease will expire")
                    }
                }
                m.processing_duration.observe(started.elapsed().as_secs_f64(), Some(exemplar), None);
                return;
            }
        }
        if self.config.bug != Some(Bug::AckBeforeProcess) {
            self.ack(leased, rng).await;
        }
        m.processing_duration.observe(started.elapsed().as_secs_f64(), Some(exemplar), None);
    }

    async fn ack(&self, leased: &Leased, rng: &mut Rng) {
        if self.faults.drop_ack(rng) {
            self.metrics.ack_failures.inc();
            tracing::warn!("ack dropped (ack-loss fault): expect a redelivery");
            return;
        }
        match self.store.ack(&leased.message_id, &leased.lease_token).await {
            Ok(true) => tracing::debug!("acked"),
            Ok(false) => {
                self.metrics.ack_failures.inc();
                tracing::warn!("ack found the lease gone: another worker holds the message now");
            }
            Err(e) => {
                self.metrics.ack_failures.inc();
                tracing::warn!(error = ?e, "ack failed: expect a redelivery");
            }
        }
    }
}
