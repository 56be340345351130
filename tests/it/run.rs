//! `haunt run` end to end, as a process: verdicts, the report, and that nothing
//! is left running afterwards, also after Ctrl-C.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub(crate) fn haunt_run(store: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_haunt"));
    c.arg("run").arg("--store").arg(store).args(args);
    c
}

/// Every live process whose command line mentions `needle`: children of a run
/// carry the run directory in their `--db` argument.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let is_pid = entry.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit());
        if is_pid && cmdline.contains(needle) && !cmdline.contains(" run ") {
            found.push(format!("{}: {cmdline}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

pub(crate) fn latest(store: &Path) -> PathBuf {
    std::fs::canonicalize(store.join("latest")).expect("store/latest points at the run")
}

pub(crate) fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

#[test]
fn a_short_run_with_every_local_fault_on_sqlite_is_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let out = haunt_run(
        tmp.path(),
        &[
            "--time-limit-s",
            "15",
            "--nemesis",
            "all",
            "--nemesis-interval-s",
            "1",
            "--visibility-timeout-ms",
            "500",
            "--seed",
            "7",
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.starts_with("VALID"), "{stdout}");
    let run = latest(tmp.path());
    let results = read_json(&run.join("results.json"));
    assert_eq!(results["valid"], true);
    assert!(results["counts"]["acknowledged"].as_u64().unwrap() > 100, "{results}");
    let faults: Vec<&str> =
        results["faults"].as_array().unwrap().iter().map(|w| w["fault"].as_str().unwrap()).collect();
    assert!(faults.len() >= 3, "the nemesis must have acted: {faults:?}");
    let run_json = read_json(&run.join("run.json"));
    assert_eq!((run_json["seed"].as_u64(), run_json["aborted"].as_bool()), (Some(7), Some(false)));
    assert_eq!(run_json["order_claim"], "none", "the database queue claims no order");
    assert_eq!(run_json["faults_never_fired"], serde_json::json!([]), "every fault fired: {run_json}");
    assert!(!stdout.contains("never fired"), "{stdout}");
    assert!(!stdout.contains("caused no redelivery"), "{stdout}");
    assert!(run_json["git_revision"].as_str().is_some_and(|r| !r.is_empty()));
    for log in ["api", "worker-1", "worker-2", "worker-3"] {
        assert!(run.join("logs").join(format!("{log}.log")).exists(), "logs/{log}.log");
    }
    let report = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(report.contains("VALID: no acknowledged order lost"), "the report leads with the verdict");
    assert!(report.matches("<svg").count() >= 3, "latency, throughput and delivery plots");
    assert!(
        !report.contains("<script") && !report.contains("src=\"http") && !report.contains("href=\"http"),
        "self-contained"
    );
    let left = processes_mentioning(&run.to_string_lossy());
    assert!(left.is_empty(), "processes left running: {left:?}");
}

/// A clock skew well inside a 60 s visibility timeout expires no lease: the
/// fault fires, nothing is delivered twice, and the run says so.
#[test]
fn a_run_whose_faults_caused_no_redelivery_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--time-limit-s", "6", "--nemesis", "clock-skew", "--visibility-timeout-ms", "60000", "--seed", "1"];
    let out = haunt_run(tmp.path(), &args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let results = read_json(&latest(tmp.path()).join("results.json"));
    assert_eq!(results["delivery"]["redeliveries"], 0, "{results}");
    assert!(
        stdout.contains("warning: the faults fired but caused no redelivery, so this run did not test the inbox"),
        "{stdout}"
    );
    // And the window itself is named as one that left no trace.
    assert!(stdout.contains("faults: 1 of 1 windows left no trace in the record: clock-skew worker-"), "{stdout}");
}

/// The first kill and the first pause of a worker are aimed at a batch in
/// flight (its effect committed, its ack not sent): each makes the queue
/// deliver that batch again, and the inbox absorbs the copies. Blind, at 100
/// orders a second, none of the nine kills and pauses of workers in five runs
/// of the main job caught anything.
#[test]
fn an_aimed_kill_and_pause_of_workers_each_make_redeliveries_the_inbox_absorbs() {
    let tmp = tempfile::tempdir().unwrap();
    let args = [
        "--time-limit-s",
        "12",
        "--nemesis",
        "kill,pause",
        "--fault-targets",
        "worker-1,worker-2",
        "--workers",
        "2",
        "--visibility-timeout-ms",
        "1000",
        "--seed",
        "7",
    ];
    let out = haunt_run(tmp.path(), &args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let results = read_json(&latest(tmp.path()).join("results.json"));
    let windows = results["faults"].as_array().unwrap();
    // The history says where each aimed fault struck: the first kill and the
    // first pause held a batch with its effect committed and its ack not sent;
    // then that batch was delivered again.
    let history = std::fs::read_to_string(latest(tmp.path()).join("history.jsonl")).unwrap();
    let ops: Vec<serde_json::Value> = history.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for fault in ["kill", "pause"] {
        let struck = ops
            .iter()
            .find(|op| op["f"] == fault && op["value"].get("result").is_some())
            .unwrap_or_else(|| panic!("no {fault} result in the history"));
        assert_eq!(struck["value"]["aim"]["held"], true, "{struck}");
        assert_eq!(struck["value"]["aim"]["point"], "before-ack", "{struck}");
        assert!(struck["value"]["aim"]["messages"].as_u64().unwrap() >= 1, "{struck}");
        let first = windows.iter().find(|w| w["fault"] == fault).unwrap_or_else(|| panic!("no {fault}: {results}"));
        assert!(first["target"].as_str().unwrap().starts_with("worker-"), "{first}");
        let seen = format!("window {first}\nits start {struck}");
        assert!(first["redelivered_events"].as_u64().unwrap() >= 1, "the aimed {fault} made no redelivery: {seen}");
        assert!(first["duplicates_absorbed"].as_u64().unwrap() >= 1, "nothing absorbed after the {fault}: {seen}");
        assert_eq!(first["applied_more_than_once"], 0, "{first}");
    }
    assert!(stdout.contains("faults: every window left a trace in the record"), "{stdout}");
}

/// The API has no hold point, but the workload is its client: the first
/// kill of it waits for the next order to be under way and strikes within
/// the requests' median time, and the history says so.
#[test]
fn the_first_kill_of_the_api_is_aimed_from_the_clients_side() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--time-limit-s", "10", "--nemesis", "kill", "--fault-targets", "api", "--seed", "3"];
    let out = haunt_run(tmp.path(), &args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let history = std::fs::read_to_string(latest(tmp.path()).join("history.jsonl")).unwrap();
    let first = history
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|op| op["f"] == "kill" && op["value"].get("result").is_some())
        .expect("a kill of the API");
    let aim = &first["value"]["aim"];
    assert_eq!(aim["client"], true, "{first}");
    assert!(aim["in_flight"].is_u64() && aim["held"].is_boolean(), "{first}");
}

#[test]
fn bug_no_inbox_under_ack_loss_is_caught_as_double_applied() {
    let tmp = tempfile::tempdir().unwrap();
    let out = haunt_run(
        tmp.path(),
        &[
            "--time-limit-s",
            "8",
            "--nemesis",
            "ack-loss",
            "--nemesis-interval-s",
            "1",
            "--visibility-timeout-ms",
            "500",
            "--bug",
            "no-inbox",
            "--seed",
            "3",
            "--quiet",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let results = read_json(&latest(tmp.path()).join("results.json"));
    assert!(results["anomalies"]["double-applied"]["count"].as_u64().unwrap() > 0, "{results}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("false "), "--quiet prints the verdict and the run: {stdout}");
}

#[test]
fn with_the_ack_in_the_apply_transaction_lost_acks_cannot_double_apply_even_without_an_inbox() {
    // The run above, with --ack-in-txn: the messages go with the effect, so
    // the ack-loss fault has no ack to drop and nothing is redelivered.
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--time-limit-s", "8", "--nemesis", "ack-loss", "--nemesis-interval-s", "1"];
    // A lease long enough that no batch outlives it: lost acks are the only
    // way to a redelivery here.
    let more = ["--visibility-timeout-ms", "5000", "--bug", "no-inbox", "--ack-in-txn", "--seed", "3", "--quiet"];
    let out = haunt_run(tmp.path(), &[&args[..], &more[..]].concat()).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let results = read_json(&latest(tmp.path()).join("results.json"));
    assert_eq!(results["valid"], true, "{results}");
    let fired = results["faults"].as_array().unwrap().iter().filter(|w| w["fault"] == "ack-loss").count();
    assert!(fired > 0, "the ack-loss fault was on: {results}");
    assert!(results["counts"]["applied_events"].as_u64().unwrap() > 100, "{results}");
}

/// A PostgreSQL server of this test's own (the run kills it), stopped and
/// removed on drop.
pub struct PrivatePostgres {
    pub dir: PathBuf,
    pub url: String,
}

impl PrivatePostgres {
    pub fn start() -> Option<PrivatePostgres> {
        // Only when PostgreSQL tests are on at all; the opt-out is reported there.
        haunt_testkit::postgres_admin_url()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Directly under /tmp: the server's own user must be able to reach it.
        let dir = PathBuf::from(format!("/tmp/haunt-pg-test-{}-{port}", std::process::id()));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres");
        let out = Command::new(&script)
            .arg("start")
            .env("HAUNT_PG_PORT", port.to_string())
            .env("HAUNT_PG_DIR", &dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "scripts/postgres: {}", String::from_utf8_lossy(&out.stderr));
        let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        Some(PrivatePostgres { dir, url })
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/postgres");
        let port = self.url.rsplit(':').next().unwrap().split('/').next().unwrap().to_owned();
        let _ = Command::new(script).arg("stop").env("HAUNT_PG_PORT", port).env("HAUNT_PG_DIR", &self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn a_run_on_postgres_with_db_restarts_partitions_and_kills_is_valid() {
    let Some(pg) = PrivatePostgres::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let pg_data = pg.dir.to_string_lossy().into_owned();
    let out = haunt_run(
        tmp.path(),
        &[
            "--db",
            &pg.url,
            "--pg-data",
            &pg_data,
            "--time-limit-s",
            "15",
            "--nemesis",
            "db-restart,partition,kill",
            "--nemesis-interval-s",
            "1",
            "--visibility-timeout-ms",
            "500",
            "--seed",
            "11",
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let run = latest(tmp.path());
    assert!(run.to_string_lossy().contains("local-postgres"), "{}", run.display());
    let results = read_json(&run.join("results.json"));
    assert!(results["counts"]["applied_events"].as_u64().unwrap() > 100, "{results}");
    let faults: Vec<String> = results["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| format!("{} {}", w["fault"].as_str().unwrap(), w["target"].as_str().unwrap()))
        .collect();
    assert!(faults.iter().any(|f| f == "kill postgres"), "the database was crashed: {faults:?}");
    assert!(faults.iter().any(|f| f.starts_with("partition ")), "a link was cut: {faults:?}");
    let history = std::fs::read_to_string(run.join("history.jsonl")).unwrap();
    assert!(history.contains(r#""f":"restart","value":{"result":"ok","target":"postgres"}"#), "restarted");
}

#[test]
fn ctrl_c_mid_run_heals_stops_everything_and_marks_the_run_aborted() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = haunt_run(
        tmp.path(),
        &[
            "--time-limit-s",
            "60",
            "--nemesis",
            "pause,kill",
            "--nemesis-interval-s",
            "1",
            "--visibility-timeout-ms",
            "500",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Wait until the workload is running: the history has client ops.
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        assert!(Instant::now() < deadline, "the run never started");
        if let Ok(run) = std::fs::canonicalize(tmp.path().join("latest")) {
            let ops = std::fs::read_to_string(run.join("history.jsonl")).map(|h| h.lines().count()).unwrap_or(0);
            if ops > 50 {
                break run;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Wait until a fault has started, so healing has something to do.
    let deadline = Instant::now() + Duration::from_secs(30);
    while nemesis_ops(&run).iter().all(|op| !(is_start(op) && op["value"]["result"] == "ok")) {
        assert!(Instant::now() < deadline, "no fault started within 30 s of the workload");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "interrupted runs exit 130");
    let run_json = read_json(&run.join("run.json"));
    assert_eq!(run_json["aborted"], true, "{run_json}");
    let left = processes_mentioning(&run.to_string_lossy());
    assert!(left.is_empty(), "processes left running: {left:?}");
    let ops = nemesis_ops(&run);
    let started: std::collections::BTreeSet<&str> =
        ops.iter().filter(|op| is_start(op)).map(|op| op["value"]["target"].as_str().unwrap()).collect();
    assert!(!started.is_empty(), "a fault was active when Ctrl-C came");
    for target in started {
        let last = ops.iter().rfind(|op| op["value"]["target"] == target).unwrap();
        assert!(
            !is_start(last) && last["value"]["result"] == "ok",
            "the last op on {target} is a stop that took effect: {last}"
        );
    }
}

/// The nemesis ops of a run's history so far (a last line being written is skipped).
fn nemesis_ops(run: &Path) -> Vec<Value> {
    let history = std::fs::read_to_string(run.join("history.jsonl")).unwrap_or_default();
    history
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|op| op["process"] == "nemesis")
        .collect()
}

/// Whether a nemesis op starts a fault (of `--nemesis pause,kill`).
fn is_start(op: &Value) -> bool {
    matches!(op["f"].as_str(), Some("pause" | "kill"))
}

#[test]
fn a_panic_while_the_database_is_crashed_restarts_it_on_postgres() {
    let Some(pg) = PrivatePostgres::start() else { return };
    let server = haunt_chaos::backends::postgres::PgServer::new(&pg.dir).unwrap();
    let before = server.pid().expect("the test's server runs");
    let task_server = server.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let run = runtime.spawn(async move {
        // The one db-restart fault, built as a run builds it: a kill of the
        // database node, here the server itself.
        let surfaces = haunt_chaos::core::system::Surfaces::nodes_only(Arc::new(task_server.clone()));
        let settings = haunt_chaos::core::options::RunOptions::default().fault_settings();
        let nemesis =
            haunt_chaos::core::nemesis::build(haunt_chaos::core::fault::Fault::DbRestart, &surfaces, &settings)
                .unwrap();
        let faults = haunt_chaos::core::nemesis::Faults::new(vec![nemesis]);
        faults[0].start("postgres").await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while task_server.pid().is_some() {
            assert!(Instant::now() < deadline, "the server did not die");
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("the harness panics while the database is down");
    });
    assert!(runtime.block_on(run).unwrap_err().is_panic());
    let after = server.pid().expect("the guard started the server again");
    assert_ne!(before, after, "a new postmaster");
    let port: u16 = pg.url.rsplit(':').next().unwrap().split('/').next().unwrap().parse().unwrap();
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("the server accepts connections");
}

#[test]
fn bad_options_are_refused_before_anything_starts() {
    let tmp = tempfile::tempdir().unwrap();
    for (args, needle) in [
        (vec!["--nemesis", "kil"], "unknown nemesis"),
        (vec!["--db", "mysql://x"], "unsupported database URL"),
        (vec!["--bug", "no-such"], "unknown bug mode"),
        (vec!["--bug", "retry-after-next"], "--transport db keeps none"),
        (vec!["--bug", "retry-after-next", "--transport", "sqs"], "--transport sqs:standard keeps none"),
        (vec!["--rate", "0"], "--rate must be positive"),
        (vec!["--ack-fail-rate", "1.5"], "--ack-fail-rate must be within 0 and 1"),
        (vec!["--nemesis", "loss"], "needs --backend docker"),
        (vec!["--nemesis", "db-restart"], "needs --pg-data"),
        (vec!["--backend", "docker", "--db", "sqlite://x.db"], "runs its own PostgreSQL container"),
        // Without an engine the error names scripts/docker; without the image, scripts/images.
        (vec!["--backend", "docker", "--image", "no-such-image:0"], "scripts/"),
        (vec!["--backend", "podman"], "invalid value 'podman'"),
        (vec!["--kafka-brokers", "3"], "use it with --transport kafka"),
        (vec!["--transport", "kafka", "--kafka-brokers", "2"], "1 broker or a cluster of 3"),
        (vec!["--transport", "kafka", "--kafka-brokers", "3", "--backend", "docker"], "local backend only"),
        (vec!["--kafka-server", "redpanda"], "is not a Kafka server"),
        (vec!["--kafka-server", "tansu"], "use it with --transport kafka"),
        (vec!["--transport", "kafka", "--kafka-server", "tansu", "--kafka-brokers", "3"], "tansu runs one node"),
        (vec!["--transport", "kafka:eos", "--kafka-server", "tansu"], "tansu 0.6 has none"),
        (vec!["--transport", "kafka", "--kafka-server", "tansu", "--backend", "docker"], "local backend only"),
        // The seven local faults need 40 s at the default interval.
        (vec!["--time-limit-s", "30"], "Use --time-limit-s 40 or more"),
    ] {
        let out = haunt_run(tmp.path(), &args).output().unwrap();
        assert_ne!(out.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert!(!tmp.path().join("latest").exists(), "no run directory for refused options");
}

/// A valid run of pause, ack-loss and delay in 10 s (seed 3), its directory.
fn three_faults_in_ten_seconds(store: &Path) -> PathBuf {
    let args =
        ["--time-limit-s", "10", "--nemesis", "pause,ack-loss,delay", "--nemesis-interval-s", "1.5", "--seed", "3"];
    let out = haunt_run(store, &args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    latest(store)
}

/// `haunt run --schedule FILE` strikes a run's `schedule.json` as given:
/// the same windows (fault, target, in order), each starting within a
/// second of its plan, under another seed's workload. A schedule that is
/// not one, or names what the run cannot do, is refused before anything
/// starts, naming the file and the field.
#[test]
fn a_run_replayed_from_its_schedule_strikes_the_same_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let first = three_faults_in_ten_seconds(tmp.path());
    let schedule = first.join("schedule.json");
    let planned = read_json(&schedule);
    assert_eq!(planned["version"], 1);
    assert!(planned["windows"].as_array().unwrap().len() >= 3, "{planned}");
    let replay = ["--time-limit-s", "10", "--seed", "9", "--schedule", schedule.to_str().unwrap()];
    let out = haunt_run(tmp.path(), &replay).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let second = latest(tmp.path());
    assert_ne!(first, second);
    let windows = |run: &Path| -> Vec<(String, String, u64)> {
        read_json(&run.join("results.json"))["faults"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                let f = w["fault"].as_str().unwrap().to_owned();
                (f, w["target"].as_str().unwrap().to_owned(), w["start_ns"].as_u64().unwrap())
            })
            .collect()
    };
    let (a, b) = (windows(&first), windows(&second));
    let names = |ws: &[(String, String, u64)]| ws.iter().map(|(f, t, _)| (f.clone(), t.clone())).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b), "the same windows in the same order");
    let (a0, b0) = (a[0].2, b[0].2);
    for ((_, _, x), (_, _, y)) in a.iter().zip(&b) {
        let (x, y) = ((x - a0) as i64, (y - b0) as i64);
        assert!((x - y).abs() < 1_000_000_000, "each start within a second of its plan: {a:?} / {b:?}");
    }
    assert_eq!(read_json(&second.join("run.json"))["options"]["schedule"], planned, "the schedule goes into run.json");

    let bad = tmp.path().join("bad.json");
    for (text, needle) in [
        (
            r#"{"version": 1, "windows": [{"fault": "kil", "target": "worker-1", "start_ms": 0, "hold_ms": 1}]}"#,
            "windows[0].fault",
        ),
        (
            r#"{"version": 1, "windows": [{"fault": "kill", "target": "worker-9", "start_ms": 0, "hold_ms": 1}]}"#,
            "windows[0].target worker-9",
        ),
        (r#"{"version": 1, "windows": [{"fault": "kill"}]}"#, "not a schedule"),
    ] {
        std::fs::write(&bad, text).unwrap();
        let out = haunt_run(tmp.path(), &["--schedule", bad.to_str().unwrap()]).output().unwrap();
        assert_ne!(out.status.code(), Some(0));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{text}: {stderr}");
    }
    let out = haunt_run(tmp.path(), &["--schedule", bad.to_str().unwrap(), "--nemesis", "kill"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"), "--schedule names the faults");
}

/// `haunt run --options FILE` takes every option from a file: a recorded
/// run's `run.json` runs that run again, with its seed, and draws the same
/// fault windows in the same order (fault and target; their times vary with
/// the machine, so only the windows both runs had time for are compared,
/// at least the first round of every fault). The matrix and the guarantees
/// hand their child runs options this way.
#[test]
fn a_recorded_run_runs_again_from_its_run_json_with_the_same_fault_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let first = three_faults_in_ten_seconds(tmp.path());
    let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["run", "--options"])
        .arg(first.join("run.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let second = latest(tmp.path());
    assert_ne!(first, second, "a run directory of its own");
    let (a, b) = (read_json(&first.join("run.json")), read_json(&second.join("run.json")));
    assert_eq!(b["seed"], 3);
    assert_eq!(a["options"], b["options"], "the same options, the executable and revision aside");
    let windows = |run: &Path| -> Vec<(String, String)> {
        let results = read_json(&run.join("results.json"));
        results["faults"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| (w["fault"].as_str().unwrap().to_owned(), w["target"].as_str().unwrap().to_owned()))
            .collect()
    };
    let (a, b) = (windows(&first), windows(&second));
    let both = a.len().min(b.len());
    assert!(both >= 3, "every fault fired in both runs: {a:?} / {b:?}");
    assert_eq!(a[..both], b[..both], "the same windows in the same order");
}

#[test]
fn an_options_file_is_checked_and_takes_no_other_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("options.json");
    let run = |file: &Path, more: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_haunt")).args(["run", "--options"]).arg(file).args(more).output();
        let out = out.unwrap();
        assert_ne!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    std::fs::write(&file, "{}").unwrap();
    assert!(run(&file, &["--seed", "1"]).contains("cannot be used with"));
    assert!(run(&file, &[]).contains("not a run's options"));
    std::fs::write(&file, r#"{"rate": 1, "no_such_option": 2}"#).unwrap();
    let stderr = run(&file, &[]);
    assert!(stderr.contains("no_such_option"), "the unknown field is named: {stderr}");
    std::fs::write(&file, "not json").unwrap();
    assert!(run(&file, &[]).contains("not JSON"));
    assert!(run(&tmp.path().join("missing.json"), &[]).contains("missing.json"));
    assert!(!tmp.path().join("store").exists(), "nothing was run");
}

/// GET over a raw socket: enough for a local /metrics.
fn scrape(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[test]
fn the_harness_exports_faults_client_ops_and_the_verdict_as_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let child = haunt_run(
        tmp.path(),
        &[
            "--time-limit-s",
            "8",
            "--nemesis",
            "pause",
            "--nemesis-interval-s",
            "1",
            "--visibility-timeout-ms",
            "500",
            "--metrics-listen",
            &listen,
            "--metrics-linger-s",
            "5",
            "--quiet",
        ],
    )
    .stdout(Stdio::null())
    // Kept, so that a run that fails says why (a suite run once saw exit 3).
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let (mut saw_fault, mut saw_ops, mut saw_verdict) = (false, false, false);
    let deadline = Instant::now() + Duration::from_secs(90);
    while Instant::now() < deadline && !saw_verdict {
        if let Some(text) = scrape(port) {
            saw_fault |= text
                .lines()
                .any(|l| l.starts_with("haunt_fault_active{fault=\"pause\",target=\"worker-") && l.ends_with(" 1"));
            saw_ops |=
                text.lines().any(|l| l.starts_with("haunt_client_ops_total{type=\"ok\"} ") && !l.ends_with(" 0"));
            saw_verdict = text.contains("haunt_check_valid 1")
                && text.contains("haunt_check_anomalies{anomaly=\"double-applied\"} 0")
                && text.contains("haunt_client_op_duration_seconds_count{type=\"ok\"}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(saw_ops, "client ops were counted while the run lasted");
    assert!(saw_fault, "an active pause showed as haunt_fault_active 1");
    assert!(saw_verdict, "the verdict was served after the check");
}

/// The delivery evidence end to end: under ack loss the run directory records
/// redeliveries and the duplicates the inbox absorbed, and results.json and the
/// summary agree with the final state line by line.
#[test]
fn a_run_with_ack_loss_records_redeliveries_and_absorbed_duplicates_and_the_results_agree() {
    let tmp = tempfile::tempdir().unwrap();
    let out = haunt_run(
        tmp.path(),
        &["--time-limit-s", "6", "--nemesis", "ack-loss", "--visibility-timeout-ms", "500", "--seed", "3"],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let run = latest(tmp.path());
    let (mut deliveries, mut redeliveries, mut absorbed, mut most, mut orders) = (0u64, 0u64, 0u64, 0u64, 0u64);
    for line in std::fs::read_to_string(run.join("final-state.jsonl")).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        if v["kind"] == "order" {
            orders += 1;
            let d = v["deliveries"].as_u64().unwrap_or_else(|| panic!("an order line without deliveries: {line}"));
            deliveries += d;
            redeliveries += d.saturating_sub(1);
            most = most.max(d);
            absorbed += v["duplicates_absorbed"].as_u64().unwrap();
        }
    }
    assert!(orders > 100, "{orders} orders");
    assert!(absorbed > 0, "half the acks were lost for a while, yet the inbox absorbed nothing");
    assert!(redeliveries >= absorbed, "every absorbed duplicate is a redelivery");
    let results = read_json(&run.join("results.json"));
    let d = &results["delivery"];
    assert_eq!(d["deliveries"], deliveries, "{d}");
    assert_eq!(d["redeliveries"], redeliveries, "{d}");
    assert_eq!(d["duplicates_absorbed"], absorbed, "{d}");
    assert_eq!(d["deliveries_max"], most, "{d}");
    assert_eq!(d["applied_more_than_once"], 0, "{d}");
    assert!(stdout.contains("absorbed by the inbox"), "{stdout}");
    let window = results["faults"].as_array().unwrap().iter().find(|w| w["fault"] == "ack-loss").expect("a window");
    assert!(window["duplicates_absorbed"].as_u64().unwrap() > 0, "the ack-loss window caused them: {window}");
}

/// A crash leaves no server process behind, also one that escaped the
/// postmaster's list of children (a backend forked as the postmaster was being
/// stopped, or orphaned and stuck on a lock a killed process held): one left
/// holds the old shared memory, and no restart can succeed (seen in a matrix
/// run: async-commit's db-restart left the server down for good).
#[test]
fn a_crash_kills_every_process_of_the_server_and_the_restart_succeeds_on_postgres() {
    let Some(pg) = PrivatePostgres::start() else { return };
    let server = haunt_chaos::backends::postgres::PgServer::new(&pg.dir).unwrap();
    // A stand-in for the escaped backend: named postgres, working in the data
    // directory, but no child of the postmaster.
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("postgres");
    std::fs::copy("/bin/sleep", &fake).unwrap();
    let mut escaped = Command::new(&fake).arg("600").current_dir(&pg.dir).spawn().unwrap();
    server.crash().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match escaped.try_wait().unwrap() {
            Some(_) => break,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => {
                let _ = escaped.kill();
                panic!("a process working in the data directory outlived the crash");
            }
        }
    }
    server.start_blocking().expect("the server starts again");
    let port: u16 = pg.url.rsplit(':').next().unwrap().split('/').next().unwrap().parse().unwrap();
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("the server accepts connections");
}
