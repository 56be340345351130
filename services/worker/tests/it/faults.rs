//! The fault switches as `haunt_worker::run` wires them: the store's injected
//! errors behind `db_error_rate`, the admin endpoint only with a token, and a
//! bad setting refused before anything runs.

use std::time::Duration;

use haunt_store::Backoff;
use haunt_testkit::TestDb;
use haunt_worker::faults::FaultSettings;
use haunt_worker::{RunConfig, RunError, WorkerConfig};

use crate::{counter, order, spawn, start, store, wait_until};

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
        haunt_worker::run(None, store(&db.url).await, config, std::future::pending()),
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
