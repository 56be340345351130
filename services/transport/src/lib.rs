//! The seam between the reference pipeline and a message broker.
//!
//! With a broker transport the database queue becomes an outbox: the API
//! writes the order and its message in one transaction, as it always did; a
//! relay leases outbox rows, [`Publisher::publish`]es them, waits for the
//! broker's confirmation and only then deletes them. Workers take messages
//! from the broker through a [`Consumer`], apply them through the inbox in
//! the effect's transaction, then [`Consumer::ack`] them with the broker's
//! own ack. Each hop is at-least-once; the inbox makes the copies harmless.
//!
//! # Layout
//!
//! - [`TransportSpec`]: a transport and its mode as spelled on the command
//!   line (`rabbitmq:manual-ack`, `redis-streams`, …), and the delivery
//!   guarantee the broker claims for it.
//! - [`Envelope`]: the message as it travels, one JSON body on every broker
//!   (MQTT 3.1.1 has no headers, so nothing rides outside the body).
//! - [`Publisher`], [`Consumer`]: the two ends, as trait objects; [`connect`]
//!   opens them for a spec and a broker URL.
//! - [`Depth`]: what the broker still holds, listed by message where it can
//!   list them, counted where it can only count.
//! - [`Links`]: how many of a process's broker clients are connected, which
//!   its `/readyz` reports.
//! - One module per broker, each behind a cargo feature of its name:
//!   `rabbitmq` (a quorum queue, manual or automatic acks), `redis`
//!   (Streams and Pub/Sub), `nats` (JetStream and core NATS), `mqtt`
//!   (persistent sessions at QoS 0, 1, 2), `sqs` (standard and FIFO
//!   queues), `pubsub` (Google Pub/Sub's emulator: pull, exactly-once,
//!   ordered) and `kafka` (Apache Kafka: a consumer group committing
//!   offsets, idempotent or transactional producers). Each module's doc says
//!   what its broker does with a lost ack.

#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "mqtt")]
mod mqtt;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "pubsub")]
mod pubsub;
#[cfg(feature = "rabbitmq")]
mod rabbitmq;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqs")]
mod sqs;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// The broker clients of one process (a worker's consumers, a relay's
/// publisher), counted as they connect and drop: the process is ready, and
/// its `/readyz` says 200, while all of them are connected. A run starts its
/// workload only once every relay and worker is ready, so that its first
/// faults meet messages in flight, not clients still backing off from a
/// broker that was booting.
#[derive(Debug)]
pub struct Links {
    want: usize,
    open: AtomicUsize,
}

impl Links {
    /// `want` clients, none connected yet; `Links::new(0)` is always ready
    /// (a worker on the database queue has no broker to wait for).
    pub fn new(want: usize) -> Links {
        Links { want, open: AtomicUsize::new(0) }
    }

    pub fn connected(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
    }

    pub fn dropped(&self) {
        let _ = self.open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    pub fn ready(&self) -> bool {
        self.open.load(Ordering::Relaxed) >= self.want
    }

    /// The body of `/readyz`: whether all are connected, and how many are.
    pub fn report(&self) -> (bool, String) {
        let open = self.open.load(Ordering::Relaxed);
        let ready = open >= self.want;
        (ready, format!("{{\"ready\":{ready},\"broker_clients\":{open},\"broker_clients_wanted\":{}}}\n", self.want))
    }
}

/// What a transport's mode promises about each message, as the broker's
/// documentation states it (what `haunt guarantees` measures against).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Guarantee {
    /// A message can be lost (auto-ack, fire-and-forget, QoS 0), never
    /// delivered twice by the broker.
    AtMostOnce,
    /// Redelivered until acked: never lost once confirmed, possibly twice.
    AtLeastOnce,
    /// The broker deduplicates or commits atomically within its own bounds
    /// (a FIFO queue's deduplication window, MQTT QoS 2, Kafka transactions).
    ExactlyOnce,
}

impl Guarantee {
    pub fn name(self) -> &'static str {
        match self {
            Guarantee::AtMostOnce => "at-most-once",
            Guarantee::AtLeastOnce => "at-least-once",
            Guarantee::ExactlyOnce => "exactly-once",
        }
    }
}

/// What a transport's mode promises about the order in which a key's
/// messages reach the consumers (issue 33): `haunt run` writes it into
/// `run.json`, and the checker judges the run's inversions against it, as
/// data (the checker knows no transport).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OrderClaim {
    /// No order: consumers compete for the messages (several workers, each
    /// with several lease loops), and a redelivery comes back after later
    /// messages.
    None,
    /// Publish order within one key: the key is the broker's own unit of
    /// order (SQS FIFO's message group, Pub/Sub's ordering key, a Kafka
    /// partition), and the next message of a key waits until the one before
    /// it is acked.
    PerKey,
}

