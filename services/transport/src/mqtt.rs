//! MQTT 3.1.1 (mosquitto): persistent sessions at QoS 1 (at-least-once),
//! QoS 2 (exactly-once within a session) or QoS 0 (at-most-once).
//!
//! The relay publishes each envelope to the topic `haunt.orders` at the
//! mode's QoS; with `Options::confirms` a batch is `Ok` once the broker
//! acknowledged every message (PUBACK at QoS 1, PUBCOMP at QoS 2; at QoS 0,
//! once it was written to the socket).
//!
//! Workers subscribe to the shared subscription `$share/haunt/haunt.orders`
//! (mosquitto serves `$share` to 3.1.1 clients too), so the workers share
//! the messages instead of each getting all of them. At QoS 1 and 2 a
//! worker's session is persistent (`clean_session = false`, the client id
//! is `Options::client_id`) and acks are manual: a message is acked (PUBACK
//! at QoS 1, PUBREC at QoS 2) only by `Consumer::ack`.
//!
//! **What a lost ack does differs from the other brokers**: MQTT has no
//! visibility timeout, and an unacked message belongs to the session it was
//! sent to, never to another one. The broker resends it (with the DUP flag)
//! only when *the same client id* connects again (MQTT 3.1.1 §4.4); while
//! the session stays connected, or if that client id never comes back, the
//! message waits. mosquitto also queues new messages for an offline member
//! of a shared subscription (it takes its turn in the round robin), so a
//! dead worker's session gathers messages until that worker returns. In
//! haunt the redelivery therefore happens when the same client id connects
//! again; the contract test reconnects the same client id instead of
//! starting a second consumer. A live worker whose ack was lost would hold
//! that message forever, and with it one of the broker's in-flight slots
//! for its session (mosquitto's `max_inflight_messages`, 20), so the
//! consumer keeps its own deadline: once a delivery it handed out has gone
//! unacked for `Options::visibility_timeout`, `receive` fails, and the
//! worker drops the connection and connects the session again, which makes
//! the broker resend. That is the client-side visibility timeout MQTT
//! leaves to its clients.
//!
//! **Declaring**: a message published while no session is subscribed is
//! dropped by the broker, and the inspector cannot create the workers'
//! sessions for them (it does not know their client ids, and a session it
//! created under its own id would take a share of the messages that no
//! worker would ever read). So `Inspector::declare` does nothing, and the
//! workers must have subscribed (once, ever: their sessions persist) before
//! the relay publishes.
//!
//! Delivery count: MQTT only has the DUP flag, so the count is 1, or 2 when
//! the broker flags a resend (it may have been sent more times).
//!
//! Depth: mosquitto cannot list a session's queued messages over MQTT. It
//! publishes, under `$SYS`, how many messages its store holds (those queued
//! or in flight for sessions, plus the retained ones) and how many are
//! retained; haunt publishes nothing retained, so the difference is what
//! the sessions hold, a [`Depth::Counted`]. `$SYS` is refreshed once every
//! `sys_interval` (10 s by default), so the inspector waits for the next
//! refresh (the uptime topic changes at every one) and reads the counts
//! published with it: a depth takes up to [`SYS_WAIT`]. The two counts are
//! published one after the other in each refresh, and in the first
//! refresh after the broker starts mosquitto creates more retained `$SYS`
//! topics as it goes, so that one refresh can be off in either direction;
//! it is exact afterwards (measured by the contract test). At QoS 0 nothing
//! is held: the depth is an empty list.
//!
//! Durability (mosquitto 2.0.11, measured): mosquitto keeps its store in
//! memory and writes it on autosave (after every change, as
//! `haunt_chaos::systems::brokers` configures it), and a PUBACK or PUBCOMP can go
//! out before that write: of 22 SIGKILLs right after the last confirm, 3
//! (under load) came back one message of ten short (once a message never
//! delivered again, twice a count of 9). Killed a second after the last
//! confirm, messages and sessions survived every time. But after a restart
//! the sessions' shared subscription is back only once each session
//! connects again: what is published before that is confirmed and dropped
//! (a test in `haunt-chaos` holds it), so a restart while the relay
//! publishes loses confirmed messages.
//!
//! QoS 0: a clean session, no acks: what a worker receives is settled, and
//! a message sent while it is down is never seen by it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, MqttState, Outgoing, Packet, Publish, QoS, StateError,
    SubscribeReasonCode,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::{
    Consumer, DESTINATION, Delivery, Depth, Envelope, Inspector, Options, Publisher, Receipt, TransportError,
    TransportSpec,
};

