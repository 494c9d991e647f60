//! `dflash-analyze`: reads dflash traces (docs/trace-format.md) and PyTorch-profiler
//! (Kineto) traces into polars frames, and answers where the time of a training step goes
//! (`breakdown`), whether a change made it slower (`compare`), with pictures (`plot`),
//! files (`export`) and one HTML page (`report`). It does not depend on the trainer.

pub mod breakdown;
pub mod cli;
pub mod compare;
pub mod export;
pub mod findings;
pub mod load;
pub mod plot;
pub mod queries;
pub mod render;
pub mod report;
pub mod stats;
pub mod synth;
pub mod warning;

pub use load::{load, LoadError, LoadOptions, Trace};
