//! The worker against a real store, started as `haunt worker` starts it
//! (through `haunt_worker::run`) and observed from outside, over its metrics
//! and admin endpoints: the tutorial's scenario, many workers under ack loss
//! on PostgreSQL, the db-error switch, shutdown, and its metrics.

mod delivery;
mod faults;
mod metrics;

use std::time::Duration;

use haunt_store::{NewOrder, Store, StoreOptions};
use haunt_worker::faults::FaultSettings;
use haunt_worker::{RunConfig, WorkerConfig};

/// The admin token every worker here is started with.
pub const TOKEN: &str = "t0k";

/// A worker running in this process until stopped, with its HTTP side on
/// `127.0.0.1:0`.
#[derive(Debug)]
pub struct Running {
    /// `http://127.0.0.1:PORT`, where `/metrics` and `/admin/faults` answer.
    pub base: String,
    client: reqwest::Client,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), haunt_worker::RunError>>,
}

impl Running {
    /// Shuts the worker down and waits for `run` to return, which must be `Ok`.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }

    /// A scrape of `/metrics`.
    pub async fn metrics(&self) -> String {
        let r = self.client.get(format!("{}/metrics", self.base)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.text().await.unwrap()
    }

    /// The fault switches, read through `GET /admin/faults`.
    pub async fn faults(&self) -> FaultSettings {
        let r = self.client.get(format!("{}/admin/faults", self.base)).bearer_auth(TOKEN).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }

    /// Flips switches through `POST /admin/faults`, as the nemesis does.
    pub async fn set_faults(&self, settings: &FaultSettings) {
        let url = format!("{}/admin/faults", self.base);
        let r = self.client.post(url).bearer_auth(TOKEN).json(settings).send().await.unwrap();
        assert_eq!(r.status(), 200, "{settings:?}: {}", r.text().await.unwrap());
    }
}

/// Starts a worker over `store` with `config`, losing `ack_fail_rate` of its
/// acks from the start.
pub async fn spawn(store: Store, config: WorkerConfig, ack_fail_rate: f64) -> Running {
    let faults = FaultSettings { ack_fail_rate: Some(ack_fail_rate), ..FaultSettings::default() };
    start(store, RunConfig { worker: config, faults, admin_token: Some(TOKEN.into()) }).await
}

/// Starts a worker through `haunt_worker::run`, the wiring of `haunt worker`.
pub async fn start(store: Store, config: RunConfig) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(haunt_worker::run(
        Some(listener),
        store,
        config,
        Box::pin(async {
            let _ = stopped.await;
        }),
    ));
    Running { base, client: reqwest::Client::new(), stop, task }
}

pub async fn store(url: &str) -> Store {
    Store::connect(&url.parse().unwrap(), StoreOptions::default()).await.unwrap()
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
