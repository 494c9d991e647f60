//! GPU timing without synchronizing the training threads: the running recorder's
//! backend, the calibrations that place GPU events on the CPU clock, and the window
//! within which a span boundary reuses its thread's previous event.
//!
//! A GPU-timed span records one backend event on the calling thread's current stream at
//! begin and one at end (or reuses the previous one, see `holds::LastRecord`), and the
//! writer thread later asks, without blocking, whether they have completed and how far
//! apart they are.
//!
//! Placing GPU spans on the CPU clock: a *calibration* records an event on a stream
//! private to the backend, polls it until it completes and takes the CPU time seen then
//! as that event's time (an upper bound, so GPU spans err late, never early). A span's
//! GPU start is the calibration's CPU time plus the elapsed time between the calibration
//! event and the span's begin event. Calibrations are refreshed at every file flush (so
//! clock drift and `f32` elapsed-time precision stay small); each outermost GPU span
//! remembers the calibration current when it began (its *epoch*) and the writer places
//! its whole tree of nested GPU spans with that one mapping, so the tree stays nested.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use chrome_trace_format::tracks::MAX_GPU_DEVICES;

use crate::backend::{GpuBackend, GpuError, GpuEvent};
use crate::clock::{delta_ns, now};
use crate::state::PROCESS;

/// Device indices at or above this are not GPU-timed.
pub const MAX_DEVICES: usize = MAX_GPU_DEVICES;

/// The GPU side of the process's one recorder.
struct GpuState {
    /// The backend of the running recorder.
    backend: RwLock<Option<Arc<dyn GpuBackend>>>,
    /// The epoch of each device's latest calibration; 0 while it has none (then GPU
    /// spans stay CPU-only, as a span without a calibration before it cannot be placed).
    epochs: [AtomicU32; MAX_DEVICES],
    cals: Mutex<CalStore>,
    /// The reuse window measured at calibration (see [`reuse_window_ns`]); zero: not
    /// calibrated, [`REUSE_NS`] holds.
    reuse_calibrated_ns: AtomicU64,
    /// A window set by [`set_gpu_event_reuse_window`]; `u64::MAX`: none.
    reuse_override_ns: AtomicU64,
}

static GPU: GpuState = GpuState {
    backend: RwLock::new(None),
    epochs: [const { AtomicU32::new(0) }; MAX_DEVICES],
    cals: Mutex::new(CalStore {
        next_epoch: 0,
        devices: BTreeMap::new(),
    }),
    reuse_calibrated_ns: AtomicU64::new(0),
    reuse_override_ns: AtomicU64::new(u64::MAX),
};

pub(crate) fn backend() -> Option<Arc<dyn GpuBackend>> {
    GPU.backend
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

pub(crate) fn set_backend(b: Option<Arc<dyn GpuBackend>>) {
    *GPU.backend.write().unwrap_or_else(|p| p.into_inner()) = b;
}

/// The epoch of `device`'s latest calibration; 0 (none) for devices out of range.
#[inline]
pub(crate) fn epoch(device: usize) -> u32 {
    GPU.epochs
        .get(device)
        .map_or(0, |e| e.load(Ordering::Acquire))
}

/// One calibration: `event` completed at CPU tick `cpu_ticks` (or just before).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cal {
    pub epoch: u32,
    pub event: GpuEvent,
    pub cpu_ticks: u64,
    /// Added to every span placed with this calibration, raised whenever a span would
    /// otherwise start before the CPU span that launched it.
    pub raise_ns: u64,
}

#[derive(Default)]
pub(crate) struct CalStore {
    next_epoch: u32,
    pub devices: BTreeMap<usize, Vec<Cal>>,
}

pub(crate) fn cals() -> MutexGuard<'static, CalStore> {
    GPU.cals.lock().unwrap_or_else(|p| p.into_inner())
}

/// Calibrations older than this many of their device's newer ones are dropped unless a
/// pending span still refers to them (at one per flush, ~a minute of history).
const CAL_HISTORY: usize = 64;
/// A calibration whose event took longer than this to be seen complete is too loose to
/// replace an existing one.
const CAL_MAX_WINDOW_NS: u64 = 200_000;
/// Events kept free in each calibrated device's pool ([`GpuBackend::reserve`]): more than
/// a busy trainer records between two writer passes.
pub(crate) const RESERVE_EVENTS: usize = 1024;
/// How long a calibration polls before giving up.
const CAL_TIMEOUT: Duration = Duration::from_millis(50);

/// Forgets all calibrations (a new recorder starts with a new backend).
pub(crate) fn reset() {
    GPU.reuse_calibrated_ns.store(0, Ordering::Relaxed);
    let mut c = cals();
    c.devices.clear();
    c.next_epoch = 0;
    for e in &GPU.epochs {
        e.store(0, Ordering::Release);
    }
}

/// Returns every calibration event to `b` and forgets them (the recorder finishes).
pub(crate) fn release_cals(b: &dyn GpuBackend) {
    let mut c = cals();
    for (&device, list) in &c.devices {
        for cal in list {
            b.release(device, cal.event);
        }
    }
    c.devices.clear();
}

