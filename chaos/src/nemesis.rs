//! The faults, and the seeded schedule that runs them one at a time.
//!
//! **Invariant:** the nemesis never reads the history; it only appends its own
//! start and stop ops to it.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use haunt_store::Rng;
use serde_json::json;
use tokio::time::Instant;

use crate::history::Recorder;
use crate::proxy::{ProxyMode, SharedProxy};
use crate::roles::{Backend, BoxFuture, Nemesis, Node};

/// The names `--nemesis` accepts.
pub const NEMESIS_NAMES: [&str; 9] =
    ["kill", "pause", "partition", "delay", "ack-loss", "clock-skew", "db-error", "db-restart", "loss"];

/// A network link the partition nemesis can cut: a fault proxy (local backend)
/// or iptables rules in a container's network namespace (Docker backend).
pub trait Link: Send + Sync + std::fmt::Debug {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// Restores the link. Idempotent: healing a whole link is always safe.
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>>;
}

pub type SharedLink = Arc<dyn Link>;

impl Link for crate::proxy::FaultProxy {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.set(ProxyMode::Partition);
        Box::pin(async { Ok(()) })
    }
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        // A delay on the same proxy is another nemesis's to heal.
        if self.mode() == ProxyMode::Partition {
            self.set(ProxyMode::Pass);
        }
        Box::pin(async { Ok(()) })
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

fn put<T>(slot: &Mutex<Option<T>>, value: T) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
}

/// SIGKILL a node, later start it again.
#[derive(Debug)]
pub struct KillNemesis<B> {
    name: &'static str,
    backend: Arc<B>,
    targets: Vec<Node>,
    killed: Mutex<Option<Node>>,
}

impl<B: Backend> KillNemesis<B> {
    pub fn new(backend: Arc<B>, targets: Vec<Node>) -> Self {
        KillNemesis::named("kill", backend, targets)
    }

    /// The same fault under another `--nemesis` name (`db-restart` of a
    /// database container).
    pub fn named(name: &'static str, backend: Arc<B>, targets: Vec<Node>) -> Self {
        KillNemesis { name, backend, targets, killed: Mutex::new(None) }
    }
}

impl<B: Backend + 'static> Nemesis for KillNemesis<B> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("kill", "restart")
    }
    fn targets(&self) -> Vec<String> {
        self.targets.iter().map(|n| n.name.clone()).collect()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let node = self.targets.iter().find(|n| n.name == target).context("unknown target")?.clone();
            put(&self.killed, node.clone());
            self.backend.kill(&node).await
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            match take(&self.killed) {
                Some(node) => self.backend.start(&node).await,
                None => Ok(()),
            }
        })
    }
}

/// SIGSTOP a worker for longer than the visibility timeout: when it resumes it
/// is a zombie holding an expired lease.
#[derive(Debug)]
pub struct PauseNemesis<B> {
    backend: Arc<B>,
    targets: Vec<Node>,
    hold_min: Duration,
    paused: Mutex<Option<Node>>,
}

impl<B: Backend> PauseNemesis<B> {
    pub fn new(backend: Arc<B>, targets: Vec<Node>, visibility_timeout: Duration) -> Self {
        // Twice the lease, so another worker has time to take the message over.
        PauseNemesis { backend, targets, hold_min: visibility_timeout * 2, paused: Mutex::new(None) }
    }
}

impl<B: Backend + 'static> Nemesis for PauseNemesis<B> {
    fn name(&self) -> &'static str {
        "pause"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("pause", "resume")
    }
    fn targets(&self) -> Vec<String> {
        self.targets.iter().map(|n| n.name.clone()).collect()
    }
    fn hold_min(&self) -> Duration {
        self.hold_min
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let node = self.targets.iter().find(|n| n.name == target).context("unknown target")?.clone();
            put(&self.paused, node.clone());
            self.backend.pause(&node).await
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            match take(&self.paused) {
                Some(node) if self.backend.is_running(&node) => self.backend.resume(&node).await,
                _ => Ok(()),
            }
        })
    }
}

