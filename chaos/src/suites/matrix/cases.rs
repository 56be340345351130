//! The rows of the matrix: the bug-mode catalogue, what exposes each mode
//! and what a run must show to count as caught, and the rows for a transport
//! or a system file.

use std::borrow::Cow;

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
    /// The row's faults, as `--nemesis` takes them.
    pub nemesis: Cow<'static, str>,
    /// What the row's runs change of the matrix's options.
    pub tuning: Tuning,
    pub needs: Needs,
    /// Runs on PostgreSQL (`--db`) rather than on a fresh SQLite file. A bug
    /// mode that needs nothing of the database runs on both, a row each.
    pub postgres: bool,
    /// What every run must show.
    pub expected: Expect,
    /// A row of `haunt matrix --system FILE`: the system's name (it runs the
    /// file's system, under the row's fault, and must stay valid).
    pub system: Option<String>,
    /// Of a system file with `[[variant]]`s: the variant the row runs, whose
    /// own expectation is the row's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
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

/// What a row changes of a run's options, typed: each set field is written
/// over the matrix's options before the run (`Tuning::apply`), and
/// `matrix.json` lists the set fields under the names of `haunt run`'s
/// flags.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tuning {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nemesis_interval_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults_at_once: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_fail_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quiesce_timeout_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery_attempts_max: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordered_keys: Option<usize>,
    #[serde(skip_serializing_if = "<[&str]>::is_empty")]
    pub fault_targets: &'static [&'static str],
}

impl Tuning {
    /// Nothing changed.
    pub const NONE: Tuning = Tuning {
        visibility_timeout_ms: None,
        nemesis_interval_s: None,
        faults_at_once: None,
        workers: None,
        rate: None,
        concurrency: None,
        items: None,
        ack_fail_rate: None,
        quiesce_timeout_s: None,
        delivery_attempts_max: None,
        ordered_keys: None,
        fault_targets: &[],
    };

    /// Writes the set fields over `options`.
    pub fn apply(&self, options: &mut RunOptions) {
        if let Some(ms) = self.visibility_timeout_ms {
            options.visibility_timeout = Duration::from_millis(ms);
        }
        if let Some(s) = self.nemesis_interval_s {
            options.nemesis_interval = Duration::from_secs_f64(s);
        }
        if let Some(s) = self.quiesce_timeout_s {
            options.quiesce_timeout = Duration::from_secs(s);
        }
        options.faults_at_once = self.faults_at_once.unwrap_or(options.faults_at_once);
        options.workers = self.workers.unwrap_or(options.workers);
        options.rate = self.rate.unwrap_or(options.rate);
        options.concurrency = self.concurrency.unwrap_or(options.concurrency);
        options.items = self.items.unwrap_or(options.items);
        options.ack_fail_rate = self.ack_fail_rate.unwrap_or(options.ack_fail_rate);
        options.delivery_attempts_max = self.delivery_attempts_max.unwrap_or(options.delivery_attempts_max);
        options.ordered_keys = self.ordered_keys.unwrap_or(options.ordered_keys);
        if !self.fault_targets.is_empty() {
            options.fault_targets = self.fault_targets.iter().map(|t| (*t).to_owned()).collect();
        }
    }
}

