//! The hot path: the on/off switch, the per-thread state, the [`Span`] guard, counters
//! and flows. The writer thread finds every thread's ring through the registry
//! (`thread`).
//!
//! Per enabled span: one relaxed load of the process's `active` flag and one
//! thread-local flag at begin,
//! two raw clock reads, and at the end one copy of a fixed-size [`Head`] into the
//! thread's single-producer ring. The span's fields live in its guard; there is
//! no per-thread stack of open spans: the writer, which sees a thread's events in the
//! order they ended, cuts a guard dropped out of order at its parent's end. No lock, no
//! allocation (after a thread's first span), no formatting. The writer drains the rings;
//! a thread that exits leaves its ring behind, so its last events are still written.
use std::cell::{Cell, RefCell, UnsafeCell};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use chrome_trace_format::ArgValue;

use crate::calib::{self, MAX_DEVICES};
use crate::clock::now;
use crate::cost::COST_SCALARS;
use crate::event::{Arg, GpuPart, Head, Kind, Slot, MAX_ARGS, NO_ARG};
use crate::holds::{self, ThreadGpu};
use crate::names::{self, Name};
use crate::ring::{self, Producer};
use crate::state::PROCESS;
use crate::thread::{new_slot, ThreadSlot, RING_SLOTS};

/// True while the recorder is started and active. One relaxed load: ~0.3 ns.
#[inline(always)]
pub fn enabled() -> bool {
    PROCESS.active.load(Ordering::Relaxed)
}

/// A new flow id, unique in the process (and so in the file) and far below 2^53.
pub fn next_flow_id() -> u64 {
    PROCESS.next_flow_id()
}

/// The thread's recorder state. Touched only when a span ends (to push its event) and by
/// the cold paths (GPU spans, step spans, naming); a span's own fields live in its guard.
struct Local {
    slot: Option<Arc<ThreadSlot>>,
    /// Args of open spans, by start tick.
    args: Vec<(u64, Arg)>,
    /// GPU halves of open GPU-timed spans (with the step they began in and the ticks
    /// their begin spent in the recorder), by start tick.
    gpus: Vec<(u64, GpuPart, u64, u64)>,
    /// Open step spans: start tick, step number, the thread's step (+1) to restore.
    steps: Vec<(u64, u64, u64)>,
    /// Current step + 1 (0: none), set by [`step_span`]; GPU spans carry it.
    step: u64,
    gpu_device: Option<usize>,
    /// Open GPU-timed spans, and the tree id of the outermost one.
    gpu_depth: u32,
    gpu_tree: u32,
    next_tree: u32,
    /// The thread's latest GPU event (reusable by the next span boundary) and what GPU
    /// timing has cost it.
    gpu: ThreadGpu,
}

#[cold]
#[inline(never)]
fn make_ring(r: &mut Option<Producer>) -> &mut Producer {
    let (p, c) = ring::ring(RING_SLOTS);
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        *l.slot().ring.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
    });
    r.insert(p)
}

/// The thread's ring, made at its first event; `None` while the thread is exiting.
#[inline(always)]
fn with_ring<R>(f: impl FnOnce(&mut Producer) -> R) -> Option<R> {
    let p = RING
        .try_with(|r| {
            // SAFETY: `RING` is only touched here; no reference to it outlives this call.
            let r = unsafe { &mut *r.get() };
            match r {
                Some(p) => p as *mut Producer,
                None => make_ring(r) as *mut Producer,
            }
        })
        .ok()?;
    // SAFETY: the producer lives as long as this thread, and `f` (ring code only) does
    // not re-enter the recorder. Taking the pointer out of the closure lets the event be
    // written straight into its slot instead of through a captured copy.
    Some(f(unsafe { &mut *p }))
}

/// Copies a plain event (no args, no GPU half) into the thread's ring. A full ring drops
/// the event (counted).
#[inline(always)]
fn push_head(head: Head) {
    if with_ring(|p| p.push(Slot::Head(head))) != Some(true) {
        PROCESS.count_dropped();
    }
}

/// Copies an event into the thread's ring: the head, then its args and GPU half, all
/// published at once. A full ring drops the event (counted).
#[inline(never)]
fn push(head: Head, args: &[Arg], gpu: Option<GpuPart>) {
    let args = &args[..args.len().min(MAX_ARGS)];
    if with_ring(|p| p.push_event(head, args, gpu)) != Some(true) {
        PROCESS.count_dropped();
        if let Some(g) = gpu {
            let _ = LOCAL.try_with(|l| l.borrow_mut().slot().holds.release_part(&g));
        }
    }
}

