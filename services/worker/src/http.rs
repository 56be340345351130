//! The worker's HTTP side: `/metrics` (queue depth is sampled at scrape time),
//! `/healthz` (the process is up), `/readyz` (and, with a broker transport,
//! every consumer is connected to it: 503 until then), and, with
//! `HAUNT_ADMIN_TOKEN`, `GET`/`POST /admin/faults` and `POST /admin/hold`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use haunt_store::Store;
use haunt_telemetry::metrics::{QueueLabels, WorkerMetrics};
use haunt_transport::Links;
use serde_json::json;

use crate::faults::{FaultSettings, Faults, HOLD_MS_MAX, HoldPoint};

#[derive(Debug)]
struct HttpState {
    store: Store,
    metrics: Arc<WorkerMetrics>,
    faults: Arc<Faults>,
    links: Arc<Links>,
    admin_token: Option<String>,
}

pub fn router(
    store: Store,
    metrics: Arc<WorkerMetrics>,
    faults: Arc<Faults>,
    links: Arc<Links>,
    admin_token: Option<String>,
) -> Router {
    let admin = admin_token.is_some();
    let state = Arc::new(HttpState { store, metrics, faults, links, admin_token });
    let mut app = Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(|State(state): State<Arc<HttpState>>| async move { readyz(&state.links) }));
    if admin {
        app = app
            .route("/admin/faults", get(get_faults).post(set_faults))
            .route("/admin/hold", axum::routing::post(hold))
            .route("/admin/points", get(points));
    }
    app.with_state(state)
}

/// 200 while every broker client of the process is connected, 503 with the
/// counts otherwise. The relay serves the same.
pub fn readyz(links: &Links) -> Response {
    let (ready, body) = links.report();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn serve_metrics(State(state): State<Arc<HttpState>>) -> Response {
    // A scrape during a database fault still answers, with the last depths.
    let sample = tokio::time::timeout(std::time::Duration::from_secs(2), state.store.queue_stats()).await;
    if let Ok(Ok(stats)) = sample {
        let m = &state.metrics;
        for (label, n) in [
            ("visible", stats.visible),
            ("leased", stats.leased),
            ("delayed", stats.delayed),
            ("dead_letter", stats.dead_letter),
        ] {
            m.queue_messages.get_or_create(&QueueLabels { state: label }).set(n);
        }
        m.oldest_message_age_seconds.set(stats.oldest_age_ms as f64 / 1000.0);
    }
    let body = haunt_telemetry::metrics::encode(&state.metrics.registry);
    ([(header::CONTENT_TYPE, haunt_telemetry::OPENMETRICS_CONTENT_TYPE)], body).into_response()
}

fn authorized(state: &HttpState, headers: &HeaderMap) -> bool {
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    haunt_telemetry::admin::bearer_matches(authorization, state.admin_token.as_deref())
}

async fn get_faults(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(state.faults.get()).into_response()
}

async fn set_faults(State(state): State<Arc<HttpState>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    if !authorized(&state, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let settings: FaultSettings = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => return unprocessable(None, e.to_string()),
    };
    match state.faults.set(&settings) {
        Ok(()) => {
            tracing::info!(?settings, "fault switches changed");
            axum::Json(state.faults.get()).into_response()
        }
        Err(e) => unprocessable(Some(e.field), e.message),
    }
}

/// A 422 naming the field the body was wrong about: `field` when the caller
/// knows it, else the one serde's message names, if any.
fn unprocessable(field: Option<&str>, error: String) -> Response {
    let field = field.or_else(|| haunt_telemetry::admin::field_named_in(&error)).map(str::to_owned);
    (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(json!({"error": error, "field": field}))).into_response()
}

/// `GET /admin/points`: the hold points a worker has. It reaches one of
/// them, which its configuration decides (`docs/admin.md`).
async fn points(State(state): State<Arc<HttpState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    axum::Json(json!({"points": HoldPoint::ALL})).into_response()
}

/// `POST /admin/hold`: how long to wait for a batch to reach its hold point,
/// and how long that batch then holds still.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HoldRequest {
    /// Only a batch at this point holds; absent: at the worker's own point.
    #[serde(default)]
    point: Option<String>,
    wait_ms: u64,
    hold_ms: u64,
}

/// Arms the hold point and answers once a batch holds still there
/// (`{"held": true, "point": "before-ack", "messages": 3}`), or after
/// `wait_ms` without one (`{"held": false}`, and the hold is disarmed). The
/// nemesis kills or pauses the worker on a `true`, so that the fault finds a
/// batch in flight rather than an idle loop.
async fn hold(State(state): State<Arc<HttpState>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    if !authorized(&state, &headers) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let request: HoldRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return unprocessable(None, e.to_string()),
    };
    for (field, ms) in [("wait_ms", request.wait_ms), ("hold_ms", request.hold_ms)] {
        if !(1..=HOLD_MS_MAX).contains(&ms) {
            return unprocessable(Some(field), format!("{field} must be within 1..={HOLD_MS_MAX}, got {ms}"));
        }
    }
    let point = match request.point.as_deref().map(|p| serde_json::from_value::<HoldPoint>(json!(p))) {
        None => None,
        Some(Ok(point)) => Some(point),
        Some(Err(_)) => {
            let known = HoldPoint::ALL.join(", ");
            return unprocessable(
                Some("point"),
                format!("a worker has no hold point {:?} (it has: {known})", request.point.unwrap_or_default()),
            );
        }
    };
    let wait = std::time::Duration::from_millis(request.wait_ms);
    match state.faults.hold_next(point, wait, std::time::Duration::from_millis(request.hold_ms)).await {
        Some(held) => axum::Json(json!({"held": true, "point": held.point, "messages": held.messages})).into_response(),
        None => axum::Json(json!({"held": false})).into_response(),
    }
}
