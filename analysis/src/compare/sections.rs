//! The judgement of a comparison, section by section, over per-step samples: the ratio
//! of medians B/A with a percentile-bootstrap interval, a two-sided Mann-Whitney U test,
//! Holm's correction over all sections, and the noise band; then the host shift (most
//! CPU sections moved by about one factor) and every section judged again relative to
//! it. Only [`samples`] reads a trace; the breakdowns and the kernels they hold are the
//! parent module's and `kernels.rs`' concern.

use std::collections::BTreeMap;

use chrome_trace_format::{dflash, Clock};
use polars::prelude::*;
use serde::{Deserialize, Serialize};

use crate::load::Trace;
use crate::queries as q;
use crate::rows::rows;
use crate::stats;

/// Fewer per-step samples than this in either run: `insufficient`.
pub const MIN_SAMPLES: usize = 5;
/// Bootstrap resamples (fewer for very long runs, so a compare stays interactive).
pub const BOOTSTRAP_ITERATIONS: usize = 2000;
/// Coverage of the confidence interval.
pub const CI_LEVEL: f64 = 0.95;
/// A host shift needs at least this many CPU sections ...
pub const HOST_MIN_SECTIONS: usize = 4;
/// ... at least this share of which lie within HOST_SPREAD of their median ratio.
pub const HOST_MAJORITY: f64 = 0.7;
pub const HOST_SPREAD: f64 = 0.10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Regression,
    Improvement,
    Unchanged,
    Insufficient,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Regression => "regression",
            Verdict::Improvement => "improvement",
            Verdict::Unchanged => "unchanged",
            Verdict::Insufficient => "insufficient",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CompareOptions {
    pub noise: f64,
    pub alpha: f64,
    pub seed: u64,
    /// A change of a section's median smaller than this share of A's median step time is
    /// not flagged (too small to move the step, whatever its p-value).
    pub min_effect: f64,
}

/// The default of [`CompareOptions::min_effect`]: 0.5% of the step. On one GPU host, runs
/// of one build moved small sections' medians by up to 0.33% of the step with p < 0.01
/// (spans that share the GPU with the other worker's kernels); real changes of a step's
/// work move it by whole percents.
pub const MIN_EFFECT: f64 = 0.005;

/// The step's wall time as a section, for traces without a span around each step's
/// sections (a PyTorch-profiler trace's `ProfilerStep#N`).
pub const STEP_SECTION: &str = "step (wall time)";

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            noise: 0.02,
            alpha: 0.05,
            seed: 1,
            min_effect: MIN_EFFECT,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SectionCompare {
    pub name: String,
    /// `cpu` or `gpu`.
    pub kind: Clock,
    /// Judged on the absolute durations.
    pub verdict: Verdict,
    /// median(B) / median(A); null when a run lacks the section.
    pub ratio: Option<f64>,
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    /// Mann-Whitney U two-sided p-value, before correction.
    pub p_value: Option<f64>,
    /// After Holm's correction over the judged sections.
    pub p_adjusted: Option<f64>,
    pub n_a: usize,
    pub n_b: usize,
    pub median_a_us: Option<f64>,
    pub median_b_us: Option<f64>,
    /// With a host shift: the ratio divided by the host factor (CPU sections only).
    pub relative_ratio: Option<f64>,
    /// With a host shift: the verdict relative to the host factor.
    pub relative_verdict: Option<Verdict>,
    /// A change in absolute time that the host shift accounts for.
    pub explained_by_host: bool,
    /// For a flagged change: `host` (CPU time, launches, syncs) or `device` (kernel
    /// time), when the traces tell.
    pub side: Option<&'static str>,
    /// Significant, but the medians differ by less than `min_effect` of A's median step:
    /// the verdict is `unchanged`.
    pub negligible: bool,
    /// Both runs are GPU-bound on the same side, and this is a CPU section other than the
    /// step itself: the host waits for the GPU each step, and a change here is where that
    /// wait landed, not time the step takes. Not counted as a regression or improvement.
    pub host_slack: bool,
}

impl SectionCompare {
    /// Why a change of this section is not counted, as printed after its verdict: `small`
    /// (negligible), `slack` (host slack) or `host` (explained by the host shift).
    pub fn discount(&self) -> Option<&'static str> {
        if self.negligible {
            Some("small")
        } else if self.host_slack && self.verdict != Verdict::Unchanged {
            Some("slack")
        } else if self.explained_by_host {
            Some("host")
        } else {
            None
        }
    }
}

/// Most CPU sections moved together.
#[derive(Debug, Clone, Serialize)]
pub struct HostShift {
    /// The median ratio B/A of the CPU sections.
    pub factor: f64,
    /// CPU sections within HOST_SPREAD of the factor, out of `of`.
    pub sections: usize,
    pub of: usize,
}