/// Calibrates `device` unless it already has a calibration. Cold; runs on the caller.
pub(crate) fn ensure_calibrated(device: usize) {
    if device >= MAX_DEVICES || !PROCESS.running.load(Ordering::Acquire) || epoch(device) != 0 {
        return;
    }
    if let Some(b) = backend() {
        if calibrate(&*b, device).is_err() {
            PROCESS.count_gpu_error();
        } else {
            b.reserve(device, RESERVE_EVENTS);
            calibrate_reuse_window(&*b, device);
        }
    }
}

/// Records a calibration event for `device` and polls it to completion; publishes it as
/// the device's newest epoch. A loose result (completion seen late) is kept only when
/// the device has no calibration yet.
pub(crate) fn calibrate(b: &dyn GpuBackend, device: usize) -> Result<(), GpuError> {
    let t0 = now();
    let ev = b.record_calibration(device)?;
    let mut spins = 0u32;
    let t1 = loop {
        match b.query(ev) {
            Ok(true) => break now(),
            Ok(false) => {}
            Err(e) => {
                b.release(device, ev);
                return Err(e);
            }
        }
        if delta_ns(t0, now()) > CAL_TIMEOUT.as_nanos() as u64 {
            b.release(device, ev);
            return Err(GpuError {
                op: "calibration",
                message: format!("event did not complete within {CAL_TIMEOUT:?}"),
            });
        }
        // Spin briefly (an idle stream completes in microseconds), then stop hogging
        // a core.
        spins += 1;
        if spins < 2000 {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    };
    let mut store = cals();
    let list = store.devices.entry(device).or_default();
    if !list.is_empty() && delta_ns(t0, t1) > CAL_MAX_WINDOW_NS {
        drop(store);
        b.release(device, ev);
        return Ok(());
    }
    store.next_epoch += 1;
    let epoch = store.next_epoch;
    store.devices.entry(device).or_default().push(Cal {
        epoch,
        event: ev,
        cpu_ticks: t1,
        // Each calibration has its own error, so corrections are not inherited; the
        // writer keeps consecutive spans of a stream from overlapping on its own.
        raise_ns: 0,
    });
    GPU.epochs[device].store(epoch, Ordering::Release);
    Ok(())
}

/// Drops calibrations of `device` that no pending span refers to (`keep_from`: the
/// oldest epoch still referred to), keeping the newest [`CAL_HISTORY`].
pub(crate) fn prune(b: &dyn GpuBackend, device: usize, keep_from: Option<u32>) {
    let mut store = cals();
    let Some(list) = store.devices.get_mut(&device) else {
        return;
    };
    let n = list.len();
    let mut i = 0;
    list.retain(|c| {
        i += 1;
        let keep = i + CAL_HISTORY > n || keep_from.is_some_and(|k| c.epoch >= k);
        if !keep {
            b.release(device, c.event);
        }
        keep
    });
}

/// The smallest reuse window: far below the CPU cost of queuing anything on a stream on
/// any host.
pub(crate) const REUSE_NS: u64 = 200;
/// The largest window a calibration may set.
const REUSE_MAX_NS: u64 = 2_000;

/// Sets the window within which a span boundary reuses its thread's previous GPU event
/// (zero: never); `None` goes back to the calibrated window. For tests and benchmarks,
/// which need a deterministic window; a window longer than the time to queue work on a
/// stream mis-times spans.
#[doc(hidden)]
pub fn set_gpu_event_reuse_window(window: Option<Duration>) {
    let ns = window.map_or(u64::MAX, |w| (w.as_nanos() as u64).min(u64::MAX - 1));
    GPU.reuse_override_ns.store(ns, Ordering::Relaxed);
}

/// The reuse window in force, in ns. Measured at calibration: the cheapest event record
/// seen on this host, and never below 200 ns. An event record only queues a marker;
/// queuing work (a kernel launch, a copy, a memset) costs more CPU than that, so a gap
/// shorter than the cheapest record holds no work (docs/gpu-results.md has the
/// experiment that chose it).
pub fn reuse_window_ns() -> u64 {
    match GPU.reuse_override_ns.load(Ordering::Relaxed) {
        u64::MAX => match GPU.reuse_calibrated_ns.load(Ordering::Relaxed) {
            0 => REUSE_NS,
            ns => ns,
        },
        ns => ns,
    }
}

/// Event records timed to calibrate the reuse window: enough that the cheapest is near
/// the host's floor (a few of the first records in a process are slow).
const REUSE_CAL_RECORDS: usize = 32;

/// Times event records on the backend's calibration stream and sets the reuse window
/// from the cheapest (see [`reuse_window_ns`]). Cold: at a device's first calibration.
fn calibrate_reuse_window(b: &dyn GpuBackend, device: usize) {
    let mut best = u64::MAX;
    for _ in 0..REUSE_CAL_RECORDS {
        let t0 = now();
        let Ok(ev) = b.record_calibration(device) else {
            return;
        };
        best = best.min(delta_ns(t0, now()));
        b.release(device, ev);
    }
    let window = best.clamp(REUSE_NS, REUSE_MAX_NS);
    // Several devices: the smallest window holds for all of them.
    let _ = GPU
        .reuse_calibrated_ns
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            Some(if w == 0 { window } else { w.min(window) })
        });
}