/// Cuts one link: nothing crosses it, both ways, until it heals.
#[derive(Debug)]
pub struct PartitionNemesis {
    links: Vec<(String, SharedLink)>,
}

impl PartitionNemesis {
    /// `links`: a name such as `client<->api` and the link itself.
    pub fn new(links: Vec<(String, SharedLink)>) -> Self {
        PartitionNemesis { links }
    }
}

impl Nemesis for PartitionNemesis {
    fn name(&self) -> &'static str {
        "partition"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-partition", "stop-partition")
    }
    fn targets(&self) -> Vec<String> {
        self.links.iter().map(|(n, _)| n.clone()).collect()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let (_, link) = self.links.iter().find(|(n, _)| n == target).context("unknown link")?;
            link.cut().await
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            for (_, link) in &self.links {
                link.heal().await?;
            }
            Ok(())
        })
    }
}

/// Flips services' fault switches through their admin endpoints
/// (`POST /admin/faults`).
#[derive(Debug, Clone)]
pub struct Admin {
    http: reqwest::Client,
    token: String,
    /// Node name and the base URL of its admin endpoint.
    pub workers: Vec<(String, String)>,
}

impl Admin {
    pub fn new(token: String, workers: Vec<(String, String)>) -> anyhow::Result<Self> {
        // Short: a worker that does not answer at once is paused or dead, and the
        // nemesis must not stall the schedule waiting for it.
        let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        Ok(Admin { http, token, workers })
    }

    pub async fn set(&self, worker: &str, settings: serde_json::Value) -> anyhow::Result<()> {
        let (_, base) = self.workers.iter().find(|(n, _)| n == worker).context("unknown worker")?;
        let r = self
            .http
            .post(format!("{base}/admin/faults"))
            .bearer_auth(&self.token)
            .json(&settings)
            .send()
            .await
            .with_context(|| format!("setting faults on {worker}"))?;
        anyhow::ensure!(r.status().is_success(), "{worker} refused the fault switch: {}", r.status());
        Ok(())
    }

    /// Sets `settings` on every worker; reports the first failure after trying all.
    pub async fn set_all(&self, settings: serde_json::Value) -> anyhow::Result<()> {
        let mut first_error = None;
        for (name, _) in &self.workers {
            if let Err(e) = self.set(name, settings.clone()).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Drops acks after the effect committed, on every worker.
#[derive(Debug)]
pub struct AckLossNemesis {
    admin: Admin,
    rate: f64,
}

impl AckLossNemesis {
    pub fn new(admin: Admin, rate: f64) -> Self {
        AckLossNemesis { admin, rate }
    }
}

impl Nemesis for AckLossNemesis {
    fn name(&self) -> &'static str {
        "ack-loss"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-ack-loss", "stop-ack-loss")
    }
    fn targets(&self) -> Vec<String> {
        vec!["workers".into()]
    }
    fn start<'a>(&'a self, _target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"ack_fail_rate": self.rate})).await })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"ack_fail_rate": 0.0})).await })
    }
}

/// Makes database statements fail before commit, in the API and the workers:
/// what a flaky connection or a serialization failure does. A correct pipeline
/// answers "not committed" or retries; a pipeline that splits what belongs in
/// one transaction is left half-done.
#[derive(Debug)]
pub struct DbErrorNemesis {
    admin: Admin,
    rate: f64,
}

impl DbErrorNemesis {
    pub fn new(admin: Admin, rate: f64) -> Self {
        DbErrorNemesis { admin, rate }
    }
}

impl Nemesis for DbErrorNemesis {
    fn name(&self) -> &'static str {
        "db-error"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-db-error", "stop-db-error")
    }
    fn targets(&self) -> Vec<String> {
        vec!["services".into()]
    }
    fn start<'a>(&'a self, _target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"db_error_rate": self.rate})).await })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move { self.admin.set_all(json!({"db_error_rate": 0.0})).await })
    }
}

/// Moves one worker's clock. A correct worker takes leases from the database
/// clock and does not notice.
#[derive(Debug)]
pub struct ClockSkewNemesis {
    admin: Admin,
    offset_ms: i64,
    skewed: Mutex<Option<String>>,
}

