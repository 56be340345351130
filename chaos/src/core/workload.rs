//! The workload: concurrent clients placing orders over a few hot items, each op
//! recorded as an invoke and its completion.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use haunt_format::{OpType, OpValue, OrderValue, Process};
use haunt_store::Rng;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::core::history::Recorder;
use crate::core::inflight::InFlight;
use crate::core::roles::{BoxFuture, Client, Completion};
use crate::core::seed::RunSeed;

/// Talks to the API over HTTP.
#[derive(Debug, Clone)]
pub struct HttpClient {
    http: reqwest::Client,
    orders_url: String,
    /// Its requests under way at the API, for a kill aimed from its side.
    in_flight: Arc<InFlight>,
}

impl HttpClient {
    pub fn new(api_base: &str, request_timeout: Duration) -> anyhow::Result<HttpClient> {
        let http = reqwest::Client::builder()
            .timeout(request_timeout)
            // A refused or unanswered connect means nothing was sent: a definite
            // failure, so it must not eat the whole request timeout.
            .connect_timeout(request_timeout.min(Duration::from_millis(500)))
            .pool_max_idle_per_host(64)
            .build()?;
        Ok(HttpClient { http, orders_url: format!("{api_base}/orders"), in_flight: Arc::default() })
    }

    /// The requests under way at the API, from start to the answer's head.
    pub fn in_flight(&self) -> Arc<InFlight> {
        self.in_flight.clone()
    }
}

impl Client for HttpClient {
    fn place<'a>(&'a self, order: &'a OrderValue, correlation_id: &'a str) -> BoxFuture<'a, Completion> {
        Box::pin(async move {
            let body = serde_json::json!({"order_id": order.order_id, "item_id": order.item_id, "qty": order.qty});
            let request = self.http.post(&self.orders_url).header("x-correlation-id", correlation_id).json(&body);
            let in_flight = self.in_flight.begin();
            let response = request.send().await;
            drop(in_flight);
            let response = match response {
                Ok(r) => r,
                Err(e) if e.is_connect() => {
                    return Completion::Fail { error: format!("connect: {e}") };
                }
                Err(e) if e.is_timeout() => {
                    return Completion::Info { error: "timeout".into() };
                }
                Err(e) => return Completion::Info { error: format!("{e}") },
            };
            let status = response.status();
            let definite_failure = response.headers().get("haunt-outcome").is_some_and(|v| v == "not-committed");
            let body: serde_json::Value = match response.json().await {
                Ok(b) => b,
                // The status was read, the body was not: for a success the commit
                // happened, but without the event id the op cannot count as ok.
                Err(e) if status.is_success() => {
                    return Completion::Info { error: format!("reading the answer: {e}") };
                }
                Err(_) => serde_json::Value::Null,
            };
            if status.is_success() {
                match body["event_id"].as_str() {
                    Some(e) => Completion::Ok { event_id: Some(e.to_owned()) },
                    None => Completion::Info { error: format!("{status} without an event_id") },
                }
            } else if status.is_client_error() || (status.as_u16() == 503 && definite_failure) {
                Completion::Fail { error: format!("{status}: {}", body["error"].as_str().unwrap_or_default()) }
            } else {
                Completion::Info { error: format!("{status}: {}", body["error"].as_str().unwrap_or_default()) }
            }
        })
    }
}

#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    pub concurrency: usize,
    /// Target ops per second across all clients.
    pub rate: f64,
    pub items: usize,
    /// Keys that each belong to one client ([`owned_keys`]).
    pub ordered_keys: usize,
    /// Retries of one order after an indeterminate answer, each under a new
    /// process. Three covers a kill and a restart of the API.
    pub retries_max: u32,
    pub seed: u64,
    pub deadline: Instant,
    /// Where to count completed ops and their durations, if anywhere.
    pub metrics: Option<Arc<haunt_telemetry::metrics::HarnessMetrics>>,
}

/// The keys client `thread` of `concurrency` owns when there are `keys`
/// ordered keys: `key-k` belongs to client `k % concurrency`, so every key
/// has exactly one client and no client has two more than another.
pub fn owned_keys(thread: usize, concurrency: usize, keys: usize) -> Vec<usize> {
    (0..keys).filter(|k| k % concurrency.max(1) == thread).collect()
}

/// Spaces the ops of all clients `1/rate` apart.
#[derive(Debug)]
struct Pacer {
    interval: Duration,
    next: Mutex<Instant>,
}

