//! `haunt bench pipeline` runs every phase end to end (figures are reported,
//! never asserted) and refuses a database that holds data.

use std::process::Command;

fn bench(db: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_haunt"))
        .args(["bench", "pipeline", "--db", db, "--events", "300", "--clients", "4"])
        .args(["--sweep-batch-sizes", "1,50", "--sweep-workers", "1"])
        .output()
        .unwrap()
}

#[test]
fn the_pipeline_bench_measures_every_phase_on_sqlite() {
    let tmp = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", tmp.path().join("bench.db").display());
    let out = bench(&db);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for rate in [
        &report["events_per_s"]["per_message"],
        &report["events_per_s"]["haunt_workers"],
        &report["orders_per_s"]["raw_insert_txn"],
        &report["orders_per_s"]["api_http"],
    ] {
        assert!(rate.as_f64().is_some_and(|r| r > 0.0), "{report:#}");
    }
    assert!(report["events_per_s"]["raw_ceiling"].is_null(), "the raw ceiling is PostgreSQL's only");
    assert!(report["worker_peak_rss_mib"].as_f64().is_some_and(|m| m > 1.0), "{report:#}");
    assert_eq!(report["sweep"].as_array().map(Vec::len), Some(2));
}

#[test]
fn the_pipeline_bench_measures_the_raw_baselines_on_postgres() {
    let Some(admin) = haunt_testkit::postgres_admin_url() else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let name = format!("haunt_bench_test_{}", std::process::id());
    let db = rt.block_on(haunt_chaos::matrix::ScratchDb::create(&admin, &name)).unwrap();
    let out = bench(&db.url);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    rt.block_on(db.drop_now());
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for rate in [
        &report["events_per_s"]["raw_ceiling"],
        &report["events_per_s"]["raw_ceiling_same_batch"],
        &report["events_per_s"]["raw_one_txn"],
        &report["events_per_s"]["haunt_workers"],
        &report["orders_per_s"]["api_http"],
        &report["ratios"]["haunt_vs_raw_ceiling"],
    ] {
        assert!(rate.as_f64().is_some_and(|r| r > 0.0), "{report:#}");
    }
    assert!(report["worker_peak_rss_mib"].as_f64().is_some_and(|m| m > 1.0), "{report:#}");
}

#[test]
fn the_pipeline_bench_refuses_a_database_with_data() {
    let tmp = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", tmp.path().join("busy.db").display());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = haunt_store::Store::connect(&db, haunt_store::StoreOptions::default()).await.unwrap();
        let order = haunt_store::NewOrder {
            order_id: "keep-me".into(),
            item_id: "i".into(),
            qty: 1,
            correlation_id: "c".into(),
            traceparent: None,
        };
        store.place_order(&order).await.unwrap();
        store.close().await;
    });
    let out = bench(&db);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"), "{}", String::from_utf8_lossy(&out.stderr));
    rt.block_on(async {
        let store = haunt_store::Store::connect(&db, haunt_store::StoreOptions::default()).await.unwrap();
        assert!(store.get_order("keep-me").await.unwrap().is_some(), "nothing was deleted");
    });
}
