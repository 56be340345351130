//! `haunt bench pipeline` runs every phase end to end (figures are reported,
//! never asserted: each phase verifies its own drain, every event applied once
//! and the queue empty, or the bench fails) and refuses a database that holds
//! data.

use std::process::Command;

fn bench(db: &str) -> std::process::Output {
    bench_with(db, &[])
}

fn bench_with(db: &str, more: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["bench", "pipeline", "--db", db, "--events", "300", "--clients", "4"])
        .args(["--sweep-batch-sizes", "1,50", "--sweep-workers", "1"])
        .args(more)
        .output()
        .unwrap()
}

/// The suite's stand-in for pgmq's SQL (`tests/it/pgmq_standin.sql`): pgmq's
/// five calls with its signatures, so that the bench's pgmq phase runs here.
fn pgmq_standin() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/pgmq_standin.sql").display().to_string()
}

#[test]
fn the_pipeline_bench_measures_every_phase_on_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", tmp.path().join("bench.db").display());
    let out = bench(&db);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for rate in [
        &report["events_per_s"]["server_side_limit_3_commits"],
        &report["events_per_s"]["server_side_limit_2_commits"],
        &report["events_per_s"]["per_message"],
        &report["events_per_s"]["haunt_workers"],
        &report["events_per_s"]["worker_process"],
        &report["orders_per_s"]["raw_insert_txn"],
        &report["orders_per_s"]["api_http"],
        &report["ratios"]["haunt_vs_server_side_3_commits"],
        &report["ratios"]["haunt_vs_server_side_2_commits"],
        &report["worker_process"]["cpu_s"],
    ] {
        assert!(rate.as_f64().is_some_and(|r| r > 0.0), "{report:#}");
    }
    // SQLite has one writer: its limit runs on one connection; and it has
    // no asynchronous commits, so haunt runs the durable protocols there.
    assert_eq!(report["server_side_consumers_best"]["3 commits"], 1, "{report:#}");
    assert_eq!(report["haunt_protocol"]["default"], "3 commits", "{report:#}");
    for postgres_only in [
        "client_sql_baseline",
        "server_side_limit_3_commits_async_lease_ack",
        "server_side_limit_2_commits_async_lease",
        "haunt_workers_3_commits_async_lease_ack",
    ] {
        assert!(report["events_per_s"][postgres_only].is_null(), "{postgres_only} is PostgreSQL's only");
    }
    assert!(report["worker_peak_rss_mib"].as_f64().is_some_and(|m| m > 1.0), "{report:#}");
    assert_eq!(report["sweep"].as_array().map(Vec::len), Some(2));
    paired_by_default(&report, ("3 commits", "2 commits"), "spawn");
}

