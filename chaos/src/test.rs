//! haunt as a library, for a `#[tokio::test]`: a builder for one chaos test,
//! its outcome, and assertions that fail with what a reader needs.
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use std::time::Duration;
//! use haunt_chaos::test::{ChaosTest, Fault};
//!
//! let outcome = ChaosTest::system_file("examples/systems/haunt.toml")
//!     .faults(&[Fault::Kill, Fault::Pause, Fault::Partition])
//!     .time_limit(Duration::from_secs(20))
//!     .seed(7)
//!     .run()
//!     .await?;
//! outcome.assert_valid();
//! # Ok(()) }
//! ```
//!
//! The run directory is kept (under `store/`, or [`ChaosTest::store`]) for
//! inspection; the assertion names it and its `report.html`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use haunt_checker::{Results, Verdict};

// What a test names besides the builder, under the one path a user imports
// from (wherever the harness keeps it).
pub use crate::core::fault::Fault;
pub use crate::core::options::RunOptions;
pub use crate::core::system::System;
pub use haunt_store::Bug;

/// Which system a test drives.
enum Target {
    /// haunt's reference pipeline, as `haunt run` runs it.
    Pipeline,
    /// A system file (`docs/system-format.md`).
    File(PathBuf),
    /// A system file's text, given in code.
    Text(String),
    /// A system given in code, named for its run directory.
    Given(String, Arc<dyn System>),
}

/// One chaos test, built up and then [`run`](ChaosTest::run).
pub struct ChaosTest {
    target: Target,
    options: RunOptions,
    /// `None`: the system's defaults.
    faults: Option<Vec<Fault>>,
    /// A `schedule.json` to strike instead of the seeded schedule.
    schedule: Option<PathBuf>,
}

impl std::fmt::Debug for ChaosTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosTest").field("options", &self.options).finish_non_exhaustive()
    }
}

impl ChaosTest {
    fn new(target: Target) -> ChaosTest {
        let options = RunOptions {
            quiet: true,
            seed: crate::core::seed::RunSeed::random().0,
            // The services run from the `haunt` executable: $HAUNT_EXE, or `haunt` on PATH.
            exe: std::env::var_os("HAUNT_EXE").map_or_else(|| PathBuf::from("haunt"), PathBuf::from),
            ..RunOptions::default()
        };
        ChaosTest { target, options, faults: None, schedule: None }
    }

    /// haunt's own pipeline, as local processes of the `haunt` executable
    /// ([`ChaosTest::haunt_exe`]) on a fresh SQLite file.
    pub fn reference_pipeline() -> ChaosTest {
        ChaosTest::new(Target::Pipeline)
    }

    /// The system a system file describes; its nodes, client and final-state SQL.
    pub fn system_file(path: impl Into<PathBuf>) -> ChaosTest {
        ChaosTest::new(Target::File(path.into()))
    }

    /// A system file's text given in code, for a system whose containers the
    /// test started itself: nodes with `container = "<id>"` are adopted, and
    /// the faults reach them (kill, pause, and `links` cut with iptables).
    /// `{system_dir}` is the current directory. Errors name the line.
    ///
    /// ```no_run
    /// # async fn example(pg: &str, api: &str, api_port: u16) -> anyhow::Result<()> {
    /// use haunt_chaos::test::ChaosTest;
    /// let system = format!(r#"
    /// name = "shop"
    /// [[node]]
    /// name = "postgres"
    /// container = "{pg}"
    /// port = 5432
    /// faults = ["kill"]
    /// [[node]]
    /// name = "api"
    /// container = "{api}"
    /// port = 8080
    /// links = ["postgres"]
    /// faults = ["kill", "pause"]
    /// [client]
    /// url = "http://{{addr:api}}/orders"
    /// body = '{{"order_id": "{{order_id}}", "item_id": "{{item_id}}", "qty": {{qty}}}}'
    /// ok = [200, 201]
    /// [final_state]
    /// database = "postgres://postgres@127.0.0.1:{{port:postgres}}/postgres"
    /// orders = "SELECT order_id, item_id, qty, event_id FROM orders"
    /// projection = "SELECT item_id, reserved_qty FROM inventory"
    /// "#);
    /// ChaosTest::system_toml(&system).run().await?.assert_valid();
    /// # Ok(()) }
    /// ```
    pub fn system_toml(text: &str) -> ChaosTest {
        ChaosTest::new(Target::Text(text.to_owned()))
    }

