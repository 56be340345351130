//! The faults, and the seeded schedule that runs them.
//!
//! The schedule fires every enabled fault once first, in a seeded order and
//! with calms and holds cut to fit the time limit ([`check_fit`] says before a
//! run whether they can), then picks faults at random. A stop that fails leaves
//! its fault active and is retried until it takes effect. [`Faults`] owns a
//! run's nemeses and heals, on drop, whatever is still broken.
//!
//! **Invariant:** the nemesis never reads the history; it only appends its own
//! start and stop ops to it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use haunt_store::Rng;
use serde_json::json;
use tokio::time::Instant;

use crate::backends::proxy::{ProxyMode, SharedProxy};
use crate::core::fault::Fault;
use crate::core::history::Recorder;
use crate::core::roles::{Backend, BoxFuture, Nemesis, Node};

/// A network link the partition nemesis can cut: a fault proxy (local backend)
/// or iptables rules in a container's network namespace (Docker backend).
pub trait Link: Send + Sync + std::fmt::Debug {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// Restores the link. Idempotent: healing a whole link is always safe.
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// [`Link::heal`] without a runtime, for [`Nemesis::heal_blocking`].
    fn heal_blocking(&self);
}

pub type SharedLink = Arc<dyn Link>;

impl Link for crate::backends::proxy::FaultProxy {
    fn cut(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.set(ProxyMode::Partition);
        Box::pin(async { Ok(()) })
    }
    fn heal(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Link::heal_blocking(self);
        Box::pin(async { Ok(()) })
    }
    fn heal_blocking(&self) {
        // A delay on the same proxy is another nemesis's to heal.
        if self.mode() == ProxyMode::Partition {
            self.set(ProxyMode::Pass);
        }
    }
}

// The slot of a fault's target is emptied only once its stop has worked: a
// failed stop must leave the next one something to heal.

fn peek<T: Clone>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn put<T>(slot: &Mutex<Option<T>>, value: T) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
}

fn clear<T>(slot: &Mutex<Option<T>>) {
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// Aims a kill or a pause of a worker at a batch in flight. A worker is idle
/// most of the time at a modest rate, and a blind SIGKILL then finds no lease
/// in hand and leaves no trace: in five runs of the main job, none of its nine
/// kills and pauses of workers left one. So every other such fault of a kind
/// (the kill's count and the pause's are their own, whichever worker they hit),
/// starting with the first, first asks the worker to hold its next batch at its
/// hold point (its effect committed and its ack not sent; with the ack in the
/// apply's transaction, its lease in hand; with the ack sent on receipt, acked
/// and not applied), waits for it, then acts. The others stay blind, to land
/// wherever the worker happens to be (inside a transaction, between batches).
/// A worker without an admin endpoint (a user's system) is always hit blind, as
/// is one that has no batch within [`Aim::WAIT`].
#[derive(Debug)]
pub struct Aim {
    admin: Admin,
    /// How long the batch holds still (see [`Aim::new`]).
    hold: Duration,
    shots: std::sync::atomic::AtomicU64,
    /// The last aimed shot's answer, until the history takes it.
    last: Mutex<Option<serde_json::Value>>,
}

impl Aim {
    /// How long a fault waits for a batch before it acts anyway. With the
    /// answer's margin it stays within [`ACT_ALLOWANCE`], so an aimed fault
    /// fits the schedule a blind one fits: a worker polls an empty queue every
    /// 50 ms, and at the default rate one of its loops has a batch within a
    /// few polls.
    const WAIT: Duration = Duration::from_millis(250);
    /// How late the answer may come after [`Aim::WAIT`] on a worker that
    /// answers at all (one paused by another fault does not).
    const ANSWER_MARGIN: Duration = Duration::from_millis(150);

    /// `visibility_timeout`: the lease the held batch has in hand. The hold
    /// only bridges the moments between the worker's answer and the signal,
    /// and lasts a third of the lease (at most a second), so that a hold no
    /// fault follows (a kill that failed) ends with the lease still valid: the
    /// batch then acks as usual, and any redelivery in the window is the
    /// fault's doing, not the hold's.
    pub fn new(admin: Admin, visibility_timeout: Duration) -> Self {
        let hold = (visibility_timeout / 3).clamp(Duration::from_millis(1), Duration::from_secs(1));
        Aim { admin, hold, shots: Default::default(), last: Mutex::new(None) }
    }

    /// Whether this shot is aimed: the first of each kind and every other after it.
    fn takes_aim(&self) -> bool {
        self.shots.fetch_add(1, Ordering::Relaxed).is_multiple_of(2)
    }

    /// Before a fault on `target`: whether a batch of it now holds still.
    /// An aimed shot's answer is kept for [`Nemesis::take_aim`].
    async fn at_batch(aim: Option<&Aim>, target: &str) -> bool {
        let Some(aim) = aim.filter(|a| a.admin.has(target)) else { return false };
        if !aim.takes_aim() {
            return false;
        }
        let answer = match aim.admin.hold(target, Aim::WAIT, Aim::ANSWER_MARGIN, aim.hold).await {
            Ok(answer) => answer,
            // A worker that does not answer (already down, paused) is hit blind.
            Err(e) => {
                tracing::info!(target, error = %e, "no hold; the fault lands blind");
                json!({"held": false})
            }
        };
        let held = answer["held"] == json!(true);
        put(&aim.last, answer);
        held
    }

    fn take(aim: Option<&Aim>) -> Option<serde_json::Value> {
        aim.and_then(|a| a.last.lock().unwrap_or_else(|p| p.into_inner()).take())
    }
}

/// SIGKILL a node, later start it again.
#[derive(Debug)]
pub struct KillNemesis {
    name: &'static str,
    backend: Arc<dyn Backend>,
    targets: Vec<Node>,
    aim: Option<Aim>,
    killed: Mutex<Option<Node>>,
}

impl KillNemesis {
    /// `aim`: to aim kills of workers at a batch in flight (see [`Aim`]).
    pub fn new(backend: Arc<dyn Backend>, targets: Vec<Node>, aim: Option<Aim>) -> Self {
        KillNemesis { aim, ..KillNemesis::named("kill", backend, targets) }
    }

    /// The same fault under another `--nemesis` name: `db-restart` is a kill
    /// of the database node, a container or a server of its own.
    pub fn named(name: &'static str, backend: Arc<dyn Backend>, targets: Vec<Node>) -> Self {
        KillNemesis { name, backend, targets, aim: None, killed: Mutex::new(None) }
    }
}

impl Nemesis for KillNemesis {
    fn name(&self) -> &'static str {
        self.name
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("kill", "restart")
    }
    fn targets(&self) -> Vec<String> {
        self.targets.iter().map(|n| n.name.clone()).collect()
    }
    fn take_aim(&self) -> Option<serde_json::Value> {
        Aim::take(self.aim.as_ref())
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let node = self.targets.iter().find(|n| n.name == target).context("unknown target")?.clone();
            Aim::at_batch(self.aim.as_ref(), target).await;
            put(&self.killed, node.clone());
            self.backend.kill(&node).await
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let Some(node) = peek(&self.killed) else { return Ok(()) };
            self.backend.start(&node).await?;
            clear(&self.killed);
            Ok(())
        })
    }
    /// A killed node the backend owns ends with the backend, and starting it
    /// only to end it helps no one; one that outlives the run (a database
    /// server the harness does not own) the backend brings back.
    fn heal_blocking(&self) {
        if let Some(node) = peek(&self.killed) {
            self.backend.restore_blocking(&node);
        }
    }
}

