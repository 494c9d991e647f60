//! Training: data, the target worker, the hidden-state queue, the drafter worker, the
//! optimizer and checkpoints.
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod limits;
pub mod memory;
pub mod optim;
pub mod pipeline;
pub mod pretrain;
pub mod queue;
pub mod run_dir;
pub mod step;
