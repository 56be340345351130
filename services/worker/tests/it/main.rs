//! The worker against a real store: the tutorial's scenario, many workers under
//! ack loss on PostgreSQL, shutdown, and its metrics.

mod delivery;
mod metrics;

use std::sync::Arc;
use std::time::Duration;

use haunt_store::{NewOrder, Store, StoreOptions};
use haunt_telemetry::metrics::WorkerMetrics;
use haunt_worker::{Faults, Worker, WorkerConfig};
use tokio::sync::watch;

/// A worker running in this process until dropped or stopped.
#[derive(Debug)]
pub struct Running {
    pub worker: Worker,
    pub faults: Arc<Faults>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
    }

    pub fn metrics(&self) -> &WorkerMetrics {
        self.worker.metrics()
    }
}

pub fn spawn(store: Store, config: WorkerConfig, ack_fail_rate: f64) -> Running {
    let faults = Arc::new(Faults::new(ack_fail_rate, 0).unwrap());
    let worker = Worker::new(store, config, faults.clone(), Arc::new(WorkerMetrics::default()));
    let (stop, rx) = watch::channel(false);
    let w = worker.clone();
    let task = tokio::spawn(async move { w.run(rx).await });
    Running { worker, faults, stop, task }
}

pub async fn store(url: &str) -> Store {
    Store::connect(url, StoreOptions::default()).await.unwrap()
}

pub fn order(i: usize, item: &str, qty: i64) -> NewOrder {
    NewOrder {
        order_id: format!("o{i}"),
        item_id: item.into(),
        qty,
        correlation_id: format!("c{i}"),
        traceparent: None,
    }
}

/// Polls `done` every 20 ms for at most `limit`.
pub async fn wait_until(limit: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

pub fn counter(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len() + 1..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
