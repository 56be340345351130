//! Apache Kafka, through librdkafka (the `rdkafka` crate, its bundled
//! librdkafka 2.12).
//!
//! One topic (`haunt.orders`, [`PARTITIONS`] partitions) and one consumer
//! group (`haunt.workers`): every lease loop of every worker is a member,
//! and the group coordinator spreads the partitions over them. A message's
//! key is the envelope's key (the order's item), so a key's messages share
//! a partition, which Kafka keeps in order (`OrderClaim::PerKey`).
//!
//! Kafka has no per-message ack: a consumer commits an offset per
//! partition, and a commit covers every offset below it. So the consumer
//! keeps, per partition, the offsets of the batch in hand and commits up to
//! the first one that is not settled:
//!
//! - an acked delivery is settled; the commit is sent at once and waited for
//!   (an error is the ack's error: a commit refused after a rebalance);
//! - a delivery handed back (`release`) is not: the partition seeks back to
//!   it, so it and everything after it come again, in order (the inbox
//!   absorbs what was already applied), as Spring Kafka's error handler does;
//! - a delivery whose ack never came (the `ack-loss` fault) is a commit that
//!   never reached the broker. The next receive takes the batch as done, as
//!   a Kafka consumer's position has moved past it, and the next commit
//!   covers it; until then a consumer that dies leaves it to be delivered
//!   again. A receive that finds commits owed sends them (at most once a
//!   second), as librdkafka's auto-commit would, so that an idle partition
//!   does not keep a lag that a lost commit left.
//!
//! The group speaks Kafka's consumer protocol (KIP-848, `group.protocol=
//! consumer`): the coordinator assigns partitions and moves them one member
//! at a time, so a member that comes or goes stops no one else. Under the
//! classic protocol every change stopped the whole group until each member
//! had rejoined or timed out: after a broker's restart, 6 consumers read
//! nothing for 12 s, and a worker killed meanwhile held no batch to lose.
//! The session and the heartbeat are the broker's settings under this
//! protocol (`group.consumer.session.timeout.ms`, 6 s here; see the broker's
//! layout in `haunt-chaos`). A consumer that dies keeps its partitions until
//! its session ends; then their new owner starts from the last commit.
//! Kafka counts no deliveries: the count a delivery carries is this
//! consumer's own (1 after a rebalance).
//!
//! A Kafka-compatible broker that speaks only the classic protocol (tansu
//! 0.6) is named with `?group=classic` after its servers: the consumers
//! then join the classic way, with a session of [`CLASSIC_SESSION_TIMEOUT_MS`]
//! that the client sets, and every change of the group stops it as above.
//!
//! Modes:
//! - `kafka:at-least-once` (the bare name): an idempotent producer with
//!   `acks=all`; the consumer commits after the effect.
//! - `kafka:at-most-once`: the consumer commits what it received before it
//!   returns it, before the effect; a consumer that dies holding it loses it.
//! - `kafka:eos`: the relay's producer is transactional (one transaction per
//!   batch, `transactional.id` = the relay's id, so a restarted relay fences
//!   its predecessor and aborts what it left open), and consumers read
//!   `read_committed`. Kafka's exactly-once ends at Kafka's edge: the
//!   effect, in the database, is outside it.
//! - `kafka:acks-1`: the leader alone acknowledges a write (`acks=1`, no
//!   idempotence): nothing is promised across a leader's failure.
//!
//! Depth: the group's lag, listed. The inspector reads each partition from
//! the group's committed offset to its end (the last stable offset under
//! `read_committed`) without joining the group, and names what it finds.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message as _;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::{
    Consumer, Delivery, Depth, Envelope, Held, Inspector, Options, Publisher, Receipt, TransportError, TransportSpec,
};

const TOPIC: &str = crate::DESTINATION;
const GROUP: &str = "haunt.workers";

/// The topic's partitions: enough for the consumers of a default run (3
/// workers with 8 lease loops each share them; the rest wait as standbys).
pub const PARTITIONS: i32 = 8;

