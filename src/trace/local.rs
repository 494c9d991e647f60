//! The hot path: the on/off switch, the per-thread state, the [`Span`] guard, counters
//! and flows, and the registry through which the writer thread finds every thread's ring.
//!
//! Per enabled span: one relaxed load of [`ACTIVE`], a thread-local borrow, two raw clock
//! reads, a push/pop on a small per-thread stack of open spans (which keeps a guard
//! dropped out of order from producing overlapping events), and one copy of a fixed-size
//! [`RawEvent`] into the thread's single-producer ring. No lock, no allocation (after a
//! thread's first span), no formatting. The writer drains the rings; a thread that exits
//! leaves its ring behind, so its last events are still written.
use std::cell::RefCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rtrb::{Consumer, Producer, RingBuffer};

use super::clock::now;
use super::event::{Arg, ArgValue, GpuPart, Head, Kind, Slot, MAX_ARGS};
use super::gpu;
use super::names::Name;

/// Spans record only while this is set (by [`Recorder::set_active`](super::Recorder)).
pub(crate) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// A recorder (and its writer thread) exists.
pub(crate) static RUNNING: AtomicBool = AtomicBool::new(false);
/// Events lost because a thread's ring was full (the writer fell behind).
pub(crate) static DROPPED: AtomicU64 = AtomicU64::new(0);
/// GPU events that could not be recorded; those spans stay CPU-only.
pub(crate) static GPU_ERRORS: AtomicU64 = AtomicU64::new(0);
static NEXT_FLOW: AtomicU64 = AtomicU64::new(1);
static NEXT_TID: AtomicU32 = AtomicU32::new(1);

/// Ring slots per thread, drained by the writer every <= 100 ms. A plain span takes one
/// slot (<= 64 bytes), so this holds >= 2048 spans (typically 8192) in ~0.5 MB per recording thread.
pub(crate) const RING_SLOTS: usize = 8192;

/// True while the recorder is started and active. One relaxed load: ~0.3 ns.
#[inline(always)]
pub fn enabled() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// A new flow id, unique in the process (and so in the file) and far below 2^53.
pub fn next_flow_id() -> u64 {
    NEXT_FLOW.fetch_add(1, Ordering::Relaxed)
}

/// What the writer knows of one thread. Lives in [`REGISTRY`] and outlives the thread.
pub(crate) struct ThreadSlot {
    pub tid: u32,
    pub meta: Mutex<ThreadMeta>,
    /// The consumer end of the thread's ring, made at its first recorded event.
    pub ring: Mutex<Option<Consumer<Slot>>>,
    pub alive: AtomicBool,
}

pub(crate) struct ThreadMeta {
    pub name: String,
    /// Bumped at each rename, so the writer writes a new `thread_name`.
    pub generation: u64,
    /// The device and label given to [`bind_gpu`].
    pub gpu: Option<(usize, String)>,
}

impl ThreadSlot {
    pub(crate) fn meta(&self) -> MutexGuard<'_, ThreadMeta> {
        self.meta.lock().unwrap_or_else(|p| p.into_inner())
    }
}

static REGISTRY: Mutex<Vec<Arc<ThreadSlot>>> = Mutex::new(Vec::new());

/// The registered threads (a snapshot; the writer iterates it without the lock).
pub(crate) fn registry() -> Vec<Arc<ThreadSlot>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Forgets a thread that has exited and whose ring is empty.
pub(crate) fn unregister(slot: &Arc<ThreadSlot>) {
    REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|s| !Arc::ptr_eq(s, slot));
}

/// One open span on this thread. The event's fields live in the [`Span`] guard (two
/// cache-friendly words for a disabled span, ~40 bytes live); its args and GPU half wait
/// in side vectors, so opening a span writes 32 bytes here.
#[derive(Clone, Copy)]
struct Open {
    seq: u32,
    nargs: u8,
    /// The latest end this span may have: set when an enclosing span was dropped
    /// before it (out of order), so that the two still nest.
    clamp: u64,
    /// For a step span: the thread's step (+1) to restore when it ends.
    prev_step: Option<u64>,
}

