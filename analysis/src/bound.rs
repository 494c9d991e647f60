//! What bounds a step, for traces with kernels: the GPU (a stream busy most of the step),
//! the host's launches (many short kernels, each launch longer than the kernel), host
//! syncs (the host waits, the GPU idles between), the allocator (device allocations and
//! frees inside the step) or the input (a section that launches nothing while the GPU
//! idles). One finding, the bound with the largest share, with its evidence in numbers.
//! The thresholds are in [`crate::thresholds`].

use chrome_trace_format::{dflash, Clock};

use crate::breakdown::tables::{Breakdown, Finding, Section};
use crate::kernels::KernelView;
use crate::thresholds::{
    pct, ALLOC_BOUND_SHARE, FREQUENT_SYNCS, GPU_BOUND_BUSY, HOST_BOUND_IDLE, INPUT_BOUND_SHARE,
    INPUT_GPU_SHARE, KERNELS_PER_SYNC, LAUNCH_BOUND_SHARE, LAUNCH_OVER_KERNEL, QUEUE_WAIT_SHARE,
    SYNC_BOUND_SHARE,
};

/// The rules of this module, named by the bound they find.
pub const RULES: [&str; 6] = [
    "gpu_bound",
    "sync_bound",
    "allocator_bound",
    "launch_bound",
    "input_bound",
    "host_bound",
];

/// What bounds the run's step: the rule of its bound finding (one of [`RULES`]) and the
/// side it concerns (`drafter`, `target`, or none for a single-stream trace).
pub fn bound_of(b: &Breakdown) -> Option<(&'static str, Option<&str>)> {
    b.findings
        .iter()
        .find(|f| RULES.contains(&f.rule))
        .map(|f| (f.rule, f.subject.as_deref()))
}

/// A candidate bound: rule, share of step time, text.
type Candidate = (&'static str, f64, String);

fn per_step(x: f64, steps: f64) -> f64 {
    x / steps
}

/// The CPU sections that no other section encloses (envelopes and queue waits aside).
fn outer_cpu<'a>(b: &'a Breakdown, k: &'a KernelView) -> impl Iterator<Item = &'a Section> {
    b.sections.iter().filter(|s| {
        s.kind == Clock::Cpu
            && !s.operator
            && k.outer_sections.contains(&s.name)
            && !dflash::is_queue(&s.name)
            && !dflash::ENVELOPES.contains(&s.name.as_str())
            && s.share.is_finite()
    })
}

/// The longest outer CPU section that launched almost no GPU work and waited for none.
fn idle_input<'a>(b: &'a Breakdown, k: &'a KernelView) -> Option<(&'a str, f64)> {
    outer_cpu(b, k)
        .filter(|s| {
            let g = k.sections.iter().find(|g| g.name == s.name);
            g.is_none_or(|g| {
                g.launch_us + g.sync_us + g.alloc_us + g.kernel_busy_us
                    < INPUT_GPU_SHARE * s.total_us
            })
        })
        .filter(|s| s.share.is_finite())
        .max_by(|x, y| x.share.total_cmp(&y.share))
        .map(|s| (s.name.as_str(), s.share))
}

