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
    /// Over the timed steps: this process's steps after its first two (warm-up); both 0
    /// when there were none.
    pub tokens_per_s: f64,
    pub mean_step_ms: f64,
    /// How many steps `tokens_per_s` and `mean_step_ms` cover.
    pub timed_steps: i64,
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
    /// Per traced step on CUDA: the caching allocator, host syncs, and with
    /// `--trace-kernels` kernels, launch and sync time.
    pub cuda_per_step: Option<CudaPerStep>,
    /// What `--trace-kernels` wrote into the trace.
    pub kernel_trace: Option<crate::cuda::kernel_trace::MergeReport>,
}

/// CUDA figures per traced step (the drafter's device for the allocator; every thread
/// for host syncs and CUDA calls).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CudaPerStep {
    /// Traced steps measured.
    pub steps: u64,
    /// The caching allocator's device allocations and frees (`cudaMalloc`/`cudaFree`).
    pub device_allocs: f64,
    pub device_frees: f64,
    /// Over the traced steps: allocations retried after freeing the cache, and OOMs.
    pub alloc_retries: i64,
    pub ooms: i64,
    /// Bytes allocated and reserved after the last traced step.
    pub allocated_bytes: i64,
    pub reserved_bytes: i64,
    /// Host synchronizations made by the trainer's own code.
    pub host_syncs: f64,
    /// With `--trace-kernels`: kernels, and time in launch calls and in waits, per step.
    pub kernels: Option<f64>,
    pub launch_us: Option<f64>,
    pub sync_us: Option<f64>,
}

impl CudaPerStep {
    /// The live summary's suffix.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "cuda/step: {:.1} device allocs, {:.1} host syncs",
            self.device_allocs, self.host_syncs
        );
        if let (Some(k), Some(l), Some(y)) = (self.kernels, self.launch_us, self.sync_us) {
            s += &format!(", {k:.0} kernels, launch {l:.0} us, sync {y:.0} us");
        }
        s
    }
}

impl RunReport {
    /// The last complete checkpoint, if the run saved one.
    pub(super) fn last_checkpoint(&self) -> Option<Checkpoint> {
        let dir = self.checkpoint.clone()?;
        let step = checkpoint::read_state(&dir).ok()?.step;
        Some(Checkpoint { dir, step })
    }
}
