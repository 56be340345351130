//! Where a worker's deliveries come from and where they are settled: the
//! database queue or a broker. The worker has one loop
//! (`Worker::delivery_loop`) and one apply path (`Worker::process_batch`)
//! over either; what differs is here, each difference in one match.
//!
//! - The database queue leases a batch under one lease token, computed from
//!   the database clock. Its apply is fenced by that token (a zombie's late
//!   apply writes nothing), its ack is a statement fenced the same way, sent
//!   while the loop leases its next batch ([`AckInFlight`]) or, with
//!   `--ack-in-txn`, made in the apply's own transaction. A failed delivery
//!   is made visible again after its backoff by the database; one past its
//!   last delivery is parked under its token.
//! - A broker holds the lease itself (a delivery tag, a pending entry, a
//!   visibility timeout), so the apply has no fence: a zombie's copy reaches
//!   the inbox and is counted there as a duplicate. Its ack is the broker's;
//!   a failed delivery is handed back after its backoff; one parked in the
//!   dead-letter table is acked.
//!
//! This seam is the worker's, not the transport crate's: the fence and the
//! ack in the apply's transaction are the store's, which no broker has.

use std::time::Duration;

use haunt_store::{AckMode, Applied, Bug, DbKind, Failed, Headers, LeaseClock, Leased, OrderEvent, StoreError};
use haunt_transport::{Consumer, Delivery, Options, OrderClaim, Receipt};

use crate::{BrokerSource, Delivered, Worker};

/// How long one receive from a broker waits for a first message: the bound
/// on how late a consumer sees its shutdown.
const RECEIVE_WAIT: Duration = Duration::from_millis(500);

/// A delivery as the apply path takes it: a leased message of the database
/// queue, or a broker's delivery as a [`Leased`] (with no lease token) and
/// what acks it.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) leased: Leased,
    receipt: Option<Receipt>,
    /// The unit of order the broker keeps it in (the envelope's key), if
    /// the broker keeps one: what a failed delivery holds back behind it.
    pub(crate) key: Option<String>,
}

impl Received {
    fn leased(leased: Leased) -> Received {
        Received { leased, receipt: None, key: None }
    }

    fn delivered(delivery: Delivery, ordered: bool) -> Received {
        let e = delivery.envelope;
        let key = if ordered { e.key } else { None };
        let leased = Leased {
            message_id: e.message_id,
            event_id: e.event_id,
            payload: e.payload,
            // Unreadable headers lose tracing, not the message.
            headers: serde_json::from_str::<Headers>(&e.headers).unwrap_or_default(),
            delivery_count: delivery.delivery_count,
            lease_token: String::new(),
            lease_until_ms: 0,
            enqueued_at_ms: e.enqueued_at_ms,
            ctid: None,
        };
        Received { leased, receipt: Some(delivery.receipt), key }
    }
}

impl Delivered for &Received {
    fn leased(&self) -> &Leased {
        &self.leased
    }
}

/// What one receive came to.
pub(crate) enum Polled {
    Batch(Vec<Received>),
    /// Nothing to deliver; wait this long before asking again (a broker's
    /// receive has already waited).
    Empty(Duration),
    /// The queue or the broker could not be read; the loop waits by its
    /// `ErrorWait` (and a broker's consumer is connected again first).
    Failed,
}

/// One loop's source of deliveries.
pub(crate) enum Source {
    Queue {
        ack: AckInFlight,
    },
    Broker {
        broker: BrokerSource,
        options: Options,
        /// Connected on first use, and again after a failed receive.
        consumer: Option<Box<dyn Consumer>>,
    },
}

impl Source {
    /// The source of lease loop `slot` of `worker`.
    pub(crate) fn of(worker: &Worker, slot: usize) -> Source {
        match worker.config.broker.clone() {
            None => Source::Queue { ack: AckInFlight::default() },
            Some(broker) => {
                let options = Options {
                    client_id: format!("{}-{slot}", worker.config.worker_id),
                    visibility_timeout: worker.config.visibility_timeout,
                    confirms: true,
                    // BUG MODE commit-async-on-receipt (Kafka): settled as received.
                    commit_on_receipt: worker.config.bug == Some(haunt_store::Bug::CommitAsyncOnReceipt),
                };
                Source::Broker { broker, options, consumer: None }
            }
        }
    }

