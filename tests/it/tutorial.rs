//! docs/tutorial.md, steps 1 to 4, run as processes: the API and a worker that
//! drops its next two acks, one order delivered three times and applied once,
//! drift injected and reconciled.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn haunt(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_haunt"));
    c.args(args);
    c
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A blocking HTTP exchange over a raw socket: enough for local JSON and text.
fn http(port: u16, request: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(request.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn get(port: u16, path: &str) -> Option<String> {
    http(port, &format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"))
}

fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn the_tutorial_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("tutorial.db").display());
    let (api_port, metrics_port) = (free_port(), free_port());
    let api_listen = format!("127.0.0.1:{api_port}");
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let _api = Service(haunt(&["api", "--db", &db, "--listen", &api_listen]).stderr(Stdio::null()).spawn().unwrap());
    assert!(wait_for(Duration::from_secs(30), || get(api_port, "/readyz").is_some_and(|r| r.contains(" 200 "))));
    let _worker = Service(
        haunt(&[
            "worker",
            "--db",
            &db,
            "--ack-fail-next",
            "2",
            "--visibility-timeout-ms",
            "1000",
            "--metrics-listen",
            &metrics_listen,
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let body = r#"{"order_id":"o-001","item_id":"coffee-beans","qty":1}"#;
    let post = format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-correlation-id: tutorial-1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = http(api_port, &post).unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");

    let metric = |series: &str| -> f64 {
        get(metrics_port, "/metrics")
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
                    .and_then(|l| l[series.len() + 1..].split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(-1.0)
    };
    let duplicates = "haunt_deliveries_total{outcome=\"duplicate\"}";
    assert!(wait_for(Duration::from_secs(30), || metric(duplicates) == 2.0), "two duplicates");
    assert_eq!(metric("haunt_deliveries_total{outcome=\"applied\"}"), 1.0);
    assert_eq!(metric("haunt_ack_failures_total"), 2.0);
    assert!(get(api_port, "/projection").unwrap().contains(r#"{"item_id":"coffee-beans","reserved_qty":1}"#));

    // The drift, injected behind the pipeline's back, then reconciled.
    let store = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let store = haunt_store::Store::connect(&db.parse().unwrap(), Default::default()).await.unwrap();
        store.corrupt_projection("coffee-beans", 5).await.unwrap();
        store
    });
    drop(store);
    let dry = haunt(&["reconcile", "--db", &db, "--dry-run"]).output().unwrap();
    let dry = String::from_utf8_lossy(&dry.stdout);
    assert!(dry.contains("coffee-beans reserved_qty 6 (expected 1, off by +5); would set to 1"), "{dry}");
    let fixed = haunt(&["reconcile", "--db", &db]).output().unwrap();
    assert!(fixed.status.success());
    assert!(get(api_port, "/projection").unwrap().contains(r#""reserved_qty":1}"#));
    let again = haunt(&["reconcile", "--db", &db]).output().unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("no drift"));
}

/// A `haunt worker` over PostgreSQL's queue opens its lease loops'
/// connections before it says it is ready, so that its first batches do not
/// wait for connects: per loop (two by default) two for leases and acks and
/// one to apply on.
#[test]
fn a_worker_opens_its_loops_connections_before_it_is_ready() {
    let Some(db) = haunt_testkit::TestDb::postgres_blocking() else { return };
    let name = format!("haunt-warm-{}", std::process::id());
    let url = format!("{}{}application_name={name}", db.url, if db.url.contains('?') { '&' } else { '?' });
    let mut child = haunt(&["worker", "--db", &url]).env("RUST_LOG", "info").stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let _worker = Service(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stderr).lines().map_while(Result::ok);
        if lines.any(|l| l.contains("worker ready")) {
            let _ = tx.send(());
        }
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("no start line from the worker");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let open: i64 = rt.block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&name)
            .fetch_one(&mut c)
            .await
            .unwrap()
    });
    assert!(open >= 6, "{open} connections open at the worker's start line; its two loops hold six");
}

/// The runtime threads of a `haunt worker` process: one by default (its
/// lease loops wait on the database; more threads on a small machine wake
/// each other, docs/performance.md), as many as `--threads` says, and its
/// start line says how many it has.
#[test]
fn a_worker_runs_on_one_runtime_thread_unless_told_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("threads.db").display());
    let ready_line = |extra: &[&str]| -> String {
        let mut args = vec!["worker", "--db", &db, "--log-format", "json"];
        args.extend_from_slice(extra);
        let mut child = haunt(&args).env("RUST_LOG", "info").stderr(Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let _worker = Service(child);
        // Its logs go to stderr; read them beside, so that a silent worker fails the wait.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut lines = std::io::BufReader::new(stderr).lines().map_while(Result::ok);
            if let Some(line) = lines.find(|l| l.contains("worker ready")) {
                let _ = tx.send(line);
            }
        });
        rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("no start line from the worker {extra:?}"))
    };
    let threads = |line: &str| -> u64 {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        v["runtime_threads"].as_u64().unwrap_or_else(|| panic!("no runtime_threads: {line}"))
    };
    assert_eq!(threads(&ready_line(&[])), 1, "one runtime thread by default");
    assert_eq!(threads(&ready_line(&["--threads", "3"])), 3);
}
