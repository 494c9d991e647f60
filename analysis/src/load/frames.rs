//! Turns the raw columns into polars frames: span kinds and clocks, nesting (depth,
//! parent, self time), and the step of every span.
//!
//! Nesting and step lookup walk each track's rows in time order before any frame exists:
//! a stack walk and a moving pointer into step intervals are not expressible as column
//! expressions, and doing them here keeps the frames immutable afterwards. Columns that do
//! not depend on the walk are built on a second core meanwhile.

use polars::prelude::*;

use super::raw::{ArgColumn, ArgKey, Raw, NO_SPAN, NO_STEP};
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
    ("run", "run label (directory name or file stem); String"),
    ("pid", "process id; the device index for GPU tracks; Int64"),
    ("tid", "thread id; the stream for GPU tracks; Int64"),
    ("track", "thread name (unique per pid/tid); Enum"),
    ("name", "span name; Enum"),
    ("cat", "category as written; Enum"),
    (
        "kind",
        "cpu | gpu | queue | step | kernel | op | runtime | other; Enum",
    ),
    ("clock", "cpu | gpu: the clock that timed the span; Enum"),
    ("ts", "start, us from the trace base; Float64"),
    ("dur", "inclusive duration, us; Float64"),
    (
        "self_us",
        "duration minus the children on the same track, us; Float64",
    ),
    (
        "step",
        "step number (ProfilerStep#N containing it, or args.step on GPU spans); Int64",
    ),
    ("depth", "nesting depth on its track, 0 = outermost; UInt32"),
    (
        "parent",
        "row index of the enclosing span on the track; UInt32",
    ),
    (
        "top_level",
        "parent is a step, an envelope (drafter.step), or none; Boolean",
    ),
    ("wait_us", "args.wait_us (queue spans); Float64"),
    ("queue_depth", "args.depth (queue spans); Float32"),
    ("tokens", "args.tokens (drafter.step); Float32"),
    ("loss", "args.loss (drafter.step); Float64"),
    ("batch", "args.batch; Float32"),
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

/// An Enum column from codes (an unsigned integer series) into `labels`; a plain string
/// column when two labels decode to the same text (an Enum needs unique categories).
fn enum_column(name: &str, codes: Series, labels: &[&str]) -> PolarsResult<Column> {
    enum_column_with(name, codes, labels, enum_dtype(labels))
}

/// [`enum_column`] with the Enum type of `labels` made beforehand (or the error making it
/// gave): a type of many labels takes a while to build.
fn enum_column_with(
    name: &str,
    codes: Series,
    labels: &[&str],
    dtype: PolarsResult<DataType>,
) -> PolarsResult<Column> {
    let codes = codes.with_name(name.into());
    let in_range = codes
        .max::<u64>()?
        .is_none_or(|m| (m as usize) < labels.len());
    polars_ensure!(in_range, ComputeError: "`{name}`: a code past the {} labels", labels.len());
    let Ok(dtype) = dtype else {
        let codes = codes.cast(&DataType::UInt32)?;
        return Ok(StringChunked::from_iter_values(
            name.into(),
            codes.u32()?.into_no_null_iter().map(|c| labels[c as usize]),
        )
        .into_column());
    };
    let phys = dtype.cat_physical()?;
    let codes = codes.cast(&DataType::from(phys))?;
    // The checked constructor looks every code up in the mapping; codes here are indices
    // into `labels`, whose categories are numbered in order, and were range-checked above.
    macro_rules! build {
        ($t:ty) => {{
            let ca: &ChunkedArray<<$t as PolarsCategoricalType>::PolarsPhysical> =
                codes.as_ref().as_ref();
            // SAFETY: every code is below labels.len(), the number of categories.
            unsafe { CategoricalChunked::<$t>::from_cats_and_dtype_unchecked(ca.clone(), dtype) }
                .into_column()
        }};
    }
    Ok(match phys {
        CategoricalPhysical::U8 => build!(Categorical8Type),
        CategoricalPhysical::U16 => build!(Categorical16Type),
        CategoricalPhysical::U32 => build!(Categorical32Type),
    })
}

