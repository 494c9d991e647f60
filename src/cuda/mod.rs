//! CUDA streams and events that tch does not expose, over the C++ shim in `shim.cpp`
//! (c10's per-thread current streams, CUDA events, the caching allocator's
//! `recordStream`), and the recorder's CUDA [`GpuBackend`] ([`CudaEvents`]).
//!
//! Every call returns a `Result` and none panics when CUDA is absent: on a machine
//! without a GPU (or driver) [`device_count`] is 0 and the rest fail with
//! [`CudaError::NotAvailable`] or [`CudaError::NoDevice`].
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Mutex, MutexGuard, OnceLock};

use crate::trace::{DeviceProperties, GpuBackend, GpuError, GpuEvent};

pub mod activity;
pub mod capture;
pub mod kernel_trace;
pub mod kernels;
pub mod ops;

/// The shim's C ABI: every `extern "C"` function of `shim.cpp`. They return 0 on success
/// and a negative code on failure (text in `dflash_cuda_last_error`, per thread), and
/// never throw.
mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn dflash_cuda_last_error() -> *const c_char;
        pub fn dflash_cuda_device_count() -> c_int;
        pub fn dflash_cuda_use_new_stream(
            device: c_int,
            stream_id: *mut i64,
            raw: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_cuda_new_stream(
            device: c_int,
            stream_id: *mut i64,
            raw: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_cuda_device_properties(
            device: c_int,
            name: *mut c_char,
            name_len: usize,
            total_mem: *mut usize,
        ) -> c_int;
        pub fn dflash_cuda_current_stream(
            device: c_int,
            stream_id: *mut i64,
            raw: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_cuda_set_device(device: c_int) -> c_int;
        pub fn dflash_cuda_stream_synchronize(stream: *mut c_void) -> c_int;
        pub fn dflash_cuda_event_create(device: c_int, event: *mut *mut c_void) -> c_int;
        pub fn dflash_cuda_event_destroy(event: *mut c_void) -> c_int;
        pub fn dflash_cuda_event_record(event: *mut c_void, stream: *mut c_void) -> c_int;
        pub fn dflash_cuda_events_use_driver() -> c_int;
        pub fn dflash_cuda_event_record_current(
            device: c_int,
            event: *mut c_void,
            stream_id: *mut i64,
        ) -> c_int;
        pub fn dflash_cuda_event_query(event: *mut c_void) -> c_int;
        pub fn dflash_cuda_event_synchronize(event: *mut c_void) -> c_int;
        pub fn dflash_cuda_event_elapsed_ms(
            start: *mut c_void,
            end: *mut c_void,
            ms: *mut f32,
        ) -> c_int;
        pub fn dflash_cuda_stream_wait_event(stream: *mut c_void, event: *mut c_void) -> c_int;
        pub fn dflash_fused_adamw(
            param: *mut c_void,
            grad: *mut c_void,
            exp_avg: *mut c_void,
            exp_avg_sq: *mut c_void,
            step: *mut c_void,
            grad_divisor: *mut c_void,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
        ) -> c_int;
        pub fn dflash_clear_grads(tensors: *const *mut c_void, n: i64) -> c_int;
        pub fn dflash_cuda_record_stream(
            tensor: *mut c_void,
            device: c_int,
            stream_id: i64,
        ) -> c_int;
    }
}

/// Errors of the CUDA layer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is not available (no visible device or no driver)")]
    NotAvailable,
    #[error("CUDA device {device} does not exist ({count} visible)")]
    NoDevice { device: usize, count: usize },
    #[error("CUDA {op} failed (code {code}): {message}")]
    Call {
        op: &'static str,
        code: i32,
        message: String,
    },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The text of a shim's error buffer (each C++ shim keeps a NUL-terminated thread-local
/// one); empty for null.
pub(crate) fn shim_text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null, and the shims return NUL-terminated buffers that outlive the call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn last_error() -> String {
    // SAFETY: an accessor without arguments.
    shim_text(unsafe { ffi::dflash_cuda_last_error() })
}

fn check(op: &'static str, code: c_int) -> Result<()> {
    if code >= 0 {
        Ok(())
    } else {
        Err(CudaError::Call {
            op,
            code,
            message: last_error(),
        })
    }
}

/// Visible CUDA devices; 0 without a GPU or driver. Read once (the set of visible
/// devices is fixed when the CUDA runtime starts).
pub fn device_count() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    // SAFETY: plain query; the shim clears CUDA's sticky error on failure.
    *N.get_or_init(|| unsafe { ffi::dflash_cuda_device_count() }.max(0) as usize)
}

