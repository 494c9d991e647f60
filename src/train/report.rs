//! What a run is asked to do beyond its configuration ([`RunOptions`]) and what it did
//! ([`RunReport`], written as `RUN_DIR/summary.json`).
use std::path::PathBuf;

use crate::trace;

use super::checkpoint::{self, Checkpoint};

/// How to run, beyond the configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub run_dir: PathBuf,
    /// Write `RUN_DIR/trace.json`.
    pub trace: bool,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// Save and stop once this many steps are done (the schedule still spans `steps`).
    pub stop_after: Option<i64>,
    /// No progress lines.
    pub quiet: bool,
}

/// Held-out evaluation figures.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Eval {
    pub loss: f64,
    pub accuracy: f64,
    pub tau_hat: f64,
}

/// Where a run ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// All `steps` done, the drafter exported.
    #[default]
    Finished,
    /// Stopped before the end (a signal or `--stop-after`); continue with `--resume`.
    Stopped,
    /// A resume found nothing to do (finished, or already at `--stop-after`); nothing
    /// was changed.
    AlreadyDone,
}

/// What a run did (`RUN_DIR/summary.json`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunReport {
    pub status: RunStatus,
    /// Steps done in all, where the run stands.
    pub step: i64,
    /// Steps the run is planned for.
    pub steps: i64,
    pub start_step: i64,
    pub steps_done: i64,
    pub losses: Vec<f64>,
    pub tokens_per_s: f64,
    pub mean_step_ms: f64,
    pub heldout_before: Option<Eval>,
    pub heldout_after: Option<Eval>,
    pub stopped_by_signal: bool,
    /// The signal that stopped the run ("SIGINT", "SIGTERM").
    pub signal: Option<String>,
    #[serde(skip)]
    pub signal_number: Option<i32>,
    /// The last complete checkpoint.
    pub checkpoint: Option<PathBuf>,
    /// The exported drafter (finished runs).
    pub drafter: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// What GPU-timed spans cost the workers' CPU (traced CUDA runs).
    pub trace_gpu_cost: Option<trace::GpuTimingCost>,
}

impl RunReport {
    /// The last complete checkpoint, if the run saved one.
    pub(super) fn last_checkpoint(&self) -> Option<Checkpoint> {
        let dir = self.checkpoint.clone()?;
        let step = checkpoint::read_state(&dir).ok()?.step;
        Some(Checkpoint { dir, step })
    }
}
