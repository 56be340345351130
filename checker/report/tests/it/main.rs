//! The report rendered from checked run directories (the checker's own cases).

mod axes;
mod boundary;
mod page;
