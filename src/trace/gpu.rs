//! GPU timing without synchronizing the training threads. The recorder sees a GPU only
//! through [`GpuBackend`] (the CUDA implementation lives in `crate::cuda`; tests use
//! [`MockGpu`](super::MockGpu)): a GPU-timed span records one backend event on the
//! calling thread's current stream at begin and one at end (or reuses the previous one,
//! see [`LastRecord`]), and the writer thread later
//! asks, without blocking, whether they have completed and how far apart they are.
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

use super::clock::{delta_ns, now};
use super::event::GpuPart;
use super::local::{GPU_ERRORS, RUNNING};

/// Device indices at or above this are not GPU-timed.
pub const MAX_DEVICES: usize = 64;

/// An event handle of a [`GpuBackend`], opaque to the recorder (a `cudaEvent_t` for
/// CUDA, an index for the mock).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GpuEvent(pub u64);

/// A device's entry in the file's `deviceProperties`.
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
        "cuda-events"
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

/// The backend of the running recorder.
static BACKEND: RwLock<Option<Arc<dyn GpuBackend>>> = RwLock::new(None);

pub(crate) fn backend() -> Option<Arc<dyn GpuBackend>> {
    BACKEND.read().unwrap_or_else(|p| p.into_inner()).clone()
}

pub(crate) fn set_backend(b: Option<Arc<dyn GpuBackend>>) {
    *BACKEND.write().unwrap_or_else(|p| p.into_inner()) = b;
}

/// The epoch of each device's latest calibration; 0 while it has none (then GPU spans
/// stay CPU-only, as a span without a calibration before it cannot be placed).
static DEVICE_EPOCH: [AtomicU32; MAX_DEVICES] = [const { AtomicU32::new(0) }; MAX_DEVICES];

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

static CALS: Mutex<CalStore> = Mutex::new(CalStore {
    next_epoch: 0,
    devices: BTreeMap::new(),
});

pub(crate) fn cals() -> MutexGuard<'static, CalStore> {
    CALS.lock().unwrap_or_else(|p| p.into_inner())
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
    REUSE_CALIBRATED_NS.store(0, Ordering::Relaxed);
    let mut c = cals();
    c.devices.clear();
    c.next_epoch = 0;
    for e in &DEVICE_EPOCH {
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
    drop(c);
    release_held(b);
    reset();
}

