//! Writer-side GPU span resolution: collects the GPU halves of drained spans into
//! per-thread *trees* (an outermost GPU span and the GPU spans nested in it), waits
//! without blocking until their events have completed, and places each tree on the CPU
//! clock with one calibration, so that:
//! - a GPU span never starts before its CPU span (a violation raises the calibration's
//!   offset, for this tree and later ones);
//! - spans of one tree nest on their stream's track as they did on the CPU (inner spans
//!   are measured from the tree's root event, and clamped into their parent against the
//!   ~0.5 us resolution of CUDA events);
//! - consecutive trees on one stream track never overlap (a tree that would start
//!   before the previous one ended is moved later).
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use chrome_trace_format::tracks::stream_track_name;

use crate::backend::{GpuBackend, GpuEvent};
use crate::calib;
use crate::clock::Timebase;
use crate::event::{Arg, GpuPart, RawEvent, MAX_ARGS};
use crate::holds::Holds;
use crate::names::Name;

/// A GPU half waiting for its events.
#[derive(Clone, Debug)]
pub(crate) struct PendingGpu {
    pub name: Name,
    /// `ts` and end of the CPU span, ns.
    pub cpu_ts: u64,
    pub cpu_end: u64,
    pub args: [Arg; MAX_ARGS],
    pub nargs: u8,
    pub flow: u64,
    /// Step + 1, 0: none.
    pub step: u64,
    pub part: GpuPart,
}

/// A placed GPU span, ready to write.
#[derive(Clone, Debug)]
pub(crate) struct GpuSpanOut {
    pub name: Name,
    pub device: u32,
    pub tid: u32,
    pub ts: u64,
    pub dur: u64,
    pub flow: u64,
    pub step: u64,
    pub cpu_ts: u64,
    pub cpu_end: u64,
    /// The launching thread's tid and the backend's stream key.
    pub thread: u32,
    pub stream: u64,
    pub args: [Arg; MAX_ARGS],
    pub nargs: u8,
}

/// Naming events the writer must emit for tracks created while resolving.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum TrackMeta {
    Process { device: u32 },
    Thread { device: u32, tid: u32, name: String },
}

struct Track {
    tid: u32,
    last_end: u64,
}

enum TreeState {
    Ready,
    NotReady,
    Failed,
}

pub(crate) struct Resolver {
    backend: Arc<dyn GpuBackend>,
    /// Trees whose root has not arrived yet, by (thread tid, tree id).
    open: HashMap<(u32, u32), Vec<PendingGpu>>,
    /// The last root seen per thread: a non-root of an older tree arrived after its
    /// root (a guard dropped out of order) and is placed on its own.
    last_root: HashMap<u32, u32>,
    /// Complete trees per thread, in stream order.
    ready: HashMap<u32, VecDeque<Vec<PendingGpu>>>,
    tracks: HashMap<(u32, u64), Track>,
    next_tid: HashMap<u32, u32>,
    named_devices: BTreeSet<u32>,
    labels: HashMap<u32, String>,
    /// Each thread's event holds, released as its spans are placed or dropped.
    holds: HashMap<u32, Arc<Holds>>,
    /// Spans placed or dropped whose events are not handed back yet, by thread.
    releases: Vec<(u32, GpuPart)>,
    /// Spans in `open` and `ready`.
    waiting: usize,
    pub placed: u64,
    pub dropped: u64,
}

/// Spans waiting for their events beyond which the oldest are given up, so a GPU that
/// never completes (hung, or a backend that lies) cannot grow the writer without bound.
const MAX_WAITING: usize = 100_000;

impl Resolver {
    pub(crate) fn new(backend: Arc<dyn GpuBackend>) -> Self {
        Resolver {
            backend,
            open: HashMap::new(),
            last_root: HashMap::new(),
            ready: HashMap::new(),
            tracks: HashMap::new(),
            next_tid: HashMap::new(),
            named_devices: BTreeSet::new(),
            labels: HashMap::new(),
            holds: HashMap::new(),
            releases: Vec::new(),
            waiting: 0,
            placed: 0,
            dropped: 0,
        }
    }

    pub(crate) fn backend(&self) -> &dyn GpuBackend {
        &*self.backend
    }

