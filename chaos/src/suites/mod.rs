//! Commands built on many runs.
//!
//! - [`matrix`]: the bug modes, the faults that expose them, and the table.
//! - [`guarantees`]: every transport's claim against what its runs show,
//!   and [`guarantees_page`], its HTML page.
//! - [`synthetic`]: large synthetic run directories, for benchmarking the checker.

pub mod guarantees;
pub mod guarantees_page;
pub mod matrix;
pub mod synthetic;
