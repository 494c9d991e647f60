//! The span recorder: a low-overhead, process-wide recorder of CPU spans, GPU spans
//! (through a [`GpuBackend`]), counters and flows, written as a Chrome-trace JSON file
//! that Perfetto opens directly. It knows nothing of DFlash; the file format is
//! documented in `docs/trace-format.md`.
//!
//! Design (after puffin): the on/off switch is one relaxed `AtomicBool` ([`enabled`]);
//! names are interned once ([`trace_name!`](crate::trace_name), [`intern`]); a span is a
//! `!Send` RAII guard ([`Span`]) holding the event's fields, whose drop copies a fixed-size
//! record (name id, raw TSC ticks) into its thread's lock-free ring. A background writer
//! thread drains the rings, converts ticks to ns, keeps each track nested, resolves GPU
//! events without blocking, and streams JSON to the file, flushing every `flush_interval`.
//!
//! Cost (`cargo bench --bench trace_span`, 2-vCPU dev VM, best of 200 rounds / criterion
//! mean): a disabled span 0.36 / 0.50 ns (the harness's empty loop: 0.35 / 0.42 ns); an
//! enabled span (begin + end) 27.5 / 37 ns, of which the two `rdtsc` reads and a Vec push
//! alone take 20.7 / 24 ns (the bench prints that floor beside it). A GPU-timed span adds
//! one or two CUDA event records (about 1-1.4 us each on the H200 host; boundaries of
//! back-to-back spans share one event), see docs/gpu-results.md.
//!
//! ```no_run
//! use dflash::trace::{self, Recorder, RecorderConfig};
//! let rec = Recorder::start(RecorderConfig { path: "trace.json".into(), ..Default::default() })?;
//! trace::set_thread_name("drafter cuda:0");
//! {
//!     let _step = trace::step_span(5);
//!     let mut s = trace::span(dflash::trace_name!("drafter.fc"));
//!     s.arg("tokens", 4096u64);
//! }
//! rec.finish()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
mod clock;
mod event;
mod gpu;
mod json;
mod local;
mod mock;
mod names;
mod recorder;
mod resolve;
mod ring;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;

pub use event::{ArgValue, MAX_ARGS};
pub use gpu::{
    reuse_window_ns, set_gpu_event_reuse_window, DeviceProperties, GpuBackend, GpuError, GpuEvent,
    COST_BUCKETS as SPAN_COST_BUCKETS, COST_BUCKET_NS as SPAN_COST_BUCKET_NS, MAX_DEVICES,
};
pub use local::{
    bind_gpu, counter, enabled, gpu_span, next_flow_id, queue_span, set_thread_name,
    set_thread_recording, span, step_span, unbind_gpu, Span,
};
pub use mock::MockGpu;
pub use names::{intern, Name};
pub use recorder::{DistributedInfo, Recorder, RecorderConfig, TraceError};

/// Totals of one name since the previous [`Recorder::stats_snapshot`].
#[derive(Clone, Debug)]
pub struct NameStats {
    pub name: Name,
    pub text: Arc<str>,
    /// CPU spans ended.
    pub count: u64,
    /// Their total CPU time.
    pub cpu_ns: u64,
    /// GPU spans resolved, and their total GPU time.
    pub gpu_count: u64,
    pub gpu_ns: u64,
}

/// A [`Recorder::stats_snapshot`]: names sorted by CPU time, most first.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub names: Vec<NameStats>,
    /// Events lost since the recorder started because a thread's buffer was full.
    pub dropped_events: u64,
    /// GPU events that could not be recorded since the recorder started.
    pub gpu_errors: u64,
    /// What GPU timing has cost the recording threads so far.
    pub gpu_cost: GpuTimingCost,
}

/// What [`Recorder::finish`] wrote.
#[derive(Clone, Debug)]
pub struct Summary {
    pub path: PathBuf,
    /// Events written (metadata events included).
    pub events: u64,
    pub dropped_events: u64,
    /// GPU spans written, and those given up (events never completed or failed).
    pub gpu_spans: u64,
    pub gpu_spans_dropped: u64,
    pub gpu_errors: u64,
    /// What GPU timing cost the recording threads.
    pub gpu_cost: GpuTimingCost,
}

/// The CPU cost of GPU timing as the program ran, since the recorder started: every
/// GPU-timed span's begin and end as spent in the recorder, event records included.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GpuTimingCost {
    /// GPU-timed spans that ended with both events.
    pub spans: u64,
    /// Their begins and ends in the recorder, in total.
    pub cpu_ns: u64,
    /// Span boundaries that recorded a new event, and those that reused the thread's
    /// previous one (back-to-back sections).
    pub events_recorded: u64,
    pub events_reused: u64,
    /// Of `cpu_ns`, the time inside the GPU backend's event records (for CUDA, the
    /// driver's `cuEventRecord`).
    pub record_ns: u64,
    /// The spans by their own cost (begin and end together): bucket `i` counts those
    /// that cost `[i, i + 1) * SPAN_COST_BUCKET_NS`; the last bucket is open-ended.
    #[serde(serialize_with = "serialize_hist")]
    pub span_cost_hist: [u64; SPAN_COST_BUCKETS],
    /// The reuse window in force at the end (see `set_gpu_event_reuse_window`).
    pub reuse_window_ns: u64,
}

