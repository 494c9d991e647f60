//! What Holistic Trace Analysis (HTA) reports for one rank, from the same kernels and
//! launches as the kernel view, so its users find their numbers here:
//!
//! - temporal breakdown per GPU: over the window from its first kernel's start to its last
//!   kernel's end, compute (kernels), non-compute (memory copies and sets, collectives) and
//!   idle time;
//! - idle-time breakdown per stream: each gap between two consecutive kernels is host wait
//!   (the next kernel was launched only after the previous one ended: the GPU waited for
//!   the host), kernel wait (launched before, and the gap is shorter than
//!   [`KERNEL_WAIT_US`]: the launch overhead between back-to-back kernels) or other (a
//!   dependency on another stream, an event wait);
//! - launch statistics: launch delay (kernel start minus the start of its launch call),
//!   short kernels (a kernel shorter than its launch call: the host cannot keep up);
//! - queue length per stream: kernels launched and not yet finished, over time.
//!
//! The memory timeline (allocator counters) is read from the counters frame, in
//! [`memory`].

use polars::prelude::*;
use rustc_hash::FxHashMap;

use crate::columns::Cols;

/// A gap shorter than this between a kernel and the next one, launched before the first
/// ended, is kernel wait (HTA's launch-overhead idle); longer, it is "other".
pub const KERNEL_WAIT_US: f64 = 30.0;

/// Temporal breakdown of one GPU.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Temporal {
    pub pid: i64,
    /// First kernel start to last kernel end.
    pub window_us: f64,
    pub compute_us: f64,
    /// Copies, sets and collectives, where no compute kernel runs.
    pub non_compute_us: f64,
    pub idle_us: f64,
}

/// Idle-time breakdown of one stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Idle {
    pub pid: i64,
    pub tid: i64,
    pub host_wait_us: f64,
    pub kernel_wait_us: f64,
    pub other_us: f64,
}

/// Launch statistics over every kernel with a launch.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Launches {
    pub kernels: u64,
    pub delay_p50_us: f64,
    pub delay_p95_us: f64,
    pub delay_max_us: f64,
    /// Kernels shorter than their launch call.
    pub short_kernels: u64,
    pub launch_p50_us: f64,
    pub kernel_p50_us: f64,
}

/// Queue length of one stream: kernels launched and not yet finished.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Queue {
    pub pid: i64,
    pub tid: i64,
    pub max: u64,
    /// Time-weighted, from the first launch to the last kernel end.
    pub mean: f64,
}

/// Everything of this module for one trace.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Hta {
    pub temporal: Vec<Temporal>,
    pub idle: Vec<Idle>,
    pub launches: Launches,
    pub queues: Vec<Queue>,
}

/// Copies, sets and collectives: GPU work that is not compute (HTA's "non-compute").
pub fn is_non_compute(name: &str) -> bool {
    name.starts_with("Memcpy")
        || name.starts_with("Memset")
        || name.starts_with("nccl")
        || name.contains("ncclKernel")
        || name.contains("ncclDevKernel")
}

/// A quantile of unsorted values (linear interpolation, as elsewhere in the analyzer).
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    crate::stats::quantile_sorted(v, q).unwrap_or(0.0)
}

/// Union length of intervals sorted by start.
fn union(iv: impl Iterator<Item = (f64, f64)>) -> f64 {
    let mut total = 0.0;
    let mut open: Option<(f64, f64)> = None;
    for (s, e) in iv {
        match &mut open {
            Some((_, oe)) if s <= *oe => *oe = oe.max(e),
            Some((os, oe)) => {
                total += *oe - *os;
                open = Some((s, e));
            }
            None => open = Some((s, e)),
        }
    }
    total + open.map_or(0.0, |(s, e)| e - s)
}

