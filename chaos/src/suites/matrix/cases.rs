//! The rows of the matrix: the bug-mode catalogue, what exposes each mode
//! and what a run must show to count as caught, and the rows for a transport
//! or a system file.

use super::*;

/// What a bug mode needs from the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Needs {
    Any,
    /// Concurrent writers (SQLite serializes them, hiding the bug).
    Postgres,
    /// A server the harness may crash (`--pg-data`).
    PostgresCrash,
}

/// One row of the matrix: how to expose a bug mode and what must be found.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// `None`: the correct build.
    #[serde(serialize_with = "bug_name")]
    pub bug: Option<Bug>,
    pub nemesis: &'static str,
    /// Extra `haunt run` arguments.
    pub args: &'static [&'static str],
    pub needs: Needs,
    /// Runs on PostgreSQL (`--db`) rather than on a fresh SQLite file. A bug
    /// mode that needs nothing of the database runs on both, a row each.
    pub postgres: bool,
    /// What every run must show.
    pub expected: Expect,
    /// A row of `haunt matrix --system FILE`: the system's name (it runs the
    /// file's system, under the row's fault, and must stay valid).
    pub system: Option<String>,
    /// A row of `haunt matrix --transport NAME`: the pipeline over that broker.
    #[serde(serialize_with = "transport_name", skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportSpec>,
}

fn transport_name<S: serde::Serializer>(t: &Option<TransportSpec>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.collect_str(t),
        None => s.serialize_none(),
    }
}

/// What a run of a case must show to count as caught (or, for the correct
/// build, as passing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The correct build: verdict `true`.
    Valid,
    /// A safety bug: this anomaly is reported.
    Anomaly(&'static str),
    /// A liveness bug: messages stay leased past the quiesce timeout, so the
    /// queue never drains: verdict `"unknown"` with orders pending, and no
    /// failing anomaly.
    NotDrained,
}

impl Expect {
    pub fn name(self) -> &'static str {
        match self {
            Expect::Valid => "valid",
            Expect::Anomaly(a) => a,
            Expect::NotDrained => "not-drained",
        }
    }
}

impl Serialize for Expect {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

fn bug_name<S: serde::Serializer>(bug: &Option<Bug>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(bug.map_or("correct", |b| b.name()))
}

impl Case {
    pub fn name(&self) -> String {
        if let Some(system) = &self.system {
            return format!("{system} under {}", self.nemesis);
        }
        let what = self.row_name();
        if let Some(t) = self.transport {
            return format!("{what} ({t})");
        }
        match (self.needs, self.postgres) {
            // Only PostgreSQL shows it: the name says enough.
            (Needs::Postgres | Needs::PostgresCrash, _) => what.to_owned(),
            (Needs::Any, false) => format!("{what} (sqlite)"),
            (Needs::Any, true) => format!("{what} (postgres)"),
        }
    }

    /// What `--only` calls the row: its bug mode, `correct`, or, for a
    /// transport that claims at-most-once, `at-most-once`.
    pub fn row_name(&self) -> &'static str {
        match (self.bug, self.transport) {
            (Some(b), _) => b.name(),
            (None, Some(t)) if t.claim() == Guarantee::AtMostOnce => "at-most-once",
            (None, _) => "correct",
        }
    }

    /// The backend the row runs on, as `--backends` names it.
    pub fn backend(&self) -> &'static str {
        if self.postgres { "postgres" } else { "sqlite" }
    }

    /// Whether one run's results count as caught (or, for the correct build, as passing).
    pub fn passes(&self, results: &Results) -> bool {
        match self.expected {
            Expect::Valid => results.valid == Verdict::Valid,
            Expect::Anomaly(anomaly) => results.anomalies.get(anomaly).is_some_and(|a| a.count > 0),
            Expect::NotDrained => {
                results.valid == Verdict::Unknown && results.pending > 0 && results.failing_anomalies().next().is_none()
            }
        }
    }
}

