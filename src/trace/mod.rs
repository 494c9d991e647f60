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
    set_gpu_event_reuse_window, DeviceProperties, GpuBackend, GpuError, GpuEvent, MAX_DEVICES,
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
}
