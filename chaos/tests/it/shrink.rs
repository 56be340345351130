//! `haunt shrink`'s search over real runs in process, in virtual time: a
//! failing run of the in-memory system, with a fault that breaks it and two
//! that do not, shrinks to a schedule that still fails and is minimal.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use haunt_chaos::core::fault::Fault;
use haunt_chaos::core::nemesis::{Faults, SCHEDULE_FILE, ScheduleFile};
use haunt_chaos::core::options::RunOptions;
use haunt_chaos::core::roles::{BoxFuture, Nemesis, RunDirChecker};
use haunt_chaos::core::run::{Roles, execute};
use haunt_chaos::core::system::System;
use haunt_chaos::suites::shrink::{Candidate, Tries, kinds_of, search};

use crate::memory::Memory;

/// A fault that only flips a switch: `ack-loss` makes the system apply the
/// orders placed meanwhile twice; `pause` and `delay` flip nothing.
struct Switch {
    name: &'static str,
    flag: Option<Arc<AtomicBool>>,
}

impl Switch {
    fn set(&self, on: bool) {
        if let Some(flag) = &self.flag {
            flag.store(on, Ordering::SeqCst);
        }
    }
}

impl Nemesis for Switch {
    fn name(&self) -> &'static str {
        self.name
    }
    fn targets(&self) -> Vec<String> {
        vec!["memory".into()]
    }
    fn start<'a>(&'a self, _: &'a str) -> BoxFuture<'a, anyhow::Result<()>> {
        self.set(true);
        Box::pin(async { Ok(()) })
    }
    fn stop(&self) -> BoxFuture<'_, anyhow::Result<()>> {
        self.set(false);
        Box::pin(async { Ok(()) })
    }
    fn heal_blocking(&self) {
        self.set(false);
    }
}

/// A run of a fresh in-memory system in `dir`: its results.
async fn run(options: &RunOptions, dir: &Path) -> haunt_checker::Results {
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let system = Memory::new();
    let nemeses: Vec<Box<dyn Nemesis>> = vec![
        Box::new(Switch { name: "pause", flag: None }),
        Box::new(Switch { name: "ack-loss", flag: Some(system.doubling.clone()) }),
        Box::new(Switch { name: "delay", flag: None }),
    ];
    let system: Arc<dyn System> = Arc::new(system);
    let roles =
        Roles { client: system.client(), system, nemeses: Faults::new(nemeses), checker: Box::new(RunDirChecker) };
    let outcome = execute(options, roles, dir.to_owned(), 0, &Arc::default()).await.unwrap();
    outcome.results.expect("the run was checked")
}

/// Candidates as runs in process: one run each (the system is deterministic
/// but for the workload's seed, which stays the run's).
struct InProcess {
    base: RunOptions,
    kinds: Vec<String>,
    root: PathBuf,
    tries: usize,
}

impl InProcess {
    async fn fails_now(&mut self, c: &Candidate) -> bool {
        self.tries += 1;
        let schedule = ScheduleFile::new(c.windows.clone());
        let options = RunOptions {
            time_limit: Duration::from_secs(c.time_limit_s),
            concurrency: c.concurrency,
            faults: schedule.faults(),
            schedule: Some(schedule),
            ..self.base.clone()
        };
        let results = run(&options, &self.root.join(format!("try-{}", self.tries))).await;
        kinds_of(&results).iter().any(|k| self.kinds.contains(k))
    }
}

impl Tries for InProcess {
    fn fails<'a>(&'a mut self, _: &'static str, c: &'a Candidate) -> BoxFuture<'a, Option<bool>> {
        Box::pin(async move { Some(self.fails_now(c).await) })
    }
}

#[tokio::test(start_paused = true)]
async fn a_failing_run_shrinks_in_process_to_a_minimal_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    let base = RunOptions {
        time_limit: Duration::from_secs(30),
        nemesis_interval: Duration::from_secs(2),
        rate: 50.0,
        quiet: true,
        quiesce_timeout: Duration::from_secs(5),
        store: tmp.path().to_owned(),
        seed: 7,
        faults: vec![Fault::Pause, Fault::AckLoss, Fault::Delay],
        ..RunOptions::default()
    };
    let first = tmp.path().join("first");
    let results = run(&base, &first).await;
    let kinds = kinds_of(&results);
    assert!(kinds.contains(&"double-applied".to_owned()), "the seeded run fails: {kinds:?}");
    let schedule = ScheduleFile::read(&first.join(SCHEDULE_FILE)).unwrap();
    let harmless = schedule.windows.iter().filter(|w| w.fault != "ack-loss").count();
    assert!(schedule.windows.len() >= 6 && harmless >= 2, "windows to shrink: {:?}", schedule.windows);
    let before = Candidate { windows: schedule.windows, time_limit_s: 30, concurrency: base.concurrency };
    let first_anomaly_ms = results.anomalies.values().filter_map(|a| a.first_time_ns).min().map(|ns| ns / 1_000_000);

    let mut tries = InProcess { base, kinds, root: tmp.path().join("tries"), tries: 0 };
    let (after, finished) = search(&mut tries, before.clone(), first_anomaly_ms).await;
    assert!(finished, "no budget to spend in process");
    assert_eq!(after.windows.len(), 1, "{}", after.describe());
    assert_eq!(after.windows[0].fault, "ack-loss", "{}", after.describe());
    assert!(after.windows[0].hold_ms < before.windows.iter().map(|w| w.hold_ms).max().unwrap(), "a shorter hold");
    assert!(after.time_limit_s < before.time_limit_s, "a shorter run: {}", after.describe());
    assert_eq!(after.concurrency, 1, "fewer clients: {}", after.describe());
    eprintln!("{} -> {} in {} tries", before.describe(), after.describe(), tries.tries);
    // Minimal: it still fails, and without any one of its windows it passes.
    assert!(tries.fails_now(&after).await, "the result fails: {}", after.describe());
    for i in 0..after.windows.len() {
        let mut fewer = after.clone();
        fewer.windows.remove(i);
        assert!(!tries.fails_now(&fewer).await, "without window {i} it passes: {}", fewer.describe());
    }
}