/// The `cat` column: an Enum of the categories in use only (a handful, so `u8` codes),
/// not of every interned string (one per `ProfilerStep#N` name, among others).
fn cat_column(span_cat: Vec<u32>, strings: &[&str]) -> PolarsResult<Column> {
    let mut code = vec![u32::MAX; strings.len()];
    let mut labels: Vec<&str> = Vec::new();
    let mut cats = span_cat;
    for c in cats.iter_mut() {
        let k = &mut code[*c as usize];
        if *k == u32::MAX {
            *k = labels.len() as u32;
            labels.push(strings[*c as usize]);
        }
        *c = *k;
    }
    if labels.len() <= 256 {
        let small: Vec<u8> = cats.iter().map(|&c| c as u8).collect();
        drop(cats);
        return enum_column("cat", u8_codes(small), &labels);
    }
    enum_column("cat", u32_codes(cats), &labels)
}

fn u32_codes(codes: Vec<u32>) -> Series {
    UInt32Chunked::from_vec(PlSmallStr::EMPTY, codes).into_series()
}

fn u8_codes(codes: Vec<u8>) -> Series {
    UInt8Chunked::from_vec(PlSmallStr::EMPTY, codes).into_series()
}

/// A nullable column from one arg's sparse rows: dense values, null where absent. Counts
/// are `Float32` (exact below 2^24), times and the loss `Float64`.
fn arg_column(key: ArgKey, arg: ArgColumn, n: usize) -> Column {
    fn dense<T: polars::prelude::PolarsNumericType>(
        name: &str,
        arg: &ArgColumn,
        n: usize,
        conv: impl Fn(f64) -> T::Native,
    ) -> Column {
        let mut values = vec![T::Native::default(); n];
        let mut valid = polars_arrow::bitmap::MutableBitmap::from_len_zeroed(n);
        for (&r, &v) in arg.rows.iter().zip(&arg.values) {
            values[r as usize] = conv(v);
            valid.set(r as usize, true);
        }
        ChunkedArray::<T>::from_vec_validity(name.into(), values, Some(valid.into())).into_column()
    }
    let name = key.column();
    let float32 = key.is_count();
    if arg.rows.is_empty() {
        let dtype = if float32 {
            DataType::Float32
        } else {
            DataType::Float64
        };
        return Column::full_null(name.into(), n, &dtype);
    }
    if float32 {
        dense::<Float32Type>(name, &arg, n, |v| v as f32)
    } else {
        dense::<Float64Type>(name, &arg, n, |v| v)
    }
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
            enum_column("dir", u8_codes(f.dir), &["out", "in"])?,
            Int64Chunked::from_vec("pid".into(), f.pid).into_column(),
            Int64Chunked::from_vec("tid".into(), f.tid).into_column(),
            Float64Chunked::from_vec("ts".into(), f.ts).into_column(),
            {
                let validity =
                    polars_arrow::bitmap::Bitmap::from_iter(f.span.iter().map(|&s| s != NO_SPAN));
                UInt32Chunked::from_vec_validity("span".into(), f.span, Some(validity))
                    .into_column()
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

fn build_spans(raw: Raw, run: &str, warnings: &mut Vec<Warning>) -> PolarsResult<Built> {
    let n = raw.span_ts.len();
    // Track labels: the thread name, made unique with its pid when two tracks share it.
    let track_labels = track_labels(&raw);
    let label_refs: Vec<&str> = track_labels.iter().map(|t| t.2.as_str()).collect();
    let Raw {
        strings: interned,
        tracks,
        span_track,
        span_name,
        span_cat,
        span_ts,
        span_dur,
        span_step,
        span_args,
        ctr_pid,
        ctr_name,
        ctr_key,
        ctr_ts,
        ctr_value,
        ..
    } = raw;
    let strings: Vec<&str> = interned.strings.iter().map(String::as_str).collect();

    // 1. Kind per span from its cat, `step` for ProfilerStep#N names.
    let kind_of_cat: Vec<Kind> = strings.iter().map(|s| Kind::of_cat(s)).collect();
    let step_of_name: Vec<Option<i64>> = strings.iter().map(|s| step_number(s)).collect();
    // The clock comes from the category: a GPU-side ProfilerStep is a step on the GPU clock.
    let clock: Vec<Clock> = span_cat
        .iter()
        .map(|&c| kind_of_cat[c as usize].clock())
        .collect();
    let kind: Vec<Kind> = (0..n)
        .map(|i| {
            if step_of_name[span_name[i] as usize].is_some() {
                Kind::Step
            } else {
                kind_of_cat[span_cat[i] as usize]
            }
        })
        .collect();

    // 2. Group the rows by track, each track in an order the nesting walk can take.
    let mut order = track_order(&span_track, &span_ts, &span_dur, tracks.len());

    // The columns that need nothing from the nesting walk are built on a second core
    // meanwhile.
    let (side, nested) = std::thread::scope(|scope| {
        let side = scope.spawn(|| {
            side_columns(
                &span_track,
                &tracks,
                &kind,
                &clock,
                span_args,
                CounterCols {
                    pid: ctr_pid,
                    name: ctr_name,
                    key: ctr_key,
                    ts: ctr_ts,
                    value: ctr_value,
                },
                &strings,
            )
        });
        let nested = nest_and_step(
            &mut order,
            &span_track,
            &tracks,
            &span_name,
            &span_ts,
            &span_dur,
            span_step,
            &kind,
            &clock,
            &step_of_name,
            warnings,
        );
        let side = side
            .join()
            .map_err(|_| PolarsError::ComputeError("building the span tables failed".into()));
        (side, nested)
    });
    let side = side??;
    drop(order);
    let Nested {
        depth,
        parent,
        self_us,
        step,
    } = nested;

    // 5. Top level: parent is none, a step, or an envelope.
    let envelope_ids: Vec<u32> = ENVELOPES.iter().filter_map(|e| interned.get(e)).collect();
    let top_level = BooleanChunked::from_iter_values(
        "top_level".into(),
        (0..n).map(|i| {
            if envelope_ids.contains(&span_name[i]) || kind[i] == Kind::Step {
                return false;
            }
            let p = parent[i];
            p == NO_ROW
                || kind[p as usize] == Kind::Step
                || envelope_ids.contains(&span_name[p as usize])
        }),
    );
    drop(kind);
    drop(clock);
    let parent_valid = polars_arrow::bitmap::Bitmap::from_iter(parent.iter().map(|&p| p != NO_ROW));
    let step_valid = polars_arrow::bitmap::Bitmap::from_iter(step.iter().map(|&s| s != NO_STEP));

    let [kind_col, clock_col] = side.codes;
    let mut cols: Vec<Column> = vec![
        Column::new_scalar("run".into(), Scalar::from(PlSmallStr::from(run)), n),
        side.pid,
        side.tid,
        enum_column("track", u32_codes(span_track), &label_refs)?,
        enum_column_with("name", u32_codes(span_name), &strings, side.name_dtype)?,
        cat_column(span_cat, &strings)?,
        kind_col,
        clock_col,
        Float64Chunked::from_vec("ts".into(), span_ts).into_column(),
        Float64Chunked::from_vec("dur".into(), span_dur).into_column(),
        Float64Chunked::from_vec("self_us".into(), self_us).into_column(),
        Int64Chunked::from_vec_validity("step".into(), step, Some(step_valid)).into_column(),
        UInt32Chunked::from_vec("depth".into(), depth).into_column(),
        UInt32Chunked::from_vec_validity("parent".into(), parent, Some(parent_valid)).into_column(),
        top_level.into_column(),
    ];
    cols.extend(side.args);
    let spans = DataFrame::new(n, cols)?;

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
        counters: side.counters,
        flows: DataFrame::empty(),
        threads,
    })
}

