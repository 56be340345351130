//! `/metrics` is OpenMetrics text with exemplars on the delivery metrics.

use std::time::Duration;

use haunt_testkit::TestDb;
use haunt_worker::WorkerConfig;

use crate::{TOKEN, order, spawn, store, wait_until};

/// A structural check of OpenMetrics text: metadata before samples, every
/// sample `name{labels} value` with an optional `# {labels} value` exemplar,
/// and `# EOF` last.
fn check_openmetrics(text: &str) -> Result<(), String> {
    let lines: Vec<&str> = text.lines().collect();
    if lines.last() != Some(&"# EOF") {
        return Err("does not end with # EOF".into());
    }
    let mut typed: Vec<String> = Vec::new();
    for (n, line) in lines[..lines.len() - 1].iter().enumerate() {
        let n = n + 1;
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split(' ');
            let name = parts.next().unwrap_or_default();
            let kind = parts.next().unwrap_or_default();
            if !["counter", "gauge", "histogram", "summary", "unknown", "info", "stateset", "gaugehistogram"]
                .contains(&kind)
            {
                return Err(format!("line {n}: bad type {kind}"));
            }
            typed.push(name.to_owned());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (sample, exemplar) = match line.split_once(" # ") {
            Some((s, e)) => (s, Some(e)),
            None => (*line, None),
        };
        let name_end = sample.find(['{', ' ']).ok_or(format!("line {n}: no value"))?;
        let name = &sample[..name_end];
        if !typed.iter().any(|t| name.starts_with(t.as_str())) {
            return Err(format!("line {n}: sample {name} before its TYPE"));
        }
        let value = sample.rsplit(' ').next().unwrap();
        value.parse::<f64>().map_err(|_| format!("line {n}: bad value {value}"))?;
        if let Some(ex) = exemplar
            && (!ex.starts_with('{') || !ex.contains("} "))
        {
            return Err(format!("line {n}: bad exemplar {ex}"));
        }
    }
    Ok(())
}

#[tokio::test]
async fn metrics_are_openmetrics_with_exemplars_on_delivery_attempt() {
    let db = TestDb::sqlite();
    let store = store(&db.url).await;
    store.place_order(&order(7, "a", 1)).await.unwrap();
    let w = spawn(store.clone(), WorkerConfig::default(), 0.0).await;
    assert!(
        wait_until(Duration::from_secs(10), async || store.queue_stats().await.unwrap().visible
            + store.queue_stats().await.unwrap().leased
            == 0)
        .await
    );

    let client = reqwest::Client::new();
    let r = client.get(format!("{}/metrics", w.base)).send().await.unwrap();
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/openmetrics-text; version=1.0.0"));
    let text = r.text().await.unwrap();
    check_openmetrics(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let exemplar = text
        .lines()
        .find(|l| l.starts_with("haunt_delivery_attempt_bucket") && l.contains(" # {"))
        .unwrap_or_else(|| panic!("no exemplar on haunt_delivery_attempt:\n{text}"));
    assert!(exemplar.contains("correlation_id=\"c7\""), "{exemplar}");
    assert!(text.contains("haunt_queue_messages{state=\"visible\"} 0"), "{text}");

    // The fault endpoint: token required, bad values rejected and nothing changed.
    let faults = format!("{}/admin/faults", w.base);
    assert_eq!(client.post(&faults).body(r#"{"ack_fail_rate":0.5}"#).send().await.unwrap().status(), 401);
    // Each rejection names the field that was wrong, not always the same one.
    for (body, field) in [
        (r#"{"ack_fail_rate":2}"#, "ack_fail_rate"),
        (r#"{"db_error_rate":1.5}"#, "db_error_rate"),
        (r#"{"ack_fail_rate":0.5,"stall_after_lease_ms":99999999}"#, "stall_after_lease_ms"),
    ] {
        let bad = client.post(&faults).bearer_auth(TOKEN).body(body).send().await.unwrap();
        assert_eq!(bad.status(), 422, "{body}");
        let answer: serde_json::Value = bad.json().await.unwrap();
        assert_eq!(answer["field"], field, "{body}: {answer}");
        assert_eq!(w.faults().await.ack_fail_rate, Some(0.0), "{body} changed nothing");
    }
    let unknown = client.post(&faults).bearer_auth(TOKEN).body(r#"{"ack_rate":0.5}"#).send().await.unwrap();
    assert_eq!(unknown.status(), 422);
    let answer: serde_json::Value = unknown.json().await.unwrap();
    assert_eq!(answer["field"], "ack_rate", "the unknown field is named: {answer}");
    let ok = client
        .post(&faults)
        .bearer_auth(TOKEN)
        .body(r#"{"ack_fail_rate":0.5,"clock_offset_ms":-3000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(w.faults().await.ack_fail_rate, Some(0.5));
    assert_eq!(w.faults().await.clock_offset_ms, Some(-3000));
    w.stop().await;
}

#[test]
fn the_openmetrics_check_rejects_what_it_should() {
    assert!(check_openmetrics("# TYPE a counter\na_total 1\n# EOF").is_ok());
    assert!(check_openmetrics("# TYPE a counter\na_total 1\n").is_err());
    assert!(check_openmetrics("a_total 1\n# EOF").is_err());
    assert!(check_openmetrics("# TYPE a counter\na_total x\n# EOF").is_err());
}
