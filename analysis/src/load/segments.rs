//! Joins the trace files of a run directory (`trace.json`, then one `trace.N.json` per
//! `--resume --trace`) into one trace on the clock of the first.
//!
//! Each segment was written by its own process, with `ts` counted from that process's
//! time zero; `baseTimeNanoseconds` says when that was (Unix ns). A later segment moves by
//! the difference of the two base times; one without a base time (or after a first
//! segment without one) is placed just after the segments before it. The trainer's pid is
//! the OS pid, so a resumed trainer has a new one: a later segment's process joins an
//! earlier process of the same name, and its threads the earlier threads of the same
//! names, so a track stays one track across segments. Flow ids restart in every process
//! and are moved past the earlier segments'. A step traced in two segments (the run was
//! killed after its last checkpoint, and the steps since are run again) counts once,
//! from its later copy: the earlier copy's rows are listed in [`Superseded`] and lose
//! their step when the frames are built. The columns are then joined by [`Raw::concat`],
//! as the parts of one file are.

use std::collections::BTreeSet;
use std::ops::Range;

use chrome_trace_format::header::top::BASE_TIME_NS;
use chrome_trace_format::limits::{MAX_FLOW_ID, MAX_ID};
use chrome_trace_format::names::parse_step;
use rustc_hash::{FxHashMap, FxHashSet};

use super::raw::{Raw, NO_STEP};
use crate::warning::Warning;

/// One segment as scanned: its file name (for messages), its columns, its base time.
pub(super) struct Segment {
    pub file: String,
    pub raw: Raw,
    /// `baseTimeNanoseconds`, when the file has a usable one.
    pub base_ns: Option<i128>,
}

/// Rows of an earlier segment whose steps a later segment traced again.
pub(crate) struct Superseded {
    pub rows: Range<usize>,
    /// Ascending.
    pub steps: Vec<i64>,
}

impl Superseded {
    /// Clears the step of every listed row whose step was traced again later.
    pub fn unstep(list: &[Superseded], step: &mut [i64]) {
        for s in list {
            for v in &mut step[s.rows.clone()] {
                if *v != NO_STEP && s.steps.binary_search(v).is_ok() {
                    *v = NO_STEP;
                }
            }
        }
    }
}

/// The segments joined.
pub(super) struct Joined {
    pub raw: Raw,
    pub superseded: Vec<Superseded>,
    pub warnings: Vec<Warning>,
}

/// Tolerance when comparing segment edges: timestamps carry 3 decimals (ns).
const EPS_US: f64 = 1.5e-3;

/// `baseTimeNanoseconds` of a file's top-level keys.
pub(super) fn base_ns(top: &serde_json::Map<String, serde_json::Value>) -> Option<i128> {
    let v = top.get(BASE_TIME_NS)?;
    v.as_u64()
        .map(i128::from)
        .or_else(|| v.as_i64().map(i128::from))
        .or_else(|| v.as_f64().filter(|f| f.is_finite()).map(|f| f as i128))
}

/// Joins the segments, in segment order, onto the clock and the ids of the first.
pub(super) fn join(mut segments: Vec<Segment>) -> Joined {
    let mut warnings = Vec::new();
    let Some(first) = segments.first() else {
        return Joined {
            raw: Raw::default(),
            superseded: Vec::new(),
            warnings,
        };
    };
    let reference = first.base_ns;
    let mut names = Names::default();
    names.absorb(&first.raw);
    let mut end = extent(&first.raw).map(|e| (e.1, 0usize));
    let mut next_flow = next_flow_id(&first.raw);
    let mut overlaps: Vec<(usize, usize, f64)> = Vec::new();
    for k in 1..segments.len() {
        let ext = extent(&segments[k].raw);
        let shift = match (reference, segments[k].base_ns) {
            (Some(r), Some(b)) => (b - r) as f64 / 1e3,
            _ => {
                let shift = match (ext, end) {
                    (Some((from, _)), Some((to, _))) => to - from,
                    _ => 0.0,
                };
                let missing = if reference.is_none() { 0 } else { k };
                warnings.push(Warning::SegmentPlaced {
                    file: segments[k].file.clone(),
                    missing: segments[missing].file.clone(),
                    at_us: ext.map_or(0.0, |e| e.0 + shift),
                });
                shift
            }
        };
        let seg = &mut segments[k];
        shift_ts(&mut seg.raw, shift);
        if let (Some((from, to)), Some((prev_end, prev))) = (ext, end) {
            if from + shift < prev_end - EPS_US {
                overlaps.push((k, prev, prev_end - (from + shift)));
            }
            if to + shift > prev_end {
                end = Some((to + shift, k));
            }
        } else if let Some((_, to)) = ext {
            end = Some((to + shift, k));
        }
        names.align(&mut seg.raw);
        next_flow = move_flows(&mut seg.raw, next_flow);
        names.absorb(&seg.raw);
    }
    if let Some(&(k, prev, overlap_us)) = overlaps.first() {
        warnings.push(Warning::SegmentsOverlap {
            file: segments[k].file.clone(),
            previous: segments[prev].file.clone(),
            overlap_us,
            count: overlaps.len(),
        });
    }
    let superseded = repeated_steps(&segments, &mut warnings);
    Joined {
        raw: Raw::concat(segments.into_iter().map(|s| s.raw).collect()),
        superseded,
        warnings,
    }
}

