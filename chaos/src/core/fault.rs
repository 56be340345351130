//! The faults as data: one enum with the names `--nemesis` takes, as bug
//! modes are a `haunt_store::Bug`. Each kind's nemesis is built from what the
//! system under test exposes by `crate::core::nemesis::build`.

use std::time::Duration;

use crate::core::roles::HOLD_MIN_DEFAULT;

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

    /// The fault window its ops open and close in the history
    /// (`haunt_format::fault_ops`): every fault that a kill starts and a
    /// restart ends is a `kill`.
    pub fn family(self) -> &'static str {
        match self {
            Fault::Kill | Fault::DbRestart | Fault::BrokerRestart | Fault::RelayKill => "kill",
            other => other.name(),
        }
    }

    /// The shortest time the fault must last to mean anything, known before
    /// its nemesis exists (for the fit check). The nemesis reports the same
    /// through [`Nemesis::hold_min`]; `crate::core::nemesis::build` checks that they agree.
    pub fn hold_min(self, visibility_timeout: Duration) -> Duration {
        match self {
            // Twice the lease, so another worker has time to take the message over.
            Fault::Pause => visibility_timeout * 2,
            // The stall (twice the lease) and a moment for the zombie to act after it.
            Fault::Stall => visibility_timeout * 2 + HOLD_MIN_DEFAULT,
            _ => HOLD_MIN_DEFAULT,
        }
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

/// By its name, as `run.json`'s `options.nemesis` lists it.
impl<'de> serde::Deserialize<'de> for Fault {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Fault, D::Error> {
        let name = String::deserialize(d)?;
        Fault::ALL.into_iter().find(|f| f.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
            serde::de::Error::custom(format!("unknown fault {name:?}; expected one of {}", names.join(", ")))
        })
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
    /// How kills and pauses are aimed.
    pub aim: Aiming,
    /// The run's seed: where within a request a client-side aim strikes.
    pub seed: u64,
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

/// How a kill or a pause of a node finds work in flight (`--aim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Aiming {
    /// At a hold point where the node offers one (haunt's workers, a system
    /// file's `points`); else at its `aim` probe's first yes; else, for a
    /// node the workload's client calls, while a request of the client is in
    /// flight there.
    #[default]
    Points,
    /// Only from the client's side, hold points or not.
    Client,
    /// Never: every strike lands wherever the node happens to be.
    Blind,
}