/// SIGSTOP a worker for longer than the visibility timeout: when it resumes it
/// is a zombie holding an expired lease.
#[derive(Debug)]
pub struct PauseNemesis {
    backend: Arc<dyn Backend>,
    targets: Vec<Node>,
    hold_min: Duration,
    aim: Option<Aim>,
    paused: Mutex<Option<Node>>,
}

impl PauseNemesis {
    /// `aim`: as for [`KillNemesis::new`]. An aimed pause stops a worker
    /// whose batch has applied and not acked; it resumes a zombie, its lease
    /// long expired and its messages delivered again elsewhere.
    pub fn new(backend: Arc<dyn Backend>, targets: Vec<Node>, visibility_timeout: Duration, aim: Option<Aim>) -> Self {
        let hold_min = Fault::Pause.hold_min(visibility_timeout);
        PauseNemesis { backend, targets, hold_min, aim, paused: Mutex::new(None) }
    }
}

impl Nemesis for PauseNemesis {
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
    fn take_aim(&self) -> Option<serde_json::Value> {
        Aim::take(self.aim.as_ref())
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let node = self.targets.iter().find(|n| n.name == target).context("unknown target")?.clone();
            Aim::at_batch(self.aim.as_ref(), target).await;
            put(&self.paused, node.clone());
            self.backend.pause(&node).await
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let Some(node) = peek(&self.paused) else { return Ok(()) };
            if self.backend.is_running(&node) {
                self.backend.resume(&node).await?;
            }
            clear(&self.paused);
            Ok(())
        })
    }
    /// SIGCONT (or `docker unpause`): a stopped process outlives a harness
    /// that is not its parent, and holds its leases and connections meanwhile.
    fn heal_blocking(&self) {
        if let Some(node) = peek(&self.paused) {
            match self.backend.resume_blocking(&node) {
                Ok(()) => clear(&self.paused),
                Err(e) => eprintln!("haunt: resuming {}: {e:#}", node.name),
            }
        }
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
    fn heal_blocking(&self) {
        for (_, link) in &self.links {
            link.heal_blocking();
        }
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

    fn base(&self, worker: &str) -> anyhow::Result<&str> {
        let (_, base) = self.workers.iter().find(|(n, _)| n == worker).context("unknown worker")?;
        Ok(base)
    }

    /// Whether `node` is one of these workers.
    pub fn has(&self, node: &str) -> bool {
        self.workers.iter().any(|(n, _)| n == node)
    }

    /// Asks `worker` to hold its next batch at its hold point (`POST
    /// /admin/hold`, see `haunt_worker::Faults::hold_next`) and waits for
    /// the worker's answer: `{"held": true, "point": …, "messages": …}`
    /// once a batch holds still there for `hold`, `{"held": false}` when none
    /// came within `wait`; an error when no answer came within `wait + margin`.
    pub async fn hold(
        &self,
        worker: &str,
        wait: Duration,
        margin: Duration,
        hold: Duration,
    ) -> anyhow::Result<serde_json::Value> {
        let base = self.base(worker)?;
        let body = json!({"wait_ms": wait.as_millis() as u64, "hold_ms": hold.as_millis() as u64});
        let r = self
            .http
            .post(format!("{base}/admin/hold"))
            .bearer_auth(&self.token)
            .json(&body)
            // The answer comes after up to `wait`: past the client's usual bound.
            .timeout(wait + margin)
            .send()
            .await
            .with_context(|| format!("asking {worker} to hold a batch"))?;
        anyhow::ensure!(r.status().is_success(), "{worker} refused the hold: {}", r.status());
        r.json().await.with_context(|| format!("{worker}'s answer to a hold"))
    }

    pub async fn set(&self, worker: &str, settings: serde_json::Value) -> anyhow::Result<()> {
        let base = self.base(worker)?;
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
    /// The rate the workers run with outside the fault's windows
    /// (`--ack-fail-rate`), which a stop restores.
    background: f64,
}

impl AckLossNemesis {
    pub fn new(admin: Admin, rate: f64, background: f64) -> Self {
        AckLossNemesis { admin, rate: rate.max(background), background }
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
        Box::pin(async move { self.admin.set_all(json!({"ack_fail_rate": self.background})).await })
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
    switch: WorkerSwitch,
}

impl ClockSkewNemesis {
    pub fn new(admin: Admin, offset_ms: i64) -> Self {
        let switch = WorkerSwitch::new(admin, json!({"clock_offset_ms": offset_ms}), json!({"clock_offset_ms": 0}));
        ClockSkewNemesis { switch }
    }
}

/// An admin switch flipped on one worker at a time: on at the start, off at
/// the stop, and the worker forgotten only once the stop took effect (a stop
/// that failed is tried again on the same worker).
#[derive(Debug)]
struct WorkerSwitch {
    admin: Admin,
    on: serde_json::Value,
    off: serde_json::Value,
    target: Mutex<Option<String>>,
}

impl WorkerSwitch {
    fn new(admin: Admin, on: serde_json::Value, off: serde_json::Value) -> Self {
        WorkerSwitch { admin, on, off, target: Mutex::new(None) }
    }

    fn targets(&self) -> Vec<String> {
        self.admin.workers.iter().map(|(n, _)| n.clone()).collect()
    }

    async fn start(&self, worker: &str) -> anyhow::Result<()> {
        put(&self.target, worker.to_owned());
        self.admin.set(worker, self.on.clone()).await
    }

    async fn stop(&self) -> anyhow::Result<()> {
        let Some(worker) = peek(&self.target) else { return Ok(()) };
        self.admin.set(&worker, self.off.clone()).await?;
        clear(&self.target);
        Ok(())
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
        self.switch.targets()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.switch.start(target))
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.switch.stop())
    }
}

/// Stalls one worker right after its next lease that returns messages, for
/// twice the visibility timeout: a GC pause or a swapped-out process at the
/// worst moment. Unlike `pause`, which stops a process whatever it is doing,
/// the stall always leaves a zombie with a lease in hand: another worker takes
/// its messages over, and the zombie wakes up and carries on with them. A
/// correct worker's apply finds its lease gone and writes nothing.
#[derive(Debug)]
pub struct StallNemesis {
    visibility_timeout: Duration,
    /// Off disarms a stall that never met a lease; one under way runs out by
    /// itself (the window's hold covers it).
    switch: WorkerSwitch,
}

impl StallNemesis {
    pub fn new(admin: Admin, visibility_timeout: Duration) -> Self {
        // Twice the lease: another worker has time to take the messages over.
        let on = json!({"stall_after_lease_ms": (visibility_timeout * 2).as_millis() as u64});
        StallNemesis { visibility_timeout, switch: WorkerSwitch::new(admin, on, json!({"stall_after_lease_ms": 0})) }
    }
}

impl Nemesis for StallNemesis {
    fn name(&self) -> &'static str {
        "stall"
    }
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-stall", "stop-stall")
    }
    fn targets(&self) -> Vec<String> {
        self.switch.targets()
    }
    fn hold_min(&self) -> Duration {
        Fault::Stall.hold_min(self.visibility_timeout)
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(self.switch.start(target))
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.switch.stop())
    }
}