/// Under the classic group protocol (`?group=classic`), a member that has
/// not heartbeated for this long leaves the group and its partitions go to
/// the others: 6 s, Kafka's least by default (`group.min.session.timeout.ms`),
/// so that a killed worker's partitions move within a short run.
pub const CLASSIC_SESSION_TIMEOUT_MS: u32 = 6_000;
/// A third of the session, as Kafka advises.
const CLASSIC_HEARTBEAT_INTERVAL_MS: u32 = 2_000;

/// A member that does not poll for this long is taken out of the group:
/// longer than a batch's apply and its retries' backoff.
pub const MAX_POLL_INTERVAL_MS: u32 = 30_000;

/// How long a request (a publish, a commit, a transaction's end) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a message may wait for the broker's acknowledgement before the
/// producer gives up on it (`message.timeout.ms`), where it gives up at all
/// (see [`message_timeout`]): the relay learns of a broker out of reach
/// within it and publishes the batch again. Kafka's default is 5 minutes. A
/// producer that is not waited on (bug mode `no-publisher-confirms`) drops
/// what times out.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(3);

/// `message.timeout.ms` of a publisher: none (0, librdkafka's "infinite")
/// for an idempotent producer whose confirms the relay waits for outside a
/// transaction (`kafka` and `kafka:at-most-once`), [`DELIVERY_TIMEOUT`] for
/// the others. An idempotent producer that gives up on one message still
/// delivers the ones behind it in the same partition, and the relay's retry
/// then publishes it after them: a key's order broken by the publisher
/// itself (7 inversions of one key in a run whose partition leader was cut
/// off, 2026-12-05, when every mode timed out at 3 s). Never given up on,
/// a message is retried in its place until the partition has a leader
/// again, and the relay waits. A transaction's messages are all aborted
/// with the one that fails, so its order holds with the timeout
/// (librdkafka wants it under the transaction's); `acks=1` is not
/// idempotent and promises no order under faults; an unconfirmed producer
/// must time out to show what it loses.
fn message_timeout(mode: Mode, confirms: bool) -> String {
    if confirms && matches!(mode, Mode::AtLeastOnce | Mode::AtMostOnce) {
        "0".to_owned()
    } else {
        DELIVERY_TIMEOUT.as_millis().to_string()
    }
}

/// How often a receive sends the commits it owes.
const COMMIT_REPAIR: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    AtLeastOnce,
    AtMostOnce,
    Eos,
    Acks1,
}

impl Mode {
    fn of(spec: TransportSpec) -> Mode {
        match spec.mode() {
            "at-most-once" => Mode::AtMostOnce,
            "eos" => Mode::Eos,
            "acks-1" => Mode::Acks1,
            _ => Mode::AtLeastOnce,
        }
    }

    fn isolation(self) -> &'static str {
        if self == Mode::Eos { "read_committed" } else { "read_uncommitted" }
    }
}

/// How long the topic's creation is tried again on a cluster that is still
/// coming up.
const DECLARE_LIMIT: Duration = Duration::from_secs(60);

/// Whether a refusal of the topic's creation is one a cluster still coming
/// up gives, and passes.
fn passes(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::OperationTimedOut
            | C::RequestTimedOut
            | C::DestroyBroker
            | C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::NotController
            | C::InvalidReplicationFactor
            | C::LeaderNotAvailable
            | C::BrokerNotAvailable
    )
}

fn broker(why: impl std::fmt::Display) -> TransportError {
    TransportError::Broker { broker: "kafka", why: why.to_string() }
}

fn unconfirmed(why: impl std::fmt::Display) -> TransportError {
    TransportError::Unconfirmed { broker: "kafka", why: why.to_string() }
}

/// How the consumers join their group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupProtocol {
    /// Kafka's consumer protocol (KIP-848): the default.
    Consumer,
    /// The classic protocol, for a broker without KIP-848 (`?group=classic`).
    Classic,
}

const URL_FORM: &str = "kafka://HOST:PORT[,HOST:PORT…][?group=classic]";

