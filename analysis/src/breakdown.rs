//! Where the time of a step goes: per-section statistics, CPU vs GPU time, a per-step
//! table, queue waits and depth, GPU idle time inside steps. All of it is polars queries
//! over the spans frame; this module turns their small results into plain structs that
//! the terminal, JSON, plots and the report share.

use polars::prelude::*;
use serde::Serialize;

use crate::findings::{self, Finding};
use crate::load::Trace;
use crate::queries as q;

/// One (name, kind) section.
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    pub name: String,
    /// The clock: `cpu` or `gpu`.
    pub kind: String,
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
}

/// A section timed on both clocks.
#[derive(Debug, Clone, Serialize)]
pub struct CpuGpu {
    pub name: String,
    pub cpu_total_us: f64,
    pub gpu_total_us: f64,
    /// CPU minus GPU: time the host spends beyond the device's work (launches, syncs).
    pub gap_us: f64,
    pub cpu_over_gpu: f64,
}

/// One step.
#[derive(Debug, Clone, Serialize)]
pub struct StepRow {
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
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
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

#[derive(Debug, Clone, Serialize)]
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
    pub warnings: Vec<crate::warning::Warning>,
}

pub fn producer(trace: &Trace) -> &'static str {
    if trace.is_dflash() {
        return "dflash";
    }
    let kineto = trace.top.contains_key("deviceProperties")
        || trace.top.contains_key("distributedInfo")
        || trace.top.contains_key("schemaVersion");
    if kineto {
        "kineto"
    } else {
        "chrome"
    }
}

pub fn breakdown(trace: &Trace) -> PolarsResult<Breakdown> {
    let spans = &trace.spans;
    let step_total = q::step_total(spans)?;

    // 1. Sections.
    let sec = q::sections(spans.clone().lazy(), step_total).collect()?;
    let (name, kind) = (q::strs(&sec, "name")?, q::strs(&sec, "kind")?);
    let (count, steps_n) = (q::i64s(&sec, "count")?, q::i64s(&sec, "steps")?);
    let (total, mean) = (q::f64s(&sec, "total_us")?, q::f64s(&sec, "mean_us")?);
    let (p50, p95) = (q::f64s(&sec, "p50_us")?, q::f64s(&sec, "p95_us")?);
    let (share, self_us) = (q::f64s(&sec, "share")?, q::f64s(&sec, "self_us")?);
    let top = q::bools(&sec, "top_level")?;
    let sections = (0..sec.height())
        .map(|i| Section {
            name: name[i].clone(),
            kind: kind[i].clone(),
            count: count[i].unwrap_or(0) as u64,
            total_us: total[i].unwrap_or(0.0),
            mean_us: mean[i].unwrap_or(0.0),
            p50_us: p50[i].unwrap_or(0.0),
            p95_us: p95[i].unwrap_or(0.0),
            share: share[i].unwrap_or(0.0),
            self_us: self_us[i].unwrap_or(0.0),
            top_level: top[i],
            steps: steps_n[i].unwrap_or(0) as u64,
        })
        .collect();

    // 2. CPU vs GPU, for sections on both clocks.
    let cg = q::cpu_vs_gpu(sec.lazy()).collect()?;
    let name = q::strs(&cg, "name")?;
    let (cpu, gpu) = (q::f64s(&cg, "cpu_total_us")?, q::f64s(&cg, "gpu_total_us")?);
    let (gap, r) = (q::f64s(&cg, "gap_us")?, q::f64s(&cg, "cpu_over_gpu")?);
    let cpu_gpu = (0..cg.height())
        .map(|i| CpuGpu {
            name: name[i].clone(),
            cpu_total_us: cpu[i].unwrap_or(0.0),
            gpu_total_us: gpu[i].unwrap_or(0.0),
            gap_us: gap[i].unwrap_or(0.0),
            cpu_over_gpu: r[i].unwrap_or(f64::NAN),
        })
        .collect();

    // 3. Per-step table.
    let st = q::per_step(spans)?.collect()?;
    let step = q::i64s(&st, "step")?;
    let dur = q::f64s(&st, "dur_us")?;
    let wait = q::f64s(&st, "queue_wait_us")?;
    let (busy, idle) = (q::f64s(&st, "gpu_busy_us")?, q::f64s(&st, "gpu_idle_us")?);
    let (tokens, loss) = (q::f64s(&st, "tokens")?, q::f64s(&st, "loss")?);
    let tps = q::f64s(&st, "tokens_per_s")?;
    let per_step = (0..st.height())
        .map(|i| StepRow {
            step: step[i].unwrap_or(-1),
            dur_us: dur[i].unwrap_or(0.0),
            queue_wait_us: wait[i],
            gpu_busy_us: busy[i],
            gpu_idle_us: idle[i],
            tokens: tokens[i],
            loss: loss[i],
            tokens_per_s: tps[i],
        })
        .collect();
    let ss = q::step_summary(st.lazy()).collect()?;
    let first =
        |c: &str| -> PolarsResult<Option<f64>> { Ok(q::f64s(&ss, c)?.first().copied().flatten()) };
    let steps = StepSummary {
        count: first("count")?.unwrap_or(0.0) as u64,
        total_us: first("total_us")?.unwrap_or(0.0),
        mean_us: first("mean_us")?.unwrap_or(0.0),
        p50_us: first("p50_us")?.unwrap_or(0.0),
        p95_us: first("p95_us")?.unwrap_or(0.0),
        tokens_per_s: first("tokens_per_s")?,
        gpu_idle_share: first("gpu_idle_share")?,
    };

    // 4. Queue waits and depth.
    let qs = q::queue_sides(spans.clone().lazy(), step_total).collect()?;
    let name = q::strs(&qs, "name")?;
    let count = q::i64s(&qs, "count")?;
    let (wt, wm) = (
        q::f64s(&qs, "wait_total_us")?,
        q::f64s(&qs, "wait_mean_us")?,
    );
    let (w50, w95) = (q::f64s(&qs, "wait_p50_us")?, q::f64s(&qs, "wait_p95_us")?);
    let share = q::f64s(&qs, "share")?;
    let queue = (0..qs.height())
        .map(|i| QueueSide {
            name: name[i].clone(),
            count: count[i].unwrap_or(0) as u64,
            wait_total_us: wt[i].unwrap_or(0.0),
            wait_mean_us: wm[i].unwrap_or(0.0),
            wait_p50_us: w50[i].unwrap_or(0.0),
            wait_p95_us: w95[i].unwrap_or(0.0),
            share: share[i].unwrap_or(0.0),
        })
        .collect();
    let qd = q::queue_depth(trace.counters.clone().lazy()).collect()?;
    let get = |c: &str| -> PolarsResult<f64> {
        Ok(q::f64s(&qd, c)?.first().copied().flatten().unwrap_or(0.0))
    };
    let samples = get("samples")? as u64;
    let queue_depth = if samples > 0 {
        Some(QueueDepth {
            samples,
            mean: get("mean")?,
            min: get("min")?,
            max: get("max")?,
            empty_share: get("empty_share")?,
            full_share: get("full_share")?,
        })
    } else {
        None
    };

    let mut b = Breakdown {
        run: trace.run.clone(),
        producer: producer(trace).to_string(),
        steps,
        sections,
        cpu_gpu,
        per_step,
        queue,
        queue_depth,
        findings: Vec::new(),
        warnings: trace.warnings.clone(),
    };
    b.findings = findings::findings(&b);
    Ok(b)
}
