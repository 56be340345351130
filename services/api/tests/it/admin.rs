//! Admin endpoints exist only with a token, and only answer to it.

use haunt_api::ApiConfig;
use haunt_testkit::TestDb;
use serde_json::json;

use crate::start;

#[tokio::test]
async fn admin_endpoints_are_absent_without_a_token() {
    let db = TestDb::sqlite();
    let api = start(&db, ApiConfig::default()).await;
    let r = api.client.get(format!("{}/admin/final-state", api.base)).bearer_auth("x").send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn admin_endpoints_require_the_token() {
    let db = TestDb::sqlite();
    let api = start(&db, ApiConfig { admin_token: Some("s3cret".into()) }).await;
    let url = format!("{}/admin/final-state", api.base);
    assert_eq!(api.client.get(&url).send().await.unwrap().status(), 401);
    assert_eq!(api.client.get(&url).bearer_auth("s3cres").send().await.unwrap().status(), 401);
    api.client
        .post(format!("{}/orders", api.base))
        .json(&json!({"order_id": "o", "item_id": "a", "qty": 1}))
        .send()
        .await
        .unwrap();
    let r = api.client.get(&url).bearer_auth("s3cret").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    let kinds: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, vec!["order", "pending"]);
    let r = api
        .client
        .post(format!("{}/admin/reconcile?dry_run=true", api.base))
        .bearer_auth("s3cret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// The API's fault switch refuses a bad body with a 422 naming the field, and
/// changes nothing.
#[tokio::test]
async fn a_bad_fault_setting_is_refused_naming_its_field() {
    let db = TestDb::sqlite();
    let api = start(&db, ApiConfig { admin_token: Some("s3cret".into()) }).await;
    let url = format!("{}/admin/faults", api.base);
    for (body, field) in [
        (r#"{"db_error_rate":1.5}"#, json!("db_error_rate")),
        (r#"{"db_eror_rate":0.5}"#, json!("db_eror_rate")),
        (r#"{"db_error_rate":"half"}"#, serde_json::Value::Null),
    ] {
        let r = api.client.post(&url).bearer_auth("s3cret").body(body).send().await.unwrap();
        assert_eq!(r.status(), 422, "{body}");
        let answer: serde_json::Value = r.json().await.unwrap();
        assert_eq!(answer["field"], field, "{body}: {answer}");
        let now: serde_json::Value =
            api.client.get(&url).bearer_auth("s3cret").send().await.unwrap().json().await.unwrap();
        assert_eq!(now["db_error_rate"], 0.0, "{body} changed nothing");
    }
}
