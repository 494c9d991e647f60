//! Pictures of a run and of a comparison, each written as PNG and SVG.
//!
//! Text is drawn with DejaVu Sans embedded through `ab_glyph`, so no system font library
//! is needed. Every chart is a function over a generic drawing area, called once per
//! backend.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Context};
use plotters::coord::Shift;
use plotters::prelude::*;
use polars::prelude::*;

use crate::breakdown::Breakdown;
use crate::compare::{Comparison, Verdict};
use crate::load::Trace;
use crate::queries as q;

const FONT: &str = "sans-serif";
const W: u32 = 1400;
const H: u32 = 800;
/// Bars beyond this many steps would be thinner than a pixel: plot the last ones.
const MAX_STEPS_PLOTTED: usize = 200;
/// Sections named in bar charts; the rest are summed into "(other)" or left out.
const MAX_SECTIONS: usize = 16;

/// Tableau 20, a palette made for telling categories apart.
const PALETTE: [(u8, u8, u8); 20] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (174, 199, 232),
    (255, 187, 120),
    (152, 223, 138),
    (255, 152, 150),
    (197, 176, 213),
    (196, 156, 148),
    (247, 182, 210),
    (199, 199, 199),
    (219, 219, 141),
    (158, 218, 229),
];

fn color(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

fn fonts() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| "the embedded regular font is invalid".to_string())?;
        plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold())
            .map_err(|_| "the embedded bold font is invalid".to_string())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing: {e:?}")
}

type Area<'a, DB> = DrawingArea<DB, Shift>;

fn title_style() -> TextStyle<'static> {
    (FONT, 28).into_font().style(FontStyle::Bold).into()
}

fn label_font() -> FontDesc<'static> {
    (FONT, 18).into_font()
}

/// Per step, the top-level CPU sections (ms), plus "(other)" for the rest of the step.
pub struct Stacked {
    steps: Vec<i64>,
    names: Vec<String>,
    /// values[name][step index]
    values: Vec<Vec<f64>>,
}

fn stacked(trace: &Trace, b: &Breakdown) -> PolarsResult<Stacked> {
    let df = q::top_level_per_step(trace.spans.clone().lazy(), "cpu").collect()?;
    let (name, step, dur) = (
        q::strs(&df, "name")?,
        q::i64s(&df, "step")?,
        q::f64s(&df, "dur_us")?,
    );
    let mut steps: Vec<i64> = b.per_step.iter().map(|r| r.step).collect();
    if steps.len() > MAX_STEPS_PLOTTED {
        steps = steps.split_off(steps.len() - MAX_STEPS_PLOTTED);
    }
    // Order sections by their share; keep the largest, fold the rest into "(other)".
    let present: std::collections::BTreeSet<&str> = name.iter().map(String::as_str).collect();
    let mut order: Vec<(&str, f64)> = b
        .sections
        .iter()
        .filter(|s| s.top_level && s.kind == "cpu" && present.contains(s.name.as_str()))
        .map(|s| (s.name.as_str(), s.total_us))
        .collect();
    order.sort_by(|x, y| y.1.total_cmp(&x.1));
    let mut names: Vec<String> = order
        .iter()
        .take(MAX_SECTIONS - 1)
        .map(|s| s.0.to_string())
        .collect();
    names.push("(other)".into());
    let other = names.len() - 1;
    let pos: BTreeMap<i64, usize> = steps.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    let mut values = vec![vec![0.0; steps.len()]; names.len()];
    for ((n, s), d) in name.iter().zip(step).zip(dur) {
        let (Some(s), Some(d)) = (s, d) else { continue };
        let Some(&i) = pos.get(&s) else { continue };
        let k = names.iter().position(|x| x == n).unwrap_or(other);
        if k != other {
            values[k][i] += d / 1000.0;
        }
    }
    for r in &b.per_step {
        if let Some(&i) = pos.get(&r.step) {
            let named: f64 = values.iter().take(other).map(|v| v[i]).sum();
            values[other][i] = (r.dur_us / 1000.0 - named).max(0.0);
        }
    }
    Ok(Stacked {
        steps,
        names,
        values,
    })
}

