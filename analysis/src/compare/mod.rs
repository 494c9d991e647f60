//! Compares two runs section by section, with statistics that say when a change is real.
//!
//! The samples of a section are its per-step durations (summed within a step). For each
//! (name, clock) section: the ratio of medians B/A with a percentile-bootstrap interval,
//! and a two-sided Mann-Whitney U test. A section is flagged only when its p-value is
//! significant after Holm's correction over all sections AND its whole interval lies
//! outside the noise band 1 +- noise (criterion's rule, with a rank test like Google
//! Benchmark's compare.py). When most CPU-side sections moved by about the same factor,
//! that factor is reported once as a slower (or faster) host, and each section is judged
//! again relative to it. Two rules keep real runs of one build from flagging changes
//! (both measured on the GPU host; docs/analyze-json.md): a change smaller than
//! `min_effect` of the step is not flagged, and when both runs are GPU-bound the CPU
//! sections' changes are host slack (where the host's wait for the GPU landed), reported
//! once and not counted.
//!
//! `sections.rs` judges the sections over their per-step samples; `kernels.rs` adds what
//! the kernels say (which moved, host or device); this file runs both on two traces and
//! tells the result in sentences.

mod kernels;
mod sections;

use chrome_trace_format::{dflash, Clock};
use polars::prelude::*;
use serde::Serialize;

use kernels::{attribute_sides, explain_gpu_by_host, kernel_change};
pub use kernels::{KernelChange, KernelMove, KERNEL_MIN_SHARE, KERNEL_MOVE, KERNEL_SECTION};
pub use sections::{
    compare_samples, samples, CompareOptions, HostShift, SectionCompare, Verdict,
    BOOTSTRAP_ITERATIONS, CI_LEVEL, HOST_MAJORITY, HOST_MIN_SECTIONS, HOST_SPREAD, MIN_EFFECT,
    MIN_SAMPLES, STEP_SECTION,
};
use sections::{drop_negligible, is_flagged_improvement, is_flagged_regression, mark_host_slack};

use crate::bound::bound_of;
use crate::breakdown::{self, Breakdown};
use crate::load::Trace;

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub run_a: String,
    pub run_b: String,
    pub noise: f64,
    pub alpha: f64,
    /// Changes below this share of A's median step are `negligible`.
    pub min_effect: f64,
    /// Both runs are GPU-bound on the same side (`drafter`, `target`, or `""` for a
    /// single-stream trace): CPU sections are host slack.
    pub gpu_bound: Option<String>,
    pub steps_a: u64,
    pub steps_b: u64,
    pub step_p50_a_us: f64,
    pub step_p50_b_us: f64,
    pub tokens_per_s_a: Option<f64>,
    pub tokens_per_s_b: Option<f64>,
    /// tokens/s of B over A, minus 1 (-0.1 = 10% fewer tokens per second).
    pub tokens_per_s_delta: Option<f64>,
    pub host_shift: Option<HostShift>,
    /// Kernel time per step in both runs and the kernels that moved (traces with kernels).
    pub kernels: Option<KernelChange>,
    pub sections: Vec<SectionCompare>,
    /// Regressions not explained by a host shift (what `--fail-on-regression` counts).
    pub regressions: usize,
    pub improvements: usize,
    /// The comparison in sentences.
    pub summary: Vec<String>,
}

pub fn compare(
    a: &Trace,
    b: &Trace,
    o: &CompareOptions,
) -> PolarsResult<(Comparison, Breakdown, Breakdown)> {
    let (ba, bb) = (breakdown::breakdown(a)?, breakdown::breakdown(b)?);
    let (mut sa, mut sb) = (samples(a)?, samples(b)?);
    for (s, bd) in [(&mut sa, &ba), (&mut sb, &bb)] {
        // The step itself, where no section spans it (dflash's `drafter.step` does): with
        // both runs GPU-bound the CPU sections are not counted, and a host that makes the
        // GPU wait shows here.
        if !bd.sections.iter().any(|x| dflash::is_envelope(&x.name)) && !bd.per_step.is_empty() {
            s.insert(
                (STEP_SECTION.to_string(), Clock::Cpu),
                bd.per_step.iter().map(|x| x.dur_us).collect(),
            );
        }
        if let Some(k) = &bd.kernels {
            s.insert(
                (KERNEL_SECTION.to_string(), Clock::Gpu),
                k.step_busy.iter().map(|x| x.busy_us).collect(),
            );
        }
    }
    let (mut sections, host) = compare_samples(&sa, &sb, o);
    let kernels = kernel_change(&ba, &bb);
    if let Some(h) = &host {
        explain_gpu_by_host(&mut sections, h, &ba, &bb);
    }
    if ba.steps.p50_us > 0.0 {
        drop_negligible(&mut sections, o.min_effect * ba.steps.p50_us);
    }
    let gpu_bound = match (bound_of(&ba), bound_of(&bb)) {
        (Some(("gpu_bound", x)), Some(("gpu_bound", y))) if x == y => {
            Some(x.unwrap_or("").to_string())
        }
        _ => None,
    };
    if gpu_bound.is_some() {
        mark_host_slack(&mut sections);
    }
    attribute_sides(&mut sections, &ba, &bb);
    let regressions = sections.iter().filter(|s| is_flagged_regression(s)).count();
    let improvements = sections
        .iter()
        .filter(|s| is_flagged_improvement(s))
        .count();
    let tps_delta = match (ba.steps.tokens_per_s, bb.steps.tokens_per_s) {
        (Some(x), Some(y)) if x > 0.0 => Some(y / x - 1.0),
        _ => None,
    };
    let mut c = Comparison {
        run_a: a.run.clone(),
        run_b: b.run.clone(),
        noise: o.noise,
        alpha: o.alpha,
        min_effect: o.min_effect,
        gpu_bound,
        steps_a: ba.steps.count,
        steps_b: bb.steps.count,
        step_p50_a_us: ba.steps.p50_us,
        step_p50_b_us: bb.steps.p50_us,
        tokens_per_s_a: ba.steps.tokens_per_s,
        tokens_per_s_b: bb.steps.tokens_per_s,
        tokens_per_s_delta: tps_delta,
        host_shift: host,
        kernels,
        sections,
        regressions,
        improvements,
        summary: Vec::new(),
    };
    c.summary = summary(&c);
    Ok((c, ba, bb))
}

