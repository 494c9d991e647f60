//! Terminal output: aligned tables (one unit per column, named in the header) and the
//! findings in words. Colour carries meaning only (red regression, green improvement,
//! yellow warnings) and is off unless asked for or on a terminal without NO_COLOR.

use std::fmt::Write as _;

use comfy_table::{presets, Cell, CellAlignment, Color, ContentArrangement, Table};

use crate::breakdown::Breakdown;
use crate::compare::{Comparison, SectionCompare, Verdict};

fn table(color: bool, header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(Cell::new));
    if color {
        t.enforce_styling();
    } else {
        t.force_no_tty();
    }
    for i in 1..header.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

fn pct(x: f64) -> String {
    format!("{:.1}", x * 100.0)
}

pub fn breakdown(b: &Breakdown, top: usize, color: bool) -> String {
    let mut out = String::new();
    let s = &b.steps;
    let _ = writeln!(
        out,
        "run {} ({}): {} steps, median {} ms, p95 {} ms{}{}",
        b.run,
        b.producer,
        s.count,
        ms(s.p50_us),
        ms(s.p95_us),
        s.tokens_per_s
            .map(|v| format!(", {v:.0} tokens/s"))
            .unwrap_or_default(),
        s.gpu_idle_share
            .map(|v| format!(", GPU idle {}%", pct(v)))
            .unwrap_or_default()
    );

    let _ = writeln!(out, "\nTop findings:");
    if b.findings.is_empty() {
        let _ = writeln!(out, "  (none: no rule fired)");
    }
    for (i, f) in b.findings.iter().enumerate() {
        let _ = writeln!(out, "  {}. {}", i + 1, f.text);
    }

    sections_table(&mut out, b, top, color);
    if let Some(why) = &b.fallback {
        let _ = writeln!(out, "(operators added: {why})");
    }
    if let Some(k) = &b.kernels {
        kernel_tables(&mut out, k, top, color);
    }
    cpu_gpu_table(&mut out, b, top, color);
    queue_table(&mut out, b, color);
    per_step_table(&mut out, b, color);
    out
}

fn sections_table(out: &mut String, b: &Breakdown, top: usize, color: bool) {
    let _ = writeln!(out, "\nSections (times in ms, share in % of step time):");
    let mut t = table(
        color,
        &[
            "section", "kind", "count", "total", "self", "mean", "p50", "p95", "share %",
        ],
    );
    let n = if top == 0 {
        b.sections.len()
    } else {
        top.min(b.sections.len())
    };
    for sec in &b.sections[..n] {
        t.add_row(vec![
            Cell::new(&sec.name),
            Cell::new(sec.kind.as_str()),
            Cell::new(sec.count),
            Cell::new(ms(sec.total_us)),
            Cell::new(ms(sec.self_us)),
            Cell::new(ms(sec.mean_us)),
            Cell::new(ms(sec.p50_us)),
            Cell::new(ms(sec.p95_us)),
            Cell::new(pct(sec.share)),
        ]);
    }
    let _ = writeln!(out, "{t}");
    if n < b.sections.len() {
        let _ = writeln!(
            out,
            "({} more sections; --top 0 shows all)",
            b.sections.len() - n
        );
    }
}

/// A long C++ kernel name cut to `max` characters.
fn short(name: &str, max: usize) -> String {
    if name.chars().count() <= max {
        return name.to_string();
    }
    let mut s: String = name.chars().take(max - 1).collect();
    s.push('…');
    s
}

