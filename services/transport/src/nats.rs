//! NATS: a JetStream stream with a durable pull consumer (at-least-once),
//! or core NATS publish/subscribe (at-most-once).
//!
//! JetStream: the stream `haunt-orders` captures the subject
//! `haunt.orders` in file storage, with the work-queue retention policy: a
//! message leaves the stream when it is acked, so the stream holds exactly
//! what is not yet acked, and the final state can list it. The relay
//! publishes each envelope with the `Nats-Msg-Id` header set to its message
//! id, so a republish within the stream's duplicate window (two minutes) is
//! acked as a duplicate and not stored twice; with `Options::confirms` a
//! batch is `Ok` once every publish ack came back. Every worker pulls from
//! one durable consumer, `haunt-workers` (so the workers share the
//! messages), with explicit acks and an ack wait of
//! `Options::visibility_timeout`: **a delivery not acked within the ack
//! wait is redelivered, to whichever worker pulls next, with its delivery
//! count raised**, whether or not the first worker is still alive. The
//! delivery count is the server's (`delivered` in the message's ack
//! subject). An ack is a `+ACK` request that the server answers (a "double
//! ack"), so `Consumer::ack` returns once the server processed it.
//!
//! Depth: the stream's messages, listed by id, read one by one from the
//! stream (`STREAM.MSG.GET`, next by subject, skipping the acked ones that
//! are gone), up to [`LIST_MAX`] of them; past that, a count. The stream
//! does not keep a delivery count per message, and the consumer only
//! reports the highest stream sequence it delivered, so a listed message's
//! count is a lower bound: 0 if the consumer never delivered it, 1 if it
//! did (it may have been delivered more times).
//!
//! Core NATS: a publish reaches whoever is subscribed to `haunt.orders` at
//! that instant; the server stores nothing and nothing is acked, so a
//! worker that is down or dies holding a message loses it. The workers
//! subscribe in one queue group, [`QUEUE_GROUP`], so that each message goes
//! to one of them, as a work queue over core NATS is built (a plain
//! subscription would give every worker every message, as Redis Pub/Sub
//! does). Both modes use
//! one subject: a core publish on a server where the stream exists is also
//! captured by the stream (haunt runs one mode per broker).

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, pull};
use async_nats::jetstream::stream::{self, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, Context};
use async_nats::{Client, HeaderMap};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;

use crate::{
    Consumer, DESTINATION, Delivery, Depth, Envelope, Held, Inspector, Options, Publisher, Receipt, TransportError,
    TransportSpec,
};

/// The stream's name (stream names cannot contain dots).
const STREAM: &str = "haunt-orders";

/// The core-NATS queue group every worker joins.
const QUEUE_GROUP: &str = "haunt-workers";

/// The durable consumer every worker pulls from.
const DURABLE: &str = "haunt-workers";

/// Deliveries the consumer may have out unacked across all workers before
/// the server stops delivering: far above a run's in-flight batches, and a
/// bound on what a stuck fleet holds.
const ACK_PENDING_MAX: i64 = 10_000;

/// The most messages the final state lists one by one (a request each);
/// past it the depth is a count.
const LIST_MAX: u64 = 10_000;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn broker(e: impl std::fmt::Display) -> TransportError {
    TransportError::Broker { broker: "nats", why: e.to_string() }
}

fn unconfirmed(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unconfirmed { broker: "nats", why: e.to_string() }
}

fn is_jetstream(spec: TransportSpec) -> bool {
    spec.mode() == "jetstream"
}

async fn connect(url: &str) -> Result<Client, TransportError> {
    async_nats::ConnectOptions::new().connection_timeout(CONNECT_TIMEOUT).connect(url).await.map_err(broker)
}

fn stream_config() -> stream::Config {
    stream::Config {
        name: STREAM.into(),
        subjects: vec![DESTINATION.into()],
        storage: StorageType::File,
        retention: RetentionPolicy::WorkQueue,
        ..Default::default()
    }
}

