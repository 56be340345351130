//! The nemeses: one per kind of fault, each built from what the system under
//! test exposes ([`build`]), and the seeded schedule that runs them.
//!
//! - [`node`]: kills and pauses of nodes (`NodeNemesis`), a database's or a
//!   broker's restart and the relay's kill among them.
//! - [`aim`]: how a kill or a pause of a worker is aimed at a batch in flight.
//! - [`link`]: partitions, delays and packet loss of links.
//! - [`switch`]: the services' fault switches (ack loss, database errors,
//!   clock skew, stalls).
//! - [`schedule`]: the seeded schedule, its fit to the time limit, the
//!   coverage it reports and the faults active now.
//! - [`script`]: an explicit schedule, the windows a run struck
//!   (`schedule.json`), struck again as given (`haunt run --schedule`).
//! - [`heal`]: healing at the end of a run, and on every path out of one.
//!
//! **Invariant:** the nemesis never reads the history; it only appends its own
//! start and stop ops to it.

use std::sync::Mutex;
use std::time::Duration;

use crate::core::fault::{Fault, FaultSettings};
use crate::core::roles::{BoxFuture, Nemesis};
use crate::core::system::Surfaces;

pub mod aim;
pub mod heal;
pub mod link;
pub mod node;
pub mod schedule;
pub mod script;
pub mod switch;

pub use aim::Aim;
pub use heal::{Faults, heal_all};
pub use link::{DelayNemesis, LossNemesis, PartitionNemesis};
pub use node::NodeNemesis;
pub use schedule::{
    ACT_ALLOWANCE, ActiveFaults, Coverage, FaultContext, ScheduleOptions, Unfit, check_fit, run_schedule,
    stop_retry_for,
};
pub use script::{PlannedWindow, SCHEDULE_FILE, ScheduleFile};
pub use switch::{AckLossNemesis, ClockSkewNemesis, DbErrorNemesis, StallNemesis};

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

/// The nemesis of `fault` over what the system exposes. A system that lacks
/// what the fault needs gets an error naming it.
pub fn build(fault: Fault, on: &Surfaces, settings: &FaultSettings) -> anyhow::Result<Box<dyn Nemesis>> {
    let switches =
        || {
            on.switches.as_ref().and_then(|s| s.for_fault(fault)).cloned().ok_or_else(|| {
                anyhow::anyhow!("--nemesis {fault}: no node of this system takes it through its switches")
            })
        };
    let nodes = || on.nodes_for(fault);
    let vt = settings.visibility_timeout;
    let nemesis: Box<dyn Nemesis> = match fault {
        // Kills and pauses of workers are aimed at a batch in flight where the
        // workers have admin endpoints.
        Fault::Kill | Fault::Pause => {
            let holds = on.switches.as_ref().map(|s| s.holds.clone());
            let aim = Aim::with(holds, on.probes.clone(), on.in_flight.clone(), settings.aim, vt, settings.seed);
            Box::new(NodeNemesis::new(fault, on.backend.clone(), nodes(), vt, Some(aim)))
        }
        // A cut of a link one of whose ends has hold points lands, every
        // other time, while that end holds work there.
        Fault::Partition => {
            let holds = on.switches.as_ref().map(|s| s.holds.clone());
            let aim = Aim::with(holds, Vec::new(), Vec::new(), settings.aim, vt, settings.seed);
            Box::new(PartitionNemesis::new(on.links.clone()).aimed(aim))
        }
        // Past the client's timeout: answers arrive after the client gave up.
        Fault::Delay => {
            Box::new(DelayNemesis::new(on.slowable.clone(), settings.request_timeout + settings.request_timeout / 4))
        }
        // One statement in three fails: enough to hit most multi-step paths,
        // few enough that retries get through.
        Fault::DbError => Box::new(DbErrorNemesis::new(switches()?, 0.3)),
        // Half the acks lost: most messages come back at least once.
        Fault::AckLoss => Box::new(AckLossNemesis::new(switches()?, 0.5, settings.ack_fail_rate)),
        Fault::Stall => Box::new(StallNemesis::new(switches()?, vt)),
        // Ten minutes ahead, as after a bad NTP step: a worker that trusts its
        // clock leases for ten minutes, past any quiesce timeout.
        Fault::ClockSkew => Box::new(ClockSkewNemesis::new(switches()?, 10 * 60 * 1000)),
        // One packet in four lost: TCP gets through, slowly, and some
        // requests outlast their timeout.
        Fault::Loss => {
            anyhow::ensure!(
                !on.lossy.is_empty(),
                "--nemesis loss drops packets with iptables in containers: it needs --backend docker"
            );
            Box::new(LossNemesis::new(on.lossy.clone(), 0.25))
        }
        Fault::DbRestart | Fault::BrokerRestart | Fault::RelayKill => {
            let targets = nodes();
            anyhow::ensure!(!targets.is_empty(), "--nemesis {fault} needs {}", needs(fault));
            Box::new(NodeNemesis::new(fault, on.backend.clone(), targets, vt, None))
        }
    };
    assert_eq!(nemesis.name(), fault.name(), "a fault builds its own nemesis");
    assert_eq!(nemesis.hold_min(), fault.hold_min(vt), "Fault::hold_min must know the hold of {fault}");
    let targets = &settings.fault_targets;
    Ok(if targets.is_empty() { nemesis } else { OnlyTargets::wrap(nemesis, targets) })
}

/// What a restart or a relay's kill needs of the run, for its error.
fn needs(fault: Fault) -> &'static str {
    match fault {
        Fault::DbRestart => {
            "the database as a node: --pg-data DIR (the data directory of the PostgreSQL server behind --db), or \
             --backend docker"
        }
        Fault::BrokerRestart => "a broker: --transport NAME",
        Fault::RelayKill => "a relay: --transport NAME",
        _ => "nodes to hit",
    }
}

/// Builds the nemesis of every kind in `faults`.
pub fn build_all(faults: &[Fault], on: &Surfaces, settings: &FaultSettings) -> anyhow::Result<Vec<Box<dyn Nemesis>>> {
    faults.iter().map(|&f| build(f, on, settings)).collect()
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
    fn family(&self) -> &'static str {
        self.inner.family()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fault that only names its targets.
    struct Named(&'static str, &'static [&'static str]);

    impl Nemesis for Named {
        fn name(&self) -> &'static str {
            self.0
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
}