impl Local {
    const fn new() -> Self {
        Local {
            slot: None,
            args: Vec::new(),
            gpus: Vec::new(),
            steps: Vec::new(),
            step: 0,
            gpu_device: None,
            gpu_depth: 0,
            gpu_tree: 0,
            next_tree: 0,
            gpu: ThreadGpu::new(),
        }
    }

    fn slot(&mut self) -> &Arc<ThreadSlot> {
        self.slot.get_or_insert_with(new_slot)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            slot.holds.retire(self.gpu.last);
            slot.alive.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = const { RefCell::new(Local::new()) };
    /// The producer end of this thread's ring, made at its first event.
    static RING: UnsafeCell<Option<Producer>> = const { UnsafeCell::new(None) };
    /// Per-thread switch under the global one ([`set_thread_recording`]). No destructor,
    /// so reading it is one thread-local load.
    static MUTED: Cell<bool> = const { Cell::new(false) };
    /// Recording spans open on this thread. A span that ends with more open than when it
    /// began was dropped out of order; it tells the writer how many it outlived.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Turns recording on or off for the calling thread only (on by default). A trainer whose
/// threads work on different steps at the same moment (a producer runs ahead of its
/// consumer) uses it to record the same steps on every thread, so flows between them
/// have both ends. Read in the out-of-line span begin.
pub fn set_thread_recording(on: bool) {
    MUTED.with(|m| m.set(!on));
}

#[inline(always)]
fn muted() -> bool {
    MUTED.with(|m| m.get())
}

/// Names this thread's track (`thread_name`). Cold: takes a lock and allocates.
pub fn set_thread_name(name: &str) {
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        let slot = l.slot();
        let mut m = slot.meta();
        m.name = name.to_string();
        m.generation += 1;
    });
}

/// Binds this thread's GPU-timed spans to CUDA device `device`: from now on
/// [`gpu_span`] records a pair of events on the thread's *current* stream on that device
/// (make the stream current first, e.g. with `cuda::use_new_stream`). The stream's
/// track is named `stream <id> (<label>)`. Cold: may calibrate the device's clock.
pub fn bind_gpu(device: usize, stream_label: &str) {
    if device >= MAX_DEVICES {
        return;
    }
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        l.gpu_device = Some(device);
        l.slot().meta().gpu = Some((device, stream_label.to_string()));
    });
    calib::ensure_calibrated(device);
}

/// Clears [`bind_gpu`]: this thread's [`gpu_span`]s become CPU-only.
pub fn unbind_gpu() {
    let _ = LOCAL.try_with(|l| l.borrow_mut().gpu_device = None);
}

/// An open span; dropping it ends the span. `!Send`: a span begins and ends on one
/// thread, which is what keeps each thread's track properly nested (a guard dropped out
/// of order is cut at its parent's end by the writer).
///
/// The guard holds the event's fields (32 bytes), so beginning a plain span touches no
/// state beyond two thread-local counters, and ending one is a single copy into the
/// thread's ring. Args, the GPU half and a step's number wait in per-thread side lists,
/// keyed by the span's start tick (unique on a thread), and are gathered at the end.
#[must_use = "a span ends when dropped; bind it: `let _s = span(..)`"]
pub struct Span {
    /// `None`: not recording (then `rec` is left uninitialised, so a disabled span
    /// costs one byte store).
    kind: Option<Kind>,
    rec: MaybeUninit<Rec>,
    _not_send: PhantomData<*const ()>,
}

/// The fields of a recording span.
#[derive(Clone, Copy)]
struct Rec {
    start: u64,
    flow: u64,
    name: Name,
    /// Recording spans open on this thread when it began.
    depth: u32,
    nargs: u8,
    gpu: bool,
    flow_in: bool,
    flow_out: bool,
}

impl Span {
    #[inline(always)]
    const fn off() -> Span {
        Span {
            kind: None,
            rec: MaybeUninit::uninit(),
            _not_send: PhantomData,
        }
    }

    /// Whether this span is recording (the recorder was active when it began).
    #[inline]
    pub fn is_recording(&self) -> bool {
        self.kind.is_some()
    }

    #[inline(always)]
    fn rec(&mut self) -> Option<&mut Rec> {
        // SAFETY: `rec` is initialised whenever `kind` is set (only by `begin`).
        self.kind.map(|_| unsafe { self.rec.assume_init_mut() })
    }