#[test]
fn the_pipeline_bench_measures_the_server_side_limits_and_baselines_on_postgres() {
    let Some(admin) = haunt_testkit::postgres_admin_url() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let name = format!("haunt_bench_test_{}", std::process::id());
    let db = rt.block_on(haunt_chaos::suites::matrix::ScratchDb::create(&admin, &name)).unwrap();
    let out = bench_with(db.url.as_str(), &["--pgmq-sql", &pgmq_standin()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // The bench drops the pgmq schema it installed, and empties haunt's tables.
    let left = rt.block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(db.url.as_str()).await.unwrap();
        let schemas: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = 'pgmq'")
                .fetch_one(&mut c)
                .await
                .unwrap();
        let baseline = haunt_store::Baseline::connect(&db.url, 1).await.unwrap();
        let ledger = baseline.drain_counts().await.unwrap().ledger_rows;
        baseline.close().await;
        (schemas, ledger)
    });
    rt.block_on(db.drop_now());
    assert!(out.status.success(), "{stderr}");
    assert_eq!(left, (0, 0), "the pgmq schema and the ledger after the bench");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for rate in [
        &report["events_per_s"]["server_side_limit_3_commits"],
        &report["events_per_s"]["server_side_limit_2_commits"],
        &report["events_per_s"]["server_side_limit_3_commits_async_lease_ack"],
        &report["events_per_s"]["server_side_limit_2_commits_async_lease"],
        &report["events_per_s"]["haunt_workers_3_commits"],
        &report["events_per_s"]["haunt_workers_3_commits_async_lease_ack"],
        &report["events_per_s"]["haunt_workers_2_commits"],
        &report["events_per_s"]["haunt_workers_2_commits_async_lease"],
        &report["events_per_s"]["client_sql_baseline"],
        &report["events_per_s"]["client_sql_baseline_same_batch"],
        &report["events_per_s"]["client_sql_locked_one_txn"],
        &report["events_per_s"]["haunt_workers"],
        &report["events_per_s"]["worker_process"],
        &report["orders_per_s"]["api_http"],
        &report["ratios"]["haunt_vs_server_side_3_commits"],
        &report["ratios"]["haunt_vs_server_side_2_commits"],
        &report["ratios"]["haunt_vs_server_side_3_commits_async_lease_ack"],
        &report["ratios"]["haunt_vs_own_limit"],
        &report["ratios"]["haunt_default_vs_server_side_3_commits_durable"],
        &report["ratios"]["worker_process_vs_own_limit"],
    ] {
        assert!(rate.as_f64().is_some_and(|r| r > 0.0), "{report:#}");
    }
    // Found and read (null when the bench found none of the worker's backends);
    // at 300 events their CPU time can be under the kernel's 10 ms tick.
    assert!(report["worker_process"]["postgres_backends_cpu_s"].as_f64().is_some(), "{report:#}");
    // haunt's default on PostgreSQL commits its leases and acks asynchronously,
    // and is measured against the limit of that protocol.
    assert_eq!(report["haunt_protocol"]["default"], "3 commits, lease+ack async", "{report:#}");
    // Every limit is the best of several consumer counts.
    for (protocol, key) in [
        ("3 commits", "server_side_limit_3_commits"),
        ("2 commits", "server_side_limit_2_commits"),
        ("3 commits, lease+ack async", "server_side_limit_3_commits_async_lease_ack"),
        ("2 commits, lease async", "server_side_limit_2_commits_async_lease"),
    ] {
        let by = report["server_side_limit_by_consumers"][protocol].as_object().expect("figures by consumer count");
        let counts: Vec<&str> = by.keys().map(String::as_str).collect();
        for count in ["2", "4", "8"] {
            assert!(counts.contains(&count), "{protocol} at {count} consumers: {report:#}");
        }
        let best = by.values().filter_map(|v| v.as_f64()).fold(0.0, f64::max);
        assert_eq!(report["events_per_s"][key].as_f64(), Some(best), "the limit is the best count's: {report:#}");
        let at = report["server_side_consumers_best"][protocol].as_u64().unwrap().to_string();
        assert_eq!(by[&at].as_f64(), Some(best), "{report:#}");
    }
    assert!(report["worker_peak_rss_mib"].as_f64().is_some_and(|m| m > 1.0), "{report:#}");
    paired_by_default(&report, ("3 commits, lease+ack async", "2 commits, lease async"), "first lease");
    // haunt's default drain paired with the consumer over pgmq: pgmq on either
    // side of each of haunt's 9 drains, each ratio against their mean, as many
    // consumers as haunt's lease loops.
    let pgmq = &report["pgmq"];
    assert_eq!(pgmq["consumers"], report["lease_loops"], "{report:#}");
    assert_eq!(pgmq["batch_size"], 500, "{report:#}");
    alternated(&report, pgmq, "pgmq");
    assert_eq!(report["ratios"]["haunt_vs_pgmq_client_side_paired"], pgmq["median_ratio"], "{report:#}");
    assert!(stderr.contains("against pgmq client-side"), "{stderr}");
    // What each side's drains cost the machine, and how much of it was in
    // the bench process (the consumers): some of it, not all.
    for side in ["pgmq", "haunt"] {
        let cpu = &pgmq["cpu_us_per_event_median"][side];
        let (machine, own) = (cpu["machine"].as_f64(), cpu["bench_process"].as_f64());
        assert!(machine.zip(own).is_some_and(|(m, o)| o > 0.0 && m > o), "{side}'s CPU per event: {report:#}");
    }
    assert!(stderr.contains("CPU (medians): pgmq "), "{stderr}");
    // And the WAL the server wrote for each side's drains: some, per event.
    for side in ["pgmq", "haunt"] {
        let wal = pgmq["wal_bytes_per_event_median"][side].as_f64();
        assert!(wal.is_some_and(|b| b > 0.0), "{side}'s WAL per event: {report:#}");
    }
    assert!(stderr.contains("WAL the server wrote (medians): pgmq "), "{stderr}");
}

