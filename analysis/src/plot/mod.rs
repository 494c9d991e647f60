//! Pictures of a run and of a comparison, each written as PNG and SVG.
//!
//! Text is drawn with DejaVu Sans embedded through `ab_glyph`, so no system font library
//! is needed. Every chart is a function over a generic drawing area, called once per
//! backend.

mod charts;
mod compare;
mod style;

use std::path::{Path, PathBuf};

use anyhow::Context;
use chrome_trace_format::Clock;
use plotters::prelude::*;
use polars::prelude::*;

use crate::breakdown::Breakdown;
use crate::compare::Comparison;
use crate::load::Trace;
use crate::queries as q;
use charts::{
    chart_bars, chart_depth, chart_hist, chart_stacked, stacked, Bars, Stacked, StepTimes,
};
use compare::{chart_compare, chart_medians};
use style::{err, fonts, Area, H, MAX_SECTIONS, W};

/// (file stem, title, chart, size in pixels).
pub type Planned = (&'static str, String, Chart, (u32, u32));

/// One picture, before it is drawn on a backend.
pub enum Chart {
    Stacked(Stacked, String),
    Hist(StepTimes, String),
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
        let times = StepTimes {
            durs_ms: b.per_step.iter().map(|r| r.dur_us / 1000.0).collect(),
            p50_ms: b.steps.p50_us / 1000.0,
            p95_ms: b.steps.p95_us / 1000.0,
        };
        out.push((
            "step_time_hist",
            "Step time distribution".into(),
            Chart::Hist(times, run.clone()),
            (W, H),
        ));
    }
    let mut share: Vec<_> = b
        .sections
        .iter()
        .filter(|s| s.kind == Clock::Cpu && s.share > 0.0)
        .collect();
    share.sort_by(|x, y| y.share.total_cmp(&x.share));
    share.truncate(MAX_SECTIONS);
    if !share.is_empty() {
        let bars = Bars {
            title: format!("{run}: share of step time per section (CPU)"),
            x_desc: "share of total step time (nested sections overlap their parents)".into(),
            labels: share.iter().map(|s| s.name.clone()).collect(),
            series: vec![(
                Clock::Cpu.as_str().into(),
                share.iter().map(|s| s.share).collect(),
            )],
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
    let depth = q::queue_depth_series(trace.counters.clone().lazy()).collect()?;
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

/// Draws the comparison: ratios with intervals, and A vs B medians per section.
pub fn plot_compare(c: &Comparison, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    write_files(compare_charts(c), dir)
}
