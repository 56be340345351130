//! The fault switches as `haunt_worker::run` wires them: the store's injected
//! errors behind `db_error_rate`, the admin endpoint only with a token, and a
//! bad setting refused before anything runs.

use std::time::Duration;

use haunt_store::{AckMode, Backoff, Bug, Store, StoreOptions};
use haunt_testkit::TestDb;
use haunt_worker::faults::FaultSettings;
use haunt_worker::{RunConfig, RunError, WorkerConfig};

use crate::{TOKEN, counter, order, spawn, start, store, wait_until};

const FAILED: &str = "haunt_deliveries_total{outcome=\"failed\"}";
const APPLIED: &str = "haunt_deliveries_total{outcome=\"applied\"}";

/// The `db-error` fault as the nemesis injects it: `db_error_rate` set through
/// `/admin/faults` fails the worker's deliveries (the store's statements), and
/// clearing it lets them through. If `run` kept the switch to itself instead of
/// handing it the store's, the first delivery would apply and this would fail.
#[tokio::test]
async fn db_error_rate_set_through_admin_fails_deliveries_until_cleared() {
    let db = TestDb::sqlite();
    // Orders are placed through a store of their own, whose switch is its own:
    // the fault is the worker's, and must not refuse the orders.
    let writer = store(&db.url).await;
    let config = WorkerConfig {
        concurrency: 1,
        poll_interval: Duration::from_millis(10),
        // Retries come quickly and never run out, so that the failures pile up
        // within the test's time and the message is still there to apply after.
        backoff: Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(50) },
        delivery_attempts_max: 1_000,
        ..WorkerConfig::default()
    };
    let w = spawn(store(&db.url).await, config, 0.0).await;
    w.set_faults(&FaultSettings { db_error_rate: Some(1.0), ..FaultSettings::default() }).await;
    assert_eq!(w.faults().await.db_error_rate, Some(1.0));
    writer.place_order(&order(1, "a", 1)).await.unwrap();

    // Stops early on an apply too: a switch that is not wired fails at once.
    wait_until(Duration::from_secs(10), async || {
        let t = w.metrics().await;
        counter(&t, FAILED) >= 3.0 || counter(&t, APPLIED) > 0.0
    })
    .await;
    let t = w.metrics().await;
    assert!(
        counter(&t, FAILED) >= 3.0,
        "db_error_rate 1 set through /admin/faults did not fail the worker's deliveries: \
         run() must give the fault switches the store's injected errors\n{t}"
    );
    assert_eq!(counter(&t, APPLIED), 0.0, "nothing applies while every statement fails:\n{t}");
    assert_eq!(writer.projection().await.unwrap(), vec![], "the failed deliveries wrote nothing");

    w.set_faults(&FaultSettings { db_error_rate: Some(0.0), ..FaultSettings::default() }).await;
    let drained = wait_until(Duration::from_secs(10), async || {
        let s = writer.queue_stats().await.unwrap();
        s.visible + s.leased + s.delayed + s.dead_letter == 0
    })
    .await;
    let t = w.metrics().await;
    assert!(drained, "cleared, the next delivery applies and is acked: {:?}\n{t}", writer.queue_stats().await.unwrap());
    assert_eq!(counter(&t, APPLIED), 1.0, "{t}");
    assert_eq!(writer.projection().await.unwrap(), vec![("a".to_string(), 1)]);
    w.stop().await;
}

/// A fault setting out of range is refused by `run` before a lease is taken,
/// naming its field, and by `RunConfig::check`, which the binary asks first.
#[tokio::test]
async fn a_bad_fault_setting_is_refused_before_anything_runs() {
    let db = TestDb::sqlite();
    let writer = store(&db.url).await;
    writer.place_order(&order(1, "a", 1)).await.unwrap();
    let config = RunConfig {
        faults: FaultSettings { ack_fail_rate: Some(1.5), ..FaultSettings::default() },
        ..RunConfig::default()
    };
    assert_eq!(config.check().unwrap_err().field, "ack_fail_rate");
    let ran = tokio::time::timeout(
        Duration::from_secs(5),
        haunt_worker::run(None, store(&db.url).await, config, Box::pin(std::future::pending())),
    )
    .await
    .expect("run returns at once on a bad setting");
    match ran {
        Err(RunError::Faults(e)) => assert_eq!(e.field, "ack_fail_rate", "{e}"),
        other => panic!("expected a fault setting error, got {other:?}"),
    }
    assert_eq!(writer.queue_stats().await.unwrap().visible, 1, "nothing was leased");
}