/// The shared subscription every worker joins.
const SHARED: &str = "$share/haunt/haunt.orders";

/// Requests (publishes, acks) queued for the connection's event loop. A
/// full queue makes the caller wait, it loses nothing.
const REQUESTS_MAX: usize = 1024;

/// Deliveries received and not yet taken by `receive`. At QoS 1 and 2 the
/// broker keeps at most its `max_inflight_messages` (mosquitto: 20) unacked
/// messages in flight to a session, so this does not fill; at QoS 0 a full
/// queue holds the event loop back, and TCP the broker.
const DELIVERIES_MAX: usize = 1024;

/// QoS 2 exchanges the relay keeps open at once (PUBLISH sent, PUBCOMP not
/// yet received). mosquitto's `max_inflight_messages` (20 by default) also
/// bounds what a client has in flight *to* it at QoS 2: the 21st PUBLISH is
/// answered with reason 0x97 (quota exceeded) and the connection closed.
/// rumqttc's default of 100 made every batch of more than 20 fail, so after
/// a fault left a backlog in the outbox the relay published it again and
/// again and it never drained.
const QOS2_INFLIGHT_MAX: u16 = 20;

/// The largest packet either side accepts: an envelope is a few hundred bytes.
const PACKET_MAX: usize = 1 << 20;

/// How long a subscribe, or a batch's confirmations, may take.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// How long the inspector waits for the next `$SYS` refresh: mosquitto's
/// default `sys_interval` of 10 s, and a margin.
const SYS_WAIT: Duration = Duration::from_secs(15);

/// How long after the refresh's uptime the inspector waits for the rest of
/// that refresh (published in one go).
const SYS_GRACE: Duration = Duration::from_millis(500);

/// The pause between reconnection attempts of an event loop.
const RECONNECT_DELAY: Duration = Duration::from_millis(250);

const STORED: &str = "$SYS/broker/store/messages/count";
const RETAINED: &str = "$SYS/broker/retained messages/count";
const UPTIME: &str = "$SYS/broker/uptime";

fn broker(e: impl std::fmt::Display) -> TransportError {
    TransportError::Broker { broker: "mqtt", why: e.to_string() }
}

fn unconfirmed(e: impl std::fmt::Display) -> TransportError {
    TransportError::Unconfirmed { broker: "mqtt", why: e.to_string() }
}

