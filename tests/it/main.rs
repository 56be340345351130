//! Tests of the `haunt` binary, run as a process.

mod check;
mod run;
mod tutorial;
