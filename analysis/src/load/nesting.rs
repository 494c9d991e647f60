//! The walk over each track's spans in time order: depth, parent and self time by a
//! stack, and the step of every span by a moving pointer into the track's step intervals.
//! Writers emit a track's spans as they start (Kineto) or as they end (dflash), so the
//! rows are grouped per track in whichever of those orders they already have.

use chrome_trace_format::{Clock, SpanKind};

use super::raw::NO_STEP;
use crate::warning::Warning;

/// Tolerance for nesting checks: timestamps carry 3 decimals (ns), rounding may shift an
/// end by one ns.
const EPS_US: f64 = 1.5e-3;

/// `parent` of a span without one.
pub(crate) const NO_ROW: u32 = u32::MAX;

/// A step interval: (start, end, N).
type StepSpan = (f64, f64, i64);

/// What the nesting walk finds: depth, parent ([`NO_ROW`] for none), self time, and the
/// step of every span ([`NO_STEP`] for none).
pub(crate) struct Nested {
    pub depth: Vec<u32>,
    pub parent: Vec<u32>,
    pub self_us: Vec<f64>,
    pub step: Vec<i64>,
}

/// 3. Steps: same-pid containment in ProfilerStep#N; GPU spans take `args.step`.
/// 4. Nesting by a stack walk over each track (depth, parent, children's time); then the
///    step of each span, by a pointer into the track's sorted step intervals.
#[allow(clippy::too_many_arguments)]
pub(crate) fn nest_and_step(
    order: &mut TrackOrder,
    span_track: &[u32],
    tracks: &[(i64, i64)],
    span_name: &[u32],
    span_ts: &[f64],
    span_dur: &[f64],
    // `args.step` as written; becomes the step column, in place.
    mut step: Vec<i64>,
    kind: &[SpanKind],
    clock: &[Clock],
    step_of_name: &[Option<i64>],
    warnings: &mut Vec<Warning>,
) -> Nested {
    let n = span_ts.len();
    // (pid, start, end, N), sorted; CPU-clock steps also form the global fallback list.
    let pid_of = |i: usize| tracks[span_track[i] as usize].0;
    let mut steps: Vec<(i64, f64, f64, i64)> = (0..n)
        .filter_map(|i| {
            step_of_name[span_name[i] as usize]
                .map(|s| (pid_of(i), span_ts[i], span_ts[i] + span_dur[i], s))
        })
        .collect();
    steps.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut global: Vec<StepSpan> = (0..n)
        .filter(|&i| kind[i] == SpanKind::Step && clock[i] == Clock::Cpu)
        .map(|i| {
            (
                span_ts[i],
                span_ts[i] + span_dur[i],
                step_of_name[span_name[i] as usize].unwrap_or(-1),
            )
        })
        .collect();
    global.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut by_pid: Vec<(i64, Vec<StepSpan>)> = Vec::new();
    for s in &steps {
        match by_pid.last_mut() {
            Some((p, v)) if *p == s.0 => v.push((s.1, s.2, s.3)),
            _ => by_pid.push((s.0, vec![(s.1, s.2, s.3)])),
        }
    }

    let mut nest = Nesting {
        depth: vec![0u32; n],
        parent: vec![NO_ROW; n],
        child_sum: vec![0f64; n],
        overlaps: 0,
        stack: Vec::new(),
    };
    for g in 0..order.groups.len() {
        let (from, to, mirrored) = order.groups[g];
        let rows = &mut order.rows[from..to];
        if !(mirrored && nest.walk(rows, true, span_ts, span_dur)) {
            if mirrored {
                // Out of spec for the mirrored walk: redo the track in start order.
                nest.reset(rows);
                sort_by_start(rows, span_ts, span_dur);
            }
            nest.walk(rows, false, span_ts, span_dur);
        }
    }
    for &(from, to, _) in &order.groups {
        let rows = &order.rows[from..to];
        let Some(&first) = rows.first() else { continue };
        let pid = pid_of(first as usize);
        let list: &[StepSpan] = match by_pid.binary_search_by(|p| p.0.cmp(&pid)) {
            Ok(j) => &by_pid[j].1,
            Err(_) => &global,
        };
        let mut k = 0usize;
        for &r in rows {
            let i = r as usize;
            let ts = span_ts[i];
            // The last interval starting at or before ts; ts moves little from span to span.
            while k > 0 && list[k].0 > ts + EPS_US {
                k -= 1;
            }
            while k + 1 < list.len() && list[k + 1].0 <= ts + EPS_US {
                k += 1;
            }
            let in_list = list
                .get(k)
                .filter(|s| s.0 <= ts + EPS_US && (ts < s.1 - EPS_US || ts <= s.0 + EPS_US))
                .map(|s| s.2);
            let found = if let Some(s) = step_of_name[span_name[i] as usize] {
                Some(s)
            } else if clock[i] == Clock::Gpu && step[i] != NO_STEP {
                Some(step[i])
            } else {
                in_list
            };
            step[i] = found.unwrap_or(NO_STEP);
        }
    }
    if nest.overlaps > 0 {
        warnings.push(Warning::Overlaps {
            count: nest.overlaps,
        });
    }
    if steps.is_empty() && n > 0 {
        warnings.push(Warning::NoSteps);
    }
    // Self time in place of the children's sum: one column less to allocate.
    let mut self_us = nest.child_sum;
    for (s, &d) in self_us.iter_mut().zip(span_dur) {
        *s = (d - *s).max(0.0);
    }
    Nested {
        depth: nest.depth,
        parent: nest.parent,
        self_us,
        step,
    }
}

