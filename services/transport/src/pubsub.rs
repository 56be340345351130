//! Google Cloud Pub/Sub, spoken to over its REST API (`v1`), as Google's
//! emulator serves it.
//!
//! haunt runs this against **Google's Pub/Sub emulator, not Pub/Sub**
//! (`cloud-pubsub-emulator`, from the Google Cloud SDK): it keeps
//! everything in memory, so a restart loses every topic, subscription and
//! message (Pub/Sub is durable), and Google documents that it does not
//! implement every feature. The contract tests say what it does.
//!
//! One topic (`haunt.orders`) in the project `haunt`, and one subscription
//! per mode, each created with the topic (a topic drops what it is given
//! while it has no subscription, so every end declares both before it
//! publishes or pulls):
//!
//! - `pubsub:pull` (`haunt.orders.pull`): at-least-once. A worker pulls
//!   (unary pull, `returnImmediately`, polled), sets each delivery's ack
//!   deadline to `Options::visibility_timeout` with `modifyAckDeadline`,
//!   and acks after the effect commits. **A delivery not acked within its
//!   deadline is delivered again, to any worker**, whether the first died
//!   or is only stopped; a nack (`modifyAckDeadline` 0) brings it back at
//!   once. While the worker is still on a batch (its apply is slow, or waits
//!   out a retry's backoff) the consumer extends the batch's deadlines every
//!   half deadline, for at most a minute, as Google's client libraries do;
//!   its next receive ends that, so an ack the `ack-loss` fault dropped is
//!   not extended. A worker that dies right after a pull, before it set the
//!   deadline, costs the subscription's own deadline: 10 s, Pub/Sub's least.
//! - `pubsub:exactly-once` (`…exactly-once`, `enableExactlyOnceDelivery`):
//!   Google's claim is that a message whose ack succeeded is not delivered
//!   again, and that an ack after the deadline fails. Each ack is its own
//!   request, so that a failed one is known: it is reported as an error,
//!   and the delivery counts as not acked. A copy the relay published again
//!   is a new message with an id of its own: no broker promises anything
//!   about it, and the inbox absorbs it.
//! - `pubsub:ordered` (`…ordered`, `enableMessageOrdering`): each message
//!   carries the envelope's key (the order's item) as its ordering key, and
//!   Pub/Sub delivers a key's messages in publish order, the next not before
//!   the one before it is acked or given back (`OrderClaim::PerKey`).
//!   **The emulator breaks that order on a nack**: a message given back
//!   with deadline 0 comes again after the messages of its key that were
//!   published while it was out (`chaos/tests/it/transports.rs` shows it).
//!   A deadline that runs out keeps the order, so a consumer of an ordered
//!   subscription gives a delivery back with a deadline of 1 s instead.
//!
//! Every subscription has a dead-letter policy to `haunt.orders.dead` at
//! Pub/Sub's highest attempt count (100): without one, Pub/Sub leaves a
//! delivery's `deliveryAttempt` unset, and every redelivery would read as a
//! first. The worker parks a message long before Pub/Sub would; what
//! Pub/Sub itself forwards is kept by the subscription of the same name and
//! shows in the depth.
//!
//! Publish: one `publish` request per 1,000 messages; its answer, with one
//! message id per message, is the confirmation (with `Options::confirms`
//! off the request is sent and not waited for).
//!
//! Depth: Pub/Sub cannot list or count what a subscription holds without
//! pulling it, and a pull hides what it returns until its deadline. So the
//! inspector pulls, holds what it pulled, and gives it all back at the end
//! (`deliveryAttempt` grows by one). A delivery held by a consumer that died
//! is seen only once its deadline has run out, so a read that did not follow
//! a quiet spell waits out the longest deadline first. An ordered
//! subscription hands out only the head of each key, so its depth is a
//! count: a run that did not drain is `unknown`, never a false loss.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use crate::{
    Consumer, Delivery, Depth, Envelope, Held, Inspector, Options, Publisher, Receipt, TransportError, TransportSpec,
};

/// The project every name lives in: the emulator takes any.
const PROJECT: &str = "haunt";
const TOPIC: &str = "haunt.orders";
const DEAD_TOPIC: &str = "haunt.orders.dead";

