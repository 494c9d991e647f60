//! dflash: train DFlash block-diffusion drafters for speculative decoding on libtorch,
//! with a built-in trace recorder.
//!
//! Rooms: [`model`] (the target and the drafter, plain tch modules), [`train`] (data,
//! workers, queue, optimizer, checkpoints), [`trace`] (the span recorder; it knows
//! nothing of DFlash) and [`cuda`] (streams and events libtorch does not expose).
pub mod cuda;
pub mod durable;
pub mod model;
pub mod run_files;
pub mod trace;
pub mod train;