/// Calibrates `device` unless it already has a calibration. Cold; runs on the caller.
pub(crate) fn ensure_calibrated(device: usize) {
    if device >= MAX_DEVICES
        || !RUNNING.load(Ordering::Acquire)
        || DEVICE_EPOCH[device].load(Ordering::Acquire) != 0
    {
        return;
    }
    if let Some(b) = backend() {
        if calibrate(&*b, device).is_err() {
            GPU_ERRORS.fetch_add(1, Ordering::Relaxed);
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
    DEVICE_EPOCH[device].store(epoch, Ordering::Release);
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

/// A recording thread's most recent span event. The next GPU-timed span boundary on that
/// thread reuses it instead of recording a new one when the thread's own code ran for
/// less than the reuse window (see [`reuse_window_ns`]) since the recorder returned, on
/// the same device and stream: nothing can have been queued on the stream in between
/// (queuing any work takes longer than that), so a new event would complete at the same
/// moment. Back-to-back sections (one ends, the next begins; an inner span ends, then
/// its parent) then cost one event record per boundary instead of two.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LastRecord {
    event: u64,
    /// Its index in the thread's event table.
    slot: u32,
    stream: u64,
    device: u32,
    gen: u32,
    /// Clock ticks when the recorder last handed control back to the thread's own code
    /// after using this event.
    after: u64,
}

impl LastRecord {
    /// The thread's code runs again from now on (called as the recorder returns).
    /// Returns the clock reading it took.
    pub(crate) fn touch(&mut self) -> u64 {
        self.after = now();
        self.after
    }
}

/// The smallest reuse window (see [`LastRecord`]): far below the CPU cost of queuing
/// anything on a stream on any host.
pub(crate) const REUSE_NS: u64 = 200;
/// The largest window a calibration may set.
const REUSE_MAX_NS: u64 = 2_000;
/// The window measured at calibration: the cheapest event record seen on this host, and
/// never below [`REUSE_NS`]. An event record only queues a marker; queuing work (a kernel
/// launch, a copy, a memset) costs more CPU than that, so a gap shorter than the cheapest
/// record holds no work. (Half of it, as before, left a fifth of the training boundaries
/// just outside the window: 1.09-1.25 events per span against 1.05 from 1 us up, with no
/// change in the sections' GPU times; docs/gpu-results.md.) Zero: not calibrated,
/// [`REUSE_NS`] holds.
static REUSE_CALIBRATED_NS: AtomicU64 = AtomicU64::new(0);
/// A window set by [`set_gpu_event_reuse_window`]; `u64::MAX`: none.
static REUSE_OVERRIDE_NS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Sets the window within which a span boundary reuses its thread's previous GPU event
/// (zero: never); `None` goes back to the calibrated window. For tests and benchmarks,
/// which need a deterministic window; a window longer than the time to queue work on a
/// stream mis-times spans.
#[doc(hidden)]
pub fn set_gpu_event_reuse_window(window: Option<Duration>) {
    let ns = window.map_or(u64::MAX, |w| (w.as_nanos() as u64).min(u64::MAX - 1));
    REUSE_OVERRIDE_NS.store(ns, Ordering::Relaxed);
}

/// The reuse window in force, in ns.
pub fn reuse_window_ns() -> u64 {
    match REUSE_OVERRIDE_NS.load(Ordering::Relaxed) {
        u64::MAX => match REUSE_CALIBRATED_NS.load(Ordering::Relaxed) {
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
/// from the cheapest (see [`REUSE_CALIBRATED_NS`]). Cold: at a device's first
/// calibration.
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
    let _ = REUSE_CALIBRATED_NS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
        Some(if w == 0 { window } else { w.min(window) })
    });
}

/// A recording thread's GPU-timing state: its latest event, and running totals of what
/// GPU timing has cost it (published to its registry slot at each GPU span's end).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ThreadGpu {
    pub last: Option<LastRecord>,
    /// GPU-timed spans ended with both events, and the clock ticks their begins and ends
    /// spent in the recorder.
    pub spans: u64,
    pub ticks: u64,
    /// Span boundaries that recorded a new event, and those that reused `last`.
    pub recorded: u64,
    pub reused: u64,
    /// Ticks spent inside the backend's event records (the driver's share), part of
    /// `ticks`.
    pub record_ticks: u64,
    /// GPU-timed spans by their own cost (begin and end together), in buckets of
    /// [`COST_BUCKET_NS`].
    pub hist: [u64; COST_BUCKETS],
}

impl ThreadGpu {
    pub(crate) const fn new() -> Self {
        ThreadGpu {
            last: None,
            spans: 0,
            ticks: 0,
            recorded: 0,
            reused: 0,
            record_ticks: 0,
            hist: [0; COST_BUCKETS],
        }
    }

    /// Counts a GPU-timed span that spent `ticks` in the recorder (begin and end). Returns
    /// its histogram bucket.
    pub(crate) fn span_done(&mut self, ticks: u64) -> usize {
        self.spans += 1;
        self.ticks += ticks;
        let b = cost_bucket(delta_ns(0, ticks));
        self.hist[b] += 1;
        b
    }

    /// The counters in [`COST_FIELDS`] order (spans, ticks, events recorded, events
    /// reused, record ticks); the histogram follows them there.
    pub(crate) fn scalars(&self) -> [u64; COST_SCALARS] {
        [
            self.spans,
            self.ticks,
            self.recorded,
            self.reused,
            self.record_ticks,
        ]
    }
}

/// Buckets of the per-span cost histogram ([`GpuTimingCost`](super::GpuTimingCost)):
/// bucket `i` counts spans that cost `[i, i + 1) * COST_BUCKET_NS`; the last is open.
pub const COST_BUCKETS: usize = 64;
pub const COST_BUCKET_NS: u64 = 250;

/// The bucket of a span that cost `ns`.
pub(crate) fn cost_bucket(ns: u64) -> usize {
    ((ns / COST_BUCKET_NS) as usize).min(COST_BUCKETS - 1)
}

/// Counters per thread: spans, ticks, events recorded, events reused, record ticks,
/// then [`COST_BUCKETS`] histogram counts.
pub(crate) const COST_SCALARS: usize = 5;
pub(crate) const COST_FIELDS: usize = COST_SCALARS + COST_BUCKETS;

/// Bumped when a recorder finishes: events of an earlier recorder are never reused or
/// released again.
static GEN: AtomicU32 = AtomicU32::new(1);

/// Events a thread takes from its backend's pool at once when it has none free.
const TAKE_BATCH: usize = 64;

/// The span events of one recording thread, and who holds them. Each thread has its own,
/// so the training threads share no lock and no cache line on the span path: the thread
/// locks it at each GPU span boundary, and the writer only when it releases that thread's
/// spans (an uncontended lock, on a line the thread mostly owns).
///
/// A live event is held by each span that uses it (until the writer has placed or
/// dropped that span) and by the thread while it is its [`LastRecord`]. An event no one
/// holds goes back to the thread's free list, from which its next boundaries record; the
/// thread goes to the backend's pool only when that list is empty.
pub(crate) struct Holds(Mutex<HoldState>);

struct HoldState {
    /// The backend of the recorder these events belong to (so that the span path does
    /// not take the global lock, nor touch a shared reference count).
    backend: Option<Arc<dyn GpuBackend>>,
    events: Events,
}

/// A thread's events, each at a fixed index of `table` for as long as the thread has
/// it, so a span finds its holders' count by index (carried in its [`GpuPart`] and the
/// thread's [`LastRecord`]): no hashing, one cache line per boundary.
struct Events {
    /// That recorder's generation; 0: none yet.
    gen: u32,
    table: Vec<Entry>,
    /// Indices of entries nobody holds, of `free_device`, ready to record again.
    free: Vec<u32>,
    free_device: u32,
    /// The thread has exited: its events go straight back to the backend.
    dead: bool,
    /// Scratch for taking events from the backend.
    taken: Vec<GpuEvent>,
}

#[derive(Clone, Copy)]
struct Entry {
    /// 0: the entry is empty (its event went back to the backend).
    event: u64,
    device: u32,
    holds: u32,
}

/// Every thread's [`Holds`], so that a finishing recorder can take back the events of
/// threads it cannot reach (pruned of exited threads' as it does).
static ALL_HOLDS: Mutex<Vec<Arc<Holds>>> = Mutex::new(Vec::new());

impl Holds {
    /// A thread's holds, registered for [`release_held`].
    pub(crate) fn new() -> Arc<Holds> {
        let h = Arc::new(Holds(Mutex::new(HoldState {
            backend: None,
            events: Events {
                gen: 0,
                table: Vec::new(),
                free: Vec::new(),
                free_device: 0,
                dead: false,
                taken: Vec::new(),
            },
        })));
        lock(&ALL_HOLDS).push(h.clone());
        h
    }

    fn lock(&self) -> MutexGuard<'_, HoldState> {
        lock(&self.0)
    }

    /// Drops one hold of a span of generation `gen` on the event at `slot`; the last
    /// makes it free.
    fn release(&self, gen: u32, slot: u32, event: u64) {
        let mut h = self.lock();
        let HoldState { backend, events } = &mut *h;
        if let Some(b) = backend.as_deref() {
            events.unref(b, gen, slot, event);
        }
    }

    /// Drops both holds of a span's GPU half (written, discarded, or lost to a full ring).
    pub(crate) fn release_part(&self, g: &GpuPart) {
        self.release_parts(std::iter::once(g));
    }

    /// [`release_part`](Self::release_part) for several spans, under one lock.
    pub(crate) fn release_parts<'a>(&self, parts: impl Iterator<Item = &'a GpuPart>) {
        let mut h = self.lock();
        let HoldState { backend, events } = &mut *h;
        let Some(b) = backend.as_deref() else {
            return;
        };
        for g in parts {
            events.unref(b, g.gen, g.begin_slot, g.begin);
            if g.end != 0 {
                events.unref(b, g.gen, g.end_slot, g.end);
            }
        }
    }

    /// The thread exits: drops its hold on its last record and returns its free events;
    /// spans still on their way to the writer return theirs as they are released.
    pub(crate) fn retire(&self, last: Option<LastRecord>) {
        let mut h = self.lock();
        let HoldState { backend, events } = &mut *h;
        events.dead = true;
        if let Some(b) = backend.as_deref() {
            if let Some(l) = last {
                events.unref(b, l.gen, l.slot, l.event);
            }
            events.give_back_free(b);
        }
    }
}