/// The counter columns of a [`Raw`].
struct CounterCols {
    pid: Vec<i64>,
    name: Vec<u32>,
    key: Vec<u32>,
    ts: Vec<f64>,
    value: Vec<f64>,
}

/// Span columns that need nothing from the nesting walk, and the counters table.
struct Side {
    pid: Column,
    tid: Column,
    /// `kind`, `clock`.
    codes: [Column; 2],
    /// The Enum type of the `name` column (every interned string is a label).
    name_dtype: PolarsResult<DataType>,
    args: Vec<Column>,
    counters: DataFrame,
}

fn side_columns(
    span_track: &[u32],
    tracks: &[(i64, i64)],
    kind: &[Kind],
    clock: &[Clock],
    args: [ArgColumn; 5],
    ctr: CounterCols,
    strings: &[&str],
) -> PolarsResult<Side> {
    let n = span_track.len();
    let pid = Int64Chunked::from_iter_values(
        "pid".into(),
        span_track.iter().map(|&t| tracks[t as usize].0),
    )
    .into_column();
    let tid = Int64Chunked::from_iter_values(
        "tid".into(),
        span_track.iter().map(|&t| tracks[t as usize].1),
    )
    .into_column();
    let kind_labels: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    let kind_code = |k: Kind| Kind::ALL.iter().position(|x| *x == k).unwrap_or(0) as u8;
    let kind_col = enum_column(
        "kind",
        u8_codes(kind.iter().map(|&k| kind_code(k)).collect()),
        &kind_labels,
    )?;
    let clock_col = enum_column(
        "clock",
        u8_codes(clock.iter().map(|&c| (c == Clock::Gpu) as u8).collect()),
        &["cpu", "gpu"],
    )?;
    // Args: every column exists (all null when the trace has none), so queries need not
    // check the schema.
    let args = ArgKey::ALL
        .into_iter()
        .zip(args)
        .map(|(key, arg)| arg_column(key, arg, n))
        .collect();
    let counters = DataFrame::new(
        ctr.ts.len(),
        vec![
            Int64Chunked::from_vec("pid".into(), ctr.pid).into_column(),
            StringChunked::from_iter_values(
                "name".into(),
                ctr.name.iter().map(|&i| strings[i as usize]),
            )
            .into_column(),
            StringChunked::from_iter_values(
                "key".into(),
                ctr.key.iter().map(|&i| strings[i as usize]),
            )
            .into_column(),
            Float64Chunked::from_vec("ts".into(), ctr.ts).into_column(),
            Float64Chunked::from_vec("value".into(), ctr.value).into_column(),
        ],
    )?;
    Ok(Side {
        pid,
        tid,
        codes: [kind_col, clock_col],
        name_dtype: enum_dtype(strings),
        args,
        counters,
    })
}

