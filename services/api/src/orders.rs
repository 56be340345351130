//! `POST /orders` and `GET /orders/{id}`.

use std::borrow::Cow;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use haunt_store::{NewOrder, Placement};
use haunt_telemetry::metrics::OutcomeLabels;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::{BODY_BYTES_MAX, CORRELATION_HEADER, NOT_COMMITTED, OUTCOME_HEADER, Shared};

/// Identifiers: short, printable, safe in a URL and a log line.
const ID_CHARS_MAX: usize = 128;
const QTY_MAX: i64 = 1_000_000;

/// A 4xx answer naming the offending field.
#[derive(Debug)]
pub(crate) struct Rejection {
    status: StatusCode,
    error: String,
    field: Option<Cow<'static, str>>,
}

impl Rejection {
    fn new(status: StatusCode, field: Option<&'static str>, error: impl Into<String>) -> Self {
        Rejection { status, error: error.into(), field: field.map(Cow::Borrowed) }
    }

    fn field(field: &'static str, error: impl Into<String>) -> Self {
        Rejection::new(StatusCode::UNPROCESSABLE_ENTITY, Some(field), error)
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({"error": self.error, "field": self.field}))).into_response()
    }
}

fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= ID_CHARS_MAX
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn id_field(body: &serde_json::Map<String, Value>, field: &'static str) -> Result<Option<String>, Rejection> {
    match body.get(field) {
        None => Ok(None),
        Some(Value::String(s)) if valid_id(s) => Ok(Some(s.clone())),
        Some(Value::String(_)) => {
            Err(Rejection::field(field, format!("{field} must be 1 to {ID_CHARS_MAX} characters of A-Z a-z 0-9 . _ -")))
        }
        Some(_) => Err(Rejection::field(field, format!("{field} must be a string"))),
    }
}

/// Checks the request and builds the order; every way a request can be wrong
/// ends here, before anything touches the database.
fn parse(headers: &HeaderMap, body: &[u8]) -> Result<(NewOrder, bool), Rejection> {
    let json_content = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json"))
        .unwrap_or(false);
    if !json_content {
        return Err(Rejection::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Some("content-type"),
            "content-type must be application/json",
        ));
    }
    let (correlation_id, generated) = match headers.get(CORRELATION_HEADER) {
        None => (uuid::Uuid::new_v4().to_string(), true),
        Some(v) => match v.to_str() {
            Ok(s) if valid_id(s) => (s.to_owned(), false),
            _ => {
                return Err(Rejection::new(
                    StatusCode::BAD_REQUEST,
                    Some("X-Correlation-Id"),
                    format!("X-Correlation-Id must be 1 to {ID_CHARS_MAX} characters of A-Z a-z 0-9 . _ -"),
                ));
            }
        },
    };
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Rejection::new(StatusCode::BAD_REQUEST, None, format!("malformed JSON: {e}")))?;
    let Value::Object(body) = value else {
        return Err(Rejection::new(StatusCode::UNPROCESSABLE_ENTITY, None, "the body must be a JSON object"));
    };
    if let Some(unknown) = body.keys().find(|k| !matches!(k.as_str(), "order_id" | "item_id" | "qty")) {
        let error = format!("unknown field {unknown:?}; expected order_id, item_id, qty");
        let field = Some(Cow::Owned(unknown.clone()));
        return Err(Rejection { status: StatusCode::UNPROCESSABLE_ENTITY, error, field });
    }
    let order_id = id_field(&body, "order_id")?.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let item_id = id_field(&body, "item_id")?.ok_or_else(|| Rejection::field("item_id", "item_id is required"))?;
    let qty = match body.get("qty") {
        None => return Err(Rejection::field("qty", "qty is required")),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(q) if (1..=QTY_MAX).contains(&q) => q,
            _ => {
                return Err(Rejection::field("qty", format!("qty must be an integer from 1 to {QTY_MAX}")));
            }
        },
        Some(_) => return Err(Rejection::field("qty", "qty must be an integer")),
    };
    Ok((NewOrder { order_id, item_id, qty, correlation_id, traceparent: None }, generated))
}