pub fn is_available() -> bool {
    device_count() > 0
}

fn device_arg(device: usize) -> Result<c_int> {
    let count = device_count();
    if count == 0 {
        return Err(CudaError::NotAvailable);
    }
    if device >= count {
        return Err(CudaError::NoDevice { device, count });
    }
    Ok(device as c_int)
}

/// Makes `device` the calling thread's current device.
pub fn set_device(device: usize) -> Result<()> {
    let d = device_arg(device)?;
    // SAFETY: valid device index.
    check("set_device", unsafe { ffi::dflash_cuda_set_device(d) })
}

/// Name and memory of `device`.
pub fn device_properties(device: usize) -> Result<DeviceProperties> {
    let d = device_arg(device)?;
    let mut name = [0 as c_char; 256];
    let mut mem = 0usize;
    // SAFETY: the buffer and its length are passed together; the shim NUL-terminates.
    check("get_device_properties", unsafe {
        ffi::dflash_cuda_device_properties(d, name.as_mut_ptr(), name.len(), &mut mem)
    })?;
    // SAFETY: NUL-terminated within the buffer (see above).
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok(DeviceProperties {
        name,
        total_global_mem: mem as u64,
    })
}

/// A CUDA stream of c10's pool (never destroyed: c10 owns pool streams).
#[derive(Debug)]
pub struct Stream {
    device: usize,
    id: i64,
    raw: *mut c_void,
}

// SAFETY: a `cudaStream_t` is a handle that the CUDA runtime accepts from any thread;
// c10's pool streams live as long as the process.
unsafe impl Send for Stream {}
// SAFETY: as above; every operation through `&Stream` is a thread-safe runtime call.
unsafe impl Sync for Stream {}

type StreamFn = unsafe extern "C" fn(c_int, *mut i64, *mut *mut c_void) -> c_int;

fn stream_from(op: &'static str, device: usize, f: StreamFn) -> Result<Stream> {
    let d = device_arg(device)?;
    let mut id = 0i64;
    let mut raw = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; the shim writes them only on success.
    check(op, unsafe { f(d, &mut id, &mut raw) })?;
    Ok(Stream { device, id, raw })
}

/// Takes a stream from c10's pool on `device` and makes it the calling thread's current
/// stream there: tch operations of this thread then run on it.
pub fn use_new_stream(device: usize) -> Result<Stream> {
    stream_from("use_new_stream", device, ffi::dflash_cuda_use_new_stream)
}

/// A stream of c10's pool on `device`, not made current.
pub fn new_stream(device: usize) -> Result<Stream> {
    stream_from("new_stream", device, ffi::dflash_cuda_new_stream)
}

/// The calling thread's current stream on `device`.
pub fn current_stream(device: usize) -> Result<Stream> {
    stream_from("current_stream", device, ffi::dflash_cuda_current_stream)
}

impl Stream {
    pub fn device(&self) -> usize {
        self.device
    }

    /// c10's packed stream id (what `record_stream` needs).
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The `cudaStream_t`.
    pub fn raw(&self) -> *mut c_void {
        self.raw
    }

    /// Blocks until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live stream handle.
        check("stream_synchronize", unsafe {
            ffi::dflash_cuda_stream_synchronize(self.raw)
        })
    }

    /// Makes later work on this stream wait for `event` (no host blocking).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        // SAFETY: live stream and event handles.
        check("stream_wait_event", unsafe {
            ffi::dflash_cuda_stream_wait_event(self.raw, event.raw)
        })
    }
}

/// A CUDA event (`cudaEventDefault`, so it carries timing). Destroyed on drop.
#[derive(Debug)]
pub struct Event {
    device: usize,
    raw: *mut c_void,
}

// SAFETY: a `cudaEvent_t` may be recorded, queried and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; `&Event` only allows thread-safe runtime calls.
unsafe impl Sync for Event {}

fn create_event(device: usize) -> Result<*mut c_void> {
    let d = device_arg(device)?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    check("event_create", unsafe {
        ffi::dflash_cuda_event_create(d, &mut raw)
    })?;
    Ok(raw)
}

fn query_raw(raw: *mut c_void) -> Result<bool> {
    // SAFETY: a live event handle.
    let rc = unsafe { ffi::dflash_cuda_event_query(raw) };
    check("event_query", rc)?;
    Ok(rc == 1)
}

