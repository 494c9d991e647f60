//! dflash: train DFlash block-diffusion drafters for speculative decoding on libtorch,
//! with a built-in trace recorder.
//!
//! Rooms: [`model`] (the target and the drafter, plain tch modules), [`train`] (data,
//! workers, queue, optimizer, checkpoints) and [`cuda`] (streams and events libtorch does
//! not expose, and the recorder's CUDA backend).
//!
//! May import: `tch` (libtorch), the span recorder (the `trace-recorder` crate,
//! re-exported as [`trace`]; it knows nothing of DFlash) and the trace format
//! (`chrome-trace-format`, for the well-known section names and the run directory's
//! files). Nothing imports this crate but its binary, its tests and its examples.
pub mod cuda;
pub mod durable;
pub mod model;
/// The run directory's file names (the trace format's `run_dir`).
pub use chrome_trace_format::run_dir as run_files;
pub mod train;

/// The span recorder (the `trace-recorder` crate).
pub use trace_recorder as trace;
pub use trace_recorder::trace_name;