/// `kafka://host:port[,host:port…][?group=classic]`: librdkafka's
/// `bootstrap.servers`, and how the consumers join their group.
fn parse_url(url: &str) -> Result<(String, GroupProtocol), TransportError> {
    let rest = url.strip_prefix("kafka://").unwrap_or(url);
    let (servers, query) = rest.split_once('?').map_or((rest, None), |(s, q)| (s, Some(q)));
    let servers = servers.trim_end_matches('/');
    if servers.is_empty()
        || servers.split(',').any(|s| s.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()))
    {
        return Err(broker(format!("{url:?} is not {URL_FORM}")));
    }
    let group = match query {
        None | Some("group=consumer") => GroupProtocol::Consumer,
        Some("group=classic") => GroupProtocol::Classic,
        Some(other) => return Err(broker(format!("{url:?}: {other:?} is not a setting of {URL_FORM}"))),
    };
    Ok((servers.to_owned(), group))
}

/// The servers of a URL, as librdkafka's `bootstrap.servers`.
fn bootstrap(url: &str) -> Result<String, TransportError> {
    parse_url(url).map(|(servers, _)| servers)
}

/// What every client sets: short reconnect backoffs (librdkafka's 10 s
/// would leave a run idle after a broker restart) and bounded requests.
fn config(servers: &str, client_id: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", servers)
        .set("client.id", client_id)
        .set("reconnect.backoff.max.ms", "1000")
        .set("socket.timeout.ms", REQUEST_TIMEOUT.as_millis().to_string())
        .set("topic.metadata.refresh.interval.ms", "5000");
    c
}

/// Runs a blocking librdkafka call off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, TransportError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| broker(format!("a blocking call failed: {e}")))
}

pub(crate) async fn publisher(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    let mode = Mode::of(spec);
    let mut c = config(&bootstrap(url)?, &options.client_id);
    let request = (DELIVERY_TIMEOUT.as_millis() * 4 / 5).to_string();
    let timeout = message_timeout(mode, options.confirms);
    c.set("linger.ms", "1").set("request.timeout.ms", request).set("message.timeout.ms", &timeout);
    if mode == Mode::Acks1 {
        c.set("acks", "1").set("enable.idempotence", "false");
    } else {
        c.set("acks", "all").set("enable.idempotence", "true");
    }
    if mode == Mode::Eos {
        // Above the message timeout and the socket timeout, as librdkafka asks.
        let transaction = REQUEST_TIMEOUT.as_millis().to_string();
        c.set("transactional.id", &options.client_id).set("transaction.timeout.ms", transaction);
    }
    let producer: FutureProducer = c.create().map_err(broker)?;
    if mode == Mode::Eos {
        // Fences an earlier producer of the same id and aborts what it left open.
        let p = producer.clone();
        blocking(move || p.init_transactions(REQUEST_TIMEOUT)).await?.map_err(broker)?;
    }
    Ok(Box::new(KafkaPublisher { producer, transactional: mode == Mode::Eos, confirms: options.confirms }))
}

struct KafkaPublisher {
    producer: FutureProducer,
    transactional: bool,
    confirms: bool,
}

impl std::fmt::Debug for KafkaPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaPublisher").field("transactional", &self.transactional).finish_non_exhaustive()
    }
}

impl KafkaPublisher {
    /// Sends the batch and, with confirms on, waits for every delivery report.
    async fn send(&self, batch: &[Envelope]) -> Result<(), TransportError> {
        let mut reports = Vec::with_capacity(batch.len());
        for e in batch {
            let body = e.to_body();
            let key = e.key.as_deref().unwrap_or(&e.message_id);
            let record = FutureRecord::to(TOPIC).key(key).payload(&body);
            reports.push(self.producer.send_result(record).map_err(|(e, _)| unconfirmed(e))?);
        }
        if !self.confirms && !self.transactional {
            return Ok(());
        }
        for report in reports {
            match report.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => return Err(unconfirmed(e)),
                Err(_) => return Err(unconfirmed("the producer went away before its delivery report")),
            }
        }
        Ok(())
    }
}