/// The first start and the last end of a segment's events (spans, counters, flows).
fn extent(raw: &Raw) -> Option<(f64, f64)> {
    let starts = raw.span_ts.iter().chain(&raw.ctr_ts).chain(&raw.flow_ts);
    let from = starts.copied().reduce(f64::min)?;
    let ends = raw
        .span_ts
        .iter()
        .zip(&raw.span_dur)
        .map(|(t, d)| t + d)
        .chain(raw.ctr_ts.iter().chain(&raw.flow_ts).copied());
    let to = ends.reduce(f64::max)?;
    Some((from, to))
}

fn shift_ts(raw: &mut Raw, shift_us: f64) {
    if shift_us == 0.0 {
        return;
    }
    for ts in [&mut raw.span_ts, &mut raw.ctr_ts, &mut raw.flow_ts] {
        for t in ts.iter_mut() {
            *t += shift_us;
        }
    }
}

/// One past the largest numeric flow id of `raw` (string ids live above [`MAX_FLOW_ID`]).
fn next_flow_id(raw: &Raw) -> u64 {
    raw.flow_id
        .iter()
        .filter(|&&f| f < MAX_FLOW_ID)
        .max()
        .map_or(0, |m| m + 1)
}

/// Moves the numeric flow ids of a later segment past the earlier segments' (each process
/// counts its own from the start); returns one past the largest after the move.
fn move_flows(raw: &mut Raw, from: u64) -> u64 {
    let next = next_flow_id(raw);
    if next == 0 {
        return from;
    }
    for f in raw.flow_id.iter_mut().filter(|f| **f < MAX_FLOW_ID) {
        *f += from;
    }
    from + next
}

/// The `ProfilerStep#N` numbers a segment names.
fn step_numbers(raw: &Raw) -> BTreeSet<i64> {
    raw.strings
        .strings
        .iter()
        .filter_map(|s| parse_step(s))
        .collect()
}

/// For each segment, the steps a later segment traces again, with one warning per
/// segment that has any.
fn repeated_steps(segments: &[Segment], warnings: &mut Vec<Warning>) -> Vec<Superseded> {
    let sets: Vec<BTreeSet<i64>> = segments.iter().map(|s| step_numbers(&s.raw)).collect();
    let mut out = Vec::new();
    let mut row = 0usize;
    for (j, seg) in segments.iter().enumerate() {
        let rows = row..row + seg.raw.span_ts.len();
        row = rows.end;
        let mut again = BTreeSet::new();
        let mut later = None;
        for (k, set) in sets.iter().enumerate().skip(j + 1) {
            let before = again.len();
            again.extend(sets[j].intersection(set).copied());
            if later.is_none() && again.len() > before {
                later = Some(k);
            }
        }
        let (Some(k), Some(&first), Some(&last)) = (later, again.first(), again.last()) else {
            continue;
        };
        warnings.push(Warning::RepeatedSteps {
            file: seg.file.clone(),
            later: segments[k].file.clone(),
            steps: again.len(),
            first,
            last,
        });
        out.push(Superseded {
            rows,
            steps: again.into_iter().collect(),
        });
    }
    out
}

