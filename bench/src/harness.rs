//! `haunt bench harness`: the harness's own ceiling.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::HarnessOptions;

/// A stub of `POST /orders` that commits nothing and answers 201 at once.
async fn stub_api() -> anyhow::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let next = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/orders",
        axum::routing::post(move || {
            let n = next.fetch_add(1, Ordering::Relaxed);
            async move { (axum::http::StatusCode::CREATED, axum::Json(json!({"event_id": format!("e{n}")}))) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// The harness's clients and history recorder against a stub API that answers
/// at once, against the same HTTP requests sent without recording.
pub fn harness(options: HarnessOptions) -> futures_util::future::BoxFuture<'static, anyhow::Result<serde_json::Value>> {
    // Boxed in this crate, as `haunt_chaos::assemble::run_interruptible` says why.
    Box::pin(harness_run(options))
}

async fn harness_run(options: HarnessOptions) -> anyhow::Result<serde_json::Value> {
    let addr = stub_api().await?;
    let duration = options.duration.max(Duration::from_secs(1));

    // Baseline: the same requests, no history.
    let http = reqwest::Client::new();
    let sent = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + duration;
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..options.concurrency {
        let (http, sent) = (http.clone(), sent.clone());
        let url = format!("http://{addr}/orders");
        tasks.spawn(async move {
            let mut n = 0u64;
            while tokio::time::Instant::now() < deadline {
                n += 1;
                let body = json!({"order_id": format!("b-{t}-{n}"), "item_id": "item-1", "qty": 1});
                if http.post(&url).json(&body).send().await.is_ok_and(|r| r.status().is_success()) {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let baseline = sent.load(Ordering::Relaxed) as f64 / duration.as_secs_f64();

    // The harness: paced clients (pacing far above what can be reached), Jepsen
    // outcomes, every op recorded in a history file.
    let tmp = tempfile::tempdir()?;
    let recorder = Arc::new(haunt_chaos::core::history::Recorder::create(&tmp.path().join("history.jsonl"))?);
    let client =
        Arc::new(haunt_chaos::core::workload::HttpClient::new(&format!("http://{addr}"), Duration::from_secs(2))?);
    let workload = haunt_chaos::core::workload::WorkloadOptions {
        concurrency: options.concurrency,
        rate: 1e9,
        items: 5,
        ordered_keys: 0,
        retries_max: 3,
        seed: 1,
        deadline: tokio::time::Instant::now() + duration,
        metrics: None,
    };
    haunt_chaos::core::workload::run(client, recorder.clone(), workload, Arc::new(AtomicBool::new(false))).await;
    recorder.finish()?;
    let t = recorder.tally();
    let recorded = (t.ok + t.fail + t.info) as f64 / duration.as_secs_f64();
    Ok(json!({
        "bench": "harness",
        "machine": crate::machine(),
        "concurrency": options.concurrency,
        "seconds": duration.as_secs(),
        "baseline_requests_per_s": baseline,
        "harness_ops_per_s": recorded,
        "harness_over_baseline": recorded / baseline,
        "history_lines": recorder.ops(),
    }))
}
