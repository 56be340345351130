//! The systems under test, each a `core::system::System`.
//!
//! - [`pipeline`]: the reference pipeline, local or in containers.
//! - [`brokers`]: the broker servers its transports run over, as nodes.
//! - [`system_file`]: a system described by a file (`haunt run --system`).

pub mod brokers;
pub mod pipeline;
pub mod system_file;
