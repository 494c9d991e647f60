//! The registry of recording threads: what the writer knows of each thread (its track
//! id and name, the consumer end of its ring, whether it still runs, its GPU-timing
//! totals and event holds), kept past the thread's exit until its last events are
//! written; and what GPU timing has cost all of them since the recorder started.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::calib::reuse_window_ns;
use crate::clock::delta_ns;
use crate::cost::{GpuTimingCost, COST_FIELDS, COST_SCALARS};
use crate::holds::Holds;
use crate::ring::Consumer;

/// Ring slots per thread, drained by the writer every <= 100 ms. A plain span takes one
/// slot (<= 64 bytes), so this holds >= 2048 spans (typically 8192) in ~0.5 MB per
/// recording thread.
pub(crate) const RING_SLOTS: usize = 8192;

/// What the writer knows of one thread. Lives in the registry and outlives the thread.
pub(crate) struct ThreadSlot {
    pub tid: u32,
    /// The OS thread id (`gettid`), what CUDA's activity records name a thread by.
    pub os_tid: u32,
    pub meta: Mutex<ThreadMeta>,
    /// The consumer end of the thread's ring, made at its first recorded event.
    pub ring: Mutex<Option<Consumer>>,
    pub alive: AtomicBool,
    /// The thread's GPU-timing counters (`holds::ThreadGpu::scalars` and its histogram),
    /// stored (not added: one writer) at each of its GPU-timed spans' end.
    pub gpu_cost: [AtomicU64; COST_FIELDS],
    /// The thread's GPU span events and who holds them.
    pub holds: Arc<Holds>,
}

pub(crate) struct ThreadMeta {
    pub name: String,
    /// Bumped at each rename, so the writer writes a new `thread_name`.
    pub generation: u64,
    /// The device and label given to `bind_gpu`.
    pub gpu: Option<(usize, String)>,
}

impl ThreadSlot {
    pub(crate) fn meta(&self) -> MutexGuard<'_, ThreadMeta> {
        self.meta.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Every recording thread, and the GPU-timing totals of those that left.
struct Registry {
    slots: Vec<Arc<ThreadSlot>>,
    /// GPU-timing totals of threads that have left the registry, and the grand totals
    /// when the recorder started (the counters only grow).
    retired: [u64; COST_FIELDS],
    baseline: [u64; COST_FIELDS],
    /// The tid the next thread gets: threads are numbered in the order they first record.
    next_tid: u32,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    slots: Vec::new(),
    retired: [0; COST_FIELDS],
    baseline: [0; COST_FIELDS],
    next_tid: 1,
});

fn registry_lock() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// The registered threads (a snapshot; the writer iterates it without the lock).
pub(crate) fn registry() -> Vec<Arc<ThreadSlot>> {
    registry_lock().slots.clone()
}

/// Registers the calling thread: a new track id, named after the thread.
pub(crate) fn new_slot() -> Arc<ThreadSlot> {
    let mut reg = registry_lock();
    let tid = reg.next_tid;
    reg.next_tid += 1;
    let name = match std::thread::current().name() {
        Some(n) => n.to_string(),
        None => format!("thread {tid}"),
    };
    let slot = Arc::new(ThreadSlot {
        tid,
        os_tid: os_tid(),
        meta: Mutex::new(ThreadMeta {
            name,
            generation: 1,
            gpu: None,
        }),
        ring: Mutex::new(None),
        alive: AtomicBool::new(true),
        gpu_cost: [const { AtomicU64::new(0) }; COST_FIELDS],
        holds: Holds::new(),
    });
    reg.slots.push(slot.clone());
    slot
}

/// The calling thread's OS id.
pub(crate) fn os_tid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Forgets a thread that has exited and whose ring is empty (its GPU-timing totals
/// move to the retired ones).
pub(crate) fn unregister(slot: &Arc<ThreadSlot>) {
    let mut reg = registry_lock();
    let before = reg.slots.len();
    reg.slots.retain(|s| !Arc::ptr_eq(s, slot));
    if reg.slots.len() < before {
        for (r, c) in reg.retired.iter_mut().zip(&slot.gpu_cost) {
            *r += c.load(Ordering::Relaxed);
        }
    }
}

/// Every thread's GPU-timing totals since the process started.
fn cost_totals(reg: &Registry) -> [u64; COST_FIELDS] {
    let mut t = reg.retired;
    for slot in &reg.slots {
        for (i, c) in slot.gpu_cost.iter().enumerate() {
            t[i] += c.load(Ordering::Relaxed);
        }
    }
    t
}

/// What GPU timing has cost the recording threads since the recorder started. Each
/// thread's share is as of its latest GPU-timed span's end.
pub(crate) fn gpu_timing_cost() -> GpuTimingCost {
    let reg = registry_lock();
    let t = cost_totals(&reg);
    let d: [u64; COST_FIELDS] = std::array::from_fn(|i| t[i].saturating_sub(reg.baseline[i]));
    drop(reg);
    GpuTimingCost {
        spans: d[0],
        cpu_ns: delta_ns(0, d[1]),
        events_recorded: d[2],
        events_reused: d[3],
        record_ns: delta_ns(0, d[4]),
        span_cost_hist: std::array::from_fn(|i| d[COST_SCALARS + i]),
        reuse_window_ns: reuse_window_ns(),
    }
}

/// Starts [`gpu_timing_cost`] from zero (a recorder starts).
pub(crate) fn reset_gpu_timing_cost() {
    let mut reg = registry_lock();
    reg.baseline = cost_totals(&reg);
}
