//! Integration tests of the checker: one binary, one module per concern.

mod props;
mod runs;
