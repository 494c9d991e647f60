//! `trace-recorder`: a low-overhead, process-wide recorder of CPU spans, GPU spans
//! (through a [`GpuBackend`]), counters and flows, written as a Chrome-trace JSON file
//! that Perfetto opens directly. It knows nothing of DFlash; the file format is the
//! `chrome-trace-format` crate (and `docs/trace-format.md`).
//!
//! Owns: the span API ([`span`], [`gpu_span`], [`queue_span`], [`step_span`],
//! [`counter`], flows), name interning ([`intern`], [`trace_name!`]), the per-thread
//! rings, the writer thread, GPU span placement and calibration, the live statistics
//! ([`Stats`], [`GpuTimingCost`]) and a mock GPU for tests ([`MockGpu`]).
//!
//! May import: `chrome-trace-format` (every byte of the file is written through its
//! `EventWriter`), `quanta` (the clock), `flate2`, `serde`/`serde_json` (the header's
//! metadata), `thiserror`. Not libtorch: a GPU is whatever implements [`GpuBackend`]
//! (the trainer's CUDA adapter does).
//!
//! Design (after puffin): the on/off switch is one relaxed `AtomicBool` ([`enabled`]);
//! names are interned once ([`trace_name!`], [`intern`]); a span is a `!Send` RAII guard
//! ([`Span`]) holding the event's fields, whose drop copies a fixed-size record (name id,
//! raw TSC ticks) into its thread's lock-free ring. A background writer thread drains the
//! rings, converts ticks to ns, keeps each track nested, resolves GPU events without
//! blocking, and streams JSON to the file, flushing every `flush_interval`. What a span
//! costs is measured by `cargo bench -p trace-recorder --bench trace_span`; the figures
//! are in `docs/recorder-bench.md` and, for GPU spans on real hardware,
//! `docs/gpu-results.md`.
//!
//! Modules, each importing only those listed before it: `state` (the process-wide
//! switches and counters), `clock`, `cost`, `backend`, `names`, `event`, `ring`, `nest`,
//! `sink`, `calib` (calibrations, reuse window), `holds` (each thread's GPU events),
//! `thread` (the registry of threads), `span` (the hot path), `external` (what a caller
//! adding events at the end is told), `resolve` (placing GPU spans), `stats`, `writer` (the writer thread), `recorder` (the handle), `mock`.
//!
//! ```no_run
//! use trace_recorder::{self as trace, Recorder, RecorderConfig};
//! let rec = Recorder::start(RecorderConfig { path: "trace.json".into(), ..Default::default() })?;
//! trace::set_thread_name("drafter cuda:0");
//! {
//!     let _step = trace::step_span(5);
//!     let mut s = trace::span(trace::trace_name!("drafter.fc"));
//!     s.arg("tokens", 4096u64);
//! }
//! rec.finish()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
mod state;

mod clock;
mod cost;

mod backend;
mod names;

mod event;
mod ring;

mod nest;
mod sink;

mod calib;
mod holds;
mod thread;

mod span;

mod external;
mod resolve;
mod stats;
mod writer;

mod recorder;

mod mock;

pub use backend::{DeviceProperties, GpuBackend, GpuError, GpuEvent};
pub use calib::{reuse_window_ns, set_gpu_event_reuse_window, MAX_DEVICES};
pub use chrome_trace_format::ArgValue;
pub use cost::{
    GpuTimingCost, COST_BUCKETS as SPAN_COST_BUCKETS, COST_BUCKET_NS as SPAN_COST_BUCKET_NS,
};
pub use event::MAX_ARGS;
pub use external::{clock_ns, Appender, FinishView, PlacedGpuSpan, TraceThread};
pub use mock::MockGpu;
pub use names::{intern, Name};
pub use recorder::{DistributedInfo, Recorder, RecorderConfig, TraceError};
pub use span::{
    bind_gpu, counter, enabled, gpu_span, next_flow_id, queue_span, set_thread_name,
    set_thread_recording, span, step_span, unbind_gpu, Span,
};
pub use stats::{NameStats, Stats, Summary};