/// Pub/Sub's limit on the messages of one publish request, and what one
/// pull may return.
const PUBLISH_MAX: usize = 1000;
const PULL_MAX: usize = 1000;

/// The subscription's own ack deadline: Pub/Sub's least. It holds only
/// between a pull and the `modifyAckDeadline` that follows it.
const SUBSCRIPTION_DEADLINE: Duration = Duration::from_secs(10);

/// The longest deadline `modifyAckDeadline` sets.
const DEADLINE_MAX_S: u64 = 600;

/// Pub/Sub's highest `maxDeliveryAttempts`.
const DEAD_LETTER_ATTEMPTS: u32 = 100;

/// How often an empty subscription is pulled again within one receive.
const POLL: Duration = Duration::from_millis(50);

/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long apart the inspector pulls while it waits for a quiet spell.
const RECOUNT_DELAY: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Pull,
    ExactlyOnce,
    Ordered,
}

impl Mode {
    fn of(spec: TransportSpec) -> Mode {
        match spec.mode() {
            "exactly-once" => Mode::ExactlyOnce,
            "ordered" => Mode::Ordered,
            _ => Mode::Pull,
        }
    }

    /// The deadline that hands a delivery back: 0 (a nack) but on an
    /// ordered subscription, where the emulator gives a nacked message back
    /// after the messages of its key published while it was out (a key's
    /// order broken; Pub/Sub documents redelivery in order). A deadline that
    /// runs out keeps the order, so there the delivery goes back in 1 s.
    fn give_back_s(self) -> u64 {
        if self == Mode::Ordered { 1 } else { 0 }
    }

    fn subscription(self) -> &'static str {
        match self {
            Mode::Pull => "haunt.orders.pull",
            Mode::ExactlyOnce => "haunt.orders.exactly-once",
            Mode::Ordered => "haunt.orders.ordered",
        }
    }
}

fn broker(why: impl std::fmt::Display) -> TransportError {
    TransportError::Broker { broker: "pubsub", why: why.to_string() }
}

/// The REST API of one emulator (or `PUBSUB_EMULATOR_HOST`).
#[derive(Debug, Clone)]
struct Api {
    http: reqwest::Client,
    /// `http://host:port/v1/projects/haunt`
    base: String,
}

/// A request the server refused or never answered.
#[derive(Debug)]
struct Refused {
    /// The HTTP status, `None` when no answer came.
    status: Option<u16>,
    why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(s) => write!(f, "HTTP {s}: {}", self.why),
            None => f.write_str(&self.why),
        }
    }
}

