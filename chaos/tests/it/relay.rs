//! The relay against a real Redis: a relay that dies between the broker's
//! confirmation and the delete leaves its outbox rows leased; once the lease
//! expires the next relay publishes them again, and the inbox absorbs the
//! copies. Deleting before publishing (`relay-marks-before-publish`) instead
//! loses every row whose publish then fails. And the relay and a worker say
//! they are ready only once they are connected to the broker.

use std::time::{Duration, Instant};

use haunt_chaos::backends::local::LocalBackend;
use haunt_chaos::core::roles::Backend;
use haunt_chaos::systems::brokers::{Broker, free_ports};
use haunt_relay::RelayConfig;
use haunt_store::{Applied, Bug, LeaseClock, Leased, NewOrder, Store, StoreOptions};
use haunt_transport::{Consumer, Delivery, Envelope, Options, TransportSpec};

struct Redis {
    backend: LocalBackend,
    node: haunt_chaos::core::roles::Node,
    ready: haunt_chaos::systems::brokers::Ready,
    url: String,
}

impl Redis {
    async fn start(&self) {
        self.backend.start(&self.node).await.unwrap();
        self.ready.wait(Broker::Redis.start_limit(), || self.backend.is_running(&self.node)).await.unwrap();
    }
}

/// A Redis server laid out in `dir`, started.
async fn redis(dir: &std::path::Path) -> Option<Redis> {
    let redis = redis_laid_out(dir)?;
    redis.start().await;
    Some(redis)
}

/// A Redis server laid out in `dir`, not started yet.
fn redis_laid_out(dir: &std::path::Path) -> Option<Redis> {
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: the relay against Redis (HAUNT_SKIP_BROKERS=1)");
        return None;
    }
    let (port, http_port) = free_ports().unwrap();
    let laid = Broker::Redis.layout(port, http_port, &dir.join("redis"), None, &[]).unwrap_or_else(|e| panic!("{e:#}"));
    let node = laid.spec.node.clone();
    let backend = LocalBackend::new(laid.spec.program.clone().unwrap(), dir.to_owned(), Vec::new(), vec![laid.spec]);
    let url = haunt_transport::local_url("redis-streams".parse().unwrap(), laid.addr);
    Some(Redis { backend, node, ready: laid.ready, url })
}

async fn store(dir: &std::path::Path, bug: Option<Bug>) -> Store {
    let url = format!("sqlite://{}", dir.join("haunt.db").display());
    Store::connect(&url.parse().unwrap(), StoreOptions { bug, ..StoreOptions::default() }).await.unwrap()
}

async fn place(store: &Store, n: usize) {
    for i in 0..n {
        let order = NewOrder {
            order_id: format!("o{i}"),
            item_id: "sku".into(),
            qty: 1,
            correlation_id: format!("c{i}"),
            traceparent: None,
        };
        store.place_order(&order).await.unwrap();
    }
}

fn envelope(l: &Leased) -> Envelope {
    Envelope {
        message_id: l.message_id.clone(),
        event_id: l.event_id.clone(),
        payload: l.payload.clone(),
        headers: serde_json::to_string(&l.headers).unwrap(),
        enqueued_at_ms: l.enqueued_at_ms,
        key: l.event().ok().map(|e| e.item_id),
    }
}

/// Receives until `n` deliveries arrived (copies count) or 10 s passed.
async fn receive(consumer: &mut dyn Consumer, n: usize) -> Vec<Delivery> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    while got.len() < n && Instant::now() < deadline {
        got.extend(consumer.receive(n, Duration::from_millis(200)).await.unwrap());
    }
    got
}

fn as_leased(d: &Delivery) -> Leased {
    let e = &d.envelope;
    Leased {
        message_id: e.message_id.clone(),
        event_id: e.event_id.clone(),
        payload: e.payload.clone(),
        headers: serde_json::from_str(&e.headers).unwrap(),
        delivery_count: d.delivery_count,
        lease_token: String::new(),
        lease_until_ms: 0,
        enqueued_at_ms: e.enqueued_at_ms,
        ctid: None,
    }
}

