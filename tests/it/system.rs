//! `haunt run --system FILE` end to end: the reference pipeline through its
//! system file gives what `haunt run` gives on the same seed, and a user's
//! mistakes (a node that never becomes ready, a final-state query that fails,
//! a bad file) are reported so they can act on them, with nothing started.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::run::{haunt_run, latest, read_json};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systems").join(name)
}

/// `(fault, target)` of every fault window, in order.
fn windows(results: &Value) -> Vec<(String, String)> {
    let list = results["faults"].as_array().unwrap();
    list.iter().map(|w| (w["fault"].as_str().unwrap().to_owned(), w["target"].as_str().unwrap().to_owned())).collect()
}

const SAME_RUN: [&str; 8] =
    ["--time-limit-s", "24", "--seed", "11", "--nemesis", "kill,pause,partition,delay", "--quiet", "--rate"];

/// Runs `extra` on a fresh store; the run directory and its results.
fn run(extra: &[&str]) -> (tempfile::TempDir, PathBuf, Value) {
    let store = tempfile::tempdir().unwrap();
    let mut args: Vec<&str> = SAME_RUN.to_vec();
    args.push("50");
    args.extend(extra);
    let out = haunt_run(store.path(), &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "haunt run {args:?}: {}\n{stderr}", String::from_utf8_lossy(&out.stdout));
    let dir = latest(store.path());
    let results = read_json(&dir.join("results.json"));
    (store, dir, results)
}

/// `both`: arguments of both runs.
fn assert_same_run(system_file: &Path, haunt_args: &[&str], both: &[&str]) {
    let file = system_file.to_string_lossy().into_owned();
    let (_a, dir, by_file) = run(&[&["--system", file.as_str()][..], both].concat());
    let (_b, _, by_run) = run(&[haunt_args, both].concat());
    assert_eq!(by_file["valid"], true, "{by_file:#}");
    assert_eq!(by_run["valid"], true, "{by_run:#}");
    assert_eq!(windows(&by_file), windows(&by_run), "the same seed, the same faults on the same targets");
    assert_eq!(windows(&by_file).len(), 4, "every fault fired once: {:?}", windows(&by_file));
    assert!(by_file["counts"]["applied_events"].as_u64().unwrap() > 200, "{by_file:#}");
    assert!(by_file["delivery"]["deliveries"].as_u64().unwrap() > 0, "the orders query's delivery evidence");
    let run_file = read_json(&dir.join("run.json"));
    assert_eq!(run_file["faults_never_fired"], serde_json::json!([]), "{run_file:#}");
    assert!(dir.to_string_lossy().contains("local-haunt"), "named after the file: {}", dir.display());
}

#[test]
fn the_reference_pipeline_through_its_system_file_matches_haunt_run_on_sqlite() {
    assert_same_run(&example("haunt.toml"), &[], &[]);
}

