//! Turns a breakdown into sentences: who waits on whom, which sections are launch-bound,
//! how idle the GPU is, what dominates a step. Each rule has a named threshold
//! ([`crate::thresholds`]); findings are ordered by the share of step time they concern.
//! What bounds a step is [`crate::bound`]'s.

use chrome_trace_format::{dflash, Clock};

use crate::breakdown::tables::Breakdown;
pub use crate::breakdown::tables::Finding;
use crate::thresholds::{
    pct, GPU_IDLE_SHARE, LAUNCH_BOUND_RATIO, MIN_SECTION_SHARE, QUEUE_WAIT_SHARE, TOP_SECTIONS,
    UNEVEN_STEPS,
};

fn component(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

pub fn findings(b: &Breakdown) -> Vec<Finding> {
    let mut out = Vec::new();
    queue_waits(b, &mut out);
    if b.kernels.is_some() {
        // Kernels say what bounds the step; the CPU/GPU ratio of sections misleads when
        // another thread (autograd's) launches a section's kernels.
        crate::bound::bound(b, &mut out);
    } else {
        crate::bound::pipeline(b, &mut out);
        launch_bound(b, &mut out);
    }
    gpu_idle(b, &mut out);
    top_sections(b, &mut out);
    uneven_steps(b, &mut out);
    // What bounds the step first, then the other diagnoses, then what dominates; each
    // group by share.
    let rank = |f: &Finding| match f.rule {
        r if crate::bound::RULES.contains(&r) => 0,
        "top_section" => 2,
        _ => 1,
    };
    out.sort_by(|x, y| rank(x).cmp(&rank(y)).then(y.share.total_cmp(&x.share)));
    out
}

/// 1. Who waits on whom.
fn queue_waits(b: &Breakdown, out: &mut Vec<Finding>) {
    for q in &b.queue {
        if q.share < QUEUE_WAIT_SHARE {
            continue;
        }
        let text = match q.name.as_str() {
            dflash::QUEUE_GET => format!(
                "drafter waits on the queue {} of the step (queue.get, {:.0} us per step at the median): the target side is the bottleneck",
                pct(q.share),
                q.wait_p50_us
            ),
            dflash::QUEUE_PUT => format!(
                "target waits on a full queue {} of the step time (queue.put): the drafter is the bottleneck",
                pct(q.share)
            ),
            other => format!("{other} waits {} of the step time", pct(q.share)),
        };
        out.push(Finding {
            rule: "queue_wait",
            subject: Some(q.name.clone()),
            share: q.share,
            text,
        });
    }
    if let Some(d) = &b.queue_depth {
        if d.empty_share >= 0.5
            && b.queue
                .iter()
                .any(|q| q.name == dflash::QUEUE_GET && q.share >= QUEUE_WAIT_SHARE)
        {
            out.push(Finding {
                rule: "queue_empty",
                subject: Some(dflash::QUEUE_COUNTER.into()),
                share: 0.0,
                text: format!(
                    "the queue is empty at {} of its samples (mean depth {:.1}): the producer cannot keep it filled",
                    pct(d.empty_share),
                    d.mean
                ),
            });
        }
    }
}

/// 2. Launch-bound sections: CPU time well above GPU time.
fn launch_bound(b: &Breakdown, out: &mut Vec<Finding>) {
    let step_total = b.steps.total_us;
    for cg in &b.cpu_gpu {
        let share = if step_total > 0.0 {
            cg.cpu_total_us / step_total
        } else {
            0.0
        };
        if cg.cpu_over_gpu.is_finite()
            && cg.cpu_over_gpu >= LAUNCH_BOUND_RATIO
            && share >= MIN_SECTION_SHARE
        {
            out.push(Finding {
                rule: "launch_bound",
                subject: Some(cg.name.clone()),
                share,
                text: format!(
                    "{} CPU time is {:.1}x its GPU time: launch-bound (the host spends {:.0} us per step beyond the GPU work: kernel launches, host syncs or allocation on the {} side)",
                    cg.name,
                    cg.cpu_over_gpu,
                    cg.gap_us / b.steps.count.max(1) as f64,
                    component(&cg.name)
                ),
            });
        }
    }
}

/// 3. GPU idle inside steps.
fn gpu_idle(b: &Breakdown, out: &mut Vec<Finding>) {
    if let Some(idle) = b.steps.gpu_idle_share {
        if idle >= GPU_IDLE_SHARE {
            out.push(Finding {
                rule: "gpu_idle",
                subject: None,
                share: idle,
                text: format!(
                    "the GPU is idle {} of the step time: the step is bound by the host or by waiting, not by GPU compute",
                    pct(idle)
                ),
            });
        }
    }
}

/// 4. What dominates a step.
fn top_sections(b: &Breakdown, out: &mut Vec<Finding>) {
    let mut top: Vec<_> = b
        .sections
        .iter()
        .filter(|s| s.top_level && s.kind == Clock::Cpu && !dflash::is_queue(&s.name))
        .collect();
    top.sort_by(|x, y| y.share.total_cmp(&x.share));
    for s in top.into_iter().take(TOP_SECTIONS) {
        if s.share < MIN_SECTION_SHARE {
            break;
        }
        // With kernels, the GPU side of a section is the busy time of what it launched
        // (a Kineto GPU annotation misses what autograd's thread launched for it).
        let gpu = match &b.kernels {
            Some(k) => k.sections.iter().find(|g| g.name == s.name).map(|g| {
                format!(
                    " (its kernels keep the GPU busy {:.0} us per step)",
                    g.kernel_busy_us / b.steps.count.max(1) as f64
                )
            }),
            None => b
                .sections
                .iter()
                .find(|g| g.name == s.name && g.kind == Clock::Gpu)
                .map(|g| format!(" (GPU {})", pct(g.share))),
        }
        .unwrap_or_default();
        out.push(Finding {
            rule: "top_section",
            subject: Some(s.name.clone()),
            share: s.share,
            text: format!(
                "{} takes {} of the step time on the CPU{gpu}, p50 {:.0} us",
                s.name,
                pct(s.share),
                s.p50_us
            ),
        });
    }
}

/// 5. Uneven steps.
fn uneven_steps(b: &Breakdown, out: &mut Vec<Finding>) {
    if b.steps.count >= 5 && b.steps.p50_us > 0.0 && b.steps.p95_us / b.steps.p50_us >= UNEVEN_STEPS
    {
        let slowest = b
            .per_step
            .iter()
            .max_by(|x, y| x.dur_us.total_cmp(&y.dur_us));
        out.push(Finding {
            rule: "uneven_steps",
            subject: None,
            share: 0.0,
            text: format!(
                "step time is uneven: p95 is {:.1}x the median{}",
                b.steps.p95_us / b.steps.p50_us,
                slowest
                    .map(|s| format!(" (step {} took {:.1} ms)", s.step, s.dur_us / 1000.0))
                    .unwrap_or_default()
            ),
        });
    }
}
