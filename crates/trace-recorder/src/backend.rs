//! The GPU as the recorder sees it: the [`GpuBackend`] trait, its event handles, device
//! properties and errors. The recorder knows no GPU API; the trainer's CUDA adapter
//! implements this trait, and [`MockGpu`](crate::MockGpu) does for tests and benches.

/// An event handle of a [`GpuBackend`], opaque to the recorder (a `cudaEvent_t` for
/// CUDA, an index for the mock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuEvent(pub u64);

/// A device's name and memory, for the file's `deviceProperties`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    pub name: String,
    pub total_global_mem: u64,
}

/// What a GPU backend reported as failing.
#[derive(Debug, Clone, thiserror::Error)]
#[error("GPU backend: {op} failed: {message}")]
pub struct GpuError {
    pub op: &'static str,
    pub message: String,
}

/// A GPU as the recorder needs it. Implementations must be cheap on the span path
/// ([`record`](Self::record) runs up to twice per GPU-timed span,
/// [`take`](Self::take) once per batch of events, and
/// [`current_stream`](Self::current_stream) when a boundary may reuse the previous event)
/// and must never block there; everything else runs on the writer thread.
pub trait GpuBackend: Send + Sync {
    /// Written as `metadata.gpu_timing`.
    fn timing_name(&self) -> &'static str {
        chrome_trace_format::header::meta::GPU_TIMING_CUDA_EVENTS
    }

    /// Number of devices (for `deviceProperties`).
    fn device_count(&self) -> usize;

    /// Name and memory of `device`, if known.
    fn device_properties(&self, _device: usize) -> Option<DeviceProperties> {
        None
    }

    /// A key of the calling thread's current stream on `device`, unique per device.
    fn current_stream(&self, device: usize) -> Result<u64, GpuError>;

    /// Moves up to `n` free events of `device` from the backend's pool into `out`,
    /// creating events when the pool is empty. A recording thread takes a batch when it
    /// has no free event of its own left; events come back through
    /// [`release`](Self::release).
    fn take(&self, device: usize, n: usize, out: &mut Vec<GpuEvent>) -> Result<(), GpuError>;

    /// Records `event` (taken, not in use by another span) on the calling thread's
    /// current stream on `device`. Returns the stream's key (as
    /// [`current_stream`](Self::current_stream)).
    fn record(&self, device: usize, event: GpuEvent) -> Result<u64, GpuError>;

    /// Takes an event from the pool and records it like [`record`](Self::record), but on
    /// a stream private to the backend that carries no other work, so the event completes
    /// as soon as the GPU reaches it.
    fn record_calibration(&self, device: usize) -> Result<GpuEvent, GpuError>;

    /// Whether `event` has completed. Must not block.
    fn query(&self, event: GpuEvent) -> Result<bool, GpuError>;

    /// Milliseconds from `start` to `end`; both completed, on one device.
    fn elapsed_ms(&self, start: GpuEvent, end: GpuEvent) -> Result<f64, GpuError>;

    /// Returns `event` to the pool of `device`.
    fn release(&self, device: usize, event: GpuEvent);

    /// Makes sure at least `free` events wait in the pool of `device`, so that records
    /// on the training threads do not create them (creating an event is a driver call
    /// of its own). Cold: called when a device is first calibrated and by the writer.
    fn reserve(&self, _device: usize, _free: usize) {}
}
