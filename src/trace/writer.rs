//! The writer thread: drains every thread's ring, turns raw events into Chrome-trace JSON
//! lines, resolves GPU spans as their events complete, refreshes GPU calibrations and
//! flushes the file every `flush_interval`. All formatting happens here, off the hot
//! path.
//!
//! The file is written as a stream: the header (every top-level key but `traceEvents`)
//! at start, then one event per line, each but the last ending with `,`, and
//! `]}` at finish. A process killed between flushes leaves a file cut inside the
//! `traceEvents` array whose every complete line before the cut is a complete event.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use flate2::write::GzEncoder;

use super::clock::Timebase;
use super::event::{Arg, Kind, RawEvent, Slot};
use super::gpu;

use super::json::{escape_into, push_us, push_value};
use super::local::{gpu_timing_cost, registry, unregister, ThreadSlot, DROPPED, GPU_ERRORS};
use super::names::{sync_entries, Name, NameEntry};
use super::resolve::{GpuSpanOut, Resolver, TrackMeta};
use super::{NameStats, Summary};

/// How long `finish` waits for the GPU to complete outstanding spans.
const FINISH_GPU_WAIT: Duration = Duration::from_secs(2);
/// Bytes of formatted events buffered before they go to the file.
const CHUNK: usize = 1 << 16;

pub(crate) enum Out {
    Plain(BufWriter<File>),
    Gzip(Box<GzEncoder<BufWriter<File>>>),
    Closed,
}

impl Out {
    pub(crate) fn create(path: &Path, gzip: bool) -> io::Result<Out> {
        let f = BufWriter::with_capacity(1 << 20, File::create(path)?);
        Ok(if gzip {
            Out::Gzip(Box::new(GzEncoder::new(f, flate2::Compression::fast())))
        } else {
            Out::Plain(f)
        })
    }

    pub(crate) fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        match self {
            Out::Plain(w) => w.write_all(b),
            Out::Gzip(w) => w.write_all(b),
            Out::Closed => Ok(()),
        }
    }

    /// Makes everything written so far readable from the file: for gzip a sync flush,
    /// which ends the deflate block so a reader of the truncated stream gets it all.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        match self {
            Out::Plain(w) => w.flush(),
            Out::Gzip(w) => w.flush(),
            Out::Closed => Ok(()),
        }
    }

    fn close(&mut self) -> io::Result<()> {
        match std::mem::replace(self, Out::Closed) {
            Out::Plain(mut w) => w.flush(),
            Out::Gzip(w) => w.finish()?.flush(),
            Out::Closed => Ok(()),
        }
    }
}

pub(crate) enum Cmd {
    Flush(mpsc::Sender<()>),
    Finish(mpsc::Sender<Result<Summary, io::Error>>),
}

#[derive(Default, Clone, Copy)]
pub(crate) struct Acc {
    pub count: u64,
    pub cpu_ns: u64,
    pub gpu_count: u64,
    pub gpu_ns: u64,
}

pub(crate) type SharedStats = Arc<Mutex<HashMap<Name, Acc>>>;

pub(crate) struct Writer {
    pub out: Out,
    pub path: std::path::PathBuf,
    pub pid: u32,
    pub tb: Timebase,
    pub flush_interval: Duration,
    pub resolver: Option<Resolver>,
    pub stats: SharedStats,
    buf: String,
    names: Vec<NameEntry>,
    thread_gen: HashMap<u32, u64>,
    /// Per thread: the spans that later spans of that thread may still end inside.
    nests: HashMap<u32, Nest>,
    acc: HashMap<Name, Acc>,
    gpu_out: Vec<GpuSpanOut>,
    track_meta: Vec<TrackMeta>,
    events: u64,
    error: Option<io::Error>,
}

