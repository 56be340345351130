//! `haunt guarantees`: a short one over the database queue and Redis
//! Streams writes the table, `guarantees.json` and `guarantees.html`; the
//! inbox rows apply nothing twice and the no-inbox rows do, under ack loss.
//! And the repair step on its own: reconcile re-enqueues what a run lost, a
//! worker applies it, and the checker finds the repaired state valid.

use std::process::Command;

use serde_json::Value;

use crate::run::{haunt_run, latest, read_json};

#[test]
fn a_short_guarantees_run_over_the_database_queue_and_redis_streams_writes_the_table_json_and_page() {
    if std::env::var("HAUNT_SKIP_BROKERS").as_deref() == Ok("1") {
        eprintln!("SKIPPED: haunt guarantees over redis-streams (HAUNT_SKIP_BROKERS=1)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The speed columns need a PostgreSQL database of their own.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let speed_db = haunt_testkit::postgres_admin_url().map(|admin| {
        let name = format!("haunt_guarantees_speed_{}", std::process::id());
        rt.block_on(haunt_chaos::suites::matrix::ScratchDb::create(&admin, &name)).unwrap()
    });
    let mut command = Command::new(env!("CARGO_BIN_EXE_haunt"));
    command
        .arg("guarantees")
        .arg("--store")
        .arg(tmp.path())
        .args(["--transports", "db,redis-streams", "--seeds", "1", "--time-limit-s", "8"])
        .args(["--throughput-time-limit-s", "3"]);
    if let Some(db) = &speed_db {
        command.args(["--speed-db", db.url.as_str(), "--speed-events", "300"]);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("at-least-once + inbox"), "the tutorial-shaped table: {stdout}");
    let dir = std::fs::read_dir(tmp.path().join("guarantees")).unwrap().next().unwrap().unwrap().path();
    let json = read_json(&dir.join("guarantees.json"));
    assert_eq!(json["complete"], true, "written after the last row too");
    let rows = json["rows"].as_array().unwrap();
    let names: Vec<(String, bool)> =
        rows.iter().map(|r| (r["transport"].as_str().unwrap().to_owned(), r["inbox"].as_bool().unwrap())).collect();
    let expected = [("db", true), ("db", false), ("redis-streams", true), ("redis-streams", false)];
    assert_eq!(names, expected.map(|(t, i)| (t.to_owned(), i)));
    let mut speeds = Vec::new();
    for row in rows {
        let name = format!("{} inbox={}", row["transport"], row["inbox"]);
        for field in ["lost", "delivered_more_than_once", "applied_more_than_once", "events_per_s"] {
            assert!(row.get(field).is_some(), "{name}: no {field}: {row}");
        }
        assert_eq!(row["claim"], "at-least-once", "{name}");
        assert_eq!(row["matches_claim"], true, "{name}: {row}");
        assert_eq!(row["lost"], 0, "{name}: {row}");
        assert!(row["events_per_s"].as_f64().unwrap() > 0.0, "{name}: {row}");
        assert!(row["effect_lag_ms_p99"].is_number(), "{name}: {row}");
        speeds.push((name.clone(), row["speed"].as_f64(), row["mode_speed"].as_f64()));
        let fired = &row["runs"][0]["faults_fired"];
        assert!(fired["ack-loss"].as_u64().unwrap_or(0) > 0, "{name}: ack loss never fired: {row}");
        if row["inbox"] == true {
            assert_eq!(row["applied_more_than_once"], 0, "{name}: {row}");
            assert!(row["delivered_more_than_once"].as_u64().unwrap() > 0, "{name}: nothing redelivered: {row}");
            let repair = &row["repaired_by_reconcile"];
            assert_eq!((&repair["lost_after"], &repair["projection_mismatch_after"]), (&0.into(), &0.into()), "{name}");
            assert_eq!(repair["verdict_after"], "true", "{name}: {row}");
        } else {
            assert!(row["applied_more_than_once"].as_u64().unwrap() > 0, "{name}: no double application: {row}");
            assert!(row["repaired_by_reconcile"].is_null(), "{name}: reconcile needs the inbox: {row}");
        }
    }
    if speed_db.is_some() {
        // The transport's own ratio where there is a broker; its first mode
        // is the base of the mode's speed.
        let measured: Vec<(bool, Option<f64>)> =
            speeds.iter().map(|(_, speed, mode)| (speed.is_some_and(|s| s > 0.0), *mode)).collect();
        assert_eq!(measured, [(false, None), (false, None), (true, Some(1.0)), (true, Some(1.0))], "{speeds:?}");
        for row in &rows[2..] {
            let speed = &row["transport_speed"];
            assert!(speed["bare_events_per_s"].as_f64().is_some_and(|b| b > 0.0), "{speed}");
            assert!(speed["error"].is_null(), "{speed}");
        }
    } else {
        eprintln!("SKIPPED: the speed columns (no PostgreSQL)");
    }
    let page = std::fs::read_to_string(dir.join("guarantees.html")).unwrap();
    assert!(page.matches("<svg").count() >= 3, "bars, throughput against lag, the worst run's faults");
    assert!(page.contains("redis-streams"), "the page names the rows");
    assert!(!page.contains("<script") && !page.contains("src=\"http"), "self-contained");
    assert!(dir.join("guarantees.txt").exists());
}