impl Pacer {
    async fn wait(&self) {
        let at = {
            let mut next = self.next.lock().await;
            let now = Instant::now();
            let at = (*next).max(now);
            *next = at + self.interval;
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

/// Runs `concurrency` clients until the deadline or `stop`. Returns once every
/// client has completed its op in flight.
pub async fn run(client: Arc<dyn Client>, recorder: Arc<Recorder>, options: WorkloadOptions, stop: Arc<AtomicBool>) {
    let rate = options.rate.max(0.1);
    let pacer = Arc::new(Pacer { interval: Duration::from_secs_f64(1.0 / rate), next: Mutex::new(Instant::now()) });
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..options.concurrency.max(1) {
        let (client, recorder, pacer, stop, options) =
            (client.clone(), recorder.clone(), pacer.clone(), stop.clone(), options.clone());
        tasks.spawn(async move { client_loop(t, client, recorder, pacer, options, stop).await });
    }
    while tasks.join_next().await.is_some() {}
}

async fn client_loop(
    thread: usize,
    client: Arc<dyn Client>,
    recorder: Arc<Recorder>,
    pacer: Arc<Pacer>,
    options: WorkloadOptions,
    stop: Arc<AtomicBool>,
) {
    let mut rng = Rng::new(RunSeed(options.seed).client(thread));
    let stride = options.concurrency.max(1) as u64;
    let own = owned_keys(thread, options.concurrency, options.ordered_keys);
    let mut process = thread as u64;
    let mut n = 0u64;
    let running = || !stop.load(Ordering::Relaxed) && Instant::now() < options.deadline;
    while running() {
        pacer.wait().await;
        if !running() {
            break;
        }
        n += 1;
        let order = OrderValue {
            order_id: format!("o-{thread}-{n}"),
            item_id: if own.is_empty() {
                format!("item-{}", rng.below(options.items.max(1) as u64))
            } else {
                // The client's own keys in turn: each key's orders follow one
                // another, each invoked after the one before was answered.
                format!("key-{}", own[(n as usize - 1) % own.len()])
            },
            qty: 1 + rng.below(5) as i64,
            event_id: None,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let correlation_id = format!("{}-a{attempt}", order.order_id);
            recorder.record(
                Process::Client(process),
                OpType::Invoke,
                "order",
                OpValue::Order(order.clone()),
                Some(correlation_id.clone()),
                None,
            );
            let started = Instant::now();
            let completion = client.place(&order, &correlation_id).await;
            if let Some(m) = &options.metrics {
                let labels = haunt_telemetry::metrics::ClientOpLabels {
                    r#type: match completion {
                        Completion::Ok { .. } => "ok",
                        Completion::Fail { .. } => "fail",
                        Completion::Info { .. } => "info",
                    },
                };
                m.client_ops.get_or_create(&labels).inc();
                m.client_op_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
            }
            let (kind, value, error) = match completion {
                Completion::Ok { event_id } => (OpType::Ok, OrderValue { event_id, ..order.clone() }, None),
                Completion::Fail { error } => (OpType::Fail, order.clone(), Some(error)),
                Completion::Info { error } => (OpType::Info, order.clone(), Some(error)),
            };
            recorder.record(
                Process::Client(process),
                kind,
                "order",
                OpValue::Order(value),
                Some(correlation_id),
                error,
            );
            if kind != OpType::Info {
                break;
            }
            // After an indeterminate op this process is done; the client goes on
            // under a new number, and retries the same order (its idempotency key).
            process += stride;
            if attempt > options.retries_max || !running() {
                break;
            }
            // Back off a little: the API was probably killed or partitioned.
            tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::owned_keys;

    #[test]
    fn each_ordered_key_belongs_to_exactly_one_client() {
        let (clients, keys) = (8, 20);
        let mut owners = vec![0; keys];
        for thread in 0..clients {
            let own = owned_keys(thread, clients, keys);
            assert!((2..=3).contains(&own.len()), "client {thread}: {own:?}");
            for k in own {
                owners[k] += 1;
            }
        }
        assert_eq!(owners, vec![1; keys]);
        assert_eq!(owned_keys(5, 8, 3), Vec::<usize>::new(), "fewer keys than clients: some own none");
        assert_eq!(owned_keys(0, 8, 0), Vec::<usize>::new());
    }
}
