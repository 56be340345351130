//! The run's phases in process, in virtual time: an in-memory system on the
//! no-op backend, a scripted nemesis, `tokio::time::pause()`. Whichever way a
//! run ends (its end, an error, cancellation, Ctrl-C), every fault that started
//! is healed, and the history it leaves is well formed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use haunt_chaos::core::nemesis::Faults;
use haunt_chaos::core::options::RunOptions;
use haunt_chaos::core::roles::{BoxFuture, Client, Completion, Nemesis, NoopBackend, RunDirChecker};
use haunt_chaos::core::run::{Roles, RunOutcome, execute};
use haunt_chaos::core::system::{FinalSink, Surfaces, System};
use haunt_format::{Applied, FinalLine, OrderRow, OrderValue, ProjectionRow};
use serde_json::Value;

/// Orders kept in memory, each applied once: a correct system, unless
/// `doubles` says to apply every n-th order twice.
#[derive(Debug)]
struct Memory {
    surfaces: Surfaces,
    orders: Arc<Mutex<BTreeMap<String, OrderRow>>>,
    doubles: Option<usize>,
}

impl Memory {
    fn new() -> Memory {
        Memory { surfaces: Surfaces::nodes_only(Arc::new(NoopBackend)), orders: Arc::default(), doubles: None }
    }
}

#[derive(Debug)]
struct MemoryClient(Arc<Mutex<BTreeMap<String, OrderRow>>>);

impl Client for MemoryClient {
    fn place<'a>(&'a self, order: &'a OrderValue, _correlation_id: &'a str) -> BoxFuture<'a, Completion> {
        Box::pin(async move {
            let mut orders = self.0.lock().unwrap();
            let row = orders.entry(order.order_id.clone()).or_insert_with(|| OrderRow {
                order_id: order.order_id.clone(),
                item_id: order.item_id.clone(),
                qty: order.qty,
                event_id: format!("e-{}", order.order_id),
                ..OrderRow::default()
            });
            Completion::Ok { event_id: Some(row.event_id.clone()) }
        })
    }
}

impl System for Memory {
    fn surfaces(&self) -> &Surfaces {
        &self.surfaces
    }
    fn client(&self) -> Arc<dyn Client> {
        Arc::new(MemoryClient(self.orders.clone()))
    }
    fn ready(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async { Ok(()) })
    }
    fn is_quiet(&self) -> BoxFuture<'_, anyhow::Result<bool>> {
        Box::pin(async { Ok(true) })
    }
    fn read_final_state<'a>(&'a self, sink: &'a mut FinalSink<'_>) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let orders = self.orders.lock().unwrap().clone();
            let mut reserved: BTreeMap<String, i64> = BTreeMap::new();
            for (i, row) in orders.values().enumerate() {
                let times = if self.doubles.is_some_and(|n| i % n == 0) { 2 } else { 1 };
                sink(FinalLine::Order(row.clone()))?;
                for attempt in 1..=times {
                    *reserved.entry(row.item_id.clone()).or_default() += row.qty;
                    sink(FinalLine::Applied(Applied {
                        event_id: row.event_id.clone(),
                        order_id: row.order_id.clone(),
                        item_id: row.item_id.clone(),
                        qty: row.qty,
                        delivery_attempt: attempt,
                        worker_id: "memory".into(),
                        applied_at_ms: 0,
                        key_seq: None,
                        publish_seq: None,
                    }))?;
                }
            }
            for (item_id, reserved_qty) in reserved {
                sink(FinalLine::Projection(ProjectionRow { item_id, reserved_qty }))?;
            }
            Ok(())
        })
    }
    fn database(&self) -> String {
        "memory".into()
    }
}

/// What the scripted nemesis has broken, as the test sees it.
#[derive(Debug, Default)]
struct Breakage {
    broken: AtomicBool,
    starts: AtomicU32,
    heals_blocking: AtomicU32,
}