fn chart_stacked<DB: DrawingBackend>(
    root: &Area<DB>,
    s: &Stacked,
    run: &str,
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally((W - 330) as i32);
    let n = s.steps.len();
    let max = (0..n)
        .map(|i| s.values.iter().map(|v| v[i]).sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-3);
    let mut chart = ChartBuilder::on(&left)
        .caption(
            format!("{run}: time per step by section (CPU, top level in the step)"),
            title_style(),
        )
        .margin(15)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..max * 1.05)
        .map_err(err)?;
    let steps = s.steps.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("step")
        .y_desc("ms")
        .x_labels(n.min(20))
        .x_label_formatter(&|v| {
            // Bars are centred on integers; label only those.
            if (v - v.round()).abs() > 1e-6 || *v < 0.0 {
                return String::new();
            }
            steps
                .get(v.round() as usize)
                .map(|s| s.to_string())
                .unwrap_or_default()
        })
        .label_style(label_font())
        .axis_desc_style(label_font())
        .draw()
        .map_err(err)?;
    let mut base = vec![0.0; n];
    for (k, vals) in s.values.iter().enumerate() {
        let c = if k == s.values.len() - 1 {
            RGBColor(200, 200, 200)
        } else {
            color(k)
        };
        chart
            .draw_series((0..n).map(|i| {
                let r = Rectangle::new(
                    [
                        (i as f64 - 0.4, base[i]),
                        (i as f64 + 0.4, base[i] + vals[i]),
                    ],
                    c.filled(),
                );
                base[i] += vals[i];
                r
            }))
            .map_err(err)?;
    }
    legend(&right, &s.names, true)?;
    Ok(())
}

/// A legend as its own column: a swatch and a name per row.
fn legend<DB: DrawingBackend>(
    area: &Area<DB>,
    names: &[String],
    last_grey: bool,
) -> anyhow::Result<()> {
    let style = TextStyle::from(label_font()).color(&BLACK);
    for (k, name) in names.iter().enumerate() {
        let y = 70 + 30 * k as i32;
        let c = if last_grey && k == names.len() - 1 {
            RGBColor(200, 200, 200)
        } else {
            color(k)
        };
        area.draw(&Rectangle::new([(10, y), (32, y + 20)], c.filled()))
            .map_err(err)?;
        area.draw(&Text::new(name.clone(), (40, y + 1), style.clone()))
            .map_err(err)?;
    }
    Ok(())
}

/// Horizontal bars: one row per label, one bar per series.
pub struct Bars {
    title: String,
    x_desc: String,
    labels: Vec<String>,
    series: Vec<(String, Vec<f64>)>,
    /// Format of the value printed at the end of each bar.
    percent: bool,
}

