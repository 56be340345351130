//! Each broker transport keeps its promise at the client level, against the
//! real server started as a local node: what is confirmed survives a kill
//! and restart of the broker, what is received and not acked comes back to
//! another consumer (with its delivery count where the broker counts), what
//! is acked does not, and the inspector sees what is left. An at-most-once
//! mode settles on receipt, so a consumer that dies holding a message loses it.
//!
//! These need the servers `scripts/brokers` installs. Without one, its test
//! fails with directions, unless `HAUNT_SKIP_BROKERS=1` says to skip it, and
//! then the skip is printed.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use haunt_chaos::brokers::{Broker, BrokerNode, free_ports};
use haunt_chaos::local::LocalBackend;
use haunt_chaos::roles::Backend;
use haunt_transport::{Consumer, Delivery, Depth, Envelope, Options, TransportSpec};

struct Server {
    laid: BrokerNode,
    backend: LocalBackend,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(broker: Broker) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let (port, http_port) = free_ports().unwrap();
        let laid = broker.layout(port, http_port, &dir.path().join("data")).unwrap_or_else(|e| panic!("{e:#}"));
        let backend = LocalBackend::new(
            laid.spec.program.clone().unwrap(),
            dir.path().to_owned(),
            Vec::new(),
            vec![laid.spec.clone()],
        );
        let server = Server { laid, backend, _dir: dir };
        server.backend.start(&server.laid.spec.node).await.unwrap();
        server.ready().await;
        server
    }

    async fn ready(&self) {
        let node = &self.laid.spec.node;
        if let Err(e) = self.laid.ready.wait(self.laid.broker.start_limit(), || self.backend.is_running(node)).await {
            let log = std::fs::read_to_string(self.backend.log_path(node)).unwrap_or_default();
            panic!("{} did not answer: {e}\n{log}", self.laid.broker.name());
        }
    }

    async fn restart(&self) {
        let node = &self.laid.spec.node;
        self.backend.kill(node).await.unwrap();
        self.backend.start(node).await.unwrap();
        self.ready().await;
    }

    fn url(&self, spec: TransportSpec) -> String {
        haunt_transport::local_url(spec, self.laid.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = futures_util::FutureExt::now_or_never(self.backend.stop(&self.laid.spec.node));
    }
}

fn envelopes(from: usize, n: usize) -> Vec<Envelope> {
    (from..from + n)
        .map(|i| Envelope {
            message_id: format!("m{i:03}"),
            event_id: format!("e{i:03}"),
            payload: format!("{{\"event_id\":\"e{i:03}\",\"order_id\":\"o{i:03}\",\"item_id\":\"sku\",\"qty\":1}}"),
            headers: "{\"correlation_id\":\"c\"}".into(),
            enqueued_at_ms: i as i64,
        })
        .collect()
}

/// Receives until `want` distinct messages arrived or `limit` passed.
async fn receive_all(consumer: &mut dyn Consumer, want: usize, limit: Duration) -> Vec<Delivery> {
    let deadline = Instant::now() + limit;
    let mut got: Vec<Delivery> = Vec::new();
    while got.iter().map(|d| &d.envelope.message_id).collect::<BTreeSet<_>>().len() < want {
        assert!(Instant::now() < deadline, "received {} of {want} messages within {limit:?}", got.len());
        got.extend(consumer.receive(want, Duration::from_millis(300)).await.unwrap());
    }
    got
}

fn ids(deliveries: &[Delivery]) -> BTreeSet<String> {
    deliveries.iter().map(|d| d.envelope.message_id.clone()).collect()
}

fn held_ids(depth: &Depth) -> Option<BTreeSet<String>> {
    match depth {
        Depth::Listed(held) => Some(held.iter().map(|h| h.message_id.clone()).collect()),
        Depth::Counted(_) => None,
    }
}

fn skipped(what: &str) -> bool {
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: the {what} transport (HAUNT_SKIP_BROKERS=1)");
        return true;
    }
    false
}