impl Events {
    fn unref(&mut self, b: &dyn GpuBackend, gen: u32, slot: u32, event: u64) {
        if gen != self.gen {
            return;
        }
        let Some(e) = self.table.get_mut(slot as usize) else {
            return;
        };
        if e.event != event || e.holds == 0 {
            return;
        }
        e.holds -= 1;
        if e.holds > 0 {
            return;
        }
        if self.dead || e.device != self.free_device {
            b.release(e.device as usize, GpuEvent(e.event));
            e.event = 0;
        } else {
            self.free.push(slot);
        }
    }

    /// Returns the free events to the backend; their entries stay empty.
    fn give_back_free(&mut self, b: &dyn GpuBackend) {
        for i in self.free.drain(..) {
            let e = &mut self.table[i as usize];
            b.release(e.device as usize, GpuEvent(e.event));
            e.event = 0;
        }
    }

    /// Every event the thread has, free or held, back to `b` (the recorder finishes).
    fn give_back_all(&mut self, b: &dyn GpuBackend) {
        for e in &self.table {
            if e.event != 0 {
                b.release(e.device as usize, GpuEvent(e.event));
            }
        }
    }

    /// The index of a free event of `device`, from the free list or else a batch from
    /// the pool.
    #[inline]
    fn take(&mut self, b: &dyn GpuBackend, device: u32) -> Result<u32, GpuError> {
        if device == self.free_device {
            if let Some(i) = self.free.pop() {
                return Ok(i);
            }
        }
        self.refill(b, device)
    }