    /// Up to a batch of deliveries.
    pub(crate) async fn receive(&mut self, worker: &Worker, slot: usize) -> Polled {
        let config = &worker.config;
        match self {
            Source::Queue { .. } => {
                let clock = match config.bug {
                    // BUG MODE worker-clock-lease: the lease is computed from this
                    // worker's clock, which a skew fault can move.
                    Some(Bug::WorkerClockLease) => LeaseClock::Worker { now_ms: worker.faults.worker_now_ms() },
                    _ => LeaseClock::Database,
                };
                match worker.store.lease(config.batch_size_max, config.visibility_timeout, clock).await {
                    Ok(batch) if batch.is_empty() => Polled::Empty(config.poll_interval),
                    Ok(batch) => Polled::Batch(batch.into_iter().map(Received::leased).collect()),
                    Err(e) => {
                        tracing::warn!(worker_id = %config.worker_id, slot, error = ?e, "lease failed");
                        Polled::Failed
                    }
                }
            }
            Source::Broker { broker, options, consumer } => {
                let c = match consumer {
                    Some(c) => c,
                    None => match haunt_transport::consumer(broker.spec, &broker.url, options).await {
                        Ok(c) => {
                            tracing::info!(worker_id = %config.worker_id, slot, transport = %broker.spec, "consuming");
                            worker.links.connected();
                            consumer.insert(c)
                        }
                        Err(e) => {
                            tracing::warn!(worker_id = %config.worker_id, slot, error = %e,
                                "connecting to the broker failed");
                            return Polled::Failed;
                        }
                    },
                };
                match c.receive(config.batch_size_max as usize, RECEIVE_WAIT).await {
                    Ok(batch) if batch.is_empty() => Polled::Empty(Duration::ZERO),
                    Ok(batch) => {
                        let ordered = broker.spec.order_claim() == OrderClaim::PerKey;
                        Polled::Batch(batch.into_iter().map(|d| Received::delivered(d, ordered)).collect())
                    }
                    Err(e) => {
                        tracing::warn!(worker_id = %config.worker_id, slot, error = %e, "receive failed; reconnecting");
                        *consumer = None;
                        worker.links.dropped();
                        Polled::Failed
                    }
                }
            }
        }
    }

    /// Applies deliveries in one transaction: fenced by their lease token
    /// on the database queue (and, with [`AckMode::InApplyTxn`], acked in
    /// it), unfenced from a broker.
    /// (`&mut self`: a consumer is `Send` but not `Sync`, so no shared
    /// borrow of it may be held across the apply's await.)
    pub(crate) async fn apply(
        &mut self,
        worker: &Worker,
        batch: &[(&Leased, OrderEvent)],
    ) -> Result<Vec<Applied>, StoreError> {
        let (store, worker_id) = (&worker.store, worker.config.worker_id.as_str());
        match self {
            Source::Queue { .. } => store.apply_batch_with(batch, worker_id, worker.config.ack).await,
            Source::Broker { .. } => store.apply_deliveries(batch, worker_id).await,
        }
    }

    /// Whether the apply's transaction already acked what it applied.
    pub(crate) fn acked_in_apply(&self, worker: &Worker) -> bool {
        matches!(self, Source::Queue { .. }) && worker.config.ack == AckMode::InApplyTxn
    }

    /// Acks deliveries: by their lease token on the database queue (in
    /// flight while the loop leases again), with the broker's ack from a
    /// broker. An ack that never arrives is a redelivery later, which the
    /// inbox absorbs.
    pub(crate) async fn ack(&mut self, worker: &Worker, received: &[&Received]) {
        match self {
            Source::Queue { ack } => {
                // Sent even when empty: it waits for the ack in flight.
                let token = received.first().map(|r| r.leased.lease_token.clone()).unwrap_or_default();
                let acks = received.iter().map(|r| (r.leased.message_id.clone(), r.leased.ctid.clone())).collect();
                ack.send(worker, acks, token).await;
            }
            Source::Broker { consumer, .. } => {
                let Some(consumer) = consumer.as_mut().filter(|_| !received.is_empty()) else { return };
                let receipts: Vec<Receipt> = received.iter().filter_map(|r| r.receipt.clone()).collect();
                match consumer.ack(&receipts).await {
                    Ok(()) => tracing::debug!(acked = receipts.len(), "acked"),
                    Err(e) => {
                        worker.metrics.ack_failures.inc_by(receipts.len() as u64);
                        tracing::warn!(error = %e, "ack failed: expect redeliveries");
                    }
                }
            }
        }
    }

    /// BUG MODE ack-before-process: acks on receipt, before the effect, and
    /// waits for the ack (the database queue's is not left in flight), so
    /// that a crash right after it loses the deliveries.
    pub(crate) async fn ack_on_receipt(&mut self, worker: &Worker, received: &[&Received]) {
        match self {
            Source::Queue { ack } => {
                ack.settle().await;
                let Some(first) = received.first() else { return };
                let acks: Vec<(&str, Option<&str>)> =
                    received.iter().map(|r| (r.leased.message_id.as_str(), r.leased.ctid.as_deref())).collect();
                worker.ack_all(&acks, &first.leased.lease_token).await;
            }
            Source::Broker { .. } => self.ack(worker, received).await,
        }
    }