impl Writer {
    pub(crate) fn new(
        out: Out,
        path: std::path::PathBuf,
        pid: u32,
        tb: Timebase,
        flush_interval: Duration,
        resolver: Option<Resolver>,
        stats: SharedStats,
    ) -> Self {
        Writer {
            out,
            path,
            pid,
            tb,
            flush_interval,
            resolver,
            stats,
            buf: String::with_capacity(CHUNK * 2),
            names: Vec::new(),
            thread_gen: HashMap::new(),
            nests: HashMap::new(),
            acc: HashMap::new(),
            gpu_out: Vec::new(),
            track_meta: Vec::new(),
            events: 0,
            error: None,
        }
    }

    /// The thread's main loop. Returns after `Finish` (or when the recorder is gone).
    pub(crate) fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        let tick = self.flush_interval.min(Duration::from_millis(100));
        let mut last_flush = Instant::now();
        loop {
            match rx.recv_timeout(tick) {
                Ok(Cmd::Flush(ack)) => {
                    self.pass();
                    self.flush();
                    last_flush = Instant::now();
                    let _ = ack.send(());
                }
                Ok(Cmd::Finish(ack)) => {
                    let r = self.finish();
                    let _ = ack.send(r);
                    return;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.reserve_events();
                    self.pass();
                    if last_flush.elapsed() >= self.flush_interval {
                        self.recalibrate();
                        self.flush();
                        last_flush = Instant::now();
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = self.finish();
                    return;
                }
            }
        }
    }

    /// Drains all rings, places the GPU spans that are ready, writes what it has.
    pub(crate) fn pass(&mut self) {
        for slot in registry() {
            self.drain(&slot);
        }
        self.resolve_gpu();
        self.merge_stats();
        self.write_buf();
    }

    fn drain(&mut self, slot: &Arc<ThreadSlot>) {
        let mut ring = slot.ring.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = ring.as_ref().map_or(0, |c| c.slots());
        let gpu_label = {
            let m = slot.meta();
            // Named when it first has events in this trace (threads that record
            // nothing, or exited before the recorder started, get no track).
            if waiting > 0 && self.thread_gen.get(&slot.tid) != Some(&m.generation) {
                self.thread_gen.insert(slot.tid, m.generation);
                self.meta_event("thread_name", self.pid, slot.tid, |b| {
                    b.push_str("\"name\":");
                    escape_into(b, &m.name);
                });
                let tid = slot.tid;
                self.meta_event("thread_sort_index", self.pid, tid, |b| {
                    let _ = write!(b, "\"sort_index\":{tid}");
                });
            }
            m.gpu.as_ref().map(|(_, l)| l.clone())
        };
        if let (Some(r), Some(l)) = (self.resolver.as_mut(), gpu_label) {
            r.set_label(slot.tid, &l);
        }
        let alive = slot.alive.load(Ordering::Acquire);
        let mut gone = ring.is_none();
        let mut nest = self.nests.remove(&slot.tid).unwrap_or_default();
        if let Some(c) = ring.as_mut() {
            // Pop at most what was there, so a busy thread cannot keep us here. An
            // event's continuation slots were published with its head.
            let mut left = waiting;
            while left > 0 {
                let Some(first) = c.pop() else { break };
                left -= 1;
                let Slot::Head(h) = first else { continue };
                let mut ev = RawEvent::from_head(&h);
                for _ in 0..h.nargs {
                    if let Some(Slot::Arg(a)) = c.pop() {
                        left = left.saturating_sub(1);
                        ev.set_arg(a.key, a.value);
                    }
                }
                if h.gpu {
                    if let Some(Slot::Gpu(g)) = c.pop() {
                        left = left.saturating_sub(1);
                        ev.gpu = Some(g);
                    }
                }
                if h.kind != Kind::Counter {
                    ev.head.end = nest.end(h.start, h.end, h.outlived);
                }
                self.event(slot, &ev);
            }
            gone = c.is_abandoned() && c.slots() == 0;
        }
        drop(ring);
        if !alive && gone {
            unregister(slot);
        } else {
            self.nests.insert(slot.tid, nest);
        }
        if self.buf.len() >= CHUNK {
            self.write_buf();
        }
    }