impl OrderClaim {
    pub fn name(self) -> &'static str {
        match self {
            OrderClaim::None => "none",
            OrderClaim::PerKey => "per-key",
        }
    }
}

/// A broker, or the database queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The database table the reference pipeline leases from: no broker.
    Db,
    RabbitMq,
    RedisStreams,
    RedisPubSub,
    Nats,
    Mqtt,
    Sqs,
    PubSub,
    Kafka,
}

/// A transport's modes, each with what it claims.
type Modes = &'static [(&'static str, Guarantee)];

/// Every transport with its modes; the first mode of each is the one a bare
/// name takes (its at-least-once mode where it has one).
const TRANSPORTS: &[(&str, Kind, Modes)] = &[
    ("db", Kind::Db, &[("lease", Guarantee::AtLeastOnce)]),
    ("redis-streams", Kind::RedisStreams, &[("consumer-group", Guarantee::AtLeastOnce)]),
    ("redis-pubsub", Kind::RedisPubSub, &[("fire-and-forget", Guarantee::AtMostOnce)]),
    ("rabbitmq", Kind::RabbitMq, &[("manual-ack", Guarantee::AtLeastOnce), ("auto-ack", Guarantee::AtMostOnce)]),
    ("nats", Kind::Nats, &[("jetstream", Guarantee::AtLeastOnce), ("core", Guarantee::AtMostOnce)]),
    (
        "mqtt",
        Kind::Mqtt,
        &[("qos1", Guarantee::AtLeastOnce), ("qos0", Guarantee::AtMostOnce), ("qos2", Guarantee::ExactlyOnce)],
    ),
    // FIFO: deduplication by id within five minutes (moto's is narrower:
    // see the sqs module).
    ("sqs", Kind::Sqs, &[("standard", Guarantee::AtLeastOnce), ("fifo", Guarantee::ExactlyOnce)]),
    // Exactly-once: no redelivery after an ack that succeeded (Google's
    // claim, measured against its emulator in the contract tests).
    (
        "pubsub",
        Kind::PubSub,
        &[
            ("pull", Guarantee::AtLeastOnce),
            ("exactly-once", Guarantee::ExactlyOnce),
            ("ordered", Guarantee::AtLeastOnce),
        ],
    ),
    // Exactly-once: Kafka's transactions (an idempotent, transactional
    // producer and `read_committed` consumers), within Kafka. acks-1 claims
    // at-least-once only while the partition's leader lives.
    (
        "kafka",
        Kind::Kafka,
        &[
            ("at-least-once", Guarantee::AtLeastOnce),
            ("at-most-once", Guarantee::AtMostOnce),
            ("eos", Guarantee::ExactlyOnce),
            ("acks-1", Guarantee::AtLeastOnce),
        ],
    ),
];

/// A transport and its mode, parsed from `NAME[:MODE]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportSpec {
    pub kind: Kind,
    mode: &'static str,
    guarantee: Guarantee,
    /// Whether the mode was spelled out: `Display` writes it back as given.
    explicit: bool,
}

impl Default for TransportSpec {
    fn default() -> Self {
        "db".parse().expect("db is a transport")
    }
}

impl TransportSpec {
    /// Every transport and mode this build knows, spelled as on the command
    /// line (`--transport` in the help text, `haunt guarantees`' rows).
    pub fn all() -> Vec<TransportSpec> {
        TRANSPORTS
            .iter()
            .flat_map(|(_, kind, modes)| {
                modes.iter().map(|(mode, guarantee)| TransportSpec {
                    kind: *kind,
                    mode,
                    guarantee: *guarantee,
                    explicit: modes.len() > 1,
                })
            })
            .collect()
    }

