//! An explicit schedule: the windows a run struck, written to its
//! `schedule.json`, and struck again as given by `haunt run --schedule`.
//!
//! A window is a fault on a target, from a start (milliseconds from the
//! schedule's start) for a hold, in a lane (`--faults-at-once`). Each lane's
//! windows are struck in order of start, each at its start or as soon as the
//! one before it has healed. The workload still follows the run's seed. An
//! aimed kill or pause is aimed again: a nemesis aims its shots in turn (the
//! first of each kind and every other after it), so the same windows of a
//! kind are aimed the same way; the record keeps each shot's `aim` as it
//! came.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::schedule::{Coverage, ScheduleOptions, Struck};
use crate::core::roles::Nemesis;

/// The name of the schedule in a run directory.
pub const SCHEDULE_FILE: &str = "schedule.json";

/// One window of a schedule, as struck.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlannedWindow {
    /// The schedule it ran in (0 unless faults overlap, `--faults-at-once`).
    #[serde(default)]
    pub lane: usize,
    /// As `--nemesis` names it.
    pub fault: String,
    pub target: String,
    /// From the schedule's start to the fault's start.
    pub start_ms: u64,
    /// From the fault's start to its stop.
    pub hold_ms: u64,
    /// The aimed shot's answer, as recorded (absent for a blind one). Read
    /// back for the record only: a replay aims as the nemesis does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aim: Option<serde_json::Value>,
}

/// `schedule.json`: its version and its windows in order of start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFile {
    pub version: u32,
    pub windows: Vec<PlannedWindow>,
}

impl ScheduleFile {
    pub const VERSION: u32 = 1;

    pub fn new(windows: Vec<PlannedWindow>) -> ScheduleFile {
        ScheduleFile { version: Self::VERSION, windows }
    }

    /// The faults its windows name, each once, in order of first use.
    pub fn faults(&self) -> Vec<crate::core::fault::Fault> {
        let mut out = Vec::new();
        for f in self.windows.iter().filter_map(|w| crate::core::fault::Fault::from_name(&w.fault)) {
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }

    /// Reads a schedule, naming the file and what is wrong with it.
    pub fn read(path: &std::path::Path) -> anyhow::Result<ScheduleFile> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
        let file: ScheduleFile = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: line {}: not a schedule: {e}", path.display(), e.line()))?;
        anyhow::ensure!(
            file.version == Self::VERSION,
            "{}: version {} (this haunt reads version {})",
            path.display(),
            file.version,
            Self::VERSION
        );
        for (i, w) in file.windows.iter().enumerate() {
            anyhow::ensure!(
                crate::core::fault::Fault::from_name(&w.fault).is_some(),
                "{}: windows[{i}].fault {:?} is not a fault (haunt run --help lists them)",
                path.display(),
                w.fault
            );
            anyhow::ensure!(!w.target.is_empty(), "{}: windows[{i}].target is empty", path.display());
        }
        Ok(file)
    }
}

/// Checks, before a run starts, that each window names a fault the run
/// enables and a target that fault can hit.
pub fn check(windows: &[PlannedWindow], nemeses: &[Box<dyn Nemesis>]) -> anyhow::Result<()> {
    for (i, w) in windows.iter().enumerate() {
        let nemesis = nemeses
            .iter()
            .find(|n| n.name() == w.fault)
            .ok_or_else(|| anyhow::anyhow!("--schedule: windows[{i}].fault {}: not a fault of this run", w.fault))?;
        let targets = nemesis.targets();
        anyhow::ensure!(
            targets.contains(&w.target),
            "--schedule: windows[{i}].target {}: {} cannot hit it here (it can hit {})",
            w.target,
            w.fault,
            targets.join(", ")
        );
    }
    Ok(())
}

/// Strikes `script`'s windows, each lane in order of start.
pub(super) async fn replay(
    nemeses: &[Box<dyn Nemesis>],
    script: &[PlannedWindow],
    struck: &Struck<'_>,
    options: &ScheduleOptions,
) -> Coverage {
    let mut lanes: BTreeMap<usize, Vec<&PlannedWindow>> = BTreeMap::new();
    for w in script {
        lanes.entry(w.lane).or_default().push(w);
    }
    let runs = lanes.into_values().map(|mut windows| async move {
        windows.sort_by_key(|w| w.start_ms);
        let mut fired = vec![0u32; nemeses.len()];
        for w in windows {
            let Some(i) = nemeses.iter().position(|n| n.name() == w.fault) else {
                tracing::warn!(fault = %w.fault, "a scheduled fault this run does not enable; skipped");
                continue;
            };
            // Nothing starts after the run's time limit, as in a seeded schedule.
            let at = struck.started + Duration::from_millis(w.start_ms);
            if at >= options.deadline || !super::schedule::sleep_until(at, struck.stop).await {
                break;
            }
            let hold = Duration::from_millis(w.hold_ms);
            let (started, healed) =
                struck.strike(nemeses[i].as_ref(), &w.target, hold, w.lane, options.context.as_ref()).await;
            fired[i] += u32::from(started);
            if !healed {
                break;
            }
        }
        fired
    });
    let mut fired = vec![0u32; nemeses.len()];
    for lane in futures_util::future::join_all(runs).await {
        for (total, n) in fired.iter_mut().zip(lane) {
            *total += n;
        }
    }
    struck.coverage(nemeses, fired)
}