    fn name(&mut self, n: Name) -> Option<&NameEntry> {
        if n.0 as usize >= self.names.len() {
            sync_entries(&mut self.names);
        }
        self.names.get(n.0 as usize)
    }

    fn begin_event(&mut self) {
        if self.events > 0 {
            self.buf.push_str(",\n");
        }
        self.events += 1;
    }

    fn meta_event(&mut self, what: &str, pid: u32, tid: u32, args: impl FnOnce(&mut String)) {
        self.begin_event();
        let b = &mut self.buf;
        b.push_str("{\"ph\":\"M\",\"name\":\"");
        b.push_str(what);
        let _ = write!(b, "\",\"pid\":{pid},\"tid\":{tid},\"args\":{{");
        args(b);
        b.push_str("}}");
    }

    /// The trainer process's names, written first.
    pub(crate) fn process_meta(&mut self, process_name: &str) {
        let pid = self.pid;
        self.meta_event("process_name", pid, 0, |b| {
            b.push_str("\"name\":");
            escape_into(b, process_name);
        });
        self.meta_event("process_sort_index", pid, 0, |b| {
            b.push_str("\"sort_index\":0")
        });
    }

    fn event(&mut self, slot: &ThreadSlot, ev: &RawEvent) {
        let tid = slot.tid;
        // Left in a ring by a span that ended after the previous recorder finished.
        if ev.head.start < self.tb.base_ticks {
            return;
        }
        let ts = self.tb.ns(ev.head.start);
        let end = self.tb.ns(ev.head.end).max(ts);
        let Some(entry) = self.name(ev.head.name).cloned() else {
            return;
        };
        if ev.head.kind == Kind::Counter {
            let Some(a) = ev.args().first().copied() else {
                return;
            };
            self.begin_event();
            let b = &mut self.buf;
            b.push_str("{\"ph\":\"C\",\"cat\":");
            b.push_str(&entry.first_json);
            b.push_str(",\"name\":");
            b.push_str(&entry.json);
            let _ = write!(b, ",\"pid\":{},\"ts\":", self.pid);
            push_us(b, ts);
            b.push_str(",\"args\":{");
            escape_into(b, a.key);
            b.push(':');
            push_value(b, a.value);
            b.push_str("}}");
            return;
        }
        let cat = match ev.head.kind {
            Kind::Queue => "queue",
            Kind::Step => "step",
            _ => "cpu",
        };
        self.begin_event();
        let b = &mut self.buf;
        b.push_str("{\"ph\":\"X\",\"cat\":\"");
        b.push_str(cat);
        b.push_str("\",\"name\":");
        if ev.head.kind == Kind::Step {
            let _ = write!(b, "\"ProfilerStep#{}\"", ev.head.aux);
        } else {
            b.push_str(&entry.json);
        }
        let _ = write!(b, ",\"pid\":{},\"tid\":{tid},\"ts\":", self.pid);
        push_us(b, ts);
        b.push_str(",\"dur\":");
        push_us(b, end - ts);
        if ev.head.flow != 0 && (ev.head.flow_in || ev.head.flow_out) {
            let _ = write!(b, ",\"bind_id\":{}", ev.head.flow);
            if ev.head.flow_out {
                b.push_str(",\"flow_out\":true");
            }
            if ev.head.flow_in {
                b.push_str(",\"flow_in\":true");
            }
        }
        push_args(b, ev.args(), &[]);
        b.push('}');
        let a = self.acc.entry(ev.head.name).or_default();
        a.count += 1;
        a.cpu_ns += end - ts;
        if let Some(r) = self.resolver.as_mut() {
            r.add(tid, &slot.holds, ev, ts);
        } else if let Some(g) = ev.gpu {
            slot.holds.release_part(&g);
        }
    }

    fn resolve_gpu(&mut self) {
        let Some(r) = self.resolver.as_mut() else {
            return;
        };
        r.resolve(&self.tb, &mut self.gpu_out, &mut self.track_meta);
        self.write_gpu();
    }