    /// The label of thread `tid`'s GPU binding, used to name stream tracks it creates.
    pub(crate) fn set_label(&mut self, tid: u32, label: &str) {
        if self.labels.get(&tid).map(String::as_str) != Some(label) {
            self.labels.insert(tid, label.to_string());
        }
    }

    /// Takes the GPU half of a drained event from thread `tid`, whose events `holds`
    /// holds.
    pub(crate) fn add(
        &mut self,
        tid: u32,
        holds: &Arc<Holds>,
        ev: &RawEvent,
        (cpu_ts, cpu_end): (u64, u64),
    ) {
        let Some(part) = ev.gpu else {
            return;
        };
        self.holds.entry(tid).or_insert_with(|| holds.clone());
        let p = PendingGpu {
            name: ev.head.name,
            cpu_ts,
            cpu_end,
            args: ev.args,
            nargs: ev.head.nargs,
            flow: ev.head.flow,
            step: ev.head.aux,
            part,
        };
        if self.waiting >= MAX_WAITING {
            self.shed();
            self.flush_releases();
        }
        self.waiting += 1;
        let q = self.ready.entry(tid).or_default();
        if part.root {
            let mut tree = self.open.remove(&(tid, part.tree)).unwrap_or_default();
            tree.push(p);
            q.push_back(tree);
            self.last_root.insert(tid, part.tree);
        } else if self.last_root.get(&tid).is_some_and(|&r| part.tree <= r) {
            q.push_back(vec![p]);
        } else {
            self.open.entry((tid, part.tree)).or_default().push(p);
        }
    }

    /// Spans still waiting (for their events or their root).
    pub(crate) fn pending(&self) -> usize {
        self.waiting
    }

    /// Gives up the oldest complete tree of the thread with most waiting.
    fn shed(&mut self) {
        let longest = self
            .ready
            .iter()
            .max_by_key(|(_, q)| q.len())
            .map(|(&t, _)| t);
        let tree = longest.and_then(|t| self.ready.get_mut(&t).and_then(|q| q.pop_front()));
        match (longest, tree) {
            (Some(tid), Some(t)) => self.discard(tid, &t),
            _ => {
                // Only rootless trees: give up all of them.
                let open: Vec<((u32, u32), Vec<PendingGpu>)> = self.open.drain().collect();
                for ((tid, _), t) in &open {
                    self.discard(*tid, t);
                }
            }
        }
    }

    /// The oldest calibration epoch per device that a waiting span refers to.
    pub(crate) fn oldest_epochs(&self) -> HashMap<usize, u32> {
        let mut m: HashMap<usize, u32> = HashMap::new();
        let all = self
            .open
            .values()
            .chain(self.ready.values().flat_map(|q| q.iter()));
        for p in all.flatten() {
            let e = m.entry(p.part.device as usize).or_insert(u32::MAX);
            *e = (*e).min(p.part.epoch);
        }
        m
    }

    /// Places every tree whose events have completed, in order per thread. Never blocks.
    pub(crate) fn resolve(
        &mut self,
        tb: &Timebase,
        out: &mut Vec<GpuSpanOut>,
        meta: &mut Vec<TrackMeta>,
    ) {
        let threads: Vec<u32> = self.ready.keys().copied().collect();
        for tid in threads {
            while let Some(tree) = self.ready.get(&tid).and_then(|q| q.front()) {
                match self.state(tree) {
                    TreeState::NotReady => break,
                    TreeState::Failed => {
                        if let Some(t) = self.ready.get_mut(&tid).and_then(|q| q.pop_front()) {
                            self.discard(tid, &t);
                        }
                    }
                    TreeState::Ready => {
                        if let Some(t) = self.ready.get_mut(&tid).and_then(|q| q.pop_front()) {
                            self.place(tid, &t, tb, out, meta);
                        }
                    }
                }
            }
        }
        self.ready.retain(|_, q| !q.is_empty());
        self.flush_releases();
    }

