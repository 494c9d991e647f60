//! CUDA activity into the trace (`--trace-kernels`): turns the [`Activity`] records of a
//! capture into trace events, written through the recorder's writer when the trace
//! finishes. Pure: it takes the records and what the recorder placed (GPU spans, threads,
//! the clock), so it is tested on recorded data without a GPU.
//!
//! - **Tracks.** Runtime and driver calls go on the calling thread's track (`pid` the
//!   trainer, `tid` the recorder's id of that OS thread); calls from threads that recorded
//!   nothing (libtorch's autograd workers) get a track of their own, `CUDA calls <os tid>`.
//!   Kernels, copies and sets go on the GPU stream track where the recorder put the GPU
//!   spans of the same stream: CUPTI's stream id is matched to a track by where the
//!   launching CPU section's GPU span went (a vote per stream); streams with no GPU span
//!   get a track of their own, `stream <id> (CUDA)`. A launch from a thread that recorded
//!   nothing belongs to the innermost GPU-timed section open on any thread at that moment
//!   whose GPU span is on the record's stream track (the backward's kernels belong to the
//!   section that called backward).
//! - **Clock.** CUPTI takes its timestamps from the recorder's clock, so calls land on
//!   their CPU spans as they are. GPU spans are placed from CUDA events by a calibration
//!   that may be off by microseconds, so GPU records are moved onto them: for each
//!   outermost GPU span (a step's), the shift that puts every kernel launched inside one of
//!   its sections inside that section's GPU span, the one closest to the previous shift
//!   when several do. GPU records launched elsewhere take the shift of the outermost span
//!   they fall in (or the last one before them). What still crosses a GPU span's edge is
//!   cut at the edge (`trimmed`), so every track stays properly nested.
//! - **Window.** Calls outside their thread's recorded extent (for a thread that recorded
//!   nothing: outside the window, from the first recorded event of any thread to the last)
//!   are left out. A GPU record whose launch was left out is kept, without a flow, when it
//!   starts inside the window (the GPU ran it then: work launched before the window, or
//!   by a thread that runs ahead of the others), and left out otherwise.
//! - **Flows.** Each launch gets Kineto's `ac2g` flow to its kernel (`s` on the call,
//!   `f` on the kernel, id = the correlation id).
//! - **Names.** Kineto's categories (`kernel`, `gpu_memcpy`, `gpu_memset`,
//!   `cuda_runtime`, `cuda_driver`, `cuda_sync`, `overhead`) and argument keys, so tools
//!   made for PyTorch traces read ours.
use std::collections::{BTreeMap, HashMap};

use chrome_trace_format::cuda_api::ApiClass;
use chrome_trace_format::names::kineto;
use chrome_trace_format::tracks::{gpu_process_name, gpu_sort_index};
use chrome_trace_format::{Arg, ArgValue, Category, EventWriter, Flow, FlowDir, Meta, Span, Text};
use serde::{Deserialize, Serialize};

use super::activity::{Activity, ActivityKind};
use crate::trace::{PlacedGpuSpan, TraceThread};

/// `tid` of the first track made for a thread that recorded nothing.
const FOREIGN_TID_BASE: u32 = 100_000;
/// `tid` offset of tracks made for GPU streams that have no GPU span.
const STREAM_TID_BASE: u32 = 1_000;
/// `tid` of the per-device track of device-level overhead records.
const OVERHEAD_TID: u32 = 999;

/// What the merge reads: the capture and what the recorder placed. Serializable, so that
/// a capture can be kept (`DFLASH_KERNEL_DUMP`) and the merge tested on it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MergeInput {
    /// The trainer's `pid` in the file.
    pub pid: u32,
    /// The recorder's clock at the trace's time zero, ns.
    pub base_clock_ns: u64,
    pub gpu_spans: Vec<PlacedGpuSpan>,
    pub threads: Vec<TraceThread>,
    pub activities: Vec<Activity>,
    /// Records CUPTI reported dropped during the capture.
    pub dropped: u64,
}

