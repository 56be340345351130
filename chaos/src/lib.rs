//! The harness: it runs the reference pipeline, breaks it on a seeded schedule
//! while clients record a Jepsen-style history, heals, reads the final state,
//! checks, and reports.
//!
//! # Layout
//!
//! - [`roles`]: the small traits of a run (`Client`, `Nemesis`, `Backend`,
//!   `Checker`), each with a no-op implementation.
//! - [`system`]: what the harness needs from a system under test (`System`).
//! - [`pipeline`]: the reference pipeline as a `System`, local or in containers.
//! - [`system_file`]: a system described by a file (`haunt run --system`).
//! - [`test`]: haunt as a library in a `#[tokio::test]`: `ChaosTest`, `Outcome::assert_valid`.
//! - [`fault`]: the faults as data (`Fault`), each building its nemesis.
//! - [`options`]: a run's options, typed and validated once.
//! - [`rundir`]: the run directory and `run.json`.
//! - [`progress`]: the progress line, the harness's metrics, the scrape targets.
//! - [`history`]: the recorder of `history.jsonl`.
//! - [`workload`]: the HTTP client and the concurrent client loops.
//! - [`local`]: the local backend (child processes, signals).
//! - [`docker`]: the Docker backend (containers, docker kill/pause, iptables).
//! - [`matrix`]: the bug modes, the faults that expose them, and the table.
//! - [`proxy`]: the TCP fault proxy (partitions, delay).
//! - [`nemesis`]: the faults and their seeded schedule.
//! - [`postgres`]: a PostgreSQL server the harness crashes and restarts.
//! - [`run`]: one run as a sequence of phases, assembled from roles.
//! - [`synthetic`]: large synthetic run directories, for benchmarking the checker.
//! - [`worker_metrics`]: the workers' delivery counters, scraped live for the
//!   progress line.

pub mod brokers;
pub mod docker;
pub mod fault;
pub mod guarantees;
pub mod guarantees_page;
pub mod history;
pub mod local;
pub mod matrix;
pub mod nemesis;
pub mod options;
pub mod pipeline;
pub mod postgres;
pub mod progress;
pub mod proxy;
pub mod roles;
pub mod run;
pub mod rundir;
pub mod synthetic;
pub mod system;
pub mod system_file;
pub mod test;
pub mod worker_metrics;
pub mod workload;
