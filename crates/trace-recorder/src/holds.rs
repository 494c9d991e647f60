//! The span events of each recording thread and who holds them ([`Holds`]), the
//! thread's latest event that the next span boundary may reuse ([`LastRecord`]), what
//! GPU timing has cost the thread ([`ThreadGpu`]), and recording a GPU-timed span's
//! begin and end ([`record_begin`], [`record_end`]).
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{GpuBackend, GpuError, GpuEvent};
use crate::calib::{self, reuse_window_ns};
use crate::clock::{delta_ns, now};
use crate::cost::{cost_bucket, COST_BUCKETS, COST_SCALARS};
use crate::event::GpuPart;
use crate::state::PROCESS;

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
    /// [`COST_BUCKET_NS`](crate::cost::COST_BUCKET_NS).
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

    /// The counters in [`COST_FIELDS`](crate::cost::COST_FIELDS) order (spans, ticks, events recorded, events
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

/// Every thread's event holds, and the recorder generation they belong to.
struct AllHolds {
    /// Bumped when a recorder finishes: events of an earlier recorder are never reused
    /// or released again.
    gen: AtomicU32,
    /// Every thread's [`Holds`], so that a finishing recorder can take back the events
    /// of threads it cannot reach (pruned of exited threads' as it does).
    threads: Mutex<Vec<Arc<Holds>>>,
}

static ALL: AllHolds = AllHolds {
    gen: AtomicU32::new(1),
    threads: Mutex::new(Vec::new()),
};

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
        lock(&ALL.threads).push(h.clone());
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
        self.backend = calib::backend();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Returns every span event still held (by threads' last records and free lists, or by
/// spans never written) to `b`, and starts a new generation (the recorder finishes).
pub(crate) fn release_held(b: &dyn GpuBackend) {
    let gen = ALL.gen.fetch_add(1, Ordering::AcqRel);
    let mut all = lock(&ALL.threads);
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
    let gen = ALL.gen.load(Ordering::Acquire);
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
            PROCESS.count_gpu_error();
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
    let epoch = calib::epoch(device);
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