/// `--pgmq-sql` is refused before any phase when it cannot run: on SQLite,
/// with a file that is not there, with a file that makes no pgmq; and the
/// database is left as it was.
#[test]
fn the_pipeline_bench_refuses_pgmq_sql_it_cannot_run() {
    let tmp = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", tmp.path().join("bench.db").display());
    let out = bench_with(&sqlite, &["--pgmq-sql", &pgmq_standin()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--pgmq-sql needs a PostgreSQL database"), "{stderr}");
    assert!(!stderr.contains("server-side limit"), "no phase ran: {stderr}");

    let Some(admin) = haunt_testkit::postgres_admin_url() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let name = format!("haunt_bench_pgmq_refused_{}", std::process::id());
    let db = rt.block_on(haunt_chaos::suites::matrix::ScratchDb::create(&admin, &name)).unwrap();
    let missing = tmp.path().join("no-such.sql").display().to_string();
    let out = bench_with(db.url.as_str(), &["--pgmq-sql", &missing]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success() && stderr.contains("reading --pgmq-sql") && stderr.contains("no-such.sql"),
        "{stderr}"
    );
    // A file of SQL that makes none of pgmq's functions: refused when it is
    // installed, and what it made is dropped with the schema.
    let wrong = tmp.path().join("wrong.sql");
    std::fs::write(&wrong, "CREATE SCHEMA pgmq; CREATE TABLE pgmq.nothing (x int);").unwrap();
    let out = bench_with(db.url.as_str(), &["--pgmq-sql", &wrong.display().to_string()]);
    let stderr2 = String::from_utf8_lossy(&out.stderr).into_owned();
    let schemas = rt.block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(db.url.as_str()).await.unwrap();
        sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = 'pgmq'")
            .fetch_one(&mut c)
            .await
            .unwrap()
    });
    rt.block_on(db.drop_now());
    assert!(!out.status.success() && stderr2.contains("is it pgmq's"), "{stderr2}");
    assert_eq!(schemas, 0, "the schema the wrong file made is dropped");
}