/// What the merge wrote and how it placed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MergeReport {
    pub kernels: u64,
    pub memcpys: u64,
    pub memsets: u64,
    /// Runtime and driver calls written, and those by class (time in ns, outermost calls
    /// only: a driver call inside a runtime call is not counted twice).
    pub api_calls: u64,
    pub launches: u64,
    pub launch_ns: u64,
    pub syncs: u64,
    pub sync_ns: u64,
    pub allocs: u64,
    pub alloc_ns: u64,
    /// CUPTI's synchronization records and overhead records ("Command Buffer Full").
    pub sync_records: u64,
    pub overhead_records: u64,
    pub overhead_ns: u64,
    pub command_buffer_full_ns: u64,
    pub flows: u64,
    /// Records left out: outside the traced window, or with nothing to place them by.
    pub left_out: u64,
    /// GPU records whose launch was not captured (placed by time only).
    pub unlaunched: u64,
    /// Records CUPTI dropped (its buffers were full).
    pub dropped: u64,
    /// GPU records moved to fit the GPU spans: the shift per device (median over steps,
    /// ns, record time minus trace time), steps where no single shift fit every kernel,
    /// and records cut at a GPU span's edge.
    pub shift_ns: BTreeMap<u32, i64>,
    pub unfit_groups: u64,
    pub trimmed: u64,
    /// Tracks made for threads and streams the recorder had none for.
    pub new_tracks: u64,
    /// Per GPU-timed section (by name): kernels launched inside it, their busy time, and
    /// the section's GPU time (CUDA events) over the same spans.
    pub sections: BTreeMap<String, SectionKernels>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SectionKernels {
    pub spans: u64,
    pub kernels: u64,
    pub kernel_ns: u64,
    pub gpu_ns: u64,
}

impl MergeReport {
    /// One line for the run's end.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "kernel trace: {} kernels, {} copies, {} sets, {} CUDA calls ({} launches {:.1} ms, {} syncs {:.1} ms, {} allocations {:.1} ms)",
            self.kernels,
            self.memcpys,
            self.memsets,
            self.api_calls,
            self.launches,
            self.launch_ns as f64 / 1e6,
            self.syncs,
            self.sync_ns as f64 / 1e6,
            self.allocs,
            self.alloc_ns as f64 / 1e6,
        );
        if self.command_buffer_full_ns > 0 {
            s += &format!(
                ", command buffer full {:.1} ms",
                self.command_buffer_full_ns as f64 / 1e6
            );
        }
        if self.dropped > 0 {
            s += &format!(
                "; CUPTI dropped {} records (buffers full: raise DFLASH_CUPTI_BUFFER_MB)",
                self.dropped
            );
        }
        s
    }
}

/// A record placed on the trace's time axis.
#[derive(Clone, Copy, Debug)]
struct Placed {
    idx: usize,
    pid: u32,
    tid: u32,
    ts: i64,
    end: i64,
}

/// Which track a GPU span is on, and its place in the track's nesting.
struct TrackSpans {
    /// Indices into `gpu_spans`, by start (longer first on ties).
    order: Vec<usize>,
    /// For each span of `order`: the index (into `gpu_spans`) of its outermost span.
    root: HashMap<usize, usize>,
}

fn track_spans(spans: &[PlacedGpuSpan]) -> HashMap<(u32, u32), TrackSpans> {
    let mut by: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        by.entry((s.device, s.track)).or_default().push(i);
    }
    by.into_iter()
        .map(|(k, mut order)| {
            order.sort_by_key(|&i| (spans[i].ts_ns, std::cmp::Reverse(spans[i].dur_ns)));
            let mut root = HashMap::new();
            let mut stack: Vec<usize> = Vec::new();
            for &i in &order {
                while stack
                    .last()
                    .is_some_and(|&t| spans[t].end_ns() <= spans[i].ts_ns)
                {
                    stack.pop();
                }
                let r = stack.first().copied().unwrap_or(i);
                root.insert(i, r);
                stack.push(i);
            }
            (k, TrackSpans { order, root })
        })
        .collect()
}

/// The innermost GPU span whose CPU span on `thread` was open at `t` (trace ns), on
/// `device`.
fn launching_span(
    spans: &[PlacedGpuSpan],
    by_thread: &HashMap<u32, Vec<usize>>,
    thread: u32,
    device: u32,
    t: u64,
) -> Option<usize> {
    innermost_open(spans, by_thread.get(&thread)?, t, |s| s.device == device)
}

