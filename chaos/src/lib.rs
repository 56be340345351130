//! The harness: it runs a system under test (the reference pipeline, or one a
//! system file describes), breaks it on a seeded schedule while clients record
//! a Jepsen-style history, heals, reads the final state, checks, and reports.
//!
//! # Layout
//!
//! Four rooms, each allowed to use only the rooms before it (a test,
//! `tests/it/invariants.rs`, reads every `crate::` path and fails on one that
//! points back up):
//!
//! - [`core`]: a run as phases over roles, and everything a run is made of
//!   that knows no system: the roles and the system seam, the faults as data
//!   and their nemeses, the schedule, the history, the workload, the options,
//!   the run directory, the progress line.
//! - [`backends`]: what runs nodes and cuts links: local processes, Docker
//!   containers, a PostgreSQL server, the TCP fault proxy.
//! - [`systems`]: the systems under test: the reference pipeline, the broker
//!   servers it can run over, and a system described by a file.
//! - [`suites`]: commands built on runs: the bug matrix, the guarantees table,
//!   synthetic run directories for the checker's bench.
//!
//! Beside them, above all four:
//! - [`assemble`]: one way to assemble a run of any system, for every caller;
//!   the one module that knows the systems by name.
//! - [`interrupt`]: what SIGINT and SIGTERM do to the runs in progress
//!   (heal, stop, mark aborted; a second Ctrl-C kills at once), for every
//!   caller.
//! - [`test`]: haunt as a library in a `#[tokio::test]` (`ChaosTest`,
//!   `Outcome::assert_valid`).

pub mod assemble;
pub mod backends;
pub mod core;
pub mod interrupt;
pub mod suites;
pub mod systems;
pub mod test;
