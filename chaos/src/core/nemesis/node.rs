//! Faults of nodes: a kill that a restart ends, or a pause that a resume
//! ends, of the API, a worker, the relay, the database or the broker.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use super::aim::Aim;
use super::{clear, peek, put};
use crate::core::fault::Fault;
use crate::core::roles::{Backend, BoxFuture, Nemesis, Node};

/// What a node fault does to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Strike {
    /// SIGKILL (or `docker kill`), later started again.
    Kill,
    /// SIGSTOP (or `docker pause`) past the visibility timeout: when it
    /// resumes, the node is a zombie holding an expired lease.
    Pause,
}

/// Kills or pauses one node of its targets at a time. Which of the two, and
/// the name and hold, follow from its [`Fault`]: `pause` pauses, and every
/// other node fault (`kill`, `db-restart`, `broker-restart`, `relay-kill`)
/// kills and restarts.
#[derive(Debug)]
pub struct NodeNemesis {
    fault: Fault,
    strike: Strike,
    backend: Arc<dyn Backend>,
    targets: Vec<Node>,
    hold_min: Duration,
    /// To aim at a batch in flight (see [`Aim`]); an aimed pause stops a
    /// worker whose batch has applied and not acked, and it resumes a zombie,
    /// its lease long expired and its messages delivered again elsewhere.
    aim: Option<Aim>,
    /// The node struck, until the fault's stop has worked.
    struck: Mutex<Option<Node>>,
}

impl NodeNemesis {
    /// `visibility_timeout`: what a pause must outlast ([`Fault::hold_min`]).
    pub fn new(
        fault: Fault,
        backend: Arc<dyn Backend>,
        targets: Vec<Node>,
        visibility_timeout: Duration,
        aim: Option<Aim>,
    ) -> Self {
        let strike = if fault == Fault::Pause { Strike::Pause } else { Strike::Kill };
        let hold_min = fault.hold_min(visibility_timeout);
        NodeNemesis { fault, strike, backend, targets, hold_min, aim, struck: Mutex::new(None) }
    }
}

impl Nemesis for NodeNemesis {
    fn name(&self) -> &'static str {
        self.fault.name()
    }
    fn family(&self) -> &'static str {
        self.fault.family()
    }
    fn targets(&self) -> Vec<String> {
        self.targets.iter().map(|n| n.name.clone()).collect()
    }
    fn hold_min(&self) -> Duration {
        self.hold_min
    }
    fn slow_to_heal(&self) -> bool {
        matches!(self.fault, Fault::BrokerRestart | Fault::DbRestart)
    }
    fn take_aim(&self) -> Option<serde_json::Value> {
        Aim::take(self.aim.as_ref())
    }
    fn start<'a>(&'a self, target: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let node = self.targets.iter().find(|n| n.name == target).context("unknown target")?.clone();
            Aim::at_batch(self.aim.as_ref(), target).await;
            put(&self.struck, node.clone());
            match self.strike {
                Strike::Kill => self.backend.kill(&node).await,
                Strike::Pause => self.backend.pause(&node).await,
            }
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            let Some(node) = peek(&self.struck) else { return Ok(()) };
            match self.strike {
                // Over once the node serves again; until then it stays
                // struck, and a failed wait is retried as a failed start is.
                Strike::Kill => {
                    self.backend.start(&node).await?;
                    self.backend.serves(&node).await?;
                }
                Strike::Pause if self.backend.is_running(&node) => self.backend.resume(&node).await?,
                Strike::Pause => {}
            }
            clear(&self.struck);
            Ok(())
        })
    }
    /// A paused node gets SIGCONT (or `docker unpause`): a stopped process
    /// outlives a harness that is not its parent, and holds its leases and
    /// connections meanwhile. A killed node the backend owns ends with the
    /// backend, and starting it only to end it helps no one; one that
    /// outlives the run (a database server the harness does not own) the
    /// backend brings back.
    fn heal_blocking(&self) {
        let Some(node) = peek(&self.struck) else { return };
        match self.strike {
            Strike::Kill => self.backend.restore_blocking(&node),
            Strike::Pause => match self.backend.resume_blocking(&node) {
                Ok(()) => clear(&self.struck),
                Err(e) => eprintln!("haunt: resuming {}: {e:#}", node.name),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::backends::local::worker_node;

    /// A backend whose `start` fails a given number of times, and whose
    /// started node does not serve the first `not_serving` times it is asked.
    #[derive(Debug, Default)]
    struct FlakyStart {
        failures: AtomicU32,
        starts: AtomicU32,
        not_serving: AtomicU32,
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
        fn serves<'a>(&'a self, _: &'a Node) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(async move {
                let left = self.not_serving.load(Ordering::Relaxed);
                if left > 0 {
                    self.not_serving.store(left - 1, Ordering::Relaxed);
                    anyhow::bail!("not yet");
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
        let kill = NodeNemesis::new(Fault::Kill, backend.clone(), vec![worker_node(1)], Duration::from_secs(2), None);
        kill.start("worker-1").await.unwrap();
        assert!(kill.stop().await.is_err());
        kill.stop().await.unwrap();
        assert_eq!(backend.starts.load(Ordering::Relaxed), 2, "the second stop restarted the node again");
        kill.stop().await.unwrap();
        assert_eq!(backend.starts.load(Ordering::Relaxed), 2, "and a healed fault has nothing left to stop");
    }

    #[tokio::test]
    async fn a_restart_is_over_only_once_the_node_serves() {
        let backend = Arc::new(FlakyStart { not_serving: AtomicU32::new(1), ..FlakyStart::default() });
        let restart =
            NodeNemesis::new(Fault::BrokerRestart, backend.clone(), vec![worker_node(1)], Duration::from_secs(2), None);
        restart.start("worker-1").await.unwrap();
        let err = restart.stop().await.unwrap_err();
        assert!(format!("{err:#}").contains("not yet"), "{err:#}");
        assert!(peek(&restart.struck).is_some(), "a node that does not serve yet stays struck");
        restart.stop().await.unwrap();
        assert!(peek(&restart.struck).is_none(), "healed once it serves");
    }

    #[test]
    fn each_node_fault_names_itself_and_its_window() {
        let backend: Arc<dyn Backend> = Arc::new(FlakyStart::default());
        let vt = Duration::from_secs(2);
        for (fault, family, hold) in [
            (Fault::Kill, "kill", crate::core::roles::HOLD_MIN_DEFAULT),
            (Fault::DbRestart, "kill", crate::core::roles::HOLD_MIN_DEFAULT),
            (Fault::Pause, "pause", vt * 2),
        ] {
            let n = NodeNemesis::new(fault, backend.clone(), vec![worker_node(1)], vt, None);
            assert_eq!((n.name(), n.family(), n.hold_min()), (fault.name(), family, hold));
        }
    }
}
