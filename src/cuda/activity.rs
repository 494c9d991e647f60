//! CUDA activity capture for kernel-level traces: every kernel, memcpy and memset on the
//! GPU, every CUDA runtime and driver call on the CPU, the driver's overhead records and
//! host synchronizations, from CUPTI's activity API (`activity.cpp`, which loads CUPTI
//! only when a capture starts); and the CUDA caching allocator's device statistics.
//!
//! CUPTI takes its timestamps from the clock given to [`start`], so records are on the
//! caller's clock as they arrive. Nothing here knows about traces: the caller turns
//! [`Activity`] records into trace events.
use std::ffi::{c_char, c_int, c_void, CStr};

use super::{CudaError, Result};

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    /// `DflashActivity` of `activity.cpp`, field for field.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default)]
    pub struct RawActivity {
        pub kind: u32,
        pub name: u32,
        pub start: u64,
        pub end: u64,
        pub correlation: u32,
        pub device: u32,
        pub context: u32,
        pub stream: u32,
        pub pid: u32,
        pub tid: u32,
        pub grid: [i32; 3],
        pub block: [i32; 3],
        pub registers: i32,
        pub shared_static: i32,
        pub shared_dynamic: i32,
        pub detail: u32,
        pub bytes: u64,
    }

    extern "C" {
        pub fn dflash_activity_last_error() -> *const c_char;
        pub fn dflash_activity_start(clock: extern "C" fn() -> u64, buffer_size: usize) -> c_int;
        pub fn dflash_activity_stop() -> c_int;
        pub fn dflash_activity_flush() -> c_int;
        pub fn dflash_activity_take(out: *mut RawActivity, cap: usize) -> usize;
        pub fn dflash_activity_pending() -> usize;
        pub fn dflash_activity_name(id: u32) -> *const c_char;
        pub fn dflash_activity_counts(dropped: *mut u64, buffers: *mut u64);
        pub fn dflash_activity_stream_id(stream: *mut c_void, id: *mut u32) -> c_int;
        pub fn dflash_allocator_stats(device: c_int, out6: *mut i64) -> c_int;
    }
}

/// What an [`Activity`] record is, by CUPTI activity kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ActivityKind {
    Kernel,
    Memcpy,
    Memset,
    /// A CUDA runtime API call (`cudaLaunchKernel`, `cudaMemcpyAsync`, ...).
    Runtime,
    /// A CUDA driver API call (`cuLaunchKernel`, `cuEventRecord`, ...).
    Driver,
    /// Time the driver or CUPTI spent on its own account ("Command Buffer Full", ...).
    Overhead,
    /// A host wait on the GPU (stream, event or context synchronization).
    Sync,
}

impl ActivityKind {
    fn from_raw(k: u32) -> Option<Self> {
        Some(match k {
            1 => Self::Kernel,
            2 => Self::Memcpy,
            3 => Self::Memset,
            4 => Self::Runtime,
            5 => Self::Driver,
            6 => Self::Overhead,
            7 => Self::Sync,
            _ => return None,
        })
    }
}

/// One CUDA activity record; times are on the clock given to [`start`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Activity {
    pub kind: ActivityKind,
    pub name: String,
    pub start: u64,
    pub end: u64,
    /// Links a runtime/driver call to the GPU work it launched (0 when none).
    pub correlation: u32,
    /// GPU records: device index, CUPTI context and stream ids.
    pub device: u32,
    pub context: u32,
    pub stream: u32,
    /// CPU records: process and OS thread id of the caller.
    pub pid: u32,
    pub tid: u32,
    /// Kernels: launch geometry and resources.
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub registers: i32,
    pub shared_static: i32,
    pub shared_dynamic: i32,
    /// Memcpy kind (1 HtoD, 2 DtoH, 8 DtoD, ...), overhead kind, synchronization type or
    /// API callback id, by `kind`.
    pub detail: u32,
    /// Memcpy and memset bytes.
    pub bytes: u64,
}