    #[cold]
    #[inline(never)]
    fn refill(&mut self, b: &dyn GpuBackend, device: u32) -> Result<u32, GpuError> {
        if device != self.free_device {
            self.give_back_free(b);
            self.free_device = device;
        }
        self.taken.clear();
        b.take(device as usize, TAKE_BATCH, &mut self.taken)?;
        // Empty entries are filled first, so the table grows only with what is in use.
        let mut at = 0;
        for ev in self.taken.drain(..) {
            while at < self.table.len() && self.table[at].event != 0 {
                at += 1;
            }
            let entry = Entry {
                event: ev.0,
                device,
                holds: 0,
            };
            match self.table.get_mut(at) {
                Some(slot) => *slot = entry,
                None => self.table.push(entry),
            }
            self.free.push(at as u32);
            at += 1;
        }
        self.free.pop().ok_or(GpuError {
            op: "event pool",
            message: "the backend gave no event".into(),
        })
    }
}

impl HoldState {
    /// Forgets everything of an earlier recorder (whose finish took its events back) and
    /// binds to the running one's backend. Cold.
    #[cold]
    #[inline(never)]
    fn renew(&mut self, gen: u32) {
        self.events.table.clear();
        self.events.free.clear();
        self.events.gen = gen;
        self.backend = backend();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Returns every span event still held (by threads' last records and free lists, or by
/// spans never written) to `b`, and starts a new generation (the recorder finishes).
fn release_held(b: &dyn GpuBackend) {
    let gen = GEN.fetch_add(1, Ordering::AcqRel);
    let mut all = lock(&ALL_HOLDS);
    all.retain(|holds| {
        let mut h = holds.lock();
        let e = &mut h.events;
        if e.gen == gen {
            e.give_back_all(b);
        }
        e.table.clear();
        e.free.clear();
        e.gen = 0;
        h.backend = None;
        // An exited thread's holds are empty now, and nothing will touch them again.
        !h.events.dead
    });
}

/// A span boundary's event: its handle, its index in the thread's table, the stream it
/// was recorded on, and the recorder generation.
struct Boundary {
    event: u64,
    slot: u32,
    stream: u64,
    gen: u32,
}

/// One span boundary's event on the calling thread's current stream: `last` reused when
/// the thread's own code ran for less than the window since the recorder last returned
/// (`entered`: the clock when the recorder was entered again) on the same stream; else a
/// new record, which becomes `last`.
fn record_boundary(
    holds: &Holds,
    device: usize,
    t: &mut ThreadGpu,
    entered: u64,
) -> Option<Boundary> {
    let gen = GEN.load(Ordering::Acquire);
    let mut guard = holds.lock();
    if guard.events.gen != gen {
        guard.renew(gen);
    }
    let HoldState { backend, events } = &mut *guard;
    let b = backend.as_deref()?;
    let dev = device as u32;
    if let Some(l) = t.last {
        if l.gen == gen
            && l.device == dev
            && delta_ns(l.after, entered) < reuse_window_ns()
            && b.current_stream(device).ok() == Some(l.stream)
        {
            if let Some(e) = events.table.get_mut(l.slot as usize) {
                if e.event == l.event && e.holds > 0 {
                    e.holds += 1;
                    t.reused += 1;
                    return Some(Boundary {
                        event: l.event,
                        slot: l.slot,
                        stream: l.stream,
                        gen,
                    });
                }
            }
        }
    }
    let mut called = 0;
    let recorded = events.take(b, dev).and_then(|i| {
        let event = GpuEvent(events.table[i as usize].event);
        called = now();
        match b.record(device, event) {
            Ok(stream) => Ok((i, stream)),
            Err(e) => {
                events.free.push(i);
                Err(e)
            }
        }
    });
    match recorded {
        Ok((slot, stream)) => {
            t.recorded += 1;
            let after = now();
            t.record_ticks += after.saturating_sub(called);
            let e = &mut events.table[slot as usize];
            // Held by the span and by `last`.
            e.holds = 2;
            let event = e.event;
            if let Some(old) = t.last.replace(LastRecord {
                event,
                slot,
                stream,
                device: dev,
                gen,
                after,
            }) {
                events.unref(b, old.gen, old.slot, old.event);
            }
            Some(Boundary {
                event,
                slot,
                stream,
                gen,
            })
        }
        Err(_) => {
            GPU_ERRORS.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Begin half of a GPU-timed span: an event on the thread's current stream. `None`
/// (span stays CPU-only) without a backend, a calibration or on error.
pub(crate) fn record_begin(
    holds: &Holds,
    device: usize,
    tree: u32,
    root: bool,
    t: &mut ThreadGpu,
    entered: u64,
) -> Option<GpuPart> {
    let epoch = DEVICE_EPOCH.get(device)?.load(Ordering::Acquire);
    if epoch == 0 {
        return None;
    }
    let at = record_boundary(holds, device, t, entered)?;
    Some(GpuPart {
        begin: at.event,
        end: 0,
        begin_slot: at.slot,
        end_slot: 0,
        stream: at.stream,
        device: device as u32,
        epoch,
        tree,
        root,
        gen: at.gen,
    })
}

/// End half: an event on the thread's current stream. On failure drops the begin event
/// and returns false (the span stays CPU-only).
pub(crate) fn record_end(holds: &Holds, g: &mut GpuPart, t: &mut ThreadGpu, entered: u64) -> bool {
    match record_boundary(holds, g.device as usize, t, entered) {
        Some(at) if at.gen == g.gen => {
            g.end = at.event;
            g.end_slot = at.slot;
            true
        }
        Some(at) => {
            holds.release(at.gen, at.slot, at.event);
            false
        }
        None => {
            holds.release(g.gen, g.begin_slot, g.begin);
            false
        }
    }
}
