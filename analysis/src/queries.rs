//! The polars queries of the analyzer, in one place because the polars API moves between
//! releases. Each returns a `LazyFrame` (collected once by its caller) or reads a small
//! result frame into plain vectors.

use chrome_trace_format::{dflash, Clock, SpanKind};
use polars::prelude::*;

/// `kind == k` (kinds are an Enum column). The Enum columns are compared with the text
/// as they are: polars looks the text up once and compares codes, where a cast to
/// `String` would build a string column of every span (a fifth of a large breakdown).
pub fn kind_is(k: SpanKind) -> Expr {
    col("kind").eq(lit(k.as_str()))
}

pub fn clock_is(c: Clock) -> Expr {
    col("clock").eq(lit(c.as_str()))
}

pub fn name_is(n: &str) -> Expr {
    col("name").eq(lit(n))
}

/// Spans that are sections: CPU or GPU timed annotations and queue operations.
/// (`ProfilerStep#N` spans, also GPU-side ones in Kineto traces, have kind `step`.)
pub fn is_section() -> Expr {
    kind_is(SpanKind::Cpu)
        .or(kind_is(SpanKind::Gpu))
        .or(kind_is(SpanKind::Queue))
}

/// The CPU-side `ProfilerStep#N` spans.
pub fn is_cpu_step() -> Expr {
    kind_is(SpanKind::Step).and(clock_is(Clock::Cpu))
}

/// `num / den`, null when `den` is zero.
fn ratio(num: Expr, den: Expr) -> Expr {
    when(den.clone().eq(lit(0.0)))
        .then(lit(NULL).cast(DataType::Float64))
        .otherwise(num / den)
}

fn non_negative(e: Expr) -> Expr {
    when(e.clone().lt(lit(0.0))).then(lit(0.0)).otherwise(e)
}

/// Quantile `q` of a group: linear interpolation between order statistics, the method
/// of [`stats::quantile_sorted`](crate::stats::quantile_sorted) (a test there checks that
/// both give the same numbers).
pub fn p(e: Expr, q: f64) -> Expr {
    e.quantile(lit(q), QuantileMethod::Linear)
}

/// Total duration of the CPU `ProfilerStep#N` spans.
pub fn step_total(spans: &DataFrame) -> PolarsResult<f64> {
    let df = spans
        .clone()
        .lazy()
        .filter(is_cpu_step())
        .select([col("dur").sum().alias("t")])
        .collect()?;
    Ok(f64s(&df, "t")?.first().copied().flatten().unwrap_or(0.0))
}

/// Operators near the top of their thread (depth 2 or less: under a step, a compiled
/// region and its compiled function; or autograd's evaluate_function and its node): what
/// a trace without user annotations is broken down by.
pub fn is_outer_op() -> Expr {
    kind_is(SpanKind::Op).and(col("depth").lt_eq(lit(2u32)))
}

/// Per (name, clock): count, total, mean, p50, p95, self time, share of step time.
pub fn sections(spans: LazyFrame, step_total: f64) -> LazyFrame {
    sections_where(spans, step_total, is_section(), false)
}

/// [`sections`] of the spans that `which` selects; `operator` marks the rows as
/// operators rather than user sections.
pub fn sections_where(spans: LazyFrame, step_total: f64, which: Expr, operator: bool) -> LazyFrame {
    spans
        .filter(which)
        .group_by([
            col("name").cast(DataType::String).alias("name"),
            col("clock").cast(DataType::String).alias("kind"),
        ])
        .agg([
            len().cast(DataType::Int64).alias("count"),
            col("dur").sum().alias("total_us"),
            col("dur").mean().alias("mean_us"),
            p(col("dur"), 0.5).alias("p50_us"),
            p(col("dur"), 0.95).alias("p95_us"),
            col("self_us").sum().alias("self_us"),
            col("dur")
                .filter(col("step").is_not_null())
                .sum()
                .alias("in_step_us"),
            col("top_level").any(true).alias("top_level"),
            col("step")
                .drop_nulls()
                .n_unique()
                .cast(DataType::Int64)
                .alias("steps"),
        ])
        .with_columns([
            ratio(col("in_step_us"), lit(step_total)).alias("share"),
            lit(operator).alias("operator"),
        ])
        .sort(
            ["total_us", "name", "kind"],
            SortMultipleOptions::default().with_order_descending_multi([true, false, false]),
        )
}

/// Sections timed on both clocks, from the output of [`sections`].
pub fn cpu_vs_gpu(sections: LazyFrame) -> LazyFrame {
    let side = |clock: Clock, out: &str| {
        sections
            .clone()
            .filter(col("kind").eq(lit(clock.as_str())))
            .select([col("name"), col("total_us").alias(out)])
    };
    side(Clock::Cpu, "cpu_total_us")
        .join(
            side(Clock::Gpu, "gpu_total_us"),
            [col("name")],
            [col("name")],
            JoinArgs::new(JoinType::Inner),
        )
        .with_columns([
            (col("cpu_total_us") - col("gpu_total_us")).alias("gap_us"),
            ratio(col("cpu_total_us"), col("gpu_total_us")).alias("cpu_over_gpu"),
        ])
        .sort(
            ["gap_us", "name"],
            SortMultipleOptions::default().with_order_descending_multi([true, false]),
        )
}

