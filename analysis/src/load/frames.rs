//! Turns the raw columns into polars frames: span kinds and clocks, nesting (depth,
//! parent, self time), and the step of every span.
//!
//! Nesting and step lookup walk each track's rows in time order before any frame exists:
//! a stack walk and a moving pointer into step intervals are not expressible as column
//! expressions, and doing them here keeps the frames immutable afterwards. Columns that do
//! not depend on the walk are built on a second core meanwhile.

use chrome_trace_format::dflash::ENVELOPES;
use chrome_trace_format::names::parse_step;
use chrome_trace_format::{Clock, FlowDir, SpanKind};
use polars::prelude::*;

use super::nesting::{nest_and_step, track_order, Nested, NO_ROW};
use super::raw::{ArgColumn, ArgKey, Raw, NO_SPAN, NO_STEP};
use super::segments::Superseded;
use crate::warning::Warning;

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
    (
        "correlation",
        "args.correlation: links a kernel to the call that launched it (Kineto); Float64",
    ),
];

pub(crate) struct Built {
    pub spans: DataFrame,
    pub counters: DataFrame,
    pub flows: DataFrame,
    pub threads: DataFrame,
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
            enum_column("dir", u8_codes(f.dir), &FlowDir::ALL.map(FlowDir::as_str))?,
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

/// The frames of `raw`; the rows in `superseded` lose the steps listed there (a step a
/// later segment of the run traced again).
pub(crate) fn build(
    mut raw: Raw,
    superseded: &[Superseded],
    run: &str,
    warnings: &mut Vec<Warning>,
) -> PolarsResult<Built> {
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
    let (flows, built) = rayon::join(
        move || flows_frame(flows),
        || build_spans(raw, superseded, run, warnings),
    );
    let mut built = built?;
    built.flows = flows?;
    Ok(built)
}

fn build_spans(
    raw: Raw,
    superseded: &[Superseded],
    run: &str,
    warnings: &mut Vec<Warning>,
) -> PolarsResult<Built> {
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
    let step_of_name: Vec<Option<i64>> = strings.iter().map(|s| parse_step(s)).collect();
    let (kind, clock) = kinds(&strings, &span_cat, &span_name, &step_of_name);

    // 2. Group the rows by track, each track in an order the nesting walk can take.
    let mut order = track_order(&span_track, &span_ts, &span_dur, tracks.len());

    // The columns that need nothing from the nesting walk are built on a second core
    // meanwhile.
    let (side, nested) = rayon::join(
        || {
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
        },
        || {
            nest_and_step(
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
            )
        },
    );
    let side = side?;
    drop(order);
    let Nested {
        depth,
        parent,
        self_us,
        mut step,
    } = nested;
    Superseded::unstep(superseded, &mut step);

    // 5. Top level: parent is none, a step, or an envelope.
    let envelope_ids: Vec<u32> = ENVELOPES.iter().filter_map(|e| interned.get(e)).collect();
    let top_level = top_level(&kind, &parent, &span_name, &envelope_ids);
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

    Ok(Built {
        spans,
        counters: side.counters,
        flows: DataFrame::empty(),
        threads: threads_frame(&track_labels)?,
    })
}

/// The kind and the clock of every span: the kind from its `cat` (Kineto's categories
/// mapped onto ours), `step` for `ProfilerStep#N` names; the clock from the category, so
/// a GPU-side ProfilerStep is a step on the GPU clock.
fn kinds(
    strings: &[&str],
    span_cat: &[u32],
    span_name: &[u32],
    step_of_name: &[Option<i64>],
) -> (Vec<SpanKind>, Vec<Clock>) {
    let kind_of_cat: Vec<SpanKind> = strings.iter().map(|s| SpanKind::of_cat(s)).collect();
    let clock = span_cat
        .iter()
        .map(|&c| kind_of_cat[c as usize].clock())
        .collect();
    let kind = span_cat
        .iter()
        .zip(span_name)
        .map(|(&c, &name)| {
            if step_of_name[name as usize].is_some() {
                SpanKind::Step
            } else {
                kind_of_cat[c as usize]
            }
        })
        .collect();
    (kind, clock)
}

/// Whether each span is top-level: not a step or an envelope itself, and its parent is
/// none, a step, or an envelope (`drafter.step`).
fn top_level(
    kind: &[SpanKind],
    parent: &[u32],
    span_name: &[u32],
    envelope_ids: &[u32],
) -> BooleanChunked {
    BooleanChunked::from_iter_values(
        "top_level".into(),
        (0..kind.len()).map(|i| {
            if envelope_ids.contains(&span_name[i]) || kind[i] == SpanKind::Step {
                return false;
            }
            let p = parent[i];
            p == NO_ROW
                || kind[p as usize] == SpanKind::Step
                || envelope_ids.contains(&span_name[p as usize])
        }),
    )
}

/// `pid, tid, process, track` of every track that has spans.
fn threads_frame(track_labels: &[(i64, i64, String, String)]) -> PolarsResult<DataFrame> {
    DataFrame::new(
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
    )
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
    kind: &[SpanKind],
    clock: &[Clock],
    args: [ArgColumn; ArgKey::ALL.len()],
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
    let kind_labels: Vec<&str> = SpanKind::ALL.iter().map(|k| k.as_str()).collect();
    let kind_code = |k: SpanKind| SpanKind::ALL.iter().position(|x| *x == k).unwrap_or(0) as u8;
    let kind_col = enum_column(
        "kind",
        u8_codes(kind.iter().map(|&k| kind_code(k)).collect()),
        &kind_labels,
    )?;
    let clock_labels: Vec<&str> = Clock::ALL.iter().map(|c| c.as_str()).collect();
    let clock_code = |c: Clock| Clock::ALL.iter().position(|x| *x == c).unwrap_or(0) as u8;
    let clock_col = enum_column(
        "clock",
        u8_codes(clock.iter().map(|&c| clock_code(c)).collect()),
        &clock_labels,
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
