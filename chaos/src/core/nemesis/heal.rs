//! Healing: at the end of a run every fault is stopped, each stop retried
//! within its bound ([`heal_all`]), and on every other path out of a run the
//! nemeses heal what would outlive the harness when [`Faults`] drops.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio::time::Instant;

use super::schedule::{ActiveFaults, STOP_RETRY_WAIT_MAX, STOP_RETRY_WAIT_MIN, stop_until_healed};
use crate::core::history::Recorder;
use crate::core::roles::Nemesis;

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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backends::local::{LocalBackend, NodeSpec, worker_node};
    use crate::core::fault::Fault;
    use crate::core::nemesis::NodeNemesis;
    use crate::core::roles::Backend;

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
            let faults = Faults::new(vec![Box::new(NodeNemesis::new(
                Fault::Pause,
                task_backend,
                vec![worker_node(1)],
                vt,
                None,
            ))]);
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
