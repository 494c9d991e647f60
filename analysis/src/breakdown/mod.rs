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

pub fn breakdown(trace: &Trace) -> PolarsResult<Breakdown> {
    let spans = &trace.spans;
    let step_total = q::step_total(spans)?;

    // 1. Sections.
    let sec = q::sections(spans.clone().lazy(), step_total).collect()?;
    let sections: Vec<Section> = rows(&sec)?;

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
