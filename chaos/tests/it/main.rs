//! The harness crate's integration tests, one binary (one link) for all:
//!
//! - [`phases`]: a run's phases in process, in paused time, over the
//!   in-memory system of [`memory`];
//! - [`shrink`]: `haunt shrink`'s search over runs in process, in paused time;
//! - [`local`]: the local backend's process groups;
//! - [`brokers`]: each broker server as a node (needs the servers);
//! - [`transports`]: every transport held to its contract against the real
//!   server;
//! - [`relay`]: the relay against a real Redis;
//! - [`system_file`]: the system files under `tests/system_files`.

mod brokers;
mod local;
mod memory;
mod phases;
mod relay;
mod shrink;
mod system_file;
mod transports;