impl Api {
    fn new(url: &str) -> Result<Api, TransportError> {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(broker)?;
        Ok(Api { http, base: format!("{}/v1/projects/{PROJECT}", url.trim_end_matches('/')) })
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: &Value) -> Result<Value, Refused> {
        let url = format!("{}/{path}", self.base);
        let answer = self
            .http
            .request(method, &url)
            .json(body)
            .send()
            .await
            .map_err(|e| Refused { status: None, why: format!("{url}: {e}") })?;
        let status = answer.status();
        let text = answer.text().await.map_err(|e| Refused { status: None, why: format!("{url}: {e}") })?;
        if !status.is_success() {
            return Err(Refused { status: Some(status.as_u16()), why: text.trim().to_owned() });
        }
        serde_json::from_str(&text).map_err(|e| Refused { status: None, why: format!("{url}: {e}: {text}") })
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, Refused> {
        self.call(reqwest::Method::POST, path, body).await
    }

    /// Creates what `path` names unless it exists (409).
    async fn create(&self, path: &str, body: &Value) -> Result<(), TransportError> {
        let name = path.rsplit('/').next().unwrap_or(path);
        check_name(name).map_err(|why| broker(format!("creating {path}: {why}")))?;
        match self.call(reqwest::Method::PUT, path, body).await {
            Ok(_) => Ok(()),
            Err(Refused { status: Some(409), .. }) => Ok(()),
            Err(e) => Err(broker(format!("creating {path}: {e}"))),
        }
    }

    /// The topics, the mode's subscription and the dead letters' one.
    async fn declare(&self, mode: Mode) -> Result<(), TransportError> {
        self.create(&format!("topics/{TOPIC}"), &json!({})).await?;
        self.create(&format!("topics/{DEAD_TOPIC}"), &json!({})).await?;
        let topic = |t: &str| format!("projects/{PROJECT}/topics/{t}");
        self.create(&format!("subscriptions/{DEAD_TOPIC}"), &json!({ "topic": topic(DEAD_TOPIC) })).await?;
        let subscription = json!({
            "topic": topic(TOPIC),
            "ackDeadlineSeconds": SUBSCRIPTION_DEADLINE.as_secs(),
            "enableExactlyOnceDelivery": mode == Mode::ExactlyOnce,
            "enableMessageOrdering": mode == Mode::Ordered,
            "deadLetterPolicy": { "deadLetterTopic": topic(DEAD_TOPIC), "maxDeliveryAttempts": DEAD_LETTER_ATTEMPTS },
        });
        self.create(&format!("subscriptions/{}", mode.subscription()), &subscription).await
    }

    /// What one pull returns at once (nothing waits for a first message).
    async fn pull(&self, subscription: &str, max: usize) -> Result<Vec<Pulled>, TransportError> {
        let body = json!({ "maxMessages": max.clamp(1, PULL_MAX), "returnImmediately": true });
        let answer = self.post(&format!("subscriptions/{subscription}:pull"), &body).await.map_err(broker)?;
        let Some(received) = answer.get("receivedMessages").and_then(Value::as_array) else { return Ok(Vec::new()) };
        received.iter().map(Pulled::parse).collect()
    }

    /// Sets the ack deadline of deliveries (0: hands them back now).
    async fn modify_deadline(&self, subscription: &str, ack_ids: &[&str], seconds: u64) -> Result<(), Refused> {
        if ack_ids.is_empty() {
            return Ok(());
        }
        let body = json!({ "ackIds": ack_ids, "ackDeadlineSeconds": seconds });
        self.post(&format!("subscriptions/{subscription}:modifyAckDeadline"), &body).await.map(drop)
    }

    async fn acknowledge(&self, subscription: &str, ack_ids: &[&str]) -> Result<(), Refused> {
        let body = json!({ "ackIds": ack_ids });
        self.post(&format!("subscriptions/{subscription}:acknowledge"), &body).await.map(drop)
    }
}

/// Pub/Sub's rule for a topic's or a subscription's name, checked before
/// the request so that a bad one is named here rather than refused with
/// the API's bare `Invalid [topics] name`.
fn check_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-_.~+%".contains(c);
    if !(3..=255).contains(&name.len()) {
        return Err(format!("the name {name:?} is not 3 to 255 characters long"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) || name.starts_with("goog") {
        return Err(format!("the name {name:?} must start with a letter, and not with \"goog\""));
    }
    match name.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(format!("the name {name:?} has {c:?}: only letters, digits and - _ . ~ + % are allowed")),
        None => Ok(()),
    }
}

/// One received message as a pull returns it.
#[derive(Debug)]
struct Pulled {
    ack_id: String,
    /// The broker's id of the message (a copy published again has another).
    message_id: String,
    data: Vec<u8>,
    /// `deliveryAttempt`: set because every subscription has a dead-letter policy.
    attempt: i64,
}

impl Pulled {
    fn parse(received: &Value) -> Result<Pulled, TransportError> {
        let field = |v: &Value, name: &str| -> Result<String, TransportError> {
            v.get(name)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| broker(format!("a pull without {name}")))
        };
        let message = received.get("message").ok_or_else(|| broker("a pull without message"))?;
        // A message without data is a body of no bytes (not ours, dropped later).
        let data = message.get("data").and_then(Value::as_str).unwrap_or_default();
        Ok(Pulled {
            ack_id: field(received, "ackId")?,
            message_id: field(message, "messageId")?,
            data: BASE64.decode(data).map_err(|e| broker(format!("a message's data is not base64: {e}")))?,
            attempt: received.get("deliveryAttempt").and_then(Value::as_i64).unwrap_or(1),
        })
    }
}

/// The API at `url`, with the topics and `spec`'s subscription declared:
/// what every end does before it publishes or pulls.
async fn declared(spec: TransportSpec, url: &str) -> Result<(Api, Mode), TransportError> {
    let (api, mode) = (Api::new(url)?, Mode::of(spec));
    api.declare(mode).await?;
    Ok((api, mode))
}