impl Publisher for KafkaPublisher {
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if !self.transactional {
                return self.send(batch).await;
            }
            self.producer.begin_transaction().map_err(unconfirmed)?;
            let sent = self.send(batch).await;
            let p = self.producer.clone();
            let ended = match sent {
                Ok(()) => blocking(move || p.commit_transaction(REQUEST_TIMEOUT)).await?.map_err(unconfirmed),
                Err(e) => Err(e),
            };
            if ended.is_err() {
                // Best effort: a producer in a fatal state is dropped by the
                // relay, and the next one's init aborts the transaction.
                let p = self.producer.clone();
                let _ = blocking(move || p.abort_transaction(REQUEST_TIMEOUT)).await;
            }
            ended
        })
    }
}

/// Where a delivery of the batch in hand stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settle {
    Open,
    Acked,
    Released,
}

/// One partition as this consumer holds it: the batch in hand, and the
/// offset it may commit.
#[derive(Debug)]
struct Partition {
    batch: BTreeMap<i64, Settle>,
    /// The next offset to commit: everything below it is settled (-1: none yet).
    done: i64,
    /// The offset last committed (-1: none yet).
    committed: i64,
}

impl Default for Partition {
    fn default() -> Partition {
        Partition { batch: BTreeMap::new(), done: -1, committed: -1 }
    }
}

impl Partition {
    /// Up to the first delivery of the batch that is not acked.
    fn settle(&mut self) {
        if let Some(last) = self.batch.keys().next_back() {
            self.done = self.batch.iter().find(|(_, s)| **s != Settle::Acked).map_or(last + 1, |(o, _)| *o);
        }
    }

    /// The batch is over: what was handed back comes again from its
    /// offset; what was neither acked nor handed back (its ack was lost)
    /// counts as done, and the next commit covers it.
    fn close_batch(&mut self) {
        if let Some(last) = self.batch.keys().next_back() {
            self.done = self.batch.iter().find(|(_, s)| **s == Settle::Released).map_or(last + 1, |(o, _)| *o);
        }
        self.batch.clear();
    }

    fn owes_commit(&self) -> bool {
        self.done >= 0 && self.done != self.committed
    }
}

