//! The errors of a training run. Each message is one complete line that includes its
//! cause (print it with `{}`, not as a chain); [`TrainError::is_usage`] tells the
//! problems a user can fix (exit code 2) from failures during training (exit code 1).
use std::path::{Path, PathBuf};

use crate::cuda::CudaError;
use crate::durable;
use crate::model::ModelError;
use crate::trace::TraceError;

use super::checkpoint::Checkpoint;
use super::config::ConfigError;
use super::data::DataError;
use super::memory::MemoryError;
use super::queue::QueueError;
use super::run_dir::RunDirError;
use super::tokenizer::TokenizerError;

/// A device string that names no usable device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device {0:?}: use cpu, cuda or cuda:N")]
    Unknown(String),
    #[error("device {0} requested but CUDA is not available on this machine: use --drafter-device cpu --target-devices cpu")]
    NoCuda(String),
    #[error("device {spec} does not exist: this machine has {count} CUDA device(s), cuda:0..cuda:{}", count - 1)]
    Missing { spec: String, count: usize },
}

/// Failures of a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    // What the user can fix (exit code 2), found before training where possible.
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Device(#[from] DeviceError),
    #[error("give either target or target_preset, not both")]
    TargetAndPreset,
    #[error("unknown target_preset {0:?}: use realistic or tiny")]
    UnknownPreset(String),
    #[error("target checkpoint {} is not a directory: pass a Hugging Face checkpoint directory with --target", .0.display())]
    NoTarget(PathBuf),
    #[error("target {}: {source}", dir.display())]
    Target { dir: PathBuf, source: ModelError },
    #[error("{0}")]
    TargetWeights(#[source] ModelError),
    #[error("drafter does not fit the target: {0}")]
    DrafterFit(#[source] ModelError),
    #[error("{0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("{0}")]
    Data(#[from] DataError),
    #[error("{data}: no position has a loss weight (loss_mask is 0 everywhere, or never 1 on two neighbouring tokens): there is nothing to train on")]
    NoLossWeight { data: String },
    #[error("{0}")]
    Memory(#[from] MemoryError),
    #[error("{0}")]
    RunDir(#[from] RunDirError),
    #[error("--resume: {0}")]
    Resume(#[source] ModelError),
    #[error("cannot start the trace: {0}")]
    TraceStart(#[source] TraceError),
    #[error("{0}")]
    Cuda(#[source] CudaError),
    #[error("cannot set up the drafter: {0}")]
    Drafter(#[source] ModelError),
    #[error("cannot handle signals: {0}")]
    Signals(#[source] std::io::Error),
    /// A target worker failed before it could start (e.g. loading the target).
    #[error("{0}")]
    WorkerStart(#[source] QueueError),
    #[error("{0}")]
    Write(#[from] WriteError),

    #[error("out of device memory at step {step}: {message}; the estimate made before the run is a lower bound: lower num_anchors, block_size, seq_len or batch_tokens")]
    OutOfMemory { step: i64, message: String },

    // Failures during training (exit code 1).
    #[error("training failed: {0}")]
    Queue(#[from] QueueError),
    #[error("training failed: {0}")]
    Step(#[source] ModelError),
    #[error("training failed: {0}")]
    Gpu(#[source] CudaError),
    #[error("training failed: cannot start a target worker thread: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("training failed: the target worker stopped before starting")]
    WorkerGone,
    #[error("training failed: the target workers stopped early")]
    WorkersStopped,
    #[error("training failed: the loss became {loss} at step {step}; lower the learning rate (--set lr=...)")]
    LossNotFinite { loss: f64, step: i64 },
    #[error("training failed: injected fault (DFLASH_INJECT_FAULT)")]
    InjectedFault,
    #[error("training failed: {0}")]
    Fidelity(#[source] TraceError),
}

impl TrainError {
    /// A problem the user can fix: exit code 2 (and 1 for the others).
    pub fn is_usage(&self) -> bool {
        !matches!(
            self,
            Self::Queue(_)
                | Self::Step(_)
                | Self::Gpu(_)
                | Self::Spawn(_)
                | Self::WorkerGone
                | Self::WorkersStopped
                | Self::LossNotFinite { .. }
                | Self::InjectedFault
                | Self::Fidelity(_)
        )
    }
}

/// Where a run stands when a write fails: what a message about it must say.
#[derive(Debug, Clone)]
pub struct Standing {
    pub run_dir: PathBuf,
    /// Whether this run saves checkpoints at all.
    pub saving: bool,
    /// The newest complete checkpoint.
    pub last: Option<Checkpoint>,
}

impl Standing {
    pub fn new(run_dir: &Path, saving: bool, last: Option<Checkpoint>) -> Self {
        Self {
            run_dir: run_dir.into(),
            saving,
            last,
        }
    }

    /// The error for a write of `what` that failed with `source`.
    pub fn write_failed(
        &self,
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> TrainError {
        TrainError::Write(WriteError {
            what: what.into(),
            source: Box::new(source),
            standing: self.clone(),
        })
    }
}

/// A write that failed: what was not written, why, and where the run stands (the last
/// good checkpoint, or that there is none). A full disk is named as such.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.line())]
pub struct WriteError {
    pub what: String,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
    pub standing: Standing,
}

impl WriteError {
    pub fn is_disk_full(&self) -> bool {
        durable::chain_is_disk_full(&*self.source)
    }

    fn line(&self) -> String {
        let (cause, fix) = if self.is_disk_full() {
            ("the disk is full", "free space")
        } else {
            ("a write failed", "fix the cause")
        };
        let s = &self.standing;
        let resume = format!("dflash train --resume --run-dir {}", s.run_dir.display());
        let state = match &s.last {
            Some(c) => format!(
                "the last good checkpoint is {}: {fix}, then `{resume}` continues from it",
                c.describe()
            ),
            None if s.saving => format!(
                "there is no checkpoint yet: {fix}, then `{resume}` starts over from step 0"
            ),
            None => format!(
                "no checkpoint is saved (save_checkpoints is off): {fix}, then `{resume}` starts over from step 0"
            ),
        };
        format!("{cause}: {}: {}; {state}", self.what, self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_error_names_the_cause_and_where_the_run_stands() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let ck = Checkpoint {
            dir: "r/checkpoints/step-00000004".into(),
            step: 4,
        };
        let e = Standing::new(Path::new("r"), true, Some(ck)).write_failed("writing r/m", full);
        assert!(e.is_usage());
        assert_eq!(
            e.to_string(),
            "the disk is full: writing r/m: No space left on device (os error 28); the last good checkpoint is r/checkpoints/step-00000004 (step 4): free space, then `dflash train --resume --run-dir r` continues from it"
        );
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        let e = Standing::new(Path::new("r"), true, None).write_failed("writing x", denied);
        let text = e.to_string();
        assert!(
            text.starts_with("a write failed: writing x: Permission denied"),
            "{text}"
        );
        assert!(text.ends_with("there is no checkpoint yet: fix the cause, then `dflash train --resume --run-dir r` starts over from step 0"), "{text}");
        let off = Standing::new(Path::new("r"), false, None)
            .write_failed("w", std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert!(off
            .to_string()
            .contains("no checkpoint is saved (save_checkpoints is off)"));
        assert!(!TrainError::InjectedFault.is_usage());
    }
}