fn chart_bars<DB: DrawingBackend>(root: &Area<DB>, b: &Bars) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let n = b.labels.len().max(1);
    let max = b
        .series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .fold(0.0, f64::max)
        .max(1e-9);
    let mut chart = ChartBuilder::on(root)
        .caption(&b.title, title_style())
        .margin(15)
        .margin_right(40)
        .x_label_area_size(55)
        .y_label_area_size(260)
        .build_cartesian_2d(0f64..max * 1.18, 0f64..n as f64)
        .map_err(err)?;
    let labels = b.labels.clone();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|v| {
            // Labels sit at row centres (k + 0.5), counted from the top.
            let k = v - v.floor();
            if (k - 0.5).abs() > 1e-6 {
                return String::new();
            }
            let row = n as i64 - 1 - v.floor() as i64;
            labels.get(row as usize).cloned().unwrap_or_default()
        })
        .x_desc(&b.x_desc)
        .label_style(label_font())
        .axis_desc_style(label_font())
        .draw()
        .map_err(err)?;
    let m = b.series.len() as f64;
    let small = TextStyle::from((FONT, 15).into_font()).color(&BLACK);
    for (j, (_, vals)) in b.series.iter().enumerate() {
        let c = color(j);
        let h = 0.8 / m;
        chart
            .draw_series(vals.iter().enumerate().map(|(row, &v)| {
                let y0 = (n - 1 - row) as f64 + 0.1 + h * (m - 1.0 - j as f64);
                Rectangle::new([(0.0, y0), (v, y0 + h * 0.92)], c.filled())
            }))
            .map_err(err)?;
        chart
            .draw_series(vals.iter().enumerate().map(|(row, &v)| {
                let y0 = (n - 1 - row) as f64 + 0.1 + h * (m - 1.0 - j as f64);
                let text = if b.percent {
                    format!("{:.1}%", v * 100.0)
                } else {
                    format!("{v:.2}")
                };
                Text::new(text, (v + max * 0.01, y0 + h * 0.75), small.clone())
            }))
            .map_err(err)?;
    }
    if b.series.len() > 1 {
        for (j, (name, _)) in b.series.iter().enumerate() {
            let c = color(j);
            chart
                .draw_series(std::iter::once(Circle::new((0.0, -10.0), 0, c.filled())))
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 7), (x + 18, y + 7)], c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(label_font())
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn chart_hist<DB: DrawingBackend>(
    root: &Area<DB>,
    durs_ms: &[f64],
    run: &str,
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let mut v = durs_ms.to_vec();
    v.sort_by(f64::total_cmp);
    let (lo, hi) = (
        v.first().copied().unwrap_or(0.0),
        v.last().copied().unwrap_or(1.0),
    );
    let span = (hi - lo).max(hi.abs() * 0.01).max(1e-6);
    let bins = ((v.len() as f64).sqrt().ceil() as usize).clamp(5, 60);
    let (x0, x1) = (lo - span * 0.05, hi + span * 0.05);
    let width = (x1 - x0) / bins as f64;
    let mut counts = vec![0u32; bins];
    for x in &v {
        let k = (((x - x0) / width) as usize).min(bins - 1);
        counts[k] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1) as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{run}: step time distribution ({} steps)", v.len()),
            title_style(),
        )
        .margin(15)
        .margin_right(40)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, 0f64..top * 1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("step time (ms)")
        .y_desc("steps")
        .label_style(label_font())
        .axis_desc_style(label_font())
        .draw()
        .map_err(err)?;
    chart
        .draw_series(counts.iter().enumerate().map(|(k, &c)| {
            let a = x0 + width * k as f64;
            Rectangle::new([(a, 0.0), (a + width * 0.95, c as f64)], color(0).filled())
        }))
        .map_err(err)?;
    for (q, name, c) in [(0.5, "p50", color(1)), (0.95, "p95", color(3))] {
        if let Some(x) = crate::stats::quantile_sorted(&v, q) {
            chart
                .draw_series(LineSeries::new(
                    [(x, 0.0), (x, top * 1.1)],
                    c.stroke_width(3),
                ))
                .map_err(err)?
                .label(format!("{name} {x:.2} ms"))
                .legend(move |(a, b)| PathElement::new([(a, b), (a + 20, b)], c.stroke_width(3)));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(label_font())
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn chart_depth<DB: DrawingBackend>(
    root: &Area<DB>,
    pts: &[(f64, f64)],
    run: &str,
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let t0 = pts.first().map(|p| p.0).unwrap_or(0.0);
    let t1 = pts.last().map(|p| p.0).unwrap_or(1.0).max(t0 + 1e-6);
    let max = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0);
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("{run}: hidden-state queue depth over time"),
            title_style(),
        )
        .margin(15)
        .margin_right(40)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..(t1 - t0), 0f64..max * 1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time since first sample (s)")
        .y_desc("batches in queue")
        .label_style(label_font())
        .axis_desc_style(label_font())
        .draw()
        .map_err(err)?;
    // A counter holds its value until the next sample: draw steps, not slopes.
    let mut line = Vec::with_capacity(pts.len() * 2);
    for w in pts.windows(2) {
        line.push((w[0].0 - t0, w[0].1));
        line.push((w[1].0 - t0, w[0].1));
    }
    if let Some(last) = pts.last() {
        line.push((last.0 - t0, last.1));
    }
    chart
        .draw_series(LineSeries::new(line, color(0).stroke_width(2)))
        .map_err(err)?;
    Ok(())
}