fn last_error() -> String {
    // SAFETY: an accessor without arguments.
    super::shim_text(unsafe { ffi::dflash_activity_last_error() })
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

/// Starts capturing CUDA activity, with `clock` (ns) as CUPTI's timestamp source and
/// activity buffers of `buffer_bytes`. Fails (and captures nothing) when CUDA or CUPTI is
/// not available.
pub fn start(clock: extern "C" fn() -> u64, buffer_bytes: usize) -> Result<()> {
    if !super::is_available() {
        return Err(CudaError::NotAvailable);
    }
    // SAFETY: the callback is a plain function valid for the program's life.
    check("CUPTI activity start", unsafe {
        ffi::dflash_activity_start(clock, buffer_bytes)
    })
}

/// Stops capturing and flushes every record collected so far, ready for [`take`].
pub fn stop() -> Result<()> {
    // SAFETY: no arguments; safe to call when not capturing.
    check("CUPTI activity stop", unsafe {
        ffi::dflash_activity_stop()
    })
}

/// Hands completed buffers over while capturing goes on.
pub fn flush() -> Result<()> {
    // SAFETY: no arguments.
    check("CUPTI activity flush", unsafe {
        ffi::dflash_activity_flush()
    })
}

/// Takes every record collected so far, oldest first.
pub fn take() -> Vec<Activity> {
    // SAFETY: `take` writes at most `cap` records into the buffer it is given; names are
    // NUL-terminated strings owned by activity.cpp until the next start.
    unsafe {
        let cap = ffi::dflash_activity_pending();
        let mut raw = vec![ffi::RawActivity::default(); cap];
        let n = ffi::dflash_activity_take(raw.as_mut_ptr(), cap);
        raw.truncate(n);
        let mut names: Vec<Option<String>> = Vec::new();
        raw.into_iter()
            .filter_map(|r| {
                let kind = ActivityKind::from_raw(r.kind)?;
                let i = r.name as usize;
                if names.len() <= i {
                    names.resize(i + 1, None);
                }
                let name = names[i]
                    .get_or_insert_with(|| {
                        let p = ffi::dflash_activity_name(r.name);
                        if p.is_null() {
                            "?".to_string()
                        } else {
                            CStr::from_ptr(p as *const c_char)
                                .to_string_lossy()
                                .into_owned()
                        }
                    })
                    .clone();
                Some(Activity {
                    kind,
                    name,
                    start: r.start,
                    end: r.end,
                    correlation: r.correlation,
                    device: r.device,
                    context: r.context,
                    stream: r.stream,
                    pid: r.pid,
                    tid: r.tid,
                    grid: r.grid,
                    block: r.block,
                    registers: r.registers,
                    shared_static: r.shared_static,
                    shared_dynamic: r.shared_dynamic,
                    detail: r.detail,
                    bytes: r.bytes,
                })
            })
            .collect()
    }
}

/// Records CUPTI reported dropped, and activity buffers handed out, since the program
/// started.
pub fn counts() -> (u64, u64) {
    let (mut dropped, mut buffers) = (0, 0);
    // SAFETY: two plain out-parameters.
    unsafe { ffi::dflash_activity_counts(&mut dropped, &mut buffers) };
    (dropped, buffers)
}

/// CUPTI's id of the stream with raw handle `stream` (what GPU records carry).
///
/// # Safety
/// `stream` must be a live CUDA stream handle (from c10) or null (the default stream).
pub unsafe fn stream_id(stream: *mut c_void) -> Result<u32> {
    let mut id = 0;
    // SAFETY: the caller hands a live stream handle.
    check("CUPTI stream id", unsafe {
        ffi::dflash_activity_stream_id(stream, &mut id)
    })?;
    Ok(id)
}

/// The CUDA caching allocator's statistics for one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AllocatorStats {
    /// Bytes handed out to tensors now, and reserved from the device now.
    pub allocated_bytes: i64,
    pub reserved_bytes: i64,
    /// Since the program started: `cudaMalloc`-level allocations and frees, allocations
    /// retried after freeing the cache, and out-of-memory failures.
    pub device_allocs: i64,
    pub device_frees: i64,
    pub alloc_retries: i64,
    pub ooms: i64,
}

/// The caching allocator's statistics for `device`.
pub fn allocator_stats(device: usize) -> Result<AllocatorStats> {
    let d = super::device_arg(device)?;
    let mut v = [0i64; 6];
    // SAFETY: writes six i64 into `v`.
    check("allocator stats", unsafe {
        ffi::dflash_allocator_stats(d, v.as_mut_ptr())
    })?;
    Ok(AllocatorStats {
        allocated_bytes: v[0],
        reserved_bytes: v[1],
        device_allocs: v[2],
        device_frees: v[3],
        alloc_retries: v[4],
        ooms: v[5],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_nothing_starts_and_nothing_panics() {
        if crate::cuda::is_available() {
            return;
        }
        extern "C" fn zero() -> u64 {
            0
        }
        assert!(matches!(start(zero, 1 << 20), Err(CudaError::NotAvailable)));
        assert!(matches!(allocator_stats(0), Err(CudaError::NotAvailable)));
        stop().unwrap();
        assert!(take().is_empty());
        assert_eq!(counts(), (0, 0));
    }

    #[test]
    fn raw_kinds_map_one_to_one() {
        let all: Vec<_> = (0..10).filter_map(ActivityKind::from_raw).collect();
        assert_eq!(all.len(), 7);
        assert_eq!(ActivityKind::from_raw(1), Some(ActivityKind::Kernel));
        assert_eq!(ActivityKind::from_raw(7), Some(ActivityKind::Sync));
    }
}
