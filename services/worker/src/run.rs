//! One worker process assembled from its parts: the fault switches (with the
//! store's injected errors behind `db_error_rate`), the metrics, the lease
//! loops and the HTTP side, all stopped by one shutdown. `haunt worker` calls
//! [`run`] and so do the worker's tests, so both run the same wiring.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use haunt_store::Store;
use haunt_telemetry::metrics::WorkerMetrics;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::faults::{FaultError, FaultSettings, Faults};
use crate::{Worker, WorkerConfig};

/// Everything a worker process runs with besides its store and its listener.
#[derive(Debug, Clone, Default)]
pub struct RunConfig {
    /// The lease loops' identity and bounds, and the bug mode.
    pub worker: WorkerConfig,
    /// The fault switches at start (`--ack-fail-rate`, `--ack-fail-next`,
    /// `--clock-offset-ms`); absent fields start off. `/admin/faults` changes
    /// them later.
    pub faults: FaultSettings,
    /// When set, `/admin/faults` exists and requires this bearer token.
    pub admin_token: Option<String>,
}

impl RunConfig {
    /// Whether [`run`] would accept this configuration, without a store: the
    /// binary asks before connecting, so that a bad flag fails at once.
    pub fn check(&self) -> Result<(), FaultError> {
        self.faults.check()
    }
}

/// Why a worker process could not start or did not end cleanly.
#[derive(Debug)]
pub enum RunError {
    /// A fault setting of the configuration is out of range; nothing ran.
    Faults(FaultError),
    /// The metrics and admin server failed. The lease loops ran until the
    /// shutdown regardless: metrics are not worth stopping deliveries for.
    Serve(std::io::Error),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Faults(e) => write!(f, "bad fault setting {}: {e}", e.field),
            RunError::Serve(_) => f.write_str("serving the worker's metrics"),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::Faults(e) => Some(e),
            RunError::Serve(e) => Some(e),
        }
    }
}

/// Runs one worker over `store` until `shutdown` completes: its lease loops,
/// and, on `listener` if given, `/metrics`, `/healthz`, `/readyz` and (with an admin
/// token) `/admin/faults`. After the shutdown no new lease is taken, the
/// batches in hand are finished and the server stops; then it returns.
pub async fn run(
    listener: Option<TcpListener>,
    store: Store,
    config: RunConfig,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
) -> Result<(), RunError> {
    // The worker's `db_error_rate` is the store's own switch: the `db-error`
    // fault fails the store's statements, so it must reach this store's clones.
    let faults = Arc::new(Faults::default().with_db_errors(store.injected_errors().clone()));
    faults.set(&config.faults).map_err(RunError::Faults)?;
    let metrics = Arc::new(WorkerMetrics::default());
    let worker = Worker::new(store.clone(), config.worker, faults.clone(), metrics.clone());
    let (stop, stopped) = watch::channel(false);
    let serve = async {
        let Some(listener) = listener else { return Ok(()) };
        let app = crate::http::router(store, metrics, faults, worker.links().clone(), config.admin_token);
        let mut until = stopped.clone();
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = until.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = &served {
            tracing::error!(error = ?e, "metrics server failed");
        }
        served
    };
    let signal = async move {
        shutdown.await;
        tracing::info!("shutting down: no new leases, finishing in-flight deliveries");
        let _ = stop.send(true);
    };
    let ((), (), served) = tokio::join!(worker.run(stopped.clone()), signal, serve);
    served.map_err(RunError::Serve)
}