    pub fn name(&self) -> &'static str {
        TRANSPORTS.iter().find(|(_, k, _)| *k == self.kind).map(|(n, _, _)| *n).expect("every kind is in the table")
    }

    pub fn mode(&self) -> &'static str {
        self.mode
    }

    /// What the broker promises in this mode.
    pub fn claim(&self) -> Guarantee {
        self.guarantee
    }

    /// What the broker promises about order in this mode. SQS FIFO and
    /// Pub/Sub with message ordering claim one: a message group's (an
    /// ordering key's) next message is not delivered while one before it is
    /// in flight. Kafka keeps a partition's order in every mode, and a key
    /// has one partition. RabbitMQ keeps a
    /// queue's order for one consumer until a requeue, NATS JetStream a
    /// stream's for one pending ack, and Redis a stream's for one reader:
    /// with competing consumers, as haunt runs them, none of them claims it.
    pub fn order_claim(&self) -> OrderClaim {
        match (self.kind, self.mode) {
            (Kind::Sqs, "fifo") | (Kind::PubSub, "ordered") | (Kind::Kafka, _) => OrderClaim::PerKey,
            _ => OrderClaim::None,
        }
    }

    /// The faults under which this mode's claim promises nothing, by
    /// `--nemesis` name. `kafka:acks-1`: a leader acknowledges a write
    /// before any follower has it, so a leader that fails (restarted,
    /// paused, cut off) may take acknowledged writes with it. A loss in a
    /// run where one of these struck is what the mode allows, not a
    /// contradiction of its claim.
    pub fn no_promise_under(&self) -> &'static [&'static str] {
        match (self.kind, self.mode) {
            (Kind::Kafka, "acks-1") => &["broker-restart", "pause", "partition"],
            _ => &[],
        }
    }

    /// Whether the broker tells a consumer how often it delivered a
    /// message. Kafka does not: a partition's next owner reads from the last
    /// commit, and its first delivery of a message counts 1 whoever had it
    /// before (its consumer counts its own deliveries only).
    pub fn counts_deliveries(&self) -> bool {
        self.kind != Kind::Kafka
    }

    /// Whether an ack settles everything before it too: a Kafka commit is
    /// an offset per partition. An ack lost there is covered by the next
    /// one, and only a consumer that dies first redelivers.
    pub fn acks_are_cumulative(&self) -> bool {
        self.kind == Kind::Kafka
    }

    /// Whether the broker keeps a message for a consumer that is not
    /// connected when it is published. Redis Pub/Sub and core NATS send it
    /// to whoever is subscribed at that moment, and MQTT at QoS 0 runs
    /// clean sessions: there a message published with no consumer is gone.
    pub fn keeps_for_absent_consumers(&self) -> bool {
        !matches!((self.kind, self.mode), (Kind::RedisPubSub, _) | (Kind::Nats, "core") | (Kind::Mqtt, "qos0"))
    }

    /// Whether a broker (and a relay in front of it) is in the pipeline.
    pub fn is_broker(&self) -> bool {
        self.kind != Kind::Db
    }

    /// The broker's server this transport needs, named as `haunt_chaos::systems::brokers`
    /// names it: both Redis transports run on one `redis-server`; MQTT runs
    /// on mosquitto, SQS on moto's emulator and Pub/Sub on Google's.
    pub fn server(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Db => None,
            Kind::RabbitMq => Some("rabbitmq"),
            Kind::RedisStreams | Kind::RedisPubSub => Some("redis"),
            Kind::Nats => Some("nats"),
            Kind::Mqtt => Some("mosquitto"),
            Kind::Sqs => Some("moto"),
            Kind::PubSub => Some("pubsub-emulator"),
            Kind::Kafka => Some("kafka"),
        }
    }

    /// Whether the broker's server keeps what it confirmed through a crash.
    /// moto, the SQS emulator, and Google's Pub/Sub emulator keep
    /// everything in memory: a restart of either loses it all, which says
    /// nothing about SQS or Pub/Sub, so `broker-restart` is not offered there.
    pub fn server_is_durable(&self) -> bool {
        !matches!(self.kind, Kind::Sqs | Kind::PubSub)
    }

    /// The cargo feature that compiles this transport's client in (`None`
    /// for the database queue, which needs none).
    pub fn feature(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Db => None,
            Kind::RabbitMq => Some("rabbitmq"),
            Kind::RedisStreams | Kind::RedisPubSub => Some("redis"),
            Kind::Nats => Some("nats"),
            Kind::Mqtt => Some("mqtt"),
            Kind::Sqs => Some("sqs"),
            Kind::PubSub => Some("pubsub"),
            Kind::Kafka => Some("kafka"),
        }
    }

    /// Whether this build has the transport's client.
    pub fn is_built(&self) -> bool {
        match self.kind {
            Kind::Db => true,
            Kind::RabbitMq => cfg!(feature = "rabbitmq"),
            Kind::RedisStreams | Kind::RedisPubSub => cfg!(feature = "redis"),
            Kind::Nats => cfg!(feature = "nats"),
            Kind::Mqtt => cfg!(feature = "mqtt"),
            Kind::Sqs => cfg!(feature = "sqs"),
            Kind::PubSub => cfg!(feature = "pubsub"),
            Kind::Kafka => cfg!(feature = "kafka"),
        }
    }

    /// Parses `NAME[:MODE]` as `--transport` takes it: a transport this build
    /// has, or an error that says how to build one with it.
    pub fn built(s: &str) -> Result<TransportSpec, String> {
        let spec: TransportSpec = s.parse().map_err(|e: SpecError| e.to_string())?;
        if spec.is_built() { Ok(spec) } else { Err(TransportError::NotBuilt(s.to_owned()).to_string()) }
    }

    /// Whether the relay can publish without waiting for a confirmation
    /// (`no-publisher-confirms` then changes something): RabbitMQ's
    /// publisher confirms, JetStream's publish acks, MQTT's PUBACK/PUBCOMP,
    /// Kafka's delivery reports (outside a transaction).
    pub fn has_publisher_confirms(&self) -> bool {
        matches!(self.kind, Kind::RabbitMq | Kind::Nats | Kind::Mqtt)
            || (self.kind == Kind::Kafka && self.mode != "eos")
    }
}