/// Of `list` (indices into `spans`, by CPU start), the span open on the CPU at `t` that
/// `keep` accepts and that started last (the innermost).
fn innermost_open(
    spans: &[PlacedGpuSpan],
    list: &[usize],
    t: u64,
    keep: impl Fn(&PlacedGpuSpan) -> bool,
) -> Option<usize> {
    let upto = list.partition_point(|&i| spans[i].cpu_ts_ns <= t);
    list[..upto]
        .iter()
        .rev()
        .take(4096)
        .copied()
        .filter(|&i| t <= spans[i].cpu_end_ns && keep(&spans[i]))
        .max_by_key(|&i| spans[i].cpu_ts_ns)
}

fn category(kind: ActivityKind) -> Category {
    match kind {
        ActivityKind::Kernel => Category::Kernel,
        ActivityKind::Memcpy => Category::GpuMemcpy,
        ActivityKind::Memset => Category::GpuMemset,
        ActivityKind::Runtime => Category::CudaRuntime,
        ActivityKind::Driver => Category::CudaDriver,
        ActivityKind::Sync => Category::CudaSync,
        ActivityKind::Overhead => Category::Overhead,
    }
}

fn is_gpu(kind: ActivityKind) -> bool {
    matches!(
        kind,
        ActivityKind::Kernel | ActivityKind::Memcpy | ActivityKind::Memset
    )
}