pub(crate) async fn publisher(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Publisher>, TransportError> {
    let (api, mode) = declared(spec, url).await?;
    Ok(Box::new(PubSubPublisher { api, ordered: mode == Mode::Ordered, confirms: options.confirms }))
}

pub(crate) async fn consumer(
    spec: TransportSpec,
    url: &str,
    options: &Options,
) -> Result<Box<dyn Consumer>, TransportError> {
    let (api, mode) = declared(spec, url).await?;
    let deadline_s = deadline_s(options.visibility_timeout);
    let in_hand = std::sync::Arc::new(tokio::sync::Mutex::new(InHand::default()));
    let extender = tokio::spawn(extend_in_hand(api.clone(), mode, deadline_s, in_hand.clone()));
    Ok(Box::new(PubSubConsumer { api, mode, deadline_s, in_hand, extender }))
}

/// The longest a batch in hand is kept from redelivery by extensions.
const EXTENSION_MAX: Duration = Duration::from_secs(60);

/// The deliveries of the batch a consumer is working on: from its receive
/// until each is acked or given back, or the consumer's next receive (a
/// consumer's loop works one batch at a time, so what is left then was let
/// go without an ack: the `ack-loss` fault).
#[derive(Debug, Default)]
struct InHand {
    ack_ids: Vec<String>,
    since: Option<Instant>,
}

impl InHand {
    fn let_go(&mut self, receipts: &[Receipt]) {
        self.ack_ids.retain(|id| !receipts.iter().any(|r| r.0 == *id));
    }
}

/// Extends the deadlines of the batch in hand every half deadline, for at
/// most [`EXTENSION_MAX`], as Google's client libraries manage a lease: a
/// batch still being applied is not delivered to another consumer, and a
/// consumer that dies or stops (this task dies or stops with it) lets its
/// batch come back after one deadline. The lock is held across the request,
/// so an ack or a nack never lands before an extension of the same delivery.
async fn extend_in_hand(api: Api, mode: Mode, deadline_s: u64, in_hand: std::sync::Arc<tokio::sync::Mutex<InHand>>) {
    let every = Duration::from_secs(deadline_s).mul_f64(0.5).max(Duration::from_millis(500));
    loop {
        tokio::time::sleep(every).await;
        let batch = in_hand.lock().await;
        let held = batch.since.is_some_and(|t| t.elapsed() >= every && t.elapsed() < EXTENSION_MAX);
        if !held || batch.ack_ids.is_empty() {
            continue;
        }
        let ids: Vec<&str> = batch.ack_ids.iter().map(String::as_str).collect();
        match api.modify_deadline(mode.subscription(), &ids, deadline_s).await {
            Ok(()) => tracing::debug!(deliveries = ids.len(), deadline_s, "extended the batch in hand"),
            Err(e) => tracing::debug!(error = %e, "extending the batch in hand failed: it may come back"),
        }
    }
}

pub(crate) async fn inspector(spec: TransportSpec, url: &str) -> Result<Box<dyn Inspector>, TransportError> {
    Ok(Box::new(Subscription { api: Api::new(url)?, mode: Mode::of(spec), seen: Mutex::new(Seen::default()) }))
}

/// A visibility timeout as an ack deadline: whole seconds, 1 to 600.
fn deadline_s(visibility_timeout: Duration) -> u64 {
    (visibility_timeout.as_millis().div_ceil(1000) as u64).clamp(1, DEADLINE_MAX_S)
}

#[derive(Debug)]
struct PubSubPublisher {
    api: Api,
    ordered: bool,
    confirms: bool,
}

/// A message of the publish request: the envelope as its data, its key as
/// the ordering key on an ordered subscription's topic.
fn message(envelope: &Envelope, ordered: bool) -> Value {
    let mut message = json!({
        "data": BASE64.encode(envelope.to_body()),
        "attributes": { "message_id": envelope.message_id },
    });
    if ordered && let Some(key) = &envelope.key {
        message["orderingKey"] = json!(key);
    }
    message
}

impl Publisher for PubSubPublisher {
    fn publish<'a>(&'a mut self, batch: &'a [Envelope]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            for chunk in batch.chunks(PUBLISH_MAX) {
                let messages: Vec<Value> = chunk.iter().map(|e| message(e, self.ordered)).collect();
                let body = json!({ "messages": messages });
                let path = format!("topics/{TOPIC}:publish");
                if !self.confirms {
                    // The bug mode: the request goes out, its answer is not waited for.
                    let api = self.api.clone();
                    tokio::spawn(async move {
                        if let Err(e) = api.post(&path, &body).await {
                            tracing::warn!(error = %e, "an unconfirmed pubsub publish failed");
                        }
                    });
                    continue;
                }
                let answer = self
                    .api
                    .post(&path, &body)
                    .await
                    .map_err(|e| TransportError::Unconfirmed { broker: "pubsub", why: e.to_string() })?;
                let ids = answer.get("messageIds").and_then(Value::as_array).map_or(0, Vec::len);
                if ids != chunk.len() {
                    return Err(TransportError::Unconfirmed {
                        broker: "pubsub",
                        why: format!("{ids} message ids for {} messages", chunk.len()),
                    });
                }
            }
            Ok(())
        })
    }
}

