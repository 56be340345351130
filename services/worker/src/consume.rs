//! The worker over a broker: receive with the broker's own semantics, apply
//! through the inbox exactly as from the database queue, then ack with the
//! broker's ack. The broker holds the lease (a delivery tag, a pending
//! entry, a visibility timeout), so there is no fence in the database: a
//! zombie's late copy reaches the inbox and is counted there as a duplicate.

use std::time::{Duration, Instant};

use haunt_store::{ErrorWait, Failed, Headers, Leased, OrderEvent, Rng};
use haunt_telemetry::tracing_context;
use haunt_transport::{Consumer, Delivery, Options, Receipt};
use tokio::sync::watch;
use tracing::Instrument;

use crate::faults::HoldPoint;
use crate::trace::BatchTrace;
use crate::{BrokerSource, Delivered, Worker};

/// How long one receive waits for a first message: the bound on how late a
/// loop sees its shutdown.
const RECEIVE_WAIT: Duration = Duration::from_millis(500);

/// A delivery as the apply path takes it: the broker's delivery as a
/// [`Leased`] (no lease token: the broker holds the lease), and what acks it.
struct Received {
    leased: Leased,
    receipt: Receipt,
}

impl Received {
    fn from(delivery: Delivery) -> Received {
        let e = delivery.envelope;
        Received {
            leased: Leased {
                message_id: e.message_id,
                event_id: e.event_id,
                payload: e.payload,
                // Unreadable headers lose tracing, not the message.
                headers: serde_json::from_str::<Headers>(&e.headers).unwrap_or_default(),
                delivery_count: delivery.delivery_count,
                lease_token: String::new(),
                lease_until_ms: 0,
                enqueued_at_ms: e.enqueued_at_ms,
            },
            receipt: delivery.receipt,
        }
    }
}

impl Delivered for &Received {
    fn leased(&self) -> &Leased {
        &self.leased
    }
}

impl Worker {
    /// One consumer of the broker, until `shutdown` turns true. A consumer
    /// whose connection fails is dropped and connected again, after an
    /// [`ErrorWait`]; while it is down the worker is not ready.
    pub(crate) async fn consume_loop(&self, slot: usize, broker: BrokerSource, shutdown: watch::Receiver<bool>) {
        let mut rng = Rng::from_entropy();
        let options = Options {
            client_id: format!("{}-{slot}", self.config.worker_id),
            visibility_timeout: self.config.visibility_timeout,
            confirms: true,
        };
        let mut consumer: Option<Box<dyn Consumer>> = None;
        let mut error_wait = ErrorWait::new(self.config.poll_interval);
        while !*shutdown.borrow() {
            let c = match &mut consumer {
                Some(c) => c,
                None => match haunt_transport::consumer(broker.spec, &broker.url, &options).await {
                    Ok(c) => {
                        tracing::info!(worker_id = %self.config.worker_id, slot, transport = %broker.spec, "consuming");
                        self.links.connected();
                        consumer.insert(c)
                    }
                    Err(e) => {
                        tracing::warn!(worker_id = %self.config.worker_id, slot, error = %e, "connecting to the broker failed");
                        self.wait(error_wait.failed(), &shutdown).await;
                        continue;
                    }
                },
            };
            match c.receive(self.config.batch_size_max as usize, RECEIVE_WAIT).await {
                Ok(batch) if batch.is_empty() => error_wait.succeeded(),
                Ok(batch) => {
                    error_wait.succeeded();
                    if let Some(stall) = self.faults.take_stall() {
                        // The `stall` fault, as in the lease loop: past the
                        // broker's visibility timeout another consumer holds
                        // these messages when this one wakes.
                        tracing::warn!(worker_id = %self.config.worker_id, slot, messages = batch.len(),
                            stall_ms = stall.as_millis() as u64, "stalling after a receive (stall fault)");
                        self.wait(stall, &shutdown).await;
                    }
                    let batch: Vec<Received> = batch.into_iter().map(Received::from).collect();
                    self.process_received(c.as_mut(), &batch, &mut rng).await;
                }
                Err(e) => {
                    tracing::warn!(worker_id = %self.config.worker_id, slot, error = %e, "receive failed; reconnecting");
                    consumer = None;
                    self.links.dropped();
                    self.wait(error_wait.failed(), &shutdown).await;
                }
            }
        }
    }