fn elapsed_raw(start: *mut c_void, end: *mut c_void) -> Result<f32> {
    let mut ms = 0f32;
    // SAFETY: live event handles, out-pointer to a local.
    check("event_elapsed_time", unsafe {
        ffi::dflash_cuda_event_elapsed_ms(start, end, &mut ms)
    })?;
    Ok(ms)
}

impl Event {
    pub fn new(device: usize) -> Result<Event> {
        Ok(Event {
            device,
            raw: create_event(device)?,
        })
    }

    pub fn device(&self) -> usize {
        self.device
    }

    /// Records the event on `stream` (it completes when the work queued before it does).
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: live event and stream handles.
        check("event_record", unsafe {
            ffi::dflash_cuda_event_record(self.raw, stream.raw)
        })
    }

    /// Whether the event has completed; never blocks.
    pub fn query(&self) -> Result<bool> {
        query_raw(self.raw)
    }

    /// Blocks until the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event handle.
        check("event_synchronize", unsafe {
            ffi::dflash_cuda_event_synchronize(self.raw)
        })
    }

    /// Milliseconds from this event to `end` (both recorded and completed).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        elapsed_raw(self.raw, end.raw)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: we own the handle; CUDA defers the release if it is still pending.
        unsafe {
            ffi::dflash_cuda_event_destroy(self.raw);
        }
    }
}

/// Tells c10's caching allocator that `tensor`'s memory is also used by work queued on
/// `stream`, so it is not reused before that work has finished (needed when a tensor
/// made on one stream is consumed on another). A no-op for CPU tensors.
pub fn record_stream(tensor: &tch::Tensor, stream: &Stream) -> Result<()> {
    // SAFETY: `as_ptr` is tch's `torch::Tensor*`, valid while `tensor` is borrowed; the
    // shim only reads it.
    check("record_stream", unsafe {
        ffi::dflash_cuda_record_stream(
            tensor.as_ptr() as *mut c_void,
            stream.device as c_int,
            stream.id,
        )
    })
}

/// The recorder's CUDA backend: GPU spans timed with pooled CUDA events on each
/// thread's current c10 stream, calibrated on a private pool stream per device.
///
/// ```no_run
/// # use std::sync::Arc;
/// let gpu = dflash::cuda::CudaEvents::new()?;
/// let cfg = dflash::trace::RecorderConfig {
///     gpu: Some(Arc::new(gpu)),
///     ..Default::default()
/// };
/// # Ok::<(), dflash::cuda::CudaError>(())
/// ```
pub struct CudaEvents {
    /// Free events per device (raw `cudaEvent_t` as usize).
    pools: Vec<Mutex<Vec<usize>>>,
    /// Every event created, per device, destroyed on drop.
    created: Vec<Mutex<Vec<usize>>>,
    calibration: Vec<Mutex<Option<Stream>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn gpu_err(e: CudaError) -> GpuError {
    let op = match &e {
        CudaError::Call { op, .. } => op,
        _ => "cuda",
    };
    GpuError {
        op,
        message: e.to_string(),
    }
}

impl CudaEvents {
    /// Whether GPU spans record their events through the driver's `cuEventRecord`
    /// (the default where the driver provides it) rather than the runtime's
    /// `cudaEventRecord` (`DFLASH_CUDA_EVENTS=runtime`).
    pub fn uses_driver_record() -> bool {
        // SAFETY: no arguments; loads a function pointer once.
        is_available() && unsafe { ffi::dflash_cuda_events_use_driver() } == 1
    }

    /// Fails with [`CudaError::NotAvailable`] when no device is visible.
    pub fn new() -> Result<CudaEvents> {
        let n = device_count();
        if n == 0 {
            return Err(CudaError::NotAvailable);
        }
        Ok(CudaEvents {
            pools: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            created: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            calibration: (0..n).map(|_| Mutex::new(None)).collect(),
        })
    }

    fn take_one(&self, device: usize) -> Result<usize> {
        let pool = self.pools.get(device).ok_or(CudaError::NoDevice {
            device,
            count: self.pools.len(),
        })?;
        if let Some(e) = lock(pool).pop() {
            return Ok(e);
        }
        let e = create_event(device)? as usize;
        lock(&self.created[device]).push(e);
        Ok(e)
    }

