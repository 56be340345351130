//! RabbitMQ (AMQP 0.9.1): a durable quorum queue, consumed with manual acks
//! (at-least-once) or automatic acks (at-most-once).
//!
//! Both modes use one queue, `haunt.orders`, declared durable with
//! `x-queue-type = quorum`: a quorum queue keeps its messages on disk
//! through a kill of the node, and it counts deliveries (the
//! `x-delivery-count` header). Messages are published persistent
//! (delivery mode 2) and mandatory (a message no queue takes comes back
//! instead of vanishing). With `Options::confirms` the channel is in
//! confirm mode and a batch is `Ok` only once the broker acked every
//! message of it; without, nothing is waited for.
//!
//! `manual-ack`: a consumer holds up to [`PREFETCH`] unacked deliveries;
//! `Consumer::ack` is `basic.ack` per delivery tag. **A delivery that is
//! never acked stays with its channel, not given to any other consumer, for
//! as long as that channel stays open**: RabbitMQ has no visibility timeout
//! (`Options::visibility_timeout` is ignored by the client). Its bound on
//! an unacked delivery is the server's `consumer_timeout` (30 minutes by
//! default): a channel holding a delivery longer is closed by the broker
//! with PRECONDITION_FAILED. When the channel or its connection closes (the
//! worker exits, crashes or loses its link, or the timeout fires), the
//! broker requeues the delivery and gives it to another consumer with
//! `redelivered` set. The contract test shows a second consumer getting
//! nothing while the first one's channel is open (the broker there keeps
//! the default); a run sets `consumer_timeout` to its visibility timeout
//! and checks the channel's deliveries four times as often
//! (`channel_tick_interval`, `haunt_chaos::systems::brokers`), so a lost ack comes
//! back as it would from a broker with a visibility timeout.
//!
//! Delivery count: a quorum queue sets `x-delivery-count` on a requeued
//! message to the number of earlier deliveries, so the count is that plus
//! one; without the header (a first delivery) it is 1, or 2 when the
//! broker flags a redelivery anyway.
//!
//! `auto-ack`: `basic.consume` with `no_ack`; the broker forgets a message
//! as it sends it, so a worker that dies before applying it loses it.
//!
//! Depth: AMQP cannot list a queue's messages without consuming them, so
//! the depth is a count. A passive `queue.declare` counts only the *ready*
//! messages, not those delivered and unacked, and the management HTTP API
//! that counts both is a plugin haunt does not enable (it slows the node's
//! boot); `rabbitmqctl list_queues` would need the node's Erlang cookie,
//! which a client does not have. But the unacked ones return to ready as
//! soon as the channels holding them close, and haunt stops its workers
//! before it reads the final state: once no consumer is attached, the ready
//! count *is* everything the queue holds. So in `manual-ack` mode the
//! inspector refuses to count while consumers are attached (after waiting
//! [`DETACH_WAIT`] for closing ones to go), rather than report a count that
//! misses what they hold. In `auto-ack` mode nothing is ever unacked, and
//! the ready count is the depth whoever is attached. A quorum queue that is
//! still recovering after a restart of the node counts 0, so a zero is
//! reported only once it held for [`RECOVERY_WAIT`] (an empty queue takes
//! that long to read).
//!
//! Restarts (RabbitMQ 3.10.8, measured): a quorum queue and its confirmed
//! messages survive a SIGKILL of the node, provided the queue was declared
//! at least about a second before; one declared about 0.1 s before the kill
//! did not come back at all (the restarted node registered no Raft member
//! for it, and a consume failed with INTERNAL_ERROR, "leader not known").
//!
//! A connection that broke is opened again on the next call. Receipts carry
//! the connection they came from: an ack for a delivery of an earlier
//! connection is dropped (the broker requeued that delivery when the
//! connection closed, and a tag is only valid on its own channel).

use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::{
    Consumer, DESTINATION, Delivery, Depth, Envelope, Inspector, Options, Publisher, Receipt, TransportError,
    TransportSpec,
};

/// Unacked deliveries a consumer may hold: enough for a worker's batches
/// in flight, few enough that a worker that hangs holds back little.
const PREFETCH: u16 = 256;

