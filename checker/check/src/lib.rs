//! The checker: a history and a final state in, [`Results`] out.
//!
//! It knows nothing of the services: it reads a run directory that follows
//! `RUN-FORMAT.md`, whoever wrote it, and decides from the client ops and the final
//! read whether an acknowledged order was lost, an event applied twice, or the
//! projection left wrong. Anomalies are data in the results, never an `Err`; an
//! `Err` means the input does not follow the format.
//!
//! # Layout
//!
//! - [`history`]: folds the ops into logical orders, latencies and fault windows,
//!   and enforces Jepsen's op rules.
//! - [`final_state`]: folds the final read into lookups.
//! - [`rules`]: the anomaly definitions and the verdict.
//! - [`results`]: the results as data (`results.json`).
//! - [`stats`]: quantiles.
//! - [`summary`]: the human summary printed by `haunt check`.

pub mod final_state;
pub mod history;
pub mod results;
pub mod rules;
pub mod stats;
pub mod summary;

use std::path::{Path, PathBuf};

use haunt_format::{FINAL_STATE_FILE, FormatError, HISTORY_FILE, JsonlReader};

pub use results::{ANOMALIES, AnomalyReport, Example, Results, Verdict};

/// Why a run directory could not be checked at all.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{}: no such run directory", .0.display())]
    MissingDir(PathBuf),
    #[error(transparent)]
    Format(#[from] FormatError),
}

impl InputError {
    /// The exit status of `haunt check` (sysexits: 65 data error, 66 no input).
    pub fn exit_code(&self) -> i32 {
        match self {
            InputError::MissingDir(_) => 66,
            InputError::Format(_) => 65,
        }
    }
}

/// Checks the run directory `dir`. Reads `history.jsonl` and, when present,
/// `final-state.jsonl`; writes nothing.
pub fn check_dir(dir: &Path) -> Result<Results, InputError> {
    if !dir.is_dir() {
        return Err(InputError::MissingDir(dir.to_owned()));
    }
    let history_path = dir.join(HISTORY_FILE);
    let history = history::fold(&history_path, JsonlReader::open(&history_path)?)?;
    let final_path = dir.join(FINAL_STATE_FILE);
    let final_state =
        if final_path.exists() { Some(final_state::fold(&final_path, JsonlReader::open(&final_path)?)?) } else { None };
    Ok(rules::check(&history, final_state.as_ref()))
}

/// Checks a history and a final state given as JSONL streams; the
/// files are named `history.jsonl` and `final-state.jsonl` in errors.
pub fn check_readers(
    history: impl std::io::BufRead,
    final_state: Option<impl std::io::BufRead>,
) -> Result<Results, FormatError> {
    let history_path = Path::new(HISTORY_FILE);
    let history = history::fold(history_path, JsonlReader::new(history, history_path))?;
    let final_path = Path::new(FINAL_STATE_FILE);
    let final_state = match final_state {
        Some(r) => Some(final_state::fold(final_path, JsonlReader::new(r, final_path))?),
        None => None,
    };
    Ok(rules::check(&history, final_state.as_ref()))
}
