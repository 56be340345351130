//! Admin endpoints, present only when `HAUNT_ADMIN_TOKEN` is set, and then only
//! for callers that present it as a bearer token.

use axum::Router;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::Shared;
use crate::orders::empty;

pub(crate) fn routes(state: Shared) -> Router<Shared> {
    Router::new()
        .route("/admin/final-state", get(final_state))
        .route("/admin/reconcile", post(reconcile))
        .route("/admin/faults", get(get_faults).post(set_faults))
        .layer(axum::middleware::from_fn_with_state(state, require_token))
}

async fn require_token(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let authorization = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if !haunt_telemetry::admin::bearer_matches(authorization, state.config.admin_token.as_deref()) {
        return empty(StatusCode::UNAUTHORIZED);
    }
    next.run(request).await
}

/// The final state as JSON Lines (without the `meta` line, which only the
/// harness can write).
async fn final_state(State(state): State<Shared>) -> Response {
    let mut out = Vec::new();
    let mut writer = haunt_format::JsonlWriter::new(&mut out);
    match state.store.final_state(&mut |line| writer.write(&line)).await {
        Ok(()) => ([(header::CONTENT_TYPE, "application/jsonl")], out).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": e.to_string()}))).into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct ReconcileQuery {
    #[serde(default)]
    dry_run: bool,
}

async fn reconcile(State(state): State<Shared>, Query(q): Query<ReconcileQuery>) -> Response {
    match state.store.reconcile(q.dry_run).await {
        Ok(report) => axum::Json(report).into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": e.to_string()}))).into_response(),
    }
}

/// The API's fault switches (`db_error_rate`: injected database errors before
/// commit). Unknown fields and bad values are refused and change nothing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiFaults {
    #[serde(default)]
    db_error_rate: Option<f64>,
}

async fn get_faults(State(state): State<Shared>) -> Response {
    axum::Json(json!({"db_error_rate": state.store.injected_errors().rate()})).into_response()
}

async fn set_faults(State(state): State<Shared>, body: axum::body::Bytes) -> Response {
    let faults: ApiFaults = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => {
            let error = e.to_string();
            let field = haunt_telemetry::admin::field_named_in(&error);
            return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(json!({"error": error, "field": field})))
                .into_response();
        }
    };
    if let Some(rate) = faults.db_error_rate {
        if let Err(e) = state.store.injected_errors().set_rate(rate) {
            return (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(json!({"error": e, "field": "db_error_rate"})))
                .into_response();
        }
        tracing::info!(rate, "db-error fault switched");
    }
    get_faults(State(state)).await
}