/// How long the inspector waits for consumers that are closing to detach
/// before it refuses to count: the broker processes a connection's close
/// asynchronously, so a worker that just exited can still be attached.
const DETACH_WAIT: Duration = Duration::from_secs(3);

/// How long a zero count must hold before the inspector calls the queue
/// empty: a quorum queue that is recovering after a restart of the node
/// answers a passive declare with 0 messages until its Raft member is up
/// (measured: for up to 3 s after the node accepted connections).
const RECOVERY_WAIT: Duration = Duration::from_secs(5);

/// The pause between two readings of the queue's counts.
const RECOUNT_DELAY: Duration = Duration::from_millis(250);

/// How long connecting (TCP and the AMQP handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn broker(e: impl std::fmt::Display) -> TransportError {
    TransportError::Broker { broker: "rabbitmq", why: e.to_string() }
}

fn unconfirmed(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unconfirmed { broker: "rabbitmq", why: e.to_string() }
}

fn manual_ack(spec: TransportSpec) -> bool {
    spec.mode() == "manual-ack"
}

async fn connect(url: &str) -> Result<Connection, TransportError> {
    let connecting = Connection::connect(url, ConnectionProperties::default());
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(conn) => conn.map_err(broker),
        Err(_) => Err(broker(format!("no connection to {url} within {CONNECT_TIMEOUT:?}"))),
    }
}

/// Declares the quorum queue on `channel` (idempotent).
async fn declare(channel: &Channel) -> Result<(), TransportError> {
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    channel.queue_declare(DESTINATION.into(), QueueDeclareOptions::durable(), arguments).await.map_err(broker)?;
    Ok(())
}

pub(crate) async fn publisher(
    _spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    let mut publisher = RabbitPublisher { url: url.to_owned(), confirms: options.confirms, open: None };
    publisher.channel().await?;
    Ok(Box::new(publisher))
}

pub(crate) async fn consumer(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Consumer>, TransportError> {
    let mut consumer = RabbitConsumer {
        url: url.to_owned(),
        tag: options.client_id.clone(),
        manual_ack: manual_ack(spec),
        generation: 0,
        open: None,
    };
    consumer.subscribe().await?;
    Ok(Box::new(consumer))
}

pub(crate) async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    Ok(Box::new(Queue { url: url.to_owned(), manual_ack: manual_ack(spec) }))
}

/// An open connection and the one channel used on it.
#[derive(Debug)]
struct Open {
    // Kept so that the connection closes when this is dropped, not before.
    _conn: Connection,
    channel: Channel,
}

impl Open {
    fn usable(&self) -> bool {
        self.channel.status().connected()
    }
}

#[derive(Debug)]
struct RabbitPublisher {
    url: String,
    confirms: bool,
    open: Option<Open>,
}

impl RabbitPublisher {
    /// The channel, opened again if the last one broke.
    async fn channel(&mut self) -> Result<&Channel, TransportError> {
        if !self.open.as_ref().is_some_and(Open::usable) {
            self.open = None;
            let conn = connect(&self.url).await?;
            let channel = conn.create_channel().await.map_err(broker)?;
            declare(&channel).await?;
            if self.confirms {
                channel.confirm_select(ConfirmSelectOptions::default()).await.map_err(broker)?;
            }
            self.open = Some(Open { _conn: conn, channel });
        }
        Ok(&self.open.as_ref().expect("opened above").channel)
    }

    async fn send(&mut self, batch: &[Envelope]) -> Result<(), TransportError> {
        let confirms = self.confirms;
        let channel = self.channel().await.map_err(|e| unconfirmed(e.to_string()))?;
        let mut pending = Vec::with_capacity(batch.len());
        for envelope in batch {
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(envelope.message_id.as_str().into())
                .with_content_type("application/json".into());
            let confirm = channel
                .basic_publish(
                    "".into(),
                    DESTINATION.into(),
                    BasicPublishOptions { mandatory: true, ..Default::default() },
                    &envelope.to_body(),
                    properties,
                )
                .await
                .map_err(unconfirmed)?;
            pending.push((envelope, confirm));
        }
        if !confirms {
            // The bug mode: the frames are on their way, nothing more is known.
            return Ok(());
        }
        for (envelope, confirm) in pending {
            let confirmation = confirm.await.map_err(unconfirmed)?;
            if !confirmation.is_ack() {
                return Err(unconfirmed(format!("the broker nacked {}", envelope.message_id)));
            }
            if confirmation.take_message().is_some() {
                return Err(unconfirmed(format!("no queue took {} (returned unroutable)", envelope.message_id)));
            }
        }
        Ok(())
    }
}

