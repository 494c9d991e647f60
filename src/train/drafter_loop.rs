//! The drafter worker (the calling thread): builds the trainer around the target's frozen
//! embedding and lm_head, restores a checkpoint on resume, then takes hidden states off
//! the queue and trains, step by step, saving checkpoints on the step and time intervals
//! and at the end, stopping at the end, at `--stop-after` or on SIGINT/SIGTERM. A finished
//! run exports the drafter. Every write is checked; a failure names where the run stands.
use chrome_trace_format::dflash as names;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

use crate::cuda;
use crate::model::{self, objective, LoadedDrafter};
use crate::run_files;
use crate::trace::{self, Recorder};
use crate::trace_name;

use super::checkpoint::{self, Checkpoint, RunState};
use super::data;
use super::error::{Standing, TrainError};
use super::optim::{lr_at, AdamWConfig};
use super::plan::{compute_kind, Plan};
use super::queue::HiddenQueue;
use super::report::{Eval, RunOptions, RunReport, RunStatus};
use super::run_dir::RunDir;
use super::run_log::{self, Console, MetricsLog, RunLog, StepRecord};
use super::step::{step_seed, Batch, DrafterTrainer, Prepared, StepConfig};
use super::target_worker::{injected_fault, Item, TargetHead};

/// Everything the drafter side works with.
pub(super) struct DrafterLoop<'a> {
    pub plan: &'a Plan,
    pub opts: &'a RunOptions,
    pub dir: &'a RunDir,
    pub queue: &'a HiddenQueue<Item>,
    pub head: &'a crossbeam_channel::Receiver<TargetHead>,
    /// The checkpoint a resume continues from.
    pub resume_from: Option<&'a Checkpoint>,
    /// The drafter's CUDA stream.
    pub stream: Option<&'a cuda::Stream>,
    pub recorder: Option<&'a Recorder>,
    /// 0, or the signal that asked to stop.
    pub stop: &'a AtomicUsize,
}

/// The state of a run in progress.
struct Progress {
    /// The allocator's statistics and our host syncs at the previous traced step's end.
    cuda_last: Option<(cuda::activity::AllocatorStats, u64)>,
    state: RunState,
    /// Where the run stands, for the message of a failed write.
    standing: Standing,
    last_save: Instant,
    report: RunReport,
}