/// Per step: GPU busy time as the union of GPU intervals (kernels when the trace has
/// them, else outermost GPU sections), merged with a running maximum of end times.
fn gpu_busy(spans: LazyFrame, has_kernels: bool) -> PolarsResult<LazyFrame> {
    let basis = if has_kernels {
        kind_is(SpanKind::Kernel)
    } else {
        kind_is(SpanKind::Gpu).and(col("top_level"))
    };
    let start =
        polars::lazy::dsl::max_horizontal([col("ts"), col("prev_end").fill_null(col("ts"))])?;
    Ok(spans
        .filter(basis.and(col("step").is_not_null()))
        .select([
            col("step"),
            col("ts"),
            (col("ts") + col("dur")).alias("end"),
        ])
        .sort(["step", "ts"], SortMultipleOptions::default())
        .with_column(
            col("end")
                .cum_max(false)
                .shift(lit(1))
                .over([col("step")])?
                .alias("prev_end"),
        )
        .with_column(non_negative(col("end") - start).alias("busy"))
        .group_by([col("step")])
        .agg([col("busy").sum().alias("gpu_busy_us")]))
}

pub fn has_kind(spans: &DataFrame, kind: SpanKind) -> PolarsResult<bool> {
    let df = spans
        .clone()
        .lazy()
        .select([kind_is(kind).any(true).alias("any")])
        .collect()?;
    Ok(df.column("any")?.bool()?.get(0).unwrap_or(false))
}

/// One row per step: duration, queue wait, GPU busy and idle time, tokens, loss, tokens/s.
pub fn per_step(spans: &DataFrame) -> PolarsResult<LazyFrame> {
    let lf = spans.clone().lazy();
    let has_gpu = has_kind(spans, SpanKind::Gpu)? || has_kind(spans, SpanKind::Kernel)?;
    let left = || JoinArgs::new(JoinType::Left);
    let steps = lf
        .clone()
        .filter(is_cpu_step().and(col("step").is_not_null()))
        .group_by([col("step")])
        .agg([col("dur").sum().alias("dur_us")]);
    let waits = lf
        .clone()
        .filter(name_is(dflash::QUEUE_GET).and(col("wait_us").is_not_null()))
        .group_by([col("step")])
        .agg([col("wait_us").sum().alias("queue_wait_us")]);
    let drafter = lf
        .clone()
        .filter(
            name_is(dflash::DRAFTER_STEP)
                .and(clock_is(Clock::Cpu))
                .and(col("tokens").is_not_null()),
        )
        .group_by([col("step")])
        .agg([
            col("tokens").cast(DataType::Float64).sum().alias("tokens"),
            col("loss").mean().alias("loss"),
        ]);
    let mut out = steps
        .join(waits, [col("step")], [col("step")], left())
        .join(drafter, [col("step")], [col("step")], left());
    if has_gpu {
        let busy = gpu_busy(lf, has_kind(spans, SpanKind::Kernel)?)?;
        out = out
            .join(busy, [col("step")], [col("step")], left())
            .with_column(non_negative(col("dur_us") - col("gpu_busy_us")).alias("gpu_idle_us"));
    } else {
        out = out.with_columns([
            lit(NULL).cast(DataType::Float64).alias("gpu_busy_us"),
            lit(NULL).cast(DataType::Float64).alias("gpu_idle_us"),
        ]);
    }
    Ok(out
        .with_column(ratio(col("tokens"), col("dur_us") / lit(1e6)).alias("tokens_per_s"))
        .sort(["step"], SortMultipleOptions::default()))
}

/// Totals over the per-step table.
pub fn step_summary(per_step: LazyFrame) -> LazyFrame {
    per_step.select([
        len().cast(DataType::Int64).alias("count"),
        col("dur_us").sum().alias("total_us"),
        col("dur_us").mean().alias("mean_us"),
        p(col("dur_us"), 0.5).alias("p50_us"),
        p(col("dur_us"), 0.95).alias("p95_us"),
        ratio(
            col("tokens").sum(),
            col("dur_us").filter(col("tokens").is_not_null()).sum() / lit(1e6),
        )
        .alias("tokens_per_s"),
        ratio(
            col("gpu_idle_us").sum(),
            col("dur_us").filter(col("gpu_idle_us").is_not_null()).sum(),
        )
        .alias("gpu_idle_share"),
    ])
}

