//! Exactly-once effects from at-least-once delivery.

use std::collections::HashMap;
use std::time::Duration;

use haunt_format::FinalLine;
use haunt_testkit::{TestDb, databases};
use haunt_worker::faults::FaultSettings;
use haunt_worker::{RunConfig, WorkerConfig};

use crate::{TOKEN, counter, order, spawn, start, store, wait_until};

/// The tutorial's hands-on: the first two acks are lost, so the event comes
/// three times; the inbox lets it through once and counts two duplicates.
#[tokio::test]
async fn one_event_delivered_three_times_is_applied_once() {
    for db in databases().await {
        let store = store(&db.url).await;
        store.place_order(&order(1, "coffee-beans", 1)).await.unwrap();
        // A lease long against one apply, even on a loaded machine, so that no
        // redelivery comes from a slow ack rather than a lost one.
        let config = WorkerConfig {
            visibility_timeout: Duration::from_millis(1_000),
            concurrency: 1,
            ..WorkerConfig::default()
        };
        // Set at start, as `--ack-fail-next 2` does, so that no ack goes before it.
        let faults = FaultSettings { ack_fail_next: Some(2), ..FaultSettings::default() };
        let w = start(store.clone(), RunConfig { worker: config, faults, admin_token: Some(TOKEN.into()) }).await;
        let drained = wait_until(Duration::from_secs(20), async || {
            let s = store.queue_stats().await.unwrap();
            s.visible + s.leased + s.delayed == 0
        })
        .await;
        assert!(drained, "{}: the third delivery is acked", db.kind);
        let t = w.metrics().await;
        assert_eq!(counter(&t, "haunt_deliveries_total{outcome=\"applied\"}"), 1.0, "{}:\n{t}", db.kind);
        assert_eq!(counter(&t, "haunt_deliveries_total{outcome=\"duplicate\"}"), 2.0, "{}:\n{t}", db.kind);
        assert_eq!(counter(&t, "haunt_ack_failures_total"), 2.0, "{}", db.kind);
        assert_eq!(counter(&t, "haunt_redeliveries_total"), 2.0, "{}", db.kind);
        assert_eq!(counter(&t, "haunt_delivery_attempt_count"), 3.0, "{}", db.kind);
        assert_eq!(store.projection().await.unwrap(), vec![("coffee-beans".to_string(), 1)]);
        w.stop().await;
    }
}

/// Eight workers, 10,000 orders, half the acks lost and a lease short enough to
/// expire under load: every event applied exactly once, the projection equal to
/// the orders, the queue empty. One delivery per transaction.
#[tokio::test]
async fn eight_workers_on_postgres_apply_every_event_exactly_once() {
    if let Some(db) = TestDb::postgres().await {
        exactly_once(db, 8, 10_000, 1).await;
    }
}

/// The same with batches of up to 500 applied in one transaction each.
#[tokio::test]
async fn eight_workers_on_postgres_in_batches_of_500_apply_every_event_exactly_once() {
    if let Some(db) = TestDb::postgres().await {
        exactly_once(db, 8, 10_000, 500).await;
    }
}

/// Batches on SQLite, the embedded default: one writer at a time.
#[tokio::test]
async fn two_workers_on_sqlite_in_batches_of_500_apply_every_event_exactly_once() {
    exactly_once(TestDb::sqlite(), 2, 3_000, 500).await;
}