pub(crate) async fn consumer(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Consumer>, TransportError> {
    let mode = Mode::of(spec);
    let (servers, group) = parse_url(url)?;
    let mut c = config(&servers, &options.client_id);
    c.set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", mode.isolation())
        .set("max.poll.interval.ms", MAX_POLL_INTERVAL_MS.to_string());
    match group {
        GroupProtocol::Consumer => c.set("group.protocol", "consumer"),
        GroupProtocol::Classic => c
            .set("group.protocol", "classic")
            .set("session.timeout.ms", CLASSIC_SESSION_TIMEOUT_MS.to_string())
            .set("heartbeat.interval.ms", CLASSIC_HEARTBEAT_INTERVAL_MS.to_string()),
    };
    let consumer: StreamConsumer = c.create().map_err(broker)?;
    consumer.subscribe(&[TOPIC]).map_err(broker)?;
    Ok(Box::new(KafkaConsumer {
        consumer: Arc::new(consumer),
        mode,
        commit_on_receipt: options.commit_on_receipt,
        partitions: HashMap::new(),
        assigned: BTreeSet::new(),
        deliveries: HashMap::new(),
        last_commit: Instant::now(),
    }))
}

struct KafkaConsumer {
    consumer: Arc<StreamConsumer>,
    mode: Mode,
    /// BUG MODE commit-async-on-receipt: what a receive returns is committed
    /// at once, asynchronously, before the effect.
    commit_on_receipt: bool,
    partitions: HashMap<i32, Partition>,
    /// The partitions of the last receive's assignment.
    assigned: BTreeSet<i32>,
    /// How often this consumer was given each (partition, offset).
    deliveries: HashMap<(i32, i64), i64>,
    last_commit: Instant,
}

impl std::fmt::Debug for KafkaConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConsumer")
            .field("mode", &self.mode)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

fn receipt(partition: i32, offset: i64) -> Receipt {
    Receipt(format!("{partition}:{offset}"))
}

fn parse_receipt(receipt: &Receipt) -> Result<(i32, i64), TransportError> {
    receipt
        .0
        .split_once(':')
        .and_then(|(p, o)| Some((p.parse().ok()?, o.parse().ok()?)))
        .ok_or_else(|| broker(format!("{:?} is not a Kafka receipt (partition:offset)", receipt.0)))
}

impl KafkaConsumer {
    /// Forgets the partitions a rebalance took away (their batch can no
    /// longer be committed; their new owner starts from the last commit).
    fn follow_assignment(&mut self) -> Result<(), TransportError> {
        let now: BTreeSet<i32> =
            self.consumer.assignment().map_err(broker)?.elements().iter().map(|e| e.partition()).collect();
        if now != self.assigned {
            self.partitions.clear();
            self.assigned = now;
        }
        Ok(())
    }

    /// Commits every partition that owes one, and waits for the broker.
    async fn commit(&mut self) -> Result<(), TransportError> {
        self.last_commit = Instant::now();
        let owed: Vec<(i32, i64)> =
            self.partitions.iter().filter(|(_, p)| p.owes_commit()).map(|(n, p)| (*n, p.done)).collect();
        if owed.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in &owed {
            tpl.add_partition_offset(TOPIC, *partition, Offset::Offset(*offset)).map_err(broker)?;
        }
        let consumer = self.consumer.clone();
        blocking(move || consumer.commit(&tpl, CommitMode::Sync)).await?.map_err(broker)?;
        for (partition, offset) in owed {
            if let Some(p) = self.partitions.get_mut(&partition) {
                p.committed = offset;
            }
            self.deliveries.retain(|(n, o), _| *n != partition || *o >= offset);
        }
        Ok(())
    }

    /// BUG MODE commit-async-on-receipt: commits past everything received,
    /// without waiting for the broker, before a single effect.
    fn commit_received(&mut self) -> Result<(), TransportError> {
        let mut tpl = TopicPartitionList::new();
        for (partition, p) in &self.partitions {
            if let Some(last) = p.batch.keys().next_back() {
                tpl.add_partition_offset(TOPIC, *partition, Offset::Offset(last + 1)).map_err(broker)?;
            }
        }
        if tpl.count() > 0 {
            self.consumer.commit(&tpl, CommitMode::Async).map_err(broker)?;
        }
        Ok(())
    }

    /// Takes one message into the batch in hand.
    fn take(&mut self, partition: i32, offset: i64, payload: Option<&[u8]>) -> Option<Delivery> {
        let p = self.partitions.entry(partition).or_default();
        let count = self.deliveries.entry((partition, offset)).or_insert(0);
        *count += 1;
        match Envelope::from_body(payload.unwrap_or_default()) {
            Ok(envelope) => {
                p.batch.insert(offset, Settle::Open);
                Some(Delivery { envelope, delivery_count: *count, receipt: receipt(partition, offset) })
            }
            Err(e) => {
                tracing::warn!(partition, offset, error = %e, "skipping a Kafka record that is not a haunt envelope");
                p.batch.insert(offset, Settle::Acked);
                None
            }
        }
    }
}

impl Consumer for KafkaConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            for p in self.partitions.values_mut() {
                p.close_batch();
            }
            self.follow_assignment()?;
            if self.last_commit.elapsed() >= COMMIT_REPAIR
                && let Err(e) = self.commit().await
            {
                // Sent again a second later; the broker may be moving its
                // group coordinator (a restart, a rebalance).
                tracing::debug!(error = %e, "sending the commits owed failed");
            }
            let consumer = self.consumer.clone();
            let mut out = Vec::new();
            let mut next = match tokio::time::timeout(wait, consumer.recv()).await {
                Err(_) => return Ok(out),
                Ok(first) => Some(first),
            };
            while let Some(message) = next.take() {
                match message {
                    Ok(m) => out.extend(self.take(m.partition(), m.offset(), m.payload())),
                    // librdkafka retries on its own; what it reports here
                    // (a broker down, a rebalance) ends this batch only.
                    Err(e) => {
                        tracing::debug!(error = %e, "Kafka consumer error");
                        break;
                    }
                }
                if out.len() >= max {
                    break;
                }
                next = consumer.recv().now_or_never();
            }
            if self.mode == Mode::AtMostOnce {
                // Committed before the effect: settled on receipt.
                for p in self.partitions.values_mut() {
                    p.close_batch();
                }
                self.commit().await?;
            } else if self.commit_on_receipt {
                self.commit_received()?;
            }
            Ok(out)
        })
    }

    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if self.mode == Mode::AtMostOnce {
                return Ok(());
            }
            for r in receipts {
                let (partition, offset) = parse_receipt(r)?;
                if let Some(p) = self.partitions.get_mut(&partition)
                    && let Some(s) = p.batch.get_mut(&offset)
                {
                    *s = Settle::Acked;
                    p.settle();
                }
            }
            self.commit().await
        })
    }

    fn release<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if self.mode == Mode::AtMostOnce {
                return Ok(());
            }
            let mut seeks: BTreeMap<i32, i64> = BTreeMap::new();
            for r in receipts {
                let (partition, offset) = parse_receipt(r)?;
                if let Some(p) = self.partitions.get_mut(&partition)
                    && let Some(s) = p.batch.get_mut(&offset)
                {
                    *s = Settle::Released;
                    p.settle();
                    let first = p.batch.iter().find(|(_, s)| **s == Settle::Released).map(|(o, _)| *o);
                    seeks.insert(partition, first.unwrap_or(offset));
                }
            }
            for (partition, offset) in seeks {
                let consumer = self.consumer.clone();
                blocking(move || consumer.seek(TOPIC, partition, Offset::Offset(offset), REQUEST_TIMEOUT))
                    .await?
                    .map_err(broker)?;
            }
            Ok(())
        })
    }

    fn acks_on_receipt(&self) -> bool {
        self.mode == Mode::AtMostOnce || self.commit_on_receipt
    }
}