/// Without an admin token the fault endpoint does not exist; metrics and
/// health answer regardless.
#[tokio::test]
async fn without_an_admin_token_there_is_no_fault_endpoint() {
    let db = TestDb::sqlite();
    let w = start(store(&db.url).await, RunConfig { admin_token: None, ..RunConfig::default() }).await;
    let client = reqwest::Client::new();
    let faults = client.get(format!("{}/admin/faults", w.base)).bearer_auth("anything").send().await.unwrap();
    assert_eq!(faults.status(), 404);
    assert_eq!(client.get(format!("{}/healthz", w.base)).send().await.unwrap().status(), 200);
    assert!(w.metrics().await.ends_with("# EOF\n"));
    w.stop().await;
}

/// Asks the worker to hold its next batch, as the kill and pause nemeses do
/// before they act; returns the status and the JSON answer.
async fn hold(base: String, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new().post(format!("{base}/admin/hold")).bearer_auth(TOKEN).json(&body).send().await;
    let r = r.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn holding_config(ack: AckMode) -> WorkerConfig {
    WorkerConfig {
        concurrency: 1,
        poll_interval: Duration::from_millis(10),
        visibility_timeout: Duration::from_secs(30),
        ack,
        ..WorkerConfig::default()
    }
}

/// With the ack sent after the apply, a batch holds still with its effect
/// committed and its message still leased: the moment a kill leaves the
/// queue to deliver it again. Released, it is acked as usual.
#[tokio::test]
async fn a_held_batch_has_applied_and_not_acked() {
    let db = TestDb::sqlite();
    let writer = store(&db.url).await;
    let w = spawn(store(&db.url).await, holding_config(AckMode::Separate), 0.0).await;
    let held = tokio::spawn(hold(w.base.clone(), serde_json::json!({"wait_ms": 10_000, "hold_ms": 2_000})));
    // The hold is armed before the order exists, so the first batch holds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.place_order(&order(1, "a", 2)).await.unwrap();
    let (status, answer) = held.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, serde_json::json!({"held": true, "point": "before-ack", "messages": 1}));
    // Holding: applied, and its message still leased.
    assert_eq!(writer.projection().await.unwrap(), vec![("a".to_string(), 2)]);
    let s = writer.queue_stats().await.unwrap();
    assert_eq!((s.visible, s.leased), (0, 1), "the held batch's message is leased, not acked: {s:?}");
    let acked = wait_until(Duration::from_secs(10), async || writer.queue_stats().await.unwrap().leased == 0).await;
    assert!(acked, "released after its hold, the batch is acked: {:?}", writer.queue_stats().await.unwrap());
    w.stop().await;
}

