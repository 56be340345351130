//! haunt as a library (`haunt_chaos::test::ChaosTest`) from a `#[tokio::test]`,
//! driving the reference pipeline and a system file as a user's test would.

use std::time::Duration;

use haunt_chaos::fault::Fault;
use haunt_chaos::test::ChaosTest;

fn haunt() -> &'static str {
    env!("CARGO_BIN_EXE_haunt")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chaos_test_of_the_reference_pipeline_passes_and_a_bug_mode_fails_it() {
    let store = tempfile::tempdir().unwrap();
    let valid = ChaosTest::reference_pipeline()
        .haunt_exe(haunt())
        .faults(&[Fault::Kill, Fault::Pause])
        .time_limit(Duration::from_secs(12))
        .fault_interval(Duration::from_secs(2))
        .seed(3)
        .store(store.path())
        .run()
        .await
        .unwrap();
    valid.assert_valid();
    assert_eq!(valid.seed, 3);
    assert!(valid.results.counts.acknowledged > 100, "{:?}", valid.results.counts);

    let caught = ChaosTest::reference_pipeline()
        .haunt_exe(haunt())
        .bug(haunt_store::Bug::NoInbox)
        .faults(&[Fault::AckLoss])
        .time_limit(Duration::from_secs(8))
        .seed(3)
        .store(store.path())
        .run()
        .await
        .unwrap();
    caught.assert_anomaly("double-applied");
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| caught.assert_valid())).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains("double-applied") && message.contains("report: "), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chaos_test_of_a_system_file_takes_the_faults_the_file_allows() {
    let store = tempfile::tempdir().unwrap();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systems/tutorial-python/fixed.toml");
    let outcome = ChaosTest::system_file(file)
        .time_limit(Duration::from_secs(14))
        .fault_interval(Duration::from_secs(2))
        .seed(2)
        .store(store.path())
        .run()
        .await
        .unwrap();
    outcome.assert_valid();
    let fired: Vec<&str> = outcome.results.faults.iter().map(|w| w.fault.as_str()).collect();
    for fault in ["kill", "pause", "partition", "delay"] {
        assert!(fired.contains(&fault), "{fault} fired: {fired:?}");
    }
}