/// (file stem, title, chart, size in pixels).
pub type Planned = (&'static str, String, Chart, (u32, u32));

/// One picture, before it is drawn on a backend.
pub enum Chart {
    Stacked(Stacked, String),
    Hist(Vec<f64>, String),
    Bars(Bars),
    Depth(Vec<(f64, f64)>, String),
    Ratio(Box<Comparison>),
    Medians(Box<Comparison>),
}

impl Chart {
    fn draw<DB: DrawingBackend>(&self, root: &Area<DB>) -> anyhow::Result<()> {
        match self {
            Chart::Stacked(s, run) => chart_stacked(root, s, run),
            Chart::Hist(d, run) => chart_hist(root, d, run),
            Chart::Bars(b) => chart_bars(root, b),
            Chart::Depth(p, run) => chart_depth(root, p, run),
            Chart::Ratio(c) => chart_compare(root, c),
            Chart::Medians(c) => chart_medians(root, c),
        }
    }
}

/// (file stem, title, chart, size) of every picture of one run.
pub fn run_charts(trace: &Trace, b: &Breakdown) -> anyhow::Result<Vec<Planned>> {
    let mut out = Vec::new();
    let run = b.run.clone();
    if !b.per_step.is_empty() {
        let s = stacked(trace, b)?;
        out.push((
            "step_sections",
            "Time per step by section".to_string(),
            Chart::Stacked(s, run.clone()),
            (W, H),
        ));
        let durs: Vec<f64> = b.per_step.iter().map(|r| r.dur_us / 1000.0).collect();
        out.push((
            "step_time_hist",
            "Step time distribution".into(),
            Chart::Hist(durs, run.clone()),
            (W, H),
        ));
    }
    let mut share: Vec<_> = b
        .sections
        .iter()
        .filter(|s| s.kind == "cpu" && s.share > 0.0)
        .collect();
    share.sort_by(|x, y| y.share.total_cmp(&x.share));
    share.truncate(MAX_SECTIONS);
    if !share.is_empty() {
        let bars = Bars {
            title: format!("{run}: share of step time per section (CPU)"),
            x_desc: "share of total step time (nested sections overlap their parents)".into(),
            labels: share.iter().map(|s| s.name.clone()).collect(),
            series: vec![("cpu".into(), share.iter().map(|s| s.share).collect())],
            percent: true,
        };
        out.push((
            "section_share",
            "Section share of step time".into(),
            Chart::Bars(bars),
            (W, H),
        ));
    }
    if !b.cpu_gpu.is_empty() {
        let mut cg: Vec<_> = b.cpu_gpu.iter().collect();
        cg.sort_by(|x, y| {
            y.cpu_total_us
                .max(y.gpu_total_us)
                .total_cmp(&x.cpu_total_us.max(x.gpu_total_us))
        });
        cg.truncate(MAX_SECTIONS);
        let per = b.steps.count.max(1) as f64 * 1000.0;
        let bars = Bars {
            title: format!("{run}: CPU vs GPU time per section"),
            x_desc: "ms per step".into(),
            labels: cg.iter().map(|c| c.name.clone()).collect(),
            series: vec![
                (
                    "CPU".into(),
                    cg.iter().map(|c| c.cpu_total_us / per).collect(),
                ),
                (
                    "GPU".into(),
                    cg.iter().map(|c| c.gpu_total_us / per).collect(),
                ),
            ],
            percent: false,
        };
        out.push((
            "cpu_vs_gpu",
            "CPU vs GPU time per section".into(),
            Chart::Bars(bars),
            (W, H),
        ));
    }
    let depth = trace
        .counters
        .clone()
        .lazy()
        .filter(
            col("name")
                .eq(lit("queue"))
                .and(col("key").eq(lit("depth"))),
        )
        .sort(["ts"], SortMultipleOptions::default())
        .collect()?;
    if depth.height() > 0 {
        let ts = q::f64s(&depth, "ts")?;
        let v = q::f64s(&depth, "value")?;
        let pts: Vec<(f64, f64)> = ts
            .into_iter()
            .zip(v)
            .filter_map(|(t, v)| Some((t? / 1e6, v?)))
            .collect();
        out.push((
            "queue_depth",
            "Queue depth over time".into(),
            Chart::Depth(pts, run.clone()),
            (W, H),
        ));
    }
    Ok(out)
}

/// (file stem, title, chart, size) of the pictures of a comparison.
pub fn compare_charts(c: &Comparison) -> Vec<Planned> {
    let rows = c.sections.iter().filter(|s| s.ci_low.is_some()).count();
    let h = (160 + 34 * rows as u32).max(H);
    vec![
        (
            "compare_ratio",
            "Ratio B/A per section".into(),
            Chart::Ratio(Box::new(c.clone())),
            (W, h),
        ),
        (
            "compare_medians",
            "Median per-step time, A vs B".into(),
            Chart::Medians(Box::new(c.clone())),
            (W, H),
        ),
    ]
}

fn write_files(charts: Vec<Planned>, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fonts()?;
    let mut out = Vec::new();
    for (stem, _, chart, size) in charts {
        let png = dir.join(format!("{stem}.png"));
        let svg = dir.join(format!("{stem}.svg"));
        {
            let root = BitMapBackend::new(&png, size).into_drawing_area();
            chart
                .draw(&root)
                .with_context(|| format!("drawing {}", png.display()))?;
            root.present()
                .map_err(err)
                .with_context(|| format!("writing {}", png.display()))?;
        }
        {
            let root = SVGBackend::new(&svg, size).into_drawing_area();
            chart
                .draw(&root)
                .with_context(|| format!("drawing {}", svg.display()))?;
            root.present()
                .map_err(err)
                .with_context(|| format!("writing {}", svg.display()))?;
        }
        out.push(png);
        out.push(svg);
    }
    Ok(out)
}

/// Draws charts as SVG text, for the HTML report: (title, svg).
pub fn svgs(charts: Vec<Planned>) -> anyhow::Result<Vec<(String, String)>> {
    fonts()?;
    let mut out = Vec::new();
    for (_, title, chart, size) in charts {
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, size).into_drawing_area();
            chart.draw(&root)?;
            root.present().map_err(err)?;
        }
        out.push((title, text));
    }
    Ok(out)
}

