//! One self-contained HTML page: findings, tables and plots (inline SVG) of a run, and of
//! a comparison when a second run is given. No scripts, no external files.

use std::fmt::Write as _;

use crate::breakdown::{self, Breakdown};
use crate::compare::{self, CompareOptions, Comparison};
use crate::hta::Hta;
use crate::kernels::KernelView;
use crate::load::Trace;
use crate::plot;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn ms(us: f64) -> String {
    format!("{:.3}", us / 1000.0)
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

const STYLE: &str = "body{font-family:DejaVu Sans,Helvetica,Arial,sans-serif;margin:2em;color:#222;max-width:1500px}\
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{padding:3px 10px;border-bottom:1px solid #ddd}\
th{text-align:left;background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.reg{color:#c0392b;font-weight:bold}.imp{color:#1e8449;font-weight:bold}.warn{color:#9a6700}\
figure{margin:1em 0}figcaption{font-weight:bold;margin-bottom:.3em}svg{max-width:100%;height:auto}\
details{margin:1em 0}";

fn table(out: &mut String, header: &[&str], rows: Vec<Vec<(String, bool)>>) {
    out.push_str("<table><tr>");
    for h in header {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr>");
    for r in rows {
        out.push_str("<tr>");
        for (cell, numeric) in r {
            if numeric {
                let _ = write!(out, "<td class=n>{}</td>", esc(&cell));
            } else {
                let _ = write!(out, "<td>{cell}</td>");
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

fn figures(out: &mut String, svgs: Vec<(String, String)>) {
    for (title, svg) in svgs {
        // Drop the XML prolog: the SVG is inlined into HTML.
        let body = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
        let _ = write!(
            out,
            "<figure><figcaption>{}</figcaption>{body}</figure>",
            esc(&title)
        );
    }
}

fn breakdown_html(out: &mut String, trace: &Trace, b: &Breakdown) -> anyhow::Result<()> {
    let s = &b.steps;
    let _ = write!(
        out,
        "<h2>Run {} <small>({})</small></h2><p>{} steps, median {} ms, p95 {} ms{}{}</p>",
        esc(&b.run),
        esc(&b.producer),
        s.count,
        ms(s.p50_us),
        ms(s.p95_us),
        s.tokens_per_s
            .map(|v| format!(", {v:.0} tokens/s"))
            .unwrap_or_default(),
        s.gpu_idle_share
            .map(|v| format!(", GPU idle {:.1}%", v * 100.0))
            .unwrap_or_default()
    );
    for w in &b.warnings {
        let _ = write!(out, "<p class=warn>warning: {}</p>", esc(&w.to_string()));
    }
    out.push_str("<h3>Top findings</h3><ol>");
    for f in &b.findings {
        let _ = write!(out, "<li>{}</li>", esc(&f.text));
    }
    out.push_str("</ol>");
    figures(out, plot::svgs(plot::run_charts(trace, b)?)?);
    breakdown_tables(out, b);
    gpu_tables(out, b);
    Ok(())
}

fn num(x: f64, digits: usize) -> (String, bool) {
    (format!("{x:.digits$}"), true)
}

/// Memory, kernels, sections on the GPU, and what Holistic Trace Analysis reports for one
/// rank.
fn gpu_tables(out: &mut String, b: &Breakdown) {
    memory_html(out, b);
    let Some(k) = &b.kernels else { return };
    kernel_tables(out, k);
    hta_tables(out, &k.hta);
}

/// The allocator's peaks, where the trace records them.
fn memory_html(out: &mut String, b: &Breakdown) {
    if let Some(m) = &b.memory {
        let _ = write!(
            out,
            "<h3>Memory</h3><p>{} allocator samples; peak allocated {:.1} MiB{}; last {:.1} MiB.</p>",
            m.samples,
            m.peak_allocated_bytes / 1048576.0,
            m.peak_reserved_bytes
                .map(|r| format!(", peak reserved {:.1} MiB", r / 1048576.0))
                .unwrap_or_default(),
            m.last_allocated_bytes / 1048576.0
        );
    }
}

/// The kernels by name and the sections on the GPU.
fn kernel_tables(out: &mut String, k: &KernelView) {
    let _ = write!(
        out,
        "<h3>Kernels</h3><p>{} kernels, GPU busy {} ms; {} of them attributed to a section \
         ({} through the section waiting on autograd's thread).</p>",
        k.kernels,
        ms(k.gpu_busy_us),
        k.attributed,
        k.via_waiting_thread
    );
    let rows = k
        .by_name
        .iter()
        .take(30)
        .map(|r| {
            vec![
                (esc(&r.name), false),
                (r.count.to_string(), true),
                (ms(r.total_us), true),
                num(r.mean_us, 1),
                num(r.share * 100.0, 1),
            ]
        })
        .collect();
    table(
        out,
        &["kernel", "count", "total ms", "mean us", "share %"],
        rows,
    );
    out.push_str("<h3>Sections on the GPU</h3><p>Times in ms, summed over steps.</p>");
    let rows = k
        .sections
        .iter()
        .map(|s| {
            vec![
                (esc(&s.name), false),
                (s.kernels.to_string(), true),
                (ms(s.kernel_busy_us), true),
                (ms(s.gpu_span_us), true),
                (s.launches.to_string(), true),
                (ms(s.launch_us), true),
                (s.syncs.to_string(), true),
                (ms(s.sync_us), true),
                (s.allocs.to_string(), true),
            ]
        })
        .collect();
    table(
        out,
        &[
            "section", "kernels", "busy", "GPU span", "launches", "launch", "syncs", "sync",
            "allocs",
        ],
        rows,
    );
}

/// HTA's temporal breakdown, idle time and queue length per stream, and launches.
fn hta_tables(out: &mut String, h: &Hta) {
    out.push_str(
        "<h3>Temporal breakdown</h3><p>Per GPU, from its first kernel to its last; ms.</p>",
    );
    let rows = h
        .temporal
        .iter()
        .map(|t| {
            let pct = |x: f64| num(100.0 * x / t.window_us.max(1e-9), 1);
            vec![
                (t.pid.to_string(), true),
                (ms(t.window_us), true),
                (ms(t.compute_us), true),
                pct(t.compute_us),
                (ms(t.non_compute_us), true),
                pct(t.non_compute_us),
                (ms(t.idle_us), true),
                pct(t.idle_us),
            ]
        })
        .collect();
    table(
        out,
        &[
            "GPU",
            "window",
            "compute",
            "%",
            "non-compute",
            "%",
            "idle",
            "%",
        ],
        rows,
    );
    out.push_str("<h3>Idle time and queue length per stream</h3><p>Host wait: the next kernel was launched after the previous one ended. Kernel wait: launched before, gap under 30 us. Queue: kernels launched and not finished. Times in ms.</p>");
    let rows = h
        .idle
        .iter()
        .map(|i| {
            let q = h.queues.iter().find(|q| (q.pid, q.tid) == (i.pid, i.tid));
            vec![
                (format!("GPU {} stream {}", i.pid, i.tid), false),
                (ms(i.host_wait_us), true),
                (ms(i.kernel_wait_us), true),
                (ms(i.other_us), true),
                (q.map_or(0, |q| q.max).to_string(), true),
                num(q.map_or(0.0, |q| q.mean), 1),
            ]
        })
        .collect();
    table(
        out,
        &[
            "stream",
            "host wait",
            "kernel wait",
            "other",
            "queue max",
            "queue mean",
        ],
        rows,
    );
    let l = &h.launches;
    let _ = write!(
        out,
        "<h3>Kernel launches</h3><p>{} kernels with their launch: launch delay p50 {:.1} us, p95 {:.1} us, max {:.1} us; launch call p50 {:.1} us, kernel p50 {:.1} us; {} kernels shorter than their launch call.</p>",
        l.kernels, l.delay_p50_us, l.delay_p95_us, l.delay_max_us, l.launch_p50_us, l.kernel_p50_us, l.short_kernels
    );
}

/// The breakdown's tables: sections, CPU vs GPU, queue waits, and the per-step table.
fn breakdown_tables(out: &mut String, b: &Breakdown) {
    out.push_str("<h3>Sections</h3><p>Times in ms; share in % of total step time.</p>");
    let rows = b
        .sections
        .iter()
        .map(|x| {
            vec![
                (esc(&x.name), false),
                (x.kind.to_string(), false),
                (x.count.to_string(), true),
                (ms(x.total_us), true),
                (ms(x.self_us), true),
                (ms(x.mean_us), true),
                (ms(x.p50_us), true),
                (ms(x.p95_us), true),
                (format!("{:.1}", x.share * 100.0), true),
            ]
        })
        .collect();
    table(
        out,
        &[
            "section", "kind", "count", "total", "self", "mean", "p50", "p95", "share %",
        ],
        rows,
    );
    if !b.cpu_gpu.is_empty() {
        out.push_str("<h3>CPU vs GPU</h3><p>Totals in ms; gap = CPU - GPU (launch overhead and host syncs).</p>");
        let rows = b
            .cpu_gpu
            .iter()
            .map(|c| {
                vec![
                    (esc(&c.name), false),
                    (ms(c.cpu_total_us), true),
                    (ms(c.gpu_total_us), true),
                    (ms(c.gap_us), true),
                    (format!("{:.2}", c.cpu_over_gpu), true),
                ]
            })
            .collect();
        table(out, &["section", "cpu", "gpu", "gap", "cpu/gpu"], rows);
    }
    if !b.queue.is_empty() {
        out.push_str("<h3>Queue waits</h3><p>Waits in us; share in % of total step time.</p>");
        let rows = b
            .queue
            .iter()
            .map(|q| {
                vec![
                    (esc(&q.name), false),
                    (q.count.to_string(), true),
                    (format!("{:.0}", q.wait_total_us), true),
                    (format!("{:.1}", q.wait_p50_us), true),
                    (format!("{:.1}", q.wait_p95_us), true),
                    (format!("{:.1}", q.share * 100.0), true),
                ]
            })
            .collect();
        table(
            out,
            &["side", "count", "total", "p50", "p95", "share %"],
            rows,
        );
    }
    if !b.per_step.is_empty() {
        out.push_str("<details><summary>Per-step table (ms)</summary>");
        let rows = b
            .per_step
            .iter()
            .map(|r| {
                vec![
                    (r.step.to_string(), true),
                    (ms(r.dur_us), true),
                    (opt(r.queue_wait_us, ms), true),
                    (opt(r.gpu_busy_us, ms), true),
                    (opt(r.gpu_idle_us, ms), true),
                    (opt(r.tokens_per_s, |v| format!("{v:.0}")), true),
                    (opt(r.loss, |v| format!("{v:.4}")), true),
                ]
            })
            .collect();
        table(
            out,
            &[
                "step",
                "dur",
                "queue wait",
                "gpu busy",
                "gpu idle",
                "tokens/s",
                "loss",
            ],
            rows,
        );
        out.push_str("</details>");
    }
}

fn comparison_html(out: &mut String, c: &Comparison) -> anyhow::Result<()> {
    let _ = write!(
        out,
        "<h2>Comparison: A = {}, B = {}</h2><ul>",
        esc(&c.run_a),
        esc(&c.run_b)
    );
    for line in &c.summary {
        let _ = write!(out, "<li>{}</li>", esc(line));
    }
    out.push_str("</ul>");
    figures(out, plot::svgs(plot::compare_charts(c))?);
    let rows = c
        .sections
        .iter()
        .map(|s| {
            let class = match (s.verdict, s.explained_by_host || s.host_slack) {
                (compare::Verdict::Regression, false) => "reg",
                (compare::Verdict::Improvement, false) => "imp",
                _ => "",
            };
            let verdict = match s.discount() {
                Some(why) => format!("{} ({why})", s.verdict.as_str()),
                None => s.verdict.as_str().to_string(),
            };
            vec![
                (esc(&s.name), false),
                (s.kind.to_string(), false),
                (opt(s.median_a_us, ms), true),
                (opt(s.median_b_us, ms), true),
                (opt(s.ratio, |v| format!("{v:.3}")), true),
                (opt(s.ci_low, |v| format!("{v:.3}")), true),
                (opt(s.ci_high, |v| format!("{v:.3}")), true),
                (opt(s.p_adjusted, |v| format!("{v:.2e}")), true),
                (format!("{}/{}", s.n_a, s.n_b), true),
                (
                    format!("<span class={class}>{}</span>", esc(&verdict)),
                    false,
                ),
            ]
        })
        .collect();
    out.push_str("<p>Median per-step time in ms; ratio = B/A with a 95% bootstrap interval; p after Holm's correction.</p>");
    table(
        out,
        &[
            "section", "kind", "A", "B", "ratio", "ci low", "ci high", "p adj", "n A/B", "verdict",
        ],
        rows,
    );
    Ok(())
}

/// The whole page.
pub fn report(a: &Trace, b: Option<&Trace>, noise: f64) -> anyhow::Result<String> {
    let mut out = String::new();
    let title = match b {
        Some(b) => format!("dflash-analyze: {} vs {}", a.run, b.run),
        None => format!("dflash-analyze: {}", a.run),
    };
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{}</title><style>{STYLE}</style></head><body><h1>{}</h1>",
        esc(&title),
        esc(&title)
    );
    match b {
        Some(b) => {
            let opts = CompareOptions {
                noise,
                ..CompareOptions::default()
            };
            let (c, ba, bb) = compare::compare(a, b, &opts)?;
            comparison_html(&mut out, &c)?;
            breakdown_html(&mut out, a, &ba)?;
            breakdown_html(&mut out, b, &bb)?;
        }
        None => {
            let ba = breakdown::breakdown(a)?;
            breakdown_html(&mut out, a, &ba)?;
        }
    }
    out.push_str("</body></html>\n");
    Ok(out)
}
