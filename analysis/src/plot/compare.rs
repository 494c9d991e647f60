//! The charts of a comparison: each section's ratio B/A with its interval, and the
//! medians of A and B side by side.

use plotters::prelude::*;

use super::charts::{chart_bars, Bars};
use super::style::{color, err, label_font, title_style, Area, MAX_SECTIONS};
use crate::compare::{Comparison, Verdict};

pub(super) fn chart_compare<DB: DrawingBackend>(
    root: &Area<DB>,
    c: &Comparison,
) -> anyhow::Result<()> {
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
        let shown = if s.explained_by_host || s.host_slack {
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

pub(super) fn chart_medians<DB: DrawingBackend>(
    root: &Area<DB>,
    c: &Comparison,
) -> anyhow::Result<()> {
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
