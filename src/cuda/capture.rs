//! The process's kernel capture for `--trace-kernels`: armed when the trace starts,
//! started by the first thread that enters the traced window, stopped when the drafter
//! leaves it (or the trace closes), its records taken when the trace finishes. CUPTI is
//! process-wide, so this is too; every call is cheap when the capture is not armed.
//!
//! A capture that cannot start (no CUDA, no CUPTI) says so in one line and leaves the
//! run and its trace as they would be without it.
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use super::activity;

const OFF: u8 = 0;
const ARMED: u8 = 1;
const RUNNING: u8 = 2;
const STOPPED: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(OFF);
static BUFFER_BYTES: Mutex<usize> = Mutex::new(DEFAULT_BUFFER_BYTES);
/// Dropped-record count when the capture started (CUPTI's count is process-wide).
static DROPPED_AT_START: Mutex<u64> = Mutex::new(0);

/// CUPTI activity buffer size: 8 MiB holds about 30,000 kernel records; a full buffer is
/// handed back and a fresh one given, so records are dropped only when allocation fails
/// or CUPTI cannot keep up. `DFLASH_CUPTI_BUFFER_MB` overrides it.
pub const DEFAULT_BUFFER_BYTES: usize = 8 << 20;

extern "C" fn trace_clock() -> u64 {
    crate::trace::clock_ns()
}

/// Arms the capture (the trace is starting with `--trace-kernels`). `Err` with the
/// reason when there is nothing to capture (no CUDA device in this process).
pub fn arm() -> Result<(), String> {
    if !super::is_available() || super::device_count() == 0 {
        return Err("no CUDA device".into());
    }
    let mb = std::env::var("DFLASH_CUPTI_BUFFER_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&m| m > 0);
    *BUFFER_BYTES.lock().unwrap_or_else(|p| p.into_inner()) =
        mb.map_or(DEFAULT_BUFFER_BYTES, |m| m << 20);
    STATE.store(ARMED, Ordering::Release);
    Ok(())
}

/// Whether a capture was armed for this trace.
pub fn armed() -> bool {
    STATE.load(Ordering::Acquire) != OFF
}

/// Called by each thread as it enters the traced window: the first starts the capture.
pub fn enter_window() {
    if STATE
        .compare_exchange(ARMED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    *DROPPED_AT_START.lock().unwrap_or_else(|p| p.into_inner()) = activity::counts().0;
    let bytes = *BUFFER_BYTES.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = activity::start(trace_clock, bytes) {
        eprintln!("warning: --trace-kernels: {e}; the trace has no kernels");
        STATE.store(STOPPED, Ordering::Release);
    }
}

/// Called when the drafter leaves the traced window, and when the trace closes: stops
/// the capture and flushes its records.
pub fn leave_window() {
    if STATE
        .compare_exchange(RUNNING, STOPPED, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        if let Err(e) = activity::stop() {
            eprintln!("warning: --trace-kernels: {e}");
        }
    }
}

/// Stops the capture if it runs, disarms it, and takes its records and the number CUPTI
/// dropped during it.
pub fn take() -> (Vec<activity::Activity>, u64) {
    leave_window();
    STATE.store(OFF, Ordering::Release);
    let at_start = *DROPPED_AT_START.lock().unwrap_or_else(|p| p.into_inner());
    (
        activity::take(),
        activity::counts().0.saturating_sub(at_start),
    )
}