    /// Treats trees whose root never arrived (still open when the recorder finishes)
    /// as complete, so their spans are placed too.
    pub(crate) fn close_open_trees(&mut self) {
        let mut keys: Vec<(u32, u32)> = self.open.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            if let Some(t) = self.open.remove(&k) {
                self.ready.entry(k.0).or_default().push_back(t);
            }
        }
    }

    /// Gives up on everything still waiting.
    pub(crate) fn discard_all(&mut self) {
        self.close_open_trees();
        let trees: Vec<(u32, VecDeque<Vec<PendingGpu>>)> = self.ready.drain().collect();
        for (tid, q) in &trees {
            for t in q {
                self.discard(*tid, t);
            }
        }
        self.flush_releases();
    }

    fn discard(&mut self, tid: u32, tree: &[PendingGpu]) {
        for p in tree {
            self.release(tid, &p.part);
        }
        self.dropped += tree.len() as u64;
        self.waiting = self.waiting.saturating_sub(tree.len());
    }

    /// Queues the release of a span's events; [`flush_releases`](Self::flush_releases)
    /// hands them back, one lock of each thread's holds per pass.
    fn release(&mut self, tid: u32, g: &GpuPart) {
        self.releases.push((tid, *g));
    }

    fn flush_releases(&mut self) {
        if self.releases.is_empty() {
            return;
        }
        self.releases.sort_by_key(|r| r.0);
        for run in self.releases.chunk_by(|a, b| a.0 == b.0) {
            if let Some(h) = self.holds.get(&run[0].0) {
                h.release_parts(run.iter().map(|r| &r.1));
            }
        }
        self.releases.clear();
    }

    fn state(&self, tree: &[PendingGpu]) -> TreeState {
        for p in tree {
            for ev in [p.part.end, p.part.begin] {
                match self.backend.query(GpuEvent(ev)) {
                    Ok(true) => {}
                    Ok(false) => return TreeState::NotReady,
                    Err(_) => return TreeState::Failed,
                }
            }
        }
        TreeState::Ready
    }

    fn place(
        &mut self,
        tid: u32,
        tree: &[PendingGpu],
        tb: &Timebase,
        out: &mut Vec<GpuSpanOut>,
        meta: &mut Vec<TrackMeta>,
    ) {
        let Some(mut spans) = self.times(tree, tb) else {
            self.discard(tid, tree);
            return;
        };
        // Never before the launching CPU span: raise the calibration's offset by the
        // worst violation in this tree; it stays raised for later trees.
        let need = tree
            .iter()
            .zip(&spans)
            .map(|(p, &(s, _))| p.cpu_ts as i64 - s)
            .max()
            .unwrap_or(0);
        let anchor = tree.iter().find(|p| p.part.root).unwrap_or(&tree[0]).part;
        let raise = {
            let mut store = calib::cals();
            let cal = store
                .devices
                .get_mut(&(anchor.device as usize))
                .and_then(|l| l.iter_mut().find(|c| c.epoch == anchor.epoch));
            match cal {
                Some(c) => {
                    if need > c.raise_ns as i64 {
                        c.raise_ns = need as u64;
                    }
                    c.raise_ns as i64
                }
                None => need.max(0),
            }
        };
        for (s, e) in &mut spans {
            *s += raise;
            *e += raise;
        }
        // Per track: nest, then keep after the track's previous tree.
        let mut keys: Vec<(u32, u64)> = tree
            .iter()
            .map(|p| (p.part.device, p.part.stream))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut tids = HashMap::new();
        for key in keys {
            let idx: Vec<usize> = (0..tree.len())
                .filter(|&i| (tree[i].part.device, tree[i].part.stream) == key)
                .collect();
            let mut group: Vec<(i64, i64)> = idx.iter().map(|&i| spans[i]).collect();
            nest_clamp(&mut group);
            let track_tid = self.track(key, tid, meta);
            let track = self.tracks.get_mut(&key);
            if let Some(track) = track {
                let first = group.iter().map(|g| g.0).min().unwrap_or(0);
                let shift = (track.last_end as i64 - first).max(0);
                for g in &mut group {
                    g.0 += shift;
                    g.1 += shift;
                }
                let last = group.iter().map(|g| g.1).max().unwrap_or(0);
                track.last_end = track.last_end.max(last.max(0) as u64);
            }
            for (k, &i) in idx.iter().enumerate() {
                spans[i] = group[k];
            }
            tids.insert(key, track_tid);
        }
        for (p, &(s, e)) in tree.iter().zip(&spans) {
            let ts = s.max(0) as u64;
            out.push(GpuSpanOut {
                name: p.name,
                device: p.part.device,
                tid: tids
                    .get(&(p.part.device, p.part.stream))
                    .copied()
                    .unwrap_or(1),
                ts,
                dur: (e.max(0) as u64).saturating_sub(ts),
                flow: p.flow,
                step: p.step,
                cpu_ts: p.cpu_ts,
                cpu_end: p.cpu_end,
                thread: tid,
                stream: p.part.stream,
                args: p.args,
                nargs: p.nargs,
            });
            self.release(tid, &p.part);
        }
        self.placed += tree.len() as u64;
        self.waiting = self.waiting.saturating_sub(tree.len());
    }

    /// (start, end) in ns for each span of `tree`, before corrections. Spans on the
    /// root's stream are measured from the root's begin event (short, precise
    /// intervals); others from their own calibration.
    fn times(&self, tree: &[PendingGpu], tb: &Timebase) -> Option<Vec<(i64, i64)>> {
        let b = &*self.backend;
        let store = calib::cals();
        let cal_start = |p: &GpuPart| -> Option<f64> {
            let cal = store
                .devices
                .get(&(p.device as usize))?
                .iter()
                .find(|c| c.epoch == p.epoch)?;
            let ms = b.elapsed_ms(cal.event, GpuEvent(p.begin)).ok()?;
            Some(tb.ns(cal.cpu_ticks) as f64 + ms * 1e6)
        };
        let root = tree.iter().find(|p| p.part.root).map(|p| p.part);
        let root_start = match &root {
            Some(r) => Some(cal_start(r)?),
            None => None,
        };
        let mut v = Vec::with_capacity(tree.len());
        for p in tree {
            let g = &p.part;
            let start = match (&root, root_start) {
                (Some(r), Some(rs)) if r.device == g.device && r.stream == g.stream => {
                    rs + b.elapsed_ms(GpuEvent(r.begin), GpuEvent(g.begin)).ok()? * 1e6
                }
                _ => cal_start(g)?,
            };
            let dur = b
                .elapsed_ms(GpuEvent(g.begin), GpuEvent(g.end))
                .ok()?
                .max(0.0)
                * 1e6;
            let s = start.round() as i64;
            v.push((s, s + dur.round() as i64));
        }
        Some(v)
    }

    fn track(&mut self, key: (u32, u64), thread: u32, meta: &mut Vec<TrackMeta>) -> u32 {
        if let Some(t) = self.tracks.get(&key) {
            return t.tid;
        }
        let (device, stream) = key;
        if self.named_devices.insert(device) {
            meta.push(TrackMeta::Process { device });
        }
        let n = self.next_tid.entry(device).or_insert(0);
        *n += 1;
        let tid = *n;
        let name = stream_track_name(stream as i64, self.labels.get(&thread).map(String::as_str));
        meta.push(TrackMeta::Thread { device, tid, name });
        self.tracks.insert(key, Track { tid, last_end: 0 });
        tid
    }
}

/// Makes intervals properly nested: sorted by start (longer first on ties), each one is
/// cut to end no later than the innermost interval that contains its start.
fn nest_clamp(spans: &mut [(i64, i64)]) {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].0, std::cmp::Reverse(spans[i].1)));
    let mut stack: Vec<i64> = Vec::new();
    for i in order {
        let (s, e) = spans[i];
        while stack.last().is_some_and(|&top| top <= s) {
            stack.pop();
        }
        let e = match stack.last() {
            Some(&top) => e.min(top),
            None => e,
        };
        spans[i].1 = e.max(s);
        stack.push(spans[i].1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nest_clamp_cuts_partial_overlaps() {
        let mut v = vec![(0, 100), (10, 120), (20, 30), (100, 150)];
        nest_clamp(&mut v);
        assert_eq!(v, vec![(0, 100), (10, 100), (20, 30), (100, 150)]);
    }

    #[test]
    fn nest_clamp_keeps_valid_nesting() {
        let mut v = vec![(5, 9), (0, 10), (0, 3), (10, 12)];
        let before = v.clone();
        nest_clamp(&mut v);
        assert_eq!(v, before);
    }
}