/// Creates the stream unless it exists (idempotent).
async fn declare(js: &Context) -> Result<stream::Stream, TransportError> {
    js.get_or_create_stream(stream_config()).await.map_err(broker)
}

pub(crate) async fn publisher(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    let client = connect(url).await?;
    let js = if is_jetstream(spec) {
        let js = jetstream::new(client.clone());
        declare(&js).await?;
        Some(js)
    } else {
        None
    };
    Ok(Box::new(NatsPublisher { client, js, confirms: options.confirms }))
}

pub(crate) async fn consumer(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Consumer>, TransportError> {
    let client = connect(url).await?;
    if !is_jetstream(spec) {
        let subscriber = client.queue_subscribe(DESTINATION, QUEUE_GROUP.into()).await.map_err(broker)?;
        // The subscription is registered once the server saw it: a publish
        // after this returns reaches it.
        client.flush().await.map_err(broker)?;
        return Ok(Box::new(CoreSubscriber { _client: client, subscriber }));
    }
    let js = jetstream::new(client.clone());
    let stream = declare(&js).await?;
    let config = pull::Config {
        durable_name: Some(DURABLE.into()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: options.visibility_timeout,
        deliver_policy: DeliverPolicy::All,
        max_ack_pending: ACK_PENDING_MAX,
        ..Default::default()
    };
    // Create or update: every worker asks for the same consumer.
    let consumer: PullConsumer = stream.create_consumer(config).await.map_err(broker)?;
    Ok(Box::new(JetStreamConsumer { client, consumer }))
}

pub(crate) async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    let client = connect(url).await?;
    Ok(if is_jetstream(spec) { Box::new(Stream { js: jetstream::new(client) }) } else { Box::new(Subject) })
}

#[derive(Debug)]
struct NatsPublisher {
    client: Client,
    js: Option<Context>,
    confirms: bool,
}

impl Publisher for NatsPublisher {
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let Some(js) = &self.js else {
                for envelope in batch {
                    self.client.publish(DESTINATION, envelope.to_body().into()).await.map_err(unconfirmed)?;
                }
                // Written to the socket; core NATS confirms nothing more.
                return self.client.flush().await.map_err(unconfirmed);
            };
            let mut acks = Vec::with_capacity(batch.len());
            for envelope in batch {
                let mut headers = HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, envelope.message_id.as_str());
                let ack = js
                    .publish_with_headers(DESTINATION, headers, envelope.to_body().into())
                    .await
                    .map_err(unconfirmed)?;
                acks.push(ack);
            }
            if !self.confirms {
                // The bug mode: sent, and no ack waited for.
                drop(acks);
                return self.client.flush().await.map_err(unconfirmed);
            }
            for ack in acks {
                // A duplicate is confirmed too: the stream holds the first copy.
                ack.await.map_err(unconfirmed)?;
            }
            Ok(())
        })
    }
}

#[derive(Debug)]
struct JetStreamConsumer {
    client: Client,
    consumer: PullConsumer,
}

impl JetStreamConsumer {
    /// A pulled message as a delivery, or `None` after acking one that is
    /// not an envelope.
    async fn delivery(&self, message: jetstream::Message) -> Result<Option<Delivery>, TransportError> {
        let delivered = message.info().map_err(broker)?.delivered;
        let reply = message.reply.as_ref().map(|s| s.to_string()).unwrap_or_default();
        match Envelope::from_body(&message.payload) {
            Ok(envelope) => Ok(Some(Delivery { envelope, delivery_count: delivered, receipt: Receipt(reply) })),
            Err(e) => {
                tracing::warn!(error = %e, "dropping a stream message that is not a haunt envelope");
                message.double_ack().await.map_err(broker)?;
                Ok(None)
            }
        }
    }
}

