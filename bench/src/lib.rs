//! `haunt bench`: measurements that are reported, never asserted. Each compares
//! against a baseline measured in the same run on the same machine, and returns
//! its figures as a JSON value; the binary prints it.
//!
//! # Layout
//!
//! - [`check()`] (`check.rs`): the checker on a synthetic run, against merely
//!   deserializing the same files.
//! - [`harness()`] (`harness.rs`): the harness's clients and recorder against a
//!   stub API, against the same requests sent without recording.
//! - [`pipeline()`] (`pipeline.rs`): the worker and the API against what the
//!   database can do (the server-side limit, the client-side SQL baseline, the
//!   per-message design, raw ingest), all in one run on one database.
//! - [`transport()`] (`transport.rs`): haunt's relay and workers over a
//!   broker against the transport's own client without the database,
//!   publish and drain, paired.
//! - `worker_process.rs`: the `haunt worker` process the pipeline bench starts
//!   and measures from outside (its rate, peak memory and CPU time from /proc).
//! - `options.rs`: what each bench runs, compiled in every build.
//!
//! # The feature `run`
//!
//! The benches are this crate's default feature `run`. The `haunt` binary
//! depends on the crate without it, so that the README's first command
//! (`cargo run -- run`) and a plain release build do not compile them: they
//! were about a tenth of a release build's CPU (docs/performance.md, the
//! first verdict).
//! `cargo build --release --features bench` builds the binary with them, and
//! a workspace build (the suite's) has them through this crate's default.
//! Without it each bench function returns an error that says so, and
//! [`BUILT`] is false.

/// Whether the benches are in this build (the feature `run`).
pub const BUILT: bool = cfg!(feature = "run");

/// What every bench says in a build without them.
pub const NOT_BUILT: &str = "haunt bench is not in this build: the README's first command leaves the benches out. \
     Build haunt with them: `cargo build --release --features bench` (or `cargo run --release --features bench -- bench ...`)";

mod options;
pub use options::default_events as transport_default_events;
pub use options::{CheckOptions, HarnessOptions, PipelineOptions, TransportOptions};

#[cfg(feature = "run")]
mod check;
#[cfg(feature = "run")]
mod cpu;
#[cfg(feature = "run")]
mod harness;
#[cfg(feature = "run")]
mod pgmq;
#[cfg(feature = "run")]
mod pipeline;
#[cfg(feature = "run")]
mod transport;
#[cfg(feature = "run")]
mod worker_process;

#[cfg(feature = "run")]
pub use check::check;
#[cfg(feature = "run")]
pub use harness::harness;
#[cfg(feature = "run")]
pub use pipeline::pipeline;
#[cfg(feature = "run")]
pub use transport::transport;

// Compiled in every build, so that the suite's tests (which have the
// benches) hold what a build without them says.
#[cfg_attr(feature = "run", allow(dead_code))]
mod absent;
#[cfg(not(feature = "run"))]
pub use absent::{check, harness, pipeline, transport};

/// The machine the figures were measured on: CPU model and core count.
#[cfg(feature = "run")]
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    format!("{cpu}, {cores} cores")
}