impl DrafterLoop<'_> {
    /// Trains `drafter` until the end, `--stop-after` or a signal.
    pub fn run(&self, drafter: LoadedDrafter) -> Result<RunReport, TrainError> {
        let cfg = &self.plan.cfg;
        let mut trainer = self.trainer(drafter)?;
        let mut state = RunState {
            step: 0,
            data_position: 0,
        };
        if let Some(c) = self.resume_from {
            state = checkpoint::restore(&c.dir, &mut trainer).map_err(TrainError::Resume)?;
        }
        let standing = Standing::new(
            self.dir.path(),
            cfg.save_checkpoints,
            self.resume_from.cloned(),
        );
        let mut p = Progress {
            cuda_last: None,
            state,
            standing,
            last_save: Instant::now(),
            report: RunReport {
                start_step: state.step,
                steps: cfg.steps,
                ..Default::default()
            },
        };
        let heldout = heldout_batches(self.plan, 8);
        if state.step == 0 && !heldout.is_empty() {
            p.report.heldout_before = Some(evaluate(self.plan, &trainer, &heldout)?);
        }
        let path = self.dir.file(run_files::METRICS);
        let metrics = MetricsLog::open(&path, state.step).map_err(|e| {
            p.standing
                .write_failed(format!("writing {}", path.display()), e)
        })?;
        let mut log = RunLog {
            metrics,
            console: Console::new(self.opts.quiet, cfg.log_every, cfg.steps),
        };
        self.train(&mut trainer, &mut p, &mut log)?;
        self.finish(&trainer, &mut p, &log)?;
        trace::set_thread_recording(false);
        if !heldout.is_empty() && !p.report.stopped_by_signal {
            p.report.heldout_after = Some(evaluate(self.plan, &trainer, &heldout)?);
        }
        Ok(p.report)
    }

    /// The trainer, once worker 0 has sent the target's head.
    fn trainer(&self, d: LoadedDrafter) -> Result<DrafterTrainer, TrainError> {
        let cfg = &self.plan.cfg;
        let head = match self.head.recv() {
            Ok(h) => h,
            // worker 0 failed before it could send: its error is on the queue
            Err(_) => {
                return Err(match self.queue.get() {
                    Err(e) => TrainError::WorkerStart(e),
                    _ => TrainError::WorkerGone,
                })
            }
        };
        let step_cfg = StepConfig {
            num_anchors: cfg.num_anchors,
            gamma: if cfg.gamma > 0.0 {
                cfg.gamma
            } else {
                objective::default_gamma(cfg.block_size)
            },
            chunk_blocks: cfg.chunk_blocks,
            attn_group_blocks: cfg.attn_group_blocks,
            attn_batch_blocks: cfg.effective_batch_blocks(),
            fused_loss: cfg.fused_loss,
            grad_clip: cfg.grad_clip,
        };
        let adamw = AdamWConfig {
            weight_decay: cfg.weight_decay,
            ..Default::default()
        };
        let kind = compute_kind(self.plan.drafter_device);
        DrafterTrainer::new(
            d.model,
            d.vs,
            &head.embed,
            &head.lm_head,
            kind,
            step_cfg,
            adamw,
        )
        .map_err(TrainError::Drafter)
    }

    /// The step loop.
    fn train(
        &self,
        trainer: &mut DrafterTrainer,
        p: &mut Progress,
        log: &mut RunLog,
    ) -> Result<(), TrainError> {
        let cfg = &self.plan.cfg;
        let (window, end) = (self.plan.window, self.end());
        let warmup = (cfg.steps as f64 * cfg.warmup_ratio).round() as i64;
        let fail_at = injected_fault("drafter");
        // the next step's batch and inputs, prepared while this step ran on the GPU
        let mut ahead: Option<Ahead> = None;
        while p.state.step < end {
            if fail_at.is_some_and(|n| p.state.step as u64 >= n) {
                return Err(TrainError::InjectedFault);
            }
            let sig = self.stop.load(Ordering::Relaxed) as i32;
            if sig != 0 {
                p.report.stopped_by_signal = true;
                p.report.signal_number = Some(sig);
                p.report.signal = Some(signal_name(sig));
                break;
            }
            let step = p.state.step;
            trace::set_thread_recording((window.0..window.1).contains(&step));
            if (window.0..window.1).contains(&step) {
                cuda::capture::enter_window();
            } else if step >= window.1 {
                cuda::capture::leave_window();
            }
            let t0 = Instant::now();
            let profiler_step = trace::step_span(step as u64);
            let Ahead {
                item,
                queue_wait,
                prep,
            } = match ahead.take() {
                Some(a) => a,
                None => self.ahead(trainer, step)?,
            };
            let lr = lr_at(step, cfg.steps, warmup, cfg.lr);
            let metrics = {
                let mut span = trace::span(trace_name!(names::DRAFTER_STEP));
                let launched = guard_oom(step, || trainer.launch_step(&prep, lr))?;
                let pending = guard_oom(step, || trainer.send_metrics(launched, &item.batch))?;
                drop(prep);
                // the next step's batch and inputs, while the GPU runs this one's backward;
                // traced (inside this step's span) when the next step is
                if step + 1 < end {
                    trace::set_thread_recording((window.0..window.1).contains(&(step + 1)));
                    let next = self.ahead(trainer, step + 1);
                    trace::set_thread_recording((window.0..window.1).contains(&step));
                    ahead = Some(next?);
                }
                let m = guard_oom(step, || pending.wait_traced())?;
                span.arg(names::args::STEP, step as u64);
                span.arg(names::args::TOKENS, m.tokens as u64);
                span.arg(names::args::LOSS, m.loss);
                m
            };
            drop(profiler_step);
            drop(item);
            if (window.0..window.1).contains(&step) {
                self.cuda_counters(p);
            }
            if !metrics.loss.is_finite() {
                return Err(TrainError::LossNotFinite {
                    loss: metrics.loss,
                    step,
                });
            }
            p.state.step += 1;
            p.state.data_position += 1;
            p.report.losses.push(metrics.loss);
            let record = StepRecord {
                step,
                metrics,
                lr,
                elapsed: t0.elapsed(),
                queue_wait,
            };
            log.step(&record, end).map_err(|e| {
                let what = format!("writing {}", log.metrics.path().display());
                p.standing.write_failed(what, e)
            })?;
            self.live_summary(trainer, step, metrics.tokens, p);
            if self.checkpoint_due(p) && p.state.step < end {
                self.save(trainer, p, &log.metrics)?;
            }
        }
        Ok(())
    }

    /// After a traced step on CUDA: the caching allocator's statistics and our host
    /// syncs as trace counters (`cuda.allocator`, `cuda.host_syncs`, per-step deltas for
    /// the counts), summed into the report.
    fn cuda_counters(&self, p: &mut Progress) {
        let tch::Device::Cuda(d) = self.plan.drafter_device else {
            return;
        };
        if self.recorder.is_none() {
            return;
        }
        let Ok(now) = cuda::activity::allocator_stats(d) else {
            return;
        };
        let syncs = super::step::host_syncs();
        let Some((last, last_syncs)) = p.cuda_last.replace((now, syncs)) else {
            return;
        };
        let allocs = now.device_allocs - last.device_allocs;
        let frees = now.device_frees - last.device_frees;
        let step_syncs = syncs - last_syncs;
        let name = trace_name!(names::CUDA_ALLOCATOR);
        trace::counter(
            name,
            names::args::ALLOCATED_BYTES,
            now.allocated_bytes as f64,
        );
        trace::counter(name, names::args::RESERVED_BYTES, now.reserved_bytes as f64);
        trace::counter(name, names::args::DEVICE_ALLOCS, allocs as f64);
        trace::counter(name, names::args::DEVICE_FREES, frees as f64);
        trace::counter(
            name,
            names::args::ALLOC_RETRIES,
            (now.alloc_retries - last.alloc_retries) as f64,
        );
        trace::counter(name, names::args::OOMS, (now.ooms - last.ooms) as f64);
        trace::counter(
            trace_name!(names::CUDA_HOST_SYNCS),
            names::args::SYNCS,
            step_syncs as f64,
        );
        let c = p.report.cuda_per_step.get_or_insert_with(Default::default);
        let n = c.steps as f64;
        let mean = |old: f64, x: f64| (old * n + x) / (n + 1.0);
        c.device_allocs = mean(c.device_allocs, allocs as f64);
        c.device_frees = mean(c.device_frees, frees as f64);
        c.host_syncs = mean(c.host_syncs, step_syncs as f64);
        c.alloc_retries += now.alloc_retries - last.alloc_retries;
        c.ooms += now.ooms - last.ooms;
        c.allocated_bytes = now.allocated_bytes;
        c.reserved_bytes = now.reserved_bytes;
        c.steps += 1;
    }

    /// Step `step`'s batch from the queue and its inputs prepared on the drafter's device
    /// ([`DrafterTrainer::prepare`], anchors from the step's own seed).
    fn ahead(&self, trainer: &DrafterTrainer, step: i64) -> Result<Ahead, TrainError> {
        let (item, queue_wait) = self.next_item()?;
        if let (Some(ev), Some(s)) = (&item.ready, self.stream) {
            s.wait_event(ev).map_err(TrainError::Gpu)?;
            cuda::record_stream(&item.batch.features, s).map_err(TrainError::Gpu)?;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(step_seed(self.plan.cfg.seed, step));
        let prep = guard_oom(step, || trainer.prepare(&item.batch, &mut rng))?;
        Ok(Ahead {
            item,
            queue_wait,
            prep,
        })
    }

    /// The step this run stops at: the end, or `--stop-after`.
    fn end(&self) -> i64 {
        let steps = self.plan.cfg.steps;
        self.opts.stop_after.map_or(steps, |s| s.min(steps))
    }

    /// The next batch's hidden states and the time spent waiting for them. The wait and
    /// the get are separate spans so the flow from `queue.put` always lands on a span that
    /// starts after the put began.
    fn next_item(&self) -> Result<(Item, Duration), TrainError> {
        let wait = {
            let _w = trace::queue_span(trace_name!(names::QUEUE_WAIT));
            self.queue.wait_ready()
        };
        let mut span = trace::queue_span(trace_name!(names::QUEUE_GET));
        let Some((item, info)) = self.queue.get()? else {
            return Err(TrainError::WorkersStopped);
        };
        if let Some(flow) = item.flow {
            span.flow_in(flow);
        }
        let wait = wait + info.wait;
        span.arg(names::args::WAIT_US, wait.as_secs_f64() * 1e6);
        span.arg(names::args::DEPTH, info.depth as u64);
        span.arg(names::args::BATCH, item.batch.index);
        trace::counter(
            trace_name!(names::QUEUE_COUNTER),
            names::QUEUE_DEPTH,
            info.depth as f64,
        );
        Ok((item, wait))
    }

    /// Prints the live per-section summary of traced steps when one is due.
    fn live_summary(&self, trainer: &DrafterTrainer, step: i64, tokens: i64, p: &Progress) {
        let cfg = &self.plan.cfg;
        let (a, b) = self.plan.window;
        let Some(rec) = self.recorder else {
            return;
        };
        if cfg.summary_every > 0
            && !cfg.sync_sections
            && (a..b).contains(&step)
            && (step + 1) % cfg.summary_every == 0
            && !self.opts.quiet
        {
            let layers = trainer.drafter.layers.len();
            let cuda = p
                .report
                .cuda_per_step
                .as_ref()
                .map(|c| format!("  {}", c.describe()))
                .unwrap_or_default();
            if let Some(line) = run_log::live_summary(&rec.stats_snapshot(), layers, tokens) {
                eprintln!("{line}{cuda}");
            }
        }
    }

    /// A checkpoint is due every `checkpoint_every` steps and `checkpoint_minutes`
    /// minutes (each when set).
    fn checkpoint_due(&self, p: &Progress) -> bool {
        let cfg = &self.plan.cfg;
        let by_step = cfg.checkpoint_every > 0 && p.state.step % cfg.checkpoint_every == 0;
        let by_time = cfg.checkpoint_minutes > 0.0
            && p.last_save.elapsed().as_secs_f64() >= cfg.checkpoint_minutes * 60.0;
        cfg.save_checkpoints && (by_step || by_time)
    }

    /// Saves a checkpoint of the current state, the metrics before it made durable.
    fn save(
        &self,
        trainer: &DrafterTrainer,
        p: &mut Progress,
        metrics: &MetricsLog,
    ) -> Result<(), TrainError> {
        let what = format!("checkpoint of step {} not written", p.state.step);
        metrics
            .sync()
            .map_err(|e| p.standing.write_failed(what.clone(), e))?;
        let keep = self.plan.cfg.keep_checkpoints as usize;
        let c = checkpoint::save(self.dir.path(), trainer, p.state, keep)
            .map_err(|e| p.standing.write_failed(what, e))?;
        p.standing.last = Some(c);
        p.last_save = Instant::now();
        Ok(())
    }

    /// After the loop: the final checkpoint (unless the last one is of this step), the
    /// drafter export of a finished run, the report's figures.
    fn finish(
        &self,
        trainer: &DrafterTrainer,
        p: &mut Progress,
        log: &RunLog,
    ) -> Result<(), TrainError> {
        let cfg = &self.plan.cfg;
        let done = p.state.step - p.report.start_step;
        (p.report.tokens_per_s, p.report.mean_step_ms) =
            log.console.throughput().unwrap_or((0.0, 0.0));
        p.report.timed_steps = log.console.timed_steps();
        p.report.steps_done = done;
        p.report.step = p.state.step;
        let finished = p.state.step == cfg.steps;
        log.metrics.sync().map_err(|e| {
            let what = format!("writing {}", log.metrics.path().display());
            p.standing.write_failed(what, e)
        })?;
        if cfg.save_checkpoints {
            if p.standing.last.as_ref().map(|c| c.step) != Some(p.state.step) {
                self.save(trainer, p, &log.metrics)?;
            }
            if finished {
                let out = self.dir.file(run_files::DRAFTER);
                model::save_drafter(&trainer.vs, &trainer.drafter.cfg, &out).map_err(|e| {
                    let what = format!(
                        "training finished but the drafter was not exported to {}",
                        out.display()
                    );
                    p.standing.write_failed(what, e)
                })?;
                p.report.drafter = Some(out);
            }
        }
        p.report.checkpoint = p.standing.last.as_ref().map(|c| c.dir.clone());
        p.report.status = if finished {
            RunStatus::Finished
        } else {
            RunStatus::Stopped
        };
        if p.report.stopped_by_signal && !self.opts.quiet {
            let saved = if cfg.save_checkpoints {
                "checkpoint saved"
            } else {
                "no checkpoint (save_checkpoints is off)"
            };
            eprintln!(
                "stopped by {} after step {}; {saved}: continue with --resume {}",
                p.report.signal.as_deref().unwrap_or("a signal"),
                p.state.step,
                self.dir.path().display()
            );
        }
        Ok(())
    }
}