impl Consumer for JetStreamConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            let max = max.max(1);
            let mut out = Vec::new();
            // First one message, waiting for it; then, without waiting, what
            // else is there. One pull of `max` with a wait would hold the
            // batch open for the whole wait when fewer than `max` arrive, and
            // a pull dropped before it ends leaves the server delivering to
            // nobody (those deliveries come back only after the ack wait).
            // A pull without an expiry would wait forever: a zero wait is a
            // plain fetch of what is there.
            let mut first = if wait.is_zero() {
                self.consumer.fetch().max_messages(1).messages().await.map_err(broker)?
            } else {
                self.consumer.batch().max_messages(1).expires(wait).messages().await.map_err(broker)?
            };
            match first.next().await {
                None => return Ok(out),
                Some(Err(e)) => return Err(broker(e)),
                Some(Ok(message)) => out.extend(self.delivery(message).await?),
            }
            if max > 1 {
                let mut more = self.consumer.fetch().max_messages(max - 1).messages().await.map_err(broker)?;
                while let Some(message) = more.next().await {
                    match message {
                        Ok(message) => out.extend(self.delivery(message).await?),
                        // What came before is delivered; the rest stays for later.
                        Err(e) => {
                            tracing::debug!(error = %e, "a fetch ended early");
                            break;
                        }
                    }
                }
            }
            Ok(out)
        })
    }

    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let acks = receipts.iter().map(|receipt| self.client.request(receipt.0.clone(), "+ACK".into()));
            for answered in futures_util::future::join_all(acks).await {
                answered.map_err(broker)?;
            }
            Ok(())
        })
    }
}

/// A core NATS subscription: what arrives is settled on arrival.
struct CoreSubscriber {
    // Kept so that the connection lives as long as the subscription.
    _client: Client,
    subscriber: async_nats::Subscriber,
}

impl std::fmt::Debug for CoreSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoreSubscriber")
    }
}

impl Consumer for CoreSubscriber {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(crate::receive_published(
            &mut self.subscriber,
            |m: &async_nats::Message| &m.payload[..],
            max,
            wait,
            "nats",
        ))
    }

    fn ack<'a>(&'a mut self, _receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }

    fn acks_on_receipt(&self) -> bool {
        true
    }
}

/// The stream, for declaring and for the final state.
#[derive(Debug)]
struct Stream {
    js: Context,
}

impl Inspector for Stream {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move { declare(&self.js).await.map(drop) })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async move {
            let stream = self.js.get_stream(STREAM).await.map_err(broker)?;
            let state = stream.get_info().await.map_err(broker)?.state;
            if state.messages > LIST_MAX {
                return Ok(Depth::Counted(state.messages));
            }
            // The highest stream sequence the consumer delivered (none if it
            // does not exist yet).
            let delivered_to = match stream.consumer_info(DURABLE).await {
                Ok(info) => info.delivered.stream_sequence,
                Err(_) => 0,
            };
            let mut held = Vec::new();
            let mut from = state.first_sequence.max(1);
            // Bounded by the count read above: messages published meanwhile
            // are not waited for.
            while (held.len() as u64) < state.messages {
                let message = stream.raw_message_builder().sequence(from).next_by_subject(DESTINATION).send().await;
                let message = match message {
                    Ok(message) => message,
                    Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => break,
                    Err(e) => return Err(broker(e)),
                };
                from = message.sequence + 1;
                match Envelope::from_body(&message.payload) {
                    Ok(envelope) => held.push(Held {
                        message_id: envelope.message_id,
                        event_id: envelope.event_id,
                        delivery_count: i64::from(message.sequence <= delivered_to),
                    }),
                    Err(e) => {
                        tracing::warn!(sequence = message.sequence, error = %e, "a stream message that is not a haunt envelope")
                    }
                }
            }
            Ok(Depth::Listed(held))
        })
    }
}

/// Core NATS keeps nothing: there is nothing to declare and nothing held.
#[derive(Debug)]
struct Subject;

impl Inspector for Subject {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async { Ok(Depth::Listed(Vec::new())) })
    }
}
