//! Turns the raw columns into polars frames: span kinds and clocks, nesting (depth,
//! parent, self time), and the step of every span.
//!
//! Nesting and step lookup walk sorted index arrays before any frame exists: a stack walk
//! and a binary search are not expressible as column expressions, and doing them here
//! keeps the frames immutable afterwards.

use polars::prelude::*;

use super::raw::{ArgKey, Raw, NO_SPAN};
use crate::warning::Warning;

/// What a span is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A section timed on the CPU (ours: `cat:"cpu"`; Kineto: `user_annotation`).
    Cpu,
    /// A section timed on the GPU (ours: `cat:"gpu"`; Kineto: `gpu_user_annotation`).
    Gpu,
    /// `queue.put` / `queue.get`.
    Queue,
    /// `ProfilerStep#N`.
    Step,
    /// A GPU kernel, memcpy or memset (Kineto).
    Kernel,
    /// An operator (Kineto `cpu_op`).
    Op,
    /// A CUDA runtime or driver call (Kineto).
    Runtime,
    Other,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Cpu,
        Kind::Gpu,
        Kind::Queue,
        Kind::Step,
        Kind::Kernel,
        Kind::Op,
        Kind::Runtime,
        Kind::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::Gpu => "gpu",
            Kind::Queue => "queue",
            Kind::Step => "step",
            Kind::Kernel => "kernel",
            Kind::Op => "op",
            Kind::Runtime => "runtime",
            Kind::Other => "other",
        }
    }

    fn of_cat(cat: &str) -> Kind {
        match cat {
            "cpu" | "user_annotation" => Kind::Cpu,
            "gpu" | "gpu_user_annotation" => Kind::Gpu,
            "queue" => Kind::Queue,
            "step" => Kind::Step,
            "kernel" | "gpu_memcpy" | "gpu_memset" => Kind::Kernel,
            "cpu_op" => Kind::Op,
            "cuda_runtime" | "cuda_driver" => Kind::Runtime,
            _ => Kind::Other,
        }
    }

    /// The clock a span of this kind was timed on.
    pub fn clock(self) -> Clock {
        match self {
            Kind::Gpu | Kind::Kernel => Clock::Gpu,
            _ => Clock::Cpu,
        }
    }
}

/// Which clock timed a span: the section's `kind` in breakdown and compare output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    Cpu,
    Gpu,
}

impl Clock {
    pub fn as_str(self) -> &'static str {
        match self {
            Clock::Cpu => "cpu",
            Clock::Gpu => "gpu",
        }
    }
}

/// Spans that only envelop the sections of a step; their children are top-level.
pub const ENVELOPES: &[&str] = &["drafter.step"];

/// The columns of the spans frame, in order, with what they hold.
pub const SPAN_COLUMNS: &[(&str, &str)] = &[
    ("run", "run label (directory name or file stem)"),
    ("pid", "process id; the device index for GPU tracks"),
    ("tid", "thread id; the stream for GPU tracks"),
    ("track", "thread name (unique per pid/tid)"),
    ("name", "span name"),
    ("cat", "category as written"),
    (
        "kind",
        "cpu | gpu | queue | step | kernel | op | runtime | other",
    ),
    ("clock", "cpu | gpu: the clock that timed the span"),
    ("ts", "start, us from the trace base"),
    ("dur", "inclusive duration, us"),
    (
        "self_us",
        "duration minus the children on the same track, us",
    ),
    (
        "step",
        "step number (ProfilerStep#N containing it, or args.step on GPU spans)",
    ),
    ("depth", "nesting depth on its track, 0 = outermost"),
    ("parent", "row index of the enclosing span on the track"),
    (
        "top_level",
        "parent is a step, an envelope (drafter.step), or none",
    ),
    ("wait_us", "args.wait_us (queue spans)"),
    ("queue_depth", "args.depth (queue spans)"),
    ("tokens", "args.tokens (drafter.step)"),
    ("loss", "args.loss (drafter.step)"),
    ("batch", "args.batch"),
    (
        "cpu_ts",
        "args.cpu_ts (GPU spans: ts of the launching CPU span)",
    ),
    ("arg_step", "args.step as written"),
];

pub(crate) struct Built {
    pub spans: DataFrame,
    pub counters: DataFrame,
    pub flows: DataFrame,
    pub threads: DataFrame,
}

