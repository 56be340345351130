//! One run, start to verdict, as a sequence of phases: **start** the system's
//! nodes, **drive** the workload while the nemeses break things, **heal**,
//! **quiesce** (wait until nothing is left to deliver), **read** the final
//! state, **check**, **report**.
//!
//! A run is assembled from roles ([`Roles`]): the system under test, its
//! client, the nemeses and the checker, each a trait object, so a test can
//! swap any of them ([`execute`]); the `assemble` module builds them for a
//! system and hands them here.
//! Nothing here knows how a system is laid out (`crate::systems::pipeline`), how a fault
//! is built (`crate::core::fault`) or what the options allow (`crate::core::options`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use haunt_checker::{Results, Verdict};
use haunt_format::{FINAL_STATE_FILE, FinalLine, HISTORY_FILE, JsonlWriter, Meta, RESULTS_FILE, RUN_FILE};
use haunt_telemetry::metrics::{AnomalyLabels, HarnessMetrics};
use tokio::time::Instant;

use crate::core::history::Recorder;
use crate::core::nemesis::{ActiveFaults, Coverage, Faults, ScheduleOptions};
pub use crate::core::options::{BackendKind, DockerOptions, RunOptions};
use crate::core::progress::say;
use crate::core::roles::{Checker, Client, Role, RunDirChecker};
use crate::core::rundir::{RunFile, now_ms, write_json};
use crate::core::seed::RunSeed;
use crate::core::system::System;
use crate::core::workload::WorkloadOptions;

/// How a run ended.
#[derive(Debug)]
pub struct RunOutcome {
    pub run_dir: PathBuf,
    /// `None` when the run was aborted before it could be checked.
    pub results: Option<Results>,
    pub aborted: bool,
    /// Enabled faults that never started (empty for a run that did not finish).
    pub faults_never_fired: Vec<String>,
    /// What the run did not test though it was asked to, one sentence each
    /// (`warnings`), for every caller to print.
    pub warnings: Vec<String>,
}

/// What a finished run did not test though it was asked to: enabled faults
/// that never fired, and faults that fired without one redelivery (so the
/// inbox was never put to work).
pub fn warnings(enabled: usize, never_fired: &[String], delivery: &haunt_checker::results::Delivery) -> Vec<String> {
    let mut warnings = Vec::new();
    if !never_fired.is_empty() {
        warnings.push(format!(
            "warning: enabled faults that never fired, so this run did not test them: {}",
            never_fired.join(", ")
        ));
    }
    let fired = enabled > never_fired.len();
    // A duplicate the inbox absorbed was a redelivery, counted or not (Kafka
    // counts no deliveries: a partition's next owner delivers a 1 again).
    let absorbed = delivery.duplicates_absorbed.unwrap_or(0);
    if fired && delivery.redeliveries == Some(0) && absorbed == 0 {
        warnings.push(
            "warning: the faults fired but caused no redelivery, so this run did not test the inbox \
             (another --seed, a longer --time-limit-s or --nemesis ack-loss will)"
                .to_owned(),
        );
    }
    warnings
}

/// What a run is assembled from.
pub struct Roles {
    pub system: Arc<dyn System>,
    /// Places the workload's orders (the system's own client, by default).
    pub client: Arc<dyn Client>,
    /// Owns the faults: dropped, on any path out of the run, it heals them.
    pub nemeses: Faults,
    pub checker: Box<dyn Checker>,
}

impl Roles {
    /// The system's own client, a nemesis for each of the run's faults over
    /// what the system exposes, and the checker of the run directory.
    pub fn for_system(system: Arc<dyn System>, options: &RunOptions) -> anyhow::Result<Roles> {
        let settings = options.fault_settings();
        let nemeses = Faults::new(crate::core::nemesis::build_all(&options.faults, system.surfaces(), &settings)?);
        if let Some(schedule) = &options.schedule {
            crate::core::nemesis::script::check(&schedule.windows, &nemeses)?;
        }
        Ok(Roles { client: system.client(), system, nemeses, checker: Box::new(RunDirChecker) })
    }
}

impl std::fmt::Debug for Roles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Roles").field("system", &self.system).field("nemeses", &self.nemeses).finish_non_exhaustive()
    }
}

