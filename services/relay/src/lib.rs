//! The outbox relay: the hop from the database to a broker.
//!
//! The API writes each order and its outbox row in one transaction. The
//! relay leases a batch of outbox rows (the same lease as a worker's on the
//! database queue), publishes them, waits for the broker's confirmation and
//! only then deletes them. A relay that dies between the confirmation and
//! the delete leaves rows whose lease expires: the next relay publishes them
//! again. That copy is expected; the inbox absorbs it. Deleting first would
//! lose the batch instead (bug mode `relay-marks-before-publish`), and not
//! waiting for the confirmation loses what a broker crash drops (bug mode
//! `no-publisher-confirms`).
//!
//! [`run`] is a whole relay process over an open store: the loop, and
//! `/metrics`, `/healthz` and `/readyz` (503 until the relay is connected
//! to the broker) on a listener.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use haunt_store::{Bug, ErrorWait, LeaseClock, Leased, Store};
use haunt_telemetry::metrics::RelayMetrics;
use haunt_transport::{Envelope, Links, Options, OrderClaim, Publisher, TransportSpec};
use tokio::net::TcpListener;
use tokio::sync::watch;

#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Names the relay in logs and to the broker.
    pub relay_id: String,
    pub transport: TransportSpec,
    /// The broker's URL as the relay reaches it (through its fault proxy).
    pub url: String,
    /// Outbox rows leased and published at once.
    pub batch_size_max: u32,
    /// How long a lease hides outbox rows from another relay: past it, rows
    /// published and not deleted are published again.
    pub visibility_timeout: Duration,
    /// How long an idle relay waits before leasing again.
    pub poll_interval: Duration,
    pub bug: Option<Bug>,
}

impl RelayConfig {
    pub fn new(transport: TransportSpec, url: String) -> RelayConfig {
        RelayConfig {
            relay_id: "relay".into(),
            transport,
            url,
            batch_size_max: 500,
            visibility_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_millis(20),
            bug: None,
        }
    }
}

/// Runs the relay until `shutdown` completes; the batch in hand is finished
/// first. `/metrics`, `/healthz` and `/readyz` are served on `listener` if
/// given.
pub async fn run(
    listener: Option<TcpListener>,
    store: Store,
    config: RelayConfig,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> std::io::Result<()> {
    let metrics = Arc::new(RelayMetrics::default());
    let links = Arc::new(Links::new(1));
    let (stop, stopped) = watch::channel(false);
    let serve = async {
        let Some(listener) = listener else { return Ok(()) };
        let (m, l) = (metrics.clone(), links.clone());
        let app = axum::Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route(
                "/readyz",
                get(move || {
                    let (ready, body) = l.report();
                    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                    async move { (status, [(header::CONTENT_TYPE, "application/json")], body).into_response() }
                }),
            )
            .route(
                "/metrics",
                get(move || {
                    let body = haunt_telemetry::metrics::encode(&m.registry);
                    async move {
                        ([(header::CONTENT_TYPE, haunt_telemetry::OPENMETRICS_CONTENT_TYPE)], body).into_response()
                    }
                }),
            );
        let mut until = stopped.clone();
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = until.wait_for(|s| *s).await;
            })
            .await
    };
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: no new leases, finishing the batch in hand");
        let _ = stop.send(true);
    };
    let relay = Relay { store, config, metrics: metrics.clone(), links: links.clone(), clock: PublishClock::default() };
    let ((), (), served) = tokio::join!(relay.run(stopped.clone()), signal, serve);
    served
}

#[derive(Debug)]
struct Relay {
    store: Store,
    config: RelayConfig,
    metrics: Arc<RelayMetrics>,
    /// Its publisher's connection to the broker, for `/readyz`.
    links: Arc<Links>,
    clock: PublishClock,
}

/// The relay's publish sequence: its clock's microseconds since the epoch,
/// kept strictly increasing (a message published in the same microsecond as
/// the one before it takes the next number). A relay killed and started
/// again goes on from its clock, so the numbers grow across restarts while
/// the clock does not step back by more than the time the restart took.
#[derive(Debug, Default)]
struct PublishClock(std::sync::atomic::AtomicI64);