impl ClockSkewNemesis {
    pub fn new(admin: Admin, offset_ms: i64) -> Self {
        ClockSkewNemesis { admin, offset_ms, skewed: Mutex::new(None) }
    }
}

impl Nemesis for ClockSkewNemesis {
    fn name(&self) -> &'static str {
        "clock-skew"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-clock-skew", "stop-clock-skew")
    }
    fn targets(&self) -> Vec<String> {
        self.admin.workers.iter().map(|(n, _)| n.clone()).collect()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            put(&self.skewed, target.to_owned());
            self.admin.set(target, json!({"clock_offset_ms": self.offset_ms})).await
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            match take(&self.skewed) {
                Some(worker) => self.admin.set(&worker, json!({"clock_offset_ms": 0})).await,
                None => Ok(()),
            }
        })
    }
}

/// Faults active now, for progress lines and `haunt_fault_active`.
#[derive(Debug, Default)]
pub struct ActiveFaults {
    active: Mutex<Vec<(String, String)>>,
    metrics: Option<Arc<haunt_telemetry::metrics::HarnessMetrics>>,
}

impl ActiveFaults {
    pub fn with_metrics(metrics: Arc<haunt_telemetry::metrics::HarnessMetrics>) -> Self {
        ActiveFaults { active: Mutex::default(), metrics: Some(metrics) }
    }

    fn set(&self, fault: &str, target: &str, on: bool) {
        if let Some(m) = &self.metrics {
            let labels = haunt_telemetry::metrics::FaultLabels { fault: fault.to_owned(), target: target.to_owned() };
            m.fault_active.get_or_create(&labels).set(i64::from(on));
        }
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        active.retain(|(f, t)| !(f == fault && t == target));
        if on {
            active.push((fault.to_owned(), target.to_owned()));
        }
    }

    pub fn list(&self) -> Vec<(String, String)> {
        self.active.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Debug, Clone)]
pub struct ScheduleOptions {
    /// Mean time between the end of one fault and the start of the next.
    pub interval: Duration,
    pub seed: u64,
    /// No fault starts after this; one that is active is stopped by then.
    pub deadline: Instant,
}

/// Records one nemesis action as two ops (before and after), the value naming
/// the target and, after, the result.
async fn act(recorder: &Recorder, f: &str, target: &str, action: impl Future<Output = anyhow::Result<()>>) -> bool {
    recorder.nemesis(f, json!({"target": target}));
    let result = action.await;
    let (ok, outcome) = match &result {
        Ok(()) => (true, "ok".to_owned()),
        Err(e) => (false, format!("error: {e:#}")),
    };
    if !ok {
        tracing::warn!(f, target, %outcome, "nemesis action failed");
    }
    recorder.nemesis(f, json!({"target": target, "result": outcome}));
    ok
}

/// Sleeps until `at` unless stopped first; true if it slept the whole way.
async fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    // Checks the stop flag every 50 ms: Ctrl-C must not wait out a long hold.
    while Instant::now() < at {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep((at - Instant::now()).min(Duration::from_millis(50))).await;
    }
    !stop.load(Ordering::Relaxed)
}

/// Runs faults one at a time from a seeded schedule until the deadline or
/// `stop`, and leaves every fault stopped.
///
/// With `at_once` above one, that many schedules run side by side, each over
/// its own share of the fault kinds (dealt round-robin), so faults of different
/// kinds overlap: a pause during database errors, say. A kind is never active
/// twice at once.
pub async fn run_schedule(
    nemeses: &[Box<dyn Nemesis>],
    recorder: &Recorder,
    active: &ActiveFaults,
    options: ScheduleOptions,
    at_once: usize,
    stop: &AtomicBool,
) {
    let usable: Vec<&dyn Nemesis> = nemeses.iter().filter(|n| !n.targets().is_empty()).map(|n| n.as_ref()).collect();
    let lanes = at_once.clamp(1, usable.len().max(1));
    let schedules = (0..lanes).map(|lane| {
        let share: Vec<&dyn Nemesis> = usable.iter().skip(lane).step_by(lanes).copied().collect();
        let options = ScheduleOptions { seed: options.seed.wrapping_add(lane as u64), ..options.clone() };
        one_schedule(share, recorder, active, options, stop)
    });
    futures_util::future::join_all(schedules).await;
}

