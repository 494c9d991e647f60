//! train (in progress)
