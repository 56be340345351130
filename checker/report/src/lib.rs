//! `report.html` for a checked run directory: one self-contained file (no
//! network, no scripts) rendered from the checker's [`Results`] alone, plus
//! what `run.json` says when there is one (the subtitle, the enabled faults
//! and how often each fired). It never reads the history or the final state:
//! the plots draw the bounded series the checker gathered in its one pass
//! (`Results::series`), so the report and the verdict rest on one parser.
//!
//! Plots are drawn by plotters into inline SVG; text is left to the browser
//! (see [`plots`]).
//!
//! # Layout
//!
//! - [`run_info`]: what the report reads from `run.json`, every field optional.
//! - [`plots`]: the SVG plots (time plots with the fault windows, histograms).
//! - [`page`]: the HTML page, its tables and notes.

mod order;
pub mod page;
pub mod plots;
pub mod run_info;

use std::path::{Path, PathBuf};

use anyhow::Context;
use haunt_checker::Results;

pub use run_info::RunInfo;

/// The report's file name in a run directory.
pub const REPORT_FILE: &str = "report.html";

/// Writes `report.html` into `run_dir` from `results` and the directory's
/// `run.json` (if any); returns its path.
pub fn write(run_dir: &Path, results: &Results) -> anyhow::Result<PathBuf> {
    let path = run_dir.join(REPORT_FILE);
    std::fs::write(&path, render(results, &RunInfo::read(run_dir)))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// The page for `results` and what `run` says of the run.
pub fn render(results: &Results, run: &RunInfo) -> String {
    page::render(results, run)
}
