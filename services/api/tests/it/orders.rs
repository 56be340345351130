//! Placing orders: created, replayed, conflicting, and the outcome header.

use haunt_api::ApiConfig;
use haunt_testkit::databases;
use serde_json::{Value, json};

use crate::{snapshot, start};

#[tokio::test]
async fn create_then_replay_then_conflict() {
    for db in databases().await {
        let api = start(&db, ApiConfig::default()).await;
        let url = format!("{}/orders", api.base);
        let body = json!({"order_id": "o-1", "item_id": "apple", "qty": 2});
        let created = api.client.post(&url).header("x-correlation-id", "corr-1").json(&body).send().await.unwrap();
        assert_eq!(created.status(), 201, "{}", db.kind);
        assert_eq!(created.headers()["x-correlation-id"], "corr-1", "the correlation id is echoed");
        let created: Value = created.json().await.unwrap();
        assert_eq!((created["order_id"].as_str(), created["correlation_id"].as_str()), (Some("o-1"), Some("corr-1")));

        let replay = api.client.post(&url).json(&body).send().await.unwrap();
        assert_eq!(replay.status(), 200, "{}", db.kind);
        let replay: Value = replay.json().await.unwrap();
        assert_eq!(replay["event_id"], created["event_id"], "{}: a replay answers with the original event", db.kind);

        let before = snapshot(&api.store).await;
        let conflict =
            api.client.post(&url).json(&json!({"order_id": "o-1", "item_id": "apple", "qty": 3})).send().await.unwrap();
        assert_eq!(conflict.status(), 409, "{}", db.kind);
        let conflict: Value = conflict.json().await.unwrap();
        assert_eq!(conflict["field"], "order_id");
        assert_eq!(snapshot(&api.store).await, before, "{}: a conflict writes nothing", db.kind);

        let got: Value = api.client.get(format!("{url}/o-1")).send().await.unwrap().json().await.unwrap();
        assert_eq!((got["qty"].as_i64(), got["event_id"].clone()), (Some(2), created["event_id"].clone()));
        assert_eq!(api.client.get(format!("{url}/nope")).send().await.unwrap().status(), 404);
    }
}

#[tokio::test]
async fn a_missing_order_id_and_correlation_id_are_generated() {
    let db = haunt_testkit::TestDb::sqlite();
    let api = start(&db, ApiConfig::default()).await;
    let r = api
        .client
        .post(format!("{}/orders", api.base))
        .json(&json!({"item_id": "apple", "qty": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let generated = r.headers()["x-correlation-id"].to_str().unwrap().to_owned();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["correlation_id"], generated.as_str());
    assert_eq!(body["order_id"].as_str().unwrap().len(), 36);
}

#[tokio::test]
async fn a_database_failure_before_commit_is_a_definite_503() {
    let db = haunt_testkit::TestDb::sqlite();
    let api = start(&db, ApiConfig::default()).await;
    // A closed pool fails every acquire: the transaction never begins.
    api.store.close().await;
    let r = api
        .client
        .post(format!("{}/orders", api.base))
        .json(&json!({"order_id": "o-1", "item_id": "apple", "qty": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["haunt-outcome"], "not-committed");
    assert_eq!(api.client.get(format!("{}/readyz", api.base)).send().await.unwrap().status(), 503);
    assert_eq!(api.client.get(format!("{}/healthz", api.base)).send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn metrics_are_openmetrics_and_count_orders() {
    let db = haunt_testkit::TestDb::sqlite();
    let api = start(&db, ApiConfig::default()).await;
    let url = format!("{}/orders", api.base);
    api.client.post(&url).json(&json!({"order_id": "a", "item_id": "apple", "qty": 1})).send().await.unwrap();
    api.client.post(&url).json(&json!({"order_id": "a", "item_id": "apple", "qty": 1})).send().await.unwrap();
    api.client.post(&url).json(&json!({"item_id": "apple", "qty": 0})).send().await.unwrap();
    let r = api.client.get(format!("{}/metrics", api.base)).send().await.unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    let text = r.text().await.unwrap();
    for line in [
        "haunt_orders_total{outcome=\"created\"} 1",
        "haunt_orders_total{outcome=\"replayed\"} 1",
        "haunt_orders_total{outcome=\"rejected\"} 1",
        "haunt_messages_enqueued_total 1",
        "haunt_http_request_duration_seconds_count{method=\"POST\",route=\"/orders\",status=\"201\"} 1",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    let projection: Value =
        api.client.get(format!("{}/projection", api.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(projection["items"], json!([]), "nothing applied yet: the API never touches the projection");
}