    async fn wait(&self, how_long: Duration, shutdown: &watch::Receiver<bool>) {
        let mut shutdown = shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(how_long) => {}
            _ = shutdown.changed() => {}
        }
    }

    /// A received batch: applied in one transaction, then acked; deliveries
    /// past the limit or unreadable are parked one by one; a failed batch is
    /// tried again one delivery at a time, and one that fails alone is
    /// handed back to the broker after its backoff.
    async fn process_received(&self, consumer: &mut dyn Consumer, batch: &[Received], rng: &mut Rng) {
        let max = i64::from(self.config.delivery_attempts_max);
        let mut ready: Vec<(&Received, OrderEvent)> = Vec::with_capacity(batch.len());
        for received in batch {
            match received.leased.event() {
                Ok(event) if received.leased.delivery_count <= max => ready.push((received, event)),
                Ok(_) => {
                    let why = format!("exceeded {} deliveries", self.config.delivery_attempts_max);
                    self.park(consumer, received, &why).await
                }
                Err(e) => self.park(consumer, received, &format!("unreadable payload: {e}")).await,
            }
        }
        if ready.is_empty() {
            return;
        }
        let Err(e) = self.apply_received(consumer, &ready, rng).await else { return };
        let failed: Vec<&[(&Received, OrderEvent)]> = if ready.len() == 1 {
            vec![&ready[..]]
        } else {
            let mut failed = Vec::new();
            for one in ready.chunks(1) {
                if self.apply_received(consumer, one, rng).await.is_err() {
                    failed.push(one);
                }
            }
            failed
        };
        for one in failed {
            let received = one[0].0;
            let error = format!("{e}: {:?}", std::error::Error::source(&e));
            if received.leased.delivery_count >= max {
                self.park(consumer, received, &error).await;
                continue;
            }
            let span = self.delivery_span(&received.leased);
            let exemplar = self.observe_delivery(&received.leased, tracing_context::trace_id(&span));
            self.count("failed", &exemplar);
            let delay = self.config.backoff.delay(received.leased.delivery_count as u32, rng.unit());
            span.in_scope(|| tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "apply failed"));
            tokio::time::sleep(delay).await;
            if let Err(e) = consumer.release(std::slice::from_ref(&received.receipt)).await {
                span.in_scope(|| tracing::warn!(error = %e, "handing the delivery back failed; the broker redelivers"));
            }
        }
    }

    /// Applies deliveries in one transaction and acks the settled ones with
    /// the broker (less the acks the `ack-loss` fault drops).
    async fn apply_received(
        &self,
        consumer: &mut dyn Consumer,
        ready: &[(&Received, OrderEvent)],
        rng: &mut Rng,
    ) -> Result<(), haunt_store::StoreError> {
        let started = Instant::now();
        let trace = BatchTrace::new(self, ready.iter().map(|(r, _)| &r.leased));
        let auto_ack = self.config.bug == Some(haunt_store::Bug::AckBeforeProcess);
        if auto_ack {
            // BUG MODE ack-before-process: acked on receipt, before the effect.
            let kept = self.kept(ready.iter().map(|(r, _)| *r).enumerate(), &trace, rng);
            self.ack_received(consumer, &kept).await;
            self.faults.at_hold_point(HoldPoint::AckedNotApplied, ready.len()).await;
        }
        let batch: Vec<(&Leased, OrderEvent)> = ready.iter().map(|(r, e)| (&r.leased, e.clone())).collect();
        let outcomes = match self.store.apply_deliveries(&batch, &self.config.worker_id).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                trace.failed(&e);
                return Err(e);
            }
        };
        let (settled, exemplars) = self.record(ready.iter().map(|(r, _)| &r.leased), outcomes, &trace);
        // From the batch's start to its apply's commit, as on the database queue.
        let elapsed = started.elapsed().as_secs_f64();
        if !auto_ack {
            // As on the database queue: applied, not yet acked.
            self.faults.at_hold_point(HoldPoint::BeforeAck, settled.len()).await;
            let kept = self.kept(settled.iter().map(|&i| (i, ready[i].0)), &trace, rng);
            self.ack_received(consumer, &kept).await;
        }
        trace.finish(ready.iter().map(|(r, _)| &r.leased), self.system());
        for exemplar in exemplars {
            self.metrics.processing_duration.observe(elapsed, Some(exemplar), None);
        }
        Ok(())
    }

    /// Acks with the broker; an ack it never gets is a redelivery later.
    async fn ack_received(&self, consumer: &mut dyn Consumer, received: &[&Received]) {
        if received.is_empty() {
            return;
        }
        let receipts: Vec<Receipt> = received.iter().map(|r| r.receipt.clone()).collect();
        match consumer.ack(&receipts).await {
            Ok(()) => tracing::debug!(acked = receipts.len(), "acked"),
            Err(e) => {
                self.metrics.ack_failures.inc_by(receipts.len() as u64);
                tracing::warn!(error = %e, "ack failed: expect redeliveries");
            }
        }
    }

    /// Parks a delivery in the dead-letter table and acks it; or, when the
    /// inbox holds its event (an ack was lost), only acks it. If parking
    /// fails the delivery is not acked, and the broker delivers it again.
    async fn park(&self, consumer: &mut dyn Consumer, received: &Received, why: &str) {
        let span = self.delivery_span(&received.leased);
        let exemplar = self.observe_delivery(&received.leased, tracing_context::trace_id(&span));
        let parked = self.store.dead_letter_delivery(&received.leased, why).instrument(span.clone()).await;
        match parked {
            Ok(Failed::Settled) => {
                self.count("duplicate", &exemplar);
                span.in_scope(|| {
                    tracing::info!("{why}, but its event was applied (an ack was lost): acked, not parked")
                });
            }
            Ok(_) => {
                self.count("dead_lettered", &exemplar);
                span.in_scope(|| tracing::warn!("dead-lettered: {why}"));
            }
            Err(e) => {
                span.in_scope(|| tracing::warn!(error = ?e, "dead-lettering failed; the broker redelivers"));
                return;
            }
        }
        self.ack_received(consumer, &[received]).await;
    }
}