    #[inline(always)]
    fn begin(name: Name, kind: Kind) -> Span {
        if muted() {
            return Span::off();
        }
        let depth = DEPTH.with(|d| d.replace(d.get().wrapping_add(1)));
        Span {
            kind: Some(kind),
            rec: MaybeUninit::new(Rec {
                // Read the clock last on begin, so the span excludes the recorder's work.
                start: now(),
                flow: 0,
                name,
                depth,
                nargs: 0,
                gpu: false,
                flow_in: false,
                flow_out: false,
            }),
            _not_send: PhantomData,
        }
    }

    /// Attaches a numeric argument (`args.<key>`). At most [`MAX_ARGS`](crate::MAX_ARGS)
    /// keys; a key set twice keeps the last value.
    #[inline]
    pub fn arg(&mut self, key: &'static str, value: impl Into<ArgValue>) {
        if let Some(r) = self.rec() {
            set_arg(r, key, value.into());
        }
    }

    /// Makes this span the source of flow `id` (`bind_id` + `flow_out`). A span carries
    /// one flow: a GPU-timed span already uses its own for the CPU-to-GPU arrow, and
    /// ignores this call.
    #[inline]
    pub fn flow_out(&mut self, id: u64) {
        if let Some(r) = self.rec().filter(|r| !r.gpu) {
            r.flow = id;
            r.flow_out = true;
        }
    }

    /// Makes this span the destination of flow `id` (`bind_id` + `flow_in`); see
    /// [`flow_out`](Self::flow_out) for the one-flow rule.
    #[inline]
    pub fn flow_in(&mut self, id: u64) {
        if let Some(r) = self.rec().filter(|r| !r.gpu) {
            r.flow = id;
            r.flow_in = true;
        }
    }
}

fn set_arg(r: &mut Rec, key: &'static str, value: ArgValue) {
    let start = r.start;
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        if let Some(a) = l
            .args
            .iter_mut()
            .rev()
            .find(|(s, a)| *s == start && a.key == key)
        {
            a.1.value = value;
        } else if (r.nargs as usize) < MAX_ARGS {
            r.nargs += 1;
            l.args.push((start, Arg { key, value }));
        }
    });
}

impl Drop for Span {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(kind) = self.kind {
            // Read the clock first on end.
            let end = now();
            // SAFETY: initialised since `kind` is set.
            let r = unsafe { self.rec.assume_init_ref() };
            if r.nargs == 0 && !r.gpu && kind != Kind::Step {
                end_span(r, kind, end);
            } else {
                end_slow(r, kind, end);
            }
        }
    }
}

#[inline(always)]
fn head_of(r: &Rec, kind: Kind, end: u64) -> Head {
    let open = DEPTH.with(|d| d.replace(d.get().wrapping_sub(1)));
    Head {
        start: r.start,
        end,
        flow: r.flow,
        aux: 0,
        name: r.name,
        outlived: open.saturating_sub(r.depth).saturating_sub(1),
        kind,
        flow_in: r.flow_in,
        flow_out: r.flow_out,
        nargs: 0,
        gpu: false,
    }
}

#[inline(never)]
fn end_span(r: &Rec, kind: Kind, end: u64) {
    push_head(head_of(r, kind, end));
}

/// Ending a span with args, a GPU half, or a step to restore: gathers them from the
/// side lists.
#[cold]
#[inline(never)]
fn end_slow(r: &Rec, kind: Kind, end: u64) {
    let mut head = head_of(r, kind, end);
    let start = r.start;
    let mut begin_ticks = 0;
    let gathered = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        let l = &mut *l;
        if kind == Kind::Step {
            if let Some(k) = l.steps.iter().rposition(|t| t.0 == start) {
                let (_, step, prev) = l.steps.remove(k);
                head.aux = step;
                l.step = prev;
            }
        }
        let mut part = None;
        if r.gpu {
            if let Some(k) = l.gpus.iter().rposition(|g| g.0 == start) {
                let (_, mut g, step, ticks) = l.gpus.remove(k);
                begin_ticks = ticks;
                l.gpu_depth = l.gpu_depth.saturating_sub(1);
                let holds = &l.slot.get_or_insert_with(new_slot).holds;
                if holds::record_end(holds, &mut g, &mut l.gpu, end) {
                    head.gpu = true;
                    head.aux = step;
                    part = Some(g);
                }
            }
            if part.is_none() {
                head.flow = 0;
                head.flow_out = false;
            }
        }
        let mut args = [NO_ARG; MAX_ARGS];
        let mut n = 0;
        for (st, a) in &l.args {
            if *st == start && n < MAX_ARGS {
                args[n] = *a;
                n += 1;
            }
        }
        if n > 0 {
            let tail = l.args.len() - n;
            if l.args[tail..].iter().all(|(st, _)| *st == start) {
                l.args.truncate(tail);
            } else {
                l.args.retain(|(st, _)| *st != start);
            }
        }
        (args, n, part)
    });
    let mut timed = false;
    if let Ok((args, n, part)) = gathered {
        head.nargs = n as u8;
        timed = part.is_some();
        push(head, &args[..n], part);
    }
    if r.gpu {
        // The last thing the recorder does on a GPU-timed path: the thread's latest event
        // is handed back to its code now (see `holds::LastRecord`).
        let _ = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            let l = &mut *l;
            let Some(t) = l.gpu.last.as_mut().map(|last| last.touch()) else {
                return;
            };
            if timed {
                let bucket = l.gpu.span_done(begin_ticks + t.saturating_sub(end));
                let (scalars, count) = (l.gpu.scalars(), l.gpu.hist[bucket]);
                // Only the fields that can have changed: the counters and one bucket.
                let cost = &l.slot().gpu_cost;
                for (c, v) in cost.iter().zip(scalars) {
                    c.store(v, Ordering::Relaxed);
                }
                cost[COST_SCALARS + bucket].store(count, Ordering::Relaxed);
            }
        });
    }
}

