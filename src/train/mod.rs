//! Training: data, the target worker, the hidden-state queue, the drafter worker, the
//! optimizer and checkpoints.
pub mod optim;
pub mod step;