impl Publisher for RabbitPublisher {
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let sent = self.send(batch).await;
            if sent.is_err() {
                // A channel that failed a publish may be unusable (a broker
                // close); the next batch opens a fresh one.
                self.open = None;
            }
            sent
        })
    }
}

/// A consumer's connection, and the deliveries arriving on it.
struct Subscribed {
    open: Open,
    deliveries: lapin::Consumer,
}

impl std::fmt::Debug for Subscribed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscribed").field("open", &self.open).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct RabbitConsumer {
    url: String,
    tag: String,
    manual_ack: bool,
    /// Counts the connections opened, so that a receipt names its own.
    generation: u64,
    open: Option<Subscribed>,
}

/// The delivery count a quorum queue implies for `delivery`.
fn delivery_count(delivery: &lapin::message::Delivery) -> i64 {
    let earlier = delivery.properties.headers().as_ref().and_then(|headers| {
        headers.inner().iter().find(|(k, _)| k.as_str() == "x-delivery-count").and_then(|(_, v)| match v {
            AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortInt(n) => Some(i64::from(*n)),
            AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
            AMQPValue::LongInt(n) => Some(i64::from(*n)),
            AMQPValue::LongUInt(n) => Some(i64::from(*n)),
            AMQPValue::LongLongInt(n) => Some(*n),
            _ => None,
        })
    });
    match earlier {
        Some(n) => n + 1,
        None if delivery.redelivered => 2,
        None => 1,
    }
}

impl RabbitConsumer {
    /// Subscribes, again if the last connection broke.
    async fn subscribe(&mut self) -> Result<(), TransportError> {
        if !self.open.as_ref().is_some_and(|s| s.open.usable()) {
            self.open = None;
            let conn = connect(&self.url).await?;
            let channel = conn.create_channel().await.map_err(broker)?;
            declare(&channel).await?;
            if self.manual_ack {
                channel.basic_qos(PREFETCH, BasicQosOptions::default()).await.map_err(broker)?;
            }
            let options = BasicConsumeOptions { no_ack: !self.manual_ack, ..Default::default() };
            let deliveries = channel
                .basic_consume(DESTINATION.into(), self.tag.as_str().into(), options, FieldTable::default())
                .await
                .map_err(broker)?;
            self.generation += 1;
            self.open = Some(Subscribed { open: Open { _conn: conn, channel }, deliveries });
        }
        Ok(())
    }

    async fn take(&mut self, max: usize, wait: Duration) -> Result<Vec<Delivery>, TransportError> {
        self.subscribe().await?;
        let (generation, manual_ack) = (self.generation, self.manual_ack);
        let subscribed = self.open.as_mut().expect("subscribed above");
        let mut raw = Vec::new();
        match tokio::time::timeout(wait, subscribed.deliveries.next()).await {
            Err(_) => return Ok(Vec::new()),
            Ok(None) => return Err(broker("the broker cancelled the consumer")),
            Ok(Some(first)) => raw.push(first.map_err(broker)?),
        }
        // Whatever else already arrived joins the batch.
        while raw.len() < max {
            match subscribed.deliveries.next().now_or_never() {
                Some(Some(next)) => raw.push(next.map_err(broker)?),
                _ => break,
            }
        }
        let mut out = Vec::with_capacity(raw.len());
        for delivery in raw {
            match Envelope::from_body(&delivery.data) {
                Ok(envelope) => out.push(Delivery {
                    envelope,
                    delivery_count: delivery_count(&delivery),
                    receipt: Receipt(format!("{generation}:{}", delivery.delivery_tag)),
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "dropping a message that is not a haunt envelope");
                    if manual_ack {
                        subscribed
                            .open
                            .channel
                            .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
                            .await
                            .map_err(broker)?;
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Consumer for RabbitConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            let taken = self.take(max, wait).await;
            if taken.is_err() {
                self.open = None;
            }
            taken
        })
    }

    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if !self.manual_ack {
                return Ok(());
            }
            let generation = self.generation;
            let Some(subscribed) = self.open.as_ref() else {
                // The connection those deliveries came on is gone: the broker
                // requeued them.
                return Ok(());
            };
            for receipt in receipts {
                let Some((from, tag)) = receipt.0.split_once(':') else {
                    return Err(broker(format!("not a rabbitmq receipt: {:?}", receipt.0)));
                };
                if from != generation.to_string() {
                    continue;
                }
                let tag: u64 = tag.parse().map_err(|_| broker(format!("not a delivery tag: {tag:?}")))?;
                subscribed.open.channel.basic_ack(tag, BasicAckOptions::default()).await.map_err(broker)?;
            }
            Ok(())
        })
    }

    fn acks_on_receipt(&self) -> bool {
        !self.manual_ack
    }
}