/// A fault whose targets are narrowed to those named by `--fault-targets`
/// (when it has any of them): `delay` on `client<->api` only, say, to make the
/// client retry, rather than on a database link.
pub struct OnlyTargets {
    inner: Box<dyn Nemesis>,
    allowed: Vec<String>,
}

impl std::fmt::Debug for OnlyTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnlyTargets").field("fault", &self.inner.name()).field("allowed", &self.allowed).finish()
    }
}

impl OnlyTargets {
    /// Wraps `inner` if some of its targets are in `allowed`; a fault with none
    /// of them keeps all of its own.
    pub fn wrap(inner: Box<dyn Nemesis>, allowed: &[String]) -> Box<dyn Nemesis> {
        if inner.targets().iter().any(|t| allowed.contains(t)) {
            Box::new(OnlyTargets { inner, allowed: allowed.to_vec() })
        } else {
            inner
        }
    }
}

impl Nemesis for OnlyTargets {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn ops(&self) -> (&'static str, &'static str) {
        self.inner.ops()
    }
    fn targets(&self) -> Vec<String> {
        self.inner.targets().into_iter().filter(|t| self.allowed.contains(t)).collect()
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        self.inner.start(target)
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.inner.stop()
    }
    fn hold_min(&self) -> Duration {
        self.inner.hold_min()
    }
    fn take_aim(&self) -> Option<serde_json::Value> {
        self.inner.take_aim()
    }
    fn heal_blocking(&self) {
        self.inner.heal_blocking()
    }
}

/// The shortest hold of a fault that names none of its own: long enough for a
/// few client ops and a lease to meet it.
pub const HOLD_MIN_DEFAULT: Duration = Duration::from_millis(500);

/// Time allowed for starting and stopping one fault, in [`check_fit`] and in
/// the first round's plan. Locally a signal, a proxy switch or an admin call
/// takes milliseconds, an aimed kill or pause waits up to 0.4 s for a batch
/// ([`Aim`]), restarting a killed node a few; a PostgreSQL restart
/// (crash recovery) takes longer and borrows from the round's slack.
pub const ACT_ALLOWANCE: Duration = Duration::from_millis(500);

/// How long after its hold the fault in a failed stop's way stops itself: a
/// signal or a proxy switch at once, an admin call within its 2 s timeout, a
/// PostgreSQL restart within pg_ctl's ten tries (about 10 s).
const STOP_RETRY_MARGIN: Duration = Duration::from_secs(15);

/// The first wait between stop attempts, doubled after each failure up to
/// [`STOP_RETRY_WAIT_MAX`]: a resumed worker answers within milliseconds, and
/// each second of waiting is a second the fault stays on after its window.
const STOP_RETRY_WAIT_MIN: Duration = Duration::from_millis(200);
const STOP_RETRY_WAIT_MAX: Duration = Duration::from_secs(2);

/// The durations of a schedule, from `--nemesis-interval-s`: before each fault
/// a calm of half to one and a half intervals, then a hold as long (at least
/// the fault's own [`Nemesis::hold_min`]).
#[derive(Debug, Clone, Copy)]
struct Timing {
    interval: Duration,
}

impl Timing {
    fn calm_min(self) -> Duration {
        self.interval / 2
    }

    fn hold_floor(self, hold_min: Duration) -> Duration {
        hold_min.max(self.interval / 2)
    }

