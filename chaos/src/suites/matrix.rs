//! `haunt matrix`: each bug mode run under the faults that expose it, seed
//! after seed, and the correct build under all faults; the table says whether
//! the checker caught each one with the anomaly it should.
//!
//! [`run`] is the whole matrix: each run a child `haunt run` (a whole run with
//! its own backend, not a node of a system under test), its results read back
//! from its run directory, the table and `matrix.json` written beside them.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use haunt_checker::{Results, Verdict};
use haunt_store::Bug;
use haunt_transport::{Guarantee, TransportSpec};
use serde::Serialize;

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

/// One run of one case.
#[derive(Debug, Clone, Serialize)]
pub struct RunRecord {
    pub seed: u64,
    pub run_dir: String,
    pub verdict: String,
    pub passed: bool,
    /// Reported anomalies and their counts.
    pub anomalies: BTreeMap<String, u64>,
    /// Present orders still queued at the end.
    pub pending: u64,
    /// Seconds from the run's start to the first op of the expected anomaly.
    pub first_anomaly_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunRecord {
    pub fn from_results(case: &Case, seed: u64, run_dir: String, results: &Results) -> RunRecord {
        let anomalies = results.failing_anomalies().map(|(n, r)| (n.to_owned(), r.count)).collect();
        let first_anomaly_s = Some(case.expected.name())
            .and_then(|a| results.anomalies.get(a))
            .and_then(|r| r.first_time_ns)
            .map(|ns| ns as f64 / 1e9);
        RunRecord {
            seed,
            run_dir,
            verdict: results.valid.as_str().to_owned(),
            passed: case.passes(results),
            anomalies,
            pending: results.pending,
            first_anomaly_s,
            error: None,
        }
    }

    pub fn failed_to_run(seed: u64, error: String) -> RunRecord {
        RunRecord {
            seed,
            run_dir: String::new(),
            verdict: "error".into(),
            passed: false,
            anomalies: BTreeMap::new(),
            pending: 0,
            first_anomaly_s: None,
            error: Some(error),
        }
    }
}

/// One row of the finished table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub case: Case,
    pub runs: Vec<RunRecord>,
    /// Why the case did not run (no PostgreSQL given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
}

impl Row {
    pub fn passed_count(&self) -> usize {
        self.runs.iter().filter(|r| r.passed).count()
    }

    /// Bug modes: caught in at least ⌈0.9·N⌉ runs. The correct build: valid in
    /// every run. A skipped row has not passed: see [`verdict`].
    pub fn ok(&self) -> bool {
        let n = self.runs.len();
        if self.skipped.is_some() || n == 0 {
            return false;
        }
        match self.case.expected {
            Expect::Valid => self.passed_count() == n,
            _ => self.passed_count() * 10 >= n * 9,
        }
    }

    fn median_first_anomaly_s(&self) -> Option<f64> {
        let mut v: Vec<f64> = self.runs.iter().filter(|r| r.passed).filter_map(|r| r.first_anomaly_s).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    fn reported(&self) -> String {
        let mut total: BTreeMap<&str, u64> = BTreeMap::new();
        for r in &self.runs {
            for (a, n) in &r.anomalies {
                *total.entry(a).or_default() += n;
            }
        }
        if total.is_empty() {
            return "none".into();
        }
        total.iter().map(|(a, n)| format!("{a} ({n})")).collect::<Vec<_>>().join(", ")
    }
}

/// What a whole matrix shows, and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatrixVerdict {
    /// Every row ran and met its bar.
    Passed,
    /// These rows ran and fell below their bar (exit 1), whatever else happened.
    BelowBar(Vec<String>),
    /// These rows did not run (exit 2, "unknown"): a matrix with a row missing
    /// says nothing about that row's bug mode, so it cannot pass. A user who
    /// wants fewer rows asks for them with `--only`.
    Incomplete(Vec<String>),
}

impl MatrixVerdict {
    pub fn exit_code(&self) -> i32 {
        match self {
            MatrixVerdict::Passed => 0,
            MatrixVerdict::BelowBar(_) => 1,
            MatrixVerdict::Incomplete(_) => 2,
        }
    }
}

impl MatrixVerdict {
    /// The verdict in words, as the matrix's last line says it.
    pub fn summary(&self) -> String {
        match self {
            MatrixVerdict::Passed => "every row ran and met its bar".to_owned(),
            MatrixVerdict::BelowBar(rows) => format!("below the bar: {}", rows.join(", ")),
            MatrixVerdict::Incomplete(rows) => format!(
                "UNKNOWN: these rows did not run: {} (give --db and --pg-data, or ask for fewer rows with --only or --backends sqlite)",
                rows.join(", ")
            ),
        }
    }
}