fn qos(spec: TransportSpec) -> QoS {
    match spec.mode() {
        "qos0" => QoS::AtMostOnce,
        "qos2" => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

/// Host and port of `mqtt://HOST:PORT` (or `tcp://`, or bare).
fn address(url: &str) -> Result<(String, u16), TransportError> {
    let rest = url.strip_prefix("mqtt://").or_else(|| url.strip_prefix("tcp://")).unwrap_or(url);
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| broker(format!("no port in {url:?}")))?;
    let port = port.parse().map_err(|_| broker(format!("bad port in {url:?}")))?;
    Ok((host.to_owned(), port))
}

fn mqtt_options(url: &str, client_id: &str, persistent: bool) -> Result<MqttOptions, TransportError> {
    let (host, port) = address(url)?;
    let mut options = MqttOptions::new(client_id, host, port);
    options.set_clean_session(!persistent).set_max_packet_size(PACKET_MAX, PACKET_MAX);
    options.set_keep_alive(Duration::from_secs(30)).set_request_channel_capacity(REQUESTS_MAX);
    Ok(options)
}

/// The event loop of one connection, polled by its own task until dropped.
#[derive(Debug)]
struct Polled(Option<JoinHandle<()>>);

impl Polled {
    /// Stops the event loop as [`Drop`] does, and returns once its task,
    /// and with it the socket, is gone.
    async fn closed(mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Polled {
    fn drop(&mut self) {
        // Closes the socket without a DISCONNECT, as a crash would: a
        // persistent session stays on the broker.
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Polls `eventloop` forever, reconnecting after errors, and hands each
/// event to `on_event` (an error as `Err`); stops when `on_event` says so.
fn poll(mut eventloop: EventLoop, mut on_event: impl FnMut(Result<Event, String>) -> bool + Send + 'static) -> Polled {
    Polled(Some(tokio::spawn(async move {
        loop {
            let event = eventloop.poll().await;
            let failed = event.is_err();
            if !on_event(event.map_err(|e| e.to_string())) {
                return;
            }
            if failed {
                tokio::time::sleep(RECONNECT_DELAY).await;
            }
        }
    })))
}

pub(crate) async fn publisher(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    let mut mqtt = mqtt_options(url, &options.client_id, false)?;
    if qos(spec) == QoS::ExactlyOnce {
        mqtt.set_inflight(QOS2_INFLIGHT_MAX);
    }
    let (client, eventloop) = AsyncClient::new(mqtt, REQUESTS_MAX);
    // Unbounded, but drained at every batch: only what one batch causes
    // (a written and an acked event per message, and errors) is in it.
    let (events, received) = mpsc::unbounded_channel();
    let polled = poll(eventloop, move |event| {
        let keep = match event {
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => Some(Progress::Written(pkid)),
            Ok(Event::Incoming(Packet::PubAck(ack))) => Some(Progress::Acked(ack.pkid)),
            Ok(Event::Incoming(Packet::PubComp(comp))) => Some(Progress::Acked(comp.pkid)),
            Err(e) => Some(Progress::Failed(e)),
            Ok(_) => None,
        };
        match keep {
            Some(progress) => events.send(progress).is_ok(),
            None => true,
        }
    });
    Ok(Box::new(MqttPublisher {
        client,
        qos: qos(spec),
        confirms: options.confirms,
        events: received,
        _polled: polled,
    }))
}

#[derive(Debug)]
enum Progress {
    Written(u16),
    Acked(u16),
    Failed(String),
}

#[derive(Debug)]
struct MqttPublisher {
    client: AsyncClient,
    qos: QoS,
    confirms: bool,
    events: mpsc::UnboundedReceiver<Progress>,
    _polled: Polled,
}

impl Publisher for MqttPublisher {
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            // What an earlier batch left (late acks, old errors) says
            // nothing about this one.
            while self.events.try_recv().is_ok() {}
            for envelope in batch {
                self.client.publish(DESTINATION, self.qos, false, envelope.to_body()).await.map_err(unconfirmed)?;
            }
            if !self.confirms {
                return Ok(());
            }
            let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
            let (mut written, mut unacked) = (0, HashSet::new());
            while written < batch.len() || !unacked.is_empty() {
                let progress = tokio::time::timeout_at(deadline, self.events.recv()).await.map_err(|_| {
                    unconfirmed(format!(
                        "{written} of {} written, {} unacknowledged after {ANSWER_WAIT:?}",
                        batch.len(),
                        unacked.len()
                    ))
                })?;
                match progress {
                    Some(Progress::Written(pkid)) => {
                        written += 1;
                        if self.qos != QoS::AtMostOnce {
                            unacked.insert(pkid);
                        }
                    }
                    Some(Progress::Acked(pkid)) => {
                        unacked.remove(&pkid);
                    }
                    // A connection lost mid-batch: with a clean session the
                    // client does not resend, so the rest is unknown.
                    Some(Progress::Failed(e)) => return Err(unconfirmed(e)),
                    None => return Err(unconfirmed("the connection's event loop stopped")),
                }
            }
            Ok(())
        })
    }
}

pub(crate) async fn consumer(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Consumer>, TransportError> {
    let qos = qos(spec);
    let persistent = qos != QoS::AtMostOnce;
    let mut mqtt = mqtt_options(url, &options.client_id, persistent)?;
    mqtt.set_manual_acks(persistent);
    let (client, eventloop) = AsyncClient::new(mqtt, REQUESTS_MAX);
    let (deliveries, received) = mpsc::channel(DELIVERIES_MAX);
    // The last subscription's answer: granted or refused.
    let (subscribed, mut answer) = watch::channel(None::<Result<(), String>>);
    let resubscribe = client.clone();
    let polled = Polled(Some(tokio::spawn(async move {
        let mut eventloop = eventloop;
        // QoS 2: packet ids this session answered with PUBREC and whose
        // PUBREL the broker may still send (see `expect_release`).
        let mut released = BTreeSet::new();
        loop {
            match eventloop.poll().await {
                Ok(Event::Outgoing(Outgoing::PubRec(pkid))) => {
                    released.insert(pkid);
                    expect_release(&mut eventloop.state, pkid);
                }
                Ok(Event::Outgoing(Outgoing::PubComp(pkid))) => {
                    released.remove(&pkid);
                }
                // Subscribed again on every connection: a session the broker
                // lost (or a clean one) has no subscription.
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    if let Err(e) = resubscribe.try_subscribe(SHARED, qos) {
                        tracing::warn!(error = %e, "mqtt: could not queue the subscription");
                    }
                }
                Ok(Event::Incoming(Packet::SubAck(ack))) => {
                    let granted = match ack.return_codes.first() {
                        Some(SubscribeReasonCode::Success(granted)) if *granted == qos => Ok(()),
                        other => Err(format!("subscription to {SHARED} at {qos:?} answered {other:?}")),
                    };
                    let _ = subscribed.send(Some(granted));
                }
                Ok(Event::Incoming(Packet::Publish(publish))) => {
                    if deliveries.send(publish).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "mqtt consumer connection failed; reconnecting");
                    if qos == QoS::ExactlyOnce {
                        // A PUBREL this connection had no record of: the
                        // PUBREC went out from an earlier connection or
                        // process. The broker sends it again on the reconnect.
                        if let ConnectionError::MqttState(StateError::Unsolicited(pkid)) = e {
                            released.insert(pkid);
                        }
                        // The error cleared the connection's QoS 2 records.
                        for pkid in &released {
                            expect_release(&mut eventloop.state, *pkid);
                        }
                    }
                    tokio::time::sleep(RECONNECT_DELAY).await;
                }
            }
        }
    })));
    // The subscription must be in place before this returns: a message
    // published before it is not kept for this session.
    let answered = tokio::time::timeout(ANSWER_WAIT, answer.wait_for(Option::is_some)).await;
    match answered {
        Err(_) => return Err(broker(format!("no answer to the subscription within {ANSWER_WAIT:?} from {url}"))),
        Ok(Err(_)) => return Err(broker("the connection's event loop stopped")),
        Ok(Ok(answer)) => answer.clone().expect("waited for an answer").map_err(broker)?,
    }
    Ok(Box::new(MqttConsumer {
        client,
        qos,
        deliveries: received,
        _polled: polled,
        unacked: BTreeMap::new(),
        ack_deadline: options.visibility_timeout,
    }))
}

/// Makes a connection's state answer the broker's PUBREL for `pkid` with
/// PUBCOMP.
///
/// rumqttc 0.25 answers a PUBREL only for a QoS 2 PUBLISH received on the
/// same connection, and forgets those on every reconnect. But the broker
/// sends a PUBREL for every PUBREC it got, and again after each reconnect
/// of the session until it has the PUBCOMP (MQTT 3.1.1 §4.4). A PUBREL
/// rumqttc does not know of is an error that drops the connection, the
/// broker sends it again on the next one, and the session never subscribes
/// again (rumqtt issue #664; a test in `haunt-chaos` shows it). What the
/// broker releases, this session has received and answered, so the PUBCOMP
/// is owed. The state's only way in is as a PUBLISH is recorded: one is
/// handed to it, and the event that it queues for the caller taken back.
fn expect_release(state: &mut MqttState, pkid: u16) {
    let mut publish = Publish::new(DESTINATION, QoS::ExactlyOnce, Vec::new());
    publish.pkid = pkid;
    let queued = state.events.len();
    // With manual acks, a QoS 2 PUBLISH only records its packet id.
    let _ = state.handle_incoming_packet(Packet::Publish(publish));
    state.events.truncate(queued);
}

#[derive(Debug)]
struct MqttConsumer {
    client: AsyncClient,
    qos: QoS,
    deliveries: mpsc::Receiver<Publish>,
    _polled: Polled,
    /// Packet ids handed out and not acked, with when they were received.
    unacked: BTreeMap<u16, Instant>,
    /// How long a delivery may stay unacked before the session is
    /// reconnected for the broker to resend it: the visibility timeout.
    ack_deadline: Duration,
}

impl MqttConsumer {
    /// Acks one delivery by its packet id.
    async fn ack_pkid(&self, pkid: u16) -> Result<(), TransportError> {
        let mut publish = Publish::new(DESTINATION, self.qos, Vec::new());
        publish.pkid = pkid;
        self.client.ack(&publish).await.map_err(broker)
    }
}

impl Consumer for MqttConsumer {
    /// Returns once the socket is closed: a publish that follows then finds
    /// the session offline, and the broker queues it rather than sending it
    /// to a connection about to close (which it would send again later
    /// marked DUP: a first delivery counted as a second, in the suite).
    fn crash(self: Box<Self>) -> BoxFuture<'static, ()> {
        let MqttConsumer { _polled, .. } = *self;
        Box::pin(_polled.closed())
    }

    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            // MQTT resends an unacked message only on a reconnect of its
            // session (see the module doc): one held past the deadline means
            // this connection is done with.
            if let Some(held) = self.unacked.values().min().filter(|at| at.elapsed() >= self.ack_deadline) {
                return Err(broker(format!(
                    "{} deliveries unacked, the oldest for {:?} (past the visibility timeout): the session must \
                     reconnect for the broker to resend them",
                    self.unacked.len(),
                    held.elapsed()
                )));
            }
            let mut raw = Vec::new();
            match tokio::time::timeout(wait, self.deliveries.recv()).await {
                Err(_) => return Ok(Vec::new()),
                Ok(None) => return Err(broker("the connection's event loop stopped")),
                Ok(Some(publish)) => raw.push(publish),
            }
            while raw.len() < max {
                match self.deliveries.try_recv() {
                    Ok(publish) => raw.push(publish),
                    Err(_) => break,
                }
            }
            let mut out = Vec::with_capacity(raw.len());
            for publish in raw {
                match Envelope::from_body(&publish.payload) {
                    Ok(envelope) => {
                        if self.qos != QoS::AtMostOnce {
                            self.unacked.insert(publish.pkid, Instant::now());
                        }
                        out.push(Delivery {
                            envelope,
                            delivery_count: if publish.dup { 2 } else { 1 },
                            receipt: Receipt(publish.pkid.to_string()),
                        })
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "dropping a published message that is not a haunt envelope");
                        if self.qos != QoS::AtMostOnce {
                            self.ack_pkid(publish.pkid).await?;
                        }
                    }
                }
            }
            Ok(out)
        })
    }

    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if self.qos == QoS::AtMostOnce {
                return Ok(());
            }
            for receipt in receipts {
                let pkid = receipt.0.parse().map_err(|_| broker(format!("not a packet id: {:?}", receipt.0)))?;
                self.ack_pkid(pkid).await?;
                self.unacked.remove(&pkid);
            }
            Ok(())
        })
    }

    fn acks_on_receipt(&self) -> bool {
        self.qos == QoS::AtMostOnce
    }
}

