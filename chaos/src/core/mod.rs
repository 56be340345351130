//! A run and what it is made of, knowing no system, backend or suite by name.
//!
//! - [`roles`]: the small traits of a run (`Client`, `Nemesis`, `Backend`,
//!   `Checker`), each with a no-op implementation.
//! - [`system`]: what the harness needs from a system under test (`System`).
//! - [`fault`]: the faults as data (`Fault`), each building its nemesis.
//! - [`link`]: what link faults can do to a link (`Link`, `Slow`, `Lossy`),
//!   which the backends implement.
//! - [`admin`]: the client of the services' admin endpoints (fault switches,
//!   hold points).
//! - [`nemesis`]: the nemeses and their seeded schedule.
//! - [`options`]: a run's options, typed and validated once.
//! - [`seed`]: the run's seed and every seed derived from it.
//! - [`run`]: one run as a sequence of phases, assembled from roles.
//! - [`rundir`]: the run directory and `run.json`.
//! - [`history`]: the recorder of `history.jsonl`.
//! - [`workload`]: the HTTP client and the concurrent client loops.
//! - [`progress`]: the progress line, the harness's metrics, the scrape targets.
//! - [`worker_metrics`]: the workers' delivery counters, scraped live for the
//!   progress line.

pub mod admin;
pub mod fault;
pub mod history;
pub mod inflight;
pub mod link;
pub mod nemesis;
pub mod options;
pub mod progress;
pub mod roles;
pub mod run;
pub mod rundir;
pub mod seed;
pub mod system;
pub mod worker_metrics;
pub mod workload;