impl PublishClock {
    fn next(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let ordering = std::sync::atomic::Ordering::Relaxed;
        let previous = self.0.fetch_update(ordering, ordering, |last| Some(now.max(last + 1))).expect("always Some");
        now.max(previous + 1)
    }
}

/// The outbox row as it travels, stamped with its publish sequence.
fn envelope(leased: &Leased, publish_seq: i64) -> Envelope {
    let headers = haunt_store::Headers { publish_seq: Some(publish_seq), ..leased.headers.clone() };
    Envelope {
        message_id: leased.message_id.clone(),
        event_id: leased.event_id.clone(),
        payload: leased.payload.clone(),
        headers: serde_json::to_string(&headers).expect("headers serialize"),
        enqueued_at_ms: leased.enqueued_at_ms,
        // An unreadable payload travels without a key; its consumer parks it.
        key: leased.event().ok().map(|event| event.item_id),
    }
}

impl Relay {
    async fn run(&self, shutdown: watch::Receiver<bool>) {
        let c = &self.config;
        let options = Options {
            client_id: c.relay_id.clone(),
            visibility_timeout: c.visibility_timeout,
            // BUG MODE no-publisher-confirms: publish and move on.
            confirms: c.bug != Some(Bug::NoPublisherConfirms),
            commit_on_receipt: false,
        };
        let mut publisher: Option<Box<dyn Publisher>> = None;
        let mut error_wait = ErrorWait::new(c.poll_interval);
        while !*shutdown.borrow() {
            let p = match &mut publisher {
                Some(p) => p,
                None => match self.connect(&options).await {
                    Ok(p) => {
                        error_wait.succeeded();
                        tracing::info!(relay_id = %c.relay_id, transport = %c.transport, "publishing");
                        self.links.connected();
                        publisher.insert(p)
                    }
                    Err(e) => {
                        tracing::warn!(relay_id = %c.relay_id, error = %e, "connecting to the broker failed");
                        wait(error_wait.failed(), &shutdown).await;
                        continue;
                    }
                },
            };
            // A broker that keeps each key's order gets the outbox in the
            // order it was written: one lease at a time, the oldest rows
            // first. Side by side leases would let a batch that failed, or
            // a dead relay's, be published after the rows behind it.
            let leased = if self.ordered() {
                self.store.lease_in_order(c.batch_size_max, c.visibility_timeout).await
            } else {
                self.store.lease(c.batch_size_max, c.visibility_timeout, LeaseClock::Database).await
            };
            let batch = match leased {
                Ok(batch) => {
                    error_wait.succeeded();
                    batch
                }
                Err(e) => {
                    tracing::warn!(relay_id = %c.relay_id, error = ?e, "leasing outbox rows failed");
                    wait(error_wait.failed(), &shutdown).await;
                    continue;
                }
            };
            if batch.is_empty() {
                wait(c.poll_interval, &shutdown).await;
                continue;
            }
            if let Err(e) = self.relay(p.as_mut(), &batch).await {
                tracing::warn!(relay_id = %c.relay_id, messages = batch.len(), error = %e,
                    "publish not confirmed; the rows stay in the outbox and are published again");
                self.metrics.publish_failures.inc_by(batch.len() as u64);
                if self.ordered() {
                    // Visible again now, and still the oldest: the next lease's
                    // first, rather than held until its lease runs out.
                    if let Err(e) = self.store.release(&batch[0].lease_token).await {
                        tracing::warn!(relay_id = %c.relay_id, error = ?e, "giving the rows back failed; they wait for their lease to end");
                    }
                }
                publisher = None;
                self.links.dropped();
                wait(error_wait.failed(), &shutdown).await;
            }
        }
    }

    /// Whether the broker keeps each key's order, so the outbox must reach
    /// it in order.
    fn ordered(&self) -> bool {
        self.config.transport.order_claim() == OrderClaim::PerKey
    }

