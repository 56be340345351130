//! The roles of a run, Jepsen's split: a [`Client`] performs one workload op
//! against the system, a [`Nemesis`] starts and stops one kind of fault, a
//! [`Backend`] starts, stops, kills and pauses the nodes of a cluster, and a
//! [`Checker`] turns a run directory into results. A run takes each as a value
//! (a trait object: `crate::core::run::Roles`), so a test can swap any of them; each
//! has a no-op implementation, so any one can be switched off.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use haunt_checker::Results;
use haunt_format::OrderValue;

/// What one client op came to (the semantics of `docs/run-format.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Committed: the API answered 201 or 200, with the order's event id when
    /// the system names it (the reference pipeline always does).
    Ok { event_id: Option<String> },
    /// Certainly no effect.
    Fail { error: String },
    /// Unknown: it may or may not have taken effect.
    Info { error: String },
}

pub trait Client: Send + Sync {
    /// Places one order and says what came of it.
    fn place<'a>(&'a self, order: &'a OrderValue, correlation_id: &'a str) -> BoxFuture<'a, Completion>;
}

/// Sends nothing: every op certainly had no effect.
#[derive(Debug, Default)]
pub struct NoopClient;

impl Client for NoopClient {
    fn place<'a>(&'a self, _order: &'a OrderValue, _correlation_id: &'a str) -> BoxFuture<'a, Completion> {
        Box::pin(async { Completion::Fail { error: "no-op client".into() } })
    }
}

/// A node of the cluster under test.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// `api`, `worker-1`, `postgres`, …
    pub name: String,
    pub role: Role,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Api,
    Worker,
    Database,
    /// A node of a system haunt did not build: what it may take is the
    /// system file's to say.
    Service,
    /// A message broker (`brokers.rs`), which `broker-restart` kills.
    Broker,
    /// The outbox relay in front of a broker.
    Relay,
}

/// The nodes of a cluster, and what can be done to them. Object-safe: a run
/// holds its backend as `Arc<dyn Backend>`, whatever runs the nodes.
pub trait Backend: Send + Sync + std::fmt::Debug {
    fn nodes(&self) -> Vec<Node>;
    /// Starts a node that is not running (a running one is left as it is).
    fn start<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>>;
    /// Stops a node gracefully (SIGTERM, then SIGKILL after a grace period).
    fn stop<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>>;
    /// Waits until a started node serves, by the check its backend was given
    /// for it, or fails with the last answer. A fault's restart waits for it,
    /// so that its window lasts until the node is back: a Kafka broker took 6
    /// to 10 s after its restart to accept a connection, and a fault the
    /// schedule started meanwhile hit a system still down. No check: at once.
    fn serves<'a>(&'a self, _node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    /// Kills a node at once (SIGKILL).
    fn kill<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>>;
    /// Freezes a node (SIGSTOP): it holds its leases and connections, does nothing.
    fn pause<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>>;
    fn resume<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>>;
    /// [`Backend::resume`] without a runtime: the last-resort heal of a paused
    /// node when a run unwinds (see [`crate::core::nemesis::Faults`]).
    fn resume_blocking(&self, node: &Node) -> anyhow::Result<()>;
    /// Brings back, without a runtime, a killed node that outlives the run (a
    /// database server the harness does not own): the last-resort heal of a
    /// kill. Nothing, for nodes the backend ends when it drops.
    fn restore_blocking(&self, _node: &Node) {}
    /// Whether the node's process is alive (paused counts as alive).
    fn is_running(&self, node: &Node) -> bool;
    /// Ends every node the backend owns at once, keeping what it can of their
    /// logs in `logs`. Idempotent; also what a drop does.
    fn teardown(&self, _logs: &Path) {}
}

/// Several backends as one: each node is handled by the backend that lists it
/// (the services as child processes, the database as a server of its own).
#[derive(Debug)]
pub struct Joined {
    parts: Vec<Arc<dyn Backend>>,
}

impl Joined {
    pub fn new(parts: Vec<Arc<dyn Backend>>) -> Joined {
        Joined { parts }
    }

    fn owner(&self, node: &Node) -> anyhow::Result<&dyn Backend> {
        let owner = self.parts.iter().find(|b| b.nodes().contains(node));
        owner.map(|b| b.as_ref()).ok_or_else(|| anyhow::anyhow!("no node {}", node.name))
    }
}

