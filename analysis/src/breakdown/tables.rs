//! What a breakdown is made of: the rows of its tables (sections, CPU vs GPU, steps,
//! queue sides and depth), the step summary, the findings in words, and the whole
//! [`Breakdown`] as `breakdown --json` writes it (docs/analyze-json.md). The rows are
//! read from the result frames of `queries` by column name (see `rows`).

use chrome_trace_format::Clock;
use serde::{Deserialize, Serialize};

use crate::rows::{minus_one_if_missing, nan_if_missing};

/// One (name, kind) section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Section {
    pub name: String,
    /// The clock: `cpu` or `gpu`.
    pub kind: Clock,
    pub count: u64,
    pub total_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    /// Time inside steps over the total step time.
    pub share: f64,
    /// Total minus the time of nested sections on the same track.
    pub self_us: f64,
    pub top_level: bool,
    /// Steps in which the section ran.
    pub steps: u64,
    /// An operator (Kineto `cpu_op`) shown because user sections cover little of the
    /// steps, not a user section.
    #[serde(default)]
    pub operator: bool,
}

/// A section timed on both clocks.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CpuGpu {
    pub name: String,
    pub cpu_total_us: f64,
    pub gpu_total_us: f64,
    /// CPU minus GPU: time the host spends beyond the device's work (launches, syncs).
    pub gap_us: f64,
    #[serde(deserialize_with = "nan_if_missing")]
    pub cpu_over_gpu: f64,
}

/// One step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRow {
    #[serde(deserialize_with = "minus_one_if_missing")]
    pub step: i64,
    pub dur_us: f64,
    /// `queue.get` wait inside the step.
    pub queue_wait_us: Option<f64>,
    /// Union of GPU activity inside the step.
    pub gpu_busy_us: Option<f64>,
    pub gpu_idle_us: Option<f64>,
    pub tokens: Option<f64>,
    pub loss: Option<f64>,
    pub tokens_per_s: Option<f64>,
}

/// Waits of one side of the queue.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueSide {
    pub name: String,
    pub count: u64,
    pub wait_total_us: f64,
    pub wait_mean_us: f64,
    pub wait_p50_us: f64,
    pub wait_p95_us: f64,
    /// Wait over the total step time.
    pub share: f64,
}

/// The queue depth counter.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueueDepth {
    pub samples: u64,
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Share of samples at depth 0 (the consumer finds it empty).
    pub empty_share: f64,
    /// Share of samples at the largest depth seen (likely full).
    pub full_share: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StepSummary {
    pub count: u64,
    pub total_us: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub tokens_per_s: Option<f64>,
    pub gpu_idle_share: Option<f64>,
}

/// Everything `breakdown` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    pub run: String,
    /// `dflash` or `kineto` (or `chrome` when neither is recognised).
    pub producer: String,
    pub steps: StepSummary,
    pub sections: Vec<Section>,
    pub cpu_gpu: Vec<CpuGpu>,
    pub per_step: Vec<StepRow>,
    pub queue: Vec<QueueSide>,
    pub queue_depth: Option<QueueDepth>,
    pub findings: Vec<Finding>,
    /// Set when the sections table also holds operators (a trace whose user sections
    /// cover little of its steps, e.g. a compiled model's): why, in words.
    pub fallback: Option<String>,
    /// The caching allocator over time, when the trace records it.
    pub memory: Option<crate::hta::Memory>,
    /// Kernels, and per section what it launched and waited for; `None` without kernels.
    pub kernels: Option<crate::kernels::KernelView>,
    pub warnings: Vec<crate::warning::Warning>,
    /// Events the loader skipped or did not use, by reason.
    pub skipped: Vec<crate::load::Skipped>,
}

/// A sentence about a breakdown.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    /// A stable identifier of the rule, e.g. `queue_starved`, `launch_bound`.
    pub rule: &'static str,
    /// The section or queue side it concerns, when there is one.
    pub subject: Option<String>,
    /// The share of step time it concerns; findings are sorted by it.
    pub share: f64,
    pub text: String,
}
