//! How the batch path traces its deliveries, in either [`Spans`] form.
//!
//! Per delivery, each delivery has a `tracing` span, a child of
//! its order's span, and its lines are written within it. Per batch (the
//! default), the batch has one span linked to every message's producer; each delivery's
//! lines carry its ids instead, and its span in the order's trace is sent
//! straight to the OpenTelemetry SDK when the batch's span is recorded and
//! spans are exported ([`tracing_context::record_delivery`]), once its
//! outcome and its ack are known. When nothing is exported, the producers'
//! `traceparent`s are not parsed and the batch's span gets no links (no one
//! would see them): a delivery's trace id, which its exemplars carry, is read
//! from its `traceparent` when a metric asks for it.

use std::cell::RefCell;
use std::time::SystemTime;

use haunt_store::{Applied, Leased};
use haunt_telemetry::tracing_context;
use opentelemetry::KeyValue;
use opentelemetry::trace::SpanContext;

use crate::{Spans, Worker};

/// A line about one delivery that names it by its ids (per batch, where it
/// has no span of its own to carry them).
macro_rules! with_ids {
    ($level:ident, $leased:expr, $message:expr) => {
        tracing::$level!(
            correlation_id = %$leased.headers.correlation_id,
            event_id = %$leased.event_id,
            message_id = %$leased.message_id,
            delivery_attempt = $leased.delivery_count,
            "{}",
            $message
        )
    };
}

/// The trace of one batch on its way through apply and ack.
pub(crate) struct BatchTrace<'a> {
    form: Spans,
    /// The batch's span (per batch), or none.
    batch: tracing::Span,
    /// Each delivery's span (per delivery), or none.
    spans: Vec<tracing::Span>,
    /// The batch's deliveries (per batch).
    leased: Vec<&'a Leased>,
    /// Each delivery's producer (per batch, when spans are exported).
    producers: Vec<Option<SpanContext>>,
    /// Each delivery's outcome and whether its ack was dropped (per batch),
    /// for its span when the batch is done.
    notes: RefCell<Vec<Note>>,
    started: SystemTime,
}

#[derive(Debug, Clone, Copy, Default)]
struct Note {
    outcome: Option<&'static str>,
    ack_dropped: bool,
}

impl<'a> BatchTrace<'a> {
    pub(crate) fn new(worker: &Worker, leased: impl Iterator<Item = &'a Leased>) -> BatchTrace<'a> {
        let started = SystemTime::now();
        match worker.config.spans {
            Spans::Delivery => BatchTrace {
                form: Spans::Delivery,
                batch: tracing::Span::none(),
                spans: leased.map(|l| worker.delivery_span(l)).collect(),
                leased: Vec::new(),
                producers: Vec::new(),
                notes: RefCell::default(),
                started,
            },
            Spans::Batch => {
                let leased: Vec<&Leased> = leased.collect();
                let batch = tracing::info_span!(
                    "order.process_batch",
                    otel.kind = "consumer",
                    otel.name = "orders process",
                    messaging.system = worker.system(),
                    messaging.operation.type = "process",
                    messaging.batch.message_count = leased.len(),
                    worker_id = worker.config.worker_id.as_str(),
                );
                // Parsed and linked only where someone sees them.
                let producers: Vec<Option<SpanContext>> = if !batch.is_disabled() && tracing_context::exporting() {
                    leased.iter().map(|l| tracing_context::producer(l.headers.traceparent.as_deref())).collect()
                } else {
                    Vec::new()
                };
                tracing_context::link_all(&batch, producers.iter().flatten().cloned());
                let notes = RefCell::new(vec![Note::default(); leased.len()]);
                BatchTrace { form: Spans::Batch, batch, spans: Vec::new(), leased, producers, notes, started }
            }
        }
    }

    /// Deliveries in the batch.
    pub(crate) fn len(&self) -> usize {
        self.spans.len().max(self.leased.len())
    }

    /// The span a line about delivery `i` belongs in: its own, or the batch's.
    fn span(&self, i: usize) -> &tracing::Span {
        self.spans.get(i).unwrap_or(&self.batch)
    }

    /// The trace id delivery `i`'s exemplars carry: its order's trace.
    pub(crate) fn trace_id(&self, i: usize) -> String {
        let producer = match self.producers.get(i) {
            Some(producer) => producer.clone(),
            None => self.leased.get(i).and_then(|l| tracing_context::producer(l.headers.traceparent.as_deref())),
        };
        match producer {
            Some(producer) => producer.trace_id().to_string(),
            None => tracing_context::trace_id(self.span(i)),
        }
    }

    /// A warning about delivery `i`: in its span, or with its ids.
    pub(crate) fn warn(&self, i: usize, leased: &Leased, message: &str) {
        match self.form {
            Spans::Delivery => self.span(i).in_scope(|| tracing::warn!("{message}")),
            Spans::Batch => self.batch.in_scope(|| with_ids!(warn, leased, message)),
        }
    }

    /// The batch failed: one line per delivery, or one for the batch.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Debug) {
        match self.form {
            Spans::Delivery => {
                for span in &self.spans {
                    span.in_scope(|| tracing::warn!(error = ?error, "apply failed"));
                }
            }
            Spans::Batch => self.batch.in_scope(|| tracing::warn!(error = ?error, "apply failed")),
        }
    }