/// `kernels` are the kernel rows sorted by start; `launch_of` maps a correlation id to
/// its launch row.
pub(crate) fn hta(c: &Cols, kernels: &[usize], launch_of: &FxHashMap<u64, usize>) -> Hta {
    let launch = |k: usize| {
        c.corr[k]
            .and_then(|id| launch_of.get(&(id as u64)))
            .copied()
    };
    // Temporal, per device.
    let mut by_pid: FxHashMap<i64, Vec<usize>> = FxHashMap::default();
    let mut by_stream: FxHashMap<(i64, i64), Vec<usize>> = FxHashMap::default();
    for &k in kernels {
        by_pid.entry(c.pid[k]).or_default().push(k);
        by_stream.entry((c.pid[k], c.tid[k])).or_default().push(k);
    }
    let mut temporal: Vec<Temporal> = by_pid
        .iter()
        .map(|(&pid, ks)| {
            let start = ks.iter().map(|&k| c.ts[k]).fold(f64::MAX, f64::min);
            let end = ks.iter().map(|&k| c.end(k)).fold(f64::MIN, f64::max);
            let all = union(ks.iter().map(|&k| (c.ts[k], c.end(k))));
            let compute = union(
                ks.iter()
                    .filter(|&&k| !is_non_compute(c.name(k)))
                    .map(|&k| (c.ts[k], c.end(k))),
            );
            Temporal {
                pid,
                window_us: end - start,
                compute_us: compute,
                non_compute_us: all - compute,
                idle_us: (end - start) - all,
            }
        })
        .collect();
    temporal.sort_by_key(|t| t.pid);

    // Idle per stream, and queue length per stream.
    let mut idle = Vec::new();
    let mut queues = Vec::new();
    for (&(pid, tid), ks) in &by_stream {
        let mut row = Idle {
            pid,
            tid,
            host_wait_us: 0.0,
            kernel_wait_us: 0.0,
            other_us: 0.0,
        };
        let mut prev_end = f64::MIN;
        for &k in ks {
            let gap = c.ts[k] - prev_end;
            if prev_end > f64::MIN && gap > 0.0 {
                match launch(k) {
                    Some(l) if c.ts[l] >= prev_end => row.host_wait_us += gap,
                    _ if gap < KERNEL_WAIT_US => row.kernel_wait_us += gap,
                    _ => row.other_us += gap,
                }
            }
            prev_end = prev_end.max(c.end(k));
        }
        idle.push(row);
        // +1 at the launch, -1 at the kernel's end.
        let mut ev: Vec<(f64, i64)> = Vec::with_capacity(2 * ks.len());
        for &k in ks {
            if let Some(l) = launch(k) {
                ev.push((c.ts[l], 1));
                ev.push((c.end(k), -1));
            }
        }
        ev.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let (mut n, mut max, mut area) = (0i64, 0i64, 0.0);
        for w in ev.windows(2) {
            n += w[0].1;
            max = max.max(n);
            area += n as f64 * (w[1].0 - w[0].0);
        }
        let span = match (ev.first(), ev.last()) {
            (Some(a), Some(b)) if b.0 > a.0 => b.0 - a.0,
            _ => 0.0,
        };
        queues.push(Queue {
            pid,
            tid,
            max: max.max(0) as u64,
            mean: if span > 0.0 { area / span } else { 0.0 },
        });
    }
    idle.sort_by_key(|r| (r.pid, r.tid));
    queues.sort_by_key(|q| (q.pid, q.tid));

    // Launch statistics.
    let mut delays = Vec::new();
    let mut launch_durs = Vec::new();
    let mut kernel_durs = Vec::new();
    let mut short = 0;
    for &k in kernels {
        let Some(l) = launch(k) else { continue };
        delays.push(c.ts[k] - c.ts[l]);
        launch_durs.push(c.dur[l]);
        kernel_durs.push(c.dur[k]);
        if c.dur[k] < c.dur[l] {
            short += 1;
        }
    }
    let launches = Launches {
        kernels: delays.len() as u64,
        delay_max_us: delays.iter().copied().fold(0.0, f64::max),
        delay_p50_us: quantile(&mut delays, 0.5),
        delay_p95_us: quantile(&mut delays, 0.95),
        short_kernels: short,
        launch_p50_us: quantile(&mut launch_durs, 0.5),
        kernel_p50_us: quantile(&mut kernel_durs, 0.5),
    };
    Hta {
        temporal,
        idle,
        launches,
        queues,
    }
}

/// The caching allocator over time, from Kineto's `[memory]` records (with
/// `profile_memory`) read as counters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Memory {
    pub samples: u64,
    pub peak_allocated_bytes: f64,
    pub peak_reserved_bytes: Option<f64>,
    pub last_allocated_bytes: f64,
    /// `(ts, allocated bytes)`, at most [`MEMORY_POINTS`] of them, for plots.
    pub timeline: Vec<(f64, f64)>,
}

/// Points kept in [`Memory::timeline`].
pub const MEMORY_POINTS: usize = 500;

/// The memory timeline, `None` without allocator counters.
pub fn memory(counters: &DataFrame) -> PolarsResult<Option<Memory>> {
    use chrome_trace_format::names::{KINETO_MEMORY, MEMORY_ALLOCATED, MEMORY_RESERVED};
    let series = |key: &str| -> PolarsResult<Vec<(f64, f64)>> {
        let df = counters
            .clone()
            .lazy()
            .filter(
                col("name")
                    .cast(DataType::String)
                    .eq(lit(KINETO_MEMORY))
                    .and(col("key").cast(DataType::String).eq(lit(key))),
            )
            .select([col("ts"), col("value")])
            .sort(["ts"], SortMultipleOptions::default())
            .collect()?;
        let ts = df.column("ts")?.f64()?.clone();
        let v = df.column("value")?.f64()?.clone();
        Ok(ts
            .iter()
            .zip(v.iter())
            .filter_map(|(t, v)| Some((t?, v?)))
            .collect())
    };
    let alloc = series(MEMORY_ALLOCATED)?;
    if alloc.is_empty() {
        return Ok(None);
    }
    let reserved = series(MEMORY_RESERVED)?;
    let stride = alloc.len().div_ceil(MEMORY_POINTS);
    Ok(Some(Memory {
        samples: alloc.len() as u64,
        peak_allocated_bytes: alloc.iter().map(|p| p.1).fold(f64::MIN, f64::max),
        peak_reserved_bytes: (!reserved.is_empty())
            .then(|| reserved.iter().map(|p| p.1).fold(f64::MIN, f64::max)),
        last_allocated_bytes: alloc.last().map_or(0.0, |p| p.1),
        timeline: alloc.iter().step_by(stride.max(1)).copied().collect(),
    }))
}