/// The bug modes and the correct build, in the order the table shows them.
pub fn cases() -> Vec<Case> {
    const FAST_LEASE: &[&str] = &["--visibility-timeout-ms", "500"];
    // Every fault, three at a time: a short run fits each of them once (the
    // run refuses a time limit that cannot), and faults overlap as in the wild.
    const ALL_FAULTS: &[&str] = &["--visibility-timeout-ms", "500", "--faults-at-once", "3"];
    let on_sqlite = vec![
        Case {
            bug: Some(Bug::NoInbox),
            nemesis: "ack-loss",
            args: FAST_LEASE,
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Anomaly("double-applied"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::InboxOutsideTxn),
            nemesis: "db-error",
            args: FAST_LEASE,
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Anomaly("lost-effect"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::AckBeforeProcess),
            nemesis: "db-error",
            args: FAST_LEASE,
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Anomaly("lost-effect"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::NonAtomicEnqueue),
            nemesis: "db-error",
            args: FAST_LEASE,
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Anomaly("failed-but-present"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::ReadModifyWriteProjection),
            nemesis: "none",
            // Many writers on two hot items: lost updates need overlap.
            args: &["--rate", "300", "--concurrency", "16", "--items", "2", "--workers", "4"],
            needs: Needs::Postgres,
            postgres: true,
            expected: Expect::Anomaly("projection-mismatch"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::WorkerClockLease),
            // A skewed worker leases ten minutes ahead: an ack it loses leaves
            // the message invisible for those ten minutes, past the drain. Acks
            // are lost all run long (--ack-fail-rate), so every skew window
            // meets lost acks; as a second fault's window it met them only when
            // the two overlapped (8 seeds in 10). The lease outlasts a skew
            // window, so the worker does not take its own message back while
            // skewed; one worker, so every skew meets it.
            nemesis: "clock-skew",
            args: &[
                "--workers",
                "1",
                "--visibility-timeout-ms",
                "5000",
                "--ack-fail-rate",
                "0.2",
                "--quiesce-timeout-s",
                "15",
            ],
            needs: Needs::Any,
            postgres: false,
            expected: Expect::NotDrained,
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::NoLeaseToken),
            // A worker stalls right after a lease, past it (the stall fault): with
            // one delivery allowed, the messages' new holder parks them, and the
            // zombie applies them anyway. The stall makes the zombie every time;
            // a pause only did when it happened to stop a worker holding a lease.
            nemesis: "stall",
            args: &["--visibility-timeout-ms", "500", "--delivery-attempts-max", "1"],
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Anomaly("projection-mismatch"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::NewEventIdOnRetry),
            // The client's link only: on PostgreSQL the delay could otherwise
            // pick a worker's database link, and no client would retry (5
            // seeds in 10 missed).
            nemesis: "delay",
            args: &["--fault-targets", "client<->api"],
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Anomaly("unexpected-effect"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::DlqDrop),
            nemesis: "db-error",
            // One delivery: every delivery the db-error window fails is parked,
            // and dropped. With two, a message had to fail twice inside the
            // window, and 8 s runs lost 0 to 7 messages (3 seeds in 10 none).
            args: &["--visibility-timeout-ms", "500", "--delivery-attempts-max", "1"],
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Anomaly("lost-effect"),
            system: None,
            transport: None,
        },
        Case {
            bug: Some(Bug::AsyncCommit),
            nemesis: "db-restart",
            // Only the commits of the last few hundred milliseconds before a
            // crash are at risk: crash often, with many commits in flight.
            args: &[
                "--visibility-timeout-ms",
                "500",
                "--nemesis-interval-s",
                "0.5",
                "--rate",
                "300",
                "--concurrency",
                "16",
            ],
            needs: Needs::PostgresCrash,
            postgres: true,
            expected: Expect::Anomaly("lost-order"),
            system: None,
            transport: None,
        },
        Case {
            bug: None,
            nemesis: "all",
            args: ALL_FAULTS,
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Valid,
            system: None,
            transport: None,
        },
    ];
    // What needs nothing of the database runs on PostgreSQL too, right after.
    let mut out = Vec::with_capacity(on_sqlite.len() * 2);
    for case in on_sqlite {
        let both = case.needs == Needs::Any;
        out.push(case.clone());
        if both {
            out.push(Case { postgres: true, ..case });
        }
    }
    out
}

