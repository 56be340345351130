//! The checker: a history and a final state in, [`Results`] out.
//!
//! It knows nothing of the services: it reads a run directory that follows
//! `docs/run-format.md`, whoever wrote it, and decides from the client ops and the final
//! read whether an acknowledged order was lost, an event applied twice, or the
//! projection left wrong. Anomalies are data in the results, never an `Err`; an
//! `Err` means the input does not follow the format.
//!
//! # Layout
//!
//! - [`fold`]: streams both files into one compact table of orders, enforcing
//!   Jepsen's op rules on the way, with latencies and fault windows.
//! - [`index`]: the orders by id, in a table whose slots the fold fetches
//!   a few lines before it looks them up.
//! - [`rules`]: the anomaly definitions and the verdict.
//! - [`order`]: per key, the orders fixed in real time that took effect out
//!   of that order (inversions) or never (skipped).
//! - [`results`]: the results as data (`results.json`).
//! - [`series`]: the bounded time series of ops and applications the report
//!   plots, gathered in the same pass.
//! - [`stats`], the quantiles by nearest rank.
//! - [`summary`]: the human summary printed by `haunt check`.
//! - [`windows`]: events and ops attributed to the fault windows they overlap.

pub mod fold;
pub mod index;
pub mod key;
pub mod order;
pub mod orders;
pub mod results;
pub mod rules;
pub mod series;
pub mod stats;
pub mod summary;
pub mod windows;

use std::path::{Path, PathBuf};

use haunt_format::chunks::{Chunks, ParseAhead, Splitter};
use haunt_format::fast::{FinalSpans, OrderOpSpans};
use haunt_format::{FINAL_STATE_FILE, FormatError, HISTORY_FILE, RUN_FILE};

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
/// `final-state.jsonl` and `run.json`'s `order_claim`; writes nothing.
pub fn check_dir(dir: &Path) -> Result<Results, InputError> {
    check_dir_claiming(dir, None)
}

/// [`check_dir`], with the run's claim of order given (`haunt check
/// --claim-order`) instead of read from `run.json`.
pub fn check_dir_claiming(dir: &Path, claim: Option<order::Claim>) -> Result<Results, InputError> {
    if !dir.is_dir() {
        return Err(InputError::MissingDir(dir.to_owned()));
    }
    let claim = match claim {
        Some(claim) => claim,
        None => claim_in_run_file(&dir.join(RUN_FILE))?,
    };
    let mut fold = fold::Fold::default();
    let history_path = dir.join(HISTORY_FILE);
    // About two ops of ~150 bytes per order; capped, so that a strange file
    // cannot make the checker reserve absurd amounts.
    const BYTES_PER_ORDER: u64 = 300;
    const RESERVE_ORDERS_MAX: u64 = 50_000_000;
    if let Ok(meta) = std::fs::metadata(&history_path) {
        fold.reserve((meta.len() / BYTES_PER_ORDER).min(RESERVE_ORDERS_MAX) as usize);
    }
    fold::fold_history(&mut fold, &history_path, parse_ahead(&history_path, OrderOpSpans::read)?)?;
    let final_path = dir.join(FINAL_STATE_FILE);
    if final_path.exists() {
        fold::fold_final(&mut fold, &final_path, parse_ahead(&final_path, FinalSpans::read)?)?;
    }
    Ok(rules::check(&mut fold, claim))
}

/// `path`'s lines, read and parsed by a thread of their own ahead of the fold.
fn parse_ahead<P: Send + 'static>(
    path: &Path,
    parse: fn(&str) -> Option<P>,
) -> Result<Chunks<std::io::Empty, P>, FormatError> {
    let ahead = ParseAhead::open(path, parse).map_err(|source| FormatError::Io { file: path.to_owned(), source })?;
    Ok(Chunks::Ahead(ahead))
}

/// `run.json`'s `order_claim`: none when the file or the field is absent (a
/// run of a haunt before claims, or of another tool), an error naming the
/// file when it is there and unreadable or the claim unknown.
fn claim_in_run_file(path: &Path) -> Result<order::Claim, FormatError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(order::Claim::None),
        Err(e) => return Err(FormatError::line(path, 1, format!("reading it: {e}"))),
    };
    let run: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| FormatError::line(path, e.line() as u64, e.to_string()))?;
    match run.get("order_claim") {
        None | Some(serde_json::Value::Null) => Ok(order::Claim::None),
        Some(serde_json::Value::String(s)) => {
            s.parse().map_err(|e| FormatError::line(path, 1, format!("order_claim: {e}")))
        }
        Some(other) => Err(FormatError::line(path, 1, format!("order_claim: {other} is not a string"))),
    }
}

/// Checks a history and a final state given as JSONL streams; the files are
/// named `history.jsonl` and `final-state.jsonl` in errors.
pub fn check_readers(
    history: impl std::io::BufRead,
    final_state: Option<impl std::io::BufRead>,
) -> Result<Results, FormatError> {
    let mut fold = fold::Fold::default();
    let history_path = Path::new(HISTORY_FILE);
    fold::fold_history(&mut fold, history_path, Chunks::Inline(Splitter::new(history, OrderOpSpans::read), None))?;
    if let Some(r) = final_state {
        let final_path = Path::new(FINAL_STATE_FILE);
        fold::fold_final(&mut fold, final_path, Chunks::Inline(Splitter::new(r, FinalSpans::read), None))?;
    }
    Ok(rules::check(&mut fold, order::Claim::None))
}
