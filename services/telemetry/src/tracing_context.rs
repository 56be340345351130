//! W3C trace context between the API and the workers: the API stores its span's
//! `traceparent` with the message; each delivery attempt's span takes it as its
//! parent and links to it (OpenTelemetry messaging conventions), so one trace
//! shows an order from the request through every delivery.

use std::collections::HashMap;

use opentelemetry::trace::TraceContextExt;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";

/// The current span's `traceparent`, when it has a valid OpenTelemetry context.
pub fn current_traceparent() -> Option<String> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    carrier.remove(TRACEPARENT)
}

/// Makes `span` a child of the producer's span and links it there.
pub fn continue_from(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let carrier = HashMap::from([(TRACEPARENT.to_owned(), tp.to_owned())]);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    let producer = cx.span().span_context().clone();
    if producer.is_valid() {
        // A span that already started cannot change parents; that only happens
        // when the caller misuses this, and the link below still connects them.
        let _ = span.set_parent(cx);
        span.add_link(producer);
    }
}

/// The trace id of `span` as 32 hex digits, or empty.
pub fn trace_id(span: &tracing::Span) -> String {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if sc.is_valid() { sc.trace_id().to_string() } else { String::new() }
}
