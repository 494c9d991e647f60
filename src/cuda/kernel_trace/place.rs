//! Where each record goes: calls on their threads' tracks, GPU records on their streams'
//! tracks, attributed to the GPU-timed section that launched them, shifted onto the GPU
//! spans and cut at their edges (the rules are in the parent module's header).
use std::collections::{BTreeMap, HashMap, HashSet};

use super::report::{MergeInput, MergeReport};
use crate::cuda::activity::{Activity, ActivityKind};
use crate::trace::PlacedGpuSpan;

/// `tid` of the first track made for a thread that recorded nothing.
pub(super) const FOREIGN_TID_BASE: u32 = 100_000;
/// `tid` offset of tracks made for GPU streams that have no GPU span.
pub(super) const STREAM_TID_BASE: u32 = 1_000;

/// A record placed on the trace's time axis.
#[derive(Clone, Copy, Debug)]
pub(super) struct Placed {
    pub idx: usize,
    pub pid: u32,
    pub tid: u32,
    pub ts: i64,
    pub end: i64,
}

/// A kernel, copy or set, placed.
pub(super) struct Gpu {
    pub idx: usize,
    pub ts: i64,
    pub end: i64,
    pub launch: Option<Placed>,
    /// The GPU span of the section that launched it.
    pub section: Option<usize>,
}

/// Everything placed, for the writer.
pub(super) struct Placement {
    /// From the first recorded event of any thread to the last (trace ns).
    pub window: (i64, i64),
    /// OS thread id -> the recorder's `tid`, for threads that recorded spans.
    pub known: HashMap<u32, u32>,
    /// OS thread id -> the track made for a thread that recorded nothing.
    pub foreign: BTreeMap<u32, u32>,
    pub calls: Vec<Placed>,
    /// Calls by correlation id.
    pub launch_of: HashMap<u32, Placed>,
    pub gpu: Vec<Gpu>,
    /// (device, CUPTI stream) -> track `tid`.
    pub track_of: HashMap<(u32, u32), u32>,
    /// Tracks made for streams with no GPU span: (device, stream, tid).
    pub new_streams: Vec<(u32, u32, u32)>,
    /// Indices of `gpu_spans` per recorder thread, by CPU start.
    pub by_thread: HashMap<u32, Vec<usize>>,
}

pub(super) fn is_gpu(kind: ActivityKind) -> bool {
    matches!(
        kind,
        ActivityKind::Kernel | ActivityKind::Memcpy | ActivityKind::Memset
    )
}

fn to_trace(input: &MergeInput, t: u64) -> i64 {
    t as i64 - input.base_clock_ns as i64
}

/// A record's start and end on the trace's clock (the end never before the start).
fn extent(input: &MergeInput, a: &Activity) -> (i64, i64) {
    let ts = to_trace(input, a.start);
    (ts, to_trace(input, a.end).max(ts))
}

/// Places every record; `None` (everything left out) when no thread recorded anything.
pub(super) fn place(input: &MergeInput, rep: &mut MergeReport) -> Option<Placement> {
    let window = input.threads.iter().fold(None, |w: Option<(i64, i64)>, t| {
        let (a, b) = (t.first_ns as i64, t.last_ns as i64);
        Some(w.map_or((a, b), |(x, y)| (x.min(a), y.max(b))))
    });
    let Some(window) = window else {
        rep.left_out = input.activities.len() as u64;
        return None;
    };
    let known = input.threads.iter().map(|t| (t.os_tid, t.tid)).collect();
    let mut p = Placement {
        window,
        known,
        foreign: BTreeMap::new(),
        calls: Vec::new(),
        launch_of: HashMap::new(),
        gpu: Vec::new(),
        track_of: HashMap::new(),
        new_streams: Vec::new(),
        by_thread: HashMap::new(),
    };
    place_calls(input, &mut p, rep);
    for (i, s) in input.gpu_spans.iter().enumerate() {
        p.by_thread.entry(s.thread).or_default().push(i);
    }
    let spans = &input.gpu_spans;
    for v in p.by_thread.values_mut() {
        v.sort_by_key(|&i| spans[i].cpu_ts_ns);
    }
    place_gpu_records(input, &mut p, rep);
    map_streams(input, &mut p);
    attribute_foreign_launches(input, &mut p);
    for g in &p.gpu {
        let a = &input.activities[g.idx];
        if let std::collections::hash_map::Entry::Vacant(e) = p.track_of.entry((a.device, a.stream))
        {
            let tid = STREAM_TID_BASE + a.stream;
            e.insert(tid);
            p.new_streams.push((a.device, a.stream, tid));
        }
    }
    let tracks = track_spans(spans);
    shift_onto_spans(input, &tracks, &mut p, rep);
    cut_at_span_edges(input, &tracks, &mut p, rep);
    cut_stream_overlaps(input, &mut p, rep);
    Some(p)
}

