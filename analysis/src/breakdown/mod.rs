//! Where the time of a step goes: per-section statistics, CPU vs GPU time, a per-step
//! table, queue waits and depth, GPU idle time inside steps. All of it is polars queries
//! over the spans frame; this module turns their small results into plain structs that
//! the terminal, JSON, plots and the report share.

pub mod tables;

use chrome_trace_format::header::top;
use polars::prelude::*;

use crate::findings;
use crate::load::Trace;
use crate::queries as q;
use crate::rows::rows;
pub use tables::{
    Breakdown, CpuGpu, Finding, QueueDepth, QueueSide, Section, StepRow, StepSummary,
};

pub fn producer(trace: &Trace) -> &'static str {
    if trace.is_dflash() {
        return "dflash";
    }
    let kineto = [
        top::DEVICE_PROPERTIES,
        top::DISTRIBUTED_INFO,
        top::SCHEMA_VERSION,
    ]
    .iter()
    .any(|k| trace.top.contains_key(*k));
    if kineto {
        "kineto"
    } else {
        "chrome"
    }
}

/// Below this share of step time covered by user sections, a breakdown adds operators.
const MIN_COVERED: f64 = 0.5;

/// When user sections are missing or cover little of the steps (a `torch.compile`d model
/// drops the annotations inside compiled regions), adds the operators near the top of
/// each thread as rows, so the table shows where the time goes; says so in words.
fn ops_fallback(
    spans: &DataFrame,
    step_total: f64,
    covered: f64,
    sections: &mut Vec<Section>,
) -> PolarsResult<Option<String>> {
    let thin = step_total > 0.0 && covered < MIN_COVERED;
    if !(sections.is_empty() || thin) {
        return Ok(None);
    }
    let ops: Vec<Section> = rows(
        &q::sections_where(spans.clone().lazy(), step_total, q::is_outer_op(), true).collect()?,
    )?;
    if ops.is_empty() {
        return Ok(None);
    }
    sections.extend(ops);
    sections.sort_by(|a, b| b.total_us.total_cmp(&a.total_us).then(a.name.cmp(&b.name)));
    Ok(Some(format!(
        "user sections cover {:.0}% of the step time; the table adds the operators near the \
         top of each thread (compiled regions, their compiled functions, autograd's nodes)",
        covered * 100.0
    )))
}

/// With kernels, a step's GPU busy time is that of the work it launched (the GPU runs
/// behind the host: what the busy time inside the step's window would miss or borrow
/// from the next step).
fn busy_by_launch(k: &crate::kernels::KernelView, rows: &mut [StepRow], sum: &mut StepSummary) {
    let (mut idle, mut dur) = (0.0, 0.0);
    for r in rows.iter_mut() {
        let Some(b) = k.step_busy.iter().find(|b| b.step == r.step) else {
            continue;
        };
        r.gpu_busy_us = Some(b.busy_us);
        r.gpu_idle_us = Some((r.dur_us - b.busy_us).max(0.0));
        idle += (r.dur_us - b.busy_us).max(0.0);
        dur += r.dur_us;
    }
    if dur > 0.0 {
        sum.gpu_idle_share = Some(idle / dur);
    }
}

pub fn breakdown(trace: &Trace) -> PolarsResult<Breakdown> {
    let spans = &trace.spans;
    let step_total = q::step_total(spans)?;

    // 1. Sections.
    let sec = q::sections(spans.clone().lazy(), step_total).collect()?;
    let mut sections: Vec<Section> = rows(&sec)?;
    let walk = crate::kernels::walk(spans)?;
    let covered = if step_total > 0.0 {
        walk.outer_section_us / step_total
    } else {
        0.0
    };
    let fallback = ops_fallback(spans, step_total, covered, &mut sections)?;

    // 2. CPU vs GPU, for sections on both clocks.
    let cpu_gpu: Vec<CpuGpu> = rows(&q::cpu_vs_gpu(sec.lazy()).collect()?)?;

    // 3. Per-step table.
    let st = q::per_step(spans)?.collect()?;
    let per_step: Vec<StepRow> = rows(&st)?;
    let steps = rows::<StepSummary>(&q::step_summary(st.lazy()).collect()?)?
        .pop()
        .unwrap_or_default();

    // 4. Queue waits and depth.
    let queue: Vec<QueueSide> = rows(&q::queue_sides(spans.clone().lazy(), step_total).collect()?)?;
    let queue_depth =
        rows::<QueueDepth>(&q::queue_depth(trace.counters.clone().lazy()).collect()?)?
            .pop()
            .filter(|d| d.samples > 0);

    let (mut per_step, mut steps) = (per_step, steps);
    if let Some(k) = &walk.kernels {
        busy_by_launch(k, &mut per_step, &mut steps);
    }
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
        fallback,
        memory: crate::hta::memory(&trace.counters)?,
        kernels: walk.kernels,
        warnings: trace.warnings.clone(),
        skipped: trace.stats.skipped.clone(),
    };
    b.findings = findings::findings(&b);
    Ok(b)
}