#[derive(Debug)]
struct PubSubConsumer {
    api: Api,
    mode: Mode,
    /// Each delivery's ack deadline, set on receipt and extended while in hand.
    deadline_s: u64,
    in_hand: std::sync::Arc<tokio::sync::Mutex<InHand>>,
    extender: tokio::task::JoinHandle<()>,
}

impl Drop for PubSubConsumer {
    fn drop(&mut self) {
        self.extender.abort();
    }
}

impl Consumer for PubSubConsumer {
    fn receive(&mut self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Vec<Delivery>, TransportError>> {
        Box::pin(async move {
            let subscription = self.mode.subscription();
            // The batch before this one is done with: what it did not ack is not extended.
            *self.in_hand.lock().await = InHand::default();
            let until = Instant::now() + wait;
            let pulled = loop {
                let pulled = self.api.pull(subscription, max).await?;
                if !pulled.is_empty() || Instant::now() + POLL > until {
                    break pulled;
                }
                tokio::time::sleep(POLL).await;
            };
            let ack_ids: Vec<&str> = pulled.iter().map(|p| p.ack_id.as_str()).collect();
            // The run's visibility timeout, in place of the subscription's
            // 10 s. Refused, the deliveries keep those 10 s: later
            // redeliveries, never a loss.
            if let Err(e) = self.api.modify_deadline(subscription, &ack_ids, self.deadline_s).await {
                tracing::warn!(error = %e, "setting the ack deadline of a pull failed");
            }
            let mut out = Vec::with_capacity(pulled.len());
            let mut junk = Vec::new();
            for p in pulled {
                match Envelope::from_body(&p.data) {
                    Ok(envelope) => {
                        out.push(Delivery { envelope, delivery_count: p.attempt, receipt: Receipt(p.ack_id) })
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, pubsub_id = %p.message_id,
                            "dropping a message that is not a haunt envelope");
                        junk.push(Receipt(p.ack_id));
                    }
                }
            }
            self.ack(&junk).await?;
            let ack_ids = out.iter().map(|d| d.receipt.0.clone()).collect();
            *self.in_hand.lock().await = InHand { ack_ids, since: Some(Instant::now()) };
            Ok(out)
        })
    }

    fn ack<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            if receipts.is_empty() {
                return Ok(());
            }
            self.in_hand.lock().await.let_go(receipts);
            let subscription = self.mode.subscription();
            let ids: Vec<&str> = receipts.iter().map(|r| r.0.as_str()).collect();
            if self.mode != Mode::ExactlyOnce {
                return self.api.acknowledge(subscription, &ids).await.map_err(|e| broker(format!("ack: {e}")));
            }
            // Exactly-once: one request per ack, so that each refusal (an
            // ack after its deadline, of a message given to another) is
            // known. The emulator answers one for a whole request.
            let acks = ids.iter().map(|id| self.api.acknowledge(subscription, std::slice::from_ref(id)));
            let refused: Vec<Refused> =
                futures_util::future::join_all(acks).await.into_iter().filter_map(Result::err).collect();
            match refused.first() {
                None => Ok(()),
                Some(first) => Err(broker(format!("{} of {} acks refused, first {first}", refused.len(), ids.len()))),
            }
        })
    }

    /// A nack: delivered again at once, or within a second on an ordered
    /// subscription ([`Mode::give_back_s`]).
    fn release<'a>(&'a mut self, receipts: &'a [Receipt]) -> BoxFuture<'a, Result<(), TransportError>> {
        Box::pin(async move {
            self.in_hand.lock().await.let_go(receipts);
            let ids: Vec<&str> = receipts.iter().map(|r| r.0.as_str()).collect();
            let (subscription, seconds) = (self.mode.subscription(), self.mode.give_back_s());
            self.api.modify_deadline(subscription, &ids, seconds).await.map_err(|e| broker(format!("nack: {e}")))
        })
    }
}