    /// Parks a delivery in the dead-letter table, or, when the inbox holds
    /// its event already (an ack was lost), settles it; a broker's delivery
    /// is acked either way. If parking fails nothing is acked, and the
    /// delivery comes back.
    pub(crate) async fn park(&mut self, worker: &Worker, received: &Received, why: &str) -> Result<Failed, StoreError> {
        let leased = &received.leased;
        match self {
            Source::Queue { .. } => worker.store.dead_letter(&leased.message_id, Some(&leased.lease_token), why).await,
            Source::Broker { .. } => {
                let parked = worker.store.dead_letter_delivery(leased, why).await?;
                self.ack(worker, &[received]).await;
                Ok(parked)
            }
        }
    }

    /// Whether the broker's consumer settled what it received as it
    /// received it (an at-most-once mode: auto-ack, a commit before the
    /// effect).
    pub(crate) fn settled_on_receipt(&self) -> bool {
        matches!(self, Source::Broker { consumer: Some(c), .. } if c.acks_on_receipt())
    }

    /// Whether this is a broker's consumer. The loop differs in three
    /// small ways, each said where it is decided: an unreadable delivery is
    /// parked at once (it is not haunt's to retry), a failed delivery on its
    /// last attempt is parked by the worker (the database queue's
    /// [`Source::retry`] parks it under the lease), and a retry waits out
    /// its backoff in the loop (the database queue's sets it in the row).
    pub(crate) fn is_broker(&self) -> bool {
        matches!(self, Source::Broker { .. })
    }

    /// Hands back a delivery whose apply failed, to come again after
    /// `delay`: the database makes it visible then (or parks it after its
    /// last delivery); a broker gets it back after the loop has waited.
    pub(crate) async fn retry(
        &mut self,
        worker: &Worker,
        received: &Received,
        error: &str,
        delay: Duration,
    ) -> Result<Failed, StoreError> {
        match self {
            Source::Queue { .. } => {
                worker.store.fail(&received.leased, error, delay, worker.config.delivery_attempts_max).await
            }
            Source::Broker { consumer, .. } => {
                tokio::time::sleep(delay).await;
                if let Some(consumer) = consumer
                    && let Err(e) =
                        consumer.release(std::slice::from_ref(received.receipt.as_ref().expect("a broker's"))).await
                {
                    tracing::warn!(error = %e, "handing the delivery back failed; the broker redelivers");
                }
                Ok(Failed::Retrying)
            }
        }
    }

    /// Hands back, unapplied, a broker's delivery held behind a failed one
    /// of its key: the broker delivers it again after that one, in order.
    pub(crate) async fn hand_back(&mut self, received: &Received) {
        let (Source::Broker { consumer: Some(consumer), .. }, Some(receipt)) = (self, received.receipt.as_ref()) else {
            return;
        };
        if let Err(e) = consumer.release(std::slice::from_ref(receipt)).await {
            tracing::warn!(error = %e, "handing a held-back delivery back failed; the broker redelivers it");
        }
    }

    /// Waits for the ack in flight, if any: before the loop ends.
    pub(crate) async fn settle(&mut self) {
        if let Source::Queue { ack } = self {
            ack.settle().await;
        }
    }
}

/// A lease loop's last ack, in flight while the loop leases its next batch.
///
/// The protocol is unchanged: each batch's ack is sent after its apply
/// committed, and at most one ack per loop is in flight, so the ack's round
/// trip overlaps the next lease's instead of adding to it. On SQLite, which
/// has one writer, the ack beside a lease would only wait for it, so there
/// it is sent inline.
#[derive(Debug, Default)]
pub(crate) struct AckInFlight(Option<tokio::task::JoinHandle<()>>);

impl AckInFlight {
    /// Waits for the ack in flight (the one before this) and sends this one:
    /// each message's id and where its lease left its row.
    async fn send(&mut self, worker: &Worker, acks: Vec<(String, Option<String>)>, token: String) {
        self.settle().await;
        if acks.is_empty() {
            return;
        }
        if worker.store.db_kind() != DbKind::Postgres {
            worker.ack_all(&refs(&acks), &token).await;
            return;
        }
        let worker = worker.clone();
        self.0 = Some(tokio::spawn(async move { worker.ack_all(&refs(&acks), &token).await }));
    }

    /// Waits for the ack in flight, if any.
    async fn settle(&mut self) {
        if let Some(ack) = self.0.take()
            && let Err(e) = ack.await
        {
            tracing::error!(error = %e, "an ack task failed: its messages come back after their lease");
        }
    }
}

impl Drop for AckInFlight {
    /// A loop that is dropped without settling (its task aborted) takes its
    /// ack with it: its messages come back after their lease.
    fn drop(&mut self) {
        if let Some(ack) = self.0.take() {
            ack.abort();
        }
    }
}

/// Acks as [`Worker::ack_all`] takes them.
fn refs(acks: &[(String, Option<String>)]) -> Vec<(&str, Option<&str>)> {
    acks.iter().map(|(id, ctid)| (id.as_str(), ctid.as_deref())).collect()
}
