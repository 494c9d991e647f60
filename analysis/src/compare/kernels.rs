//! The kernel side of a comparison, for traces with kernels: how the kernel time per step
//! changed and which kernels moved, whether a GPU section that moved with a slower (or
//! faster) host is explained by it, and whether each flagged change is the host's or the
//! device's.

use std::collections::BTreeMap;

use chrome_trace_format::Clock;
use serde::Serialize;

use super::sections::{
    is_flagged_improvement, is_flagged_regression, HostShift, SectionCompare, Verdict, HOST_SPREAD,
};
use crate::breakdown::Breakdown;
use crate::kernels::KernelView;

/// How the kernel time per step changed.
#[derive(Debug, Clone, Serialize)]
pub struct KernelChange {
    pub a_us_per_step: f64,
    pub b_us_per_step: f64,
    pub ratio: f64,
    /// Whether it changed beyond [`KERNEL_MOVE`].
    pub changed: bool,
    /// Kernels whose time per step moved beyond [`KERNEL_MOVE`] by at least
    /// [`KERNEL_MIN_SHARE`] of A's kernel time, by how much they moved.
    pub moved: Vec<KernelMove>,
}

#[derive(Debug, Clone, Serialize)]
pub struct KernelMove {
    pub name: String,
    pub a_us_per_step: f64,
    pub b_us_per_step: f64,
    /// B over A; infinite for a kernel new in B.
    pub ratio: f64,
}

/// The row of the kernels' GPU busy time per step (of the work each step launched),
/// judged like a section in traces with kernels.
pub const KERNEL_SECTION: &str = "kernels (GPU busy per step)";

/// Kernel time per step (of a name, of a section, of the whole step) changed when its
/// ratio leaves 1 +- this (kernel times are steady: a few percent is real).
pub const KERNEL_MOVE: f64 = 0.05;
/// ... and when the change is at least this share of A's kernel time per step.
pub const KERNEL_MIN_SHARE: f64 = 0.01;

/// Kernel busy time per step of section `name` in a breakdown, if it has kernels.
fn section_kernel_us(b: &Breakdown, name: &str) -> Option<f64> {
    let k = b.kernels.as_ref()?;
    let steps = b.steps.count.max(1) as f64;
    Some(
        k.sections
            .iter()
            .find(|s| s.name == name)
            .map_or(0.0, |s| s.kernel_busy_us / steps),
    )
}

/// Whether a kernel time per step moved: beyond [`KERNEL_MOVE`] and by at least
/// [`KERNEL_MIN_SHARE`] of `scale`.
fn kernel_moved(a: f64, b: f64, scale: f64) -> bool {
    (b - a).abs() > KERNEL_MOVE * a.max(1e-9) && (b - a).abs() >= KERNEL_MIN_SHARE * scale
}

pub(crate) fn kernel_change(ba: &Breakdown, bb: &Breakdown) -> Option<KernelChange> {
    let (ka, kb) = (ba.kernels.as_ref()?, bb.kernels.as_ref()?);
    let (sa, sb) = (ba.steps.count.max(1) as f64, bb.steps.count.max(1) as f64);
    let (a, b) = (ka.kernel_us / sa, kb.kernel_us / sb);
    let per = |k: &KernelView, s: f64| -> BTreeMap<String, f64> {
        k.by_name
            .iter()
            .map(|r| (r.name.clone(), r.total_us / s))
            .collect()
    };
    let (na, nb) = (per(ka, sa), per(kb, sb));
    let mut moved: Vec<KernelMove> = na
        .keys()
        .chain(nb.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|name| {
            let (x, y) = (
                na.get(name).copied().unwrap_or(0.0),
                nb.get(name).copied().unwrap_or(0.0),
            );
            kernel_moved(x, y, a).then(|| KernelMove {
                name: name.clone(),
                a_us_per_step: x,
                b_us_per_step: y,
                ratio: if x > 0.0 { y / x } else { f64::INFINITY },
            })
        })
        .collect();
    moved.sort_by(|x, y| {
        (y.b_us_per_step - y.a_us_per_step)
            .abs()
            .total_cmp(&(x.b_us_per_step - x.a_us_per_step).abs())
    });
    Some(KernelChange {
        a_us_per_step: a,
        b_us_per_step: b,
        ratio: if a > 0.0 { b / a } else { f64::NAN },
        changed: kernel_moved(a, b, a),
        moved,
    })
}

/// With a host shift, a GPU section that moved is explained by it when the same section
/// on the CPU is, and it moved no more than the host: its span stretched with slower
/// launches. With kernels, only when the kernels it launched did not move.
pub(crate) fn explain_gpu_by_host(
    out: &mut [SectionCompare],
    h: &HostShift,
    ba: &Breakdown,
    bb: &Breakdown,
) {
    let cpu_explained: Vec<String> = out
        .iter()
        .filter(|s| {
            s.kind == Clock::Cpu && s.relative_verdict.is_some_and(|v| v == Verdict::Unchanged)
        })
        .map(|s| s.name.clone())
        .collect();
    for s in out.iter_mut().filter(|s| s.kind == Clock::Gpu) {
        let (Some(r), Verdict::Regression | Verdict::Improvement) = (s.ratio, s.verdict) else {
            continue;
        };
        let within = if h.factor >= 1.0 {
            r <= h.factor * (1.0 + HOST_SPREAD)
        } else {
            r >= h.factor * (1.0 - HOST_SPREAD)
        };
        let kernels_still = match (
            section_kernel_us(ba, &s.name),
            section_kernel_us(bb, &s.name),
        ) {
            (Some(a), Some(b)) => !kernel_moved(a, b, a),
            _ => true,
        };
        if within && kernels_still && cpu_explained.contains(&s.name) {
            s.relative_ratio = Some(r / h.factor);
            s.explained_by_host = true;
        }
    }
}

/// Says for each flagged change whether the device (the kernels it launched moved) or
/// the host made it.
pub(crate) fn attribute_sides(out: &mut [SectionCompare], ba: &Breakdown, bb: &Breakdown) {
    for s in out.iter_mut() {
        let flagged = is_flagged_regression(s) || is_flagged_improvement(s);
        if !flagged {
            continue;
        }
        if s.name == KERNEL_SECTION {
            s.side = Some("device");
            continue;
        }
        s.side = match (
            section_kernel_us(ba, &s.name),
            section_kernel_us(bb, &s.name),
        ) {
            (Some(a), Some(b)) if kernel_moved(a, b, a) => Some("device"),
            (Some(_), Some(_)) => Some("host"),
            _ => Some(match s.kind {
                Clock::Cpu => "host",
                Clock::Gpu => "device",
            }),
        };
    }
}