/// What the inspector learned from its calls: the longest settle it was
/// asked for, and whether the subscription was last seen quiet for one.
#[derive(Debug, Default)]
struct Seen {
    settle: Duration,
    quiet: bool,
}

/// The subscription, for declaring and for the final state.
#[derive(Debug)]
struct Subscription {
    api: Api,
    mode: Mode,
    seen: Mutex<Seen>,
}

impl Subscription {
    /// Pulls `subscription` until a pull comes back empty, holding what it
    /// pulled (for the longest deadline) so that no pull sees it twice, and
    /// keeps on for `linger` for deliveries whose deadlines run out.
    async fn sweep(&self, subscription: &str, linger: Duration) -> Result<Vec<Pulled>, TransportError> {
        let since = Instant::now();
        let mut all = Vec::new();
        loop {
            let pulled = self.api.pull(subscription, PULL_MAX).await?;
            let ids: Vec<&str> = pulled.iter().map(|p| p.ack_id.as_str()).collect();
            self.api.modify_deadline(subscription, &ids, DEADLINE_MAX_S).await.map_err(broker)?;
            let empty = pulled.is_empty();
            all.extend(pulled);
            if empty {
                if since.elapsed() >= linger {
                    return Ok(all);
                }
                tokio::time::sleep(RECOUNT_DELAY).await;
            }
        }
    }

    /// Gives back what a sweep held.
    async fn give_back(&self, subscription: &str, pulled: &[Pulled]) -> Result<(), TransportError> {
        for chunk in pulled.chunks(PULL_MAX) {
            let ids: Vec<&str> = chunk.iter().map(|p| p.ack_id.as_str()).collect();
            self.api.modify_deadline(subscription, &ids, self.mode.give_back_s()).await.map_err(broker)?;
        }
        Ok(())
    }
}

