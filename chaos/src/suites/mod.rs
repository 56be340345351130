//! Commands built on many runs.
//!
//! - [`matrix`]: the bug modes, the faults that expose them, and the table.
//! - [`guarantees`]: every transport's claim against what its runs show,
//!   with its HTML page (`guarantees::page`).
//! - [`shrink`]: from a failing run toward the smallest schedule that still
//!   fails (the search so far).
//! - [`synthetic`]: large synthetic run directories, for benchmarking the checker.

pub mod guarantees;
pub mod matrix;
pub mod shrink;
pub mod synthetic;