    async fn connect(&self, options: &Options) -> Result<Box<dyn Publisher>, haunt_transport::TransportError> {
        let c = &self.config;
        // The queue or stream must exist before the first publish: a broker
        // routes a message to nowhere otherwise.
        haunt_transport::inspector(c.transport, &c.url).await?.declare().await?;
        haunt_transport::publisher(c.transport, &c.url, options).await
    }

    /// One leased batch: published, confirmed, then deleted from the outbox.
    async fn relay(
        &self,
        publisher: &mut dyn Publisher,
        batch: &[Leased],
    ) -> Result<(), haunt_transport::TransportError> {
        let token = batch[0].lease_token.as_str();
        let ids: Vec<&str> = batch.iter().map(|l| l.message_id.as_str()).collect();
        let envelopes: Vec<Envelope> = batch.iter().map(|l| envelope(l, self.clock.next())).collect();
        if self.config.bug == Some(Bug::RelayMarksBeforePublish) {
            // BUG MODE relay-marks-before-publish: the rows are gone before the
            // broker has the messages; a relay that dies here loses them.
            self.delete(&ids, token).await;
            publisher.publish(&envelopes).await?;
        } else {
            publisher.publish(&envelopes).await?;
            self.delete(&ids, token).await;
        }
        self.metrics.published.inc_by(batch.len() as u64);
        tracing::debug!(relay_id = %self.config.relay_id, messages = batch.len(), "published");
        Ok(())
    }

    /// Deletes relayed rows; a row that could not be deleted is published
    /// again once its lease expires.
    async fn delete(&self, ids: &[&str], token: &str) {
        match self.store.ack_batch(ids, token).await {
            Ok(deleted) if deleted < ids.len() as u64 => {
                let left = ids.len() as u64 - deleted;
                self.metrics.outbox_delete_failures.inc_by(left);
                tracing::warn!(left, "outbox rows' lease expired before the delete: they are published again");
            }
            Ok(_) => {}
            Err(e) => {
                self.metrics.outbox_delete_failures.inc_by(ids.len() as u64);
                tracing::warn!(error = ?e, "deleting published outbox rows failed: they are published again");
            }
        }
    }
}

async fn wait(how_long: Duration, shutdown: &watch::Receiver<bool>) {
    let mut shutdown = shutdown.clone();
    tokio::select! {
        _ = tokio::time::sleep(how_long) => {}
        _ = shutdown.changed() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leased(payload: &str) -> Leased {
        Leased {
            message_id: "m1".into(),
            event_id: "e1".into(),
            payload: payload.into(),
            headers: Default::default(),
            delivery_count: 1,
            lease_token: "t".into(),
            lease_until_ms: 0,
            enqueued_at_ms: 7,
            ctid: None,
        }
    }

    #[test]
    fn an_envelope_is_keyed_by_its_events_item_and_an_unreadable_one_by_nothing() {
        let event = r#"{"event_id":"e1","order_id":"o1","item_id":"item-4","qty":2}"#;
        let keyed = envelope(&leased(event), 5);
        assert_eq!(keyed.key.as_deref(), Some("item-4"));
        assert_eq!((keyed.message_id.as_str(), keyed.payload.as_str(), keyed.enqueued_at_ms), ("m1", event, 7));
        assert_eq!(envelope(&leased("not json"), 6).key, None);
        let headers: haunt_store::Headers = serde_json::from_str(&keyed.headers).unwrap();
        assert_eq!(headers.publish_seq, Some(5), "the headers carry the publish sequence");
    }

    #[test]
    fn the_publish_sequence_grows_strictly_even_within_a_microsecond() {
        let clock = PublishClock::default();
        let seqs: Vec<i64> = (0..10_000).map(|_| clock.next()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "not strictly increasing");
        let now_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as i64;
        assert!(seqs[0] <= now_us && seqs[0] > now_us - 60_000_000, "microseconds of the clock: {}", seqs[0]);
    }
}