pub fn verdict(rows: &[Row]) -> MatrixVerdict {
    let below: Vec<String> = rows.iter().filter(|r| r.skipped.is_none() && !r.ok()).map(|r| r.case.name()).collect();
    let skipped: Vec<String> = rows.iter().filter(|r| r.skipped.is_some()).map(|r| r.case.name()).collect();
    match (below.is_empty(), skipped.is_empty()) {
        (false, _) => MatrixVerdict::BelowBar(below),
        (true, false) => MatrixVerdict::Incomplete(skipped),
        (true, true) => MatrixVerdict::Passed,
    }
}

/// The table in Markdown.
pub fn markdown(rows: &[Row], command: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| bug mode | faults | expected | caught | anomalies reported (all seeds) | median time to first anomalous op |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for row in rows {
        let expected = match row.case.expected {
            Expect::Valid => "verdict true".to_owned(),
            Expect::Anomaly(a) => format!("`{a}`"),
            Expect::NotDrained => "not drained (verdict unknown, orders pending)".to_owned(),
        };
        let caught = match (&row.skipped, row.case.expected == Expect::Valid) {
            (Some(why), _) => format!("skipped: {why}"),
            (None, true) => format!("{}/{} valid", row.passed_count(), row.runs.len()),
            (None, false) => {
                format!("{}/{}{}", row.passed_count(), row.runs.len(), if row.ok() { "" } else { " **(below 90 %)**" })
            }
        };
        let median = row.median_first_anomaly_s().map_or("-".to_owned(), |s| format!("{s:.1} s"));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            row.case.name(),
            row.case.nemesis,
            expected,
            caught,
            row.reported(),
            median
        );
    }
    let _ = writeln!(out, "\nProduced by `{command}`.");
    out
}