fn summary(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
    if let (Some(x), Some(y), Some(d)) = (c.tokens_per_s_a, c.tokens_per_s_b, c.tokens_per_s_delta)
    {
        out.push(format!("tokens/s: {x:.0} -> {y:.0} ({:+.1}%)", d * 100.0));
    }
    if c.step_p50_a_us > 0.0 {
        out.push(format!(
            "median step: {:.2} ms -> {:.2} ms (x{:.2})",
            c.step_p50_a_us / 1000.0,
            c.step_p50_b_us / 1000.0,
            c.step_p50_b_us / c.step_p50_a_us
        ));
    }
    if let Some(h) = &c.host_shift {
        let word = if h.factor > 1.0 { "slower" } else { "faster" };
        let kernels = match &c.kernels {
            Some(k) if !k.changed => format!(", kernel time unchanged (x{:.2} per step)", k.ratio),
            Some(k) => format!(", kernel time x{:.2} per step", k.ratio),
            None => String::new(),
        };
        out.push(format!(
            "the whole host ran {word} (x{:.2}){kernels}: {} of {} CPU sections moved by about that factor; sections are judged relative to it as well",
            h.factor, h.sections, h.of
        ));
    } else if let Some(k) = c.kernels.as_ref().filter(|k| k.changed) {
        out.push(format!(
            "kernel time per step: {:.0} us -> {:.0} us (x{:.2})",
            k.a_us_per_step, k.b_us_per_step, k.ratio
        ));
    }
    if let Some(k) = &c.kernels {
        for m in k.moved.iter().take(5) {
            out.push(format!(
                "kernel {} moved: {:.0} us -> {:.0} us per step",
                m.name, m.a_us_per_step, m.b_us_per_step
            ));
        }
    }
    if let Some(side) = &c.gpu_bound {
        let slack: Vec<f64> = c
            .sections
            .iter()
            .filter(|s| {
                s.host_slack && matches!(s.verdict, Verdict::Regression | Verdict::Improvement)
            })
            .filter_map(|s| s.ratio)
            .collect();
        if !slack.is_empty() {
            let lo = slack.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = slack.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let on = if side.is_empty() {
                String::new()
            } else {
                format!(" on the {side}'s stream")
            };
            let moved = if slack.len() == 1 {
                format!("1 CPU section moved (x{lo:.2})")
            } else {
                format!("{} CPU sections moved (x{lo:.2} to x{hi:.2})", slack.len())
            };
            out.push(format!(
                "both runs are GPU-bound{on} (the host waits for the GPU each step): {moved}, which is where that wait landed, not time the step takes; not counted (the step and the GPU sections are)"
            ));
        }
    }
    for s in &c.sections {
        let flagged_reg = is_flagged_regression(s);
        let flagged_imp = is_flagged_improvement(s);
        if !(flagged_reg || flagged_imp) {
            continue;
        }
        let what = if flagged_reg { "regressed" } else { "improved" };
        let rel = match (s.relative_ratio, &c.host_shift) {
            (Some(r), Some(_)) => format!(", x{r:.2} relative to the host"),
            _ => String::new(),
        };
        let side = s.side.map(|d| format!(" [{d}]")).unwrap_or_default();
        out.push(format!(
            "{} ({}) {what}{side}: x{:.2} [{:.2}, {:.2}], p={:.2e}{rel}",
            s.name,
            s.kind,
            s.ratio.unwrap_or(f64::NAN),
            s.ci_low.unwrap_or(f64::NAN),
            s.ci_high.unwrap_or(f64::NAN),
            s.p_adjusted.unwrap_or(f64::NAN)
        ));
    }
    let insufficient = c
        .sections
        .iter()
        .filter(|s| s.verdict == Verdict::Insufficient)
        .count();
    if c.regressions == 0 && c.improvements == 0 {
        out.push(format!(
            "no section changed beyond the noise band (+-{:.0}%) and {:.1}% of the step with significance (alpha {} after Holm)",
            c.noise * 100.0,
            c.min_effect * 100.0,
            c.alpha
        ));
    }
    if insufficient > 0 {
        out.push(format!(
            "{insufficient} sections have fewer than {MIN_SAMPLES} steps in a run and were not judged"
        ));
    }
    out
}
