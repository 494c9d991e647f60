//! The writer thread: drains every thread's ring, turns raw events into the format's
//! events (written by [`EventWriter`]), resolves GPU spans as their events complete,
//! refreshes GPU calibrations and flushes the file every `flush_interval`. All
//! formatting happens here, off the hot path.
//!
//! The file is written as a stream: the header (every top-level key but `traceEvents`)
//! at start, then one event per line, each but the last ending with `,`, and
//! `]}` at finish. A process killed between flushes leaves a file cut inside the
//! `traceEvents` array whose every complete line before the cut is a complete event.
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use chrome_trace_format::names::{CPU_TS_ARG, STEP_ARG};
use chrome_trace_format::tracks::{gpu_process_name, gpu_sort_index, TRAINER_SORT_INDEX};
use chrome_trace_format::{ArgValue, Bind, Category, Counter, EventWriter, Meta, Span, Text};

use crate::calib;
use crate::clock::{clock, Timebase};
use crate::event::{Arg, Kind, RawEvent, Slot, MAX_ARGS, NO_ARG};
use crate::external::{Appender, FinishView, PlacedGpuSpan, TraceThread};
use crate::names::{sync_entries, Name, NameEntry};
use crate::nest::Nest;
use crate::resolve::{GpuSpanOut, Resolver, TrackMeta};
use crate::sink::Out;
use crate::state::PROCESS;
use crate::stats::{Acc, SharedStats, Summary};
use crate::thread::{gpu_timing_cost, registry, unregister, ThreadSlot};

/// How long `finish` waits for the GPU to complete outstanding spans.
const FINISH_GPU_WAIT: Duration = Duration::from_secs(2);
/// Bytes of formatted events buffered before they go to the file.
const CHUNK: usize = 1 << 16;

pub(crate) enum Cmd {
    Flush(mpsc::Sender<()>),
    Finish(mpsc::Sender<Result<Summary, io::Error>>, Option<Appender>),
}

pub(crate) struct Writer {
    sink: Out,
    path: PathBuf,
    pid: u32,
    tb: Timebase,
    flush_interval: Duration,
    resolver: Option<Resolver>,
    stats: SharedStats,
    events: EventWriter,
    names: Vec<NameEntry>,
    thread_gen: HashMap<u32, u64>,
    /// Per thread: the spans that later spans of that thread may still end inside.
    nests: HashMap<u32, Nest>,
    acc: HashMap<Name, Acc>,
    gpu_out: Vec<GpuSpanOut>,
    track_meta: Vec<TrackMeta>,
    /// With `keep_gpu_spans`: the GPU spans written, and each thread's OS id and extent,
    /// for the appender at the end.
    keep: bool,
    kept: Vec<PlacedGpuSpan>,
    threads: HashMap<u32, TraceThread>,
    error: Option<io::Error>,
}

/// What a writer needs to start.
pub(crate) struct WriterConfig {
    pub sink: Out,
    pub path: PathBuf,
    /// The trainer's pid in the file.
    pub pid: u32,
    pub tb: Timebase,
    pub flush_interval: Duration,
    pub resolver: Option<Resolver>,
    pub stats: SharedStats,
    pub keep_gpu_spans: bool,
}