    fn hold_max(self, hold_min: Duration) -> Duration {
        hold_min.max(self.interval * 3 / 2)
    }

    /// The least one fault takes: its calm, its hold, its start and stop.
    fn cost_min(self, hold_min: Duration) -> Duration {
        self.calm_min() + self.hold_floor(hold_min) + ACT_ALLOWANCE
    }
}

/// Deals fault kinds, by their least cost, to `at_once` lanes: costliest
/// first, each to the lane with the least so far, so that the lanes' first
/// rounds are about as long. Returns indices into `costs`, ascending per lane.
fn deal(costs: &[Duration], at_once: usize) -> Vec<Vec<usize>> {
    let lanes = at_once.clamp(1, costs.len().max(1));
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(costs[i]));
    let mut out = vec![Vec::new(); lanes];
    let mut load = vec![Duration::ZERO; lanes];
    for i in order {
        let lane = (0..lanes).min_by_key(|&l| load[l]).unwrap_or(0);
        out[lane].push(i);
        load[lane] += costs[i];
    }
    for lane in &mut out {
        lane.sort_unstable();
    }
    out
}

/// The time the longest lane needs to fire each of its kinds once.
fn first_round_min(hold_mins: &[Duration], interval: Duration, at_once: usize) -> Duration {
    let timing = Timing { interval };
    let costs: Vec<Duration> = hold_mins.iter().map(|&h| timing.cost_min(h)).collect();
    deal(&costs, at_once).iter().map(|lane| lane.iter().map(|&i| costs[i]).sum()).max().unwrap_or_default()
}

/// Why a run's time limit cannot fire every enabled fault once, and what would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// The least time limit that fires every fault once.
    pub needed: Duration,
    /// The faults that fit the time limit: each of the given ones, in order,
    /// that still fits with those taken before it.
    pub fitting: Vec<String>,
}

/// Whether `time_limit` fits one round of every fault in `kinds` (name and
/// shortest hold): the calm before each, its hold and [`ACT_ALLOWANCE`], with
/// the kinds dealt among `at_once` schedules as [`run_schedule`] deals them.
pub fn check_fit(
    kinds: &[(&str, Duration)],
    interval: Duration,
    at_once: usize,
    time_limit: Duration,
) -> Result<(), Unfit> {
    let holds: Vec<Duration> = kinds.iter().map(|(_, h)| *h).collect();
    let needed = first_round_min(&holds, interval, at_once);
    if needed <= time_limit {
        return Ok(());
    }
    let mut fitting: Vec<(&str, Duration)> = Vec::new();
    for &kind in kinds {
        let mut with = fitting.clone();
        with.push(kind);
        let holds: Vec<Duration> = with.iter().map(|(_, h)| *h).collect();
        if first_round_min(&holds, interval, at_once) <= time_limit {
            fitting = with;
        }
    }
    Err(Unfit { needed, fitting: fitting.into_iter().map(|(n, _)| n.to_owned()).collect() })
}

/// Faults active now, for progress lines and `haunt_fault_active`. A fault
/// stays here until a stop of it has taken effect.
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

/// How long a failed stop is retried: past the longest hold any fault of the
/// run can have, since the fault in its way (a pause of the worker whose admin
/// switch it must reach) ends by then, plus [`STOP_RETRY_MARGIN`] for that
/// fault's own stop.
pub fn stop_retry_for(nemeses: &[Box<dyn Nemesis>], interval: Duration) -> Duration {
    let timing = Timing { interval };
    nemeses.iter().map(|n| timing.hold_max(n.hold_min())).max().unwrap_or_default() + STOP_RETRY_MARGIN
}

/// How often each enabled fault started, in the order of the nemeses given to
/// [`run_schedule`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    pub fired: Vec<(String, u32)>,
}

impl Coverage {
    /// The enabled faults that never started.
    pub fn never_fired(&self) -> Vec<String> {
        self.fired.iter().filter(|(_, n)| *n == 0).map(|(f, _)| f.clone()).collect()
    }

    pub fn counts(&self) -> BTreeMap<String, u32> {
        let mut out = BTreeMap::new();
        for (f, n) in &self.fired {
            *out.entry(f.clone()).or_default() += n;
        }
        out
    }
}

/// Records one nemesis action as two ops (before and after), the value naming
/// the target and, after, the result: `ok`, or `error: …`.
async fn act(
    recorder: &Recorder,
    f: &str,
    target: &str,
    action: impl Future<Output = anyhow::Result<()>>,
    aim: impl FnOnce() -> Option<serde_json::Value>,
) -> bool {
    recorder.nemesis(f, json!({"target": target}));
    let result = action.await;
    let (ok, outcome) = match &result {
        Ok(()) => (true, "ok".to_owned()),
        Err(e) => (false, format!("error: {e:#}")),
    };
    if !ok {
        tracing::warn!(f, target, %outcome, "nemesis action failed");
    }
    let mut value = json!({"target": target, "result": outcome});
    if let Some(aim) = aim() {
        value["aim"] = aim;
    }
    recorder.nemesis(f, value);
    ok
}