/// The phases of a run over any roles, in `run_dir` (which exists).
pub async fn execute(
    options: &RunOptions,
    roles: Roles,
    run_dir: PathBuf,
    started_at_ms: i64,
    abort: &Arc<AtomicBool>,
) -> anyhow::Result<RunOutcome> {
    let Roles { system, client, nemeses, checker } = roles;
    let mut run_file = RunFile {
        haunt_version: env!("CARGO_PKG_VERSION"),
        git_revision: options.git_revision.clone(),
        seed: options.seed,
        backend: options.backend.name(),
        db: system.database(),
        transport: options.transport.to_string(),
        order_claim: options.transport.order_claim().name(),
        options: options.clone(),
        started_at_ms,
        ended_at_ms: None,
        aborted: false,
        error: None,
        verdict: None,
        faults_fired: None,
        faults_never_fired: None,
    };
    write_json(&run_dir.join(RUN_FILE), &run_file)?;
    say(
        options.quiet,
        &format!("run {} (seed {}, revision {})", run_dir.display(), options.seed, options.git_revision),
    );
    let metrics = Arc::new(HarnessMetrics::default());
    let _metrics_server = match options.metrics_listen {
        Some(addr) => Some(crate::core::progress::serve_metrics(addr, metrics.clone()).await?),
        None => None,
    };

    let driven = drive(options, system.as_ref(), client, &nemeses, &run_dir, abort, &metrics).await;
    // Whatever happened above, every fault is healed and no service is left
    // running; the database and the broker stay up for the final state.
    drop(nemeses);
    let backend = system.surfaces().backend.clone();
    for node in backend.nodes().into_iter().filter(|n| !matches!(n.role, Role::Database | Role::Broker)) {
        if let Err(e) = backend.stop(&node).await {
            tracing::warn!(node = %node.name, error = ?e, "stopping");
        }
    }
    if let Ok(driven) = &driven {
        // What was struck, to replay (`haunt run --schedule`), also for a run cut short.
        let schedule = crate::core::nemesis::ScheduleFile::new(driven.coverage.windows.clone());
        write_json(&run_dir.join(crate::core::nemesis::SCHEDULE_FILE), &schedule)?;
    }
    let aborted = abort.load(Ordering::Relaxed);
    run_file.aborted = aborted;
    let driven = match driven {
        Ok(driven) if !aborted => driven,
        outcome => {
            system.close().await;
            backend.teardown(&run_dir.join("logs"));
            run_file.ended_at_ms = Some(now_ms());
            if let Err(e) = &outcome {
                run_file.error = Some(format!("{e:#}"));
            }
            write_json(&run_dir.join(RUN_FILE), &run_file)?;
            outcome?;
            return Ok(RunOutcome {
                run_dir,
                results: None,
                aborted,
                faults_never_fired: Vec::new(),
                warnings: Vec::new(),
            });
        }
    };
    run_file.faults_fired = Some(driven.coverage.counts());
    let never_fired = driven.coverage.never_fired();
    run_file.faults_never_fired = Some(never_fired.clone());

    // Read, check, report.
    let read = read_final_state(system.as_ref(), &run_dir, driven.quiet, &driven.recorder).await;
    system.close().await;
    backend.teardown(&run_dir.join("logs"));
    read?;
    let results = checker.check(&run_dir).map_err(|e| anyhow::anyhow!("checking the run: {e}"))?;
    write_json(&run_dir.join(RESULTS_FILE), &results)?;
    run_file.verdict = Some(results.valid.as_str());
    run_file.ended_at_ms = Some(now_ms());
    write_json(&run_dir.join(RUN_FILE), &run_file)?;
    // From the results and run.json, as `haunt check` writes it for any run.
    haunt_report::write(&run_dir, &results)?;
    publish_verdict(&metrics, &results);
    if options.metrics_listen.is_some() && !options.metrics_linger.is_zero() {
        tokio::time::sleep(options.metrics_linger).await;
    }
    let warnings = warnings(options.faults.len(), &never_fired, &results.delivery);
    Ok(RunOutcome { run_dir, results: Some(results), aborted, faults_never_fired: never_fired, warnings })
}

/// What [`drive`] leaves for the rest of the run.
struct Driven {
    /// Whether the system was quiet when its final state was read.
    quiet: bool,
    recorder: Arc<Recorder>,
    coverage: Coverage,
}