/// A run whose effects were lost (ten applied events forgotten, their
/// projection kept): reconcile re-enqueues those ten and corrects the
/// projection, a worker applies them, and the state is valid again.
#[test]
fn reconcile_repairs_what_a_run_lost_and_the_repaired_state_is_checked_again() {
    let tmp = tempfile::tempdir().unwrap();
    let args = ["--time-limit-s", "3", "--nemesis", "none", "--seed", "2", "--quiet"];
    let out = haunt_run(tmp.path(), &args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let run = latest(tmp.path());
    let db = format!("sqlite://{}", run.join("haunt.db").display());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store =
            haunt_store::Store::connect(&db.parse().unwrap(), haunt_store::StoreOptions::default()).await.unwrap();
        assert_eq!(store.forget_applications(10).await.unwrap().len(), 10);
        store.close().await;
    });
    let haunt = std::path::Path::new(env!("CARGO_BIN_EXE_haunt"));
    let repair = runtime.block_on(haunt_chaos::suites::guarantees::repair(haunt, &run)).unwrap();
    assert_eq!(repair.requeued, 10, "{repair:?}");
    assert!(repair.projection_corrected > 0, "{repair:?}");
    assert_eq!((repair.lost_after, repair.projection_mismatch_after), (0, 0), "{repair:?}");
    assert_eq!(repair.verdict_after, "true", "{repair:?}");
    let after: Value = read_json(&run.join("after-reconcile").join("results.json"));
    assert_eq!(after["valid"], true);
}

#[test]
fn a_bad_transport_or_no_seeds_is_refused_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let guarantees = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_haunt")).arg("guarantees").arg("--store").arg(tmp.path()).args(args).output()
    };
    let out = guarantees(&["--transports", "db,kafkaesque"]).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("unknown transport \"kafkaesque\"") && stderr.contains("--transports"), "{stderr}");
    let out = guarantees(&["--transports", "db", "--seeds", "0"]).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("--seeds must be positive"), "{stderr}");
    // tansu serves only the Kafka rows, and has no transactions.
    for (args, needle) in [
        (&["--transports", "db", "--kafka-server", "tansu"][..], "--transports names none"),
        (&["--transports", "kafka:eos", "--kafka-server", "tansu"][..], "tansu 0.6 has none"),
        (
            &["--transports", "kafka", "--kafka-server", "tansu", "--speed-db", "postgres://x@127.0.0.1:1/x"][..],
            "leave it out",
        ),
    ] {
        let out = guarantees(args).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none(), "a refused run creates nothing");
}
