//! Telemetry shared by the services: Prometheus metrics in OpenMetrics text
//! (the only format that carries exemplars) and logging.
//!
//! Correlation and event ids are never labels: they would make a series per
//! order. They ride as exemplars on the delivery metrics and as fields on logs.
//!
//! # Layout
//!
//! - [`metrics`]: the API's, the worker's and the harness's metrics, and
//!   [`metrics::encode`].
//! - [`admin`]: the bearer-token check of the admin endpoints.
//! - [`logging`]: the `tracing` subscriber (text or JSON logs, OpenTelemetry spans).
//! - [`tracing_context`]: `traceparent` from the API to every delivery attempt.

pub mod admin;
pub mod logging;
pub mod metrics;
pub mod tracing_context;

/// The content type of `/metrics`.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