/// Pushes the finding that names the step's bound, when one stands out.
pub fn bound(b: &Breakdown, out: &mut Vec<Finding>) {
    let Some(k) = &b.kernels else { return };
    let total = b.steps.total_us;
    if total <= 0.0 || b.steps.count == 0 {
        return;
    }
    let steps = b.steps.count as f64;
    let share = |us: f64| (us / total).min(1.0);
    // What the steps launched keeps the GPU busy this long (it runs behind the host, so
    // not the busy time inside each step's window).
    let busy = if k.step_busy_us > 0.0 {
        share(k.step_busy_us)
    } else {
        b.steps
            .gpu_idle_share
            .map(|idle| 1.0 - idle)
            .unwrap_or_else(|| share(k.gpu_busy_us))
    }
    .clamp(0.0, 1.0);
    let idle = 1.0 - busy;
    let mean_kernel = k.kernel_us / k.kernels.max(1) as f64;
    let mean_launch = k.launch.us / k.launch.calls.max(1) as f64;

    let chosen: Option<Candidate> = if busy >= GPU_BOUND_BUSY {
        Some(gpu_bound(k, busy, steps))
    } else {
        let mut c: Vec<Candidate> = Vec::new();
        let sync = share(k.sync.us);
        let syncs = per_step(k.sync.calls as f64, steps);
        let draining =
            syncs >= FREQUENT_SYNCS && (k.kernels as f64) < KERNELS_PER_SYNC * k.sync.calls as f64;
        if sync >= SYNC_BOUND_SHARE || draining {
            c.push((
                "sync_bound",
                if draining { sync.max(idle) } else { sync },
                format!(
                    "sync-bound: {:.0} host syncs per step ({:.1} kernels between two) wait {:.0} us per step ({} of the step) and the GPU is idle {} of it; each sync drains the GPU's queue (`.item()`, `.cpu()`, `torch.cuda.synchronize()`)",
                    syncs,
                    k.kernels as f64 / k.sync.calls.max(1) as f64,
                    per_step(k.sync.us, steps),
                    pct(sync),
                    pct(idle)
                ),
            ));
        }
        let alloc = share(k.alloc.us + k.free.us);
        if alloc >= ALLOC_BOUND_SHARE {
            c.push((
                "allocator_bound",
                alloc,
                format!(
                    "allocator-bound: {:.0} device allocations and frees per step take {:.0} us per step ({} of the step); the caching allocator goes to cudaMalloc/cudaFree (`empty_cache()`, fragmentation, changing shapes)",
                    per_step((k.alloc.calls + k.free.calls) as f64, steps),
                    per_step(k.alloc.us + k.free.us, steps),
                    pct(alloc)
                ),
            ));
        }
        let launch = share(k.launch.us);
        if launch >= LAUNCH_BOUND_SHARE && mean_kernel < LAUNCH_OVER_KERNEL * mean_launch {
            c.push((
                "launch_bound",
                launch,
                format!(
                    "launch-bound: {:.0} launches per step take {:.0} us of host time per step ({} of the step); kernels last {:.1} us on average against {:.1} us per launch, so the GPU is idle {} of the step (fuse kernels, CUDA graphs, torch.compile)",
                    per_step(k.launch.calls as f64, steps),
                    per_step(k.launch.us, steps),
                    pct(launch),
                    mean_kernel,
                    mean_launch,
                    pct(idle)
                ),
            ));
        }
        if let Some((name, s)) = idle_input(b, k) {
            if s >= INPUT_BOUND_SHARE {
                c.push((
                    "input_bound",
                    s,
                    format!(
                        "input-bound: {name} takes {} of the step time and launches no GPU work; the GPU is idle {} of the step (prefetch the input, more loader workers, pinned memory)",
                        pct(s),
                        pct(idle)
                    ),
                ));
            }
        }
        if c.is_empty() && idle >= HOST_BOUND_IDLE {
            c.push(host_heavy(b, k).unwrap_or_else(|| host_overall(b, k, idle)));
        }
        c.into_iter().max_by(|x, y| x.1.total_cmp(&y.1))
    };
    if let Some((rule, share, text)) = chosen {
        out.push(Finding {
            rule,
            subject: None,
            share,
            text,
        });
    }
}

/// The GPU-bound candidate: the GPU is busy `busy` of the step time with the work the
/// steps launched; the busiest streams and the kernels as evidence, counting only the
/// kernels the steps launched when the trace says which (see [`StreamBusy`]).
///
/// [`StreamBusy`]: crate::kernels::StreamBusy
fn gpu_bound(k: &KernelView, busy: f64, steps: f64) -> Candidate {
    let in_steps = k.streams.iter().any(|s| s.step_kernels > 0);
    let of = |s: &crate::kernels::StreamBusy| {
        if in_steps {
            (s.step_kernels, s.step_busy_us)
        } else {
            (s.kernels, s.busy_us)
        }
    };
    let mut streams: Vec<(i64, i64, u64, f64)> = k
        .streams
        .iter()
        .map(|s| {
            let (n, us) = of(s);
            (s.pid, s.tid, n, us)
        })
        .collect();
    streams.sort_by(|a, b| b.3.total_cmp(&a.3).then((a.0, a.1).cmp(&(b.0, b.1))));
    let kernels = if in_steps {
        streams.iter().map(|s| s.2).sum()
    } else {
        k.kernels
    };
    // the mean over every kernel of the trace (the steps' are a sample of the same work)
    let mean_kernel = k.kernel_us / k.kernels.max(1) as f64;
    let text: Vec<String> = streams
        .iter()
        .take(3)
        .map(|&(pid, tid, _, us)| {
            format!(
                "GPU {} stream {} {:.2} ms",
                pid,
                tid,
                per_step(us, steps) / 1000.0
            )
        })
        .collect();
    (
        "gpu_bound",
        busy,
        format!(
            "GPU-bound: the work each step launches keeps the GPU busy {} of the step time (busy per step: {}; {:.0} kernels per step, {:.0} us each on average); the host waits for it, so faster kernels (or less work) speed the step up",
            pct(busy),
            text.join(", "),
            per_step(kernels as f64, steps),
            mean_kernel
        ),
    )
}