/// What the nesting walk finds: depth, parent ([`NO_ROW`] for none), self time, and the
/// step of every span ([`NO_STEP`] for none).
struct Nested {
    depth: Vec<u32>,
    parent: Vec<u32>,
    self_us: Vec<f64>,
    step: Vec<i64>,
}

/// 3. Steps: same-pid containment in ProfilerStep#N; GPU spans take `args.step`.
/// 4. Nesting by a stack walk over each track (depth, parent, children's time); then the
///    step of each span, by a pointer into the track's sorted step intervals.
#[allow(clippy::too_many_arguments)]
fn nest_and_step(
    order: &mut TrackOrder,
    span_track: &[u32],
    tracks: &[(i64, i64)],
    span_name: &[u32],
    span_ts: &[f64],
    span_dur: &[f64],
    // `args.step` as written; becomes the step column, in place.
    mut step: Vec<i64>,
    kind: &[Kind],
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
        .filter(|&i| kind[i] == Kind::Step && clock[i] == Clock::Cpu)
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
struct TrackOrder {
    rows: Vec<u32>,
    groups: Vec<(usize, usize, bool)>,
}

/// Groups the rows by track with a counting pass. Writers emit a track's spans as they
/// start (Kineto) or as they end (dflash), so a group is usually in start order already,
/// or in end order and then walked backwards; only a group in neither order is sorted.
fn track_order(track: &[u32], ts: &[f64], dur: &[f64], tracks: usize) -> TrackOrder {
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