/// Stops a fault, again and again until a stop takes effect, `retry_for` has
/// passed, or `stop` is set. Every attempt is recorded; the fault stays in
/// `active` until one succeeds. True if it was healed.
async fn stop_until_healed(
    nemesis: &dyn Nemesis,
    target: &str,
    recorder: &Recorder,
    active: &ActiveFaults,
    retry_for: Duration,
    stop: &AtomicBool,
) -> bool {
    let give_up_at = Instant::now() + retry_for;
    let mut wait = STOP_RETRY_WAIT_MIN;
    loop {
        if act(recorder, nemesis.ops().1, target, nemesis.stop(), || None).await {
            active.set(nemesis.name(), target, false);
            return true;
        }
        if stop.load(Ordering::Relaxed) || Instant::now() + wait > give_up_at {
            return false;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(STOP_RETRY_WAIT_MAX);
    }
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

/// Runs faults from a seeded schedule until the deadline or `stop`: first every
/// fault once, in a seeded order, with calms and holds cut so that the round
/// fits before the deadline (when [`check_fit`] passed), then faults picked at
/// random. Returns how often each started.
///
/// With `at_once` above one, that many schedules run side by side, each over
/// its share of the fault kinds (dealt by [`deal`]), so faults of different
/// kinds overlap: a pause during database errors, say. A kind is never active
/// twice at once. A fault whose stop never took effect is left in `active`
/// for [`heal_all`], and its schedule starts nothing more.
pub async fn run_schedule(
    nemeses: &[Box<dyn Nemesis>],
    recorder: &Recorder,
    active: &ActiveFaults,
    options: ScheduleOptions,
    at_once: usize,
    stop: &AtomicBool,
) -> Coverage {
    let timing = Timing { interval: options.interval };
    let usable: Vec<usize> = (0..nemeses.len()).filter(|&i| !nemeses[i].targets().is_empty()).collect();
    let costs: Vec<Duration> = usable.iter().map(|&i| timing.cost_min(nemeses[i].hold_min())).collect();
    let retry_for = stop_retry_for(nemeses, options.interval);
    let schedules = deal(&costs, at_once).into_iter().enumerate().map(|(lane, share)| {
        let share: Vec<usize> = share.into_iter().map(|k| usable[k]).collect();
        let options = ScheduleOptions { seed: options.seed.wrapping_add(lane as u64), ..options.clone() };
        async move {
            let kinds: Vec<&dyn Nemesis> = share.iter().map(|&i| nemeses[i].as_ref()).collect();
            let fired = one_schedule(&kinds, recorder, active, options, retry_for, stop).await;
            share.into_iter().zip(fired).collect::<Vec<_>>()
        }
    });
    let mut fired = vec![0u32; nemeses.len()];
    for (i, n) in futures_util::future::join_all(schedules).await.into_iter().flatten() {
        fired[i] = n;
    }
    Coverage { fired: nemeses.iter().zip(fired).map(|(n, c)| (n.name().to_owned(), c)).collect() }
}

/// One lane of [`run_schedule`]. Returns how often each of `kinds` started.
async fn one_schedule(
    kinds: &[&dyn Nemesis],
    recorder: &Recorder,
    active: &ActiveFaults,
    options: ScheduleOptions,
    retry_for: Duration,
    stop: &AtomicBool,
) -> Vec<u32> {
    let mut fired = vec![0u32; kinds.len()];
    if kinds.is_empty() {
        return fired;
    }
    let timing = Timing { interval: options.interval };
    let spread_ms = options.interval.as_millis().max(1) as u64;
    let mut rng = Rng::new(options.seed);
    // The first round, popped from the end: every kind once, in a seeded order.
    let mut first_round: Vec<usize> = (0..kinds.len()).collect();
    for i in (1..first_round.len()).rev() {
        first_round.swap(i, rng.below(i as u64 + 1) as usize);
    }
    loop {
        let in_first_round = !first_round.is_empty();
        let k = first_round.pop().unwrap_or_else(|| rng.below(kinds.len() as u64) as usize);
        let nemesis = kinds[k];
        let mut calm_extra = Duration::from_millis(rng.below(spread_ms));
        let mut hold_extra = Duration::from_millis(rng.below(spread_ms));
        if in_first_round {
            // What the rest of the round needs at least stays free; of the time
            // left over, this fault's random part takes at most its share.
            let rest: Duration = first_round.iter().map(|&r| timing.cost_min(kinds[r].hold_min())).sum();
            let left = options.deadline.saturating_duration_since(Instant::now());
            let slack = left.saturating_sub(rest + timing.cost_min(nemesis.hold_min()));
            let share = slack / (first_round.len() as u32 + 1);
            let extra = calm_extra + hold_extra;
            if extra > share {
                let scale = share.as_secs_f64() / extra.as_secs_f64();
                calm_extra = calm_extra.mul_f64(scale);
                hold_extra = hold_extra.mul_f64(scale);
            }
        }
        let calm = timing.calm_min() + calm_extra;
        let hold = nemesis.hold_min().max(options.interval / 2 + hold_extra);
        if Instant::now() + calm + hold > options.deadline {
            // A shorter fault of the first round may still fit; after it, the
            // run is over for this schedule.
            if in_first_round {
                continue;
            }
            break;
        }
        if !sleep_until(Instant::now() + calm, stop).await {
            break;
        }
        let targets = nemesis.targets();
        let target = targets[rng.below(targets.len() as u64) as usize].clone();
        let (start_f, _) = nemesis.ops();
        active.set(nemesis.name(), &target, true);
        if act(recorder, start_f, &target, nemesis.start(&target), || nemesis.take_aim()).await {
            fired[k] += 1;
        }
        sleep_until(Instant::now() + hold, stop).await;
        if !stop_until_healed(nemesis, &target, recorder, active, retry_for, stop).await {
            if !stop.load(Ordering::Relaxed) {
                tracing::warn!(fault = nemesis.name(), %target, ?retry_for, "the fault's stop never took effect");
            }
            break;
        }
    }
    fired
}

/// Stops every fault, recording each attempt, retrying a failed stop for
/// `retry_for` (see [`stop_retry_for`]). Called at the end of every run that
/// gets that far; [`Faults`] covers the others.
pub async fn heal_all(
    nemeses: &[Box<dyn Nemesis>],
    recorder: &Recorder,
    active: &ActiveFaults,
    retry_for: Duration,
) -> anyhow::Result<()> {
    // The end of the run must heal: nothing stops these retries but their bound.
    let never = AtomicBool::new(false);
    let mut failed = Vec::new();
    // Pauses first: a paused process cannot take the admin call that heals its
    // other faults, nor can a paused container be entered to heal its links.
    let mut list = active.list();
    list.sort_by_key(|(fault, _)| fault != "pause");
    for (fault, target) in list {
        if let Some(n) = nemeses.iter().find(|n| n.name() == fault)
            && !stop_until_healed(n.as_ref(), &target, recorder, active, retry_for, &never).await
        {
            failed.push(format!("{fault} on {target}"));
        }
    }
    // Stop the rest too: stop is idempotent, and heal must not trust
    // bookkeeping. Retried like any stop: a worker just restarted by the kill
    // fault's heal refuses its admin call until it listens again.
    for n in nemeses {
        let deadline = Instant::now() + retry_for;
        let mut wait = STOP_RETRY_WAIT_MIN;
        loop {
            match n.stop().await {
                Ok(()) => break,
                Err(e) if Instant::now() + wait > deadline => {
                    failed.push(format!("{}: {e:#}", n.name()));
                    break;
                }
                Err(_) => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(STOP_RETRY_WAIT_MAX);
                }
            }
        }
    }
    anyhow::ensure!(failed.is_empty(), "could not heal: {}", failed.join("; "));
    Ok(())
}

/// A run's nemeses, owning the faults they start: dropping it heals,
/// synchronously, whatever is still broken ([`Nemesis::heal_blocking`]), so a
/// fault is healed on every path out of a run, a panic or an early `?`
/// included, not only on the one that reaches [`heal_all`]. On that one the
/// drop finds nothing left to do.
pub struct Faults {
    nemeses: Vec<Box<dyn Nemesis>>,
}

impl Faults {
    pub fn new(nemeses: Vec<Box<dyn Nemesis>>) -> Faults {
        Faults { nemeses }
    }
}

impl std::ops::Deref for Faults {
    type Target = [Box<dyn Nemesis>];
    fn deref(&self) -> &Self::Target {
        &self.nemeses
    }
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.nemeses.iter().map(|n| n.name())).finish()
    }
}

