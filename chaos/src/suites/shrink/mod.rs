//! Shrinking a failing run to the smallest schedule that still fails
//! (issue 34). So far: [`ddmin`], the search over a run's windows.

pub mod ddmin;
