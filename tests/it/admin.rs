//! A system file's nodes struck through haunt's admin protocol
//! (`docs/admin.md`), here the tutorial shop in Python with the client
//! library of `clients/python`: a kill aimed at a declared hold point, the
//! fault hooks, and a point its node does not offer refused before the run.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::run::{haunt_run, latest, read_json};

fn shop(variant: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/systems/tutorial-python/{variant}.toml"))
}

fn lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Every log line of the run's nodes named `prefix…`.
fn logs(dir: &Path, prefix: &str) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir.join("logs")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with(prefix) {
            out += &std::fs::read_to_string(&path).unwrap();
        }
    }
    out
}

/// The naive shop commits an order and then, apart, its message. A kill of
/// its API aimed at the point between the two (declared in the system file,
/// answered by the API through the library) leaves the held order in the
/// orders and its event nowhere: no worker ever applies it.
#[test]
fn a_kill_aimed_at_a_declared_hold_point_lands_between_the_two_writes() {
    let store = tempfile::tempdir().unwrap();
    let file = shop("naive").to_string_lossy().into_owned();
    let args = ["--system", &file, "--seed", "1", "--time-limit-s", "12", "--nemesis", "kill"];
    let out = haunt_run(store.path(), &[&args[..], &["--fault-targets", "api", "--quiet"]].concat()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(store.path().join("latest").exists(), "no run: {stderr}");
    let dir = latest(store.path());
    let history = lines(&dir.join("history.jsonl"));
    let aims: Vec<&Value> =
        history.iter().filter(|op| op["f"] == "kill").filter_map(|op| op["value"].get("aim")).collect();
    assert!(!aims.is_empty(), "the first kill is aimed: {stderr}");
    let held: Vec<&str> = aims
        .iter()
        .filter(|aim| aim["held"] == true)
        .map(|aim| {
            assert_eq!(aim["point"], "after-order-before-message", "{aim}");
            aim["order_id"].as_str().expect("the library passes the point's details on")
        })
        .collect();
    assert!(!held.is_empty(), "the API held an order at its point: {aims:?}");
    let orders: Vec<String> = lines(&dir.join("final-state.jsonl"))
        .into_iter()
        .filter(|l| l["kind"] == "order")
        .map(|l| l["order_id"].as_str().unwrap().to_owned())
        .collect();
    let applied = logs(&dir, "worker");
    for order in held {
        assert!(orders.iter().any(|o| o == order), "the held order {order} was committed before the kill");
        assert!(!applied.contains(&format!("order={order} ")), "{order} has no message, so no worker applies it");
    }
    assert_eq!(out.status.code(), Some(1), "the naive shop is caught: {stderr}");
}

/// A cut of the client's link to the API, aimed: the API (the link's end with
/// a hold point) holds an order between its two writes, and the link is cut
/// while it holds, so the order's answer never reaches the client: its
/// request ends `info`, the order's fate unknown to the client.
#[test]
fn a_partition_aimed_at_a_hold_point_cuts_the_link_while_the_end_holds_work() {
    let store = tempfile::tempdir().unwrap();
    let file = shop("naive").to_string_lossy().into_owned();
    let args = ["--system", &file, "--seed", "1", "--time-limit-s", "12", "--nemesis", "partition"];
    let out = haunt_run(store.path(), &[&args[..], &["--fault-targets", "client<->api", "--quiet"]].concat())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(store.path().join("latest").exists(), "no run: {stderr}");
    let history = lines(&latest(store.path()).join("history.jsonl"));
    let aims: Vec<&Value> = history
        .iter()
        .filter(|op| op["f"] == "start-partition" && op["value"]["result"] == "ok")
        .filter_map(|op| op["value"].get("aim"))
        .collect();
    assert!(!aims.is_empty(), "the first cut is aimed: {stderr}");
    let held: Vec<&Value> = aims.iter().copied().filter(|aim| aim["held"] == true).collect();
    assert!(!held.is_empty(), "the API held an order as its link was cut: {aims:?}");
    for aim in held {
        assert_eq!(aim["end"], "api", "{aim}");
        assert_eq!(aim["point"], "after-order-before-message", "{aim}");
        let order = aim["order_id"].as_str().expect("the library passes the point's details on");
        let first = history
            .iter()
            .find(|op| op["f"] == "order" && op["type"] != "invoke" && op["value"]["order_id"] == order)
            .unwrap_or_else(|| panic!("{order}: the client's request ended"));
        assert_eq!(first["type"], "info", "the held order's answer was cut off: {first}");
    }
}

/// ack-loss, db-error and clock-skew reach the fixed shop through the hooks
/// its nodes declare, and it stays valid.
#[test]
fn the_hooks_of_a_system_file_take_the_switch_faults() {
    let store = tempfile::tempdir().unwrap();
    let file = shop("fixed").to_string_lossy().into_owned();
    let args = ["--system", &file, "--seed", "2", "--time-limit-s", "14", "--nemesis", "ack-loss,db-error,clock-skew"];
    let out =
        haunt_run(store.path(), &[&args[..], &["--nemesis-interval-s", "2", "--quiet"]].concat()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let dir = latest(store.path());
    let results = read_json(&dir.join("results.json"));
    let fired: Vec<&str> = results["faults"].as_array().unwrap().iter().map(|w| w["fault"].as_str().unwrap()).collect();
    for fault in ["ack-loss", "db-error", "clock-skew"] {
        assert!(fired.contains(&fault), "{fault} fired: {fired:?}");
    }
    assert!(logs(&dir, "worker").contains("ack lost (haunt ack-loss)"), "ack-loss reached a worker's acks");
    assert!(logs(&dir, "api").contains("injected by haunt's db-error"), "db-error reached the API's statements");
}

/// A hold point the file declares and its node does not offer is refused
/// before any order is placed, naming the node and the point.
#[test]
fn a_hold_point_its_node_does_not_offer_is_refused_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let system_dir = shop("fixed").parent().unwrap().to_string_lossy().into_owned();
    let text = std::fs::read_to_string(shop("fixed")).unwrap();
    let text = text.replace("{system_dir}", &system_dir).replace("\"after-order-before-message\"", "\"after-lunch\"");
    let file = tmp.path().join("lunch.toml");
    std::fs::write(&file, text).unwrap();
    let store = tmp.path().join("store");
    let out = haunt_run(
        &store,
        &["--system", &file.to_string_lossy(), "--nemesis", "kill", "--time-limit-s", "8", "--quiet"],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "node api: the system file declares hold point \"after-lunch\", which its admin endpoint does not offer"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("after-order-before-message"), "what it offers instead: {stderr}");
    let history = std::fs::read_to_string(latest(&store).join("history.jsonl")).unwrap_or_default();
    assert!(!history.contains("\"invoke\""), "no order was placed: {history}");
}

/// Runs a client library's own tests in `clients/DIR`; they speak the
/// protocol over HTTP on the loopback (routes, bodies, refusals, a hold).
fn library_tests(dir: &str, program: &str, args: &[&str], ran: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("clients").join(dir);
    let out = std::process::Command::new(program)
        .args(args)
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} must be installed (the polyglot machines have it): {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{program} {args:?} in {}: {text}", dir.display());
    assert!(text.contains(ran), "{program} ran no test: {text}");
}

#[test]
fn the_python_client_library_answers_the_protocol() {
    library_tests("python", "python3", &["-m", "unittest", "-v", "test_haunt_admin"], "Ran 8 tests");
}

#[test]
fn the_go_client_library_answers_the_protocol() {
    // -count=1: run them, never a cached pass.
    library_tests("go", "go", &["test", "-count=1", "-v", "./..."], "--- PASS: TestSwitchesAreSetAllOrNothing");
}

#[test]
fn the_node_client_library_answers_the_protocol() {
    library_tests("node", "node", &["--test"], "# pass 7");
}

/// A system file with `[[variant]]`s: the matrix runs a row per variant under
/// the variant's own faults and judges it by the variant's expectation.
#[test]
fn the_matrix_runs_a_row_per_variant_judged_by_its_expectation() {
    let store = tempfile::tempdir().unwrap();
    let file = shop("shop").to_string_lossy().into_owned();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["matrix", "--store"])
        .arg(store.path())
        .args(["--system", &file, "--seeds", "1", "--time-limit-s", "12", "--only", "dual-write", "lost-update"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("| tutorial-python dual-write under kill | kill | `lost-effect` | 1/1 |"), "{text}");
    assert!(text.contains("| tutorial-python lost-update under none | none | `projection-mismatch` | 1/1 |"), "{text}");
    assert!(!text.contains("no-inbox under"), "--only names variants: {text}");
}

/// `--variant` names one of the file's variants, and needs `--system`.
#[test]
fn an_unknown_variant_is_refused_naming_the_known_ones() {
    let store = tempfile::tempdir().unwrap();
    let file = shop("shop").to_string_lossy().into_owned();
    let out = haunt_run(store.path(), &["--system", &file, "--variant", "lunch"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "a refused input: {stderr}");
    assert!(
        stderr.contains("--variant lunch") && stderr.contains("fixed, dual-write, lost-update, no-inbox, unfenced"),
        "{stderr}"
    );
    let out = haunt_run(store.path(), &["--variant", "fixed"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--system"), "--variant needs --system");
    assert!(!store.path().join("latest").exists(), "nothing ran");
}

/// A node without hold points may say through a probe when it holds work.
/// Here the API's probe is its health check, always yes, so each aimed kill
/// of it strikes at the probe's first answer (the workers' probe, SQL over
/// their leased rows, is filled and built too; a lease lasts milliseconds, so
/// whether it catches one in 0.25 s is left to the measurements).
#[test]
fn a_kill_waits_for_the_work_a_probe_sees() {
    let tmp = tempfile::tempdir().unwrap();
    let system_dir = shop("shop").parent().unwrap().to_string_lossy().into_owned();
    let text = std::fs::read_to_string(shop("shop")).unwrap().replace("{system_dir}", &system_dir);
    let leased = "aim = \"SELECT count(*) FROM queue WHERE lease_owner = 'worker-{n}' \
                  AND visible_at_ms > (julianday('now') - 2440587.5) * 86400000\"";
    let text = text
        .replace("points = [\"after-effect-before-ack\"]", leased)
        .replace("points = [\"after-order-before-message\"]", "aim = \"http://127.0.0.1:{port:api}/healthz\"");
    assert!(text.contains("lease_owner") && text.contains("/healthz\"\n"), "the points give way to probes");
    let file = tmp.path().join("probed.toml");
    std::fs::write(&file, text).unwrap();
    let store = tmp.path().join("store");
    let file = file.to_string_lossy().into_owned();
    let args = ["--system", &file, "--variant", "fixed", "--nemesis", "kill", "--fault-targets", "api"];
    let more = ["--seed", "3", "--time-limit-s", "12", "--nemesis-interval-s", "1.5", "--quiet"];
    let out = haunt_run(&store, &[&args[..], &more].concat()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let history = lines(&latest(&store).join("history.jsonl"));
    let kills: Vec<&Value> =
        history.iter().filter(|op| op["f"] == "kill" && op["value"].get("result").is_some()).collect();
    let aims: Vec<(&str, &Value)> =
        kills.iter().filter_map(|op| Some((op["value"]["target"].as_str()?, op["value"].get("aim")?))).collect();
    assert!(!aims.is_empty(), "the first kill is aimed: {kills:?}");
    for (target, aim) in &aims {
        assert_eq!((*target, &aim["probe"], &aim["held"]), ("api", &json!(true), &json!(true)), "{aim}");
    }
}

/// The second example, in Go over NATS JetStream with NATS a node of the run
/// (`examples/systems/shop-go-nats`): built with the machine's Go, its naive
/// variant is caught losing an event and its fixed one is valid, each in its
/// own row of the matrix.
#[test]
fn the_go_shop_over_nats_is_caught_naive_and_valid_fixed() {
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: the Go shop over NATS (HAUNT_SKIP_BROKERS=1)");
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systems/shop-go-nats");
    let built = std::process::Command::new("go")
        .args(["build", "-o", "bin/shop", "."])
        .current_dir(&dir)
        .output()
        .expect("go must be installed (the polyglot machines have it)");
    assert!(built.status.success(), "go build: {}", String::from_utf8_lossy(&built.stderr));
    assert!(
        std::process::Command::new("nats-server").arg("--version").output().is_ok_and(|o| o.status.success()),
        "nats-server must be installed (scripts/brokers installs it), or set HAUNT_SKIP_BROKERS=1"
    );
    shop_matrix_catches_naive_and_passes_fixed(&dir, "shop-go-nats");
}

/// The third shop, in Node over Redis Streams with its orders in PostgreSQL
/// (`examples/systems/shop-node-redis`), through `clients/node`: its
/// dependencies installed from npm as a user would, Redis and a PostgreSQL
/// server of the run's own as nodes; its naive variant is caught and its
/// fixed one valid.
#[test]
fn the_node_shop_over_redis_is_caught_naive_and_valid_fixed() {
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: the Node shop over Redis (HAUNT_SKIP_BROKERS=1)");
        return;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systems/shop-node-redis");
    let installed = std::process::Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
        .current_dir(&dir)
        .output()
        .expect("npm must be installed (the polyglot machines have Node.js with npm)");
    assert!(installed.status.success(), "npm ci: {}", String::from_utf8_lossy(&installed.stderr));
    assert!(
        std::process::Command::new("redis-server").arg("--version").output().is_ok_and(|o| o.status.success()),
        "redis-server must be installed (scripts/brokers installs it), or set HAUNT_SKIP_BROKERS=1"
    );
    shop_matrix_catches_naive_and_passes_fixed(&dir, "shop-node-redis");
}

/// One seed of 24 s for each variant of the shop in `dir` (its `shop.toml`,
/// named `name`): the fixed one valid under kill, pause, partition and ack
/// loss, the naive one caught losing an event under kills.
fn shop_matrix_catches_naive_and_passes_fixed(dir: &Path, name: &str) {
    let store = tempfile::tempdir().unwrap();
    // A shop's PostgreSQL runs as the user postgres when the suite runs as
    // root: it must reach its data directory in the run's scratch folder.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(store.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.join("shop.toml").to_string_lossy().into_owned();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["matrix", "--store"])
        .arg(store.path())
        .args(["--system", &file, "--seeds", "1", "--time-limit-s", "24"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("| {name} fixed under kill,pause,partition,ack-loss |")), "{text}");
    assert!(text.contains("| verdict true | 1/1 valid |"), "{text}");
    assert!(text.contains(&format!("| {name} naive under kill | kill | `lost-effect` | 1/1 |")), "{text}");
}
