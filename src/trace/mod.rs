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
    MAX_DEVICES,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct GpuTimingCost {
    /// GPU-timed spans that ended with both events.
    pub spans: u64,
    /// Their begins and ends in the recorder, in total.
    pub cpu_ns: u64,
    /// Span boundaries that recorded a new event, and those that reused the thread's
    /// previous one (back-to-back sections).
    pub events_recorded: u64,
    pub events_reused: u64,
    /// The reuse window in force at the end (see `set_gpu_event_reuse_window`).
    pub reuse_window_ns: u64,
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
            reuse_window_ns: self.reuse_window_ns,
        }
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
