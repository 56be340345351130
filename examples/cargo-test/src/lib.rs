//! Nothing here: the example is its tests (`tests/`).
