//! The run log: `metrics.jsonl` (one line per step, only ever appended to; on resume cut
//! back to the resumed step so each step appears once), the console's progress lines,
//! the live per-section summary of traced runs, throughput, and the `fidelity.json` of
//! the validation mode. The trace section names the summary reads are in one place,
//! [`STEP_SECTIONS`].
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::trace::{self, Recorder, TraceError};
use crate::{durable, run_files};

use super::step::StepMetrics;

/// The top-level sections of a drafter step, as the trace names them (in step order).
pub use chrome_trace_format::dflash::DRAFTER_SECTIONS as STEP_SECTIONS;
use chrome_trace_format::dflash::{
    self as names, DRAFTER_PREFIX as DRAFTER, DRAFTER_STEP as STEP, QUEUE_PUT as TARGET_WAIT,
};
/// The queue spans of the drafter side (the wait, then the get).
const DRAFTER_WAITS: [&str; 2] = [names::QUEUE_WAIT, names::QUEUE_GET];

/// `metrics.jsonl`.
pub struct MetricsLog {
    file: File,
    path: PathBuf,
    /// Bytes of complete lines.
    len: u64,
}

impl MetricsLog {
    /// Opens the log, keeping the complete lines of steps `0..next_step` in order and
    /// cutting everything after them (a half-written line, steps a killed run did after
    /// its last checkpoint).
    pub fn open(path: &Path, next_step: i64) -> io::Result<MetricsLog> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut text = Vec::new();
        file.read_to_end(&mut text)?;
        let keep = kept_prefix(&text, next_step);
        if keep < text.len() {
            file.set_len(keep as u64)?;
            file.sync_all()?;
        }
        Ok(MetricsLog {
            file,
            path: path.into(),
            len: keep as u64,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line (one `write`, so a kill leaves whole lines or one cut line). A
    /// line that could not be written whole (a full disk) is cut off again.
    pub fn append(&mut self, line: &serde_json::Value) -> io::Result<()> {
        let mut s = line.to_string();
        s.push('\n');
        match self.file.write_all(s.as_bytes()) {
            Ok(()) => {
                self.len += s.len() as u64;
                Ok(())
            }
            Err(e) => {
                let _ = self.file.set_len(self.len);
                Err(e)
            }
        }
    }

    /// Makes the lines written so far durable (before a checkpoint names them done).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Length of the prefix of `text` made of complete lines for steps 0, 1, ... up to
/// `next_step - 1`, in order.
fn kept_prefix(text: &[u8], next_step: i64) -> usize {
    let mut keep = 0;
    let mut want = 0i64;
    while want < next_step {
        let Some(end) = text[keep..].iter().position(|&b| b == b'\n') else {
            break;
        };
        let step = serde_json::from_slice::<serde_json::Value>(&text[keep..keep + end])
            .ok()
            .and_then(|v| v["step"].as_i64());
        if step != Some(want) {
            break;
        }
        keep += end + 1;
        want += 1;
    }
    keep
}

/// One step as the log records it.
pub struct StepRecord {
    pub step: i64,
    pub metrics: StepMetrics,
    pub lr: f64,
    pub elapsed: Duration,
    pub queue_wait: Duration,
}

impl StepRecord {
    fn json(&self) -> serde_json::Value {
        let m = &self.metrics;
        serde_json::json!({"step": self.step, "loss": m.loss, "accuracy": m.accuracy, "tau_hat": m.tau_hat,
            "lr": self.lr, "tokens": m.tokens, "step_ms": self.elapsed.as_secs_f64() * 1e3,
            "queue_wait_ms": self.queue_wait.as_secs_f64() * 1e3, "grad_norm": m.grad_norm})
    }
}

/// Progress lines every `log_every` steps, throughput over the steps after warm-up.
pub struct Console {
    pub quiet: bool,
    pub log_every: i64,
    pub steps: i64,
    /// Since the last progress line: start, tokens, queue wait.
    window: (Instant, i64, Duration),
    /// Steps this process ran: the first two (allocator warm-up and kernel selection) are
    /// not timed, in a resumed run as in a fresh one.
    seen: i64,
    /// The timed steps (all but the first `WARMUP_STEPS` seen): time, tokens.
    timed: (Duration, i64),
}

impl Console {
    pub fn new(quiet: bool, log_every: i64, steps: i64) -> Self {
        Self {
            quiet,
            log_every,
            steps,
            window: (Instant::now(), 0, Duration::ZERO),
            seen: 0,
            timed: (Duration::ZERO, 0),
        }
    }

    /// Counts a step, and prints the progress line when one is due (every `log_every`
    /// steps and at `end`).
    fn step(&mut self, r: &StepRecord, end: i64) {
        let m = &r.metrics;
        self.seen += 1;
        if self.seen > WARMUP_STEPS {
            self.timed.0 += r.elapsed;
            self.timed.1 += m.tokens;
        }
        self.window.1 += m.tokens;
        self.window.2 += r.queue_wait;
        let done = r.step + 1;
        if self.quiet || (done % self.log_every.max(1) != 0 && done != end) {
            return;
        }
        let secs = self.window.0.elapsed().as_secs_f64();
        eprintln!(
            "step {:>6}/{}  loss {:.4}  acc {:.3}  tau {:.2}  lr {:.2e}  {:.0} tok/s  queue wait {:.0}%",
            done,
            self.steps,
            m.loss,
            m.accuracy,
            m.tau_hat,
            r.lr,
            self.window.1 as f64 / secs,
            100.0 * self.window.2.as_secs_f64() / secs
        );
        self.window = (Instant::now(), 0, Duration::ZERO);
    }

    /// How many steps the throughput figures cover.
    pub fn timed_steps(&self) -> i64 {
        (self.seen - WARMUP_STEPS).max(0)
    }

    /// Tokens per second and mean step time (ms) over the timed steps; `None` when this
    /// process ran no step past the warm-up.
    pub fn throughput(&self) -> Option<(f64, f64)> {
        let (t, tokens) = self.timed;
        let n = self.timed_steps();
        if n == 0 || t == Duration::ZERO {
            return None;
        }
        let secs = t.as_secs_f64();
        Some((tokens as f64 / secs, secs * 1e3 / n as f64))
    }
}

/// Steps at the start of each process that throughput figures leave out.
pub const WARMUP_STEPS: i64 = 2;

/// The metrics file and the console of one run.
pub struct RunLog {
    pub metrics: MetricsLog,
    pub console: Console,
}

impl RunLog {
    /// Records a finished step: a metrics line (the error is the write's), then the
    /// console's progress line when due.
    pub fn step(&mut self, r: &StepRecord, end: i64) -> io::Result<()> {
        self.metrics.append(&r.json())?;
        self.console.step(r, end);
        Ok(())
    }
}

/// One line: share of the step per top-level drafter section, queue waits on both sides,
/// GPU vs CPU time of the step, from the recorder's totals since the last line.
pub fn live_summary(stats: &trace::Stats, layers: usize, tokens_per_step: i64) -> Option<String> {
    let get = |n: &str| stats.names.iter().find(|s| &*s.text == n);
    // no step drained yet (the writer takes up to 100 ms): nothing to say
    get(STEP).filter(|s| s.count > 0 && s.cpu_ns > 0)?;
    let step_cpu = get(STEP).map_or(0, |s| s.cpu_ns).max(1) as f64;
    let steps = get(STEP).map_or(0, |s| s.count).max(1) as f64;
    let mut parts: Vec<(String, u64)> = STEP_SECTIONS
        .iter()
        .filter_map(|n| get(n).map(|s| (n.trim_start_matches(DRAFTER).to_string(), s.cpu_ns)))
        .collect();
    let layer_ns: u64 = (0..layers)
        .filter_map(|i| get(&names::layer(i)))
        .map(|s| s.cpu_ns)
        .sum();
    parts.push(("layers".into(), layer_ns));
    parts.sort_by_key(|p| std::cmp::Reverse(p.1));
    let shares: Vec<String> = parts
        .iter()
        .take(6)
        .map(|(n, ns)| format!("{n} {:.0}%", 100.0 * *ns as f64 / step_cpu))
        .collect();
    let wait = |n: &str| get(n).map_or(0.0, |s| s.cpu_ns as f64 / 1e6 / steps);
    let gpu: u64 = stats
        .names
        .iter()
        .filter(|s| names::is_drafter_section(&s.text))
        .map(|s| s.gpu_ns)
        .sum();
    let gpu_part = if gpu > 0 {
        format!("  gpu/cpu {:.2}", gpu as f64 / step_cpu)
    } else {
        String::new()
    };
    Some(format!(
        "  profile: step {:.1} ms ({:.0} tok/s) = {}  | queue wait: drafter {:.1} ms, target {:.1} ms per step{}",
        step_cpu / 1e6 / steps,
        tokens_per_step as f64 / (step_cpu / 1e9 / steps),
        shares.join(", "),
        DRAFTER_WAITS.iter().map(|n| wait(n)).sum::<f64>(),
        wait(TARGET_WAIT),
        gpu_part
    ))
}

/// Why `fidelity.json` could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    #[error("{0}")]
    Trace(#[from] TraceError),
    #[error("{}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
}

/// Validation mode: compares, per section, the mean CUDA-event GPU time with the mean
/// time measured by synchronizing the stream around the section, and writes
/// `RUN_DIR/fidelity.json`. Agreement: within 5%, or 20 us for tiny sections.
pub fn write_fidelity(rec: &Recorder, run_dir: &Path, quiet: bool) -> Result<(), FidelityError> {
    rec.flush()?;
    // GPU events resolve on the writer thread shortly after they complete
    std::thread::sleep(Duration::from_millis(600));
    rec.flush()?;
    let stats = rec.stats_snapshot();
    let sync = super::step::take_sync_times();
    let mut rows = Vec::new();
    for (name, (count, total)) in &sync {
        let Some(s) = stats.names.iter().find(|s| &*s.text == name.as_str()) else {
            continue;
        };
        if s.gpu_count == 0 {
            continue;
        }
        let sync_us = *total as f64 / *count as f64 / 1e3;
        let gpu_us = s.gpu_ns as f64 / s.gpu_count as f64 / 1e3;
        let diff = gpu_us - sync_us;
        let ok = diff.abs() <= (0.05 * sync_us).max(20.0);
        rows.push(serde_json::json!({"name": name, "n_sync": count, "n_gpu": s.gpu_count, "sync_us": sync_us,
            "gpu_event_us": gpu_us, "diff_us": diff, "diff_pct": 100.0 * diff / sync_us.max(1e-9), "agrees": ok}));
        if !quiet {
            eprintln!("fidelity {name:<28} sync {sync_us:>10.1} us  events {gpu_us:>10.1} us  diff {diff:>+8.1} us  {}", if ok { "ok" } else { "OUTSIDE" });
        }
    }
    let path = run_dir.join(run_files::FIDELITY);
    let text = serde_json::to_string_pretty(&rows).expect("serializes");
    durable::write_file(&path, text.as_bytes())
        .map_err(|source| FidelityError::Write { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(step: i64) -> String {
        format!("{{\"step\":{step},\"loss\":1.0}}\n")
    }

    #[test]
    fn metrics_are_cut_back_to_the_resumed_step() {
        let full: String = (0..6).map(line).collect();
        let four: String = (0..4).map(line).collect();
        assert_eq!(kept_prefix(full.as_bytes(), 4), four.len());
        assert_eq!(kept_prefix(full.as_bytes(), 10), full.len());
        // a half-written last line goes
        let cut = format!("{}{}", line(0), "{\"step\":1,\"lo");
        assert_eq!(kept_prefix(cut.as_bytes(), 5), line(0).len());
        // two runs interleaved: only the first, in order, stays
        let mixed: String = [0, 1, 2, 0, 1].into_iter().map(line).collect();
        assert_eq!(kept_prefix(mixed.as_bytes(), 5), 3 * line(0).len());

        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("metrics.jsonl");
        std::fs::write(&p, &full).unwrap();
        let mut log = MetricsLog::open(&p, 3).unwrap();
        log.append(&serde_json::json!({"step": 3, "loss": 2.0}))
            .unwrap();
        let steps: Vec<i64> = std::fs::read_to_string(&p)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        assert_eq!(steps, [0, 1, 2, 3]);
    }

    #[test]
    fn throughput_leaves_out_each_process_s_first_two_steps() {
        let record = |step: i64, ms: u64, tokens: i64| StepRecord {
            step,
            metrics: StepMetrics {
                loss: 1.0,
                accuracy: 0.0,
                tau_hat: 1.0,
                tokens,
                grad_norm: 0.0,
            },
            lr: 1e-3,
            elapsed: Duration::from_millis(ms),
            queue_wait: Duration::ZERO,
        };
        // a resume at step 100: its first two steps are warm-up, like a fresh run's
        let mut c = Console::new(true, 1, 105);
        for (i, ms) in [500, 300, 10, 20, 30].into_iter().enumerate() {
            c.step(&record(100 + i as i64, ms, 100), 105);
        }
        assert_eq!(c.timed_steps(), 3);
        let (tok_s, ms) = c.throughput().unwrap();
        // 300 tokens in 60 ms
        assert!((tok_s - 5000.0).abs() < 1e-6, "{tok_s}");
        assert!((ms - 20.0).abs() < 1e-9, "{ms}");
        // two steps: nothing timed, not '0 tokens/s'
        let mut short = Console::new(true, 1, 2);
        short.step(&record(0, 5, 100), 2);
        short.step(&record(1, 5, 100), 2);
        assert_eq!(short.throughput(), None);
        assert_eq!(short.timed_steps(), 0);
    }

    #[test]
    fn the_live_summary_shares_the_step_by_section() {
        let stat = |text: &str, count: u64, cpu_ns: u64| trace::NameStats {
            name: trace::intern(text),
            text: text.into(),
            count,
            cpu_ns,
            gpu_count: 0,
            gpu_ns: 0,
        };
        let stats = trace::Stats {
            names: vec![
                stat("drafter.step", 2, 20_000_000),
                stat("drafter.backward", 2, 10_000_000),
                stat("drafter.layer.0", 2, 4_000_000),
                stat("drafter.layer.1", 2, 2_000_000),
                stat("queue.get", 2, 1_000_000),
                stat("queue.put", 2, 3_000_000),
            ],
            ..Default::default()
        };
        let s = live_summary(&stats, 2, 1000).expect("two steps drained");
        // 10 ms a step, 1000 tokens: 100000 tok/s; backward 50%, the layers 30%
        assert!(
            s.starts_with("  profile: step 10.0 ms (100000 tok/s) = backward 50%, layers 30%"),
            "{s}"
        );
        assert!(
            s.ends_with("queue wait: drafter 0.5 ms, target 1.5 ms per step"),
            "{s}"
        );
        // before the writer drained a step there is no line (not 'step 0.0 ms')
        let none = trace::Stats {
            names: vec![stat("drafter.backward", 1, 1_000_000)],
            ..Default::default()
        };
        assert_eq!(live_summary(&none, 2, 1000), None);
    }
}