async fn one_schedule(
    usable: Vec<&dyn Nemesis>,
    recorder: &Recorder,
    active: &ActiveFaults,
    options: ScheduleOptions,
    stop: &AtomicBool,
) {
    if usable.is_empty() {
        return;
    }
    let mut rng = Rng::new(options.seed);
    let interval_ms = options.interval.as_millis().max(1) as u64;
    let mut round: Vec<usize> = Vec::new();
    loop {
        // Half to one and a half intervals of calm between faults.
        let calm = Duration::from_millis(interval_ms / 2 + rng.below(interval_ms));
        if !sleep_until(Instant::now() + calm, stop).await {
            break;
        }
        // Faults come in rounds, each a fresh shuffle of every enabled kind, so a
        // short run still meets each kind once.
        if round.is_empty() {
            round = (0..usable.len()).collect();
            for i in (1..round.len()).rev() {
                round.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let nemesis = usable[round.pop().expect("refilled above")];
        let targets = nemesis.targets();
        let target = targets[rng.below(targets.len() as u64) as usize].clone();
        let hold = nemesis.hold_min().max(Duration::from_millis(interval_ms / 2 + rng.below(interval_ms)));
        if Instant::now() + hold > options.deadline {
            break;
        }
        let (start_f, stop_f) = nemesis.ops();
        active.set(nemesis.name(), &target, true);
        act(recorder, start_f, &target, nemesis.start(&target)).await;
        sleep_until(Instant::now() + hold, stop).await;
        act(recorder, stop_f, &target, nemesis.stop()).await;
        active.set(nemesis.name(), &target, false);
    }
}

/// Stops every fault, recording each stop. Called at the end of every run.
pub async fn heal_all(nemeses: &[Box<dyn Nemesis>], recorder: &Recorder, active: &ActiveFaults) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    // Pauses first: a paused container cannot be entered to heal its links.
    let mut list = active.list();
    list.sort_by_key(|(fault, _)| fault != "pause");
    for (fault, target) in list {
        if let Some(n) = nemeses.iter().find(|n| n.name() == fault) {
            if !act(recorder, n.ops().1, &target, n.stop()).await {
                failed.push(format!("{fault} on {target}"));
            }
            active.set(&fault, &target, false);
        }
    }
    // Stop the rest too: stop is idempotent, and heal must not trust bookkeeping.
    for n in nemeses {
        if let Err(e) = n.stop().await {
            failed.push(format!("{}: {e:#}", n.name()));
        }
    }
    anyhow::ensure!(failed.is_empty(), "could not heal: {}", failed.join("; "));
    Ok(())
}

/// Slows a link: every chunk through its fault proxy waits `delay`. Longer than
/// the client's timeout, requests commit but their answers come too late, and
/// the client must retry an order whose fate it does not know.
#[derive(Debug)]
pub struct DelayNemesis {
    links: Vec<(String, SharedProxy)>,
    delay: Duration,
}

impl DelayNemesis {
    pub fn new(links: Vec<(String, SharedProxy)>, delay: Duration) -> Self {
        DelayNemesis { links, delay }
    }
}

impl Nemesis for DelayNemesis {
    fn name(&self) -> &'static str {
        "delay"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-delay", "stop-delay")
    }
    fn targets(&self) -> Vec<String> {
        self.links.iter().map(|(n, _)| n.clone()).collect()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let (_, proxy) = self.links.iter().find(|(n, _)| n == target).context("unknown link")?;
            proxy.set(ProxyMode::Delay(self.delay));
            Ok(())
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            for (_, proxy) in &self.links {
                if proxy.mode() != ProxyMode::Partition {
                    proxy.set(ProxyMode::Pass);
                }
            }
            Ok(())
        })
    }
}
