//! model (in progress)
