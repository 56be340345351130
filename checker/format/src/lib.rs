//! The run directory: the contract between the harness, which writes one, and the
//! checker, which reads one. Other tools and people write run directories too, so
//! this crate follows the contract of `docs/run-format.md` to the letter, and
//! depends on serde (and memchr, to find line ends) alone.
//!
//! Reading is streaming (a history can hold tens of millions of ops) and every
//! line that does not follow the format is reported with its file and line number.
//!
//! # Layout
//!
//! - [`history`]: the ops of `history.jsonl` (client ops and nemesis ops).
//! - [`faults`]: how nemesis ops open and close fault windows.
//! - [`final_state`]: the lines of `final-state.jsonl`.
//! - [`jsonl`]: the streaming reader and the writer, and [`FormatError`].
//! - [`fast`]: a fast path for the common lines, with serde behind it.
//! - [`chunks`]: a file's lines in chunks, split, checked and read through
//!   the fast path by a thread of their own, ahead of the fold.

pub mod chunks;
pub mod fast;
pub mod faults;
pub mod final_state;
pub mod history;
pub mod jsonl;

pub use faults::{fault_edge, fault_ops};
pub use final_state::{Applied, DeadLetter, FinalLine, FinalRef, Meta, OrderRow, Pending, ProjectionRow};
pub use history::{Op, OpRef, OpType, OpValue, OrderRef, OrderValue, Process};
pub use jsonl::{FormatError, JsonlReader, JsonlWriter, Line, RawLine};

/// File names inside a run directory.
pub const HISTORY_FILE: &str = "history.jsonl";
pub const FINAL_STATE_FILE: &str = "final-state.jsonl";
pub const RUN_FILE: &str = "run.json";
pub const RESULTS_FILE: &str = "results.json";