/// Step 1: Runtime and driver calls on their threads, inside the thread's recorded extent.
fn place_calls(input: &MergeInput, p: &mut Placement, rep: &mut MergeReport) {
    let extents: HashMap<u32, (i64, i64)> = input
        .threads
        .iter()
        .map(|t| (t.os_tid, (t.first_ns as i64, t.last_ns as i64)))
        .collect();
    for (idx, a) in input.activities.iter().enumerate() {
        if !matches!(a.kind, ActivityKind::Runtime | ActivityKind::Driver) {
            continue;
        }
        let (ts, end) = extent(input, a);
        let (tid, range) = match p.known.get(&a.tid) {
            Some(&tid) => (tid, extents[&a.tid]),
            None => {
                let n = p.foreign.len() as u32;
                let tid = *p.foreign.entry(a.tid).or_insert(FOREIGN_TID_BASE + n);
                (tid, p.window)
            }
        };
        if ts < range.0 || end > range.1 {
            rep.left_out += 1;
            continue;
        }
        let c = Placed {
            idx,
            pid: input.pid,
            tid,
            ts,
            end,
        };
        p.calls.push(c);
        if a.correlation != 0 {
            p.launch_of.insert(a.correlation, c);
        }
    }
    // foreign threads that ended up with no call kept get no track
    let calls = &p.calls;
    p.foreign
        .retain(|_, tid| calls.iter().any(|c| c.tid == *tid));
}

/// Step 2: GPU records launched inside the window, or (launch not captured) in it, with the
/// GPU span of the section whose thread launched them.
fn place_gpu_records(input: &MergeInput, p: &mut Placement, rep: &mut MergeReport) {
    for (idx, a) in input.activities.iter().enumerate() {
        if !is_gpu(a.kind) {
            continue;
        }
        let (ts, end) = extent(input, a);
        let launch = p.launch_of.get(&a.correlation).copied();
        if launch.is_none() {
            rep.unlaunched += 1;
            if ts < p.window.0 || ts > p.window.1 {
                rep.left_out += 1;
                continue;
            }
        }
        let section = launch.and_then(|l| {
            let known = input.threads.iter().any(|t| t.tid == l.tid);
            let list = p.by_thread.get(&l.tid).filter(|_| known)?;
            innermost_open(&input.gpu_spans, list, l.ts as u64, |s| {
                s.device == a.device
            })
        });
        p.gpu.push(Gpu {
            idx,
            ts,
            end,
            launch,
            section,
        });
    }
}

/// Step 3: CUPTI streams onto tracks, one stream per track, by vote of the launching
/// sections' GPU spans (the most voted pairs first).
fn map_streams(input: &MergeInput, p: &mut Placement) {
    let mut votes: HashMap<(u32, u32), HashMap<u32, u64>> = HashMap::new();
    for g in &p.gpu {
        if let Some(s) = g.section {
            let a = &input.activities[g.idx];
            *votes
                .entry((a.device, a.stream))
                .or_default()
                .entry(input.gpu_spans[s].track)
                .or_default() += 1;
        }
    }
    let mut pairs: Vec<((u32, u32), u32, u64)> = votes
        .into_iter()
        .flat_map(|(k, v)| v.into_iter().map(move |(t, n)| (k, t, n)))
        .collect();
    pairs.sort_by_key(|&(k, t, n)| (std::cmp::Reverse(n), k, t));
    let mut taken: HashSet<(u32, u32)> = HashSet::new();
    for ((device, stream), t, _) in pairs {
        if !p.track_of.contains_key(&(device, stream)) && taken.insert((device, t)) {
            p.track_of.insert((device, stream), t);
        }
    }
}

