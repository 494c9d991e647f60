//! cuda (in progress)