async fn exactly_once(db: TestDb, worker_count: usize, orders_n: usize, batch_size_max: u32) {
    // Few items: hot rows, so concurrent upserts contend on purpose.
    const ITEMS: usize = 7;
    let writer = store(&db.url).await;
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..16 {
        let s = writer.clone();
        tasks.spawn(async move {
            for i in (client..orders_n).step_by(16) {
                s.place_order(&order(i, &format!("item-{}", i % ITEMS), (i % 5 + 1) as i64)).await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }

    let mut workers = Vec::new();
    for n in 0..worker_count {
        let config = WorkerConfig {
            worker_id: format!("w{n}"),
            visibility_timeout: Duration::from_millis(250),
            batch_size_max,
            // Half the acks are lost, so a message can need many deliveries; the
            // limit must not turn lost acks into dead letters.
            delivery_attempts_max: 1_000,
            concurrency: 1,
            ..WorkerConfig::default()
        };
        workers.push(spawn(store(&db.url).await, config, 0.5).await);
    }
    let drained = wait_until(Duration::from_secs(240), async || {
        let s = writer.queue_stats().await.unwrap();
        s.visible + s.leased + s.delayed == 0
    })
    .await;
    let mut redeliveries = 0.0;
    let mut duplicates = 0.0;
    for w in workers {
        let t = w.metrics().await;
        redeliveries += counter(&t, "haunt_redeliveries_total");
        duplicates += counter(&t, "haunt_deliveries_total{outcome=\"duplicate\"}");
        w.stop().await;
    }
    assert!(drained, "the queue did not drain: {:?}", writer.queue_stats().await.unwrap());

    let mut applied: HashMap<String, usize> = HashMap::new();
    let mut orders: HashMap<String, i64> = HashMap::new();
    let mut order_sum: HashMap<String, i64> = HashMap::new();
    let mut pending = 0;
    let mut dead = 0;
    writer
        .final_state(&mut |line| {
            match line {
                FinalLine::Applied(a) => *applied.entry(a.event_id).or_default() += 1,
                FinalLine::Order(o) => {
                    *order_sum.entry(o.item_id).or_default() += o.qty;
                    orders.insert(o.event_id, o.qty);
                }
                FinalLine::Pending(_) => pending += 1,
                FinalLine::DeadLetter(_) => dead += 1,
                _ => {}
            }
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(orders.len(), orders_n);
    assert_eq!(applied.len(), orders_n, "every event applied");
    assert!(applied.values().all(|&n| n == 1), "some event applied twice");
    assert!(orders.keys().all(|e| applied.contains_key(e)));
    assert_eq!((pending, dead), (0, 0));
    let projection: HashMap<String, i64> = writer.projection().await.unwrap().into_iter().collect();
    assert_eq!(projection, order_sum, "the projection equals the orders");
    assert!(redeliveries >= (orders_n / 4) as f64, "lost acks must cause redeliveries, saw {redeliveries}");
    assert!(duplicates >= (orders_n / 4) as f64, "redeliveries must be caught as duplicates, saw {duplicates}");
}

#[tokio::test]
async fn shutdown_stops_leasing_and_returns() {
    let db = TestDb::sqlite();
    let store = store(&db.url).await;
    let w = spawn(store.clone(), WorkerConfig::default(), 0.0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    tokio::time::timeout(Duration::from_secs(5), w.stop()).await.expect("the worker stops within 5 s");
    store.place_order(&order(1, "a", 1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(store.queue_stats().await.unwrap().visible, 1, "a stopped worker leases nothing");
}

/// On PostgreSQL a batch's ack is in flight while its loop leases the next;
/// a worker stopped as soon as its last batch is applied has still acked
/// it when `stop` returns.
#[tokio::test]
async fn a_stopped_worker_has_sent_every_ack_it_owed() {
    for db in databases().await {
        let store = store(&db.url).await;
        for i in 0..200 {
            store.place_order(&order(i, "a", 1)).await.unwrap();
        }
        let config =
            WorkerConfig { batch_size_max: 50, poll_interval: Duration::from_millis(1), ..WorkerConfig::default() };
        let w = spawn(store.clone(), config, 0.0).await;
        let applied = wait_until(Duration::from_secs(20), async || {
            store.projection().await.unwrap() == vec![("a".to_owned(), 200)]
        })
        .await;
        assert!(applied, "{}: every order applied", db.kind);
        tokio::time::timeout(Duration::from_secs(5), w.stop()).await.expect("the worker stops within 5 s");
        assert!(
            store.queue_is_empty().await.unwrap(),
            "{}: every applied message acked by the time it stopped",
            db.kind
        );
    }
}