/// A short lease, so that a run of seconds sees many leases end.
const FAST_LEASE: Tuning = Tuning { visibility_timeout_ms: Some(500), ..Tuning::NONE };
/// A broker's lease: long enough for its consumers' round trips.
const BROKER_LEASE: Tuning = Tuning { visibility_timeout_ms: Some(1000), ..Tuning::NONE };
/// A broker's lease, with four keys whose orders are fixed in real time.
const ORDERED_BROKER_LEASE: Tuning = Tuning { ordered_keys: Some(4), ..BROKER_LEASE };
/// The relay's link to the broker cut, under a broker's lease.
const RELAY_CUT: Tuning = Tuning { fault_targets: &["relay<->broker"], ..BROKER_LEASE };

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
        match (&self.system, &self.variant) {
            (Some(system), Some(variant)) => return format!("{system} {variant} under {}", self.nemesis),
            (Some(system), None) => return format!("{system} under {}", self.nemesis),
            _ => {}
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

/// A row of the bug-mode catalogue (on SQLite; [`cases`] adds its
/// PostgreSQL twin where it needs nothing of the database).
fn bug_row(bug: Option<Bug>, nemesis: &'static str, tuning: Tuning, needs: Needs, expected: Expect) -> Case {
    let postgres = needs != Needs::Any;
    let nemesis = Cow::Borrowed(nemesis);
    Case { bug, nemesis, tuning, needs, postgres, expected, system: None, variant: None, transport: None }
}

/// The bug modes and the correct build, in the order the table shows them.
pub fn cases() -> Vec<Case> {
    use Expect::{Anomaly, NotDrained, Valid};
    use Needs::{Any, Postgres, PostgresCrash};
    let on_sqlite = [
        bug_row(Some(Bug::NoInbox), "ack-loss", FAST_LEASE, Any, Anomaly("double-applied")),
        bug_row(Some(Bug::InboxOutsideTxn), "db-error", FAST_LEASE, Any, Anomaly("lost-effect")),
        bug_row(Some(Bug::AckBeforeProcess), "db-error", FAST_LEASE, Any, Anomaly("lost-effect")),
        bug_row(Some(Bug::NonAtomicEnqueue), "db-error", FAST_LEASE, Any, Anomaly("failed-but-present")),
        // Many writers on two hot items: lost updates need overlap.
        bug_row(
            Some(Bug::ReadModifyWriteProjection),
            "none",
            Tuning { rate: Some(300.0), concurrency: Some(16), items: Some(2), workers: Some(4), ..Tuning::NONE },
            Postgres,
            Anomaly("projection-mismatch"),
        ),
        // A skewed worker leases ten minutes ahead: an ack it loses leaves
        // the message invisible for those ten minutes, past the drain. Acks
        // are lost all run long (--ack-fail-rate), so every skew window
        // meets lost acks; as a second fault's window it met them only when
        // the two overlapped (8 seeds in 10). The lease outlasts a skew
        // window, so the worker does not take its own message back while
        // skewed; one worker, so every skew meets it. A tenth of the acks
        // and 30 s to drain: with a fifth and 15 s, a message of the correct
        // build lost its ack three times in a row often enough that it too
        // stayed pending (seeds 1 and 2 of 3), so the row caught nothing of
        // the bug's own (found shrinking it, 2026-12-05).
        bug_row(
            Some(Bug::WorkerClockLease),
            "clock-skew",
            Tuning {
                workers: Some(1),
                visibility_timeout_ms: Some(5000),
                ack_fail_rate: Some(0.1),
                quiesce_timeout_s: Some(30),
                ..Tuning::NONE
            },
            Any,
            NotDrained,
        ),
        // A worker stalls right after a lease, past it (the stall fault): with
        // one delivery allowed, the messages' new holder parks them, and the
        // zombie applies them anyway. The stall makes the zombie every time;
        // a pause only did when it happened to stop a worker holding a lease.
        bug_row(
            Some(Bug::NoLeaseToken),
            "stall",
            Tuning { delivery_attempts_max: Some(1), ..FAST_LEASE },
            Any,
            Anomaly("projection-mismatch"),
        ),
        // The client's link only: on PostgreSQL the delay could otherwise
        // pick a worker's database link, and no client would retry (5
        // seeds in 10 missed).
        bug_row(
            Some(Bug::NewEventIdOnRetry),
            "delay",
            Tuning { fault_targets: &["client<->api"], ..Tuning::NONE },
            Any,
            Anomaly("unexpected-effect"),
        ),
        // One delivery: every delivery the db-error window fails is parked,
        // and dropped. With two, a message had to fail twice inside the
        // window, and 8 s runs lost 0 to 7 messages (3 seeds in 10 none).
        bug_row(
            Some(Bug::DlqDrop),
            "db-error",
            Tuning { delivery_attempts_max: Some(1), ..FAST_LEASE },
            Any,
            Anomaly("lost-effect"),
        ),
        // Only the commits of the last few hundred milliseconds before a
        // crash are at risk: crash often, with many commits in flight.
        bug_row(
            Some(Bug::AsyncCommit),
            "db-restart",
            Tuning { nemesis_interval_s: Some(0.5), rate: Some(300.0), concurrency: Some(16), ..FAST_LEASE },
            PostgresCrash,
            Anomaly("lost-order"),
        ),
        // Every fault, three at a time: a short run fits each of them once
        // (the run refuses a time limit that cannot), and faults overlap as
        // in the wild.
        bug_row(None, "all", Tuning { faults_at_once: Some(3), ..FAST_LEASE }, Any, Valid),
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
    let case = |bug, nemesis: &'static str, tuning, expected| Case {
        bug,
        nemesis: Cow::Borrowed(nemesis),
        tuning,
        needs: Needs::Any,
        postgres: false,
        expected,
        system: None,
        variant: None,
        transport: Some(transport),
    };
    if transport.claim() == Guarantee::AtMostOnce {
        let one_consumer = Tuning { workers: Some(1), fault_targets: &["worker-1"], ..Tuning::NONE };
        return vec![case(None, "kill", one_consumer, Expect::Anomaly("lost-effect"))];
    }
    let everything = if transport.server_is_durable() {
        "kill,pause,partition,ack-loss,broker-restart"
    } else {
        "kill,pause,partition,ack-loss"
    };
    // A broker that keeps each key's order is run with keys whose orders
    // are fixed in real time, so that every row checks the order too.
    let lease = if transport.order_claim() == OrderClaim::PerKey { ORDERED_BROKER_LEASE } else { BROKER_LEASE };
    // Over Kafka's offsets a lost ack is covered by the next commit, and a
    // failed apply is read again by seeking its partition back, early
    // commit or not: what an ack's loss or an ack on receipt costs shows
    // only when a consumer dies, so those rows kill worker-1, a batch held
    // (a kill a second or so: a group of 24 members spends a killed
    // worker's return rebalancing, when it has no batch to hold or its
    // commit is refused, so one kill in three or four leaves nothing).
    let (redelivers, fails, at_a_consumer) = if transport.acks_are_cumulative() {
        ("kill", "kill", Tuning { fault_targets: &["worker-1"], nemesis_interval_s: Some(1.0), ..lease })
    } else {
        ("ack-loss", "db-error", lease)
    };
    let mut cases = vec![
        case(Some(Bug::NoInbox), redelivers, at_a_consumer, Expect::Anomaly("double-applied")),
        // Acked on receipt: what then fails to apply is gone.
        case(Some(Bug::AckBeforeProcess), fails, at_a_consumer, Expect::Anomaly("lost-effect")),
        // Deleted from the outbox, then refused by a broker the relay cannot
        // reach: every batch of the partition is lost.
        case(Some(Bug::RelayMarksBeforePublish), "partition", RELAY_CUT, Expect::Anomaly("lost-effect")),
        case(None, everything, Tuning { faults_at_once: Some(2), ..lease }, Expect::Valid),
    ];
    if transport.order_claim() == OrderClaim::PerKey {
        // A failed apply waits out its backoff while the rest of its batch,
        // its key's later orders among them, is applied. The db-error fault
        // fails three statements in ten, so most batches and most of their
        // deliveries tried alone; two clients on a key each put about five
        // orders of a key in a batch of ten, and one that fails before one
        // that applies is caught. (Four keys among eight clients put one or
        // two in a batch, and 2 seeds in 10 caught it.)
        let dense = Tuning { concurrency: Some(2), ordered_keys: Some(2), ..BROKER_LEASE };
        let row = case(Some(Bug::RetryAfterNext), "db-error", dense, Expect::Anomaly(REORDERED));
        cases.insert(cases.len() - 1, row);
    }
    if transport.kind == haunt_transport::Kind::Kafka {
        // Committed as received, before the effect: a worker killed with
        // a batch in hand (the aimed kill waits for one) loses it.
        let row = case(Some(Bug::CommitAsyncOnReceipt), "kill", at_a_consumer, Expect::Anomaly("lost-effect"));
        cases.insert(cases.len() - 1, row);
    }
    if transport.has_publisher_confirms() {
        // Deleted from the outbox before the broker confirmed. A partition of
        // the relay's link holds everything published during it in the
        // network, and the connection dies with it when the link heals: every
        // publish of the partition is gone, where a broker crash would drop
        // only what was in flight at that instant (caught in 2 of 5 seeds).
        let row = case(Some(Bug::NoPublisherConfirms), "partition", RELAY_CUT, Expect::Anomaly("lost-effect"));
        cases.insert(cases.len() - 1, row);
    }
    cases
}

/// The rows of `haunt matrix --system FILE`: each fault the file allows, then
/// all of them at once; every run must be valid. A file with `[[variant]]`s
/// has a row per variant instead, under the variant's faults (all the file
/// allows by default), expecting what the variant names.
pub fn system_cases(spec: &SystemSpec) -> anyhow::Result<Vec<Case>> {
    let faults = crate::systems::system_file::faults_allowed(spec);
    anyhow::ensure!(
        !faults.is_empty(),
        "{}: it allows no fault (no node takes kill or pause, no link)",
        spec.file.display()
    );
    let row = |nemesis: Cow<'static, str>, tuning, expected, variant| Case {
        bug: None,
        nemesis,
        tuning,
        needs: Needs::Any,
        postgres: false,
        expected,
        system: Some(spec.name.clone()),
        variant,
        transport: None,
    };
    if !spec.variants.is_empty() {
        return Ok(spec
            .variants
            .iter()
            .map(|v| {
                let nemesis = v.nemesis.clone().map_or(Cow::Borrowed("all"), Cow::Owned);
                // More than two faults: two schedules side by side, as for
                // `all`, so that they fit a short run.
                let many = nemesis == "all" || nemesis.split(',').count() > 2;
                let tuning = if many { Tuning { faults_at_once: Some(2), ..Tuning::NONE } } else { Tuning::NONE };
                let expected = match v.expect {
                    "valid" => Expect::Valid,
                    "not-drained" => Expect::NotDrained,
                    anomaly => Expect::Anomaly(anomaly),
                };
                row(nemesis, tuning, expected, Some(v.name.clone()))
            })
            .collect());
    }
    let mut nemeses: Vec<&'static str> = faults.iter().map(|f| f.name()).collect();
    if nemeses.len() > 1 {
        nemeses.push("all");
    }
    Ok(nemeses
        .into_iter()
        .map(|nemesis| {
            // All at once: two schedules side by side, so that faults overlap
            // (and the round fits a shorter run).
            let tuning =
                if nemesis == "all" { Tuning { faults_at_once: Some(2), ..Tuning::NONE } } else { Tuning::NONE };
            row(Cow::Borrowed(nemesis), tuning, Expect::Valid, None)
        })
        .collect())
}