/// The at-least-once contract of `spec`.
async fn at_least_once(broker: Broker, spelled: &str) {
    if skipped(spelled) {
        return;
    }
    let spec: TransportSpec = spelled.parse().unwrap();
    let server = Server::start(broker).await;
    let url = server.url(spec);
    let options =
        |id: &str| Options { client_id: id.into(), visibility_timeout: Duration::from_millis(1500), confirms: true };
    let inspector = haunt_transport::inspector(spec, &url).await.unwrap();
    inspector.declare().await.unwrap();
    let mut publisher = haunt_transport::publisher(spec, &url, &options("relay")).await.unwrap();

    // Confirmed before a kill of the broker: still there after its restart.
    publisher.publish(&envelopes(0, 10)).await.unwrap();
    drop(publisher);
    server.restart().await;
    let depth = inspector_after_restart(spec, &url).await.depth().await.unwrap();
    assert!(!depth.is_empty(), "{spelled}: confirmed messages gone after a broker restart: {depth:?}");

    let mut a = haunt_transport::consumer(spec, &url, &options("a")).await.unwrap();
    assert!(!a.acks_on_receipt());
    let first = receive_all(a.as_mut(), 10, Duration::from_secs(20)).await;
    assert_eq!(ids(&first), ids_of(&envelopes(0, 10)), "{spelled}: every confirmed message delivered");
    assert!(first.iter().all(|d| d.delivery_count == 1), "{spelled}: first deliveries count 1");
    let (acked, kept): (Vec<&Delivery>, Vec<&Delivery>) =
        first.iter().partition(|d| d.envelope.message_id.as_str() < "m005");
    let receipts: Vec<_> = acked.iter().map(|d| d.receipt.clone()).collect();
    a.ack(&receipts).await.unwrap();

    let inspector = inspector_after_restart(spec, &url).await;
    let depth = inspector.depth().await.unwrap();
    match held_ids(&depth) {
        Some(held) => assert_eq!(held, ids_of_refs(&kept), "{spelled}: the broker lists what is unacked"),
        None => assert_eq!(depth, Depth::Counted(kept.len() as u64), "{spelled}: the broker counts what is unacked"),
    }

    // A consumer that dies holding messages: they come back to another one.
    drop(a);
    let mut b = haunt_transport::consumer(spec, &url, &options("b")).await.unwrap();
    let again = receive_all(b.as_mut(), kept.len(), Duration::from_secs(20)).await;
    assert_eq!(ids(&again), ids_of_refs(&kept), "{spelled}: exactly the unacked messages come back");
    assert!(again.iter().all(|d| d.delivery_count >= 2), "{spelled}: a redelivery counts at least 2: {again:?}");
    let receipts: Vec<_> = again.iter().map(|d| d.receipt.clone()).collect();
    b.ack(&receipts).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let depth = inspector.depth().await.unwrap();
        if depth.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{spelled}: still held after every ack: {depth:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing acked comes back.
    let late = b.receive(10, Duration::from_millis(2500)).await.unwrap();
    assert!(late.is_empty(), "{spelled}: acked messages delivered again: {late:?}");
}

/// The at-most-once contract: received is settled, even if never applied.
async fn at_most_once(broker: Broker, spelled: &str) {
    if skipped(spelled) {
        return;
    }
    let spec: TransportSpec = spelled.parse().unwrap();
    let server = Server::start(broker).await;
    let url = server.url(spec);
    let options =
        |id: &str| Options { client_id: id.into(), visibility_timeout: Duration::from_millis(1500), confirms: true };
    let inspector = haunt_transport::inspector(spec, &url).await.unwrap();
    inspector.declare().await.unwrap();
    let mut a = haunt_transport::consumer(spec, &url, &options("a")).await.unwrap();
    assert!(a.acks_on_receipt(), "{spelled} settles on receipt");
    let mut publisher = haunt_transport::publisher(spec, &url, &options("relay")).await.unwrap();
    publisher.publish(&envelopes(0, 5)).await.unwrap();
    let got = receive_all(a.as_mut(), 5, Duration::from_secs(20)).await;
    assert_eq!(ids(&got), ids_of(&envelopes(0, 5)));
    drop(a);
    let mut b = haunt_transport::consumer(spec, &url, &options("b")).await.unwrap();
    let late = b.receive(10, Duration::from_millis(2500)).await.unwrap();
    assert!(late.is_empty(), "{spelled}: a message received and never acked came back: {late:?}");
    assert!(inspector.depth().await.unwrap().is_empty());
}

/// A fresh inspector: the one opened before a restart may hold a dead connection.
async fn inspector_after_restart(spec: TransportSpec, url: &str) -> Box<dyn haunt_transport::Inspector> {
    haunt_transport::inspector(spec, url).await.unwrap()
}

fn ids_of(envelopes: &[Envelope]) -> BTreeSet<String> {
    envelopes.iter().map(|e| e.message_id.clone()).collect()
}

fn ids_of_refs(deliveries: &[&Delivery]) -> BTreeSet<String> {
    deliveries.iter().map(|d| d.envelope.message_id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_streams() {
    at_least_once(Broker::Redis, "redis-streams").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_pubsub() {
    at_most_once(Broker::Redis, "redis-pubsub").await;
}