    /// A system given in code (any [`System`]); `name` names its run directory.
    pub fn system(name: &str, system: Arc<dyn System>) -> ChaosTest {
        ChaosTest::new(Target::Given(name.to_owned(), system))
    }

    /// The faults to inject (default: `haunt run`'s, or for a system file
    /// everything it allows).
    pub fn faults(mut self, faults: &[Fault]) -> ChaosTest {
        self.faults = Some(faults.to_vec());
        self
    }

    pub fn time_limit(mut self, limit: Duration) -> ChaosTest {
        self.options.time_limit = limit;
        self
    }

    /// The seed of the workload and the fault schedule (default: random; the
    /// outcome and its assertions name it, for a replay).
    pub fn seed(mut self, seed: u64) -> ChaosTest {
        self.options.seed = seed;
        self
    }

    /// Client ops per second, across all clients.
    pub fn rate(mut self, rate: f64) -> ChaosTest {
        self.options.rate = rate;
        self
    }

    /// Mean time between faults (each lasts about as long).
    pub fn fault_interval(mut self, interval: Duration) -> ChaosTest {
        self.options.nemesis_interval = interval;
        self
    }

    /// Where run directories go (default: `store`).
    pub fn store(mut self, store: impl Into<PathBuf>) -> ChaosTest {
        self.options.store = store.into();
        self
    }

    /// The `haunt` executable that runs the reference pipeline's services and
    /// that `{haunt}` names in a system file.
    pub fn haunt_exe(mut self, exe: impl Into<PathBuf>) -> ChaosTest {
        self.options.exe = exe.into();
        self
    }

    /// The reference pipeline with a known mistake switched on.
    pub fn bug(mut self, bug: Bug) -> ChaosTest {
        self.options.bug = Some(bug);
        self
    }

    /// A system file's `[[variant]]` to run (`haunt run --variant`); its
    /// faults and targets are the run's unless the test names its own.
    pub fn variant(mut self, name: &str) -> ChaosTest {
        self.options.variant = Some(name.to_owned());
        self
    }

    /// Runs the reference pipeline's nodes, or a system file's `image` nodes,
    /// as containers the backend starts and removes (`--backend docker`).
    pub fn in_containers(mut self) -> ChaosTest {
        self.options.backend = crate::core::options::BackendKind::Docker;
        self
    }

    /// Strikes the fault windows of a run's `schedule.json` instead of the
    /// seeded schedule (`haunt run --schedule`): what a failed test's message
    /// names, to replay its faults window for window. The faults are the
    /// ones the file names; the seed still draws the workload.
    pub fn schedule(mut self, path: impl Into<PathBuf>) -> ChaosTest {
        self.schedule = Some(path.into());
        self
    }

    /// Every other option of a run, for what the builder does not name.
    pub fn options(mut self, edit: impl FnOnce(&mut RunOptions)) -> ChaosTest {
        edit(&mut self.options);
        self
    }

