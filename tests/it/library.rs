//! haunt as a library (`haunt_chaos::test::ChaosTest`) from a `#[tokio::test]`,
//! driving the reference pipeline and a system file as a user's test would.

use std::time::Duration;

use haunt_chaos::test::{ChaosTest, Fault};

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
    // It says how to shrink the run and how to replay its fault windows;
    // the replay strikes the same windows.
    assert!(message.contains(&format!("shrink: haunt shrink {}", caught.dir().display())), "{message}");
    assert!(message.contains(".schedule(\""), "{message}");
    let replay = ChaosTest::reference_pipeline()
        .haunt_exe(haunt())
        .bug(haunt_store::Bug::NoInbox)
        .schedule(caught.dir().join("schedule.json"))
        .time_limit(Duration::from_secs(8))
        .seed(4)
        .store(store.path())
        .run()
        .await
        .unwrap();
    let windows = |o: &haunt_chaos::test::Outcome| -> Vec<(String, String)> {
        o.results.faults.iter().map(|w| (w.fault.clone(), w.target.clone())).collect()
    };
    assert_eq!(windows(&replay), windows(&caught));
    assert!(!windows(&replay).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chaos_test_of_a_system_file_takes_the_faults_the_file_allows() {
    let store = tempfile::tempdir().unwrap();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systems/tutorial-python/fixed.toml");
    let outcome = ChaosTest::system_file(file)
        // Seven faults: kill, pause, partition, delay and the nodes' hooks.
        .time_limit(Duration::from_secs(22))
        .fault_interval(Duration::from_secs(2))
        .seed(2)
        .store(store.path())
        .run()
        .await
        .unwrap();
    outcome.assert_valid();
    let fired: Vec<&str> = outcome.results.faults.iter().map(|w| w.fault.as_str()).collect();
    for fault in ["kill", "pause", "partition", "delay", "ack-loss", "db-error", "clock-skew"] {
        assert!(fired.contains(&fault), "{fault} fired: {fired:?}");
    }
}

// Containers a test started itself, with testcontainers: the example crate's
// shop (examples/cargo-test), running this build's `haunt`.

#[path = "../../examples/cargo-test/tests/shop/mod.rs"]
mod shop;

use shop::{Shop, ShopOptions};

/// What the engine says of a container: its status, and how many helper
/// containers in its network namespace still exist.
async fn state_of(container: &str) -> (String, usize) {
    use haunt_chaos::backends::docker::bollard::query_parameters::ListContainersOptions;
    let docker = haunt_chaos::backends::docker::connect().await.unwrap();
    let inspect = docker.inspect_container(container, None).await.expect("the test's container still exists");
    let status = inspect.state.and_then(|s| s.status).map(|s| s.to_string()).unwrap_or_default();
    let all = docker.list_containers(Some(ListContainersOptions { all: true, ..Default::default() })).await.unwrap();
    let mode = format!("container:{container}");
    let helpers =
        all.iter().filter(|c| c.host_config.as_ref().and_then(|h| h.network_mode.as_ref()) == Some(&mode)).count();
    (status, helpers)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chaos_test_faults_containers_the_test_started_with_testcontainers() {
    if !crate::docker::docker_ready("a_chaos_test_faults_containers_the_test_started_with_testcontainers") {
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let options = ShopOptions { haunt: Some(std::path::Path::new(haunt())), ..ShopOptions::default() };
    let shop = Shop::start("library", options).await;
    let outcome = ChaosTest::system_toml(&shop.system())
        .haunt_exe(haunt())
        .faults(&[Fault::Kill, Fault::Pause, Fault::Partition, Fault::Loss])
        .time_limit(Duration::from_secs(20))
        .fault_interval(Duration::from_millis(1500))
        .options(|o| o.visibility_timeout = Duration::from_secs(1))
        .seed(4)
        .store(store.path())
        .run()
        .await
        .unwrap();
    outcome.assert_valid();
    let windows: Vec<String> = outcome.results.faults.iter().map(|w| format!("{} {}", w.fault, w.target)).collect();
    for fault in ["kill ", "pause worker-", "partition ", "loss "] {
        assert!(windows.iter().any(|w| w.starts_with(fault)), "{fault}…: {windows:?}");
    }
    assert!(outcome.results.counts.acknowledged > 100, "{:?}", outcome.results.counts);
    // The containers are the test's: still there (stopped at the end of the
    // run, never paused), and no helper that cut their links is left.
    for container in [&shop.postgres, &shop.api].into_iter().chain(&shop.workers) {
        let (status, helpers) = state_of(container.id()).await;
        assert_ne!(status, "paused", "{}", container.id());
        assert_eq!(helpers, 0, "helpers left in {}'s namespace", container.id());
    }
    drop(shop);
}

/// What of haunt's is left in the engine with `marker` in its name, with the
/// network of the run whose container names carry it.
fn left_with(marker: &str, networks: &[String]) -> Vec<String> {
    haunt_chaos::backends::docker::leftovers()
        .unwrap()
        .into_iter()
        .filter(|n| n.contains(marker) || networks.iter().any(|net| n == &format!("network {net}")))
        .collect()
}

#[test]
fn a_panic_in_the_middle_of_a_chaos_test_in_containers_leaves_no_container_or_network() {
    if !crate::docker::docker_ready(
        "a_panic_in_the_middle_of_a_chaos_test_in_containers_leaves_no_container_or_network",
    ) {
        return;
    }
    // haunt's containers file, its nodes renamed so that this test's
    // containers are told apart from any other test's.
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systems/haunt-docker.toml");
    let text = std::fs::read_to_string(source).unwrap();
    let mut text = text;
    for (from, to) in [("postgres", "panicdb"), ("api", "panicapi")] {
        for (a, b) in [("{addr:", "}"), ("{port:", "}"), ("name = \"", "\"")] {
            text = text.replace(&format!("{a}{from}{b}"), &format!("{a}{to}{b}"));
        }
    }
    assert!(text.contains("{addr:panicdb}") && text.contains("name = \"panicapi\""), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("panic.toml");
    std::fs::write(&file, text).unwrap();
    let store = dir.path().join("store");

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut network = Vec::new();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(async {
            let run = ChaosTest::system_file(&file)
                .in_containers()
                .haunt_exe(haunt())
                .faults(&[Fault::Kill, Fault::Pause, Fault::Partition])
                .time_limit(Duration::from_secs(120))
                .fault_interval(Duration::from_secs(1))
                .store(&store)
                .run();
            let panics = async {
                // Until the run's containers exist, then a few faults' worth.
                let deadline = std::time::Instant::now() + Duration::from_secs(120);
                loop {
                    let left = left_with("-panicapi", &[]);
                    if let Some(api) = left.first() {
                        let run_id = api.trim_start_matches("haunt-").split('-').next().unwrap();
                        network.push(format!("haunt-{run_id}"));
                        break;
                    }
                    assert!(std::time::Instant::now() < deadline, "the run's containers never appeared");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                tokio::time::sleep(Duration::from_secs(8)).await;
                assert!(!left_with("-panicdb", &network).is_empty(), "the containers exist while the test runs");
                panic!("the test panics in the middle of its chaos test");
            };
            tokio::select! {
                outcome = run => panic!("the run ended before the panic: {:?}", outcome.map(|o| o.results.valid)),
                () = panics => {}
            }
        })
    }));
    let message = unwound.expect_err("the test panicked");
    assert_eq!(message.downcast_ref::<&str>(), Some(&"the test panics in the middle of its chaos test"));
    assert_eq!(left_with("panic", &network), Vec::<String>::new(), "containers or the network left after a panic");
}
