//! The run directory: its place in the store, `run.json`, and the JSON files
//! the harness writes beside the history.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::options::RunOptions;

/// `run.json`: what ran, how, and how it ended (see docs/run-format.md).
#[derive(Debug, Serialize)]
pub struct RunFile {
    pub haunt_version: &'static str,
    pub git_revision: String,
    pub seed: u64,
    pub backend: &'static str,
    pub db: String,
    /// Where messages travelled: `db` (the database queue) or a broker
    /// transport as `--transport` spells it.
    pub transport: String,
    pub options: RunOptions,
    pub started_at_ms: i64,
    pub ended_at_ms: Option<i64>,
    pub aborted: bool,
    /// Why the run stopped early, if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub verdict: Option<&'static str>,
    /// How often each enabled fault (`options.nemesis`) started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults_fired: Option<std::collections::BTreeMap<String, u32>>,
    /// The enabled faults that never started: the run did not test them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub faults_never_fired: Option<Vec<String>>,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// `20261129T150405Z` from Unix milliseconds (UTC).
pub fn timestamp(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Creates `store/<name>/<timestamp>/` and points `store/latest` at it.
pub fn create_run_dir(store: &Path, name: &str, started_at_ms: i64) -> anyhow::Result<PathBuf> {
    let mut dir = store.join(name).join(timestamp(started_at_ms));
    let mut n = 1;
    while dir.exists() {
        n += 1;
        dir = store.join(name).join(format!("{}-{n}", timestamp(started_at_ms)));
    }
    std::fs::create_dir_all(dir.join("logs")).with_context(|| format!("creating {}", dir.display()))?;
    let latest = store.join("latest");
    let _ = std::fs::remove_file(&latest);
    let relative = dir.strip_prefix(store).unwrap_or(&dir);
    std::os::unix::fs::symlink(relative, &latest).with_context(|| format!("linking {}", latest.display()))?;
    Ok(dir)
}

pub fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, format!("{text}\n")).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::timestamp;

    #[test]
    fn timestamps_are_utc_civil_time() {
        assert_eq!(timestamp(0), "19700101T000000Z");
        assert_eq!(timestamp(1_795_964_645_123), "20261129T150405Z");
        assert_eq!(timestamp(951_782_400_000), "20000229T000000Z");
    }
}