type Samples = BTreeMap<(String, Clock), Vec<f64>>;

/// A section's summed duration in one step (a row of `queries::per_step_sections`).
#[derive(Deserialize)]
struct StepSection {
    name: String,
    kind: Clock,
    dur_us: Option<f64>,
}

/// Per-step durations of every section.
pub fn samples(trace: &Trace) -> PolarsResult<Samples> {
    let df = q::per_step_sections(trace.spans.clone().lazy()).collect()?;
    let mut out: Samples = BTreeMap::new();
    for s in rows::<StepSection>(&df)? {
        if let Some(d) = s.dur_us {
            out.entry((s.name, s.kind)).or_default().push(d);
        }
    }
    Ok(out)
}

/// A CPU section that is host work: queue waits measure the other side.
fn is_host_work(s: &SectionCompare) -> bool {
    s.kind == Clock::Cpu && !dflash::is_queue(&s.name)
}

fn judge(p_adj: f64, lo: f64, hi: f64, o: &CompareOptions) -> Verdict {
    if p_adj < o.alpha && lo > 1.0 + o.noise {
        Verdict::Regression
    } else if p_adj < o.alpha && hi < 1.0 - o.noise {
        Verdict::Improvement
    } else {
        Verdict::Unchanged
    }
}

fn iterations(n: usize) -> usize {
    (4_000_000 / n.max(1)).clamp(200, BOOTSTRAP_ITERATIONS)
}

/// Ratio, interval and p-value of `b` against `a` scaled by `scale`.
fn test(a: &[f64], b: &[f64], scale: f64, seed: u64) -> Option<(f64, f64, f64, f64)> {
    let a: Vec<f64> = a.iter().map(|x| x * scale).collect();
    let ma = stats::median(&a)?;
    let mb = stats::median(b)?;
    if ma <= 0.0 {
        return None;
    }
    let (lo, hi) =
        stats::bootstrap_ratio_ci(&a, b, iterations(a.len().max(b.len())), CI_LEVEL, seed)?;
    let p = stats::mann_whitney(&a, b)?.p;
    Some((mb / ma, lo, hi, p))
}

/// Compares the samples of two runs (pure: no trace needed; used by tests).
pub fn compare_samples(
    a: &Samples,
    b: &Samples,
    o: &CompareOptions,
) -> (Vec<SectionCompare>, Option<HostShift>) {
    let keys: Vec<(String, Clock)> = a
        .keys()
        .chain(b.keys())
        .cloned()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let empty = Vec::new();
    let mut out: Vec<SectionCompare> = Vec::with_capacity(keys.len());
    let mut tested: Vec<(usize, f64)> = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let sa = a.get(key).unwrap_or(&empty);
        let sb = b.get(key).unwrap_or(&empty);
        let (ma, mb) = (stats::median(sa), stats::median(sb));
        let mut s = SectionCompare {
            name: key.0.clone(),
            kind: key.1,
            verdict: Verdict::Insufficient,
            ratio: match (ma, mb) {
                (Some(x), Some(y)) if x > 0.0 => Some(y / x),
                _ => None,
            },
            ci_low: None,
            ci_high: None,
            p_value: None,
            p_adjusted: None,
            n_a: sa.len(),
            n_b: sb.len(),
            median_a_us: ma,
            median_b_us: mb,
            relative_ratio: None,
            relative_verdict: None,
            explained_by_host: false,
            side: None,
            negligible: false,
            host_slack: false,
        };
        if sa.len() >= MIN_SAMPLES && sb.len() >= MIN_SAMPLES {
            if let Some((r, lo, hi, p)) = test(sa, sb, 1.0, o.seed.wrapping_add(i as u64)) {
                s.ratio = Some(r);
                s.ci_low = Some(lo);
                s.ci_high = Some(hi);
                s.p_value = Some(p);
                tested.push((i, p));
            }
        }
        out.push(s);
    }
    // Holm over every judged section.
    let adj = stats::holm(&tested.iter().map(|t| t.1).collect::<Vec<_>>());
    for (&(i, _), pa) in tested.iter().zip(adj) {
        let s = &mut out[i];
        s.p_adjusted = Some(pa);
        s.verdict = judge(pa, s.ci_low.unwrap_or(1.0), s.ci_high.unwrap_or(1.0), o);
    }

    // A host shift: most CPU sections (queue waits aside: they measure the other side)
    // moved by about the same factor; then every section is judged relative to it.
    let host_work: Vec<usize> = tested
        .iter()
        .map(|t| t.0)
        .filter(|&i| is_host_work(&out[i]))
        .collect();
    let host = host_shift(&out, &host_work, o);
    if let Some(h) = &host {
        judge_relative(&mut out, &host_work, (a, b), h, o);
    }
    (out, host)
}