    fn write_gpu(&mut self) {
        for m in std::mem::take(&mut self.track_meta) {
            match m {
                TrackMeta::Process { device } => {
                    self.meta_event("process_name", device, 0, |b| {
                        let _ = write!(b, "\"name\":\"GPU {device}\"");
                    });
                    self.meta_event("process_sort_index", device, 0, |b| {
                        let _ = write!(b, "\"sort_index\":{}", device + 1);
                    });
                }
                TrackMeta::Thread { device, tid, name } => {
                    self.meta_event("thread_name", device, tid, |b| {
                        b.push_str("\"name\":");
                        escape_into(b, &name);
                    });
                    self.meta_event("thread_sort_index", device, tid, |b| {
                        let _ = write!(b, "\"sort_index\":{tid}");
                    });
                }
            }
        }
        for g in std::mem::take(&mut self.gpu_out) {
            let Some(entry) = self.name(g.name).cloned() else {
                continue;
            };
            self.begin_event();
            let b = &mut self.buf;
            b.push_str("{\"ph\":\"X\",\"cat\":\"gpu\",\"name\":");
            b.push_str(&entry.json);
            let _ = write!(b, ",\"pid\":{},\"tid\":{},\"ts\":", g.device, g.tid);
            push_us(b, g.ts);
            b.push_str(",\"dur\":");
            push_us(b, g.dur);
            if g.flow != 0 {
                let _ = write!(b, ",\"bind_id\":{},\"flow_in\":true", g.flow);
            }
            let mut extra = String::new();
            if g.step != 0 && !g.args[..g.nargs as usize].iter().any(|a| a.key == "step") {
                let _ = write!(extra, "\"step\":{},", g.step - 1);
            }
            extra.push_str("\"cpu_ts\":");
            push_us(&mut extra, g.cpu_ts);
            push_args(b, &g.args[..g.nargs as usize], &[&extra]);
            b.push('}');
            let a = self.acc.entry(g.name).or_default();
            a.gpu_count += 1;
            a.gpu_ns += g.dur;
        }
    }

    fn merge_stats(&mut self) {
        if self.acc.is_empty() {
            return;
        }
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        for (n, a) in self.acc.drain() {
            let t = s.entry(n).or_default();
            t.count += a.count;
            t.cpu_ns += a.cpu_ns;
            t.gpu_count += a.gpu_count;
            t.gpu_ns += a.gpu_ns;
        }
    }

    fn write_buf(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if self.error.is_none() {
            if let Err(e) = self.out.write_all(self.buf.as_bytes()) {
                self.error = Some(e);
                self.out = Out::Closed;
            }
        }
        self.buf.clear();
    }

    fn flush(&mut self) {
        self.write_buf();
        if self.error.is_none() {
            if let Err(e) = self.out.flush() {
                self.error = Some(e);
                self.out = Out::Closed;
            }
        }
    }

    /// Tops up the event pool of every calibrated device (off the training threads).
    fn reserve_events(&self) {
        let Some(r) = self.resolver.as_ref() else {
            return;
        };
        let devices: Vec<usize> = gpu::cals().devices.keys().copied().collect();
        for d in devices {
            r.backend().reserve(d, gpu::RESERVE_EVENTS);
        }
    }

    /// Refreshes the calibration of every device a thread is bound to, and forgets the
    /// ones nothing refers to any more.
    fn recalibrate(&mut self) {
        let Some(r) = self.resolver.as_ref() else {
            return;
        };
        let mut devices: Vec<usize> = registry()
            .iter()
            .filter_map(|s| s.meta().gpu.as_ref().map(|g| g.0))
            .collect();
        devices.extend(gpu::cals().devices.keys().copied());
        devices.sort_unstable();
        devices.dedup();
        let oldest = r.oldest_epochs();
        for d in devices {
            if gpu::calibrate(r.backend(), d).is_err() {
                GPU_ERRORS.fetch_add(1, Ordering::Relaxed);
            }
            gpu::prune(r.backend(), d, oldest.get(&d).copied());
        }
    }

