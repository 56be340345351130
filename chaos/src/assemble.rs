//! One way to assemble a run, whoever asks for it: `haunt run` (the
//! reference pipeline, or `--system FILE`), `ChaosTest`, and through their
//! child runs the matrix and the guarantees table. It is the one place that
//! knows the systems by name: it loads what the options name once
//! ([`Target::of`]), checks the options against it before anything is
//! created ([`Target::check`]), lays the system out, builds its roles and
//! its run directory ([`assemble`]), and hands them to the run's phases
//! (`crate::core::run::execute`), which know no system.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use futures_util::future::BoxFuture;

use crate::core::fault::Fault;
use crate::core::options::{BackendKind, RunOptions};
use crate::core::run::{Roles, RunOutcome, execute};
use crate::core::rundir::{create_run_dir, now_ms};
use crate::core::system::System;
use crate::systems::pipeline::Pipeline;
use crate::systems::system_file::spec::SystemSpec;
use crate::systems::system_file::{self, Foreign};

/// The system a run drives, loaded once.
#[derive(Debug)]
pub enum Target {
    /// The reference pipeline, laid out from the options.
    Pipeline,
    /// A system described by a file (`--system`), or by text in a test.
    System(Box<SystemSpec>),
    /// A system a test built in code (`ChaosTest::system`), under a name for
    /// its run directory.
    Given { name: String, system: Arc<dyn System> },
}

impl Target {
    /// What the options name: the system file of `--system`, read and parsed
    /// here once, or the reference pipeline.
    pub fn of(options: &RunOptions) -> anyhow::Result<Target> {
        Ok(match &options.system {
            Some(path) => {
                let mut spec = system_file::spec::load(path)?;
                spec.choose(options.variant.as_deref())?;
                Target::System(Box::new(spec))
            }
            None => Target::Pipeline,
        })
    }

    /// What `--nemesis all` means: what the pipeline's layout can take, or
    /// what the system file's nodes and links allow.
    pub fn all_faults(&self, options: &RunOptions) -> Vec<Fault> {
        match self {
            Target::Pipeline => options.pipeline_faults(),
            Target::System(spec) => system_file::faults_allowed(spec),
            // What it can take is what its surfaces hold: a fault they lack
            // is refused, naming what it needs, when its nemesis is built.
            Target::Given { .. } => Fault::ALL.to_vec(),
        }
    }

    /// The faults of a run that names none: the pipeline's defaults, the
    /// faults a system file's variant names, or everything the file allows.
    pub fn default_faults(&self, options: &RunOptions) -> Vec<Fault> {
        match self {
            Target::Pipeline => options.pipeline_default_faults(),
            Target::System(spec) => {
                let allowed = system_file::faults_allowed(spec);
                // Checked when the file was read.
                let named = spec.variant.as_ref().and_then(|v| v.nemesis.as_deref());
                named.and_then(|n| Fault::parse_list(n, &allowed).ok()).unwrap_or(allowed)
            }
            Target::Given { .. } => options.faults.clone(),
        }
    }

    /// Completes `options` for this system: a system file whose nodes name
    /// running containers is a Docker run, a run that names no faults
    /// (`faults` is `None`) gets this system's defaults, and one that names
    /// no targets gets its variant's.
    pub fn complete(&self, options: &mut RunOptions, faults: Option<Vec<Fault>>) {
        if let Target::System(spec) = self {
            if spec.nodes.iter().any(|n| n.container.is_some()) {
                options.backend = BackendKind::Docker;
            }
            if let Some(v) = spec.variant.as_ref().filter(|_| options.fault_targets.is_empty()) {
                options.fault_targets.clone_from(&v.fault_targets);
            }
        }
        options.faults = faults.unwrap_or_else(|| self.default_faults(options));
    }

    /// Every check of the options against this system, before anything is
    /// created: each error names the flag (or the file and its node).
    pub fn check(&self, options: &RunOptions) -> anyhow::Result<()> {
        options.validate()?;
        if let Target::System(spec) = self {
            system_file::check_options(spec, options)?;
        }
        Ok(())
    }
}

/// A run laid out and not yet started: its roles, its run directory (which
/// exists) and when it began.
#[derive(Debug)]
pub struct Assembled {
    pub roles: Roles,
    pub run_dir: PathBuf,
    pub started_at_ms: i64,
}

/// Lays `target` out for `options` (already checked by [`Target::check`]):
/// the system, a nemesis for each of the run's faults over what it exposes,
/// the checker, and a run directory named after the run.
pub async fn assemble(target: Target, options: &RunOptions) -> anyhow::Result<Assembled> {
    let started_at_ms = now_ms();
    match target {
        Target::Pipeline => {
            // Before the run directory: a refused layout leaves nothing behind.
            let prepared = Pipeline::prepare(options).await?;
            let mut name = format!("{}-{}", options.backend.name(), options.db_kind().name());
            if options.transport.is_broker() {
                // `rabbitmq:auto-ack` as `rabbitmq-auto-ack`: a path without a colon.
                name = format!("{name}-{}", options.transport.to_string().replace(':', "-"));
            }
            if let Some(bug) = options.bug {
                name = format!("{name}-{}", bug.name());
            }
            let run_dir = create_run_dir(&options.store, &name, started_at_ms)?;
            let system = Arc::new(Pipeline::create(options, prepared, &run_dir).await?);
            Ok(Assembled { roles: Roles::for_system(system, options)?, run_dir, started_at_ms })
        }
        Target::System(spec) => {
            let mut name = format!("{}-{}", options.backend.name(), spec.name);
            if let Some(variant) = &spec.variant {
                name = format!("{name}-{}", variant.name);
            }
            let run_dir = create_run_dir(&options.store, &name, started_at_ms)?;
            let docker = (options.backend == BackendKind::Docker).then_some(&options.docker);
            let system = Foreign::create(*spec, &run_dir, &options.exe, options.request_timeout, docker).await?;
            Ok(Assembled { roles: Roles::for_system(Arc::new(system), options)?, run_dir, started_at_ms })
        }
        Target::Given { name, system } => {
            let run_dir = create_run_dir(&options.store, &name, started_at_ms)?;
            Ok(Assembled { roles: Roles::for_system(system, options)?, run_dir, started_at_ms })
        }
    }
}

/// Runs one test of `target`, start to verdict. `abort` (Ctrl-C) stops it
/// early: faults are healed, processes stopped, and the run directory marked
/// aborted.
pub async fn run_target(target: Target, options: &RunOptions, abort: &Arc<AtomicBool>) -> anyhow::Result<RunOutcome> {
    // Before anything exists: a refused run leaves nothing behind.
    target.check(options)?;
    let Assembled { roles, run_dir, started_at_ms } = assemble(target, options).await?;
    execute(options, roles, run_dir, started_at_ms, abort).await
}

/// Runs one test of `target` as [`run_target`] does, stopped early by
/// SIGINT or SIGTERM as every run in this process is (`crate::interrupt`).
///
/// The future is boxed here, in this crate: an `async fn`'s body is compiled
/// again in every crate that awaits it (release builds share no generic
/// code between crates), and the `haunt` binary awaited the whole harness
/// (docs/performance.md, the first verdict). The other entry points the
/// binary awaits are boxed for the same reason.
pub fn run_interruptible(target: Target, options: &RunOptions) -> BoxFuture<'_, anyhow::Result<RunOutcome>> {
    Box::pin(async move {
        let guard = crate::interrupt::Guard::new();
        run_target(target, options, guard.flag()).await
    })
}