struct Local {
    slot: Option<Arc<ThreadSlot>>,
    producer: Option<Producer<Slot>>,
    stack: Vec<Open>,
    /// Args of open spans, by span seq.
    args: Vec<(u32, Arg)>,
    /// GPU halves of open spans, by span seq.
    gpus: Vec<(u32, GpuPart)>,
    next_seq: u32,
    /// Current step + 1 (0: none), set by [`step_span`].
    step: u64,
    gpu_device: Option<usize>,
    gpu_depth: u32,
    gpu_tree: u32,
    next_tree: u32,
}

fn new_slot() -> Arc<ThreadSlot> {
    let tid = NEXT_TID.fetch_add(1, Ordering::Relaxed);
    let cur = std::thread::current();
    let name = match cur.name() {
        Some(n) => n.to_string(),
        None => format!("thread {tid}"),
    };
    let slot = Arc::new(ThreadSlot {
        tid,
        meta: Mutex::new(ThreadMeta {
            name,
            generation: 1,
            gpu: None,
        }),
        ring: Mutex::new(None),
        alive: AtomicBool::new(true),
    });
    REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(slot.clone());
    slot
}

#[cold]
#[inline(never)]
fn make_ring<'a>(
    producer: &'a mut Option<Producer<Slot>>,
    slot: &mut Option<Arc<ThreadSlot>>,
) -> &'a mut Producer<Slot> {
    let (p, c) = RingBuffer::new(RING_SLOTS);
    let slot = slot.get_or_insert_with(new_slot);
    *slot.ring.lock().unwrap_or_else(|p| p.into_inner()) = Some(c);
    producer.insert(p)
}

/// Copies an event into the thread's ring: the head, then its args and GPU half, all
/// published at once. A full ring drops the event (counted).
#[inline]
fn push(
    producer: &mut Option<Producer<Slot>>,
    slot: &mut Option<Arc<ThreadSlot>>,
    head: Head,
    args: &[Arg],
    gpu: Option<GpuPart>,
) {
    let p = match producer {
        Some(p) => p,
        None => make_ring(producer, slot),
    };
    let ok = if args.is_empty() && gpu.is_none() {
        p.push(Slot::Head(head)).is_ok()
    } else {
        let n = 1 + args.len() + usize::from(gpu.is_some());
        match p.write_chunk_uninit(n) {
            Ok(chunk) => {
                let slots = std::iter::once(Slot::Head(head))
                    .chain(args.iter().map(|a| Slot::Arg(*a)))
                    .chain(gpu.map(Slot::Gpu));
                chunk.fill_from_iter(slots);
                true
            }
            Err(_) => false,
        }
    };
    if !ok {
        DROPPED.fetch_add(1, Ordering::Relaxed);
        if let Some(g) = gpu {
            gpu::release_pair(&g);
        }
    }
}

impl Local {
    fn new() -> Self {
        Local {
            slot: None,
            producer: None,
            stack: Vec::with_capacity(64),
            args: Vec::with_capacity(64),
            gpus: Vec::with_capacity(16),
            next_seq: 0,
            step: 0,
            gpu_device: None,
            gpu_depth: 0,
            gpu_tree: 0,
            next_tree: 0,
        }
    }

    fn slot(&mut self) -> &Arc<ThreadSlot> {
        self.slot.get_or_insert_with(new_slot)
    }

    /// Opens a span; returns its seq and the step it belongs to (+1, 0: none).
    #[inline]
    fn open(&mut self, step: Option<u64>) -> (u32, u64) {
        let seq = self.next_seq;
        self.next_seq = seq.wrapping_add(1);
        let (aux, prev_step) = match step {
            Some(n) => {
                let prev = self.step;
                self.step = n + 1;
                (n, Some(prev))
            }
            None => (self.step, None),
        };
        self.stack.push(Open {
            seq,
            nargs: 0,
            clamp: u64::MAX,
            prev_step,
        });
        (seq, aux)
    }