impl fmt::Display for TransportSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.explicit { write!(f, "{}:{}", self.name(), self.mode) } else { f.write_str(self.name()) }
    }
}

/// Why `--transport` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("unknown transport {0:?}; known: {known}", known = known_names())]
    Transport(String),
    #[error("transport {transport} has no mode {mode:?}; its modes: {modes}")]
    Mode { transport: String, mode: String, modes: String },
}

/// What a build without the transport `spec` says: the feature, and the
/// command that builds haunt with it.
fn not_built(spec: &str) -> String {
    let feature = spec.parse::<TransportSpec>().ok().and_then(|s| s.feature()).unwrap_or("brokers");
    format!(
        "transport {spec} is not in this build: its cargo feature `{feature}` is off. \
         Build haunt with it: `cargo build --release --features {feature}` \
         (or `--features brokers` for every broker; `cargo run --release --features {feature} -- ...`)"
    )
}

fn known_names() -> String {
    TRANSPORTS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
}

impl std::str::FromStr for TransportSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, mode) = match s.split_once(':') {
            Some((name, mode)) => (name, Some(mode)),
            None => (s, None),
        };
        let (_, kind, modes) =
            TRANSPORTS.iter().find(|(n, _, _)| *n == name).ok_or_else(|| SpecError::Transport(name.to_owned()))?;
        let (mode, guarantee) = match mode {
            None => modes[0],
            Some(m) => *modes.iter().find(|(n, _)| *n == m).ok_or_else(|| SpecError::Mode {
                transport: name.to_owned(),
                mode: m.to_owned(),
                modes: modes.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            })?,
        };
        Ok(TransportSpec { kind: *kind, mode, guarantee, explicit: modes.len() > 1 })
    }
}

/// A message as it travels through a broker: the outbox row, whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub message_id: String,
    pub event_id: String,
    /// The event, as JSON text.
    pub payload: String,
    /// The message's headers (correlation id, traceparent), as JSON text.
    pub headers: String,
    /// When the API committed the order and its outbox row.
    pub enqueued_at_ms: i64,
    /// The unit of order its event belongs to (the order's item): what a
    /// broker that keeps order per key is given as that key (SQS FIFO's
    /// message group). Absent from envelopes of haunt before it had one,
    /// which still parse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl Envelope {
    pub fn to_body(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an envelope serializes")
    }

    pub fn from_body(body: &[u8]) -> Result<Envelope, TransportError> {
        serde_json::from_slice(body).map_err(|e| TransportError::Body(e.to_string()))
    }
}

/// What a consumer received: the message, how many times the broker says it
/// has delivered it (1 when the broker does not count), and what acks it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub envelope: Envelope,
    pub delivery_count: i64,
    pub receipt: Receipt,
}

/// What acks one delivery, in its broker's terms (a delivery tag, a stream
/// entry id, a receipt handle…). Only the consumer that received it reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt(pub(crate) String);

/// A message the broker still holds at the end of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub message_id: String,
    pub event_id: String,
    pub delivery_count: i64,
}

/// What the broker still holds, ready or delivered and not acked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Depth {
    /// Every message, by id: the final state's `pending` lines.
    Listed(Vec<Held>),
    /// Only a count: a run that did not drain is `unknown`, never a false
    /// `lost-effect` for messages that may be in here.
    Counted(u64),
}