pub(crate) async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    address(url)?;
    Ok(Box::new(Sessions { url: url.to_owned(), qos: qos(spec) }))
}

/// The broker's sessions, seen through `$SYS`.
#[derive(Debug)]
struct Sessions {
    url: String,
    qos: QoS,
}

impl Sessions {
    /// The stored and retained counts of the first `$SYS` refresh after now.
    async fn counts(&self) -> Result<(u64, u64), TransportError> {
        // A clean session under a name of its own: it joins no share and
        // leaves nothing behind.
        let id = format!("haunt-inspector-{}-{:?}", std::process::id(), Instant::now());
        let (client, eventloop) = AsyncClient::new(mqtt_options(&self.url, &id, false)?, REQUESTS_MAX);
        let (events, mut received) = mpsc::unbounded_channel();
        let _polled = poll(eventloop, move |event| match event {
            Ok(Event::Incoming(Packet::Publish(publish))) => events.send(Ok(publish)).is_ok(),
            Ok(_) => true,
            Err(e) => events.send(Err(e)).is_ok(),
        });
        for topic in [UPTIME, STORED, RETAINED] {
            client.subscribe(topic, QoS::AtMostOnce).await.map_err(broker)?;
        }
        let mut values = BTreeMap::new();
        let mut deadline = tokio::time::Instant::now() + SYS_WAIT;
        let mut refreshed = false;
        loop {
            match tokio::time::timeout_at(deadline, received.recv()).await {
                Err(_) if refreshed => break,
                Err(_) => return Err(broker(format!("no $SYS refresh within {SYS_WAIT:?}"))),
                Ok(None) => return Err(broker("the connection's event loop stopped")),
                Ok(Some(Err(e))) => return Err(broker(e)),
                Ok(Some(Ok(publish))) => {
                    let value = String::from_utf8_lossy(&publish.payload).trim().to_owned();
                    // Retained copies are the last refresh's; a live uptime is
                    // the next refresh beginning.
                    if publish.topic == UPTIME && !publish.retain && !refreshed {
                        refreshed = true;
                        deadline = tokio::time::Instant::now() + SYS_GRACE;
                    }
                    values.insert(publish.topic, value);
                }
            }
        }
        let _ = client.disconnect().await;
        let count = |topic: &str| -> Result<u64, TransportError> {
            let value = values.get(topic).ok_or_else(|| broker(format!("mosquitto published no {topic}")))?;
            value.parse().map_err(|_| broker(format!("{topic} is not a count: {value:?}")))
        };
        Ok((count(STORED)?, count(RETAINED)?))
    }
}

impl Inspector for Sessions {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        // See the module doc: the workers' own subscriptions are the topology.
        Box::pin(async { Ok(()) })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async move {
            if self.qos == QoS::AtMostOnce {
                return Ok(Depth::Listed(Vec::new()));
            }
            let (stored, retained) = self.counts().await?;
            Ok(Depth::Counted(stored.saturating_sub(retained)))
        })
    }
}