    /// The stack index of open span `seq`: the top, unless guards were dropped out of
    /// order (or the span began while this thread's state was being torn down).
    #[inline]
    fn find(&self, seq: u32) -> Option<usize> {
        match self.stack.last() {
            Some(top) if top.seq == seq => Some(self.stack.len() - 1),
            _ => self.stack.iter().rposition(|o| o.seq == seq),
        }
    }

    /// Sets `key` on span `seq`, replacing an earlier value of the same key (JSON
    /// objects must not repeat keys); ignored past [`MAX_ARGS`].
    fn set_arg(&mut self, seq: u32, key: &'static str, value: ArgValue) {
        let Some(i) = self.find(seq) else {
            return;
        };
        if let Some(a) = self
            .args
            .iter_mut()
            .rev()
            .find(|(s, a)| *s == seq && a.key == key)
        {
            a.1.value = value;
            return;
        }
        let open = &mut self.stack[i];
        if (open.nargs as usize) < MAX_ARGS {
            open.nargs += 1;
            self.args.push((seq, Arg { key, value }));
        }
    }

    /// Ends span `seq` with the event `head` (`start`/`end` set), pushes the event and
    /// returns the end it was given. A span that ends while spans opened after it are
    /// still open keeps its end, and those inner spans will end no later than it, so the
    /// track stays nested (they show truncated rather than overlapping their parent).
    #[inline]
    fn close(&mut self, seq: u32, mut head: Head) -> Option<u64> {
        let i = self.find(seq)?;
        let open = self.stack[i];
        head.end = head.end.min(open.clamp).max(head.start);
        if i + 1 < self.stack.len() {
            for inner in &mut self.stack[i + 1..] {
                inner.clamp = inner.clamp.min(head.end);
            }
            self.stack.remove(i);
        } else {
            self.stack.pop();
        }
        if let Some(prev) = open.prev_step {
            self.step = prev;
        }
        head.nargs = open.nargs;
        let end = head.end;
        if head.nargs == 0 && !head.gpu {
            push(&mut self.producer, &mut self.slot, head, &[], None);
        } else {
            self.close_slow(seq, head);
        }
        Some(end)
    }

    /// Closing a span with args or a GPU half: gathers them from the side vectors.
    fn close_slow(&mut self, seq: u32, mut head: Head) {
        let mut gpu = None;
        if head.gpu {
            if let Some(k) = self.gpus.iter().rposition(|(s, _)| *s == seq) {
                let (_, mut g) = self.gpus.remove(k);
                self.gpu_depth = self.gpu_depth.saturating_sub(1);
                if gpu::record_end(&mut g) {
                    gpu = Some(g);
                }
            }
            if gpu.is_none() {
                head.gpu = false;
                head.flow = 0;
                head.flow_out = false;
            }
        }
        let mut args = [super::event::NO_ARG; MAX_ARGS];
        let mut n = 0;
        for (s, a) in &self.args {
            if *s == seq && n < MAX_ARGS {
                args[n] = *a;
                n += 1;
            }
        }
        head.nargs = n as u8;
        let tail = self.args.len() - n;
        if self.args[tail..].iter().all(|(s, _)| *s == seq) {
            self.args.truncate(tail);
        } else {
            self.args.retain(|(s, _)| *s != seq);
        }
        push(&mut self.producer, &mut self.slot, head, &args[..n], gpu);
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            slot.alive.store(false, Ordering::Release);
        }
    }
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::new());
    /// Per-thread switch under the global one ([`set_thread_recording`]).
    static MUTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Turns recording on or off for the calling thread only (on by default). A trainer whose