    fn finish(&mut self) -> Result<Summary, io::Error> {
        self.pass();
        if self.resolver.is_some() {
            let deadline = Instant::now() + FINISH_GPU_WAIT;
            if let Some(r) = self.resolver.as_mut() {
                r.close_open_trees();
            }
            loop {
                self.resolve_gpu();
                let pending = self.resolver.as_ref().map_or(0, |r| r.pending());
                if pending == 0 || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            if let Some(r) = self.resolver.as_mut() {
                r.discard_all();
            }
            self.merge_stats();
        }
        self.buf.push_str("\n]}\n");
        self.write_buf();
        if self.error.is_none() {
            if let Err(e) = self.out.close() {
                self.error = Some(e);
            }
        }
        let (placed, lost) = self
            .resolver
            .as_ref()
            .map_or((0, 0), |r| (r.placed, r.dropped));
        match self.error.take() {
            // the kind survives, so a caller can tell a full disk
            Some(e) => Err(io::Error::new(
                e.kind(),
                format!("writing {}: {e}", self.path.display()),
            )),
            None => Ok(Summary {
                path: self.path.clone(),
                events: self.events,
                dropped_events: DROPPED.load(Ordering::Relaxed),
                gpu_spans: placed,
                gpu_spans_dropped: lost,
                gpu_errors: GPU_ERRORS.load(Ordering::Relaxed),
                gpu_cost: gpu_timing_cost(),
            }),
        }
    }
}

/// Appends `,"args":{...}` for `args` plus pre-formatted `extra` members, if any.
/// Keeps one thread's spans nested when guards were dropped out of order. Spans reach the
/// writer in the order they ended; a span that ended while `outlived` spans opened inside
/// it were still open is remembered until those have arrived, and each of them is cut at
/// its end (the innermost such end), so they show truncated rather than overlapping it.
/// Spans dropped in order pass through untouched, at no cost beyond an empty-list check.
#[derive(Default)]
pub(crate) struct Nest(Vec<Outlived>);

struct Outlived {
    start: u64,
    /// Its end as recorded, and as written (cut itself if it outlived a parent).
    end: u64,
    cut: u64,
    /// Spans opened inside it and still open at its end that have not arrived yet.
    waiting: u32,
}

impl Nest {
    /// Bound on remembered spans (reached only if their inner spans were never recorded,
    /// e.g. lost to a full ring).
    const MAX: usize = 64;

    /// The end to write for a span that began at `start` and ended at `end` (raw ticks)
    /// while `outlived` spans opened after it were still open.
    pub(crate) fn end(&mut self, start: u64, end: u64, outlived: u32) -> u64 {
        let mut cut = end;
        if !self.0.is_empty() {
            for o in &mut self.0 {
                // Opened inside `o` and still open when it ended.
                if o.start < start && start < o.end {
                    o.waiting = o.waiting.saturating_sub(1);
                    if start < o.cut {
                        cut = cut.min(o.cut);
                    }
                }
            }
            self.0.retain(|o| o.waiting > 0);
        }
        let cut = cut.max(start);
        if outlived > 0 {
            if self.0.len() == Self::MAX {
                self.0.remove(0);
            }
            self.0.push(Outlived {
                start,
                end,
                cut,
                waiting: outlived,
            });
        }
        cut
    }
}

fn push_args(b: &mut String, args: &[Arg], extra: &[&str]) {
    if args.is_empty() && extra.is_empty() {
        return;
    }
    b.push_str(",\"args\":{");
    let mut first = true;
    for a in args {
        if !first {
            b.push(',');
        }
        first = false;
        escape_into(b, a.key);
        b.push(':');
        push_value(b, a.value);
    }
    for e in extra {
        if !first {
            b.push(',');
        }
        first = false;
        b.push_str(e);
    }
    b.push('}');
}

/// Per-name totals, for [`Stats`](super::Stats).
pub(crate) fn snapshot(stats: &SharedStats) -> Vec<NameStats> {
    let taken = std::mem::take(&mut *stats.lock().unwrap_or_else(|p| p.into_inner()));
    let mut v: Vec<NameStats> = taken
        .into_iter()
        .map(|(name, a)| NameStats {
            name,
            text: name.text(),
            count: a.count,
            cpu_ns: a.cpu_ns,
            gpu_count: a.gpu_count,
            gpu_ns: a.gpu_ns,
        })
        .collect();
    v.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.name.cmp(&b.name)));
    v
}