/// The host shift, if the CPU sections `cpu` (host work, tested) moved together.
fn host_shift(out: &[SectionCompare], cpu: &[usize], o: &CompareOptions) -> Option<HostShift> {
    let ratios: Vec<f64> = cpu.iter().filter_map(|&i| out[i].ratio).collect();
    stats::median(&ratios).and_then(|m| {
        let close = ratios
            .iter()
            .filter(|r| (*r / m - 1.0).abs() <= HOST_SPREAD)
            .count();
        let moved = cpu
            .iter()
            .filter(|&&i| out[i].verdict != Verdict::Unchanged)
            .count();
        (ratios.len() >= HOST_MIN_SECTIONS
            && (m - 1.0).abs() > o.noise
            && close as f64 >= HOST_MAJORITY * ratios.len() as f64
            && moved as f64 >= HOST_MAJORITY * ratios.len() as f64)
            .then_some(HostShift {
                factor: m,
                sections: close,
                of: ratios.len(),
            })
    })
}

/// Relative to the host factor: the CPU sections `cpu` (host work, tested) tested again
/// against A scaled by it; queue waits that moved by about the factor are explained by it.
fn judge_relative(
    out: &mut [SectionCompare],
    cpu: &[usize],
    (a, b): (&Samples, &Samples),
    h: &HostShift,
    o: &CompareOptions,
) {
    let mut rel: Vec<(usize, f64, f64, f64, f64)> = Vec::new();
    for &i in cpu {
        let key = (out[i].name.clone(), out[i].kind);
        let (sa, sb) = (&a[&key], &b[&key]);
        if let Some((r, lo, hi, p)) = test(sa, sb, h.factor, o.seed.wrapping_add(1000 + i as u64)) {
            rel.push((i, r, lo, hi, p));
        }
    }
    let adj = stats::holm(&rel.iter().map(|t| t.4).collect::<Vec<_>>());
    for (&(i, r, lo, hi, _), pa) in rel.iter().zip(adj) {
        let s = &mut out[i];
        let v = judge(pa, lo, hi, o);
        s.relative_ratio = Some(r);
        s.relative_verdict = Some(v);
        s.explained_by_host = s.verdict != Verdict::Unchanged && v == Verdict::Unchanged;
    }
    // Queue waits are not host work, but they stretch with the side they wait for:
    // one that moved by about the host factor is explained by it.
    for s in out
        .iter_mut()
        .filter(|s| s.kind == Clock::Cpu && dflash::is_queue(&s.name))
    {
        if let (Some(r), Verdict::Regression | Verdict::Improvement) = (s.ratio, s.verdict) {
            if (r / h.factor - 1.0).abs() <= HOST_SPREAD {
                s.relative_ratio = Some(r / h.factor);
                s.explained_by_host = true;
            }
        }
    }
}

/// A regression that the host shift does not account for (what `--fail-on-regression`
/// counts).
pub(crate) fn is_flagged_regression(s: &SectionCompare) -> bool {
    !s.host_slack
        && ((s.verdict == Verdict::Regression && !s.explained_by_host)
            || s.relative_verdict == Some(Verdict::Regression))
}

/// An improvement counted like a flagged regression.
pub(crate) fn is_flagged_improvement(s: &SectionCompare) -> bool {
    !s.host_slack
        && ((s.verdict == Verdict::Improvement && !s.explained_by_host)
            || s.relative_verdict == Some(Verdict::Improvement))
}

/// Turns the changes smaller than `floor_us` (absolute difference of medians) into
/// `unchanged`, marked `negligible`.
pub(crate) fn drop_negligible(sections: &mut [SectionCompare], floor_us: f64) {
    for s in sections.iter_mut() {
        let (Some(a), Some(b)) = (s.median_a_us, s.median_b_us) else {
            continue;
        };
        let changed = |v: Option<Verdict>| {
            matches!(v, Some(Verdict::Regression) | Some(Verdict::Improvement))
        };
        if (b - a).abs() < floor_us && (changed(Some(s.verdict)) || changed(s.relative_verdict)) {
            s.negligible = true;
            s.verdict = Verdict::Unchanged;
            if s.relative_verdict.is_some() {
                s.relative_verdict = Some(Verdict::Unchanged);
            }
            s.explained_by_host = false;
        }
    }
}

