//! Training: data, the target workers, the hidden-state queue, the drafter worker, the
//! optimizer, checkpoints and the run directory. [`pipeline::run`] tells a run's story;
//! the other rooms each own one part of it.
pub mod bpe;
pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod data;
mod drafter_loop;
pub mod error;
pub mod limits;
pub mod memory;
pub mod optim;
pub mod pipeline;
pub mod plan;
pub mod prepare;
pub mod pretrain;
pub mod queue;
pub mod records;
pub mod report;
pub mod run_dir;
pub mod run_log;
pub mod step;
mod target_worker;
pub mod token_file;
pub mod tokenizer;