/// Writes the capture into the trace through `w` and says what it did.
pub fn merge(input: &MergeInput, w: &mut EventWriter) -> MergeReport {
    let mut rep = MergeReport {
        dropped: input.dropped,
        ..Default::default()
    };
    let spans = &input.gpu_spans;
    let acts = &input.activities;
    let to_trace = |t: u64| t as i64 - input.base_clock_ns as i64;

    // threads: known ones by OS id; the window is what any of them recorded
    let by_os: HashMap<u32, &TraceThread> = input.threads.iter().map(|t| (t.os_tid, t)).collect();
    let window = input.threads.iter().fold(None, |w: Option<(i64, i64)>, t| {
        let (a, b) = (t.first_ns as i64, t.last_ns as i64);
        Some(w.map_or((a, b), |(x, y)| (x.min(a), y.max(b))))
    });
    let Some(window) = window else {
        rep.left_out = acts.len() as u64;
        return rep;
    };
    let mut foreign: BTreeMap<u32, u32> = BTreeMap::new();

    // 1. calls on their threads
    let mut calls: Vec<Placed> = Vec::new();
    let mut launch_of: HashMap<u32, Placed> = HashMap::new();
    for (idx, a) in acts.iter().enumerate() {
        if !matches!(a.kind, ActivityKind::Runtime | ActivityKind::Driver) {
            continue;
        }
        let (ts, end) = (to_trace(a.start), to_trace(a.end).max(to_trace(a.start)));
        let (tid, extent) = match by_os.get(&a.tid) {
            Some(t) => (t.tid, (t.first_ns as i64, t.last_ns as i64)),
            None => {
                let n = foreign.len() as u32;
                (
                    *foreign.entry(a.tid).or_insert(FOREIGN_TID_BASE + n),
                    window,
                )
            }
        };
        if ts < extent.0 || end > extent.1 {
            rep.left_out += 1;
            continue;
        }
        let p = Placed {
            idx,
            pid: input.pid,
            tid,
            ts,
            end,
        };
        calls.push(p);
        if a.correlation != 0 {
            launch_of.insert(a.correlation, p);
        }
    }
    // foreign threads that ended up with no call kept get no track
    foreign.retain(|_, tid| calls.iter().any(|c| c.tid == *tid));

    // 2. GPU records: launched inside the window, or (launch not captured) in it
    let mut by_thread: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, s) in spans.iter().enumerate() {
        by_thread.entry(s.thread).or_default().push(i);
    }
    for v in by_thread.values_mut() {
        v.sort_by_key(|&i| spans[i].cpu_ts_ns);
    }
    struct Gpu {
        idx: usize,
        ts: i64,
        end: i64,
        launch: Option<Placed>,
        /// The GPU span of the section that launched it.
        section: Option<usize>,
    }
    let mut gpu: Vec<Gpu> = Vec::new();
    for (idx, a) in acts.iter().enumerate() {
        if !is_gpu(a.kind) {
            continue;
        }
        let (ts, end) = (to_trace(a.start), to_trace(a.end).max(to_trace(a.start)));
        let launch = launch_of.get(&a.correlation).copied();
        if launch.is_none() {
            rep.unlaunched += 1;
            if ts < window.0 || ts > window.1 {
                rep.left_out += 1;
                continue;
            }
        }
        let section = launch.and_then(|l| {
            let known = input.threads.iter().any(|t| t.tid == l.tid);
            known
                .then(|| launching_span(spans, &by_thread, l.tid, a.device, l.ts as u64))
                .flatten()
        });
        gpu.push(Gpu {
            idx,
            ts,
            end,
            launch,
            section,
        });
    }

    // 3. streams onto tracks, by vote of the launching sections' GPU spans
    let mut votes: HashMap<(u32, u32), HashMap<u32, u64>> = HashMap::new();
    for g in &gpu {
        if let Some(s) = g.section {
            let a = &acts[g.idx];
            *votes
                .entry((a.device, a.stream))
                .or_default()
                .entry(spans[s].track)
                .or_default() += 1;
        }
    }
    // one stream per track: the most voted pairs first
    let mut pairs: Vec<((u32, u32), u32, u64)> = votes
        .into_iter()
        .flat_map(|(k, v)| v.into_iter().map(move |(t, n)| (k, t, n)))
        .collect();
    pairs.sort_by_key(|&(k, t, n)| (std::cmp::Reverse(n), k, t));
    let mut track_of: HashMap<(u32, u32), u32> = HashMap::new();
    let mut taken: std::collections::HashSet<(u32, u32)> = std::collections::HashSet::new();
    for ((device, stream), t, _) in pairs {
        if !track_of.contains_key(&(device, stream)) && taken.insert((device, t)) {
            track_of.insert((device, stream), t);
        }
    }
    // records launched by threads that recorded no span (autograd's workers run the
    // backward's launches while the thread that called backward waits in its section):
    // the innermost GPU-timed section open on any thread at the launch whose GPU span is
    // on the record's stream track
    let mut by_cpu_start: Vec<usize> = (0..spans.len()).collect();
    by_cpu_start.sort_by_key(|&i| spans[i].cpu_ts_ns);
    for g in gpu.iter_mut().filter(|g| g.section.is_none()) {
        let (Some(l), a) = (g.launch, &acts[g.idx]) else {
            continue;
        };
        if input.threads.iter().any(|t| t.tid == l.tid) {
            continue;
        }
        let Some(&track) = track_of.get(&(a.device, a.stream)) else {
            continue;
        };
        g.section = innermost_open(spans, &by_cpu_start, l.ts as u64, |s| {
            s.device == a.device && s.track == track
        });
    }
    let mut named_devices: std::collections::BTreeSet<u32> =
        spans.iter().map(|s| s.device).collect();
    let mut new_streams: Vec<(u32, u32, u32)> = Vec::new();
    for g in &gpu {
        let a = &acts[g.idx];
        if let std::collections::hash_map::Entry::Vacant(e) = track_of.entry((a.device, a.stream)) {
            let tid = STREAM_TID_BASE + a.stream;
            e.insert(tid);
            new_streams.push((a.device, a.stream, tid));
        }
    }

    // 4. shifts: per outermost GPU span, the one that fits its kernels into their sections
    let tracks = track_spans(spans);
    let root_of = |s: usize| -> usize {
        tracks
            .get(&(spans[s].device, spans[s].track))
            .and_then(|t| t.root.get(&s).copied())
            .unwrap_or(s)
    };
    let mut groups: BTreeMap<(u32, u64, usize), (i64, i64)> = BTreeMap::new();
    for g in &gpu {
        let Some(s) = g.section else { continue };
        let a = &acts[g.idx];
        if track_of.get(&(a.device, a.stream)) != Some(&spans[s].track) {
            continue;
        }
        let sp = &spans[s];
        let r = root_of(s);
        let lo = g.end - sp.end_ns() as i64;
        let hi = g.ts - sp.ts_ns as i64;
        let e = groups
            .entry((sp.device, spans[r].ts_ns, r))
            .or_insert((i64::MIN, i64::MAX));
        e.0 = e.0.max(lo);
        e.1 = e.1.min(hi);
    }
    // device -> [(root start, root end, shift)] by start
    let mut shifts: HashMap<u32, Vec<(i64, i64, i64)>> = HashMap::new();
    let mut prev: HashMap<u32, i64> = HashMap::new();
    for (&(device, _, r), &(lo, hi)) in &groups {
        let p = prev.get(&device).copied().unwrap_or(0);
        let d = if lo <= hi {
            p.clamp(lo, hi)
        } else {
            rep.unfit_groups += 1;
            lo / 2 + hi / 2
        };
        prev.insert(device, d);
        let root = &spans[r];
        shifts
            .entry(device)
            .or_default()
            .push((root.ts_ns as i64, root.end_ns() as i64, d));
    }
    for (device, list) in &shifts {
        let mut v: Vec<i64> = list.iter().map(|x| x.2).collect();
        v.sort_unstable();
        rep.shift_ns.insert(*device, v[v.len() / 2]);
    }
    let shift_at = |device: u32, ts: i64| -> i64 {
        let Some(list) = shifts.get(&device) else {
            return 0;
        };
        // the last root starting at or before the record (in trace time)
        let i = list.partition_point(|&(s, _, d)| s + d <= ts);
        if i == 0 {
            list[0].2
        } else {
            list[i - 1].2
        }
    };
    for g in &mut gpu {
        let a = &acts[g.idx];
        let d = match g.section {
            Some(s) => {
                let r = root_of(s);
                let key = spans[r].ts_ns as i64;
                shifts
                    .get(&a.device)
                    .and_then(|l| l.iter().find(|x| x.0 == key).map(|x| x.2))
                    .unwrap_or_else(|| shift_at(a.device, g.ts))
            }
            None => shift_at(a.device, g.ts),
        };
        g.ts -= d;
        g.end -= d;
    }

    // 5. nesting: cut what crosses a GPU span's edge on its track
    for g in &mut gpu {
        let a = &acts[g.idx];
        let track = track_of[&(a.device, a.stream)];
        let Some(t) = tracks.get(&(a.device, track)) else {
            continue;
        };
        let o = &t.order;
        let after = o.partition_point(|&i| (spans[i].ts_ns as i64) <= g.ts);
        let mut limit = i64::MAX;
        if let Some(&next) = o.get(after) {
            limit = limit.min(spans[next].ts_ns as i64);
        }
        // innermost container of the start: the latest-starting span before it that
        // still covers it
        for &i in o[..after].iter().rev().take(4096) {
            let s = &spans[i];
            if s.end_ns() as i64 > g.ts {
                limit = limit.min(s.end_ns() as i64);
                break;
            }
        }
        if g.end > limit {
            g.end = limit.max(g.ts);
            rep.trimmed += 1;
        }
    }

    // records of one stream run one after another, but CUPTI's converted timestamps can
    // overlap by a few hundred ns: cut the earlier one at the next one's start
    let mut per_track: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
    for (i, g) in gpu.iter().enumerate() {
        let a = &acts[g.idx];
        per_track
            .entry((a.device, track_of[&(a.device, a.stream)]))
            .or_default()
            .push(i);
    }
    for list in per_track.values_mut() {
        list.sort_by_key(|&i| (gpu[i].ts, gpu[i].end));
        for w in 1..list.len() {
            let next = gpu[list[w]].ts;
            let g = &mut gpu[list[w - 1]];
            if g.end > next {
                g.end = next.max(g.ts);
                rep.trimmed += 1;
            }
        }
    }

    // 6. section figures: kernels launched in each GPU-timed section, their busy time
    for s in spans {
        let e = rep.sections.entry(s.name.clone()).or_default();
        e.spans += 1;
        e.gpu_ns += s.dur_ns;
    }
    for g in &gpu {
        if acts[g.idx].kind != ActivityKind::Kernel {
            continue;
        }
        // the section and every GPU-timed section around it on its thread
        let Some(s) = g.section else { continue };
        let thread = spans[s].thread;
        let t = g.launch.map(|l| l.ts as u64).unwrap_or(0);
        let mut names: Vec<&str> = by_thread[&thread]
            .iter()
            .filter(|&&i| spans[i].cpu_ts_ns <= t && t <= spans[i].cpu_end_ns)
            .map(|&i| spans[i].name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        for n in names {
            if let Some(e) = rep.sections.get_mut(n) {
                e.kernels += 1;
                e.kernel_ns += (g.end - g.ts).max(0) as u64;
            }
        }
    }

    // 7. write: track names, calls, syncs, overhead, GPU records, flows
    for (os, tid) in &foreign {
        w.meta(&Meta::ThreadName {
            pid: input.pid,
            tid: *tid,
            name: &format!("CUDA calls {os}"),
        });
        w.meta(&Meta::ThreadSortIndex {
            pid: input.pid,
            tid: *tid,
            index: u64::from(*tid),
        });
    }
    rep.new_tracks += foreign.len() as u64;
    for &(device, stream, tid) in &new_streams {
        if named_devices.insert(device) {
            name_device(w, device);
        }
        w.meta(&Meta::ThreadName {
            pid: device,
            tid,
            name: &format!("stream {stream} (CUDA)"),
        });
        w.meta(&Meta::ThreadSortIndex {
            pid: device,
            tid,
            index: u64::from(tid),
        });
        rep.new_tracks += 1;
    }
    // outermost calls per thread for the class totals
    calls.sort_by_key(|c| (c.tid, c.ts, std::cmp::Reverse(c.end)));
    let mut open_until: HashMap<u32, i64> = HashMap::new();
    for c in &calls {
        let a = &acts[c.idx];
        let outer = open_until.get(&c.tid).is_none_or(|&e| c.ts >= e);
        if outer {
            open_until.insert(c.tid, c.end);
            let dur = (c.end - c.ts) as u64;
            match ApiClass::of(&a.name) {
                ApiClass::Launch => {
                    rep.launches += 1;
                    rep.launch_ns += dur;
                }
                ApiClass::Sync => {
                    rep.syncs += 1;
                    rep.sync_ns += dur;
                }
                ApiClass::Alloc | ApiClass::Free => {
                    rep.allocs += 1;
                    rep.alloc_ns += dur;
                }
                ApiClass::Other => {}
            }
        }
        let args = [
            Arg {
                key: kineto::CORRELATION,
                value: ArgValue::U64(a.correlation.into()),
            },
            Arg {
                key: kineto::CBID,
                value: ArgValue::U64(a.detail.into()),
            },
        ];
        w.span(&Span {
            cat: category(a.kind),
            name: Text::Plain(&a.name),
            pid: c.pid,
            tid: c.tid,
            ts_ns: c.ts as u64,
            dur_ns: (c.end - c.ts) as u64,
            bind: None,
            args: &args,
        });
        rep.api_calls += 1;
    }
    // devices whose overhead records went on their own track, named after the loop
    let mut overhead_tracks: std::collections::BTreeSet<u32> = Default::default();
    for a in acts {
        match a.kind {
            ActivityKind::Sync => {
                // on the thread of the call that waited
                let Some(l) = launch_of.get(&a.correlation) else {
                    rep.left_out += 1;
                    continue;
                };
                let (ts, end) = (to_trace(a.start), to_trace(a.end));
                let (ts, end) = (ts.max(l.ts), end.min(l.end).max(ts.max(l.ts)));
                let args = [
                    Arg {
                        key: kineto::CORRELATION,
                        value: ArgValue::U64(a.correlation.into()),
                    },
                    Arg {
                        key: kineto::STREAM,
                        value: ArgValue::U64(a.stream.into()),
                    },
                ];
                w.span(&Span {
                    cat: Category::CudaSync,
                    name: Text::Plain(&a.name),
                    pid: l.pid,
                    tid: l.tid,
                    ts_ns: ts as u64,
                    dur_ns: (end - ts) as u64,
                    bind: None,
                    args: &args,
                });
                rep.sync_records += 1;
            }
            ActivityKind::Overhead => {
                let (ts, end) = (to_trace(a.start), to_trace(a.end).max(to_trace(a.start)));
                if ts < window.0 || ts > window.1 {
                    rep.left_out += 1;
                    continue;
                }
                let (pid, tid) = match by_os.get(&a.tid) {
                    Some(t) if a.tid != 0 => (input.pid, t.tid),
                    _ => match foreign.get(&a.tid) {
                        Some(&t) if a.tid != 0 => (input.pid, t),
                        _ => {
                            if named_devices.insert(a.device) {
                                name_device(w, a.device);
                            }
                            overhead_tracks.insert(a.device);
                            (a.device, OVERHEAD_TID)
                        }
                    },
                };
                w.span(&Span {
                    cat: Category::Overhead,
                    name: Text::Plain(&a.name),
                    pid,
                    tid,
                    ts_ns: ts as u64,
                    dur_ns: (end - ts) as u64,
                    bind: None,
                    args: &[],
                });
                rep.overhead_records += 1;
                rep.overhead_ns += (end - ts) as u64;
                if a.name == "Command Buffer Full" {
                    rep.command_buffer_full_ns += (end - ts) as u64;
                }
            }
            _ => {}
        }
    }
    for d in overhead_tracks {
        w.meta(&Meta::ThreadName {
            pid: d,
            tid: OVERHEAD_TID,
            name: "CUDA overhead",
        });
    }
    for g in &gpu {
        let a = &acts[g.idx];
        let track = track_of[&(a.device, a.stream)];
        let ts = g.ts.max(0) as u64;
        let dur = (g.end - g.ts).max(0) as u64;
        let mut args: Vec<Arg<'_>> = vec![
            Arg {
                key: kineto::DEVICE,
                value: ArgValue::U64(a.device.into()),
            },
            Arg {
                key: kineto::CONTEXT,
                value: ArgValue::U64(a.context.into()),
            },
            Arg {
                key: kineto::STREAM,
                value: ArgValue::U64(a.stream.into()),
            },
            Arg {
                key: kineto::CORRELATION,
                value: ArgValue::U64(a.correlation.into()),
            },
        ];
        match a.kind {
            ActivityKind::Kernel => {
                rep.kernels += 1;
                args.extend([
                    Arg {
                        key: kineto::REGISTERS,
                        value: ArgValue::I64(a.registers.into()),
                    },
                    Arg {
                        key: kineto::SHARED_MEMORY,
                        value: ArgValue::I64(
                            i64::from(a.shared_static) + i64::from(a.shared_dynamic),
                        ),
                    },
                    Arg {
                        key: kineto::GRID,
                        value: ArgValue::Triple(a.grid.map(i64::from)),
                    },
                    Arg {
                        key: kineto::BLOCK,
                        value: ArgValue::Triple(a.block.map(i64::from)),
                    },
                ]);
            }
            ActivityKind::Memcpy | ActivityKind::Memset => {
                if a.kind == ActivityKind::Memcpy {
                    rep.memcpys += 1;
                } else {
                    rep.memsets += 1;
                }
                args.push(Arg {
                    key: kineto::BYTES,
                    value: ArgValue::U64(a.bytes),
                });
                if dur > 0 {
                    args.push(Arg {
                        key: kineto::BANDWIDTH,
                        value: ArgValue::F64(a.bytes as f64 / dur as f64),
                    });
                }
            }
            _ => {}
        }
        w.span(&Span {
            cat: category(a.kind),
            name: Text::Plain(&a.name),
            pid: a.device,
            tid: track,
            ts_ns: ts,
            dur_ns: dur,
            bind: None,
            args: &args,
        });
        if let Some(l) = g.launch {
            w.flow(&Flow {
                dir: FlowDir::Out,
                id: a.correlation.into(),
                pid: l.pid,
                tid: l.tid,
                ts_ns: l.ts as u64,
                cat: Category::Ac2g,
                name: kineto::AC2G,
            });
            w.flow(&Flow {
                dir: FlowDir::In,
                id: a.correlation.into(),
                pid: a.device,
                tid: track,
                ts_ns: ts,
                cat: Category::Ac2g,
                name: kineto::AC2G,
            });
            rep.flows += 1;
        }
    }
    rep
}

fn name_device(w: &mut EventWriter, device: u32) {
    w.meta(&Meta::ProcessName {
        pid: device,
        name: &gpu_process_name(device),
    });
    w.meta(&Meta::ProcessSortIndex {
        pid: device,
        index: gpu_sort_index(device),
    });
}

#[cfg(test)]
mod tests;