impl Inspector for Subscription {
    fn declare(&self) -> BoxFuture<'_, Result<(), TransportError>> {
        Box::pin(self.api.declare(self.mode))
    }

    /// Nothing came back to a pull for `settle` (at least the subscription's
    /// own deadline). What a pull takes while the consumers are attached is
    /// given back at once: a delivery more for it, nothing lost.
    fn drained(&self, settle: Duration) -> BoxFuture<'_, Result<bool, TransportError>> {
        Box::pin(async move {
            let settle = settle.max(SUBSCRIPTION_DEADLINE);
            {
                let mut seen = self.seen.lock().expect("not poisoned");
                seen.settle = seen.settle.max(settle);
                seen.quiet = false;
            }
            let subscription = self.mode.subscription();
            let since = Instant::now();
            loop {
                let pulled = self.api.pull(subscription, PULL_MAX).await?;
                if !pulled.is_empty() {
                    self.give_back(subscription, &pulled).await?;
                    return Ok(false);
                }
                if since.elapsed() >= settle {
                    self.seen.lock().expect("not poisoned").quiet = true;
                    return Ok(true);
                }
                tokio::time::sleep(RECOUNT_DELAY).await;
            }
        })
    }

    fn depth(&self) -> BoxFuture<'_, Result<Depth, TransportError>> {
        Box::pin(async move {
            // No declare: a subscription the emulator lost (it keeps nothing
            // through a restart) is an error here, not an empty one.
            // After a quiet spell nothing is out with a consumer; otherwise
            // a delivery held by one that died is seen once its deadline
            // has run out.
            let linger = {
                let seen = self.seen.lock().expect("not poisoned");
                if seen.quiet { Duration::ZERO } else { seen.settle.max(SUBSCRIPTION_DEADLINE) }
            };
            let subscription = self.mode.subscription();
            let held = self.sweep(subscription, linger).await?;
            let dead = self.sweep(DEAD_TOPIC, Duration::ZERO).await?;
            self.give_back(subscription, &held).await?;
            self.give_back(DEAD_TOPIC, &dead).await?;
            if self.mode == Mode::Ordered {
                // Only each key's head was handed out: a count, at least one
                // when anything is held.
                return Ok(Depth::Counted((held.len() + dead.len()) as u64));
            }
            let mut listed = Vec::with_capacity(held.len() + dead.len());
            for p in held.iter().chain(&dead) {
                match Envelope::from_body(&p.data) {
                    Ok(e) => listed.push(Held {
                        message_id: e.message_id,
                        event_id: e.event_id,
                        // The inspector's own pull counted too.
                        delivery_count: (p.attempt - 1).max(0),
                    }),
                    Err(e) => {
                        tracing::warn!(error = %e, "the subscription holds a message that is not a haunt envelope")
                    }
                }
            }
            Ok(Depth::Listed(listed))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordered_message_carries_its_key_and_the_envelope_whole() {
        let envelope = Envelope {
            message_id: "m1".into(),
            event_id: "e1".into(),
            payload: "{}".into(),
            headers: "{}".into(),
            enqueued_at_ms: 7,
            key: Some("item-2".into()),
        };
        let ordered = message(&envelope, true);
        assert_eq!(ordered["orderingKey"], "item-2");
        let data = BASE64.decode(ordered["data"].as_str().unwrap()).unwrap();
        assert_eq!(Envelope::from_body(&data).unwrap(), envelope);
        assert!(message(&envelope, false).get("orderingKey").is_none(), "no key where order is not asked for");
        let unkeyed = Envelope { key: None, ..envelope };
        assert!(message(&unkeyed, true).get("orderingKey").is_none());
    }

    #[test]
    fn every_name_haunt_uses_is_one_pubsub_takes_and_a_bad_one_is_named() {
        for mode in [Mode::Pull, Mode::ExactlyOnce, Mode::Ordered] {
            assert_eq!(check_name(mode.subscription()), Ok(()));
        }
        assert_eq!((check_name(TOPIC), check_name(DEAD_TOPIC)), (Ok(()), Ok(())));
        for (bad, why) in
            [("t1", "3 to 255"), ("1orders", "start with a letter"), ("google.x", "goog"), ("a b c", "' '")]
        {
            let e = check_name(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains(why), "{bad}: {e}");
        }
    }

    #[tokio::test]
    async fn an_emulator_that_does_not_answer_is_named_in_the_error() {
        let spec: TransportSpec = "pubsub".parse().unwrap();
        // A port nothing listens on: bound, then let go.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}");
        let e = crate::consumer(spec, &url, &Options::default()).await.unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("pubsub: creating topics/haunt.orders") && text.contains(&url), "{text}");
    }

    #[test]
    fn a_pull_is_read_with_its_attempt_and_a_deadline_is_whole_seconds() {
        let received = json!({
            "ackId": "projects/haunt/subscriptions/s:4",
            "message": { "data": BASE64.encode(b"hi"), "messageId": "9", "publishTime": "2026-12-05T00:00:00Z" },
            "deliveryAttempt": 3,
        });
        let p = Pulled::parse(&received).unwrap();
        assert_eq!(
            (p.ack_id.as_str(), p.message_id.as_str(), p.data.as_slice(), p.attempt),
            ("projects/haunt/subscriptions/s:4", "9", &b"hi"[..], 3)
        );
        let first = json!({ "ackId": "a", "message": { "messageId": "1" } });
        assert_eq!(Pulled::parse(&first).unwrap().attempt, 1, "no deliveryAttempt: the first");
        assert!(Pulled::parse(&json!({ "message": { "messageId": "1" } })).is_err(), "no ack id");
        assert_eq!(
            [1, 999, 1000, 1001, 900_000].map(|ms| deadline_s(Duration::from_millis(ms))),
            [1, 1, 1, 2, DEADLINE_MAX_S]
        );
    }
}
