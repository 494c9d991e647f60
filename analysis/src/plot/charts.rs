//! The charts of one run: step time stacked by section, the step time histogram,
//! horizontal bars, and the queue depth over time.

use std::collections::BTreeMap;

use chrome_trace_format::Clock;
use plotters::prelude::*;
use polars::prelude::*;

use super::style::{
    color, err, label_font, title_style, Area, FONT, MAX_SECTIONS, MAX_STEPS_PLOTTED, W,
};
use crate::breakdown::Breakdown;
use crate::load::Trace;
use crate::queries as q;

/// Per step, the top-level CPU sections (ms), plus "(other)" for the rest of the step.
pub struct Stacked {
    steps: Vec<i64>,
    names: Vec<String>,
    /// values[name][step index]
    values: Vec<Vec<f64>>,
}

pub(super) fn stacked(trace: &Trace, b: &Breakdown) -> PolarsResult<Stacked> {
    let df = q::top_level_per_step(trace.spans.clone().lazy(), Clock::Cpu).collect()?;
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
        .filter(|s| s.top_level && s.kind == Clock::Cpu && present.contains(s.name.as_str()))
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

pub(super) fn chart_stacked<DB: DrawingBackend>(
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
    pub(super) title: String,
    pub(super) x_desc: String,
    pub(super) labels: Vec<String>,
    pub(super) series: Vec<(String, Vec<f64>)>,
    /// Format of the value printed at the end of each bar.
    pub(super) percent: bool,
}

pub(super) fn chart_bars<DB: DrawingBackend>(root: &Area<DB>, b: &Bars) -> anyhow::Result<()> {
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

/// Step times (ms) with their median and 95th percentile as the breakdown has them.
pub struct StepTimes {
    pub durs_ms: Vec<f64>,
    pub p50_ms: f64,
    pub p95_ms: f64,
}

pub(super) fn chart_hist<DB: DrawingBackend>(
    root: &Area<DB>,
    t: &StepTimes,
    run: &str,
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let mut v = t.durs_ms.clone();
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
    for (x, name, c) in [(t.p50_ms, "p50", color(1)), (t.p95_ms, "p95", color(3))] {
        chart
            .draw_series(LineSeries::new(
                [(x, 0.0), (x, top * 1.1)],
                c.stroke_width(3),
            ))
            .map_err(err)?
            .label(format!("{name} {x:.2} ms"))
            .legend(move |(a, b)| PathElement::new([(a, b), (a + 20, b)], c.stroke_width(3)));
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

pub(super) fn chart_depth<DB: DrawingBackend>(
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