/// Start, drive, heal, quiesce.
async fn drive(
    options: &RunOptions,
    system: &dyn System,
    client: Arc<dyn Client>,
    nemeses: &Faults,
    run_dir: &Path,
    abort: &Arc<AtomicBool>,
    metrics: &Arc<HarnessMetrics>,
) -> anyhow::Result<Driven> {
    let backend = system.surfaces().backend.clone();
    for node in backend.nodes() {
        backend.start(&node).await?;
    }
    system.ready().await?;
    if let Some(path) = &options.prometheus_sd {
        let (backend, harness) = (options.backend.name(), options.metrics_listen);
        crate::core::progress::write_scrape_targets(path, backend, &system.metrics(), harness, run_dir)?;
    }

    let recorder = Arc::new(Recorder::create(&run_dir.join(HISTORY_FILE))?);
    let active = Arc::new(ActiveFaults::with_metrics(metrics.clone()));
    let deadline = Instant::now() + options.time_limit;
    let workload = WorkloadOptions {
        concurrency: options.concurrency,
        rate: options.rate,
        items: options.items,
        ordered_keys: options.ordered_keys,
        retries_max: 3,
        seed: options.seed,
        deadline,
        metrics: Some(metrics.clone()),
    };
    let workload = tokio::spawn(crate::core::workload::run(client, recorder.clone(), workload, abort.clone()));
    let progress = (!options.quiet).then(|| {
        let (recorder, active, endpoints) = (recorder.clone(), active.clone(), system.metrics());
        tokio::spawn(crate::core::progress::progress(recorder, active, endpoints, deadline, abort.clone()))
    });
    let schedule = ScheduleOptions {
        interval: options.nemesis_interval,
        seed: RunSeed(options.seed).schedule(),
        deadline,
        context: system.fault_context(),
        script: options.schedule.as_ref().map(|s| Arc::new(s.windows.clone())),
    };
    let coverage =
        crate::core::nemesis::run_schedule(nemeses, &recorder, &active, schedule, options.faults_at_once, abort).await;
    let workload = workload.await;

    let retry_for = crate::core::nemesis::stop_retry_for(nemeses, options.nemesis_interval);
    let heal = crate::core::nemesis::heal_all(nemeses, &recorder, &active, retry_for).await;
    if let Some(progress) = progress {
        progress.abort();
    }
    workload.context("the workload panicked")?;
    heal?;
    // A node can also die on its own (a bug mode may crash it): the system
    // only quiesces if every node runs.
    for node in backend.nodes() {
        if !backend.is_running(&node) {
            say(options.quiet, &format!("{} was not running after heal; starting it", node.name));
            backend.start(&node).await?;
        }
    }
    if abort.load(Ordering::Relaxed) {
        return Ok(Driven { quiet: false, recorder, coverage });
    }

    say(options.quiet, "healed; waiting for the queue to drain");
    let quiesce_by = Instant::now() + options.quiesce_timeout;
    let quiet = loop {
        match system.is_quiet().await {
            Ok(true) => break true,
            _ if Instant::now() >= quiesce_by || abort.load(Ordering::Relaxed) => break false,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    if !quiet {
        say(options.quiet, &format!("the queue did not drain within {:?}", options.quiesce_timeout));
    }
    Ok(Driven { quiet, recorder, coverage })
}

/// Closes the history and writes the final state, its `meta` line last.
async fn read_final_state(system: &dyn System, run_dir: &Path, quiet: bool, recorder: &Recorder) -> anyhow::Result<()> {
    recorder.finish().context("writing the history")?;
    let path = run_dir.join(FINAL_STATE_FILE);
    let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut writer = JsonlWriter::new(std::io::BufWriter::new(file));
    system.read_final_state(&mut |line| writer.write(&line)).await?;
    let unlisted = system.unlisted().await?;
    let meta = Meta {
        quiesced: quiet,
        read_at_ns: recorder.elapsed_ns(),
        run_started_at_ms: recorder.started_at_ms(),
        ledger: (!system.has_ledger()).then_some(false),
        unlisted: (unlisted > 0).then_some(unlisted),
    };
    writer.write(&FinalLine::Meta(meta))?;
    writer.flush()?;
    Ok(())
}

/// The verdict on the harness's metrics, for a last scrape.
fn publish_verdict(metrics: &HarnessMetrics, results: &Results) {
    metrics.check_valid.set(match results.valid {
        Verdict::Valid => 1,
        Verdict::Invalid => 0,
        Verdict::Unknown => -1,
    });
    for (anomaly, report) in &results.anomalies {
        let labels = AnomalyLabels { anomaly: anomaly.clone() };
        metrics.check_anomalies.get_or_create(&labels).set(report.count as i64);
    }
}

#[cfg(test)]
mod tests {
    use haunt_checker::results::Delivery;

    use super::warnings;

    #[test]
    fn faults_without_a_redelivery_are_reported_but_an_absorbed_duplicate_is_one() {
        let none = Delivery { redeliveries: Some(0), duplicates_absorbed: Some(0), ..Delivery::default() };
        let said = warnings(2, &[], &none);
        assert!(said.iter().any(|w| w.contains("caused no redelivery")), "{said:?}");
        // A partition's next owner on Kafka counts its delivery 1: the
        // duplicate the inbox refused is the redelivery.
        let uncounted = Delivery { duplicates_absorbed: Some(1), ..none.clone() };
        assert!(warnings(2, &[], &uncounted).is_empty());
        assert!(warnings(0, &[], &none).is_empty(), "no fault enabled, nothing to warn of");
    }
}