/// A whole matrix: which rows, how many seeds, how long each run, where.
#[derive(Debug, Clone)]
pub struct MatrixOptions {
    /// The `haunt` executable each run is started from (`haunt run`).
    pub haunt: PathBuf,
    /// Runs per bug mode (and of the correct build), seeds 1..=N.
    pub seeds: u64,
    /// Length of each run's workload, in seconds.
    pub time_limit_s: u64,
    /// A PostgreSQL server (any database URL on it); each PostgreSQL run gets
    /// a fresh database there. Without it those rows are skipped.
    pub db: Option<String>,
    /// The data directory of that server, which async-commit's runs crash.
    pub pg_data: Option<PathBuf>,
    /// Where the runs and the table go (under `matrix/<unix time>`).
    pub store: PathBuf,
    /// Only these rows: bug mode names, or `correct`; empty for all.
    pub only: Vec<String>,
    /// Only the rows on these backends (`sqlite`, `postgres`).
    pub backends: Vec<String>,
    /// A system file: the rows are its system under each fault it allows,
    /// alone and all together, instead of haunt's bug modes.
    pub system: Option<PathBuf>,
    /// A broker transport: the rows are [`transport_cases`].
    pub transport: Option<TransportSpec>,
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

/// A finished matrix.
#[derive(Debug)]
pub struct MatrixOutcome {
    /// The matrix's directory: `runs/`, `matrix.md`, `matrix.json`.
    pub dir: PathBuf,
    /// The table in Markdown, as `matrix.md` holds it.
    pub table: String,
    pub rows: Vec<Row>,
    pub verdict: MatrixVerdict,
}

fn selected(case: &Case, options: &MatrixOptions) -> bool {
    let named = options.only.is_empty()
        || options.only.iter().any(|o| match &case.system {
            Some(_) => o == case.nemesis,
            None => o == case.row_name(),
        });
    named && options.backends.iter().any(|b| b == case.backend())
}

fn skip_reason(case: &Case, options: &MatrixOptions) -> Option<String> {
    match case.needs {
        Needs::Any if case.postgres && options.db.is_none() => Some("needs --db postgres://…".into()),
        Needs::Any => None,
        Needs::Postgres if options.db.is_none() => Some("needs --db postgres://…".into()),
        Needs::PostgresCrash if options.db.is_none() || options.pg_data.is_none() => {
            Some("needs --db postgres://… and --pg-data".into())
        }
        _ => None,
    }
}

/// One run of `case` as a child `haunt run`, on a scratch database of its own
/// when the case runs on PostgreSQL; whatever goes wrong is the record's error.
async fn one_run(case: &Case, seed: u64, options: &MatrixOptions, runs_dir: &Path, n: usize) -> RunRecord {
    let scratch = match (&options.db, case.postgres) {
        (Some(admin), true) => {
            match ScratchDb::create(admin, &format!("haunt_matrix_{}_{n}", std::process::id())).await {
                Ok(db) => Some(db),
                Err(e) => return RunRecord::failed_to_run(seed, format!("{e:#}")),
            }
        }
        _ => None,
    };
    let mut command = Command::new(&options.haunt);
    command.arg("run");
    if let Some(system) = &options.system {
        command.arg("--system").arg(system);
    }
    command
        .arg("--store")
        .arg(runs_dir)
        .args(["--seed", &seed.to_string(), "--time-limit-s", &options.time_limit_s.to_string()])
        .args(["--nemesis", case.nemesis, "--quiet"]);
    if !case.args.contains(&"--nemesis-interval-s") {
        // About six faults a run, however long the run: a short run must still
        // see the faults that expose its bug.
        command.args(["--nemesis-interval-s", &(options.time_limit_s as f64 / 6.0).clamp(1.0, 5.0).to_string()]);
    }
    command.args(case.args);
    if let Some(bug) = case.bug {
        command.args(["--bug", bug.name()]);
    }
    if let Some(transport) = case.transport {
        command.args(["--transport", &transport.to_string()]);
    }
    if let Some(db) = &scratch {
        command.args(["--db", &db.url]);
        if let Some(data) = &options.pg_data {
            command.arg("--pg-data").arg(data);
        }
    }
    let record = match child_run(command, runs_dir).await {
        Ok((dir, results)) => RunRecord::from_results(case, seed, dir.display().to_string(), &results),
        Err(e) => RunRecord::failed_to_run(seed, e),
    };
    if let Some(db) = scratch {
        db.drop_now().await;
    }
    record
}

/// Runs `command`, a child `haunt run --store runs_dir …`, to its end, and
/// reads back its run directory and results; an exit other than a verdict's
/// (0, 1 or 2), or a run without results, is the error.
pub(crate) async fn child_run(mut command: Command, runs_dir: &Path) -> Result<(PathBuf, Results), String> {
    crate::backends::local::interrupt_when_parent_dies(&mut command);
    let out = match tokio::task::spawn_blocking(move || command.output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(e) => return Err(e.to_string()),
    };
    if !matches!(out.status.code(), Some(0..=2)) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(format!("haunt run exited {:?}: {}", out.status.code(), stderr.trim()));
    }
    let dir = std::fs::canonicalize(runs_dir.join("latest")).map_err(|e| format!("finding the run: {e}"))?;
    let text = std::fs::read_to_string(dir.join("results.json")).map_err(|e| format!("finding the run: {e}"))?;
    let results = serde_json::from_str(&text).map_err(|e| format!("reading results: {e}"))?;
    Ok((dir, results))
}