impl Writer {
    pub(crate) fn new(c: WriterConfig) -> Self {
        Writer {
            sink: c.sink,
            path: c.path,
            pid: c.pid,
            tb: c.tb,
            flush_interval: c.flush_interval,
            resolver: c.resolver,
            stats: c.stats,
            events: EventWriter::with_capacity(CHUNK * 2),
            names: Vec::new(),
            thread_gen: HashMap::new(),
            nests: HashMap::new(),
            acc: HashMap::new(),
            gpu_out: Vec::new(),
            track_meta: Vec::new(),
            keep: c.keep_gpu_spans,
            kept: Vec::new(),
            threads: HashMap::new(),
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
                Ok(Cmd::Finish(ack, appender)) => {
                    let r = self.finish(appender);
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
                    let _ = self.finish(None);
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
                let (pid, tid) = (self.pid, slot.tid);
                self.events.meta(&Meta::ThreadName {
                    pid,
                    tid,
                    name: &m.name,
                });
                self.events.meta(&Meta::ThreadSortIndex {
                    pid,
                    tid,
                    index: tid.into(),
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
        if self.events.len() >= CHUNK {
            self.write_buf();
        }
    }

    /// Whether name `n` is in the writer's own table (syncing it with the interner's
    /// when `n` is newer).
    fn has_name(&mut self, n: Name) -> bool {
        if n.0 as usize >= self.names.len() {
            sync_entries(&mut self.names);
        }
        (n.0 as usize) < self.names.len()
    }

    /// The trainer process's names, written first.
    pub(crate) fn process_meta(&mut self, process_name: &str) {
        let pid = self.pid;
        self.events.meta(&Meta::ProcessName {
            pid,
            name: process_name,
        });
        self.events.meta(&Meta::ProcessSortIndex {
            pid,
            index: TRAINER_SORT_INDEX,
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
        if !self.has_name(ev.head.name) {
            return;
        }
        let entry = &self.names[ev.head.name.0 as usize];
        if ev.head.kind == Kind::Counter {
            let Some(a) = ev.args().first() else {
                return;
            };
            self.events.counter(&Counter {
                cat: Text::Quoted(&entry.first_json),
                name: Text::Quoted(&entry.json),
                pid: self.pid,
                ts_ns: ts,
                args: std::slice::from_ref(a),
            });
            return;
        }
        let (cat, name) = match ev.head.kind {
            Kind::Queue => (Category::Queue, Text::Quoted(&entry.json)),
            Kind::Step => (Category::Step, Text::Step(ev.head.aux)),
            _ => (Category::Cpu, Text::Quoted(&entry.json)),
        };
        let h = &ev.head;
        self.events.span(&Span {
            cat,
            name,
            pid: self.pid,
            tid,
            ts_ns: ts,
            dur_ns: end - ts,
            bind: (h.flow != 0).then_some(Bind {
                id: h.flow,
                flow_out: h.flow_out,
                flow_in: h.flow_in,
            }),
            args: ev.args(),
        });
        let a = self.acc.entry(ev.head.name).or_default();
        a.count += 1;
        a.cpu_ns += end - ts;
        if self.keep {
            let t = self.threads.entry(tid).or_insert(TraceThread {
                tid,
                os_tid: slot.os_tid,
                first_ns: ts,
                last_ns: end,
            });
            t.first_ns = t.first_ns.min(ts);
            t.last_ns = t.last_ns.max(end);
        }
        if let Some(r) = self.resolver.as_mut() {
            r.add(tid, &slot.holds, ev, (ts, end));
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
                    self.events.meta(&Meta::ProcessName {
                        pid: device,
                        name: &gpu_process_name(device),
                    });
                    self.events.meta(&Meta::ProcessSortIndex {
                        pid: device,
                        index: gpu_sort_index(device),
                    });
                }
                TrackMeta::Thread { device, tid, name } => {
                    self.events.meta(&Meta::ThreadName {
                        pid: device,
                        tid,
                        name: &name,
                    });
                    self.events.meta(&Meta::ThreadSortIndex {
                        pid: device,
                        tid,
                        index: tid.into(),
                    });
                }
            }
        }
        for g in std::mem::take(&mut self.gpu_out) {
            if !self.has_name(g.name) {
                continue;
            }
            let entry = &self.names[g.name.0 as usize];
            // The CPU span's args, its step (unless it set one) and its `ts`.
            let mut args = [NO_ARG; MAX_ARGS + 2];
            let own = &g.args[..g.nargs as usize];
            args[..own.len()].copy_from_slice(own);
            let mut n = own.len();
            if g.step != 0 && !own.iter().any(|a| a.key == STEP_ARG) {
                args[n] = Arg {
                    key: STEP_ARG,
                    value: ArgValue::U64(g.step - 1),
                };
                n += 1;
            }
            args[n] = Arg {
                key: CPU_TS_ARG,
                value: ArgValue::Micros(g.cpu_ts),
            };
            self.events.span(&Span {
                cat: Category::Gpu,
                name: Text::Quoted(&entry.json),
                pid: g.device,
                tid: g.tid,
                ts_ns: g.ts,
                dur_ns: g.dur,
                bind: (g.flow != 0).then_some(Bind::destination(g.flow)),
                args: &args[..n + 1],
            });
            if self.keep {
                self.kept.push(PlacedGpuSpan {
                    name: entry.text.to_string(),
                    device: g.device,
                    track: g.tid,
                    stream: g.stream,
                    ts_ns: g.ts,
                    dur_ns: g.dur,
                    thread: g.thread,
                    cpu_ts_ns: g.cpu_ts,
                    cpu_end_ns: g.cpu_end,
                });
            }
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
        if self.events.is_empty() {
            return;
        }
        if self.error.is_none() {
            if let Err(e) = self.sink.write_all(self.events.as_str().as_bytes()) {
                self.error = Some(e);
                self.sink = Out::Closed;
            }
        }
        self.events.clear();
    }

    fn flush(&mut self) {
        self.write_buf();
        if self.error.is_none() {
            if let Err(e) = self.sink.flush() {
                self.error = Some(e);
                self.sink = Out::Closed;
            }
        }
    }

    /// Tops up the event pool of every calibrated device (off the training threads).
    fn reserve_events(&self) {
        let Some(r) = self.resolver.as_ref() else {
            return;
        };
        let devices: Vec<usize> = calib::cals().devices.keys().copied().collect();
        for d in devices {
            r.backend().reserve(d, calib::RESERVE_EVENTS);
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
        devices.extend(calib::cals().devices.keys().copied());
        devices.sort_unstable();
        devices.dedup();
        let oldest = r.oldest_epochs();
        for d in devices {
            if calib::calibrate(r.backend(), d).is_err() {
                PROCESS.count_gpu_error();
            }
            calib::prune(r.backend(), d, oldest.get(&d).copied());
        }
    }

    fn finish(&mut self, appender: Option<Appender>) -> Result<Summary, io::Error> {
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
        if let Some(append) = appender {
            let mut threads: Vec<TraceThread> = self.threads.values().cloned().collect();
            threads.sort_by_key(|t| t.tid);
            let view = FinishView {
                pid: self.pid,
                base_clock_ns: clock().delta_as_nanos(0, self.tb.base_ticks),
                gpu_spans: &self.kept,
                threads: &threads,
            };
            append(&view, &mut self.events);
        }
        self.events.finish();
        self.write_buf();
        if self.error.is_none() {
            if let Err(e) = self.sink.close() {
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
                events: self.events.events(),
                dropped_events: PROCESS.dropped.load(Ordering::Relaxed),
                gpu_spans: placed,
                gpu_spans_dropped: lost,
                gpu_errors: PROCESS.gpu_errors.load(Ordering::Relaxed),
                gpu_cost: gpu_timing_cost(),
            }),
        }
    }
}
