//! The process-wide switches and counters that the hot path reads or bumps without a
//! handle: whether spans record, whether a recorder runs, events lost, GPU errors, and
//! the flow id counter. One static, because the recorder is one per process (the span
//! functions are free functions); everything else a recorder owns lives in its handle
//! and its writer thread.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub(crate) struct Process {
    /// Spans record only while this is set (by [`Recorder::set_active`](crate::Recorder)).
    pub active: AtomicBool,
    /// A recorder (and its writer thread) exists.
    pub running: AtomicBool,
    /// Events lost because a thread's ring was full (the writer fell behind).
    pub dropped: AtomicU64,
    /// GPU events that could not be recorded; those spans stay CPU-only.
    pub gpu_errors: AtomicU64,
    next_flow: AtomicU64,
}

pub(crate) static PROCESS: Process = Process {
    active: AtomicBool::new(false),
    running: AtomicBool::new(false),
    dropped: AtomicU64::new(0),
    gpu_errors: AtomicU64::new(0),
    next_flow: AtomicU64::new(1),
};

impl Process {
    pub(crate) fn count_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_gpu_error(&self) {
        self.gpu_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A new flow id, unique in the process (and so in the file) and far below 2^53.
    pub(crate) fn next_flow_id(&self) -> u64 {
        self.next_flow.fetch_add(1, Ordering::Relaxed)
    }
}
