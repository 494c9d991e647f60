//! `dflash-analyze`: reads dflash traces and PyTorch-profiler (Kineto) traces into polars
//! frames, and answers where the time of a training step goes (`breakdown`), whether a
//! change made it slower (`compare`), with pictures (`plot`), files (`export`) and one
//! HTML page (`report`).
//!
//! Owns: loading ([`load`]: a streaming scanner, parts scanned in parallel, the span,
//! counter, flow and thread frames), the queries over them ([`queries`], the one place
//! that speaks polars' expression API, and [`rows`], which reads their small results into
//! structs), statistics ([`stats`]), the kernel view ([`kernels`]: kernels attributed
//! to the sections that launched them) and HTA's figures ([`hta`]), both walks over the
//! spans frame's columns as plain vectors ([`columns`]), the findings in words
//! ([`findings`], what bounds a step in [`bound`], the thresholds of both in
//! [`thresholds`]), rendering, plots, export, the report, and synthetic traces for tests
//! and the load benchmark ([`synth`]).
//!
//! May import: `chrome-trace-format` (what a `cat`, a phase, a name or a run directory's
//! file means; the writer [`synth`] writes through), polars, plotters, rayon (the load's
//! thread pool), rustc-hash. Not the trainer and not the recorder: the trace file is the
//! only contract between the two programs.

pub mod bound;
pub mod breakdown;
pub mod cli;
mod columns;
pub mod compare;
pub mod export;
pub mod findings;
pub mod hta;
pub mod kernels;
pub mod load;
pub mod plot;
pub mod queries;
pub mod render;
pub mod report;
pub mod rows;
pub mod stats;
pub mod synth;
pub mod thresholds;
pub mod warning;

pub use load::{load, LoadError, LoadOptions, Trace};
