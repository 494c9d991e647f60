//! Events a caller adds when the trace finishes (the trainer's CUDA activity: kernels,
//! copies, runtime calls), and what the recorder tells it to place them: the clock both
//! share ([`clock_ns`]), the GPU spans the writer placed, and the recording threads with
//! their OS ids. [`Recorder::finish_with`](crate::Recorder::finish_with) runs the
//! caller's [`Appender`] on the writer thread after the last GPU span is written and
//! before the file is closed, so the added events land in the same file.
use chrome_trace_format::EventWriter;

use crate::clock::{clock, now};

/// Nanoseconds on the recorder's clock (a fixed origin; only differences mean
/// anything). Another tool's timestamps taken from this function land on the trace's
/// time axis through [`FinishView::trace_ns`].
pub fn clock_ns() -> u64 {
    clock().delta_as_nanos(0, now())
}

/// A GPU span as the writer placed it in the file (kept only when
/// [`RecorderConfig::keep_gpu_spans`](crate::RecorderConfig::keep_gpu_spans) is set).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlacedGpuSpan {
    pub name: String,
    /// The GPU's `pid` and the stream track's `tid` it was written on.
    pub device: u32,
    pub track: u32,
    /// The backend's key of the stream ([`GpuBackend::current_stream`](crate::GpuBackend::current_stream)).
    pub stream: u64,
    /// Trace time, ns.
    pub ts_ns: u64,
    pub dur_ns: u64,
    /// The recorder `tid` of the thread whose CPU span launched it, and that CPU span.
    pub thread: u32,
    pub cpu_ts_ns: u64,
    pub cpu_end_ns: u64,
}

impl PlacedGpuSpan {
    pub fn end_ns(&self) -> u64 {
        self.ts_ns + self.dur_ns
    }
}

/// A thread that recorded into the trace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceThread {
    /// Its `tid` in the file (on the trainer's `pid`).
    pub tid: u32,
    /// Its OS thread id (`gettid`).
    pub os_tid: u32,
    /// Trace time of the start of its first span and the end of its last, ns.
    pub first_ns: u64,
    pub last_ns: u64,
}

/// What an [`Appender`] is given.
#[derive(Debug)]
pub struct FinishView<'a> {
    /// The trainer's `pid` in the file.
    pub pid: u32,
    /// [`clock_ns`] at the trace's time zero.
    pub base_clock_ns: u64,
    /// In the order they were written.
    pub gpu_spans: &'a [PlacedGpuSpan],
    /// By `tid`.
    pub threads: &'a [TraceThread],
}

impl FinishView<'_> {
    /// A [`clock_ns`] reading as trace time (ns); `None` before the trace began.
    pub fn trace_ns(&self, clock_ns: u64) -> Option<u64> {
        clock_ns.checked_sub(self.base_clock_ns)
    }
}

/// Writes the caller's events through the file's writer, once, at the end.
pub type Appender = Box<dyn FnOnce(&FinishView<'_>, &mut EventWriter) + Send>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_ns_advances_like_the_span_clock() {
        let (a, t0) = (clock_ns(), now());
        std::thread::sleep(std::time::Duration::from_millis(3));
        let (b, t1) = (clock_ns(), now());
        let d = b - a;
        let dt = clock().delta_as_nanos(t0, t1);
        assert!((2_000_000..200_000_000).contains(&d), "{d}");
        assert!(d.abs_diff(dt) < 20_000, "{d} vs {dt}");
    }
}