fn kernel_tables(out: &mut String, k: &crate::kernels::KernelView, top: usize, color: bool) {
    let take = if top == 0 { usize::MAX } else { top };
    let streams: Vec<String> = k
        .streams
        .iter()
        .map(|s| format!("GPU {} stream {}: {} ms", s.pid, s.tid, ms(s.busy_us)))
        .collect();
    let _ = writeln!(
        out,
        "\nKernels: {} on the GPU, busy {} ms ({}); host: {} launches {} ms, {} syncs {} ms, {} device allocs/frees {} ms",
        k.kernels,
        ms(k.gpu_busy_us),
        streams.join(", "),
        k.launch.calls,
        ms(k.launch.us),
        k.sync.calls,
        ms(k.sync.us),
        k.alloc.calls + k.free.calls,
        ms(k.alloc.us + k.free.us),
    );
    let mut t = table(color, &["kernel", "count", "total", "mean", "share %"]);
    for r in k.by_name.iter().take(take) {
        t.add_row(vec![
            Cell::new(short(&r.name, 70)),
            Cell::new(r.count),
            Cell::new(ms(r.total_us)),
            Cell::new(format!("{:.1}", r.mean_us)),
            Cell::new(pct(r.share)),
        ]);
    }
    let _ = writeln!(
        out,
        "(times in ms, mean in us, share of all kernel time)\n{t}"
    );
    let h = &k.hta;
    for t in &h.temporal {
        let p = |x: f64| pct(x / t.window_us.max(1e-9));
        let _ = writeln!(
            out,
            "GPU {}: compute {}%, non-compute {}%, idle {}% of {} ms",
            t.pid,
            p(t.compute_us),
            p(t.non_compute_us),
            p(t.idle_us),
            ms(t.window_us)
        );
    }
    for i in &h.idle {
        let q = h.queues.iter().find(|q| (q.pid, q.tid) == (i.pid, i.tid));
        let _ = writeln!(
            out,
            "  stream {}: idle host wait {} ms, kernel wait {} ms, other {} ms; queue max {}, mean {:.1}",
            i.tid,
            ms(i.host_wait_us),
            ms(i.kernel_wait_us),
            ms(i.other_us),
            q.map_or(0, |q| q.max),
            q.map_or(0.0, |q| q.mean)
        );
    }
    let l = &h.launches;
    let _ = writeln!(
        out,
        "launch delay p50 {:.1} us, p95 {:.1} us; {} of {} kernels shorter than their launch call",
        l.delay_p50_us, l.delay_p95_us, l.short_kernels, l.kernels
    );
    if k.sections.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nSections on the GPU (ms; kernels by launch, autograd's through the waiting section: {} of {} kernels attributed, {} through another thread):",
        k.attributed, k.kernels, k.via_waiting_thread
    );
    let mut t = table(
        color,
        &[
            "section", "kernels", "busy", "gpu span", "launches", "launch", "syncs", "sync",
            "allocs",
        ],
    );
    for s in k.sections.iter().take(take) {
        t.add_row(vec![
            Cell::new(&s.name),
            Cell::new(s.kernels),
            Cell::new(ms(s.kernel_busy_us)),
            Cell::new(ms(s.gpu_span_us)),
            Cell::new(s.launches),
            Cell::new(ms(s.launch_us)),
            Cell::new(s.syncs),
            Cell::new(ms(s.sync_us)),
            Cell::new(s.allocs),
        ]);
    }
    let _ = writeln!(out, "{t}");
}

fn cpu_gpu_table(out: &mut String, b: &Breakdown, top: usize, color: bool) {
    if !b.cpu_gpu.is_empty() {
        let _ = writeln!(
            out,
            "\nCPU vs GPU time per section (ms; gap = CPU - GPU, launch overhead and host syncs):"
        );
        let mut t = table(color, &["section", "cpu", "gpu", "gap", "cpu/gpu"]);
        for c in b
            .cpu_gpu
            .iter()
            .take(if top == 0 { usize::MAX } else { top })
        {
            let mut ratio = Cell::new(format!("{:.2}", c.cpu_over_gpu));
            if color && c.cpu_over_gpu >= crate::thresholds::LAUNCH_BOUND_RATIO {
                ratio = ratio.fg(Color::Yellow);
            }
            t.add_row(vec![
                Cell::new(&c.name),
                Cell::new(ms(c.cpu_total_us)),
                Cell::new(ms(c.gpu_total_us)),
                Cell::new(ms(c.gap_us)),
                ratio,
            ]);
        }
        let _ = writeln!(out, "{t}");
    }
}

