//! The faults as data: one enum with the names `--nemesis` takes, each kind
//! building its nemesis from what the system under test exposes
//! ([`Surfaces`]), as bug modes are a `haunt_store::Bug`.

use std::time::Duration;

use crate::backends::docker::LossNemesis;
use crate::core::nemesis::{
    AckLossNemesis, Aim, ClockSkewNemesis, DbErrorNemesis, DelayNemesis, HOLD_MIN_DEFAULT, KillNemesis,
    PartitionNemesis, PauseNemesis, StallNemesis,
};
use crate::core::roles::Nemesis;
use crate::core::system::Surfaces;

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    /// SIGKILL the API or a worker, later start it again.
    Kill,
    /// SIGKILL the relay, later start it again: what it published and had
    /// not yet removed from the outbox it publishes again.
    RelayKill,
    /// SIGSTOP a worker past its lease: a zombie when it resumes.
    Pause,
    /// Cut one link, both ways.
    Partition,
    /// Slow a link past the client's timeout.
    Delay,
    /// Workers drop half their acks after the effect committed.
    AckLoss,
    /// A worker's clock ten minutes ahead.
    ClockSkew,
    /// One database statement in three fails, in every service.
    DbError,
    /// A worker stalls past its lease right after leasing, then carries on.
    Stall,
    /// Crash the database (SIGKILL), later start it again: crash recovery.
    DbRestart,
    /// Links lose one packet in four (iptables in containers).
    Loss,
    /// Crash the broker (SIGKILL), later start it again: what it confirmed
    /// must survive.
    BrokerRestart,
}

impl Fault {
    /// Every kind, in the order `--help` and `all` list them.
    pub const ALL: [Fault; 12] = [
        Fault::Kill,
        Fault::Pause,
        Fault::Partition,
        Fault::Delay,
        Fault::AckLoss,
        Fault::ClockSkew,
        Fault::DbError,
        Fault::Stall,
        Fault::DbRestart,
        Fault::Loss,
        Fault::BrokerRestart,
        Fault::RelayKill,
    ];

