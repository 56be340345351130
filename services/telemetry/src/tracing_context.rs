//! W3C trace context between the API and the workers: the API stores its span's
//! `traceparent` with the message; each delivery attempt's span takes it as its
//! parent and links to it (OpenTelemetry messaging conventions), so one trace
//! shows an order from the request through every delivery.
//!
//! A worker may instead trace a batch as one span with a link per message
//! (the conventions allow both). Each delivery then still appears in its
//! order's trace, as a span sent straight to the OpenTelemetry SDK
//! ([`record_delivery`]) and only when spans are exported, so that a worker
//! that exports nothing spends nothing on it.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::propagation::Extractor;
use opentelemetry::trace::{Link, SpanBuilder, SpanContext, SpanKind, TraceContextExt};
use opentelemetry::{Context, KeyValue};
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
    if let Some(producer) = producer(traceparent) {
        // A span that already started cannot change parents; that only happens
        // when the caller misuses this, and the link below still connects them.
        let _ = span.set_parent(Context::new().with_remote_span_context(producer.clone()));
        span.add_link(producer);
    }
}

/// The trace id of `span` as 32 hex digits, or empty.
pub fn trace_id(span: &tracing::Span) -> String {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if sc.is_valid() { sc.trace_id().to_string() } else { String::new() }
}

/// The tracer of [`record_delivery`], set by [`crate::logging::init`] when it
/// exports spans.
static EXPORTING: OnceLock<opentelemetry_sdk::trace::Tracer> = OnceLock::new();

pub(crate) fn exporting_with(tracer: opentelemetry_sdk::trace::Tracer) {
    let _ = EXPORTING.set(tracer);
}

/// Whether spans leave this process (an OTLP endpoint is configured).
pub fn exporting() -> bool {
    EXPORTING.get().is_some()
}

/// A `traceparent` as a carrier of its one header, without a map.
struct Traceparent<'a>(&'a str);

impl Extractor for Traceparent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

/// The producer's span context a `traceparent` names, when it is valid.
pub fn producer(traceparent: Option<&str>) -> Option<SpanContext> {
    let carrier = Traceparent(traceparent?);
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&carrier));
    let producer = cx.span().span_context().clone();
    producer.is_valid().then_some(producer)
}

/// Links `span` (a batch's) to each producer's span.
pub fn link_all(span: &tracing::Span, producers: impl IntoIterator<Item = SpanContext>) {
    for producer in producers {
        span.add_link(producer);
    }
}

/// One delivery of a batch traced as one span: a consumer span in its
/// order's trace (a child of `producer`), from `start` to `end`, linked to
/// the batch's span. Nothing when spans are not exported.
pub fn record_delivery(
    producer: SpanContext,
    batch: &tracing::Span,
    attributes: Vec<KeyValue>,
    start: SystemTime,
    end: SystemTime,
) {
    let Some(tracer) = EXPORTING.get() else { return };
    let batch = batch.context().span().span_context().clone();
    let links = if batch.is_valid() { vec![Link::with_context(batch)] } else { Vec::new() };
    let parent = Context::new().with_remote_span_context(producer);
    let span = SpanBuilder::from_name("orders process")
        .with_kind(SpanKind::Consumer)
        .with_start_time(start)
        .with_attributes(attributes)
        .with_links(links)
        .start_with_context(tracer, &parent);
    opentelemetry::trace::Span::end_with_timestamp(&mut { span }, end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_its_producer_and_a_malformed_one_nothing() {
        opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let producer = producer(Some(tp)).expect("a valid traceparent");
        assert_eq!(producer.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(producer.span_id().to_string(), "00f067aa0ba902b7");
        assert!(super::producer(Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01")).is_none());
        assert!(super::producer(Some("not a traceparent")).is_none());
        assert!(super::producer(None).is_none());
    }
}