    fn record_on(&self, device: usize, stream: *mut c_void) -> Result<GpuEvent> {
        let ev = self.take_one(device)?;
        // SAFETY: a pooled live event and a live stream of the same device.
        let rc = unsafe { ffi::dflash_cuda_event_record(ev as *mut c_void, stream) };
        if let Err(e) = check("event_record", rc) {
            lock(&self.pools[device]).push(ev);
            return Err(e);
        }
        Ok(GpuEvent(ev as u64))
    }
}

impl GpuBackend for CudaEvents {
    fn device_count(&self) -> usize {
        self.pools.len()
    }

    fn device_properties(&self, device: usize) -> Option<DeviceProperties> {
        device_properties(device).ok()
    }

    fn current_stream(&self, device: usize) -> Result<u64, GpuError> {
        current_stream(device).map(|s| s.id as u64).map_err(gpu_err)
    }

    fn take(&self, device: usize, n: usize, out: &mut Vec<GpuEvent>) -> Result<(), GpuError> {
        let pool = self.pools.get(device).ok_or_else(|| {
            gpu_err(CudaError::NoDevice {
                device,
                count: self.pools.len(),
            })
        })?;
        let before = out.len();
        {
            let mut p = lock(pool);
            let keep = p.len().saturating_sub(n);
            out.extend(p.drain(keep..).map(|e| GpuEvent(e as u64)));
        }
        if out.len() == before && n > 0 {
            let e = create_event(device).map_err(gpu_err)? as usize;
            lock(&self.created[device]).push(e);
            out.push(GpuEvent(e as u64));
        }
        Ok(())
    }

    fn record(&self, device: usize, event: GpuEvent) -> Result<u64, GpuError> {
        let mut stream = 0i64;
        // SAFETY: a live event of `device` taken from our pool; out-pointer to a local.
        let rc = unsafe {
            ffi::dflash_cuda_event_record_current(
                device as c_int,
                event.0 as *mut c_void,
                &mut stream,
            )
        };
        check("event_record", rc).map_err(gpu_err)?;
        Ok(stream as u64)
    }

    fn record_calibration(&self, device: usize) -> Result<GpuEvent, GpuError> {
        let slot = self.calibration.get(device).ok_or(GpuError {
            op: "calibration",
            message: format!("no device {device}"),
        })?;
        let raw = {
            let mut g = lock(slot);
            if g.is_none() {
                *g = Some(new_stream(device).map_err(gpu_err)?);
            }
            g.as_ref().map(|s| s.raw).unwrap_or(std::ptr::null_mut())
        };
        self.record_on(device, raw).map_err(gpu_err)
    }

    fn query(&self, event: GpuEvent) -> Result<bool, GpuError> {
        query_raw(event.0 as *mut c_void).map_err(gpu_err)
    }

    fn reserve(&self, device: usize, free: usize) {
        let Some(pool) = self.pools.get(device) else {
            return;
        };
        let missing = free.saturating_sub(lock(pool).len());
        // Created outside the pool's lock, so records on other threads are not held up.
        let mut made = Vec::with_capacity(missing);
        for _ in 0..missing {
            match create_event(device) {
                Ok(e) => made.push(e as usize),
                Err(_) => break,
            }
        }
        lock(&self.created[device]).extend_from_slice(&made);
        lock(pool).extend(made);
    }

    fn elapsed_ms(&self, start: GpuEvent, end: GpuEvent) -> Result<f64, GpuError> {
        elapsed_raw(start.0 as *mut c_void, end.0 as *mut c_void)
            .map(f64::from)
            .map_err(gpu_err)
    }

    fn release(&self, device: usize, event: GpuEvent) {
        if let Some(pool) = self.pools.get(device) {
            lock(pool).push(event.0 as usize);
        }
    }
}

impl Drop for CudaEvents {
    fn drop(&mut self) {
        for list in &self.created {
            for &e in lock(list).iter() {
                // SAFETY: created by us and destroyed once; CUDA defers the release of
                // events still pending.
                unsafe {
                    ffi::dflash_cuda_event_destroy(e as *mut c_void);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine class has no GPU: everything must fail cleanly, never panic.
    #[test]
    fn absent_cuda_fails_cleanly() {
        if is_available() {
            return;
        }
        assert_eq!(device_count(), 0);
        assert!(matches!(use_new_stream(0), Err(CudaError::NotAvailable)));
        assert!(matches!(current_stream(0), Err(CudaError::NotAvailable)));
        assert!(Event::new(0).is_err());
        assert!(CudaEvents::new().is_err());
        assert!(set_device(0).is_err());
        assert!(device_properties(0).is_err());
    }

    #[test]
    fn last_error_is_readable() {
        let _ = last_error();
    }
}