/// The queue, for declaring and for the final state. Each call opens its
/// own connection: a passive declare of a missing queue closes its channel,
/// and a broker restart breaks a kept connection.
#[derive(Debug)]
struct Queue {
    url: String,
    manual_ack: bool,
}

impl Inspector for Queue {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            let conn = connect(&self.url).await?;
            let channel = conn.create_channel().await.map_err(broker)?;
            declare(&channel).await?;
            conn.close(200, "declared".into()).await.map_err(broker)
        })
    }

    /// Ready messages only, consumers or not: nothing ready for `settle`
    /// (at least [`RECOVERY_WAIT`]) means drained. With `consumer_timeout`
    /// below `settle` (the harness sets it to the visibility timeout), a
    /// delivery whose ack was lost is back in the ready count by then.
    fn drained(&self, settle: Duration) -> BoxFuture<'_, Result<bool, TransportError>> {
        Box::pin(async move {
            let conn = connect(&self.url).await?;
            let since = Instant::now();
            let passive = QueueDeclareOptions { passive: true, durable: true, ..Default::default() };
            let drained = loop {
                let channel = conn.create_channel().await.map_err(broker)?;
                let queue = channel
                    .queue_declare(ShortString::from(DESTINATION), passive, FieldTable::default())
                    .await
                    .map_err(broker)?;
                let _ = channel.close(200, "counted".into()).await;
                if queue.message_count() > 0 {
                    break false;
                }
                if since.elapsed() >= settle.max(RECOVERY_WAIT) {
                    break true;
                }
                tokio::time::sleep(RECOUNT_DELAY).await;
            };
            let _ = conn.close(200, "counted".into()).await;
            Ok(drained)
        })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async move {
            let conn = connect(&self.url).await?;
            let started = Instant::now();
            let mut zero_since = None;
            let passive = QueueDeclareOptions { passive: true, durable: true, ..Default::default() };
            loop {
                // A fresh channel each time: a passive declare of a queue
                // that does not exist closes its channel.
                let channel = conn.create_channel().await.map_err(broker)?;
                let queue = channel
                    .queue_declare(ShortString::from(DESTINATION), passive, FieldTable::default())
                    .await
                    .map_err(broker)?;
                let (ready, consumers) = (queue.message_count(), queue.consumer_count());
                let _ = channel.close(200, "counted".into()).await;
                if !self.manual_ack || consumers == 0 {
                    if ready > 0 {
                        let _ = conn.close(200, "counted".into()).await;
                        return Ok(Depth::Counted(u64::from(ready)));
                    }
                    let zero_since = *zero_since.get_or_insert_with(Instant::now);
                    if zero_since.elapsed() >= RECOVERY_WAIT {
                        let _ = conn.close(200, "counted".into()).await;
                        return Ok(Depth::Counted(0));
                    }
                } else {
                    zero_since = None;
                    if started.elapsed() >= DETACH_WAIT {
                        let _ = conn.close(200, "not counted".into()).await;
                        return Err(broker(format!(
                            "{consumers} consumer(s) still attached to {DESTINATION}: the deliveries they hold \
                             unacked cannot be counted over AMQP ({ready} ready); stop the consumers first"
                        )));
                    }
                }
                tokio::time::sleep(RECOUNT_DELAY).await;
            }
        })
    }
}