/// threads work on different steps at the same moment (a producer runs ahead of its
/// consumer) uses it to record the same steps on every thread, so flows between them
/// have both ends. Cold path: the check sits in the out-of-line span begin.
pub fn set_thread_recording(on: bool) {
    MUTED.with(|m| m.set(!on));
}

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
    if device >= gpu::MAX_DEVICES {
        return;
    }
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        l.gpu_device = Some(device);
        l.slot().meta().gpu = Some((device, stream_label.to_string()));
    });
    gpu::ensure_calibrated(device);
}

/// Clears [`bind_gpu`]: this thread's [`gpu_span`]s become CPU-only.
pub fn unbind_gpu() {
    let _ = LOCAL.try_with(|l| l.borrow_mut().gpu_device = None);
}

/// An open span; dropping it ends the span. `!Send`: a span begins and ends on one
/// thread, which is what keeps each thread's track properly nested.
#[must_use = "a span ends when dropped; bind it: `let _s = trace::span(..)`"]
pub struct Span {
    seq: u32,
    /// The event so far (`start` set at begin, `end` at drop); `None` when not
    /// recording, which costs one byte store (the `Kind` niche).
    head: Option<Head>,
    _not_send: PhantomData<*const ()>,
}

impl Span {
    const OFF: Span = Span {
        seq: 0,
        head: None,
        _not_send: PhantomData,
    };

    /// Whether this span is recording (the recorder was active when it began).
    pub fn is_recording(&self) -> bool {
        self.head.is_some()
    }

    // Out of line: call sites keep only the `enabled()` test inline.
    #[inline(never)]
    fn begin(name: Name, kind: Kind, step: Option<u64>) -> Span {
        if muted() {
            return Span::OFF;
        }
        let Ok((seq, aux)) = LOCAL.try_with(|l| l.borrow_mut().open(step)) else {
            return Span::OFF;
        };
        let mut head = Head::new(name, kind);
        head.aux = aux;
        // Read the clock last on begin, so the span excludes the recorder's work.
        head.start = now();
        Span {
            seq,
            head: Some(head),
            _not_send: PhantomData,
        }
    }

    /// Attaches a numeric argument (`args.<key>`). At most [`MAX_ARGS`](super::MAX_ARGS)
    /// keys; a key set twice keeps the last value.
    #[inline]
    pub fn arg(&mut self, key: &'static str, value: impl Into<ArgValue>) {
        if self.head.is_some() {
            let value = value.into();
            let _ = LOCAL.try_with(|l| l.borrow_mut().set_arg(self.seq, key, value));
        }
    }

    /// Makes this span the source of flow `id` (`bind_id` + `flow_out`). A span carries
    /// one flow: a GPU-timed span already uses its own for the CPU-to-GPU arrow, and
    /// ignores this call.
    #[inline]
    pub fn flow_out(&mut self, id: u64) {
        if let Some(h) = &mut self.head {
            if !h.gpu {
                h.flow = id;
                h.flow_out = true;
            }
        }
    }

    /// Makes this span the destination of flow `id` (`bind_id` + `flow_in`); see
    /// [`flow_out`](Self::flow_out) for the one-flow rule.
    #[inline]
    pub fn flow_in(&mut self, id: u64) {
        if let Some(h) = &mut self.head {
            if !h.gpu {
                h.flow = id;
                h.flow_in = true;
            }
        }
    }
}

impl Drop for Span {
    #[inline]
    fn drop(&mut self) {
        if let Some(h) = &mut self.head {
            // Read the clock first on end.
            h.end = now();
            end_span(self.seq, h);
        }
    }
}

#[inline(never)]
fn end_span(seq: u32, head: &Head) {
    let _ = LOCAL.try_with(|l| l.borrow_mut().close(seq, *head));
}

/// A CPU span (`cat:"cpu"`) on this thread's track.
#[inline]
pub fn span(name: Name) -> Span {
    if !enabled() {
        return Span::OFF;
    }
    Span::begin(name, Kind::Cpu, None)
}

/// A queue span (`cat:"queue"`): time spent putting into or getting from a queue.
#[inline]
pub fn queue_span(name: Name) -> Span {
    if !enabled() {
        return Span::OFF;
    }
    Span::begin(name, Kind::Queue, None)
}