impl Depth {
    pub fn is_empty(&self) -> bool {
        match self {
            Depth::Listed(held) => held.is_empty(),
            Depth::Counted(n) => *n == 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The broker could not be reached, or the connection broke.
    #[error("{broker}: {why}")]
    Broker { broker: &'static str, why: String },
    /// A publish the broker did not confirm: it may or may not hold it.
    #[error("{broker} did not confirm the publish: {why}")]
    Unconfirmed { broker: &'static str, why: String },
    /// A body that is not an envelope: not ours, or corrupt.
    #[error("unreadable message body: {0}")]
    Body(String),
    /// The transport's feature is not compiled into this build.
    #[error("{}", not_built(.0))]
    NotBuilt(String),
    /// The database queue is not a broker: it has no publisher or consumer.
    #[error("the database queue has no broker client")]
    NoBroker,
}

/// How the ends of a transport behave, beyond the spec.
#[derive(Debug, Clone)]
pub struct Options {
    /// Names this consumer to the broker (a stream's consumer, a client id).
    pub client_id: String,
    /// How long a delivered, unacked message stays with its consumer before
    /// the broker gives it to another: a stream's claim idle time, an ack
    /// wait, a visibility timeout. Brokers that only redeliver when the
    /// connection closes (RabbitMQ) or the same client reconnects (MQTT)
    /// ignore it.
    pub visibility_timeout: Duration,
    /// Whether the publisher waits for the broker's confirmation of each
    /// batch. Off only in the `no-publisher-confirms` bug mode.
    pub confirms: bool,
    /// BUG MODE commit-async-on-receipt: a Kafka consumer commits what it
    /// received, asynchronously, before the effect. Other brokers ignore it.
    pub commit_on_receipt: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            client_id: "haunt".into(),
            visibility_timeout: Duration::from_secs(5),
            confirms: true,
            commit_on_receipt: false,
        }
    }
}

/// The relay's end: puts outbox rows on the broker.
pub trait Publisher: Send + fmt::Debug {
    /// Publishes the batch, in order. `Ok` means the broker confirmed every
    /// message (with confirms on); on an error some of them may be held
    /// anyway, and the relay publishes them all again.
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>>;
}

/// A worker's end: takes messages with the broker's ack semantics.
pub trait Consumer: Send + fmt::Debug {
    /// Up to `max` deliveries, waiting up to `wait` for the first. Malformed
    /// bodies are acked and dropped with a warning (they are not haunt's).
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>>;

    /// Acks deliveries of this consumer. An ack the broker never gets means
    /// a redelivery later, which the inbox absorbs.
    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>>;

    /// Hands deliveries whose apply failed back to the broker for another
    /// delivery. Brokers that redeliver after a visibility timeout need
    /// nothing (the default); one that only redelivers when the channel
    /// closes (RabbitMQ) requeues them here.
    fn release<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        let _ = receipts;
        Box::pin(async { Ok(()) })
    }

    /// Whether [`Consumer::receive`] already settled what it returned (an
    /// auto-ack consumer, a fire-and-forget subscription): then a crash
    /// before the apply loses those messages, and acking is a no-op.
    fn acks_on_receipt(&self) -> bool {
        false
    }

    /// Ends the consumer as a crash would (no goodbye to the broker), and
    /// returns once its connection is closed, where dropping it returns at
    /// once and closes it a moment later. For what must follow the close
    /// (a test that publishes to a persistent session after its consumer
    /// went away). Dropping is all most consumers need (the default).
    fn crash(self: Box<Self>) -> BoxFuture<'static, ()> {
        drop(self);
        Box::pin(async {})
    }
}

/// A cluster's partition leaders: node id to the partitions it leads.
pub type Leaders = BTreeMap<i32, Vec<i32>>;

/// The broker's side of a run: its topology declared, what it holds.
pub trait Inspector: Send + Sync + fmt::Debug {
    /// Declares the queue, stream or topic and its consumer group, durable
    /// unless the mode says otherwise; idempotent, so every end calls it.
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>>;

    /// What the broker still holds.
    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>>;

    /// Whether the broker looks drained while its consumers are still
    /// attached, the test of a run's quiet phase. Where [`Inspector::depth`]
    /// sees everything, that is an empty depth. A broker that cannot count
    /// what live consumers hold unacked (RabbitMQ) answers from what waits
    /// for a consumer instead, and only once nothing has waited for
    /// `settle`: longer than the broker lets a consumer hold a delivery, so
    /// that whatever a lost ack left held has come back and gone again. The
    /// final state is still read with `depth`, after the consumers stop, so a
    /// wrong guess here costs a verdict (`unknown`), never a false anomaly.
    fn drained(&self, settle: Duration) -> BoxFuture<'_, Result<bool, TransportError>> {
        let _ = settle;
        Box::pin(async move { Ok(self.depth().await?.is_empty()) })
    }

    /// Which node leads which partition, for a broker of several nodes that
    /// has partition leaders (a Kafka cluster): node id to the partitions it
    /// leads (-1: partitions without a leader). `None` elsewhere.
    fn leaders(&self) -> BoxFuture<'_, Result<Option<Leaders>, TransportError>> {
        Box::pin(async { Ok(None) })
    }
}