    /// Runs the test to its verdict, assembled as `haunt run` assembles a
    /// run (`crate::assemble`), and like it healed and stopped by Ctrl-C. An
    /// error is a run that could not be checked (a bad option, a node that
    /// never became ready, an interrupted run); a verdict that is not valid is
    /// an `Ok` outcome, for [`Outcome::assert_valid`].
    pub async fn run(self) -> anyhow::Result<Outcome> {
        let ChaosTest { target, mut options, mut faults, schedule } = self;
        if let Some(path) = schedule {
            let file = crate::core::nemesis::ScheduleFile::read(&path)?;
            faults = Some(file.faults());
            options.schedule = Some(file);
        }
        // A system given in code cannot be run again from the command line.
        let shrinkable = !matches!(target, Target::Given(..));
        let target = match target {
            Target::Pipeline => crate::assemble::Target::Pipeline,
            Target::File(path) => {
                let mut spec = crate::systems::system_file::spec::load(&path)?;
                spec.choose(options.variant.as_deref())?;
                options.system = Some(path);
                crate::assemble::Target::System(Box::new(spec))
            }
            Target::Text(text) => {
                let mut spec = crate::systems::system_file::spec::parse(Path::new("(system given in code)"), &text)?;
                spec.choose(options.variant.as_deref())?;
                spec.system_dir = std::env::current_dir()?;
                crate::assemble::Target::System(Box::new(spec))
            }
            Target::Given(name, system) => crate::assemble::Target::Given { name, system },
        };
        target.complete(&mut options, faults);
        let outcome = crate::assemble::run_interruptible(target, &options).await?;
        let results = outcome.results.ok_or_else(|| anyhow::anyhow!("the run was aborted"))?;
        Ok(Outcome { results, run_dir: outcome.run_dir, seed: options.seed, warnings: outcome.warnings, shrinkable })
    }
}

/// A finished test: its results and where its run directory is.
#[derive(Debug)]
pub struct Outcome {
    pub results: Results,
    pub run_dir: PathBuf,
    pub seed: u64,
    /// What the run did not test though it was asked to (faults that never
    /// fired, or fired without a redelivery), as `haunt run` prints them.
    pub warnings: Vec<String>,
    /// Whether `haunt shrink` can rerun it: not a system given in code.
    pub shrinkable: bool,
}

impl Outcome {
    pub fn report(&self) -> PathBuf {
        self.run_dir.join("report.html")
    }

    /// What a failed assertion says: the verdict, each anomaly with its
    /// examples, the seed, the run directory and its report.
    pub fn explain(&self) -> String {
        let mut text = haunt_checker::summary::render(&self.results);
        for warning in &self.warnings {
            text.push_str(warning);
            text.push('\n');
        }
        let schedule = self.run_dir.join(crate::core::nemesis::SCHEDULE_FILE);
        text.push_str(&format!(
            "\nseed: {} (replay with .seed({}))\nschedule: {} (replay its fault windows with .schedule({:?}))\n\
             run: {}\nreport: {}\n",
            self.seed,
            self.seed,
            schedule.display(),
            schedule.display().to_string(),
            self.run_dir.display(),
            self.report().display()
        ));
        if self.results.valid != Verdict::Valid {
            if self.shrinkable {
                text.push_str(&format!("shrink: haunt shrink {}\n", self.run_dir.display()));
            } else {
                text.push_str(
                    "shrink: a system given in code cannot be rerun by `haunt shrink`; \
                     replay the schedule with .schedule(…) and cut its windows by hand\n",
                );
            }
        }
        text
    }

    /// Panics unless the verdict is valid.
    #[track_caller]
    pub fn assert_valid(&self) {
        if self.results.valid != Verdict::Valid {
            panic!("haunt: the run is not valid\n\n{}", self.explain());
        }
    }

    /// Panics unless the checker reported `anomaly` (a test that a known
    /// mistake is caught).
    #[track_caller]
    pub fn assert_anomaly(&self, anomaly: &str) {
        let found = self.results.anomalies.get(anomaly).is_some_and(|a| a.count > 0);
        if !found {
            panic!("haunt: expected {anomaly}, which the run did not show\n\n{}", self.explain());
        }
    }

    /// The run directory, for a test that reads its files.
    pub fn dir(&self) -> &Path {
        &self.run_dir
    }
}