#[test]
fn the_reference_pipeline_through_its_system_file_matches_haunt_run_on_postgres() {
    let Some(admin) = haunt_testkit::postgres_admin_url() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pid = std::process::id();
    let by_file =
        rt.block_on(haunt_chaos::suites::matrix::ScratchDb::create(&admin, &format!("haunt_sysfile_{pid}"))).unwrap();
    let by_run =
        rt.block_on(haunt_chaos::suites::matrix::ScratchDb::create(&admin, &format!("haunt_sysrun_{pid}"))).unwrap();
    // The example, on PostgreSQL: both URLs replaced, as its comment says.
    let text = std::fs::read_to_string(example("haunt.toml"))
        .unwrap()
        .replace("sqlite://{dir}/haunt.db", by_file.url.as_str());
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("haunt.toml");
    std::fs::write(&file, text).unwrap();
    // haunt run puts a proxy in each service's way to PostgreSQL; the file,
    // which does not start the database as a node, cannot: both runs fault
    // the client's link only.
    let both = ["--fault-targets", "client<->api"];
    let result = std::panic::catch_unwind(|| assert_same_run(&file, &["--db", by_run.url.as_str()], &both));
    rt.block_on(by_file.drop_now());
    rt.block_on(by_run.drop_now());
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// The one-node system of `tests/it/systems/one-node.toml` with `command`,
/// its orders query reading `orders_table`.
fn one_node_file(dir: &Path, command: &str, orders_table: &str) -> PathBuf {
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/systems/one-node.toml");
    let text = std::fs::read_to_string(template).unwrap();
    let path = dir.join("broken.toml");
    std::fs::write(&path, text.replace("@COMMAND@", command).replace("@ORDERS_TABLE@", orders_table)).unwrap();
    path
}

const API: &str = r#"["{haunt}", "api", "--db", "sqlite://{dir}/shop.db", "--listen", "127.0.0.1:{port:api}"]"#;

fn failing_run(file: &Path, store: &Path) -> String {
    let file = file.to_string_lossy().into_owned();
    let args = ["--system", &file, "--nemesis", "none", "--time-limit-s", "2", "--quiesce-timeout-s", "2"];
    let out = haunt_run(store, &args).output().unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_node_that_never_becomes_ready_is_named_with_its_command_and_log() {
    let tmp = tempfile::tempdir().unwrap();
    let command = r#"["sh", "-c", "echo the config is missing >&2; exit 3"]"#;
    let file = one_node_file(tmp.path(), command, "orders");
    let stderr = failing_run(&file, &tmp.path().join("store"));
    assert!(stderr.contains("node api never became ready"), "{stderr}");
    assert!(stderr.contains("command: sh -c echo the config is missing"), "{stderr}");
    assert!(stderr.contains("the config is missing"), "its log's tail: {stderr}");
    assert!(stderr.contains("exited"), "{stderr}");
}

/// A node with an admin endpoint whose process dies at start (a SQLite
/// schema race of the Go shop's workers did so in CI) is reported with its
/// command and its log as soon as it has exited, not as an endpoint that
/// kept refusing connections for the readiness wait.
#[test]
fn a_node_whose_admin_endpoint_dies_with_its_process_is_named_with_its_log() {
    let tmp = tempfile::tempdir().unwrap();
    let file = one_node_file(tmp.path(), API, "orders");
    let worker = r#"
[[node]]
name = "worker"
command = ["sh", "-c", "echo schema: database is locked >&2; exit 4"]
admin = "http://127.0.0.1:{port:worker}"
points = ["after-delivery"]
"#;
    let text = std::fs::read_to_string(&file).unwrap().replace("\n[client]", &format!("{worker}\n[client]"));
    std::fs::write(&file, text).unwrap();
    let stderr = failing_run(&file, &tmp.path().join("store"));
    assert!(stderr.contains("node worker: its admin endpoint http://127.0.0.1:"), "{stderr}");
    assert!(stderr.contains("did not answer before its process exited"), "{stderr}");
    assert!(stderr.contains("command: sh -c echo schema: database is locked"), "{stderr}");
    assert!(stderr.contains("    schema: database is locked"), "its log's tail: {stderr}");
}

#[test]
fn a_final_state_query_that_fails_is_reported_with_the_database_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = one_node_file(tmp.path(), API, "no_such_orders");
    let stderr = failing_run(&file, &tmp.path().join("store"));
    assert!(stderr.contains("final_state.orders failed"), "{stderr}");
    assert!(stderr.contains("no such table: no_such_orders"), "the database's error: {stderr}");
    assert!(stderr.contains("the query: SELECT order_id, item_id, qty, event_id FROM no_such_orders"), "{stderr}");
}

#[test]
fn a_bad_system_file_starts_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let file = one_node_file(tmp.path(), API, "orders").with_file_name("bad.toml");
    let text = std::fs::read_to_string(tmp.path().join("broken.toml")).unwrap().replace("{addr:api}", "{addr:apu}");
    std::fs::write(&file, text).unwrap();
    let store = tmp.path().join("store");
    let stderr = failing_run(&file, &store);
    assert!(stderr.contains("bad.toml:11: client.url: names an unknown node \"apu\""), "{stderr}");
    assert!(!store.exists(), "no run directory for a refused file");
    // A fault the file cannot take is refused the same way.
    let good = one_node_file(tmp.path(), API, "orders").to_string_lossy().into_owned();
    let out = haunt_run(&store, &["--system", &good, "--nemesis", "ack-loss"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--nemesis ack-loss:") && stderr.contains("cannot take it"), "{stderr}");
    assert!(!store.exists());
    // Nodes from images need the Docker backend, and the Docker backend images.
    let containers = example("haunt-docker.toml").to_string_lossy().into_owned();
    let out = haunt_run(&store, &["--system", &containers]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node postgres runs from an image: give --backend docker"), "{stderr}");
    let out = haunt_run(&store, &["--system", &good, "--backend", "docker"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node api has no image"), "{stderr}");
    assert!(!store.exists());
}

/// One run of a tutorial shop variant; its exit status and results.
fn tutorial_shop(variant: &str, seed: &str) -> (Option<i32>, Value) {
    let store = tempfile::tempdir().unwrap();
    let file = example(&format!("tutorial-python/{variant}.toml")).to_string_lossy().into_owned();
    // Every fault the file allows: kill, pause, partition, delay and its hooks.
    let args = ["--system", &file, "--seed", seed, "--time-limit-s", "30", "--nemesis-interval-s", "3", "--quiet"];
    let out = haunt_run(store.path(), &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("never became ready"), "python3 must be installed (./scripts/test does): {stderr}");
    assert!(store.path().join("latest").exists(), "no run: {stderr}");
    let dir = latest(store.path());
    (out.status.code(), read_json(&dir.join("results.json")))
}

#[test]
fn the_fixed_tutorial_shop_in_python_is_valid_under_every_fault_it_takes() {
    let (code, results) = tutorial_shop("fixed", "3");
    assert_eq!(code, Some(0), "{results:#}");
    assert_eq!(results["valid"], true);
    assert!(results.get("ledger").is_none(), "it keeps a ledger: {results:#}");
    assert!(results["counts"]["applied_events"].as_u64().unwrap() > 100, "{results:#}");
    let faults: Vec<String> = windows(&results).into_iter().map(|(f, _)| f).collect();
    for fault in ["kill", "pause", "partition", "delay", "ack-loss", "db-error", "clock-skew"] {
        assert!(faults.iter().any(|f| f == fault), "{fault} fired: {faults:?}");
    }
}

#[test]
fn the_naive_tutorial_shop_in_python_is_caught_from_its_projection() {
    let (code, results) = tutorial_shop("naive", "3");
    assert_eq!(code, Some(1), "{results:#}");
    assert_eq!(results["ledger"], false, "no applied query: projection-only checking");
    assert_eq!(results["not_evaluated"], serde_json::json!(["lost-effect", "double-applied"]));
    let mismatch = &results["anomalies"]["projection-mismatch"];
    assert!(mismatch["count"].as_u64().unwrap() > 0, "{results:#}");
    assert!(
        mismatch["examples"].as_array().unwrap().iter().all(|e| e["direction"] == "over" || e["direction"] == "under"),
        "each mismatch names its direction: {mismatch:#}"
    );
    assert_eq!(results["anomalies"]["lost-effect"]["count"], 0, "not evaluated without a ledger");
}

fn matrix(args: &[&str]) -> (Option<i32>, String) {
    let store = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_haunt"))
        .arg("matrix")
        .arg("--store")
        .arg(store.path())
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn the_matrix_runs_a_system_file_under_each_fault_it_allows() {
    let fixed = example("tutorial-python/fixed.toml").to_string_lossy().into_owned();
    let rows = ["--seeds", "1", "--time-limit-s", "8", "--only", "kill", "partition"];
    let (code, out) = matrix(&[&["--system", fixed.as_str()][..], &rows].concat());
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("| tutorial-python-fixed under kill | kill | verdict true | 1/1 valid |"), "{out}");
    assert!(out.contains("| tutorial-python-fixed under partition | partition | verdict true | 1/1 valid |"), "{out}");
    assert!(!out.contains("under pause"), "--only names the faults: {out}");
    assert!(out.contains("--only kill partition --seeds 1"), "the table's command reproduces these rows: {out}");

    let naive = example("tutorial-python/naive.toml").to_string_lossy().into_owned();
    let (code, out) = matrix(&["--system", &naive, "--seeds", "1", "--time-limit-s", "8", "--only", "kill"]);
    assert_eq!(code, Some(1), "the naive shop is not valid under a kill: {out}");
    assert!(out.contains("projection-mismatch"), "{out}");
    let (code, out) = matrix(&["--system", &naive, "--only", "stall"]);
    assert_ne!(code, Some(0));
    let known = "kill, pause, partition, delay, ack-loss, db-error, clock-skew, all";
    assert!(out.contains(&format!("--only \"stall\": not a row; known: {known}")), "{out}");
}