/// The names of the numeric processes and threads of the segments joined so far.
#[derive(Default)]
struct Names {
    process: FxHashMap<i64, String>,
    thread: FxHashMap<(i64, i64), String>,
}

fn numeric(id: i64) -> bool {
    id < MAX_ID as i64
}

impl Names {
    fn absorb(&mut self, raw: &Raw) {
        for (&pid, name) in &raw.process_names {
            if numeric(pid) {
                self.process.entry(pid).or_insert_with(|| name.clone());
            }
        }
        for (&(pid, tid), name) in &raw.thread_names {
            if numeric(pid) && numeric(tid) {
                self.thread
                    .entry((pid, tid))
                    .or_insert_with(|| name.clone());
            }
        }
    }

    /// The only earlier process named `name` that `taken` does not rule out.
    fn process_named(&self, name: &str, taken: &FxHashSet<i64>) -> Option<i64> {
        let mut found = self
            .process
            .iter()
            .filter(|(p, n)| *n == name && !taken.contains(p))
            .map(|(&p, _)| p);
        let p = found.next()?;
        found.next().is_none().then_some(p)
    }

    /// The only earlier thread of `pid` named `name`.
    fn thread_named(&self, pid: i64, name: &str) -> Option<i64> {
        let mut found = self
            .thread
            .iter()
            .filter(|((p, _), n)| *p == pid && *n == name)
            .map(|(&(_, t), _)| t);
        let t = found.next()?;
        found.next().is_none().then_some(t)
    }

    /// Renames a later segment's processes and threads onto earlier ones of the same
    /// names. A process keeps its pid when an earlier segment knows that pid by the same
    /// name; otherwise it takes the pid of the one earlier process of its name that this
    /// segment does not use itself, if there is one. Threads of a moved process take the
    /// tid of the one earlier thread of their name in it.
    fn align(&self, raw: &mut Raw) {
        let mut used: FxHashSet<i64> = raw.tracks.iter().map(|t| t.0).collect();
        used.extend(raw.process_names.keys().copied());
        let mut own: Vec<(i64, &String)> = raw
            .process_names
            .iter()
            .filter(|(&p, _)| numeric(p))
            .map(|(&p, n)| (p, n))
            .collect();
        own.sort();
        let mut pids: FxHashMap<i64, i64> = FxHashMap::default();
        let mut taken = used.clone();
        for (p, name) in own {
            if self.process.get(&p) == Some(name) {
                continue;
            }
            if let Some(q) = self.process_named(name, &taken) {
                taken.insert(q);
                pids.insert(p, q);
            }
        }
        if pids.is_empty() {
            return;
        }
        let mut own_threads: Vec<((i64, i64), &String)> = raw
            .thread_names
            .iter()
            .filter(|((p, t), _)| pids.contains_key(p) && numeric(*t))
            .map(|(&k, n)| (k, n))
            .collect();
        own_threads.sort();
        let mut tids: FxHashMap<(i64, i64), i64> = FxHashMap::default();
        let mut taken: FxHashSet<(i64, i64)> = FxHashSet::default();
        for ((p, t), name) in own_threads {
            let q = pids[&p];
            if let Some(u) = self.thread_named(q, name) {
                if taken.insert((q, u)) {
                    tids.insert((p, t), u);
                }
            }
        }
        let pid = |p: i64| pids.get(&p).copied().unwrap_or(p);
        let track = |(p, t): (i64, i64)| (pid(p), tids.get(&(p, t)).copied().unwrap_or(t));
        for tr in &mut raw.tracks {
            *tr = track(*tr);
        }
        for p in &mut raw.ctr_pid {
            *p = pid(*p);
        }
        for (p, t) in raw.flow_pid.iter_mut().zip(&mut raw.flow_tid) {
            (*p, *t) = track((*p, *t));
        }
        raw.process_names = std::mem::take(&mut raw.process_names)
            .into_iter()
            .map(|(p, n)| (pid(p), n))
            .collect();
        raw.thread_names = std::mem::take(&mut raw.thread_names)
            .into_iter()
            .map(|(k, n)| (track(k), n))
            .collect();
    }
}