pub(crate) async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    let servers = bootstrap(url)?;
    let brokers = servers.split(',').count();
    Ok(Box::new(KafkaInspector { servers, brokers, mode: Mode::of(spec) }))
}

#[derive(Debug)]
struct KafkaInspector {
    servers: String,
    /// How many brokers the URL names: the topic's replication factor, up to 3.
    brokers: usize,
    mode: Mode,
}

impl KafkaInspector {
    /// The replication factor and `min.insync.replicas` of the topic: every
    /// broker holds a copy (up to 3), and an `acks=all` write needs two of
    /// three.
    fn replication(&self) -> (i32, i32) {
        let factor = self.brokers.clamp(1, 3) as i32;
        (factor, if factor >= 3 { 2 } else { 1 })
    }

    /// A reader in the group's name that never joins it, at `isolation`.
    fn reader(servers: &str, isolation: &str) -> Result<BaseConsumer, TransportError> {
        let mut c = config(servers, "haunt-inspector");
        c.set("group.id", GROUP)
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", isolation);
        c.create().map_err(broker)
    }

    /// What the group still has to read. Under `read_committed` a partition
    /// ends at its last stable offset: records of a transaction not yet
    /// resolved (its markers are written after its producer's commit
    /// returned, and again by a coordinator that restarted) lie beyond it,
    /// invisible. Then the depth is a count, so that a run waits for them
    /// and never calls them lost.
    fn depth(servers: &str, mode: Mode) -> Result<Depth, TransportError> {
        let held = KafkaInspector::lag(servers, mode)?;
        if mode != Mode::Eos {
            return Ok(Depth::Listed(held));
        }
        let (committed, all) = (Self::reader(servers, "read_committed")?, Self::reader(servers, "read_uncommitted")?);
        let mut unresolved = 0;
        for partition in 0..PARTITIONS {
            let (_, stable) = committed.fetch_watermarks(TOPIC, partition, REQUEST_TIMEOUT).map_err(broker)?;
            let (_, high) = all.fetch_watermarks(TOPIC, partition, REQUEST_TIMEOUT).map_err(broker)?;
            unresolved += u64::try_from(high - stable).unwrap_or(0);
        }
        Ok(if unresolved == 0 { Depth::Listed(held) } else { Depth::Counted(held.len() as u64 + unresolved) })
    }