/// Depth, parent and children's time of every span, filled one track at a time.
struct Nesting {
    depth: Vec<u32>,
    parent: Vec<u32>,
    child_sum: Vec<f64>,
    /// Partial overlaps met (out of spec; such a span is taken as a sibling).
    overlaps: u64,
    stack: Vec<(u32, f64)>,
}

impl Nesting {
    /// Walks one track's rows with a stack. In start order (ts, longest first) as Perfetto
    /// nests; or `mirrored`: by end descending (longest first), the order of a file
    /// written as spans end, read backwards, which is start order in mirrored time. A
    /// mirrored walk gives up at the first partial overlap (`false`), leaving the track to
    /// be reset and walked in start order, so that overlaps are judged one way only.
    fn walk(&mut self, rows: &[u32], mirrored: bool, ts: &[f64], dur: &[f64]) -> bool {
        self.stack.clear();
        for &r in rows {
            let i = r as usize;
            let (a, b) = if mirrored {
                (-(ts[i] + dur[i]), -ts[i])
            } else {
                (ts[i], ts[i] + dur[i])
            };
            while let Some(&(_, top_end)) = self.stack.last() {
                if top_end <= a + EPS_US {
                    self.stack.pop();
                } else if b <= top_end + EPS_US {
                    break;
                } else if mirrored {
                    return false;
                } else {
                    self.overlaps += 1;
                    self.stack.pop();
                }
            }
            if let Some(&(p, _)) = self.stack.last() {
                self.parent[i] = p;
                self.depth[i] = self.stack.len() as u32;
                self.child_sum[p as usize] += dur[i];
            }
            self.stack.push((r, b));
        }
        true
    }

    fn reset(&mut self, rows: &[u32]) {
        for &r in rows {
            let i = r as usize;
            self.parent[i] = NO_ROW;
            self.depth[i] = 0;
            self.child_sum[i] = 0.0;
        }
    }
}

/// Span rows grouped by track: `rows[from..to]` for each of `groups` (in track id order),
/// with whether that group runs in mirrored order (see [`Nesting::walk`]).
pub(crate) struct TrackOrder {
    rows: Vec<u32>,
    groups: Vec<(usize, usize, bool)>,
}

/// Groups the rows by track with a counting pass. Writers emit a track's spans as they
/// start (Kineto) or as they end (dflash), so a group is usually in start order already,
/// or in end order and then walked backwards; only a group in neither order is sorted.
pub(crate) fn track_order(track: &[u32], ts: &[f64], dur: &[f64], tracks: usize) -> TrackOrder {
    let mut start = vec![0usize; tracks + 1];
    for &t in track {
        start[t as usize + 1] += 1;
    }
    for i in 0..tracks {
        start[i + 1] += start[i];
    }
    let mut rows = vec![0u32; track.len()];
    let mut next = start.clone();
    for (row, &t) in track.iter().enumerate() {
        let slot = &mut next[t as usize];
        rows[*slot] = row as u32;
        *slot += 1;
    }
    let by_start = |a: u32, b: u32| start_order(ts, dur, a, b);
    // Ascending end, shortest first among equal ends: reversed, that is start order in
    // mirrored time.
    let by_end = |a: u32, b: u32| {
        let (a, b) = (a as usize, b as usize);
        (ts[a] + dur[a])
            .total_cmp(&(ts[b] + dur[b]))
            .then(dur[a].total_cmp(&dur[b]))
    };
    let sorted = |g: &[u32], cmp: &dyn Fn(u32, u32) -> std::cmp::Ordering| {
        g.windows(2)
            .all(|p| cmp(p[0], p[1]) != std::cmp::Ordering::Greater)
    };
    let mut groups = Vec::with_capacity(tracks);
    for w in start.windows(2) {
        let group = &mut rows[w[0]..w[1]];
        let mirrored = if sorted(group, &by_start) {
            false
        } else if sorted(group, &by_end) {
            group.reverse();
            true
        } else {
            sort_by_start(group, ts, dur);
            false
        };
        groups.push((w[0], w[1], mirrored));
    }
    TrackOrder { rows, groups }
}

/// Start order, as Perfetto nests: by ts, the longest first among equal starts.
fn start_order(ts: &[f64], dur: &[f64], a: u32, b: u32) -> std::cmp::Ordering {
    let (a, b) = (a as usize, b as usize);
    ts[a].total_cmp(&ts[b]).then(dur[b].total_cmp(&dur[a]))
}

/// Sorts rows into [`start_order`]; stable, and fast on runs already in order.
fn sort_by_start(rows: &mut [u32], ts: &[f64], dur: &[f64]) {
    rows.sort_by(|&a, &b| start_order(ts, dur, a, b));
}