/// With the ack in the apply's transaction, the batch holds with its lease in
/// hand and nothing written.
#[tokio::test]
async fn with_the_ack_in_the_transaction_a_held_batch_has_written_nothing() {
    let db = TestDb::sqlite();
    let writer = store(&db.url).await;
    let w = spawn(store(&db.url).await, holding_config(AckMode::InApplyTxn), 0.0).await;
    // Armed for a point this worker never reaches, the hold lets the first
    // order through and answers that nothing held.
    let elsewhere = tokio::spawn(hold(
        w.base.clone(),
        serde_json::json!({"point": "before-ack", "wait_ms": 1_500, "hold_ms": 30_000}),
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.place_order(&order(1, "a", 2)).await.unwrap();
    // Drained first, so that the hold below meets the second order.
    assert!(wait_until(Duration::from_secs(10), async || writer.queue_stats().await.unwrap().visible == 0).await);
    assert_eq!(elsewhere.await.unwrap(), (200, serde_json::json!({"held": false})), "no batch reaches before-ack");
    let held = tokio::spawn(hold(w.base.clone(), serde_json::json!({"wait_ms": 10_000, "hold_ms": 2_000})));
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.place_order(&order(2, "b", 5)).await.unwrap();
    let (_, answer) = held.await.unwrap();
    assert_eq!(answer, serde_json::json!({"held": true, "point": "after-lease", "messages": 1}));
    assert_eq!(writer.projection().await.unwrap(), vec![("a".to_string(), 2)], "nothing of b applied yet");
    assert_eq!(writer.queue_stats().await.unwrap().leased, 1);
    let done = wait_until(Duration::from_secs(10), async || writer.queue_stats().await.unwrap().leased == 0).await;
    assert!(done);
    assert_eq!(writer.projection().await.unwrap(), vec![("a".to_string(), 2), ("b".to_string(), 5)]);
    w.stop().await;
}

/// Bug mode `ack-before-process` acks on receipt: its batch holds acked and
/// not applied, the moment a kill loses it.
#[tokio::test]
async fn acking_before_processing_a_held_batch_is_acked_and_not_applied() {
    let db = TestDb::sqlite();
    let writer = store(&db.url).await;
    let bug = Some(Bug::AckBeforeProcess);
    let buggy =
        Store::connect(&db.url.parse().unwrap(), StoreOptions { bug, ..StoreOptions::default() }).await.unwrap();
    let w = spawn(buggy, WorkerConfig { bug, ..holding_config(AckMode::Separate) }, 0.0).await;
    let held = tokio::spawn(hold(w.base.clone(), serde_json::json!({"wait_ms": 10_000, "hold_ms": 2_000})));
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.place_order(&order(1, "a", 2)).await.unwrap();
    let (_, answer) = held.await.unwrap();
    assert_eq!(answer, serde_json::json!({"held": true, "point": "acked-not-applied", "messages": 1}));
    let s = writer.queue_stats().await.unwrap();
    assert_eq!((s.visible, s.leased), (0, 0), "acked: gone from the queue: {s:?}");
    assert_eq!(writer.projection().await.unwrap(), vec![], "and not applied yet");
    let applied =
        wait_until(Duration::from_secs(10), async || writer.projection().await.unwrap() == [("a".to_string(), 2)])
            .await;
    assert!(applied, "released, it applies");
    w.stop().await;
}

/// A hold no batch meets in time answers `held: false` and disarms: the next
/// batch goes straight through (with a hold of 30 s armed, it would not
/// drain within the 10 s allowed). Bad requests are refused, naming the field.
#[tokio::test]
async fn a_hold_no_batch_meets_is_disarmed_and_bad_requests_name_their_field() {
    let db = TestDb::sqlite();
    let writer = store(&db.url).await;
    let w = spawn(store(&db.url).await, holding_config(AckMode::Separate), 0.0).await;
    let (status, answer) = hold(w.base.clone(), serde_json::json!({"wait_ms": 100, "hold_ms": 30_000})).await;
    assert_eq!((status, answer), (200, serde_json::json!({"held": false})));
    writer.place_order(&order(1, "a", 1)).await.unwrap();
    let drained = wait_until(Duration::from_secs(10), async || {
        let s = writer.queue_stats().await.unwrap();
        s.visible + s.leased == 0
    })
    .await;
    assert!(drained, "a disarmed hold must not stop the next batch: {:?}", writer.queue_stats().await.unwrap());

    for (body, field) in [
        (serde_json::json!({"wait_ms": 0, "hold_ms": 10}), serde_json::json!("wait_ms")),
        (serde_json::json!({"wait_ms": 10, "hold_ms": 30_001}), serde_json::json!("hold_ms")),
        (serde_json::json!({"wait_ms": 10}), serde_json::json!("hold_ms")),
        (serde_json::json!({"wait_ms": 10, "hold_ms": 10, "kill": true}), serde_json::json!("kill")),
        (serde_json::json!({"wait_ms": "soon", "hold_ms": 10}), serde_json::Value::Null),
        (serde_json::json!({"point": "after-supper", "wait_ms": 10, "hold_ms": 10}), serde_json::json!("point")),
    ] {
        let (status, answer) = hold(w.base.clone(), body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert_eq!(answer["field"], field, "{body}: {answer}");
        assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()), "{answer}");
    }
    let r = reqwest::Client::new()
        .post(format!("{}/admin/hold", w.base))
        .json(&serde_json::json!({"wait_ms": 10, "hold_ms": 10}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "no token, no hold");
    let points = reqwest::Client::new().get(format!("{}/admin/points", w.base)).bearer_auth(TOKEN).send().await;
    let points: serde_json::Value = points.unwrap().json().await.unwrap();
    assert_eq!(points, serde_json::json!({"points": ["before-ack", "after-lease", "acked-not-applied"]}));
    w.stop().await;
}