/// Runs the matrix: every selected row, seed after seed, one child `haunt run`
/// at a time; writes `matrix.md` and `matrix.json`. `progress` gets a line as
/// the matrix starts, for each skipped row and for each finished run.
pub async fn run(options: &MatrixOptions, mut progress: impl FnMut(&str)) -> anyhow::Result<MatrixOutcome> {
    use anyhow::Context;
    anyhow::ensure!(options.seeds > 0, "--seeds must be positive");
    anyhow::ensure!(
        options.system.is_none() || options.transport.is_none(),
        "--system and --transport: a system file brings its own transport"
    );
    let all_cases = match (&options.system, options.transport) {
        (Some(path), _) => system_cases(path)?,
        (None, Some(t)) if t.is_broker() => transport_cases(t),
        (None, _) => cases(),
    };
    let known: Vec<String> = match &options.system {
        Some(_) => all_cases.iter().map(|c| c.nemesis.to_owned()).collect(),
        None => all_cases.iter().map(|c| c.row_name().to_owned()).collect(),
    };
    if let Some(bad) = options.only.iter().find(|o| !known.contains(o)) {
        anyhow::bail!("--only {bad:?}: not a row; known: {}", known.join(", "));
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let dir = options.store.join("matrix").join(stamp.to_string());
    let runs_dir = dir.join("runs");
    std::fs::create_dir_all(&runs_dir).with_context(|| format!("creating {}", runs_dir.display()))?;
    progress(&format!(
        "matrix: {} seeds per row, {} s runs, into {}",
        options.seeds,
        options.time_limit_s,
        dir.display()
    ));

    let mut rows = Vec::new();
    let mut n = 0;
    for case in all_cases.into_iter().filter(|c| selected(c, options)) {
        if let Some(why) = skip_reason(&case, options) {
            progress(&format!("{:<30} SKIPPED: {why}", case.name()));
            rows.push(Row { case, runs: Vec::new(), skipped: Some(why) });
            continue;
        }
        let mut runs = Vec::new();
        for seed in 1..=options.seeds {
            n += 1;
            let started = Instant::now();
            let record = one_run(&case, seed, options, &runs_dir, n).await;
            let what = match (&record.error, record.passed, case.expected) {
                (Some(e), _, _) => format!("ERROR {e}"),
                (None, true, Expect::Valid) => "valid".to_owned(),
                (None, false, Expect::Valid) => format!("NOT VALID ({})", record.verdict),
                (None, true, Expect::NotDrained) => {
                    format!("caught: not drained, {} orders pending", record.pending)
                }
                (None, true, _) => format!("caught {:?}", record.anomalies),
                (None, false, _) => format!("MISSED (verdict {}, {:?})", record.verdict, record.anomalies),
            };
            progress(&format!("{:<30} seed {seed:<3} {what}  [{:.0} s]", case.name(), started.elapsed().as_secs_f64()));
            runs.push(record);
        }
        rows.push(Row { case, runs, skipped: None });
    }

    let command = format!(
        "haunt matrix{}{}{} --seeds {} --time-limit-s {}{}{}{}",
        options.system.as_ref().map(|p| format!(" --system {}", p.display())).unwrap_or_default(),
        options.transport.filter(|t| t.is_broker()).map(|t| format!(" --transport {t}")).unwrap_or_default(),
        // The table holds only these rows: the line reproduces the table.
        if options.only.is_empty() { String::new() } else { format!(" --only {}", options.only.join(" ")) },
        options.seeds,
        options.time_limit_s,
        if options.backends.len() == 2 { String::new() } else { format!(" --backends {}", options.backends.join(",")) },
        if options.db.is_some() { " --db postgres://…" } else { "" },
        if options.pg_data.is_some() { " --pg-data DIR" } else { "" }
    );
    let table = markdown(&rows, &command);
    std::fs::write(dir.join("matrix.md"), &table)?;
    let json = serde_json::json!({ "seeds": options.seeds, "time_limit_s": options.time_limit_s, "rows": rows });
    std::fs::write(dir.join("matrix.json"), serde_json::to_string_pretty(&json)? + "\n")?;
    let verdict = verdict(&rows);
    Ok(MatrixOutcome { dir, table, rows, verdict })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transport_has_rows_and_an_at_most_once_mode_is_measured_against_its_claim() {
        for transport in TransportSpec::all().into_iter().filter(|t| t.is_broker()) {
            let cases = transport_cases(transport);
            let names: Vec<&str> = cases.iter().map(|c| c.row_name()).collect();
            if transport.claim() == Guarantee::AtMostOnce {
                assert_eq!(names, ["at-most-once"], "{transport}");
                assert_eq!(cases[0].expected, Expect::Anomaly("lost-effect"));
            } else {
                assert_eq!(names.last(), Some(&"correct"), "{transport}");
                assert!(names.contains(&"no-inbox") && names.contains(&"relay-marks-before-publish"), "{transport}");
                // Where the relay can skip the broker's confirmation, that bug
                // runs under a cut of the relay's link, which loses every
                // publish of the cut, not under a crash that loses by luck.
                let unconfirmed = cases.iter().find(|c| c.bug == Some(Bug::NoPublisherConfirms));
                assert_eq!(unconfirmed.is_some(), transport.has_publisher_confirms(), "{transport}");
                if let Some(c) = unconfirmed {
                    assert_eq!((c.nemesis, c.expected), ("partition", Expect::Anomaly("lost-effect")), "{transport}");
                    assert!(c.args.windows(2).any(|w| w == ["--fault-targets", "relay<->broker"]), "{transport}");
                }
            }
            assert!(cases.iter().all(|c| c.transport == Some(transport) && c.name().contains(&transport.to_string())));
        }
    }

    #[test]
    fn every_bug_mode_has_a_row_on_each_backend_it_applies_to() {
        let cases = cases();
        for bug in Bug::ALL {
            let rows: Vec<&Case> = cases.iter().filter(|c| c.bug == Some(bug)).collect();
            let backends: Vec<bool> = rows.iter().map(|c| c.postgres).collect();
            match rows[0].needs {
                Needs::Any => assert_eq!(backends, vec![false, true], "{bug}: SQLite, then PostgreSQL"),
                _ => assert_eq!(backends, vec![true], "{bug}: PostgreSQL only"),
            }
        }
        let correct: Vec<String> = cases.iter().filter(|c| c.bug.is_none()).map(|c| c.name()).collect();
        assert_eq!(correct, vec!["correct (sqlite)", "correct (postgres)"]);
        let mut names: Vec<String> = cases.iter().map(|c| c.name()).collect();
        names.dedup();
        assert_eq!(names.len(), cases.len(), "row names are unique");
        for c in &cases {
            assert_eq!(
                c.bug.is_none(),
                c.expected == Expect::Valid,
                "{}: only the correct build expects valid",
                c.name()
            );
            if let Expect::Anomaly(a) = c.expected {
                assert!(haunt_checker::ANOMALIES.contains(&a), "{a}");
            }
        }
    }

    fn row(bug: Option<Bug>, passed: &[bool]) -> Row {
        let case = cases().into_iter().find(|c| c.bug == bug).unwrap();
        let runs =
            passed.iter().map(|&p| RunRecord { passed: p, ..RunRecord::failed_to_run(1, String::new()) }).collect();
        Row { case, runs, skipped: None }
    }

    #[test]
    fn the_pass_rule_is_nine_in_ten_for_bugs_and_all_for_the_correct_build() {
        assert!(row(Some(Bug::NoInbox), &[true; 10][..].iter().copied().chain([]).collect::<Vec<_>>()).ok());
        let mut nine = vec![true; 9];
        nine.push(false);
        assert!(row(Some(Bug::NoInbox), &nine).ok());
        let mut eight = vec![true; 8];
        eight.extend([false, false]);
        assert!(!row(Some(Bug::NoInbox), &eight).ok());
        assert!(!row(Some(Bug::NoInbox), &[false]).ok(), "one seed: it must be caught");
        assert!(!row(None, &nine).ok(), "the correct build may never fail");
        assert!(row(None, &[true, true]).ok());
        assert!(!row(Some(Bug::NoInbox), &[]).ok(), "no run: nothing passed");
    }

    #[test]
    fn a_skipped_row_makes_the_matrix_unknown_and_a_missed_one_false() {
        let skipped = |bug| Row { skipped: Some("needs --db".into()), ..row(bug, &[]) };
        let all_ran = vec![row(Some(Bug::NoInbox), &[true]), row(None, &[true])];
        assert_eq!(verdict(&all_ran), MatrixVerdict::Passed);
        assert_eq!(verdict(&all_ran).exit_code(), 0);

        let mut one_skipped = all_ran.clone();
        one_skipped.push(skipped(Some(Bug::AsyncCommit)));
        assert_eq!(verdict(&one_skipped), MatrixVerdict::Incomplete(vec!["async-commit".into()]));
        assert_eq!(verdict(&one_skipped).exit_code(), 2);

        let mut missed = one_skipped.clone();
        missed.push(row(Some(Bug::DlqDrop), &[false]));
        assert_eq!(verdict(&missed), MatrixVerdict::BelowBar(vec!["dlq-drop (sqlite)".into()]));
        assert_eq!(verdict(&missed).exit_code(), 1);
    }
}

/// A database of its own for each PostgreSQL run, on the server behind
/// `admin_url`; dropped with the value.
#[derive(Debug)]
pub struct ScratchDb {
    admin_url: String,
    name: String,
    pub url: String,
}

impl ScratchDb {
    pub async fn create(admin_url: &str, name: &str) -> anyhow::Result<ScratchDb> {
        use anyhow::Context;
        use sqlx::Connection;
        let mut conn =
            sqlx::PgConnection::connect(admin_url).await.with_context(|| format!("connecting to {admin_url}"))?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
            .execute(&mut conn)
            .await?;
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await?;
        let _ = conn.close().await;
        let (base, _) = admin_url.split_once('?').unwrap_or((admin_url, ""));
        let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
        Ok(ScratchDb { admin_url: admin_url.to_owned(), name: name.to_owned(), url: format!("{base}/{name}") })
    }

    pub async fn drop_now(self) {
        use sqlx::Connection;
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin_url).await {
            let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut conn).await;
            let _ = conn.close().await;
        }
    }
}