/// Records launched by threads that recorded no span (autograd's workers run the
/// backward's launches while the thread that called backward waits in its section): the
/// innermost GPU-timed section open on any thread at the launch whose GPU span is on the
/// record's stream track.
fn attribute_foreign_launches(input: &MergeInput, p: &mut Placement) {
    let spans = &input.gpu_spans;
    let mut by_cpu_start: Vec<usize> = (0..spans.len()).collect();
    by_cpu_start.sort_by_key(|&i| spans[i].cpu_ts_ns);
    for g in p.gpu.iter_mut().filter(|g| g.section.is_none()) {
        let (Some(l), a) = (g.launch, &input.activities[g.idx]) else {
            continue;
        };
        if input.threads.iter().any(|t| t.tid == l.tid) {
            continue;
        }
        let Some(&track) = p.track_of.get(&(a.device, a.stream)) else {
            continue;
        };
        g.section = innermost_open(spans, &by_cpu_start, l.ts as u64, |s| {
            s.device == a.device && s.track == track
        });
    }
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

/// Step 4: Shifts: per outermost GPU span, the one that puts every kernel launched in one of
/// its sections inside that section's GPU span (closest to the previous shift); other
/// records take the shift of the outermost span they fall in, or the last before them.
fn shift_onto_spans(
    input: &MergeInput,
    tracks: &HashMap<(u32, u32), TrackSpans>,
    p: &mut Placement,
    rep: &mut MergeReport,
) {
    let (spans, acts) = (&input.gpu_spans, &input.activities);
    let root_of = |s: usize| -> usize {
        tracks
            .get(&(spans[s].device, spans[s].track))
            .and_then(|t| t.root.get(&s).copied())
            .unwrap_or(s)
    };
    // (device, root start, root) -> the range of shifts that fits every kernel
    let mut groups: BTreeMap<(u32, u64, usize), (i64, i64)> = BTreeMap::new();
    for g in &p.gpu {
        let Some(s) = g.section else { continue };
        let a = &acts[g.idx];
        if p.track_of.get(&(a.device, a.stream)) != Some(&spans[s].track) {
            continue;
        }
        let sp = &spans[s];
        let r = root_of(s);
        let e = groups
            .entry((sp.device, spans[r].ts_ns, r))
            .or_insert((i64::MIN, i64::MAX));
        e.0 = e.0.max(g.end - sp.end_ns() as i64);
        e.1 = e.1.min(g.ts - sp.ts_ns as i64);
    }
    // device -> [(root start, root end, shift)] by start
    let mut shifts: HashMap<u32, Vec<(i64, i64, i64)>> = HashMap::new();
    let mut prev: HashMap<u32, i64> = HashMap::new();
    for (&(device, _, r), &(lo, hi)) in &groups {
        let last = prev.get(&device).copied().unwrap_or(0);
        let d = if lo <= hi {
            last.clamp(lo, hi)
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
        list[i.saturating_sub(1)].2
    };
    for g in &mut p.gpu {
        let a = &acts[g.idx];
        let d = match g.section {
            Some(s) => {
                let key = spans[root_of(s)].ts_ns as i64;
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
}

/// Step 5: Nesting: what crosses the edge of a GPU span on its track is cut at the edge.
fn cut_at_span_edges(
    input: &MergeInput,
    tracks: &HashMap<(u32, u32), TrackSpans>,
    p: &mut Placement,
    rep: &mut MergeReport,
) {
    let spans = &input.gpu_spans;
    for g in &mut p.gpu {
        let a = &input.activities[g.idx];
        let track = p.track_of[&(a.device, a.stream)];
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
}

/// Records of one stream run one after another, but CUPTI's converted timestamps can
/// overlap by a few hundred ns: the earlier one is cut at the next one's start.
fn cut_stream_overlaps(input: &MergeInput, p: &mut Placement, rep: &mut MergeReport) {
    let mut per_track: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
    for (i, g) in p.gpu.iter().enumerate() {
        let a = &input.activities[g.idx];
        per_track
            .entry((a.device, p.track_of[&(a.device, a.stream)]))
            .or_default()
            .push(i);
    }
    let gpu = &mut p.gpu;
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
}