/// Waits of `queue.put` and `queue.get`.
pub fn queue_sides(spans: LazyFrame, step_total: f64) -> LazyFrame {
    spans
        .filter(kind_is(SpanKind::Queue).and(col("wait_us").is_not_null()))
        .group_by([col("name").cast(DataType::String).alias("name")])
        .agg([
            len().cast(DataType::Int64).alias("count"),
            col("wait_us").sum().alias("wait_total_us"),
            col("wait_us").mean().alias("wait_mean_us"),
            p(col("wait_us"), 0.5).alias("wait_p50_us"),
            p(col("wait_us"), 0.95).alias("wait_p95_us"),
            col("wait_us")
                .filter(col("step").is_not_null())
                .sum()
                .alias("wait_in_step_us"),
        ])
        .with_column(ratio(col("wait_in_step_us"), lit(step_total)).alias("share"))
        .sort(["name"], SortMultipleOptions::default())
}

/// The samples of the `queue` depth counter.
fn is_queue_depth() -> Expr {
    col("name")
        .eq(lit(dflash::QUEUE_COUNTER))
        .and(col("key").eq(lit(dflash::QUEUE_DEPTH)))
}

/// The `queue` depth counter over time: its samples in `ts` order.
pub fn queue_depth_series(counters: LazyFrame) -> LazyFrame {
    counters
        .filter(is_queue_depth())
        .sort(["ts"], SortMultipleOptions::default())
}

/// The `queue` depth counter's distribution.
pub fn queue_depth(counters: LazyFrame) -> LazyFrame {
    let v = || col("value");
    counters.filter(is_queue_depth()).select([
        len().cast(DataType::Int64).alias("samples"),
        v().mean().alias("mean"),
        v().min().alias("min"),
        v().max().alias("max"),
        v().eq(lit(0.0))
            .cast(DataType::Float64)
            .mean()
            .alias("empty_share"),
        v().eq(v().max())
            .cast(DataType::Float64)
            .mean()
            .alias("full_share"),
    ])
}

/// Per step and (name, clock): the summed duration; the samples of `compare`.
pub fn per_step_sections(spans: LazyFrame) -> LazyFrame {
    spans
        .filter(is_section().and(col("step").is_not_null()))
        .group_by([
            col("name").cast(DataType::String).alias("name"),
            col("clock").cast(DataType::String).alias("kind"),
            col("step"),
        ])
        .agg([col("dur").sum().alias("dur_us")])
        .sort(["name", "kind", "step"], SortMultipleOptions::default())
}

/// Top-level sections inside step spans (on the step's own track), per step: the stacked
/// plot, whose bars then add up to the step time.
pub fn top_level_per_step(spans: LazyFrame, clock: Clock) -> LazyFrame {
    spans
        .filter(
            is_section()
                .and(col("top_level"))
                .and(col("parent").is_not_null())
                .and(clock_is(clock))
                .and(col("step").is_not_null()),
        )
        .group_by([
            col("name").cast(DataType::String).alias("name"),
            col("step"),
        ])
        .agg([col("dur").sum().alias("dur_us")])
        .sort(["step", "name"], SortMultipleOptions::default())
}

/// A column as `f64`s; non-finite values become `None`.
pub fn f64s(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<f64>>> {
    let c = df.column(name)?.cast(&DataType::Float64)?;
    Ok(c.f64()?
        .iter()
        .map(|v| v.filter(|x| x.is_finite()))
        .collect())
}

pub fn i64s(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<i64>>> {
    let c = df.column(name)?.cast(&DataType::Int64)?;
    Ok(c.i64()?.iter().collect())
}

pub fn strs(df: &DataFrame, name: &str) -> PolarsResult<Vec<String>> {
    let c = df.column(name)?.cast(&DataType::String)?;
    Ok(c.str()?
        .iter()
        .map(|v| v.unwrap_or("").to_string())
        .collect())
}

pub fn bools(df: &DataFrame, name: &str) -> PolarsResult<Vec<bool>> {
    Ok(df
        .column(name)?
        .bool()?
        .iter()
        .map(|v| v.unwrap_or(false))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{quantile, SplitMix64};

    /// Quantiles of a group and of a slice are one method: polars' linear interpolation
    /// gives what `stats::quantile` gives.
    #[test]
    fn group_quantiles_match_the_slice_quantile() {
        let mut rng = SplitMix64::new(3);
        for n in [1usize, 2, 7, 101] {
            let v: Vec<f64> = (0..n).map(|_| 100.0 * rng.normal()).collect();
            let df = df!["x" => &v].unwrap();
            for q in [0.0, 0.05, 0.5, 0.95, 1.0] {
                let got = df
                    .clone()
                    .lazy()
                    .select([p(col("x"), q).alias("p")])
                    .collect()
                    .unwrap();
                let got = f64s(&got, "p").unwrap()[0].unwrap();
                let want = quantile(&v, q).unwrap();
                assert!(
                    (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                    "n {n} q {q}: {got} vs {want}"
                );
            }
        }
    }
}