impl Drop for Faults {
    fn drop(&mut self) {
        // Pauses first, as in heal_all.
        let (pauses, rest): (Vec<_>, Vec<_>) = self.nemeses.iter().partition(|n| n.name() == "pause");
        for n in pauses.into_iter().chain(rest) {
            n.heal_blocking();
        }
    }
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
        self.heal_blocking();
        Box::pin(async { Ok(()) })
    }
    fn heal_blocking(&self) {
        for (_, proxy) in &self.links {
            // A partition on the same proxy is another nemesis's to heal.
            if proxy.mode() != ProxyMode::Partition {
                proxy.set(ProxyMode::Pass);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::backends::local::{LocalBackend, NodeSpec, worker_node};

    /// A fault that only counts. Its stop fails `stop_failures` times before
    /// it takes effect, and notes at each attempt whether the fault was still
    /// listed as active. Starting and stopping take `act` (of tokio's clock).
    struct Fake {
        name: &'static str,
        hold_min: Duration,
        act: Duration,
        stop_failures: AtomicU32,
        active: Arc<ActiveFaults>,
        /// Each stop attempt: when, whether the fault was listed as active.
        stops: Arc<Mutex<Vec<(Instant, bool)>>>,
    }

    impl Fake {
        fn new(name: &'static str, hold_min: Duration, active: &Arc<ActiveFaults>) -> Fake {
            Fake {
                name,
                hold_min,
                act: Duration::ZERO,
                stop_failures: AtomicU32::new(0),
                active: active.clone(),
                stops: Arc::default(),
            }
        }
    }

    impl Nemesis for Fake {
        fn name(&self) -> &'static str {
            self.name
        }
        fn ops(&self) -> (&'static str, &'static str) {
            ("start-fake", "stop-fake")
        }
        fn targets(&self) -> Vec<String> {
            vec!["t".into()]
        }
        fn hold_min(&self) -> Duration {
            self.hold_min
        }
        fn start<'a>(&'a self, _target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move {
                tokio::time::sleep(self.act).await;
                Ok(())
            })
        }
        fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
            Box::pin(async move {
                tokio::time::sleep(self.act).await;
                let listed = self.active.list().iter().any(|(f, t)| f == self.name && t == "t");
                self.stops.lock().unwrap().push((Instant::now(), listed));
                let left = self.stop_failures.load(Ordering::Relaxed);
                if left > 0 {
                    self.stop_failures.store(left - 1, Ordering::Relaxed);
                    anyhow::bail!("timed out");
                }
                Ok(())
            })
        }
    }

    fn fakes(list: Vec<Fake>) -> Vec<Box<dyn Nemesis>> {
        list.into_iter().map(|f| Box::new(f) as Box<dyn Nemesis>).collect()
    }

    fn history(dir: &tempfile::TempDir) -> Vec<haunt_format::Op> {
        let text = std::fs::read_to_string(dir.path().join("h.jsonl")).unwrap();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    fn result_of(op: &haunt_format::Op) -> Option<String> {
        match &op.value {
            haunt_format::OpValue::Other(v) => v.get("result").and_then(|r| r.as_str()).map(str::to_owned),
            _ => None,
        }
    }

    /// A fault that only names its targets.
    struct Named(&'static str, &'static [&'static str]);

    impl Nemesis for Named {
        fn name(&self) -> &'static str {
            self.0
        }
        fn ops(&self) -> (&'static str, &'static str) {
            ("start", "stop")
        }
        fn targets(&self) -> Vec<String> {
            self.1.iter().map(|t| t.to_string()).collect()
        }
        fn start<'a>(&'a self, _target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async { Ok(()) })
        }
        fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
            Box::pin(async { Ok(()) })
        }
    }

    #[test]
    fn only_targets_narrows_the_faults_that_have_them_and_leaves_the_rest() {
        let allowed = vec!["client<->api".to_owned()];
        let delay = OnlyTargets::wrap(Box::new(Named("delay", &["client<->api", "worker-1<->db"])), &allowed);
        assert_eq!(delay.targets(), vec!["client<->api"]);
        assert_eq!(delay.name(), "delay");
        let kill = OnlyTargets::wrap(Box::new(Named("kill", &["api", "worker-1"])), &allowed);
        assert_eq!(kill.targets(), vec!["api", "worker-1"], "no allowed target: all of its own");
    }

    #[tokio::test]
    async fn a_failed_stop_stays_active_and_is_retried_until_it_takes_effect() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
        let active = Arc::new(ActiveFaults::default());
        let f = Fake::new("db-error", HOLD_MIN_DEFAULT, &active);
        f.stop_failures.store(3, Ordering::Relaxed);
        let stops = f.stops.clone();
        let nemeses = fakes(vec![f]);
        // Room for one fault only: 1 s calm and hold at most, then the deadline.
        let options = ScheduleOptions {
            interval: Duration::from_secs(1),
            seed: 1,
            deadline: Instant::now() + Duration::from_secs(4),
        };
        let coverage = run_schedule(&nemeses, &recorder, &active, options, 1, &AtomicBool::new(false)).await;
        recorder.finish().unwrap();
        assert_eq!(coverage.fired, vec![("db-error".to_owned(), 1)]);
        let stops = stops.lock().unwrap().clone();
        assert_eq!(stops.len(), 4, "three failed attempts, then the one that took effect");
        assert!(stops.iter().all(|(_, listed)| *listed), "active until a stop took effect: {stops:?}");
        assert!(active.list().is_empty(), "healed at last");
        let waits: Vec<Duration> = stops.windows(2).map(|w| w[1].0 - w[0].0).collect();
        // The timer rounds each sleep up to its next millisecond tick or two.
        let backoff = [200, 400, 800].map(Duration::from_millis);
        assert!(waits.iter().zip(backoff).all(|(w, b)| *w >= b && *w < b + Duration::from_millis(5)), "{waits:?}");
        // In the history: each attempt is two ops, the failed ones say so, the last is ok.
        let results: Vec<Option<String>> =
            history(&dir).iter().filter(|op| op.f == "stop-fake").map(result_of).collect();
        assert_eq!(results.len(), 8);
        assert!(results.iter().step_by(2).all(Option::is_none), "before ops carry no result");
        let afters: Vec<&str> = results.iter().skip(1).step_by(2).map(|r| r.as_deref().unwrap()).collect();
        assert_eq!(afters, ["error: timed out", "error: timed out", "error: timed out", "ok"]);
    }

    #[tokio::test]
    async fn a_stop_that_never_takes_effect_is_retried_within_its_bound_and_left_to_heal_all() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
        let active = Arc::new(ActiveFaults::default());
        let f = Fake::new("db-error", HOLD_MIN_DEFAULT, &active);
        f.stop_failures.store(u32::MAX, Ordering::Relaxed);
        let stops = f.stops.clone();
        let nemeses = fakes(vec![f]);
        let interval = Duration::from_secs(1);
        let options = ScheduleOptions { interval, seed: 1, deadline: Instant::now() + Duration::from_secs(60) };
        run_schedule(&nemeses, &recorder, &active, options, 1, &AtomicBool::new(false)).await;
        let retry_for = stop_retry_for(&nemeses, interval);
        assert_eq!(retry_for, Duration::from_millis(1500) + STOP_RETRY_MARGIN);
        let stops = stops.lock().unwrap().clone();
        let (first, last) = (stops[0].0, stops[stops.len() - 1].0);
        assert!(last - first <= retry_for && last - first >= retry_for - STOP_RETRY_WAIT_MAX, "{:?}", last - first);
        assert_eq!(active.list(), vec![("db-error".to_owned(), "t".to_owned())], "still active: it never healed");
        // The schedule gave up on it and started nothing more: one start only.
        recorder.flush().unwrap();
        let starts = history(&dir).iter().filter(|op| op.f == "start-fake").count();
        assert_eq!(starts, 2);
        let err = heal_all(&nemeses, &recorder, &active, retry_for).await.unwrap_err();
        assert!(format!("{err:#}").contains("could not heal: db-error on t"), "{err:#}");
        assert_eq!(active.list().len(), 1);
    }

    /// A backend whose `start` fails a given number of times.
    #[derive(Debug, Default)]
    struct FlakyStart {
        failures: AtomicU32,
        starts: AtomicU32,
    }

    impl Backend for FlakyStart {
        fn nodes(&self) -> Vec<Node> {
            vec![worker_node(1)]
        }
        fn start<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move {
                self.starts.fetch_add(1, Ordering::Relaxed);
                let left = self.failures.load(Ordering::Relaxed);
                if left > 0 {
                    self.failures.store(left - 1, Ordering::Relaxed);
                    anyhow::bail!("no");
                }
                Ok(())
            })
        }
        fn stop<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move { Ok(()) })
        }
        fn kill<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move { Ok(()) })
        }
        fn pause<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move { Ok(()) })
        }
        fn resume<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move { Ok(()) })
        }
        fn resume_blocking(&self, _: &Node) -> anyhow::Result<()> {
            Ok(())
        }
        fn is_running(&self, _: &Node) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn a_failed_restart_is_retried_on_the_same_node() {
        let backend = Arc::new(FlakyStart { failures: AtomicU32::new(1), ..FlakyStart::default() });
        let kill = KillNemesis::new(backend.clone(), vec![worker_node(1)], None);
        kill.start("worker-1").await.unwrap();
        assert!(kill.stop().await.is_err());
        kill.stop().await.unwrap();
        assert_eq!(backend.starts.load(Ordering::Relaxed), 2, "the second stop restarted the node again");
        kill.stop().await.unwrap();
        assert_eq!(backend.starts.load(Ordering::Relaxed), 2, "and a healed fault has nothing left to stop");
    }

    #[test]
    fn the_first_shot_of_a_kind_and_every_other_after_it_is_aimed() {
        let admin = Admin::new("t".into(), vec![("worker-1".into(), "http://127.0.0.1:9".into())]).unwrap();
        let aim = Aim::new(admin, Duration::from_secs(2));
        let shots: Vec<bool> = (0..5).map(|_| aim.takes_aim()).collect();
        assert_eq!(shots, [true, false, true, false, true]);
    }

    #[test]
    fn an_aimed_batch_holds_for_a_third_of_its_lease_at_most_a_second() {
        let admin = || Admin::new("t".into(), Vec::new()).unwrap();
        for (lease_ms, hold_ms) in [(300, 100), (1_500, 500), (2_000, 666), (30_000, 1_000), (1, 1)] {
            let aim = Aim::new(admin(), Duration::from_millis(lease_ms));
            assert_eq!(aim.hold.as_millis(), hold_ms, "lease {lease_ms} ms");
        }
        // The wait and the answer's margin stay within what the schedule allows.
        assert!(Aim::WAIT + Aim::ANSWER_MARGIN < ACT_ALLOWANCE);
    }

    /// A worker that does not answer (here, no one listens) is hit blind.
    #[tokio::test]
    async fn a_worker_that_does_not_answer_a_hold_is_hit_blind() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let aim = Aim::new(Admin::new("t".into(), vec![("worker-1".into(), base)]).unwrap(), Duration::from_secs(2));
        assert!(!Aim::at_batch(Some(&aim), "worker-1").await);
        assert_eq!(Aim::take(Some(&aim)), Some(json!({"held": false})), "the history says the aim missed");
        assert_eq!(Aim::take(Some(&aim)), None, "once");
        assert!(!Aim::at_batch(Some(&aim), "worker-2").await, "not one of the workers: blind");
    }

    fn hold(name: &str, visibility_timeout: Duration) -> Duration {
        Fault::from_name(name).expect("a fault's name").hold_min(visibility_timeout)
    }

    /// The seven local faults as fakes: holds as `haunt run` gives them, each
    /// start and stop taking `act`.
    const LOCAL_DEFAULTS: [&str; 7] = ["kill", "pause", "partition", "delay", "ack-loss", "clock-skew", "db-error"];

    fn seven_local_faults(active: &Arc<ActiveFaults>, visibility_timeout: Duration, act: Duration) -> Vec<Fake> {
        LOCAL_DEFAULTS
            .into_iter()
            .map(|name| Fake { act, ..Fake::new(name, hold(name, visibility_timeout), active) })
            .collect()
    }

    #[tokio::test]
    async fn with_the_default_options_every_local_fault_fires_whatever_the_seed() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        // haunt run's defaults: 60 s, --nemesis-interval-s 5, --visibility-timeout-ms 2000.
        let (limit, interval, vt) = (Duration::from_secs(60), Duration::from_secs(5), Duration::from_secs(2));
        let kinds: Vec<(&str, Duration)> = LOCAL_DEFAULTS.iter().map(|&n| (n, hold(n, vt))).collect();
        assert_eq!(check_fit(&kinds, interval, 1, limit), Ok(()));
        for at_once in [1, 2, 3] {
            for seed in 0..40 {
                let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
                let active = Arc::new(ActiveFaults::default());
                let nemeses = fakes(seven_local_faults(&active, vt, Duration::from_millis(50)));
                let options = ScheduleOptions { interval, seed, deadline: Instant::now() + limit };
                let coverage =
                    run_schedule(&nemeses, &recorder, &active, options, at_once, &AtomicBool::new(false)).await;
                assert_eq!(coverage.never_fired(), Vec::<String>::new(), "seed {seed}, {at_once} at once");
                assert!(active.list().is_empty());
            }
        }
    }

    #[tokio::test]
    async fn a_time_limit_that_just_fits_fires_every_fault() {
        tokio::time::pause();
        let dir = tempfile::tempdir().unwrap();
        let (interval, vt) = (Duration::from_secs(1), Duration::from_millis(500));
        let kinds: Vec<(&str, Duration)> = LOCAL_DEFAULTS.iter().map(|&n| (n, hold(n, vt))).collect();
        // Seven faults of 0.5 s calm, 0.5 s hold (pause 1 s) and 0.5 s to act.
        let needed = Duration::from_millis(7 * 1500 + 500);
        assert_eq!(check_fit(&kinds, interval, 1, needed), Ok(()));
        let unfit = check_fit(&kinds, interval, 1, needed - Duration::from_millis(1)).unwrap_err();
        assert_eq!(unfit.needed, needed);
        assert_eq!(unfit.fitting, ["kill", "pause", "partition", "delay", "ack-loss", "clock-skew"]);
        // Two schedules: pause and two others in one (5 s), four in the other (6 s).
        assert_eq!(check_fit(&kinds, interval, 2, Duration::from_secs(6)), Ok(()));
        for seed in 0..40 {
            let recorder = Recorder::create(&dir.path().join("h.jsonl")).unwrap();
            let active = Arc::new(ActiveFaults::default());
            let nemeses = fakes(seven_local_faults(&active, vt, Duration::from_millis(100)));
            let options = ScheduleOptions { interval, seed, deadline: Instant::now() + needed };
            let coverage = run_schedule(&nemeses, &recorder, &active, options, 1, &AtomicBool::new(false)).await;
            assert_eq!(coverage.never_fired(), Vec::<String>::new(), "seed {seed}");
        }
    }

    fn process_state(pid: nix::unistd::Pid) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit_once(')').unwrap().1.trim_start().chars().next().unwrap()
    }

    #[tokio::test]
    async fn a_panic_while_a_worker_is_paused_resumes_it() {
        let dir = tempfile::tempdir().unwrap();
        let node = worker_node(1);
        let spec = NodeSpec::args(node.clone(), vec!["60".into()]);
        let backend = Arc::new(LocalBackend::new("/bin/sleep".into(), dir.path().into(), Vec::new(), vec![spec]));
        backend.start(&node).await.unwrap();
        let pid = backend.pid(&node).unwrap();
        let (task_backend, vt) = (backend.clone(), Duration::from_millis(500));
        let run = tokio::spawn(async move {
            let faults = Faults::new(vec![Box::new(PauseNemesis::new(task_backend, vec![worker_node(1)], vt, None))]);
            faults[0].start("worker-1").await.unwrap();
            assert_eq!(process_state(pid), 'T', "paused");
            panic!("the harness panics mid-fault");
        });
        assert!(run.await.unwrap_err().is_panic());
        // SIGCONT is delivered at once, but the state in /proc may lag a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while process_state(pid) == 'T' && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_ne!(process_state(pid), 'T', "the guard resumed the paused worker");
        backend.kill_all();
    }
}
