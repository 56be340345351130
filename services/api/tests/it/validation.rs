//! Bad requests: each gets its documented 4xx naming the field, and nothing
//! anywhere changes.

use haunt_api::ApiConfig;
use haunt_testkit::databases;
use serde_json::Value;

use crate::{snapshot, start};

struct Case {
    name: &'static str,
    content_type: Option<&'static str>,
    correlation_id: Option<&'static str>,
    body: Vec<u8>,
    status: u16,
    field: Option<&'static str>,
}

fn case(name: &'static str, body: &str, status: u16, field: Option<&'static str>) -> Case {
    Case {
        name,
        content_type: Some("application/json"),
        correlation_id: None,
        body: body.as_bytes().to_vec(),
        status,
        field,
    }
}

fn cases() -> Vec<Case> {
    let long = "x".repeat(129);
    let mut v = vec![
        case("malformed json", "{\"item_id\": ", 400, None),
        case("not an object", "[1, 2]", 422, None),
        case("empty body", "", 400, None),
        case("missing item_id", r#"{"qty": 1}"#, 422, Some("item_id")),
        case("missing qty", r#"{"item_id": "a"}"#, 422, Some("qty")),
        case("qty zero", r#"{"item_id": "a", "qty": 0}"#, 422, Some("qty")),
        case("qty negative", r#"{"item_id": "a", "qty": -1}"#, 422, Some("qty")),
        case("qty too large", r#"{"item_id": "a", "qty": 1000001}"#, 422, Some("qty")),
        case("qty 1e12", r#"{"item_id": "a", "qty": 1e12}"#, 422, Some("qty")),
        case("qty fractional", r#"{"item_id": "a", "qty": 1.5}"#, 422, Some("qty")),
        case("qty as string", r#"{"item_id": "a", "qty": "1"}"#, 422, Some("qty")),
        case("qty null", r#"{"item_id": "a", "qty": null}"#, 422, Some("qty")),
        case("item_id number", r#"{"item_id": 7, "qty": 1}"#, 422, Some("item_id")),
        case("item_id empty", r#"{"item_id": "", "qty": 1}"#, 422, Some("item_id")),
        case("item_id with space", r#"{"item_id": "a b", "qty": 1}"#, 422, Some("item_id")),
        case("item_id sql", r#"{"item_id": "a'; DROP TABLE orders; --", "qty": 1}"#, 422, Some("item_id")),
        case("order_id sql", r#"{"order_id": "1 OR 1=1", "item_id": "a", "qty": 1}"#, 422, Some("order_id")),
        case("order_id unicode", r#"{"order_id": "zürich", "item_id": "a", "qty": 1}"#, 422, Some("order_id")),
        case("order_id not a string", r#"{"order_id": ["o"], "item_id": "a", "qty": 1}"#, 422, Some("order_id")),
        case("unknown field", r#"{"item_id": "a", "qty": 1, "quantity": 2}"#, 422, Some("quantity")),
    ];
    v.push(Case {
        body: format!(r#"{{"item_id": "{long}", "qty": 1}}"#).into_bytes(),
        ..case("item_id too long", "", 422, Some("item_id"))
    });
    v.push(Case {
        content_type: None,
        ..case("no content type", r#"{"item_id": "a", "qty": 1}"#, 415, Some("content-type"))
    });
    v.push(Case {
        content_type: Some("text/plain"),
        ..case("wrong content type", r#"{"item_id": "a", "qty": 1}"#, 415, Some("content-type"))
    });
    v.push(Case {
        correlation_id: Some("bad id!"),
        ..case("bad correlation id", r#"{"item_id": "a", "qty": 1}"#, 400, Some("X-Correlation-Id"))
    });
    let mut huge = br#"{"item_id": "a", "qty": 1, "pad": ""#.to_vec();
    huge.extend(std::iter::repeat_n(b'x', 70 * 1024));
    huge.extend(br#""}"#);
    v.push(Case { body: huge, ..case("huge body", "", 413, None) });
    v
}

#[tokio::test]
async fn every_bad_request_gets_its_4xx_and_changes_nothing() {
    for db in databases().await {
        let api = start(&db, ApiConfig::default()).await;
        // One good order first, so "nothing changed" compares a non-empty state.
        let ok = api
            .client
            .post(format!("{}/orders", api.base))
            .json(&serde_json::json!({"order_id": "keep", "item_id": "a", "qty": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 201);
        let before = snapshot(&api.store).await;
        let mut failures = Vec::new();
        for c in cases() {
            let mut req = api.client.post(format!("{}/orders", api.base)).body(c.body.clone());
            if let Some(ct) = c.content_type {
                req = req.header("content-type", ct);
            }
            if let Some(id) = c.correlation_id {
                req = req.header("x-correlation-id", id);
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            if status != c.status {
                failures.push(format!("{}: status {status}, expected {} ({body})", c.name, c.status));
            } else if body["field"].as_str() != c.field {
                failures.push(format!("{}: field {}, expected {:?}", c.name, body["field"], c.field));
            } else if !body["error"].is_string() {
                failures.push(format!("{}: no error message in {body}", c.name));
            }
        }
        assert!(failures.is_empty(), "{}:\n{}", db.kind, failures.join("\n"));
        assert_eq!(snapshot(&api.store).await, before, "{}: bad requests changed the state", db.kind);
    }
}