/// A CPU span (`cat:"cpu"`) on this thread's track.
#[inline(always)]
pub fn span(name: Name) -> Span {
    if !enabled() {
        return Span::off();
    }
    Span::begin(name, Kind::Cpu)
}

/// A queue span (`cat:"queue"`): time spent putting into or getting from a queue.
#[inline]
pub fn queue_span(name: Name) -> Span {
    if !enabled() {
        return Span::off();
    }
    Span::begin(name, Kind::Queue)
}

/// `ProfilerStep#<step>` (`cat:"step"`). While it is open, this thread's GPU spans carry
/// `args.step = step`.
pub fn step_span(step: u64) -> Span {
    if !enabled() {
        return Span::off();
    }
    let mut s = Span::begin(names::step_name(), Kind::Step);
    if let Some(r) = s.rec() {
        let _ = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            let prev = std::mem::replace(&mut l.step, step + 1);
            l.steps.push((r.start, step, prev));
        });
    }
    s
}

/// A CPU span which, when this thread is bound to a device ([`bind_gpu`]) and the
/// recorder has a GPU backend, also records a GPU event on the thread's current stream
/// at begin and at end. The writer turns the pair into a `cat:"gpu"` span on the
/// device's track, joined to this span by a flow. Costs the backend's two event records
/// on top of a CPU span.
pub fn gpu_span(name: Name) -> Span {
    if !enabled() {
        return Span::off();
    }
    let mut s = Span::begin(name, Kind::Cpu);
    if let Some(r) = s.rec() {
        let _ = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            let l = &mut *l;
            let Some(device) = l.gpu_device else {
                return;
            };
            let root = l.gpu_depth == 0;
            if root {
                l.next_tree = l.next_tree.wrapping_add(1);
                l.gpu_tree = l.next_tree;
            }
            let tree = l.gpu_tree;
            let holds = &l.slot.get_or_insert_with(new_slot).holds;
            let Some(part) = holds::record_begin(holds, device, tree, root, &mut l.gpu, r.start)
            else {
                return;
            };
            r.gpu = true;
            r.flow = next_flow_id();
            r.flow_out = true;
            r.flow_in = false;
            let step = l.step;
            l.gpu_depth += 1;
            // The begin's cost is counted with the span, at its end.
            let t = l.gpu.last.as_mut().map_or(r.start, |last| last.touch());
            l.gpus
                .push((r.start, part, step, t.saturating_sub(r.start)));
        });
    }
    s
}

/// A counter sample: a `C` event on the process, shown as track `<name> <key>`. Its
/// `cat` is the name's first `.`-separated component. Non-finite values are skipped.
#[inline]
pub fn counter(name: Name, key: &'static str, value: f64) {
    if !enabled() || !value.is_finite() || muted() {
        return;
    }
    let mut head = Head::new(name, Kind::Counter);
    head.nargs = 1;
    head.start = now();
    head.end = head.start;
    let arg = Arg {
        key,
        value: ArgValue::F64(value),
    };
    push(head, &[arg], None);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disabled_span_is_small_and_inert() {
        assert!(std::mem::size_of::<Span>() <= 40);
        let mut s = Span::off();
        assert!(!s.is_recording());
        s.arg("k", 1u64);
        s.flow_out(3);
        assert!(s.rec().is_none());
    }
}