/// Tolerance for nesting checks: timestamps carry 3 decimals (ns), rounding may shift an
/// end by one ns.
const EPS_US: f64 = 1.5e-3;

const NO_ROW: u32 = u32::MAX;

/// A step interval: (start, end, N).
type StepSpan = (f64, f64, i64);

/// `ProfilerStep#12` -> 12.
fn step_number(name: &str) -> Option<i64> {
    name.strip_prefix("ProfilerStep#")?.parse().ok()
}

fn enum_dtype(labels: &[&str]) -> PolarsResult<DataType> {
    Ok(DataType::from_frozen_categories(FrozenCategories::new(
        labels.iter().copied(),
    )?))
}

/// An Enum column from codes into `labels`; a plain string column when two labels decode
/// to the same text (an Enum needs unique categories).
fn enum_column(name: &str, codes: Vec<u32>, labels: &[&str]) -> PolarsResult<Column> {
    let Ok(dtype) = enum_dtype(labels) else {
        return Ok(StringChunked::from_iter_values(
            name.into(),
            codes.iter().map(|&c| labels[c as usize]),
        )
        .into_column());
    };
    let phys = DataType::from(dtype.cat_physical()?);
    let codes = UInt32Chunked::from_vec(name.into(), codes)
        .into_series()
        .cast(&phys)?;
    Ok(Series::from_cats_and_dtype(&codes, &dtype, true)?.into_column())
}

fn opt_f64(name: &str, values: Vec<f64>, valid: Vec<bool>) -> Column {
    let validity = polars_arrow::bitmap::Bitmap::from_iter(valid);
    Float64Chunked::from_vec_validity(name.into(), values, Some(validity)).into_column()
}

/// The flow columns of a [`Raw`], taken out to be built on their own thread.
struct FlowCols {
    id: Vec<u64>,
    dir: Vec<u8>,
    pid: Vec<i64>,
    tid: Vec<i64>,
    ts: Vec<f64>,
    span: Vec<u32>,
}

fn flows_frame(f: FlowCols) -> PolarsResult<DataFrame> {
    DataFrame::new(
        f.ts.len(),
        vec![
            UInt64Chunked::from_vec("id".into(), f.id).into_column(),
            StringChunked::from_iter_values(
                "dir".into(),
                f.dir.iter().map(|&d| if d == 0 { "out" } else { "in" }),
            )
            .into_column(),
            Int64Chunked::from_vec("pid".into(), f.pid).into_column(),
            Int64Chunked::from_vec("tid".into(), f.tid).into_column(),
            Float64Chunked::from_vec("ts".into(), f.ts).into_column(),
            {
                let validity =
                    polars_arrow::bitmap::Bitmap::from_iter(f.span.iter().map(|&s| s != NO_SPAN));
                let rows: Vec<i64> = f.span.iter().map(|&s| s as i64).collect();
                Int64Chunked::from_vec_validity("span".into(), rows, Some(validity)).into_column()
            },
        ],
    )
}

pub(crate) fn build(mut raw: Raw, run: &str, warnings: &mut Vec<Warning>) -> PolarsResult<Built> {
    use std::mem::take;
    let flows = FlowCols {
        id: take(&mut raw.flow_id),
        dir: take(&mut raw.flow_dir),
        pid: take(&mut raw.flow_pid),
        tid: take(&mut raw.flow_tid),
        ts: take(&mut raw.flow_ts),
        span: take(&mut raw.flow_span),
    };
    // The flows table needs nothing from the spans: build it on a second core meanwhile.
    std::thread::scope(|scope| {
        let handle = scope.spawn(move || flows_frame(flows));
        let mut built = build_spans(raw, run, warnings)?;
        built.flows = handle
            .join()
            .map_err(|_| PolarsError::ComputeError("building the flows table failed".into()))??;
        Ok(built)
    })
}