/// The outer section whose host time most exceeds the GPU work it launched, as the
/// host-bound candidate.
fn host_heavy(b: &Breakdown, k: &KernelView) -> Option<Candidate> {
    let steps = b.steps.count.max(1) as f64;
    let total = b.steps.total_us;
    let (s, g, excess) = outer_cpu(b, k)
        .map(|s| {
            let g = k.sections.iter().find(|g| g.name == s.name);
            let busy = g.map_or(0.0, |g| g.kernel_busy_us);
            (s, g, s.total_us - busy)
        })
        .max_by(|x, y| x.2.total_cmp(&y.2))?;
    let share = (excess / total).min(1.0);
    if share < HOST_BOUND_IDLE {
        return None;
    }
    Some((
        "host_bound",
        share,
        format!(
            "host-bound: {} takes {:.0} us per step on the CPU but its kernels keep the GPU busy only {:.0} us ({} launches, {} syncs per step); the host, not the GPU, sets the pace (Python and operator overhead: torch.compile, CUDA graphs, larger kernels)",
            s.name,
            s.total_us / steps,
            g.map_or(0.0, |g| g.kernel_busy_us) / steps,
            g.map_or(0.0, |g| g.launches as f64 / steps).round(),
            g.map_or(0.0, |g| g.syncs as f64 / steps).round(),
        ),
    ))
}

/// The host-bound candidate when no user section stands out (a compiled model): the idle
/// GPU and what the host spends per step, with the longest outer operator.
fn host_overall(b: &Breakdown, k: &KernelView, idle: f64) -> Candidate {
    let steps = b.steps.count.max(1) as f64;
    let op = b
        .sections
        .iter()
        .filter(|s| s.operator && s.kind == Clock::Cpu && s.top_level)
        .max_by(|x, y| x.total_us.total_cmp(&y.total_us))
        .map(|s| {
            format!(
                "; the longest outer operator is {} ({:.0} us per step)",
                s.name,
                s.total_us / steps
            )
        })
        .unwrap_or_default();
    (
        "host_bound",
        idle,
        format!(
            "host-bound: the GPU is idle {} of the step while the host issues {:.0} launches per step ({:.0} us in launch calls) and {:.1} syncs ({:.0} us){op}; the host, not the GPU, sets the pace (CUDA graphs, fewer and larger kernels)",
            pct(idle),
            per_step(k.launch.calls as f64, steps),
            per_step(k.launch.us, steps),
            per_step(k.sync.calls as f64, steps),
            per_step(k.sync.us, steps),
        ),
    )
}

/// For a pipelined run without kernels in its trace (dflash's: target and drafter on
/// their own threads and streams, joined by the queue): which side is on the critical
/// path, and whether its GPU stream or its host work bounds it. The drafter is on it
/// unless it waits on the queue for input (then the target is).
pub fn pipeline(b: &Breakdown, out: &mut Vec<Finding>) {
    let side_of = |n: &str| {
        b.queue
            .iter()
            .find(|q| q.name == n)
            .map_or(0.0, |q| q.share)
    };
    if b.queue.is_empty() || b.steps.total_us <= 0.0 {
        return;
    }
    let (get, put) = (side_of(dflash::QUEUE_GET), side_of(dflash::QUEUE_PUT));
    let side = if get >= QUEUE_WAIT_SHARE && get >= put {
        "target"
    } else {
        "drafter"
    };
    let of_side = |clock: Clock| -> f64 {
        b.sections
            .iter()
            .filter(|s| s.kind == clock && s.top_level && s.share.is_finite())
            .filter(|s| !dflash::is_queue(&s.name) && !dflash::ENVELOPES.contains(&s.name.as_str()))
            .filter(|s| s.name.split('.').next() == Some(side))
            .map(|s| s.share)
            .sum::<f64>()
            .min(1.0)
    };
    let (gpu, cpu) = (of_side(Clock::Gpu), of_side(Clock::Cpu));
    let has_gpu = b.sections.iter().any(|s| s.kind == Clock::Gpu);
    let why = format!(
        "the {side} is on the critical path (the drafter waits on the queue {} of the step, the target on a full queue {})",
        pct(get),
        pct(put)
    );
    let idle = b
        .steps
        .gpu_idle_share
        .map(|i| format!("; the GPU is idle {} of the step", pct(i)))
        .unwrap_or_default();
    let (rule, share, text) = if gpu >= GPU_BOUND_BUSY {
        (
            "gpu_bound",
            gpu,
            format!(
                "GPU-bound on the {side}'s stream: {why}, and its GPU sections take {} of the step{idle}",
                pct(gpu)
            ),
        )
    } else if cpu > 0.0 {
        // A run without GPU timing (a CPU run) has no GPU share to speak of.
        let gpu_part = if has_gpu {
            format!("its GPU sections take {} of the step, ", pct(gpu))
        } else {
            String::new()
        };
        (
            "host_bound",
            cpu,
            format!(
                "host-bound on the {side} side: {why}; {gpu_part}its CPU sections {}{idle}",
                pct(cpu)
            ),
        )
    } else {
        return;
    };
    out.push(Finding {
        rule,
        subject: Some(side.to_string()),
        share,
        text,
    });
}