#[cfg(test)]
mod tests {
    use super::Nest;

    /// Random open/close sequences on one thread, the clock ticking once per operation:
    /// `None` opens a span, `Some(k)` ends one (`usize::MAX`: the innermost; else the
    /// `k % open`-th, out of order). Returns the events in the order they ended, as the
    /// recording thread reports them: (start, end, spans opened after it still open).
    fn simulate(ops: &[Option<usize>]) -> Vec<(u64, u64, u32)> {
        let mut open: Vec<u64> = Vec::new();
        let mut out = Vec::new();
        for (t, op) in ops.iter().enumerate() {
            let t = t as u64;
            match op {
                None => open.push(t),
                Some(_) if open.is_empty() => {}
                Some(k) => {
                    let i = if *k == usize::MAX {
                        open.len() - 1
                    } else {
                        k % open.len()
                    };
                    let start = open.remove(i);
                    out.push((start, t, (open.len() - i) as u32));
                }
            }
        }
        out
    }

    fn nested(spans: &[(u64, u64, u32)]) -> Vec<(u64, u64)> {
        let mut nest = Nest::default();
        spans
            .iter()
            .map(|&(s, e, o)| (s, nest.end(s, e, o)))
            .collect()
    }

    #[test]
    fn nest_cuts_out_of_order_spans_only_and_leaves_no_overlap() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..600 {
            let in_order = round % 3 == 0;
            let ops: Vec<Option<usize>> = (0..80)
                .map(|_| {
                    let r = rnd();
                    match r % 10 {
                        0..=3 => None,
                        9 if !in_order => Some((r >> 8) as usize),
                        _ => Some(usize::MAX),
                    }
                })
                .collect();
            let spans = simulate(&ops);
            let got = nested(&spans);
            if in_order {
                let plain: Vec<(u64, u64)> = spans.iter().map(|&(s, e, _)| (s, e)).collect();
                assert_eq!(got, plain, "in-order drops are never changed");
            }
            for (k, (&(s, e, _), &(_, g))) in spans.iter().zip(&got).enumerate() {
                assert!(s <= g && g <= e, "only ever cut: {s}..{e} -> {g}");
                if g < e {
                    assert!(
                        spans[..k]
                            .iter()
                            .zip(&got)
                            .any(|(p, q)| p.0 < s && s < p.1 && q.1 == g),
                        "{s}..{e} cut to {g}, not the end of a span it opened in"
                    );
                }
            }
            for a in &got {
                for b in &got {
                    let partial = a.0 < b.0 && b.0 < a.1 && a.1 < b.1;
                    assert!(!partial, "{a:?} and {b:?} overlap in {spans:?}");
                }
            }
        }
    }

    #[test]
    fn nest_cuts_at_the_innermost_parent_dropped_first() {
        // n opens at 1, p at 2, m at 3; p ends at 4 (m open), n at 5 (m open), m at 6:
        // m began inside p, which ended first, so m ends at 4.
        let spans = [(2, 4, 1), (1, 5, 1), (3, 6, 0)];
        assert_eq!(nested(&spans), vec![(2, 4), (1, 5), (3, 4)]);
        // A span that outlived its parent keeps the rest of the track as it was.
        let spans = [(10, 50, 1), (20, 80, 0), (90, 95, 0)];
        assert_eq!(nested(&spans), vec![(10, 50), (20, 50), (90, 95)]);
    }

    #[test]
    fn nest_forgets_parents_whose_inner_spans_never_arrive() {
        let mut nest = Nest::default();
        for i in 0..1000u64 {
            assert_eq!(nest.end(10 * i, 10 * i + 5, 3), 10 * i + 5);
        }
        assert!(nest.0.len() <= Nest::MAX);
    }
}
