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

mod check;
mod harness;
mod pgmq;
mod pipeline;
mod transport;
mod worker_process;

pub use check::{CheckOptions, check};
pub use harness::{HarnessOptions, harness};
pub use pipeline::{PipelineOptions, pipeline};
pub use transport::{TransportOptions, default_events as transport_default_events, transport};

/// The machine the figures were measured on: CPU model and core count.
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
