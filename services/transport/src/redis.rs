//! Redis: Streams with a consumer group (at-least-once), and Pub/Sub
//! (fire-and-forget).
//!
//! Streams: the relay `XADD`s each envelope; the server's reply is its
//! confirmation (with `appendfsync always`, as haunt runs it, after the
//! append reached the disk). A consumer first takes back entries another
//! consumer left unacked for longer than the visibility timeout
//! (`XAUTOCLAIM`), then reads new ones (`XREADGROUP … >`). An ack is `XACK`
//! and `XDEL`, so that the stream holds exactly what is not yet acked and the
//! final state can list it. A lost ack leaves the entry in the group's
//! pending list until another consumer claims it.
//!
//! Pub/Sub: `PUBLISH` reaches whoever is subscribed at that instant and the
//! server keeps nothing; a subscriber that is down, paused past its output
//! buffer or cut off never sees the message.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamPendingCountReply, StreamReadReply};
use redis::{AsyncConnectionConfig, Client, Value};

use crate::{
    Consumer, DESTINATION, Delivery, Depth, Envelope, Held, Inspector, Kind, Options, Publisher, Receipt,
    TransportError, TransportSpec,
};

const GROUP: &str = "haunt";
const FIELD: &str = "body";

fn broker(e: redis::RedisError) -> TransportError {
    TransportError::Broker { broker: "redis", why: e.to_string() }
}

/// A connection whose replies may take `wait` (a blocking read) and more.
async fn connect(url: &str, wait: Duration) -> Result<MultiplexedConnection, TransportError> {
    let client = Client::open(url).map_err(broker)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(wait + Duration::from_secs(5)));
    client.get_multiplexed_async_connection_with_config(&config).await.map_err(broker)
}

pub(crate) async fn publisher(
    spec: TransportSpec,
    url: &str,
    _options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    let conn = connect(url, Duration::ZERO).await?;
    Ok(Box::new(RedisPublisher { conn, streams: spec.kind == Kind::RedisStreams }))
}

pub(crate) async fn consumer(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Consumer>, TransportError> {
    if spec.kind == Kind::RedisPubSub {
        let client = Client::open(url).map_err(broker)?;
        let mut pubsub = client.get_async_pubsub().await.map_err(broker)?;
        pubsub.subscribe(DESTINATION).await.map_err(broker)?;
        return Ok(Box::new(Subscriber { messages: pubsub.into_on_message() }));
    }
    // A blocking read waits at most a second here; see `receive`.
    let conn = connect(url, Duration::from_secs(1)).await?;
    let inspector = Streams { conn: conn.clone() };
    inspector.declare().await?;
    Ok(Box::new(StreamConsumer {
        conn,
        name: options.client_id.clone(),
        min_idle_ms: options.visibility_timeout.as_millis() as u64,
    }))
}

pub(crate) async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    let conn = connect(url, Duration::ZERO).await?;
    Ok(match spec.kind {
        Kind::RedisPubSub => Box::new(Channel),
        _ => Box::new(Streams { conn }),
    })
}

#[derive(Debug)]
struct RedisPublisher {
    conn: MultiplexedConnection,
    streams: bool,
}

impl Publisher for RedisPublisher {
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            for envelope in batch {
                if self.streams {
                    pipe.cmd("XADD").arg(DESTINATION).arg("*").arg(FIELD).arg(envelope.to_body()).ignore();
                } else {
                    pipe.cmd("PUBLISH").arg(DESTINATION).arg(envelope.to_body()).ignore();
                }
            }
            pipe.query_async::<()>(&mut self.conn)
                .await
                .map_err(|e| TransportError::Unconfirmed { broker: "redis", why: e.to_string() })
        })
    }
}

#[derive(Debug)]
struct StreamConsumer {
    conn: MultiplexedConnection,
    name: String,
    min_idle_ms: u64,
}

/// An entry's envelope, or `None` (with a warning) for a body that is not one.
fn envelope_of(entry: &StreamId) -> Option<Envelope> {
    let body = match entry.map.get(FIELD) {
        Some(Value::BulkString(bytes)) => bytes.as_slice(),
        _ => &[],
    };
    match Envelope::from_body(body) {
        Ok(envelope) => Some(envelope),
        Err(e) => {
            tracing::warn!(entry = %entry.id, error = %e, "dropping a stream entry that is not a haunt envelope");
            None
        }
    }
}

impl StreamConsumer {
    /// Acks and deletes entries: the stream keeps only what is unacked.
    async fn settle(&mut self, ids: &[&str]) -> Result<(), TransportError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.cmd("XACK").arg(DESTINATION).arg(GROUP).arg(ids).ignore();
        pipe.cmd("XDEL").arg(DESTINATION).arg(ids).ignore();
        pipe.query_async::<()>(&mut self.conn).await.map_err(broker)
    }

    /// Turns entries into deliveries; settles those that are not envelopes.
    async fn deliveries(
        &mut self,
        entries: Vec<StreamId>,
        counts: &HashMap<String, usize>,
    ) -> Result<Vec<Delivery>, TransportError> {
        let mut out = Vec::with_capacity(entries.len());
        let mut junk = Vec::new();
        for entry in &entries {
            match envelope_of(entry) {
                Some(envelope) => out.push(Delivery {
                    envelope,
                    delivery_count: counts.get(&entry.id).copied().unwrap_or(1) as i64,
                    receipt: Receipt(entry.id.clone()),
                }),
                None => junk.push(entry.id.as_str()),
            }
        }
        self.settle(&junk).await?;
        Ok(out)
    }
}

