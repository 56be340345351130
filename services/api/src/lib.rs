//! The order API of the reference pipeline (axum).
//!
//! `POST /orders` writes the order and its event in one transaction through the
//! store; the order id is the client's idempotency key. Every answer tells the
//! client what it may conclude: 201/200 committed, 4xx certainly not, 503 with
//! `haunt-outcome: not-committed` certainly not, any other 5xx unknown.
//!
//! # Layout
//!
//! - [`run`] and [`router`]: serving, for `haunt api` and for tests on `127.0.0.1:0`.
//! - `orders`: `POST /orders` and `GET /orders/{id}`, with validation.
//! - `admin`: the token-guarded admin endpoints.
//! - `ops`: health, readiness, projection and metrics.

mod admin;
mod ops;
mod orders;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use haunt_store::Store;
use haunt_telemetry::metrics::{ApiMetrics, HttpLabels};

/// The response header that marks a definite failure (nothing was committed).
pub const OUTCOME_HEADER: &str = "haunt-outcome";
pub const NOT_COMMITTED: &str = "not-committed";
pub const CORRELATION_HEADER: &str = "x-correlation-id";
/// Bodies of `POST /orders` larger than this are refused with 413.
pub const BODY_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug, Clone, Default)]
pub struct ApiConfig {
    /// When set, the admin endpoints exist and require this bearer token.
    pub admin_token: Option<String>,
}

#[derive(Debug)]
pub(crate) struct AppState {
    pub store: Store,
    pub metrics: ApiMetrics,
    pub config: ApiConfig,
}

pub(crate) type Shared = Arc<AppState>;

/// The API's routes over `store`.
pub fn router(store: Store, config: ApiConfig) -> Router {
    let admin = config.admin_token.is_some();
    let state: Shared = Arc::new(AppState { store, metrics: ApiMetrics::default(), config });
    let mut app = Router::new()
        .route("/orders", post(orders::place))
        .route("/orders/{order_id}", get(orders::get))
        .route("/projection", get(ops::projection))
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics));
    if admin {
        app = app.merge(admin::routes(state.clone()));
    }
    app.layer(axum::middleware::from_fn_with_state(state.clone(), record_http)).with_state(state)
}

/// Serves the API on `listener` until `shutdown` completes, then finishes the
/// requests in flight.
pub async fn run(
    listener: tokio::net::TcpListener,
    store: Store,
    config: ApiConfig,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> std::io::Result<()> {
    axum::serve(listener, router(store, config)).with_graceful_shutdown(shutdown).await
}

async fn record_http(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = match request.extensions().get::<MatchedPath>().map(MatchedPath::as_str) {
        Some("/orders") => "/orders",
        Some("/orders/{order_id}") => "/orders/{order_id}",
        Some("/projection") => "/projection",
        Some("/healthz") => "/healthz",
        Some("/readyz") => "/readyz",
        Some("/metrics") => "/metrics",
        Some(_) => "/admin",
        // Unmatched paths share one label: a scanner must not mint series.
        None => "unmatched",
    };
    let response = next.run(request).await;
    let labels = HttpLabels { method, route, status: response.status().as_u16() };
    state.metrics.http_request_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    response
}
