//! The run directory: its place in the store, `run.json`, and the JSON files
//! the harness writes beside the history.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::core::options::RunOptions;

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
    /// What the transport promises about the order of a key's events:
    /// `none`, or `per-key` (publish order within a key). Data for the
    /// checker, which knows no transport.
    pub order_claim: &'static str,
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
///
/// Two runs that start in the same second (two tests of one `cargo test`
/// process, say) get two directories: each is claimed by `create_dir`, which
/// fails for all but one claimant, never by a check that it does not exist
/// yet (two runs once passed that check together and wrote one history).
pub fn create_run_dir(store: &Path, name: &str, started_at_ms: i64) -> anyhow::Result<PathBuf> {
    let parent = store.join(name);
    std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let stamp = timestamp(started_at_ms);
    let mut dir = parent.join(&stamp);
    let mut n = 1;
    loop {
        match std::fs::create_dir(&dir) {
            Ok(()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                n += 1;
                dir = parent.join(format!("{stamp}-{n}"));
            }
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    std::fs::create_dir(dir.join("logs")).with_context(|| format!("creating {}", dir.display()))?;
    point_latest_at(store, &dir)?;
    Ok(dir)
}

/// `store/latest` → `dir`, replaced in one step (a link made under a name of
/// its own, then renamed over the old one), so that runs starting together
/// never find the name taken between a removal and a creation.
fn point_latest_at(store: &Path, dir: &Path) -> anyhow::Result<()> {
    static LINKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = LINKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let latest = store.join("latest");
    let staged = store.join(format!(".latest.{}.{n}", std::process::id()));
    let _ = std::fs::remove_file(&staged);
    let relative = dir.strip_prefix(store).unwrap_or(dir);
    std::os::unix::fs::symlink(relative, &staged).with_context(|| format!("linking {}", staged.display()))?;
    std::fs::rename(&staged, &latest).with_context(|| format!("linking {}", latest.display()))
}

pub fn write_json(path: &Path, value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, format!("{text}\n")).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::{create_run_dir, timestamp};

    #[test]
    fn runs_that_start_in_the_same_millisecond_get_a_directory_each() {
        let store = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let store = store.path().to_owned();
                std::thread::spawn(move || {
                    (0..10).map(|_| create_run_dir(&store, "shop", 1_795_964_645_123).unwrap()).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut dirs: Vec<_> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        dirs.sort();
        dirs.dedup();
        assert_eq!(dirs.len(), 80, "one directory per run");
        assert!(dirs.iter().all(|d| d.join("logs").is_dir()));
        let latest = std::fs::read_link(store.path().join("latest")).unwrap();
        assert!(dirs.contains(&store.path().join(latest)), "latest points at one of the runs");
        let left: Vec<_> = std::fs::read_dir(store.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".latest"))
            .collect();
        assert!(left.is_empty(), "staged links left behind: {left:?}");
    }

    #[test]
    fn timestamps_are_utc_civil_time() {
        assert_eq!(timestamp(0), "19700101T000000Z");
        assert_eq!(timestamp(1_795_964_645_123), "20261129T150405Z");
        assert_eq!(timestamp(951_782_400_000), "20000229T000000Z");
    }
}