pub(crate) async fn place(State(state): State<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let count = |outcome: &'static str| {
        state.metrics.orders.get_or_create(&OutcomeLabels { outcome }).inc();
    };
    let body = match axum::body::to_bytes(body, BODY_BYTES_MAX).await {
        Ok(bytes) => bytes,
        Err(_) => {
            count("rejected");
            let error = format!("the body is larger than {BODY_BYTES_MAX} bytes");
            return Rejection::new(StatusCode::PAYLOAD_TOO_LARGE, None, error).into_response();
        }
    };
    let (mut order, _generated) = match parse(&parts.headers, &body) {
        Ok(parsed) => parsed,
        Err(rejection) => {
            count("rejected");
            return rejection.into_response();
        }
    };
    let correlation = HeaderValue::from_str(&order.correlation_id).expect("validated above");
    let span = tracing::info_span!(
        "order.place",
        otel.kind = "producer",
        otel.name = "orders publish",
        messaging.system = "haunt",
        messaging.operation.type = "publish",
        correlation_id = %order.correlation_id,
        order_id = %order.order_id,
        item_id = %order.item_id,
        qty = order.qty,
    );
    order.traceparent = span.in_scope(haunt_telemetry::tracing_context::current_traceparent);
    let mut response = place_in_span(&state, &order, count).instrument(span).await;
    response.headers_mut().insert(CORRELATION_HEADER, correlation);
    response
}

async fn place_in_span(state: &Shared, order: &NewOrder, count: impl Fn(&'static str)) -> Response {
    match state.store.place_order(order).await {
        Ok(Placement::Created { event_id }) => {
            count("created");
            state.metrics.messages_enqueued.inc();
            tracing::info!(event_id = %event_id, "order placed");
            answer(StatusCode::CREATED, order, &event_id)
        }
        Ok(Placement::Replayed { event_id }) => {
            count("replayed");
            tracing::info!(event_id = %event_id, "order replayed");
            answer(StatusCode::OK, order, &event_id)
        }
        Ok(Placement::Conflict { existing }) => {
            count("conflict");
            let body = json!({
                "error": format!("order {} exists with other content", existing.order_id),
                "field": "order_id",
                "existing": {"item_id": existing.item_id, "qty": existing.qty},
            });
            (StatusCode::CONFLICT, axum::Json(body)).into_response()
        }
        Err(e) if e.not_committed() => {
            count("not_committed");
            tracing::warn!(error = ?e, "order not committed");
            let body = json!({"error": format!("{e}: {}", source_of(&e)), "field": null});
            let mut r = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
            r.headers_mut().insert(OUTCOME_HEADER, HeaderValue::from_static(NOT_COMMITTED));
            r
        }
        Err(e) => {
            count("unknown");
            tracing::error!(error = ?e, "order outcome unknown");
            let body = json!({"error": format!("{e}: {}", source_of(&e)), "field": null});
            (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
        }
    }
}

fn source_of(e: &haunt_store::StoreError) -> String {
    std::error::Error::source(e).map(|s| s.to_string()).unwrap_or_default()
}

fn answer(status: StatusCode, order: &NewOrder, event_id: &str) -> Response {
    let body = json!({"order_id": order.order_id, "event_id": event_id, "correlation_id": order.correlation_id});
    (status, axum::Json(body)).into_response()
}

pub(crate) async fn get(State(state): State<Shared>, Path(order_id): Path<String>) -> Response {
    if !valid_id(&order_id) {
        return Rejection::new(StatusCode::BAD_REQUEST, Some("order_id"), "invalid order_id").into_response();
    }
    match state.store.get_order(&order_id).await {
        Ok(Some(order)) => axum::Json(order).into_response(),
        Ok(None) => {
            (StatusCode::NOT_FOUND, axum::Json(json!({"error": "no such order", "field": "order_id"}))).into_response()
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": e.to_string(), "field": null})))
            .into_response(),
    }
}

/// Used by the admin endpoints too.
pub(crate) fn empty(status: StatusCode) -> Response {
    Response::builder().status(status).body(Body::empty()).expect("a static response")
}