/// A relay without an HTTP side, running until `stopped` fires.
fn spawn_relay(
    store: &Store,
    config: RelayConfig,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    tokio::spawn(haunt_relay::run(
        None,
        store.clone(),
        config,
        Box::pin(async move {
            let _ = stopped.await;
        }),
    ))
}

/// Runs a relay until the outbox is empty (or 10 s), then stops it.
async fn relay_until_drained(store: &Store, url: &str, bug: Option<Bug>) {
    let spec: TransportSpec = "redis-streams".parse().unwrap();
    let config =
        RelayConfig { bug, visibility_timeout: Duration::from_millis(300), ..RelayConfig::new(spec, url.into()) };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = spawn_relay(store, config, stopped);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = store.queue_stats().await.unwrap();
        if s.visible + s.leased + s.delayed == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    relay.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_that_dies_after_publishing_publishes_again_and_the_inbox_absorbs_the_copies() {
    let dir = tempfile::tempdir().unwrap();
    let Some(redis) = redis(dir.path()).await else { return };
    let store = store(dir.path(), None).await;
    place(&store, 20).await;
    let spec: TransportSpec = "redis-streams".parse().unwrap();
    let options = Options { client_id: "w".into(), ..Options::default() };
    let mut consumer = haunt_transport::consumer(spec, &redis.url, &options).await.unwrap();

    // The relay that dies: it leased, published, was confirmed, and never
    // deleted. Its lease is short, so the rows come back soon.
    let leased = store.lease(500, Duration::from_millis(300), LeaseClock::Database).await.unwrap();
    assert_eq!(leased.len(), 20);
    let envelopes: Vec<Envelope> = leased.iter().map(envelope).collect();
    haunt_transport::publisher(spec, &redis.url, &options).await.unwrap().publish(&envelopes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The next relay publishes the same rows again and deletes them.
    relay_until_drained(&store, &redis.url, None).await;
    assert_eq!(store.queue_stats().await.unwrap().visible, 0, "the outbox is empty");

    let got = receive(consumer.as_mut(), 40).await;
    assert_eq!(got.len(), 40, "each row published twice");
    let mut outcomes = Vec::new();
    for d in &got {
        let l = as_leased(d);
        let event = l.event().unwrap();
        outcomes.extend(store.apply_deliveries(&[(&l, event)], "w").await.unwrap());
    }
    let applied = outcomes.iter().filter(|o| matches!(o, Applied::Applied { .. })).count();
    let duplicates = outcomes.iter().filter(|o| **o == Applied::Duplicate).count();
    assert_eq!((applied, duplicates), (20, 20), "every copy after the first is absorbed");
    assert_eq!(store.projection().await.unwrap(), vec![("sku".to_owned(), 20)]);
    redis.backend.stop(&redis.node).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relay_that_deletes_before_publishing_loses_what_the_broker_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let Some(redis) = redis(dir.path()).await else { return };
    let store = store(dir.path(), Some(Bug::RelayMarksBeforePublish)).await;
    // The broker is down while the relay works: every publish fails.
    redis.backend.kill(&redis.node).await.unwrap();
    place(&store, 5).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let spec: TransportSpec = "redis-streams".parse().unwrap();
    let config = RelayConfig { bug: Some(Bug::RelayMarksBeforePublish), ..RelayConfig::new(spec, redis.url.clone()) };
    // It cannot connect while Redis is down; start Redis once it tries, then
    // cut it again mid-way, so some batch is leased, deleted and refused.
    let relay = spawn_relay(&store, config, stopped);
    redis.start().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.queue_stats().await.unwrap().visible > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.backend.kill(&redis.node).await.unwrap();
    place(&store, 5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(());
    relay.await.unwrap().unwrap();
    // The last five were deleted and never published: neither in the outbox
    // nor (once Redis is back) in the stream.
    let s = store.queue_stats().await.unwrap();
    assert_eq!(s.visible + s.leased + s.delayed, 0, "the rows were deleted before the publish: {s:?}");
    redis.start().await;
    let inspector = haunt_transport::inspector(spec, &redis.url).await;
    let held = match inspector {
        Ok(i) => i.depth().await.unwrap(),
        Err(e) => panic!("{e}"),
    };
    match held {
        haunt_transport::Depth::Listed(h) => assert_eq!(h.len(), 5, "only the first five reached the broker: {h:?}"),
        other => panic!("Redis lists: {other:?}"),
    }
    redis.backend.stop(&redis.node).await.unwrap();
}

/// `GET /readyz` of a service on `addr`: its status and body.
async fn readyz(addr: std::net::SocketAddr) -> (u16, serde_json::Value) {
    let r = reqwest::get(format!("http://{addr}/readyz")).await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// A run starts its workload once every service is ready, so a relay or a
/// worker must not say it is before its broker clients are connected: the
/// first seconds of a run otherwise had nothing in flight while the relay
/// backed off from a booting broker. Its wait after failed connections is
/// capped at a second ([`haunt_store::ErrorWait`]), so it is ready soon
/// after the broker, even after a long outage (the 5 s cap it had once
/// left a relay idle for up to 5 s after the broker came back).
#[tokio::test(flavor = "multi_thread")]
async fn a_relay_and_a_worker_are_ready_only_once_connected_to_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let Some(redis) = redis_laid_out(dir.path()) else { return };
    let store = store(dir.path(), None).await;
    let spec: TransportSpec = "redis-streams".parse().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = |mut s: tokio::sync::watch::Receiver<bool>| async move {
        let _ = s.wait_for(|stop| *stop).await;
    };

    let relay_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = relay_listener.local_addr().unwrap();
    let relay = tokio::spawn(haunt_relay::run(
        Some(relay_listener),
        store.clone(),
        RelayConfig::new(spec, redis.url.clone()),
        Box::pin(until(stopped.clone())),
    ));
    let worker_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker_addr = worker_listener.local_addr().unwrap();
    let config = haunt_worker::RunConfig {
        worker: haunt_worker::WorkerConfig {
            broker: Some(haunt_worker::BrokerSource { spec, url: redis.url.clone() }),
            ..haunt_worker::WorkerConfig::default()
        },
        faults: Default::default(),
        admin_token: None,
    };
    let worker =
        tokio::spawn(haunt_worker::run(Some(worker_listener), store.clone(), config, Box::pin(until(stopped))));

    // Six seconds without a broker: long enough for the backoff to reach its cap.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let (status, body) = readyz(relay_addr).await;
    assert_eq!((status, &body["broker_clients"]), (503, &serde_json::json!(0)), "relay: {body}");
    let (status, body) = readyz(worker_addr).await;
    assert_eq!(status, 503, "worker: {body}");
    assert_eq!(body["broker_clients_wanted"], 2, "one per consume loop: {body}");

    redis.start().await;
    let up = Instant::now();
    let mut ready = [None, None];
    while ready.contains(&None) && up.elapsed() < Duration::from_secs(10) {
        for (i, addr) in [relay_addr, worker_addr].into_iter().enumerate() {
            if ready[i].is_none() && readyz(addr).await.0 == 200 {
                ready[i] = Some(up.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(true);
    relay.await.unwrap().unwrap();
    worker.await.unwrap().unwrap();
    // A wait capped at one second, and connecting on loopback: well within
    // 2.5 s. With the old 5 s cap this failed.
    for (who, at) in ["relay", "worker"].into_iter().zip(ready) {
        let at = at.unwrap_or_else(|| panic!("the {who} never said it was ready"));
        assert!(at < Duration::from_millis(2500), "the {who} was ready {at:?} after the broker");
    }
}