    /// Reads every partition from the group's committed offset to its end.
    fn lag(servers: &str, mode: Mode) -> Result<Vec<Held>, TransportError> {
        let reader = Self::reader(servers, mode.isolation())?;
        let metadata = reader.fetch_metadata(Some(TOPIC), REQUEST_TIMEOUT).map_err(broker)?;
        let topic = metadata.topics().iter().find(|t| t.name() == TOPIC).ok_or_else(|| broker("no topic"))?;
        if let Some(e) = topic.error() {
            return Err(broker(format!("topic {TOPIC}: {:?}", RDKafkaErrorCode::from(e))));
        }
        let mut all = TopicPartitionList::new();
        for p in topic.partitions() {
            all.add_partition(TOPIC, p.id());
        }
        // The group's coordinator may be loading or moving (the broker's
        // first group, a restart): asked again until it answers.
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        let committed = loop {
            match reader.committed_offsets(all.clone(), REQUEST_TIMEOUT) {
                Ok(committed) => break committed,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "reading the group's offsets: asking again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(broker(e)),
            }
        };
        let mut from = TopicPartitionList::new();
        for e in committed.elements() {
            let (low, high) = reader.fetch_watermarks(TOPIC, e.partition(), REQUEST_TIMEOUT).map_err(broker)?;
            let start = match e.offset() {
                Offset::Offset(o) => o,
                _ => low,
            };
            if start < high {
                from.add_partition_offset(TOPIC, e.partition(), Offset::Offset(start)).map_err(broker)?;
            }
        }
        let mut left: BTreeSet<i32> = from.elements().iter().map(|e| e.partition()).collect();
        reader.assign(&from).map_err(broker)?;
        let deadline = Instant::now() + REQUEST_TIMEOUT * 3;
        let mut held = Vec::new();
        while !left.is_empty() {
            if Instant::now() >= deadline {
                return Err(broker(format!(
                    "partitions {left:?} not read to their end within {:?}",
                    REQUEST_TIMEOUT * 3
                )));
            }
            match reader.poll(Duration::from_millis(200)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    left.remove(&p);
                }
                Some(Err(e)) => return Err(broker(e)),
                Some(Ok(m)) => {
                    if let Ok(e) = Envelope::from_body(m.payload().unwrap_or_default()) {
                        held.push(Held { message_id: e.message_id, event_id: e.event_id, delivery_count: 0 });
                    }
                }
            }
        }
        Ok(held)
    }
}