fn queue_table(out: &mut String, b: &Breakdown, color: bool) {
    if !b.queue.is_empty() {
        let _ = writeln!(out, "\nQueue waits (us; share in % of step time):");
        let mut t = table(
            color,
            &["side", "count", "total", "mean", "p50", "p95", "share %"],
        );
        for q in &b.queue {
            t.add_row(vec![
                Cell::new(&q.name),
                Cell::new(q.count),
                Cell::new(format!("{:.0}", q.wait_total_us)),
                Cell::new(format!("{:.1}", q.wait_mean_us)),
                Cell::new(format!("{:.1}", q.wait_p50_us)),
                Cell::new(format!("{:.1}", q.wait_p95_us)),
                Cell::new(pct(q.share)),
            ]);
        }
        let _ = writeln!(out, "{t}");
        if let Some(d) = &b.queue_depth {
            let _ = writeln!(
                out,
                "queue depth: mean {:.2}, min {:.0}, max {:.0}; empty at {}% and at max at {}% of {} samples",
                d.mean,
                d.min,
                d.max,
                pct(d.empty_share),
                pct(d.full_share),
                d.samples
            );
        }
    }
}

fn per_step_table(out: &mut String, b: &Breakdown, color: bool) {
    if !b.per_step.is_empty() {
        let _ = writeln!(out, "\nPer step (ms):");
        let mut t = table(
            color,
            &[
                "step",
                "dur",
                "queue wait",
                "gpu busy",
                "gpu idle",
                "tokens/s",
                "loss",
            ],
        );
        for r in &b.per_step {
            t.add_row(vec![
                Cell::new(r.step),
                Cell::new(ms(r.dur_us)),
                Cell::new(opt(r.queue_wait_us, ms)),
                Cell::new(opt(r.gpu_busy_us, ms)),
                Cell::new(opt(r.gpu_idle_us, ms)),
                Cell::new(opt(r.tokens_per_s, |v| format!("{v:.0}"))),
                Cell::new(opt(r.loss, |v| format!("{v:.4}"))),
            ]);
        }
        let _ = writeln!(out, "{t}");
    }
}

pub fn comparison(c: &Comparison, color: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "compare A={} B={}:", c.run_a, c.run_b);
    for line in &c.summary {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(
        out,
        "\nSections (median per-step time in ms; ratio = B/A with its 95% bootstrap interval; p after Holm):"
    );
    let mut t = table(
        color,
        &[
            "section", "kind", "A", "B", "ratio", "ci low", "ci high", "p adj", "n A", "n B",
            "verdict",
        ],
    );
    let mut rows: Vec<_> = c.sections.iter().collect();
    rows.sort_by(|x, y| {
        let rank = |v: Verdict| match v {
            Verdict::Regression => 0,
            Verdict::Improvement => 1,
            Verdict::Unchanged => 2,
            Verdict::Insufficient => 3,
        };
        // Host slack below the flagged changes: it is not counted.
        let shown = |s: &SectionCompare| {
            if s.host_slack {
                Verdict::Unchanged
            } else {
                s.verdict
            }
        };
        rank(shown(x)).cmp(&rank(shown(y))).then(
            y.median_a_us
                .unwrap_or(0.0)
                .total_cmp(&x.median_a_us.unwrap_or(0.0)),
        )
    });
    for s in rows {
        let mut verdict = s.verdict.as_str().to_string();
        if let Some(why) = s.discount() {
            verdict = format!("{verdict} ({why})");
        } else if let Some(rv) = s.relative_verdict {
            if rv != Verdict::Unchanged {
                verdict = format!("{} vs host", rv.as_str());
            }
        }
        let mut vc = Cell::new(&verdict);
        if color {
            let shown = if s.host_slack {
                Verdict::Unchanged
            } else {
                s.relative_verdict
                    .filter(|_| {
                        s.explained_by_host || s.relative_verdict != Some(Verdict::Unchanged)
                    })
                    .unwrap_or(s.verdict)
            };
            vc = match shown {
                Verdict::Regression => vc.fg(Color::Red),
                Verdict::Improvement => vc.fg(Color::Green),
                _ => vc,
            };
        }
        t.add_row(vec![
            Cell::new(&s.name),
            Cell::new(s.kind.as_str()),
            Cell::new(opt(s.median_a_us, ms)),
            Cell::new(opt(s.median_b_us, ms)),
            Cell::new(opt(s.ratio, |v| format!("{v:.3}"))),
            Cell::new(opt(s.ci_low, |v| format!("{v:.3}"))),
            Cell::new(opt(s.ci_high, |v| format!("{v:.3}"))),
            Cell::new(opt(s.p_adjusted, |v| format!("{v:.2e}"))),
            Cell::new(s.n_a),
            Cell::new(s.n_b),
            vc,
        ]);
    }
    let _ = writeln!(out, "{t}");
    out
}