/// Draws every picture of one run; returns the files written.
pub fn plot_run(trace: &Trace, b: &Breakdown, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    write_files(run_charts(trace, b)?, dir)
}

fn chart_compare<DB: DrawingBackend>(root: &Area<DB>, c: &Comparison) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let rows: Vec<_> = c.sections.iter().filter(|s| s.ci_low.is_some()).collect();
    let n = rows.len().max(1);
    let lo = rows
        .iter()
        .filter_map(|s| s.ci_low)
        .fold(1.0 - 2.0 * c.noise, f64::min);
    let hi = rows
        .iter()
        .filter_map(|s| s.ci_high)
        .fold(1.0 + 2.0 * c.noise, f64::max);
    let pad = (hi - lo) * 0.08;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!(
                "{} vs {}: median per-step time B/A, 95% CI",
                c.run_b, c.run_a
            ),
            title_style(),
        )
        .margin(15)
        .margin_right(40)
        .x_label_area_size(55)
        .y_label_area_size(300)
        .build_cartesian_2d((lo - pad)..(hi + pad), 0f64..n as f64)
        .map_err(err)?;
    let labels: Vec<String> = rows
        .iter()
        .map(|s| format!("{} ({})", s.name, s.kind))
        .collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|v| {
            if ((v - v.floor()) - 0.5).abs() > 1e-6 {
                return String::new();
            }
            let row = n as i64 - 1 - v.floor() as i64;
            labels.get(row as usize).cloned().unwrap_or_default()
        })
        .x_desc("ratio B/A (1 = unchanged; shaded: noise band)")
        .label_style(label_font())
        .axis_desc_style(label_font())
        .draw()
        .map_err(err)?;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(1.0 - c.noise, 0.0), (1.0 + c.noise, n as f64)],
            RGBColor(220, 220, 220).mix(0.6).filled(),
        )))
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            [(1.0, 0.0), (1.0, n as f64)],
            BLACK.stroke_width(1),
        ))
        .map_err(err)?;
    if let Some(h) = &c.host_shift {
        chart
            .draw_series(LineSeries::new(
                [(h.factor, 0.0), (h.factor, n as f64)],
                color(4).stroke_width(2),
            ))
            .map_err(err)?
            .label(format!("host factor x{:.2}", h.factor))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], color(4).stroke_width(2)));
    }
    for (row, s) in rows.iter().enumerate() {
        let y = (n - 1 - row) as f64 + 0.5;
        let shown = if s.explained_by_host {
            Verdict::Unchanged
        } else {
            s.relative_verdict.unwrap_or(s.verdict)
        };
        let col = match shown {
            Verdict::Regression => RGBColor(214, 39, 40),
            Verdict::Improvement => RGBColor(44, 160, 44),
            _ => RGBColor(90, 90, 90),
        };
        let (l, h) = (s.ci_low.unwrap_or(1.0), s.ci_high.unwrap_or(1.0));
        chart
            .draw_series(std::iter::once(PathElement::new(
                [(l, y), (h, y)],
                col.stroke_width(3),
            )))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(Circle::new(
                (s.ratio.unwrap_or(1.0), y),
                6,
                col.filled(),
            )))
            .map_err(err)?;
    }
    if c.host_shift.is_some() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(label_font())
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn chart_medians<DB: DrawingBackend>(root: &Area<DB>, c: &Comparison) -> anyhow::Result<()> {
    let mut rows: Vec<_> = c
        .sections
        .iter()
        .filter(|s| s.median_a_us.is_some() && s.median_b_us.is_some())
        .collect();
    rows.sort_by(|x, y| {
        y.median_a_us
            .unwrap_or(0.0)
            .total_cmp(&x.median_a_us.unwrap_or(0.0))
    });
    rows.truncate(MAX_SECTIONS);
    let bars = Bars {
        title: format!("median per-step time: A = {}, B = {}", c.run_a, c.run_b),
        x_desc: "ms per step (median)".into(),
        labels: rows
            .iter()
            .map(|s| format!("{} ({})", s.name, s.kind))
            .collect(),
        series: vec![
            (
                format!("A {}", c.run_a),
                rows.iter()
                    .map(|s| s.median_a_us.unwrap_or(0.0) / 1000.0)
                    .collect(),
            ),
            (
                format!("B {}", c.run_b),
                rows.iter()
                    .map(|s| s.median_b_us.unwrap_or(0.0) / 1000.0)
                    .collect(),
            ),
        ],
        percent: false,
    };
    chart_bars(root, &bars)
}

/// Draws the comparison: ratios with intervals, and A vs B medians per section.
pub fn plot_compare(c: &Comparison, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    write_files(compare_charts(c), dir)
}
