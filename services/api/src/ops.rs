//! Health, readiness, the projection and metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::Shared;

/// The process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// The process can serve orders: the database answers.
pub(crate) async fn readyz(State(state): State<Shared>) -> Response {
    match state.store.now_ms().await {
        Ok(_) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("database unavailable: {e}\n")).into_response(),
    }
}

pub(crate) async fn projection(State(state): State<Shared>) -> Response {
    match state.store.projection().await {
        Ok(rows) => {
            let items: Vec<_> = rows
                .into_iter()
                .map(|(item_id, reserved_qty)| json!({"item_id": item_id, "reserved_qty": reserved_qty}))
                .collect();
            axum::Json(json!({ "items": items })).into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": e.to_string()}))).into_response(),
    }
}

pub(crate) async fn metrics(State(state): State<Shared>) -> Response {
    let body = haunt_telemetry::metrics::encode(&state.metrics.registry);
    ([(header::CONTENT_TYPE, haunt_telemetry::OPENMETRICS_CONTENT_TYPE)], body).into_response()
}