impl Backend for Joined {
    fn nodes(&self) -> Vec<Node> {
        self.parts.iter().flat_map(|b| b.nodes()).collect()
    }
    fn start<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.owner(node)?.start(node).await })
    }
    fn stop<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.owner(node)?.stop(node).await })
    }
    fn serves<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.owner(node)?.serves(node).await })
    }
    fn kill<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.owner(node)?.kill(node).await })
    }
    fn pause<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.owner(node)?.pause(node).await })
    }
    fn resume<'a>(&'a self, node: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move { self.owner(node)?.resume(node).await })
    }
    fn resume_blocking(&self, node: &Node) -> anyhow::Result<()> {
        self.owner(node)?.resume_blocking(node)
    }
    fn restore_blocking(&self, node: &Node) {
        if let Ok(owner) = self.owner(node) {
            owner.restore_blocking(node);
        }
    }
    fn is_running(&self, node: &Node) -> bool {
        self.owner(node).is_ok_and(|b| b.is_running(node))
    }
    fn teardown(&self, logs: &Path) {
        for part in &self.parts {
            part.teardown(logs);
        }
    }
}

/// A cluster with no nodes.
#[derive(Debug, Default)]
pub struct NoopBackend;

fn done<'a>() -> BoxFuture<'a, anyhow::Result<()>> {
    Box::pin(async { Ok(()) })
}

impl Backend for NoopBackend {
    fn nodes(&self) -> Vec<Node> {
        Vec::new()
    }
    fn start<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        done()
    }
    fn stop<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        done()
    }
    fn kill<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        done()
    }
    fn pause<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        done()
    }
    fn resume<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
        done()
    }
    fn resume_blocking(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    fn is_running(&self, _: &Node) -> bool {
        false
    }
}

/// The shortest hold of a fault that names none of its own: long enough for a
/// few client ops and a lease to meet it.
pub const HOLD_MIN_DEFAULT: std::time::Duration = std::time::Duration::from_millis(500);

/// A boxed future, so that nemeses of different kinds fit in one list.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One kind of fault. `stop` must be idempotent and must heal whatever `start`
/// broke: the run calls it at the end, on Ctrl-C and on errors, fault active or not.
/// A `stop` that fails must leave the fault as it is, so that the next `stop`
/// tries again (the schedule retries it until it takes effect).
pub trait Nemesis: Send + Sync {
    /// The fault's name in `--nemesis` (`kill`, `pause`, …).
    fn name(&self) -> &'static str;
    /// The fault window its ops open and close in the history: `kill` for
    /// every kill that a restart ends, `pause`, or its own name. The ops' `f`
    /// follow from it ([`haunt_format::fault_ops`]).
    fn family(&self) -> &'static str {
        self.name()
    }
    /// The targets this fault can hit.
    fn targets(&self) -> Vec<String>;
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>>;
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// The shortest time the fault must last to mean anything (a pause must
    /// outlast the visibility timeout).
    fn hold_min(&self) -> std::time::Duration {
        HOLD_MIN_DEFAULT
    }
    /// Whether the fault's stop waits for something that takes its own time,
    /// beyond any plan: a restart waits until the node serves again (a Kafka
    /// broker under load: 7 to 14 s). The first round of a schedule strikes
    /// such faults last, so that one slow heal cannot crowd out the others.
    fn slow_to_heal(&self) -> bool {
        false
    }
    /// What the last `start` aimed at, for its result op in the history
    /// (`value.aim`): the worker's answer to the hold (`{"held": true,
    /// "point": …, "messages": …}` or `{"held": false}`); `None` for a shot
    /// that was not aimed, and for every fault that never aims. Taken: a
    /// second call answers `None`.
    fn take_aim(&self) -> Option<serde_json::Value> {
        None
    }
    /// The last resort when a run unwinds (a panic, an error before the heal):
    /// undoes, without a runtime, whatever of this fault is still in place and
    /// would outlive the harness. Called on every path out of a run, so it must
    /// be idempotent and cheap when nothing is broken. The default does nothing,
    /// which is right for a fault that lives only in processes or containers the
    /// backend ends when it drops (an admin switch of a worker, a killed node).
    fn heal_blocking(&self) {}
}

/// Never breaks anything.
#[derive(Debug, Default)]
pub struct NoopNemesis;

impl Nemesis for NoopNemesis {
    fn name(&self) -> &'static str {
        "none"
    }
    fn targets(&self) -> Vec<String> {
        Vec::new()
    }
    fn start<'a>(&'a self, _: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
}

pub trait Checker: Send + Sync {
    fn check(&self, run_dir: &Path) -> Result<Results, haunt_checker::InputError>;
}

/// The real checker over the run directory.
#[derive(Debug, Default)]
pub struct RunDirChecker;

impl Checker for RunDirChecker {
    fn check(&self, run_dir: &Path) -> Result<Results, haunt_checker::InputError> {
        haunt_checker::check_dir(run_dir)
    }
}

/// Checks nothing; reports an empty run. For harness tests that only exercise
/// the cluster.
#[derive(Debug, Default)]
pub struct NoopChecker;

impl Checker for NoopChecker {
    fn check(&self, _run_dir: &Path) -> Result<Results, haunt_checker::InputError> {
        let empty: &[u8] = b"";
        haunt_checker::check_readers(empty, Some(empty)).map_err(haunt_checker::InputError::Format)
    }
}
