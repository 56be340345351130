//! The reduced matrix: one short run per bug mode and of the correct build.
//! A change that blinds the checker or breaks a bug mode fails here. With
//! PostgreSQL opted out (`HAUNT_SKIP_POSTGRES=1`, reported by the testkit) it
//! runs the SQLite rows (`--backends sqlite`); a matrix that leaves rows out
//! without being asked to says it is incomplete (the second test).

use std::path::Path;
use std::process::Command;

use crate::run::PrivatePostgres;

#[test]
fn the_reduced_matrix_catches_every_bug_mode_and_passes_the_correct_build_on_every_backend() {
    let tmp = tempfile::tempdir().unwrap();
    let pg = PrivatePostgres::start();
    let mut command = Command::new(env!("CARGO_BIN_EXE_haunt"));
    command.arg("matrix").arg("--store").arg(tmp.path()).args(["--seeds", "1", "--time-limit-s", "8"]);
    match &pg {
        Some(pg) => {
            command.args(["--db", &pg.url]).arg("--pg-data").arg(&pg.dir);
        }
        None => {
            command.args(["--backends", "sqlite"]);
        }
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let matrix_dir = std::fs::read_dir(tmp.path().join("matrix")).unwrap().next().unwrap().unwrap().path();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(matrix_dir.join("matrix.json")).unwrap()).unwrap();
    let rows = json["rows"].as_array().unwrap();
    let on_postgres = rows.iter().filter(|r| r["case"]["postgres"] == true).count();
    match pg {
        // Eight bug modes on both backends, two on PostgreSQL only, the correct build on both.
        Some(_) => assert_eq!((rows.len(), on_postgres), (20, 11)),
        None => assert_eq!((rows.len(), on_postgres), (9, 0)),
    }
    for row in rows {
        let backend = if row["case"]["postgres"] == true { "postgres" } else { "sqlite" };
        let name = &format!("{} ({backend})", row["case"]["bug"].as_str().unwrap());
        assert!(!row["skipped"].is_string(), "{name} skipped: {row}");
        let runs = row["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 1, "{name}");
        match (row["case"]["bug"].as_str().unwrap(), row["case"]["expected"].as_str().unwrap()) {
            ("correct", expected) => {
                assert_eq!(expected, "valid");
                assert_eq!(runs[0]["verdict"], "true", "{name}: {row}")
            }
            (_, "not-drained") => {
                assert_eq!(runs[0]["verdict"], "unknown", "{name}: {row}");
                assert!(runs[0]["pending"].as_u64().unwrap() > 0, "{name}: {row}");
                assert_eq!(runs[0]["anomalies"], serde_json::json!({}), "{name}: {row}");
            }
            (_, anomaly) => {
                assert!(
                    runs[0]["anomalies"][anomaly].as_u64().unwrap_or(0) > 0,
                    "{name} not caught as {anomaly}: {row}"
                )
            }
        }
    }
    assert!(Path::new(&matrix_dir.join("matrix.md")).exists());
    assert!(stdout.contains("| no-inbox (sqlite) | ack-loss | `double-applied` | 1/1 |"), "{stdout}");
}

#[test]
fn a_matrix_with_a_row_that_could_not_run_exits_unknown() {
    let tmp = tempfile::tempdir().unwrap();
    // async-commit needs a PostgreSQL server to crash; none is given.
    let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .arg("matrix")
        .arg("--store")
        .arg(tmp.path())
        .args(["--seeds", "1", "--time-limit-s", "1", "--only", "async-commit"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("UNKNOWN: these rows did not run: async-commit"), "{stderr}");
}

#[test]
fn the_matrix_over_a_broker_catches_the_consumer_and_relay_bugs_and_passes_the_correct_build() {
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: haunt matrix --transport redis-streams (HAUNT_SKIP_BROKERS=1)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .arg("matrix")
        .arg("--store")
        .arg(tmp.path())
        .args(["--transport", "redis-streams", "--seeds", "1", "--time-limit-s", "8"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{}", String::from_utf8_lossy(&out.stderr));
    let matrix_dir = std::fs::read_dir(tmp.path().join("matrix")).unwrap().next().unwrap().unwrap().path();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(matrix_dir.join("matrix.json")).unwrap()).unwrap();
    let rows: Vec<(&str, &str)> = json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["case"]["bug"].as_str().unwrap(), r["case"]["expected"].as_str().unwrap()))
        .collect();
    assert_eq!(
        rows,
        [
            ("no-inbox", "double-applied"),
            ("ack-before-process", "lost-effect"),
            ("relay-marks-before-publish", "lost-effect"),
            ("correct", "valid")
        ]
    );
    for row in json["rows"].as_array().unwrap() {
        assert_eq!(row["case"]["transport"], "redis-streams", "{row}");
        assert_eq!(row["runs"][0]["passed"], true, "{row}");
    }
    assert!(stdout.contains("--transport redis-streams"), "the table names how to reproduce it: {stdout}");
}

/// Every live process whose command line mentions `needle`, the child
/// `haunt run` and its nodes included.
fn processes_under(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!("{name}: {cmdline}"));
        }
    }
    found
}

/// Every `run.json` under `dir`.
fn run_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() && !path.is_symlink() {
                todo.push(path);
            } else if path.file_name().is_some_and(|n| n == "run.json") {
                found.push(path);
            }
        }
    }
    found
}

/// A matrix or a guarantees run killed outright (SIGKILL: no handler of its
/// own runs) still leaves nothing behind: the kernel interrupts its child
/// `haunt run`, which heals, stops its broker and services as on Ctrl-C, and
/// marks its run aborted.
fn killed_outright_leaves_nothing(command: &str, args: &[&str]) {
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: a killed haunt {command} over redis-streams (HAUNT_SKIP_BROKERS=1)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().to_string_lossy().into_owned();
    let mut parent = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .arg(command)
        .arg("--store")
        .arg(tmp.path())
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Until the child run's workload is going: its history has client ops.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let run_dir = loop {
        assert!(std::time::Instant::now() < deadline, "the {command}'s run never started");
        let going = run_files(tmp.path()).into_iter().filter_map(|f| f.parent().map(Path::to_owned)).find(|d| {
            std::fs::read_to_string(d.join("history.jsonl")).map(|h| h.lines().count() > 50).unwrap_or(false)
        });
        if let Some(dir) = going {
            break dir;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(processes_under(&store).len() > 2, "a run, its broker and services: {:?}", processes_under(&store));
    parent.kill().unwrap();
    parent.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !processes_under(&store).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "left running a minute after the {command} was killed: {:?}",
            processes_under(&store)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["aborted"], true, "{run}");
}

#[test]
fn a_matrix_killed_outright_leaves_no_process_and_its_run_marked_aborted() {
    let args = ["--transport", "redis-streams", "--seeds", "1", "--time-limit-s", "60", "--only", "correct"];
    killed_outright_leaves_nothing("matrix", &args);
}

#[test]
fn a_guarantees_run_killed_outright_leaves_no_process_and_its_run_marked_aborted() {
    let args = ["--transports", "redis-streams", "--seeds", "1", "--time-limit-s", "60"];
    killed_outright_leaves_nothing("guarantees", &args);
}
