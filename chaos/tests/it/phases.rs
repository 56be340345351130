//! The run's phases in process, in virtual time: an in-memory system on the
//! no-op backend, a scripted nemesis, `tokio::time::pause()`. Whichever way a
//! run ends (its end, an error, cancellation, Ctrl-C), every fault that started
//! is healed, and the history it leaves is well formed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use haunt_chaos::core::nemesis::Faults;
use haunt_chaos::core::options::RunOptions;
use haunt_chaos::core::roles::{BoxFuture, Nemesis, RunDirChecker};
use haunt_chaos::core::run::{Roles, RunOutcome, execute};
use haunt_chaos::core::system::System;
use serde_json::Value;

use crate::memory::Memory;

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