/// The default's limit and haunt's default drain, measured alternately (9
/// rounds by default): a limit on either side of every drain, each drain's
/// ratio against their mean, and the median of those in the ratios; the
/// same for `--ack-in-txn` and its protocol; and the default once more,
/// drained by `haunt worker` processes as `haunt run` starts them, timed
/// from `timed_from`: their first leases where the bench can hold the queue
/// until every loop has sent one (PostgreSQL), their spawn where not.
fn paired_by_default(report: &serde_json::Value, (default, in_txn): (&str, &str), timed_from: &str) {
    for (key, protocol, ratio) in [
        ("paired", default, "haunt_vs_own_limit_paired"),
        ("paired_ack_in_txn", in_txn, "haunt_ack_in_txn_vs_own_limit_paired"),
        ("paired_worker_processes", default, "worker_processes_vs_own_limit_paired"),
    ] {
        paired_series(report, key, protocol, ratio);
    }
    let processes = &report["paired_worker_processes"];
    assert_eq!(processes["workers"], report["workers"], "{report:#}");
    assert_eq!(
        (processes["rust_log"].as_str(), processes["metrics_served"].as_bool()),
        (Some("info"), Some(true)),
        "{report:#}"
    );
    assert_eq!(processes["timed_from"], timed_from, "{report:#}");
    assert_eq!(report["worker_process"]["timed_from"], timed_from, "{report:#}");
    // Each round's start, spawn to first leases, outside its drain's time.
    let starts: Vec<f64> = processes["starts_s"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect();
    let expected = if timed_from == "first lease" { 9 } else { 0 };
    assert_eq!(starts.len(), expected, "{report:#}");
    assert!(starts.iter().all(|s| *s > 0.0 && *s < 30.0), "{report:#}");
    assert_eq!(report["worker_process"]["start_s"].as_f64().is_some(), expected > 0, "{report:#}");
}

/// Nine rounds of haunt's drains (the default) alternated with a baseline
/// (`baseline`'s ten figures in `paired`): each ratio haunt's drain against the mean of
/// the two around it. Returns the ratios.
fn alternated(report: &serde_json::Value, paired: &serde_json::Value, baseline: &str) -> Vec<f64> {
    let floats =
        |key: &str| -> Vec<f64> { paired[key].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect() };
    let (around, haunt, ratios) = (floats(baseline), floats("haunt"), floats("ratios"));
    assert_eq!((around.len(), haunt.len(), ratios.len()), (10, 9, 9), "{report:#}");
    for (i, ratio) in ratios.iter().enumerate() {
        let expected = haunt[i] / ((around[i] + around[i + 1]) / 2.0);
        assert!((ratio - expected).abs() < 1e-9 && *ratio > 0.0, "round {i}: {report:#}");
    }
    ratios
}

fn paired_series(report: &serde_json::Value, key: &str, protocol: &str, ratio: &str) {
    let paired = &report[key];
    assert_eq!(paired["protocol"], protocol, "{report:#}");
    assert_eq!(paired["consumers"], report["server_side_consumers_best"][protocol], "{report:#}");
    let mut sorted = alternated(report, paired, "limits");
    sorted.sort_by(f64::total_cmp);
    // The middle one, to three decimals as the checker's quantiles are.
    let median = (sorted[sorted.len() / 2] * 1000.0).round() / 1000.0;
    assert_eq!(paired["median_ratio"].as_f64(), Some(median), "{report:#}");
    assert_eq!(report["ratios"][ratio].as_f64(), Some(median), "{report:#}");
    // What each side's drains cost the machine, from /proc/stat's ticks of
    // 10 ms: a drain of a few hundred events may read none, never less.
    for side in ["limits", "haunt"] {
        for figure in ["cpu_us_per_event_median", "busy_share_median"] {
            let value = paired["machine"][side][figure].as_f64();
            assert!(value.is_some_and(|v| v.is_finite() && v >= 0.0), "{key}.machine.{side}.{figure}: {report:#}");
        }
    }
}

#[test]
fn the_pipeline_bench_runs_a_worker_process_under_a_wrapper_alone() {
    // `env` stands in for a profiler: it runs the worker's command line as
    // given, and the bench stops it with SIGINT once the queue is drained.
    let tmp = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", tmp.path().join("profile.db").display());
    let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["bench", "pipeline", "--db", &db, "--events", "300", "--profile-worker", "env"])
        .args(["--worker-rust-log", "info", "--worker-spans", "batch"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["profile_worker"], "env", "{report:#}");
    // The worker ran in the span form and at the level it was given: at info
    // with a span per batch, no delivery has a line of its own.
    assert_eq!(
        (&report["worker_process"]["spans"], &report["worker_process"]["rust_log"]),
        (&"batch".into(), &"info".into())
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("applied") && !stderr.contains("order.deliver"), "{stderr}");
    assert!(report["worker_process"]["events_per_s"].as_f64().is_some_and(|r| r > 0.0), "{report:#}");
    assert!(report["worker_process"]["peak_rss_mib"].as_f64().is_some_and(|m| m > 1.0), "{report:#}");
    // Only that phase ran.
    assert!(report.get("events_per_s").is_none(), "{report:#}");
}

#[test]
fn the_pipeline_bench_refuses_a_database_with_data() {
    let tmp = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", tmp.path().join("busy.db").display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url: haunt_store::DbUrl = db.parse().unwrap();
    rt.block_on(keep_me(&url, true));
    let out = bench(&db);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not empty"), "{stderr}");
    // The suite's binary is a dev build, as the README's first command's is:
    // a bench says its figures are not a release build's (a release build of
    // the suite would not).
    assert_eq!(stderr.contains("a dev build, without optimisation"), cfg!(debug_assertions), "{stderr}");
    rt.block_on(keep_me(&url, false));
}

/// Places the order `keep-me` (`place`), or checks that it is still there.
async fn keep_me(db: &haunt_store::DbUrl, place: bool) {
    let store = haunt_store::Store::connect(db, haunt_store::StoreOptions::default()).await.unwrap();
    if place {
        let order = haunt_store::NewOrder {
            order_id: "keep-me".into(),
            item_id: "i".into(),
            qty: 1,
            correlation_id: "c".into(),
            traceparent: None,
        };
        store.place_order(&order).await.unwrap();
    } else {
        assert!(store.get_order("keep-me").await.unwrap().is_some(), "nothing was deleted");
    }
    store.close().await;
}

/// `haunt bench transport` over one broker: the relay and the workers each
/// paired with the bare client, every event published and applied once
/// (the bench verifies the ledger itself), the figures in the report.
fn transport_bench(db: &str, transport: &str, rounds: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["bench", "transport", "--transport", transport, "--db", db])
        .args(["--events", "400", "--rounds", rounds, "--consumers", "2", "--batch-size", "100"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{transport}: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_transport_bench_pairs_the_relay_and_the_workers_with_the_bare_client() {
    let Some(admin) = haunt_testkit::postgres_admin_url() else { return };
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: the transport bench over Redis, NATS and MQTT (HAUNT_SKIP_BROKERS=1)");
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let name = format!("haunt_bench_transport_{}", std::process::id());
    let db = rt.block_on(haunt_chaos::suites::matrix::ScratchDb::create(&admin, &name)).unwrap();
    let positive = |v: &serde_json::Value| v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0);

    // A broker that holds what is published: filled, then drained.
    let report = transport_bench(db.url.as_str(), "redis-streams", "1");
    assert_eq!(report["transport"], "redis-streams", "{report:#}");
    assert_eq!(report["live"], false, "{report:#}");
    assert_eq!(report["haunt"]["applied"], serde_json::json!([400]), "{report:#}");
    assert_eq!(report["bare"]["received"], serde_json::json!([400, 400]), "{report:#}");
    // A warm-up pair ran first and is not in the ratios; the round after it
    // applied every one of its own events, none of the warm-up's ids again.
    assert_eq!(report["warmup"]["applied"], serde_json::json!([400]), "{report:#}");
    assert!(positive(&report["warmup"]["bare_drain_events_per_s"][0]), "{report:#}");
    for figure in [
        &report["ratios"]["relay_vs_bare_publish"],
        &report["ratios"]["workers_vs_bare_drain"],
        &report["bare_publish_events_per_s"],
        &report["bare_drain_events_per_s"],
        &report["haunt"]["relay_events_per_s"][0],
        &report["haunt"]["workers_events_per_s"][0],
    ] {
        assert!(positive(figure), "{figure} in {report:#}");
    }
    // The ratio is haunt's rate over the mean of the bare rates around it.
    let bare: Vec<f64> =
        report["bare"]["drain_events_per_s"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let workers = report["haunt"]["workers_events_per_s"][0].as_f64().unwrap();
    let ratio = report["ratios"]["workers_vs_bare_drain"].as_f64().unwrap();
    assert!((ratio - workers / ((bare[0] + bare[1]) / 2.0)).abs() < 1e-9, "{report:#}");

    // Fire-and-forget: the consumers first, and what arrived is counted.
    let report = transport_bench(db.url.as_str(), "redis-pubsub", "1");
    assert_eq!(report["live"], true, "{report:#}");
    let applied = report["haunt"]["applied"][0].as_u64().unwrap();
    assert!(applied > 0 && applied <= 400, "{report:#}");
    assert!(positive(&report["ratios"]["workers_vs_bare_drain"]), "{report:#}");

    // A broker that deduplicates by message id (JetStream's Nats-Msg-Id):
    // each round's messages are new to it, so every round applies them all.
    let report = transport_bench(db.url.as_str(), "nats", "2");
    assert_eq!(report["haunt"]["applied"], serde_json::json!([400, 400]), "{report:#}");
    // MQTT keeps a session per consumer name: the bare client and haunt's
    // workers share theirs, and each phase leaves them empty, so no phase
    // loses messages to a dead session or applies another phase's (the
    // bench verifies each haunt drain's ledger).
    let report = transport_bench(db.url.as_str(), "mqtt", "2");
    assert_eq!(report["haunt"]["applied"], serde_json::json!([400, 400]), "{report:#}");

    // A database with data of its own is refused, and kept.
    rt.block_on(keep_me(&db.url, true));
    let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["bench", "transport", "--transport", "redis-streams", "--db", db.url.as_str()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("not empty"), "{stderr}");
    rt.block_on(keep_me(&db.url, false));
}

#[test]
fn the_transport_bench_refuses_the_database_queue_and_sqlite_before_starting_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", tmp.path().join("t.db").display());
    for (transport, db, says) in [
        ("db", "postgres://127.0.0.1:1/none", "needs a broker"),
        ("redis-streams", sqlite.as_str(), "runs on PostgreSQL"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_haunt"))
            .args(["bench", "transport", "--transport", transport, "--db", db])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{transport} {db}: {stderr}");
    }
    assert!(!tmp.path().join("t.db").exists(), "nothing was created");
}