impl Default for GpuTimingCost {
    fn default() -> Self {
        GpuTimingCost {
            spans: 0,
            cpu_ns: 0,
            events_recorded: 0,
            events_reused: 0,
            record_ns: 0,
            span_cost_hist: [0; SPAN_COST_BUCKETS],
            reuse_window_ns: 0,
        }
    }
}

fn serialize_hist<S: serde::Serializer>(
    h: &[u64; SPAN_COST_BUCKETS],
    s: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(h.as_slice(), s)
}

impl GpuTimingCost {
    /// What was spent between `earlier` (an older snapshot of the same recorder) and this
    /// one; the window is this one's.
    pub fn since(&self, earlier: &GpuTimingCost) -> GpuTimingCost {
        GpuTimingCost {
            spans: self.spans.saturating_sub(earlier.spans),
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            events_recorded: self.events_recorded.saturating_sub(earlier.events_recorded),
            events_reused: self.events_reused.saturating_sub(earlier.events_reused),
            record_ns: self.record_ns.saturating_sub(earlier.record_ns),
            span_cost_hist: std::array::from_fn(|i| {
                self.span_cost_hist[i].saturating_sub(earlier.span_cost_hist[i])
            }),
            reuse_window_ns: self.reuse_window_ns,
        }
    }

    /// One line for logs: spans, mean and quantiles of their CPU cost, the event
    /// records' share, events per span.
    pub fn describe(&self) -> String {
        let us = |ns: Option<f64>| ns.map_or("-".to_string(), |v| format!("{:.2}", v / 1e3));
        format!(
            "{} GPU-timed spans, {:.2} us of CPU each (median {} us, 90th percentile {} us), \
             {:.2} us of it in event records; {:.2} events recorded per span (reuse window {} ns)",
            self.spans,
            self.cpu_ns_per_span() / 1e3,
            us(self.span_cost_quantile_ns(0.5)),
            us(self.span_cost_quantile_ns(0.9)),
            self.record_ns_per_span() / 1e3,
            self.events_per_span(),
            self.reuse_window_ns
        )
    }

    /// Mean ns per GPU-timed span spent inside the backend's event records.
    pub fn record_ns_per_span(&self) -> f64 {
        self.record_ns as f64 / self.spans.max(1) as f64
    }

    /// The `q` quantile (0..=1) of the per-span cost in ns, interpolated within its
    /// histogram bucket; `None` without spans. A quantile in the open last bucket reads
    /// as that bucket's lower bound.
    pub fn span_cost_quantile_ns(&self, q: f64) -> Option<f64> {
        let n: u64 = self.span_cost_hist.iter().sum();
        if n == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * n as f64;
        let width = SPAN_COST_BUCKET_NS as f64;
        let mut below = 0u64;
        for (i, &c) in self.span_cost_hist.iter().enumerate() {
            if c > 0 && (below + c) as f64 >= rank {
                let lo = i as f64 * width;
                if i == SPAN_COST_BUCKETS - 1 {
                    return Some(lo);
                }
                return Some(lo + width * ((rank - below as f64) / c as f64).clamp(0.0, 1.0));
            }
            below += c;
        }
        None
    }

    /// Mean CPU ns per GPU-timed span (0 without any).
    pub fn cpu_ns_per_span(&self) -> f64 {
        self.cpu_ns as f64 / self.spans.max(1) as f64
    }

    /// Events recorded per GPU-timed span (2 without reuse).
    pub fn events_per_span(&self) -> f64 {
        self.events_recorded as f64 / self.spans.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The histogram's quantiles against the exact quantiles of the samples it counts:
    /// within one bucket, and exact at the open last bucket's lower bound.
    #[test]
    fn span_cost_quantiles_match_the_samples() {
        assert_eq!(GpuTimingCost::default().span_cost_quantile_ns(0.5), None);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut samples: Vec<u64> = (0..5000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly 0.5-3 us, a tail to 20 us (past the last bucket's bound).
                if i % 10 == 0 {
                    x % 20_000
                } else {
                    500 + x % 2_500
                }
            })
            .collect();
        let mut c = GpuTimingCost::default();
        for &s in &samples {
            c.span_cost_hist[gpu::cost_bucket(s)] += 1;
        }
        samples.sort_unstable();
        let width = SPAN_COST_BUCKET_NS as f64;
        let last_lo = ((SPAN_COST_BUCKETS - 1) as u64 * SPAN_COST_BUCKET_NS) as f64;
        for q in [0.01, 0.1, 0.25, 0.5, 0.75, 0.9] {
            let exact = samples[((q * samples.len() as f64) as usize).min(samples.len() - 1)];
            let got = c.span_cost_quantile_ns(q).unwrap();
            assert!(
                (got - exact as f64).abs() <= width,
                "q {q}: {got} vs {exact}"
            );
        }
        assert!(samples[samples.len() * 99 / 100] as f64 >= last_lo);
        assert_eq!(c.span_cost_quantile_ns(0.99), Some(last_lo));
        assert_eq!(c.span_cost_quantile_ns(1.0), Some(last_lo));
        let since = c.since(&GpuTimingCost {
            span_cost_hist: c.span_cost_hist,
            ..Default::default()
        });
        assert_eq!(since.span_cost_quantile_ns(0.5), None);
    }
}