    /// Delivery `i`'s ack was dropped (the `ack-loss` fault): a warning, and
    /// per batch an attribute of its span.
    pub(crate) fn ack_dropped(&self, i: usize, leased: &Leased) {
        self.warn(i, leased, "ack dropped (ack-loss fault): expect a redelivery");
        if let Some(note) = self.notes.borrow_mut().get_mut(i) {
            note.ack_dropped = true;
        }
    }

    /// Delivery `i`'s outcome: its line (at `info` in its span, or at
    /// `debug` with its ids), noted for its span per batch.
    pub(crate) fn settled(&self, i: usize, leased: &Leased, outcome: &Applied) {
        let what = match outcome {
            Applied::Applied { .. } => "applied",
            Applied::Duplicate => "duplicate skipped",
            // Its warning is written by the caller.
            Applied::LeaseLost => "lease lost",
        };
        match self.form {
            Spans::Delivery => {
                if *outcome != Applied::LeaseLost {
                    self.span(i).in_scope(|| tracing::info!("{what}"));
                }
            }
            Spans::Batch => {
                if *outcome != Applied::LeaseLost {
                    with_ids!(debug, leased, what);
                }
                if let Some(note) = self.notes.borrow_mut().get_mut(i) {
                    note.outcome = Some(what);
                }
            }
        }
    }

    /// The batch is applied and its acks sent: per batch, each settled
    /// delivery's span in its order's trace, when the batch's span is
    /// recorded (its level is on) and spans are exported.
    pub(crate) fn finish(&self, system: &'static str) {
        if self.form != Spans::Batch || self.batch.is_disabled() || !tracing_context::exporting() {
            return;
        }
        let end = SystemTime::now();
        let notes = self.notes.borrow();
        for ((leased, producer), note) in self.leased.iter().zip(&self.producers).zip(notes.iter()) {
            let (Some(producer), Some(outcome)) = (producer, note.outcome) else { continue };
            let attributes = vec![
                KeyValue::new("messaging.system", system),
                KeyValue::new("messaging.operation.type", "process"),
                KeyValue::new("messaging.message.id", leased.message_id.clone()),
                KeyValue::new("messaging.message.conversation_id", leased.headers.correlation_id.clone()),
                KeyValue::new("haunt.delivery_count", leased.delivery_count),
                KeyValue::new("haunt.outcome", outcome),
                KeyValue::new("haunt.ack_dropped", note.ack_dropped),
            ];
            tracing_context::record_delivery(producer.clone(), &self.batch, attributes, self.started, end);
        }
    }
}