pub(super) fn signal_name(sig: i32) -> String {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT".into(),
        signal_hook::consts::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

fn heldout_batches(plan: &Plan, max: usize) -> Vec<data::HostBatch> {
    let seqs: Vec<&data::Sequence> = plan.data.heldout.iter().collect();
    let per = (plan.cfg.batch_tokens / plan.cfg.seq_len).max(1);
    seqs.chunks(per)
        .take(max)
        .enumerate()
        .map(|(i, c)| data::collate(c, plan.pad, i as u64))
        .collect()
}

/// Loss, accuracy and tau_hat on held-out batches, with a target loaded on the drafter's
/// device (anchors drawn with a fixed seed, so before/after figures are comparable).
fn evaluate(
    plan: &Plan,
    trainer: &DrafterTrainer,
    batches: &[data::HostBatch],
) -> Result<Eval, TrainError> {
    let target = plan
        .source
        .load(trainer.device, trainer.kind)
        .map_err(TrainError::Step)?;
    let taps = &plan.drafter_cfg.target_layer_ids;
    let mut sum = Eval::default();
    let mut rng = ChaCha8Rng::seed_from_u64(12345);
    for b in batches {
        let ids = b.input_ids.to_device(trainer.device);
        let out =
            tch::no_grad(|| target.model.forward(&ids, taps, false)).map_err(TrainError::Step)?;
        let batch = Batch {
            input_ids: b.input_ids.shallow_clone(),
            loss_mask: b.loss_mask.shallow_clone(),
            features: Tensor::cat(&out.hidden, -1),
            index: b.index,
        };
        let m = trainer
            .evaluate(&batch, &mut rng)
            .map_err(TrainError::Step)?;
        sum.loss += m.loss;
        sum.accuracy += m.accuracy;
        sum.tau_hat += m.tau_hat;
    }
    let n = batches.len() as f64;
    Ok(Eval {
        loss: sum.loss / n,
        accuracy: sum.accuracy / n,
        tau_hat: sum.tau_hat / n,
    })
}

/// A step's batch, taken from the queue, and its prepared inputs.
struct Ahead {
    item: Item,
    queue_wait: Duration,
    prep: Prepared,
}

/// Runs one step, turning libtorch's out-of-memory error (returned, or raised as a panic
/// by tch's unchecked calls) into a one-line usage error; other panics go on unwinding.
fn guard_oom<T>(
    step: i64,
    f: impl FnOnce() -> Result<T, crate::model::ModelError>,
) -> Result<T, TrainError> {
    let oom = |text: &str| {
        text.contains("out of memory")
            .then(|| TrainError::OutOfMemory {
                step,
                message: oom_line(text),
            })
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(oom(&e.to_string()).unwrap_or(TrainError::Step(e))),
        Err(payload) => {
            let text = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            match oom(&text) {
                Some(e) => Err(e),
                None => std::panic::resume_unwind(payload),
            }
        }
    }
}

/// The first sentence of libtorch's out-of-memory message ("CUDA out of memory. Tried to
/// allocate 246.00 MiB").
pub(crate) fn oom_line(text: &str) -> String {
    let start = text
        .find("out of memory")
        .map_or(0, |i| text[..i].rfind(['"', '(']).map_or(0, |j| j + 1));
    let rest = &text[start..];
    let end = rest.match_indices(". ").nth(1).map_or(
        rest.find('\n').unwrap_or(rest.len()).min(rest.len()),
        |(i, _)| i,
    );
    rest[..end].trim().to_string()
}

#[cfg(test)]
mod oom_tests {
    use super::*;

    #[test]
    fn an_out_of_memory_panic_becomes_a_one_line_usage_error() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let msg = "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. \
                   Tried to allocate 246.00 MiB. GPU 0 has a total capacity of 79.18 GiB\nException\")";
        let r: Result<(), _> = guard_oom(7, || panic!("{msg}"));
        let other = std::panic::catch_unwind(|| guard_oom::<()>(1, || panic!("something else")));
        std::panic::set_hook(hook);
        let e = r.unwrap_err();
        assert!(e.is_usage());
        let line = e.to_string();
        assert!(
            line.starts_with(
                "out of device memory at step 7: CUDA out of memory. Tried to allocate 246.00 MiB;"
            ),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        assert!(other.is_err(), "other panics keep unwinding");
    }
}