/// Breaks a flag; its stop heals it unless told to fail, its last-resort heal
/// always does. `on_start` runs once the fault is in place.
struct Scripted {
    state: Arc<Breakage>,
    stop_fails: bool,
    on_start: Box<dyn Fn() + Send + Sync>,
}

impl Nemesis for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn targets(&self) -> Vec<String> {
        vec!["the-system".into()]
    }
    fn start<'a>(&'a self, _: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            self.state.broken.store(true, Ordering::SeqCst);
            self.state.starts.fetch_add(1, Ordering::SeqCst);
            (self.on_start)();
            Ok(())
        })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        Box::pin(async move {
            anyhow::ensure!(!self.stop_fails, "the scripted stop fails");
            self.state.broken.store(false, Ordering::SeqCst);
            Ok(())
        })
    }
    fn heal_blocking(&self) {
        if self.state.broken.swap(false, Ordering::SeqCst) {
            self.state.heals_blocking.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn options(store: &std::path::Path) -> RunOptions {
    RunOptions {
        time_limit: Duration::from_secs(20),
        nemesis_interval: Duration::from_secs(2),
        rate: 50.0,
        quiet: true,
        quiesce_timeout: Duration::from_secs(5),
        store: store.to_owned(),
        seed: 7,
        ..RunOptions::default()
    }
}

struct Setup {
    _tmp: tempfile::TempDir,
    run_dir: std::path::PathBuf,
    options: RunOptions,
    state: Arc<Breakage>,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    std::fs::create_dir_all(run_dir.join("logs")).unwrap();
    let options = options(tmp.path());
    Setup { _tmp: tmp, run_dir, options, state: Arc::default() }
}

fn roles(state: &Arc<Breakage>, stop_fails: bool, on_start: Box<dyn Fn() + Send + Sync>) -> Roles {
    let system: Arc<dyn System> = Arc::new(Memory::new());
    let nemesis = Scripted { state: state.clone(), stop_fails, on_start };
    Roles {
        client: system.client(),
        system,
        nemeses: Faults::new(vec![Box::new(nemesis)]),
        checker: Box::new(RunDirChecker),
    }
}

/// The scripted fault's ops in the history: each start that worked followed
/// by a stop that worked, none left open.
fn assert_faults_paired(history: &str) {
    let mut open = false;
    for line in history.lines() {
        let op: Value = serde_json::from_str(line).expect("every history line is JSON");
        let worked = op["value"]["result"] == "ok";
        match op["f"].as_str() {
            Some("start-scripted") if worked => {
                assert!(!open, "a second start before a stop: {line}");
                open = true;
            }
            Some("stop-scripted") if worked => open = false,
            _ => {}
        }
    }
    assert!(!open, "a start without its stop");
}

#[tokio::test(start_paused = true)]
async fn a_run_that_ends_heals_every_fault_and_leaves_a_well_formed_history() {
    let s = setup();
    let abort = Arc::new(AtomicBool::new(false));
    let roles = roles(&s.state, false, Box::new(|| {}));
    let outcome: RunOutcome = execute(&s.options, roles, s.run_dir.clone(), 0, &abort).await.unwrap();

    let results = outcome.results.expect("a finished run is checked");
    assert_eq!(results.valid, haunt_checker::Verdict::Valid, "{results:#?}");
    assert!(results.counts.acknowledged > 100, "the workload ran: {:?}", results.counts);
    assert!(results.counts.present == results.counts.acknowledged, "{:?}", results.counts);
    assert!(s.state.starts.load(Ordering::SeqCst) >= 3, "the fault fired");
    assert!(!s.state.broken.load(Ordering::SeqCst), "healed");
    assert_eq!(s.state.heals_blocking.load(Ordering::SeqCst), 0, "by its stop, not the last resort");
    assert!(outcome.faults_never_fired.is_empty());
    assert_faults_paired(&std::fs::read_to_string(s.run_dir.join("history.jsonl")).unwrap());
    let run: Value = serde_json::from_str(&std::fs::read_to_string(s.run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["verdict"], "true", "Jepsen's :valid? true");
    assert_eq!(run["faults_fired"]["scripted"], s.state.starts.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_run_that_fails_still_heals_and_says_why() {
    let s = setup();
    let abort = Arc::new(AtomicBool::new(false));
    let roles = roles(&s.state, true, Box::new(|| {}));
    let err = execute(&s.options, roles, s.run_dir.clone(), 0, &abort).await.unwrap_err();

    assert!(format!("{err:#}").contains("the scripted stop fails"), "{err:#}");
    assert!(!s.state.broken.load(Ordering::SeqCst), "healed on the way out");
    assert_eq!(s.state.heals_blocking.load(Ordering::SeqCst), 1, "by the last resort");
    let run: Value = serde_json::from_str(&std::fs::read_to_string(s.run_dir.join("run.json")).unwrap()).unwrap();
    assert!(run["error"].as_str().unwrap().contains("could not heal"), "{run}");
    assert!(run["ended_at_ms"].is_i64());
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_heals_the_fault_in_place() {
    let s = setup();
    let abort = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let notify = started.clone();
    let roles = roles(&s.state, false, Box::new(move || notify.notify_one()));
    let run = execute(&s.options, roles, s.run_dir.clone(), 0, &abort);
    tokio::select! {
        outcome = run => panic!("the run ended before its first fault: {outcome:?}"),
        () = started.notified() => {}
    }
    // The run's future is dropped with the fault in place.
    assert!(!s.state.broken.load(Ordering::SeqCst), "healed when the run was dropped");
    assert_eq!(s.state.heals_blocking.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_aborted_run_heals_and_is_marked_aborted() {
    let s = setup();
    let abort = Arc::new(AtomicBool::new(false));
    let flag = abort.clone();
    let roles = roles(&s.state, false, Box::new(move || flag.store(true, Ordering::SeqCst)));
    let outcome = execute(&s.options, roles, s.run_dir.clone(), 0, &abort).await.unwrap();

    assert!(outcome.aborted && outcome.results.is_none());
    assert!(!s.state.broken.load(Ordering::SeqCst), "healed");
    assert_eq!(s.state.starts.load(Ordering::SeqCst), 1, "nothing started after the abort");
    assert_faults_paired(&std::fs::read_to_string(s.run_dir.join("history.jsonl")).unwrap());
    let run: Value = serde_json::from_str(&std::fs::read_to_string(s.run_dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["aborted"], true);
}

/// The library's builder over a system given in code: a correct one passes
/// `assert_valid`, one that applies events twice fails it with the anomaly,
/// the seed and the report.
#[tokio::test(start_paused = true)]
async fn the_library_asserts_a_system_given_in_code() {
    use haunt_chaos::test::ChaosTest;
    let tmp = tempfile::tempdir().unwrap();
    let test = |system: Memory| {
        ChaosTest::system("memory", Arc::new(system))
            .faults(&[])
            .time_limit(Duration::from_secs(5))
            .seed(7)
            .store(tmp.path())
    };
    let outcome = test(Memory::new()).run().await.unwrap();
    outcome.assert_valid();
    assert!(outcome.report().is_file(), "the report is written");

    let outcome = test(Memory { doubles: Some(10), ..Memory::new() }).run().await.unwrap();
    outcome.assert_anomaly("double-applied");
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| outcome.assert_valid())).unwrap_err();
    let message = panic.downcast_ref::<String>().unwrap();
    assert!(message.contains("haunt: the run is not valid"), "{message}");
    assert!(message.contains("double-applied"), "each anomaly: {message}");
    assert!(message.contains("applied 2 times"), "with its examples: {message}");
    assert!(message.contains("seed: 7 (replay with .seed(7))"), "{message}");
    assert!(message.contains(&format!("report: {}", outcome.report().display())), "{message}");
}
