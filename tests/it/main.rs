//! Tests of the `haunt` binary, run as a process.

mod admin;
mod async_settle;
mod bench;
mod check;
mod docker;
mod guarantees;
mod invariants;
mod layers;
mod library;
mod matrix;
mod observability;
mod report;
mod run;
mod shrink;
mod source;
mod store_boundary;
mod system;
mod traces;
mod transport;
mod tutorial;
