//! The roles of a run, Jepsen's split: a [`Client`] performs one workload op
//! against the system, a [`Nemesis`] starts and stops one kind of fault, a
//! [`Backend`] starts, stops, kills and pauses the nodes of a cluster, and a
//! [`Checker`] turns a run directory into results. Each has a no-op
//! implementation, so any one role can be switched off.

use std::future::Future;
use std::path::Path;

use haunt_checker::Results;
use haunt_format::OrderValue;

/// What one client op came to (the semantics of `docs/run-format.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Committed: the API answered 201 or 200 with this event.
    Ok { event_id: String },
    /// Certainly no effect.
    Fail { error: String },
    /// Unknown: it may or may not have taken effect.
    Info { error: String },
}

pub trait Client: Send + Sync {
    fn place(&self, order: &OrderValue, correlation_id: &str) -> impl Future<Output = Completion> + Send;
}

/// Sends nothing: every op certainly had no effect.
#[derive(Debug, Default)]
pub struct NoopClient;

impl Client for NoopClient {
    async fn place(&self, _order: &OrderValue, _correlation_id: &str) -> Completion {
        Completion::Fail { error: "no-op client".into() }
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
}

pub trait Backend: Send + Sync {
    fn nodes(&self) -> Vec<Node>;
    /// Starts a node that is not running.
    fn start(&self, node: &Node) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Stops a node gracefully (SIGTERM, then SIGKILL after a grace period).
    fn stop(&self, node: &Node) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Kills a node at once (SIGKILL).
    fn kill(&self, node: &Node) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// Freezes a node (SIGSTOP): it holds its leases and connections, does nothing.
    fn pause(&self, node: &Node) -> impl Future<Output = anyhow::Result<()>> + Send;
    fn resume(&self, node: &Node) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// [`Backend::resume`] without a runtime: the last-resort heal of a paused
    /// node when a run unwinds (see [`crate::nemesis::Faults`]).
    fn resume_blocking(&self, node: &Node) -> anyhow::Result<()>;
    /// Whether the node's process is alive (paused counts as alive).
    fn is_running(&self, node: &Node) -> bool;
}

/// A cluster with no nodes.
#[derive(Debug, Default)]
pub struct NoopBackend;

impl Backend for NoopBackend {
    fn nodes(&self) -> Vec<Node> {
        Vec::new()
    }
    async fn start(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    async fn stop(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    async fn kill(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    async fn pause(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    async fn resume(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    fn resume_blocking(&self, _: &Node) -> anyhow::Result<()> {
        Ok(())
    }
    fn is_running(&self, _: &Node) -> bool {
        false
    }
}

/// A boxed future, so that nemeses of different kinds fit in one list.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One kind of fault. `stop` must be idempotent and must heal whatever `start`
/// broke: the run calls it at the end, on Ctrl-C and on errors, fault active or not.
/// A `stop` that fails must leave the fault as it is, so that the next `stop`
/// tries again (the schedule retries it until it takes effect).
pub trait Nemesis: Send + Sync {
    /// The fault's name in `--nemesis` (`kill`, `pause`, …).
    fn name(&self) -> &'static str;
    /// The history's `f` for the start and the stop (`kill`/`restart`, …).
    fn ops(&self) -> (&'static str, &'static str);
    /// The targets this fault can hit.
    fn targets(&self) -> Vec<String>;
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>>;
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>>;
    /// The shortest time the fault must last to mean anything (a pause must
    /// outlast the visibility timeout).
    fn hold_min(&self) -> std::time::Duration {
        crate::nemesis::HOLD_MIN_DEFAULT
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
    fn ops(&self) -> (&'static str, &'static str) {
        ("start-noop", "stop-noop")
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

pub trait Checker {
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