/// The rows of `haunt matrix --transport NAME`: the pipeline over that broker
/// (on SQLite). An at-least-once mode: the correct build under the broker's
/// faults and the workers', and the bug modes that concern a consumer and a
/// relay, each under the fault that exposes it. An at-most-once mode: its
/// claim, measured: with one consumer, killed, it loses.
pub fn transport_cases(transport: TransportSpec) -> Vec<Case> {
    let case = |bug, nemesis, args: &'static [&'static str], expected| Case {
        bug,
        nemesis,
        args,
        needs: Needs::Any,
        postgres: false,
        expected,
        system: None,
        transport: Some(transport),
    };
    if transport.claim() == Guarantee::AtMostOnce {
        let args = &["--workers", "1", "--fault-targets", "worker-1"];
        return vec![case(None, "kill", args, Expect::Anomaly("lost-effect"))];
    }
    const LEASE: &[&str] = &["--visibility-timeout-ms", "1000"];
    let everything = if transport.server_is_durable() {
        "kill,pause,partition,ack-loss,broker-restart"
    } else {
        "kill,pause,partition,ack-loss"
    };
    let mut cases = vec![
        case(Some(Bug::NoInbox), "ack-loss", LEASE, Expect::Anomaly("double-applied")),
        // Acked on receipt: what then fails to apply is gone.
        case(Some(Bug::AckBeforeProcess), "db-error", LEASE, Expect::Anomaly("lost-effect")),
        // Deleted from the outbox, then refused by a broker the relay cannot
        // reach: every batch of the partition is lost.
        case(
            Some(Bug::RelayMarksBeforePublish),
            "partition",
            &["--visibility-timeout-ms", "1000", "--fault-targets", "relay<->broker"],
            Expect::Anomaly("lost-effect"),
        ),
        case(None, everything, &["--visibility-timeout-ms", "1000", "--faults-at-once", "2"], Expect::Valid),
    ];
    if transport.has_publisher_confirms() {
        // Deleted from the outbox before the broker confirmed. A partition of
        // the relay's link holds everything published during it in the
        // network, and the connection dies with it when the link heals: every
        // publish of the partition is gone, where a broker crash would drop
        // only what was in flight at that instant (caught in 2 of 5 seeds).
        let row = case(
            Some(Bug::NoPublisherConfirms),
            "partition",
            &["--visibility-timeout-ms", "1000", "--fault-targets", "relay<->broker"],
            Expect::Anomaly("lost-effect"),
        );
        cases.insert(cases.len() - 1, row);
    }
    cases
}

/// The rows of `haunt matrix --system FILE`: each fault the file allows, then
/// all of them at once; every run must be valid.
pub fn system_cases(path: &Path) -> anyhow::Result<Vec<Case>> {
    let spec = crate::systems::system_file::spec::load(path)?;
    let faults = crate::systems::system_file::faults_allowed(&spec);
    anyhow::ensure!(
        !faults.is_empty(),
        "{}: it allows no fault (no node takes kill or pause, no link)",
        path.display()
    );
    let mut nemeses: Vec<&'static str> = faults.iter().map(|f| f.name()).collect();
    if nemeses.len() > 1 {
        nemeses.push("all");
    }
    Ok(nemeses
        .into_iter()
        .map(|nemesis| Case {
            bug: None,
            nemesis,
            // All at once: two schedules side by side, so that faults overlap
            // (and the round fits a shorter run).
            args: if nemesis == "all" { &["--faults-at-once", "2"] } else { &[] },
            needs: Needs::Any,
            postgres: false,
            expected: Expect::Valid,
            system: Some(spec.name.clone()),
            transport: None,
        })
        .collect())
}