/// Marks the CPU sections whose changes are host slack (both runs GPU-bound): every CPU
/// section but the step (`drafter.step`, [`STEP_SECTION`]).
pub(crate) fn mark_host_slack(sections: &mut [SectionCompare]) {
    for s in sections
        .iter_mut()
        .filter(|s| s.kind == Clock::Cpu && !dflash::is_envelope(&s.name) && s.name != STEP_SECTION)
    {
        s.host_slack = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rng: &mut stats::SplitMix64, mean: f64, n: usize) -> Vec<f64> {
        (0..n).map(|_| mean * (0.03 * rng.normal()).exp()).collect()
    }

    fn runs(shift: &dyn Fn(&str) -> f64, seed_b: u64) -> (Samples, Samples) {
        let names = ["x.a", "x.b", "x.c", "x.d", "x.e", "x.f"];
        let mut ra = stats::SplitMix64::new(1);
        let mut rb = stats::SplitMix64::new(seed_b);
        let mut a = Samples::new();
        let mut b = Samples::new();
        for (k, n) in names.iter().enumerate() {
            let mean = 100.0 * (k + 1) as f64;
            a.insert((n.to_string(), Clock::Cpu), sample(&mut ra, mean, 30));
            b.insert(
                (n.to_string(), Clock::Cpu),
                sample(&mut rb, mean * shift(n), 30),
            );
            a.insert((n.to_string(), Clock::Gpu), sample(&mut ra, mean, 30));
            b.insert((n.to_string(), Clock::Gpu), sample(&mut rb, mean, 30));
        }
        (a, b)
    }

    #[test]
    fn one_section_shift_is_flagged_alone() {
        let (a, b) = runs(&|n| if n == "x.c" { 1.2 } else { 1.0 }, 2);
        let (s, host) = compare_samples(&a, &b, &CompareOptions::default());
        assert!(host.is_none());
        let flagged: Vec<_> = s
            .iter()
            .filter(|s| s.verdict != Verdict::Unchanged)
            .map(|s| (&s.name[..], s.kind.as_str()))
            .collect();
        assert_eq!(flagged, vec![("x.c", "cpu")]);
    }

    #[test]
    fn host_shift_is_one_finding() {
        let (a, b) = runs(&|_| 1.5, 2);
        let (s, host) = compare_samples(&a, &b, &CompareOptions::default());
        let h = host.expect("a host shift");
        assert!((h.factor - 1.5).abs() < 0.05, "{}", h.factor);
        assert!(s
            .iter()
            .filter(|s| s.kind == "cpu")
            .all(|s| s.explained_by_host));
        assert!(s.iter().all(|s| !is_flagged_regression(s)));
    }

    #[test]
    fn changes_below_the_floor_are_negligible_and_slack_spares_the_step() {
        // Both sections 20% slower: 100 -> 120 us and 600 -> 720 us at the median.
        let (a, b) = runs(&|n| if n == "x.a" || n == "x.f" { 1.2 } else { 1.0 }, 2);
        let (mut s, _) = compare_samples(&a, &b, &CompareOptions::default());
        let get = |s: &[SectionCompare], n: &str| {
            s.iter()
                .find(|x| x.name == n && x.kind == "cpu")
                .unwrap()
                .clone()
        };
        assert_eq!(get(&s, "x.a").verdict, Verdict::Regression);
        assert_eq!(get(&s, "x.f").verdict, Verdict::Regression);
        // A floor of 50 us: x.a moved by about 20 us, x.f by about 120 us.
        drop_negligible(&mut s, 50.0);
        let (xa, xf) = (get(&s, "x.a"), get(&s, "x.f"));
        assert!(xa.negligible && xa.verdict == Verdict::Unchanged, "{xa:?}");
        assert!(
            !xf.negligible && xf.verdict == Verdict::Regression,
            "{xf:?}"
        );
        assert!(is_flagged_regression(&xf));
        // Host slack: every CPU section but the step envelope, no GPU section.
        s.push(SectionCompare {
            name: dflash::DRAFTER_STEP.into(),
            ..xf.clone()
        });
        mark_host_slack(&mut s);
        for x in &s {
            let want = x.kind == Clock::Cpu && x.name != dflash::DRAFTER_STEP;
            assert_eq!(x.host_slack, want, "{}", x.name);
        }
        assert!(!is_flagged_regression(&get(&s, "x.f")));
        assert!(is_flagged_regression(s.last().unwrap()));
    }

    #[test]
    fn few_samples_are_insufficient() {
        let mut a = Samples::new();
        let mut b = Samples::new();
        a.insert(("x".into(), Clock::Cpu), vec![1.0, 2.0, 3.0]);
        b.insert(("x".into(), Clock::Cpu), vec![10.0, 20.0, 30.0]);
        let (s, _) = compare_samples(&a, &b, &CompareOptions::default());
        assert_eq!(s[0].verdict, Verdict::Insufficient);
    }
}