impl Inspector for KafkaInspector {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(async move {
            let admin: AdminClient<DefaultClientContext> =
                config(&self.servers, "haunt-declare").create().map_err(broker)?;
            let (factor, min_insync) = self.replication();
            let min_insync = min_insync.to_string();
            let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(factor))
                .set("min.insync.replicas", &min_insync)
                .set("unclean.leader.election.enable", "false");
            let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
            // A cluster just started refuses for a while in ways that pass:
            // no controller yet, too few brokers registered for the
            // replication factor, or the client giving up its bootstrap
            // connections for the ones it learned, with the request on them
            // (`DestroyBroker`, met under the suite's load). Those are tried
            // again, for as long as a broker may take to start; the topic
            // then exists (a create that did land answers TopicAlreadyExists).
            let deadline = Instant::now() + DECLARE_LIMIT;
            loop {
                let code = match admin.create_topics([&topic], &options).await {
                    Ok(results) => match results.into_iter().find_map(Result::err) {
                        None | Some((_, RDKafkaErrorCode::TopicAlreadyExists)) => return Ok(()),
                        Some((_, code)) => code,
                    },
                    Err(KafkaError::AdminOp(code)) => code,
                    Err(e) => return Err(broker(e)),
                };
                if !passes(code) || Instant::now() >= deadline {
                    return Err(broker(format!("creating topic {TOPIC}: {code}")));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async move {
            let (servers, mode) = (self.servers.clone(), self.mode);
            blocking(move || KafkaInspector::depth(&servers, mode)).await?
        })
    }

    /// From the cluster's metadata, as any node the harness reaches gives
    /// it (within a second: a fault starts late by that at most).
    fn leaders(&self) -> BoxFuture<'_, Result<Option<crate::Leaders>, TransportError>> {
        Box::pin(async move {
            if self.brokers < 2 {
                return Ok(None);
            }
            let servers = self.servers.clone();
            blocking(move || {
                let reader = KafkaInspector::reader(&servers, "read_uncommitted")?;
                let metadata = reader.fetch_metadata(Some(TOPIC), Duration::from_secs(1)).map_err(broker)?;
                let mut leaders = crate::Leaders::new();
                for topic in metadata.topics() {
                    for p in topic.partitions() {
                        leaders.entry(p.leader()).or_default().push(p.id());
                    }
                }
                Ok(Some(leaders))
            })
            .await?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_confirmed_idempotent_publisher_outside_a_transaction_never_gives_up_a_message() {
        for mode in [Mode::AtLeastOnce, Mode::AtMostOnce] {
            assert_eq!(message_timeout(mode, true), "0", "{mode:?}");
            assert_eq!(message_timeout(mode, false), "3000", "{mode:?} unconfirmed");
        }
        for mode in [Mode::Eos, Mode::Acks1] {
            assert_eq!(message_timeout(mode, true), "3000", "{mode:?}");
        }
    }

    #[test]
    fn urls_name_their_brokers() {
        assert_eq!(bootstrap("kafka://127.0.0.1:9092").unwrap(), "127.0.0.1:9092");
        assert_eq!(bootstrap("kafka://a:1,b:2,c:3/").unwrap(), "a:1,b:2,c:3");
        for bad in ["kafka://", "kafka://host", "kafka://:9092", "kafka://a:1,b", "kafka://?group=classic"] {
            let e = bootstrap(bad).unwrap_err().to_string();
            assert!(e.contains("kafka://HOST:PORT"), "{bad}: {e}");
        }
        assert_eq!(parse_url("kafka://a:1").unwrap().1, GroupProtocol::Consumer);
        assert_eq!(parse_url("kafka://a:1,b:2?group=classic").unwrap(), ("a:1,b:2".into(), GroupProtocol::Classic));
        assert_eq!(parse_url("kafka://a:1/?group=consumer").unwrap().1, GroupProtocol::Consumer);
        let e = parse_url("kafka://a:1?group=old").unwrap_err().to_string();
        assert!(e.contains("\"group=old\" is not a setting"), "{e}");
    }

    #[test]
    fn receipts_round_trip_and_bad_ones_are_named() {
        assert_eq!(parse_receipt(&receipt(3, 41)).unwrap(), (3, 41));
        assert!(parse_receipt(&Receipt("x".into())).unwrap_err().to_string().contains("partition:offset"));
    }

    fn partition(offsets: &[(i64, Settle)]) -> Partition {
        let mut p = Partition::default();
        p.batch.extend(offsets.iter().copied());
        p
    }

    #[test]
    fn a_commit_never_passes_a_delivery_not_yet_settled() {
        let mut p = partition(&[(10, Settle::Acked), (11, Settle::Open), (12, Settle::Acked)]);
        p.settle();
        assert_eq!(p.done, 11, "11 is still being applied or retried");
        p.batch.insert(11, Settle::Acked);
        p.settle();
        assert_eq!(p.done, 13);
        assert!(p.owes_commit());
        p.committed = 13;
        assert!(!p.owes_commit());
    }

    #[test]
    fn a_handed_back_delivery_comes_again_and_a_lost_ack_is_covered_by_the_next_commit() {
        let mut p = partition(&[(10, Settle::Acked), (11, Settle::Released), (12, Settle::Acked)]);
        p.close_batch();
        assert_eq!(p.done, 11, "handed back: the partition reads it again from 11");
        let mut p = partition(&[(10, Settle::Acked), (11, Settle::Open), (12, Settle::Acked)]);
        p.settle();
        assert_eq!(p.done, 11, "until the batch is over, an ack may still come");
        p.close_batch();
        assert_eq!((p.done, p.batch.len()), (13, 0), "its ack was lost: the position is past it");
    }
}