fn build_spans(mut raw: Raw, run: &str, warnings: &mut Vec<Warning>) -> PolarsResult<Built> {
    let n = raw.span_ts.len();
    raw.finish();
    let mut arg_cols: Vec<(ArgKey, Vec<f64>, Vec<bool>)> = ArgKey::ALL
        .iter()
        .zip(std::mem::take(&mut raw.span_args))
        .filter_map(|(&key, c)| c.map(|c| (key, c.values, c.valid)))
        .collect();
    let strings: Vec<&str> = raw.strings.strings.iter().map(String::as_str).collect();

    // 1. Kind per span from its cat, `step` for ProfilerStep#N names.
    let kind_of_cat: Vec<Kind> = strings.iter().map(|s| Kind::of_cat(s)).collect();
    let step_of_name: Vec<Option<i64>> = strings.iter().map(|s| step_number(s)).collect();
    // The clock comes from the category: a GPU-side ProfilerStep is a step on the GPU clock.
    let clock: Vec<Clock> = raw
        .span_cat
        .iter()
        .map(|&c| kind_of_cat[c as usize].clock())
        .collect();
    let kind: Vec<Kind> = (0..n)
        .map(|i| {
            if step_of_name[raw.span_name[i] as usize].is_some() {
                Kind::Step
            } else {
                kind_of_cat[raw.span_cat[i] as usize]
            }
        })
        .collect();

    // 2. Order each track by (ts, longest first), as Perfetto nests.
    let order = track_order(
        &raw.span_track,
        &raw.span_ts,
        &raw.span_dur,
        raw.tracks.len(),
    );

    // 3. Steps: same-pid containment in ProfilerStep#N; GPU spans take args.step.
    let arg_step = arg_cols.iter().find(|c| c.0 == ArgKey::Step);

    // (pid, start, end, N), sorted; CPU-clock steps also form the global fallback list.
    let pid_of = |i: usize| raw.tracks[raw.span_track[i] as usize].0;
    let mut steps: Vec<(i64, f64, f64, i64)> = (0..n)
        .filter_map(|i| {
            step_of_name[raw.span_name[i] as usize].map(|s| {
                (
                    pid_of(i),
                    raw.span_ts[i],
                    raw.span_ts[i] + raw.span_dur[i],
                    s,
                )
            })
        })
        .collect();
    steps.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut global: Vec<(f64, f64, i64)> = (0..n)
        .filter(|&i| kind[i] == Kind::Step && clock[i] == Clock::Cpu)
        .map(|i| {
            (
                raw.span_ts[i],
                raw.span_ts[i] + raw.span_dur[i],
                step_of_name[raw.span_name[i] as usize].unwrap_or(-1),
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
    // 4. One walk over each track in time order: nesting by a stack (depth, parent,
    //    children's time), and the step by a pointer into the sorted step intervals.
    let mut depth = vec![0u32; n];
    let mut parent = vec![NO_ROW; n];
    let mut child_sum = vec![0f64; n];
    let mut step: Vec<i64> = vec![0; n];
    let mut step_valid: Vec<bool> = vec![false; n];
    let mut overlaps = 0u64;
    let mut stack: Vec<(u32, f64)> = Vec::new();
    let mut cur_track = u32::MAX;
    let mut list: &[(f64, f64, i64)] = &[];
    let mut k = 0usize;
    for &r in &order {
        let i = r as usize;
        if raw.span_track[i] != cur_track {
            cur_track = raw.span_track[i];
            stack.clear();
            let pid = raw.tracks[cur_track as usize].0;
            list = match by_pid.binary_search_by(|p| p.0.cmp(&pid)) {
                Ok(j) => &by_pid[j].1,
                Err(_) => &global,
            };
            k = 0;
        }
        let (ts, end) = (raw.span_ts[i], raw.span_ts[i] + raw.span_dur[i]);
        while let Some(&(_, top_end)) = stack.last() {
            if top_end <= ts + EPS_US {
                stack.pop();
            } else if end <= top_end + EPS_US {
                break;
            } else {
                // Partial overlap: out of spec; treat as a sibling.
                overlaps += 1;
                stack.pop();
            }
        }
        if let Some(&(p, _)) = stack.last() {
            parent[i] = p;
            depth[i] = stack.len() as u32;
            child_sum[p as usize] += raw.span_dur[i];
        }
        stack.push((r, end));

        // The last interval starting at or before ts (ts only grows along a track).
        while k + 1 < list.len() && list[k + 1].0 <= ts + EPS_US {
            k += 1;
        }
        let in_list = list
            .get(k)
            .filter(|s| s.0 <= ts + EPS_US && (ts < s.1 - EPS_US || ts <= s.0 + EPS_US))
            .map(|s| s.2);
        let found = if let Some(s) = step_of_name[raw.span_name[i] as usize] {
            Some(s)
        } else if let (Clock::Gpu, Some(c)) = (clock[i], arg_step) {
            c.2[i].then_some(c.1[i] as i64).or(in_list)
        } else {
            in_list
        };
        if let Some(s) = found {
            step[i] = s;
            step_valid[i] = true;
        }
    }
    drop(order);
    if overlaps > 0 {
        warnings.push(Warning::Overlaps { count: overlaps });
    }
    if steps.is_empty() && n > 0 {
        warnings.push(Warning::NoSteps);
    }

    // 5. Top level: parent is none, a step, or an envelope.
    let envelope_ids: Vec<u32> = ENVELOPES
        .iter()
        .filter_map(|e| raw.strings.get(e))
        .collect();
    let top_level: Vec<bool> = (0..n)
        .map(|i| {
            if envelope_ids.contains(&raw.span_name[i]) || kind[i] == Kind::Step {
                return false;
            }
            let p = parent[i];
            p == NO_ROW
                || kind[p as usize] == Kind::Step
                || envelope_ids.contains(&raw.span_name[p as usize])
        })
        .collect();
    // Self time in place of the children's sum: one column less to allocate.
    let mut self_us = child_sum;
    for (s, &d) in self_us.iter_mut().zip(&raw.span_dur) {
        *s = (d - *s).max(0.0);
    }

    // 6. Track labels: the thread name, made unique with its pid when two tracks share it.
    let track_labels = track_labels(&raw);
    let label_refs: Vec<&str> = track_labels.iter().map(|t| t.2.as_str()).collect();

    let kind_labels: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    let kind_code = |k: Kind| Kind::ALL.iter().position(|x| *x == k).unwrap_or(0) as u32;
    let clock_code: Vec<u32> = clock
        .iter()
        .map(|k| match k {
            Clock::Cpu => 0,
            Clock::Gpu => 1,
        })
        .collect();
    let kind_codes: Vec<u32> = kind.iter().map(|&k| kind_code(k)).collect();
    drop(kind);

    let pids: Vec<i64> = raw
        .span_track
        .iter()
        .map(|&t| raw.tracks[t as usize].0)
        .collect();
    let tids: Vec<i64> = raw
        .span_track
        .iter()
        .map(|&t| raw.tracks[t as usize].1)
        .collect();
    let (parent_vals, parent_valid): (Vec<i64>, Vec<bool>) = parent
        .iter()
        .map(|&p| {
            if p == NO_ROW {
                (0, false)
            } else {
                (p as i64, true)
            }
        })
        .unzip();
    drop(parent);

    let mut cols: Vec<Column> = vec![
        Column::new_scalar("run".into(), Scalar::from(PlSmallStr::from(run)), n),
        Int64Chunked::from_vec("pid".into(), pids).into_column(),
        Int64Chunked::from_vec("tid".into(), tids).into_column(),
        enum_column("track", raw.span_track, &label_refs)?,
        enum_column("name", raw.span_name, &strings)?,
        enum_column("cat", raw.span_cat, &strings)?,
        enum_column("kind", kind_codes, &kind_labels)?,
        enum_column("clock", clock_code, &["cpu", "gpu"])?,
        Float64Chunked::from_vec("ts".into(), raw.span_ts).into_column(),
        Float64Chunked::from_vec("dur".into(), raw.span_dur).into_column(),
        Float64Chunked::from_vec("self_us".into(), self_us).into_column(),
        {
            let validity = polars_arrow::bitmap::Bitmap::from_iter(step_valid);
            Int64Chunked::from_vec_validity("step".into(), step, Some(validity)).into_column()
        },
        UInt32Chunked::from_vec("depth".into(), depth).into_column(),
        {
            let validity = polars_arrow::bitmap::Bitmap::from_iter(parent_valid);
            Int64Chunked::from_vec_validity("parent".into(), parent_vals, Some(validity))
                .into_column()
        },
        BooleanChunked::from_slice("top_level".into(), &top_level).into_column(),
    ];
    // Args: every column exists (all null when the trace has none), so queries need not
    // check the schema.
    for key in ArgKey::ALL {
        match arg_cols.iter().position(|c| c.0 == key) {
            Some(k) => {
                let (_, v, ok) = arg_cols.swap_remove(k);
                cols.push(opt_f64(key.column(), v, ok));
            }
            None => cols.push(Column::full_null(
                key.column().into(),
                n,
                &DataType::Float64,
            )),
        }
    }
    let spans = DataFrame::new(n, cols)?;

    let counters = DataFrame::new(
        raw.ctr_ts.len(),
        vec![
            Int64Chunked::from_vec("pid".into(), raw.ctr_pid).into_column(),
            StringChunked::from_iter_values(
                "name".into(),
                raw.ctr_name.iter().map(|&i| strings[i as usize]),
            )
            .into_column(),
            StringChunked::from_iter_values(
                "key".into(),
                raw.ctr_key.iter().map(|&i| strings[i as usize]),
            )
            .into_column(),
            Float64Chunked::from_vec("ts".into(), raw.ctr_ts).into_column(),
            Float64Chunked::from_vec("value".into(), raw.ctr_value).into_column(),
        ],
    )?;

    let flows = DataFrame::empty();

    let threads = DataFrame::new(
        track_labels.len(),
        vec![
            Int64Chunked::from_iter_values("pid".into(), track_labels.iter().map(|t| t.0))
                .into_column(),
            Int64Chunked::from_iter_values("tid".into(), track_labels.iter().map(|t| t.1))
                .into_column(),
            StringChunked::from_iter_values(
                "process".into(),
                track_labels.iter().map(|t| t.3.as_str()),
            )
            .into_column(),
            StringChunked::from_iter_values(
                "track".into(),
                track_labels.iter().map(|t| t.2.as_str()),
            )
            .into_column(),
        ],
    )?;

    Ok(Built {
        spans,
        counters,
        flows,
        threads,
    })
}

/// Span rows grouped by track (in track id order), each track by (ts, longest first).
///
/// A counting pass groups the rows; most tracks are already in time order in the file
/// (writers emit spans as they end or start), so each group is only sorted when it is not.
fn track_order(track: &[u32], ts: &[f64], dur: &[f64], tracks: usize) -> Vec<u32> {
    let mut start = vec![0usize; tracks + 1];
    for &t in track {
        start[t as usize + 1] += 1;
    }
    for i in 0..tracks {
        start[i + 1] += start[i];
    }
    let mut order = vec![0u32; track.len()];
    let mut next = start.clone();
    for (row, &t) in track.iter().enumerate() {
        let slot = &mut next[t as usize];
        order[*slot] = row as u32;
        *slot += 1;
    }
    let before = |a: u32, b: u32| {
        let (a, b) = (a as usize, b as usize);
        ts[a].total_cmp(&ts[b]).then(dur[b].total_cmp(&dur[a]))
    };
    for w in start.windows(2) {
        let group = &mut order[w[0]..w[1]];
        if group
            .windows(2)
            .any(|p| before(p[0], p[1]) == std::cmp::Ordering::Greater)
        {
            // Stable and fast on runs that are already in order.
            group.sort_by(|&a, &b| before(a, b));
        }
    }
    order
}

/// (pid, tid, unique label, process name) per track id.
fn track_labels(raw: &Raw) -> Vec<(i64, i64, String, String)> {
    let base: Vec<(i64, i64, String, String)> = raw
        .tracks
        .iter()
        .map(|&(pid, tid)| {
            let process = raw
                .process_names
                .get(&pid)
                .cloned()
                .or_else(|| raw.string_id_label(pid).map(str::to_string))
                .unwrap_or_else(|| format!("pid {pid}"));
            let thread = raw
                .thread_names
                .get(&(pid, tid))
                .cloned()
                .or_else(|| raw.string_id_label(tid).map(str::to_string))
                .unwrap_or_else(|| format!("{pid}/{tid}"));
            (pid, tid, thread, process)
        })
        .collect();
    let mut out = Vec::with_capacity(base.len());
    let mut seen = std::collections::HashSet::new();
    for (pid, tid, label, process) in base.iter().cloned() {
        let dup = base.iter().filter(|b| b.2 == label).count() > 1;
        let mut l = if dup {
            format!("{label} ({process})")
        } else {
            label
        };
        while !seen.insert(l.clone()) {
            l = format!("{l} [{pid}/{tid}]");
        }
        out.push((pid, tid, l, process));
    }
    out
}
