//! trace (in progress)