/// `ProfilerStep#<step>` (`cat:"step"`). While it is open, this thread's GPU spans carry
/// `args.step = step`.
pub fn step_span(step: u64) -> Span {
    if !enabled() {
        return Span::OFF;
    }
    Span::begin(super::names::step_name(), Kind::Step, Some(step))
}

/// A CPU span which, when this thread is bound to a device ([`bind_gpu`]) and the
/// recorder has a GPU backend, also records a GPU event on the thread's current stream
/// at begin and at end. The writer turns the pair into a `cat:"gpu"` span on the
/// device's track, joined to this span by a flow. Costs the backend's two event records
/// on top of a CPU span.
pub fn gpu_span(name: Name) -> Span {
    if !enabled() {
        return Span::OFF;
    }
    let mut s = Span::begin(name, Kind::Cpu, None);
    let seq = s.seq;
    if let Some(h) = &mut s.head {
        let _ = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            let Some(device) = l.gpu_device else {
                return;
            };
            let root = l.gpu_depth == 0;
            if root {
                l.next_tree = l.next_tree.wrapping_add(1);
                l.gpu_tree = l.next_tree;
            }
            let tree = l.gpu_tree;
            let Some(part) = gpu::record_begin(device, tree, root) else {
                return;
            };
            h.gpu = true;
            h.flow = next_flow_id();
            h.flow_out = true;
            h.flow_in = false;
            l.gpus.push((seq, part));
            l.gpu_depth += 1;
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
    let _ = LOCAL.try_with(|l| {
        let mut l = l.borrow_mut();
        let l = &mut *l;
        push(&mut l.producer, &mut l.slot, head, &[arg], None);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(start: u64, end: u64) -> Head {
        let mut h = Head::new(Name(0), Kind::Cpu);
        h.start = start;
        h.end = end;
        h
    }

    #[test]
    fn out_of_order_close_clamps_inner_spans() {
        let mut l = Local::new();
        let (a, _) = l.open(None);
        let (b, _) = l.open(None);
        let (c, _) = l.open(None);
        // `a` ends first, at 100: b and c must end by 100.
        assert_eq!(l.close(a, head(1, 100)), Some(100));
        assert_eq!(l.close(c, head(3, 150)), Some(100));
        // A span opened after the cut is not clamped.
        let (d, _) = l.open(None);
        assert_eq!(l.close(d, head(120, 300)), Some(300));
        assert_eq!(l.close(b, head(2, 200)), Some(100));
        assert!(l.stack.is_empty());
    }

    #[test]
    fn in_order_close_is_exact_and_restores_the_step() {
        let mut l = Local::new();
        let (s, _) = l.open(Some(7));
        assert_eq!(l.step, 8);
        let (a, aux) = l.open(None);
        assert_eq!(aux, 8);
        l.set_arg(a, "k", ArgValue::I64(1));
        l.set_arg(s, "k", ArgValue::I64(2));
        l.set_arg(a, "k", ArgValue::I64(3));
        assert_eq!(l.args.len(), 2);
        assert_eq!(l.stack[1].nargs, 1);
        assert_eq!(l.close(a, head(2, 5)), Some(5));
        assert_eq!(
            l.args,
            vec![(
                s,
                Arg {
                    key: "k",
                    value: ArgValue::I64(2)
                }
            )]
        );
        assert_eq!(l.close(s, head(1, 9)), Some(9));
        assert!(l.args.is_empty());
        assert_eq!(l.step, 0);
        // Unknown seq: nothing to close.
        assert_eq!(l.close(1234, head(0, 7)), None);
    }

    #[test]
    fn a_disabled_span_is_small_and_inert() {
        assert!(std::mem::size_of::<Span>() <= 64);
        assert_eq!(
            std::mem::size_of::<Option<Head>>(),
            std::mem::size_of::<Head>()
        );
        assert!(!Span::OFF.is_recording());
    }
}
