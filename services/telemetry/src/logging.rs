//! The `tracing` subscriber: logs (text for people, JSON for machines, filtered
//! by `RUST_LOG`, default `info`) and OpenTelemetry spans.
//!
//! Spans always get OpenTelemetry ids, so the API can store a `traceparent` with
//! every message and exemplars can name a trace; they are exported over OTLP only
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, over HTTP (`http/protobuf`, the
//! collector's port 4318). gRPC is not built in: it brought tonic and its
//! stack into every build for a second way to say the same.

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("unknown log format {s:?}; expected text or json")),
        }
    }
}

/// Flushes spans at exit.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Exports what is buffered. The SDK's shutdown blocks, so it runs off the
    /// async threads.
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}

fn exporter() -> anyhow::Result<Option<opentelemetry_otlp::SpanExporter>> {
    // Unset or empty (as compose.local.yaml sets it): no export.
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none_or(|v| v.is_empty()) {
        return Ok(None);
    }
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or_else(|_| "http/protobuf".into());
    let exporter = match protocol.as_str() {
        "http/protobuf" => opentelemetry_otlp::SpanExporter::builder().with_http().build()?,
        "grpc" => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: haunt exports OTLP over HTTP only; \
             set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (or leave it unset) and point \
             OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (4318)"
        ),
        other => anyhow::bail!("OTEL_EXPORTER_OTLP_PROTOCOL={other} is not supported; use http/protobuf"),
    };
    Ok(Some(exporter))
}

/// Installs the global subscriber for `service`. Logs go to stderr so stdout stays free
/// for command output.
pub fn init(service: &'static str, format: LogFormat) -> anyhow::Result<TelemetryGuard> {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let mut builder = SdkTracerProvider::builder()
        .with_resource(opentelemetry_sdk::Resource::builder().with_service_name(service).build());
    let exporting = match exporter()? {
        Some(exporter) => {
            builder = builder.with_batch_exporter(exporter);
            true
        }
        None => false,
    };
    let provider = builder.build();
    if exporting {
        crate::tracing_context::exporting_with(provider.tracer("haunt"));
    }
    let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer("haunt"));
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    // A second init (tests start several services in one process) keeps the first.
    let _ = match format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(tracing_subscriber::fmt::layer().json().flatten_event(true).with_writer(std::io::stderr))
            .try_init(),
    };
    if exporting {
        tracing::info!(service, "exporting spans over OTLP");
    }
    Ok(TelemetryGuard { provider: Some(provider) })
}