impl Consumer for StreamConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            // First what another consumer (or this one, before a restart) left
            // unacked past the visibility timeout: that is the redelivery.
            let claimed: StreamAutoClaimReply = redis::cmd("XAUTOCLAIM")
                .arg(DESTINATION)
                .arg(GROUP)
                .arg(&self.name)
                .arg(self.min_idle_ms)
                .arg("0-0")
                .arg("COUNT")
                .arg(max)
                .query_async(&mut self.conn)
                .await
                .map_err(broker)?;
            if !claimed.deleted_ids.is_empty() {
                let gone: Vec<&str> = claimed.deleted_ids.iter().map(String::as_str).collect();
                self.settle(&gone).await?;
            }
            if !claimed.claimed.is_empty() {
                // Each claimed entry's delivery count, as the group counts them.
                let first = claimed.claimed.first().map(|e| e.id.clone()).unwrap_or_default();
                let last = claimed.claimed.last().map(|e| e.id.clone()).unwrap_or_default();
                let pending: StreamPendingCountReply = redis::cmd("XPENDING")
                    .arg(DESTINATION)
                    .arg(GROUP)
                    .arg(&first)
                    .arg(&last)
                    .arg(claimed.claimed.len())
                    .arg(&self.name)
                    .query_async(&mut self.conn)
                    .await
                    .map_err(broker)?;
                let counts = pending.ids.into_iter().map(|p| (p.id, p.times_delivered)).collect();
                return self.deliveries(claimed.claimed, &counts).await;
            }
            // Then new entries. The connection's reply timeout bounds a block
            // at a second: past it, the claim above runs again.
            let block_ms = wait.as_millis().clamp(1, 1000) as u64;
            let read: Option<StreamReadReply> = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(GROUP)
                .arg(&self.name)
                .arg("COUNT")
                .arg(max)
                .arg("BLOCK")
                .arg(block_ms)
                .arg("STREAMS")
                .arg(DESTINATION)
                .arg(">")
                .query_async(&mut self.conn)
                .await
                .map_err(broker)?;
            let entries = read.map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect()).unwrap_or_default();
            self.deliveries(entries, &HashMap::new()).await
        })
    }

    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            let ids: Vec<&str> = receipts.iter().map(|r| r.0.as_str()).collect();
            self.settle(&ids).await
        })
    }
}

/// The stream and its group, for declaring and for the final state.
#[derive(Debug)]
struct Streams {
    conn: MultiplexedConnection,
}

impl Inspector for Streams {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            // From id 0: entries the relay added before the group existed are
            // delivered too.
            let created: Result<(), _> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(DESTINATION)
                .arg(GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut conn)
                .await;
            match created {
                Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
                other => other.map_err(broker),
            }
        })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            // Acked entries are deleted, so every entry left is unacked:
            // unread, or delivered and pending.
            let entries: redis::streams::StreamRangeReply =
                redis::cmd("XRANGE").arg(DESTINATION).arg("-").arg("+").query_async(&mut conn).await.map_err(broker)?;
            let pending: StreamPendingCountReply = redis::cmd("XPENDING")
                .arg(DESTINATION)
                .arg(GROUP)
                .arg("-")
                .arg("+")
                .arg(entries.ids.len().max(1))
                .query_async(&mut conn)
                .await
                .map_err(broker)?;
            let counts: HashMap<String, usize> = pending.ids.into_iter().map(|p| (p.id, p.times_delivered)).collect();
            let held = entries
                .ids
                .iter()
                .filter_map(|entry| {
                    let envelope = envelope_of(entry)?;
                    Some(Held {
                        message_id: envelope.message_id,
                        event_id: envelope.event_id,
                        delivery_count: counts.get(&entry.id).copied().unwrap_or(0) as i64,
                    })
                })
                .collect();
            Ok(Depth::Listed(held))
        })
    }
}

/// A Pub/Sub subscription: what arrives is settled on arrival.
struct Subscriber {
    messages: redis::aio::PubSubStream,
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Subscriber")
    }
}

impl Consumer for Subscriber {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(crate::receive_published(
            &mut self.messages,
            |m: &redis::Msg| m.get_payload_bytes(),
            max,
            wait,
            "redis",
        ))
    }

    fn ack<'a>(&'a mut self, _receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }

    fn acks_on_receipt(&self) -> bool {
        true
    }
}

/// Pub/Sub keeps nothing: there is nothing to declare and nothing held.
#[derive(Debug)]
struct Channel;

impl Inspector for Channel {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async { Ok(()) })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async { Ok(Depth::Listed(Vec::new())) })
    }
}