/// Connects a publisher for `spec` to the broker at `url`.
pub async fn publisher(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    match spec.kind {
        Kind::Db => Err(TransportError::NoBroker),
        #[cfg(feature = "rabbitmq")]
        Kind::RabbitMq => rabbitmq::publisher(spec, url, options).await,
        #[cfg(feature = "redis")]
        Kind::RedisStreams | Kind::RedisPubSub => redis::publisher(spec, url, options).await,
        #[cfg(feature = "nats")]
        Kind::Nats => nats::publisher(spec, url, options).await,
        #[cfg(feature = "mqtt")]
        Kind::Mqtt => mqtt::publisher(spec, url, options).await,
        #[cfg(feature = "sqs")]
        Kind::Sqs => sqs::publisher(spec, url, options).await,
        #[cfg(feature = "pubsub")]
        Kind::PubSub => pubsub::publisher(spec, url, options).await,
        #[cfg(feature = "kafka")]
        Kind::Kafka => kafka::publisher(spec, url, options).await,
        #[allow(unreachable_patterns)]
        _ => {
            let _ = (url, options);
            Err(TransportError::NotBuilt(spec.to_string()))
        }
    }
}

/// Connects a consumer for `spec` to the broker at `url`.
pub async fn consumer(spec: TransportSpec, url: &str, options: &Options) -> Result<Box<dyn Consumer>, TransportError> {
    match spec.kind {
        Kind::Db => Err(TransportError::NoBroker),
        #[cfg(feature = "rabbitmq")]
        Kind::RabbitMq => rabbitmq::consumer(spec, url, options).await,
        #[cfg(feature = "redis")]
        Kind::RedisStreams | Kind::RedisPubSub => redis::consumer(spec, url, options).await,
        #[cfg(feature = "nats")]
        Kind::Nats => nats::consumer(spec, url, options).await,
        #[cfg(feature = "mqtt")]
        Kind::Mqtt => mqtt::consumer(spec, url, options).await,
        #[cfg(feature = "sqs")]
        Kind::Sqs => sqs::consumer(spec, url, options).await,
        #[cfg(feature = "pubsub")]
        Kind::PubSub => pubsub::consumer(spec, url, options).await,
        #[cfg(feature = "kafka")]
        Kind::Kafka => kafka::consumer(spec, url, options).await,
        #[allow(unreachable_patterns)]
        _ => {
            let _ = (url, options);
            Err(TransportError::NotBuilt(spec.to_string()))
        }
    }
}

/// An inspector for `spec` on the broker at `url`.
pub async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    match spec.kind {
        Kind::Db => Err(TransportError::NoBroker),
        #[cfg(feature = "rabbitmq")]
        Kind::RabbitMq => rabbitmq::inspector(spec, url).await,
        #[cfg(feature = "redis")]
        Kind::RedisStreams | Kind::RedisPubSub => redis::inspector(spec, url).await,
        #[cfg(feature = "nats")]
        Kind::Nats => nats::inspector(spec, url).await,
        #[cfg(feature = "mqtt")]
        Kind::Mqtt => mqtt::inspector(spec, url).await,
        #[cfg(feature = "sqs")]
        Kind::Sqs => sqs::inspector(spec, url).await,
        #[cfg(feature = "pubsub")]
        Kind::PubSub => pubsub::inspector(spec, url).await,
        #[cfg(feature = "kafka")]
        Kind::Kafka => kafka::inspector(spec, url).await,
        #[allow(unreachable_patterns)]
        _ => {
            let _ = url;
            Err(TransportError::NotBuilt(spec.to_string()))
        }
    }
}

/// A fire-and-forget subscription's receive: waits up to `wait` for a first
/// message, then takes whatever else already arrived, up to `max`. What
/// arrives is settled on arrival; bodies that are not envelopes are dropped
/// with a warning. Redis Pub/Sub and core NATS share it.
#[cfg(any(feature = "redis", feature = "nats"))]
async fn receive_published<S, M>(
    messages: &mut S,
    body: impl Fn(&M) -> &[u8],
    max: usize,
    wait: Duration,
    broker: &'static str,
) -> Result<Vec<Delivery>, TransportError>
where
    S: futures_util::Stream<Item = M> + Unpin,
{
    use futures_util::{FutureExt, StreamExt};
    let mut out = Vec::new();
    let mut next = match tokio::time::timeout(wait, messages.next()).await {
        Err(_) => return Ok(out),
        Ok(None) => return Err(TransportError::Broker { broker, why: "subscription closed".into() }),
        Ok(Some(message)) => Some(message),
    };
    while let Some(message) = next.take() {
        match Envelope::from_body(body(&message)) {
            Ok(envelope) => out.push(Delivery { envelope, delivery_count: 1, receipt: Receipt(String::new()) }),
            Err(e) => tracing::warn!(error = %e, "dropping a published message that is not a haunt envelope"),
        }
        if out.len() >= max {
            break;
        }
        // Whatever else already arrived joins the batch.
        next = messages.next().now_or_never().flatten();
    }
    Ok(out)
}

/// The name queues, streams and topics take on every broker whose names
/// allow a dot (NATS streams and SQS queues are named `haunt-orders`).
pub const DESTINATION: &str = "haunt.orders";