    /// Its name in `--nemesis`, in the history's fault windows and in `run.json`.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Delay => "delay",
            Fault::AckLoss => "ack-loss",
            Fault::ClockSkew => "clock-skew",
            Fault::DbError => "db-error",
            Fault::Stall => "stall",
            Fault::DbRestart => "db-restart",
            Fault::Loss => "loss",
            Fault::BrokerRestart => "broker-restart",
            Fault::RelayKill => "relay-kill",
        }
    }

    pub fn from_name(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    /// A comma-separated list: names, `all` (the kinds in `all`, those this
    /// run can fire) and `none`. Each kind once, in the order given: a kind
    /// runs in one schedule only, so it is never active twice at once.
    pub fn parse_list(list: &str, all: &[Fault]) -> anyhow::Result<Vec<Fault>> {
        let mut out: Vec<Fault> = Vec::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let kinds = match name {
                "none" => Vec::new(),
                "all" => all.to_vec(),
                name => match Fault::from_name(name) {
                    Some(f) => vec![f],
                    None => {
                        let known: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                        anyhow::bail!("unknown nemesis {name:?}; known: {}, all, none", known.join(", "))
                    }
                },
            };
            for f in kinds {
                if !out.contains(&f) {
                    out.push(f);
                }
            }
        }
        Ok(out)
    }

    /// The shortest time the fault must last to mean anything, known before
    /// its nemesis exists (for the fit check). The nemesis reports the same
    /// through [`Nemesis::hold_min`]; [`Fault::build`] checks that they agree.
    pub fn hold_min(self, visibility_timeout: Duration) -> Duration {
        match self {
            // Twice the lease, so another worker has time to take the message over.
            Fault::Pause => visibility_timeout * 2,
            // The stall (twice the lease) and a moment for the zombie to act after it.
            Fault::Stall => visibility_timeout * 2 + HOLD_MIN_DEFAULT,
            _ => HOLD_MIN_DEFAULT,
        }
    }

    /// The nemesis of this kind over what the system exposes. A system that
    /// lacks what the fault needs gets an error naming it.
    pub fn build(self, on: &Surfaces, settings: &FaultSettings) -> anyhow::Result<Box<dyn Nemesis>> {
        let switches = || {
            on.switches
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("--nemesis {}: this system has no fault switches to flip", self.name()))
        };
        // Kills and pauses of workers are aimed at a batch in flight where the
        // workers have admin endpoints.
        let aim = || on.switches.as_ref().map(|s| Aim::new(s.workers.clone(), settings.visibility_timeout));
        let nemesis: Box<dyn Nemesis> = match self {
            Fault::Kill => Box::new(KillNemesis::new(on.backend.clone(), on.nodes_for(Fault::Kill), aim())),
            Fault::Pause => Box::new(PauseNemesis::new(
                on.backend.clone(),
                on.nodes_for(Fault::Pause),
                settings.visibility_timeout,
                aim(),
            )),
            Fault::Partition => Box::new(PartitionNemesis::new(on.links.clone())),
            // Past the client's timeout: answers arrive after the client gave up.
            Fault::Delay => {
                Box::new(DelayNemesis::new(on.proxies.clone(), settings.request_timeout + settings.request_timeout / 4))
            }
            // One statement in three fails: enough to hit most multi-step paths,
            // few enough that retries get through.
            Fault::DbError => Box::new(DbErrorNemesis::new(switches()?.services.clone(), 0.3)),
            // Half the acks lost: most messages come back at least once.
            Fault::AckLoss => Box::new(AckLossNemesis::new(switches()?.workers.clone(), 0.5, settings.ack_fail_rate)),
            Fault::Stall => Box::new(StallNemesis::new(switches()?.workers.clone(), settings.visibility_timeout)),
            // Ten minutes ahead, as after a bad NTP step: a worker that trusts its
            // clock leases for ten minutes, past any quiesce timeout.
            Fault::ClockSkew => Box::new(ClockSkewNemesis::new(switches()?.workers.clone(), 10 * 60 * 1000)),
            // One packet in four lost: TCP gets through, slowly, and some
            // requests outlast their timeout.
            Fault::Loss => {
                anyhow::ensure!(
                    !on.lossy.is_empty(),
                    "--nemesis loss drops packets with iptables in containers: it needs --backend docker"
                );
                Box::new(LossNemesis::new(on.lossy.clone(), 0.25))
            }
            Fault::DbRestart => {
                let db = on.nodes_for(Fault::DbRestart);
                anyhow::ensure!(
                    !db.is_empty(),
                    "--nemesis db-restart needs the database as a node: --pg-data DIR (the data directory of the \
                     PostgreSQL server behind --db), or --backend docker"
                );
                Box::new(KillNemesis::named("db-restart", on.backend.clone(), db))
            }
            Fault::BrokerRestart => {
                let broker = on.nodes_for(Fault::BrokerRestart);
                anyhow::ensure!(!broker.is_empty(), "--nemesis broker-restart needs a broker: --transport NAME");
                Box::new(KillNemesis::named("broker-restart", on.backend.clone(), broker))
            }
            Fault::RelayKill => {
                let relay = on.nodes_for(Fault::RelayKill);
                anyhow::ensure!(!relay.is_empty(), "--nemesis relay-kill needs a relay: --transport NAME");
                Box::new(KillNemesis::named("relay-kill", on.backend.clone(), relay))
            }
        };
        assert_eq!(nemesis.name(), self.name(), "a fault builds its own nemesis");
        assert_eq!(
            nemesis.hold_min(),
            self.hold_min(settings.visibility_timeout),
            "Fault::hold_min must know the hold of {}",
            self.name()
        );
        let targets = &settings.fault_targets;
        Ok(if targets.is_empty() { nemesis } else { crate::core::nemesis::OnlyTargets::wrap(nemesis, targets) })
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for Fault {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// What a fault's nemesis is tuned by, from the run's options.
#[derive(Debug, Clone)]
pub struct FaultSettings {
    pub visibility_timeout: Duration,
    pub request_timeout: Duration,
    /// The acks lost all run long, which the ack-loss fault's stop restores.
    pub ack_fail_rate: f64,
    /// Faults that can hit any of these targets hit only these (empty: all).
    pub fault_targets: Vec<String>,
}

/// Builds the nemesis of every kind in `faults`.
pub fn build_all(faults: &[Fault], on: &Surfaces, settings: &FaultSettings) -> anyhow::Result<Vec<Box<dyn Nemesis>>> {
    faults.iter().map(|f| f.build(on, settings)).collect()
}

/// The kinds `all` means where the database is a node ([`Fault::DbRestart`]),
/// links can lose packets ([`Fault::Loss`]) and a broker runs
/// ([`Fault::BrokerRestart`]), or not.
pub fn all_possible(db_node: bool, lossy_links: bool, relay: bool, durable_broker: bool) -> Vec<Fault> {
    Fault::ALL
        .into_iter()
        .filter(|f| *f != Fault::DbRestart || db_node)
        .filter(|f| *f != Fault::Loss || lossy_links)
        .filter(|f| *f != Fault::RelayKill || relay)
        .filter(|f| *f != Fault::BrokerRestart || durable_broker)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Fault, all_possible};

    #[test]
    fn names_round_trip() {
        for f in Fault::ALL {
            assert_eq!(Fault::from_name(f.name()), Some(f));
        }
        assert_eq!(Fault::from_name("kil"), None);
    }

    #[test]
    fn lists() {
        let all = all_possible(false, false, false, false);
        assert_eq!(Fault::parse_list("none", &all).unwrap(), vec![]);
        assert_eq!(Fault::parse_list("kill, pause", &all).unwrap(), vec![Fault::Kill, Fault::Pause]);
        assert!(!Fault::parse_list("all", &all).unwrap().contains(&Fault::DbRestart));
        assert!(
            Fault::parse_list("all", &all_possible(true, false, false, false)).unwrap().contains(&Fault::DbRestart)
        );
        assert!(
            !all.contains(&Fault::BrokerRestart)
                && all_possible(false, false, true, true).contains(&Fault::BrokerRestart)
        );
        // A relay without a durable broker (moto): its kill, not the broker's restart.
        let moto = all_possible(false, false, true, false);
        assert!(moto.contains(&Fault::RelayKill) && !moto.contains(&Fault::BrokerRestart));
        assert!(!all.contains(&Fault::RelayKill));
        assert!(Fault::parse_list("kil", &all).unwrap_err().to_string().contains("kill"));
        // all: the seven defaults and stall (db-restart and loss need more).
        assert_eq!(Fault::parse_list("kill,pause,kill,all", &all).unwrap().len(), 8, "each kind once");
        assert_eq!(all_possible(true, true, true, true).len(), Fault::ALL.len());
    }
}
