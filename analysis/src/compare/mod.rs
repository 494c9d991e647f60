//! Compares two runs section by section, with statistics that say when a change is real.
//!
//! The samples of a section are its per-step durations (summed within a step). For each
//! (name, clock) section: the ratio of medians B/A with a percentile-bootstrap interval,
//! and a two-sided Mann-Whitney U test. A section is flagged only when its p-value is
//! significant after Holm's correction over all sections AND its whole interval lies
//! outside the noise band 1 +- noise (criterion's rule, with a rank test like Google
//! Benchmark's compare.py). When most CPU-side sections moved by about the same factor,
//! that factor is reported once as a slower (or faster) host, and each section is judged
//! again relative to it.
//!
//! `sections.rs` judges the sections over their per-step samples; `kernels.rs` adds what
//! the kernels say (which moved, host or device); this file runs both on two traces and
//! tells the result in sentences.

mod kernels;
mod sections;

use chrome_trace_format::Clock;
use polars::prelude::*;
use serde::Serialize;

use kernels::{attribute_sides, explain_gpu_by_host, kernel_change};
pub use kernels::{KernelChange, KernelMove, KERNEL_MIN_SHARE, KERNEL_MOVE, KERNEL_SECTION};
use sections::is_flagged_regression;
pub use sections::{
    compare_samples, samples, CompareOptions, HostShift, SectionCompare, Verdict,
    BOOTSTRAP_ITERATIONS, CI_LEVEL, HOST_MAJORITY, HOST_MIN_SECTIONS, HOST_SPREAD, MIN_SAMPLES,
};

use crate::breakdown::{self, Breakdown};
use crate::load::Trace;

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub run_a: String,
    pub run_b: String,
    pub noise: f64,
    pub alpha: f64,
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
    attribute_sides(&mut sections, &ba, &bb);
    let regressions = sections.iter().filter(|s| is_flagged_regression(s)).count();
    let improvements = sections
        .iter()
        .filter(|s| {
            (s.verdict == Verdict::Improvement && !s.explained_by_host)
                || s.relative_verdict == Some(Verdict::Improvement)
        })
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
    for s in &c.sections {
        let flagged_reg = is_flagged_regression(s);
        let flagged_imp = (s.verdict == Verdict::Improvement && !s.explained_by_host)
            || s.relative_verdict == Some(Verdict::Improvement);
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
            "no section changed beyond the noise band (+-{:.0}%) with significance (alpha {} after Holm)",
            c.noise * 100.0,
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