/// The URL a client of `spec` uses for a broker listening on `addr` (a
/// loopback port, or a fault proxy in front of one).
pub fn local_url(spec: TransportSpec, addr: std::net::SocketAddr) -> String {
    url(spec, &addr.to_string())
}

/// The URL a client of `spec` uses for a broker at `authority` (`host:port`).
pub fn url(spec: TransportSpec, authority: &str) -> String {
    match spec.kind {
        Kind::Db => String::new(),
        // `%2f`: the default virtual host `/`.
        Kind::RabbitMq => format!("amqp://{authority}/%2f"),
        Kind::RedisStreams | Kind::RedisPubSub => format!("redis://{authority}/"),
        Kind::Nats => format!("nats://{authority}"),
        Kind::Mqtt => format!("mqtt://{authority}"),
        Kind::Sqs | Kind::PubSub => format!("http://{authority}"),
        Kind::Kafka => format!("kafka://{authority}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_ready_while_all_are_connected() {
        let links = Links::new(2);
        assert!(!links.ready());
        links.connected();
        assert_eq!(
            links.report(),
            (false, "{\"ready\":false,\"broker_clients\":1,\"broker_clients_wanted\":2}\n".into())
        );
        links.connected();
        assert!(links.ready());
        links.dropped();
        assert!(!links.ready(), "one dropped: not ready until it is back");
        links.dropped();
        links.dropped();
        links.connected();
        assert!(!links.ready(), "a drop too many does not count below zero");
        assert!(Links::new(0).ready());
    }

    /// The three modes whose broker drops what no consumer is there for;
    /// every other keeps it (the transport bench fills those first).
    #[test]
    fn only_fire_and_forget_modes_keep_nothing_for_an_absent_consumer() {
        let kept_nothing: Vec<String> = TransportSpec::all()
            .into_iter()
            .filter(|s| s.is_broker() && !s.keeps_for_absent_consumers())
            .map(|s| s.to_string())
            .collect();
        assert_eq!(kept_nothing, ["redis-pubsub", "nats:core", "mqtt:qos0"]);
    }

    #[test]
    fn names_parse_and_print_back_as_spelled() {
        for spec in TransportSpec::all() {
            let spelled = spec.to_string();
            assert_eq!(spelled.parse::<TransportSpec>().unwrap(), spec, "{spelled}");
        }
        let bare: TransportSpec = "redis-streams".parse().unwrap();
        assert_eq!((bare.kind, bare.claim()), (Kind::RedisStreams, Guarantee::AtLeastOnce));
        assert_eq!(TransportSpec::default().kind, Kind::Db);
    }

    /// The suite runs this twice: with every broker (the workspace's build)
    /// and with none (`--no-default-features`, as the first command builds).
    #[test]
    fn a_transport_is_taken_when_built_and_refused_naming_its_feature_when_not() {
        for spec in TransportSpec::all() {
            let spelled = spec.to_string();
            match (spec.is_built(), TransportSpec::built(&spelled)) {
                (true, Ok(taken)) => assert_eq!(taken, spec),
                (false, Err(why)) => {
                    let feature = spec.feature().expect("only a broker can be left out");
                    assert!(why.contains(&format!("transport {spelled} is not in this build")), "{why}");
                    assert!(why.contains(&format!("cargo build --release --features {feature}")), "{why}");
                }
                (built, answer) => panic!("{spelled}: built {built}, answered {answer:?}"),
            }
        }
        assert!(TransportSpec::default().is_built(), "the database queue is in every build");
        let features = [
            cfg!(feature = "redis"),
            cfg!(feature = "rabbitmq"),
            cfg!(feature = "nats"),
            cfg!(feature = "mqtt"),
            cfg!(feature = "sqs"),
            cfg!(feature = "pubsub"),
            cfg!(feature = "kafka"),
        ];
        let (all_features, any_feature) = (features.iter().all(|f| *f), features.iter().any(|f| *f));
        let brokers: Vec<TransportSpec> = TransportSpec::all().into_iter().filter(TransportSpec::is_broker).collect();
        let built = brokers.iter().filter(|s| s.is_built()).count();
        assert_eq!(built == brokers.len(), all_features, "{built} of {} brokers built", brokers.len());
        assert_eq!(built > 0, any_feature, "{built} of {} brokers built", brokers.len());
        assert!(TransportSpec::built("kafka:nope").unwrap_err().contains("has no mode"));
    }

    #[test]
    fn a_bare_broker_name_takes_its_at_least_once_mode() {
        for (bare, mode) in [
            ("rabbitmq", "manual-ack"),
            ("nats", "jetstream"),
            ("mqtt", "qos1"),
            ("sqs", "standard"),
            ("pubsub", "pull"),
        ] {
            let spec: TransportSpec = bare.parse().unwrap();
            assert_eq!((spec.mode(), spec.claim()), (mode, Guarantee::AtLeastOnce), "{bare}");
            // A transport with several modes always prints its mode.
            assert_eq!(spec.to_string(), format!("{bare}:{mode}"));
        }
        let claims: Vec<(String, Guarantee)> = TransportSpec::all()
            .into_iter()
            .filter(|s| matches!(s.kind, Kind::RabbitMq | Kind::Nats | Kind::Mqtt | Kind::Sqs | Kind::PubSub))
            .map(|s| (s.to_string(), s.claim()))
            .collect();
        let want = [
            ("rabbitmq:manual-ack", Guarantee::AtLeastOnce),
            ("rabbitmq:auto-ack", Guarantee::AtMostOnce),
            ("nats:jetstream", Guarantee::AtLeastOnce),
            ("nats:core", Guarantee::AtMostOnce),
            ("mqtt:qos1", Guarantee::AtLeastOnce),
            ("mqtt:qos0", Guarantee::AtMostOnce),
            ("mqtt:qos2", Guarantee::ExactlyOnce),
            ("sqs:standard", Guarantee::AtLeastOnce),
            ("sqs:fifo", Guarantee::ExactlyOnce),
            ("pubsub:pull", Guarantee::AtLeastOnce),
            ("pubsub:exactly-once", Guarantee::ExactlyOnce),
            ("pubsub:ordered", Guarantee::AtLeastOnce),
        ];
        assert_eq!(claims, want.map(|(n, g)| (n.to_owned(), g)));
    }

    #[test]
    fn only_the_modes_that_keep_a_keys_order_claim_it() {
        let claiming: Vec<String> = TransportSpec::all()
            .into_iter()
            .filter(|s| s.order_claim() == OrderClaim::PerKey)
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            claiming,
            ["sqs:fifo", "pubsub:ordered", "kafka:at-least-once", "kafka:at-most-once", "kafka:eos", "kafka:acks-1"]
        );
        assert_eq!(TransportSpec::default().order_claim(), OrderClaim::None, "the database queue claims none");
        assert_eq!(serde_json::to_value(OrderClaim::PerKey).unwrap(), serde_json::json!("per-key"));
        assert_eq!(OrderClaim::PerKey.name(), "per-key");
    }

    #[test]
    fn each_broker_names_its_server_and_url() {
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], 5000).into();
        for (spelled, server, url) in [
            ("rabbitmq", "rabbitmq", "amqp://127.0.0.1:5000/%2f"),
            ("nats:core", "nats", "nats://127.0.0.1:5000"),
            ("mqtt:qos2", "mosquitto", "mqtt://127.0.0.1:5000"),
            ("sqs:fifo", "moto", "http://127.0.0.1:5000"),
            ("pubsub:ordered", "pubsub-emulator", "http://127.0.0.1:5000"),
            ("kafka:eos", "kafka", "kafka://127.0.0.1:5000"),
        ] {
            let spec: TransportSpec = spelled.parse().unwrap();
            assert_eq!((spec.server(), local_url(spec, addr).as_str()), (Some(server), url), "{spelled}");
        }
    }

    #[test]
    fn unknown_names_and_modes_are_refused_naming_what_exists() {
        let e = "rabbit".parse::<TransportSpec>().unwrap_err();
        assert!(e.to_string().contains("redis-streams"), "{e}");
        let e = "redis-pubsub:durable".parse::<TransportSpec>().unwrap_err();
        assert!(e.to_string().contains("fire-and-forget"), "{e}");
    }

    #[test]
    fn kafkas_modes_and_what_each_claims() {
        let spec: TransportSpec = "kafka".parse().unwrap();
        assert_eq!((spec.to_string(), spec.claim()), ("kafka:at-least-once".into(), Guarantee::AtLeastOnce));
        for (spelled, claim, confirms) in [
            ("kafka:at-most-once", Guarantee::AtMostOnce, true),
            ("kafka:eos", Guarantee::ExactlyOnce, false),
            ("kafka:acks-1", Guarantee::AtLeastOnce, true),
        ] {
            let spec: TransportSpec = spelled.parse().unwrap();
            assert_eq!((spec.claim(), spec.has_publisher_confirms()), (claim, confirms), "{spelled}");
            assert_eq!(spec.order_claim(), OrderClaim::PerKey, "{spelled}: a key's partition keeps its order");
        }
        let e = "kafka:transactions".parse::<TransportSpec>().unwrap_err().to_string();
        assert!(e.contains("at-least-once, at-most-once, eos, acks-1"), "{e}");
        assert!(matches!("kafkaesque".parse::<TransportSpec>(), Err(SpecError::Transport(_))));
    }
}
