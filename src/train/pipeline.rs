//! `dflash train`, the story of a run: plan (every check, before anything is written),
//! open and lock the run directory, find where a resume starts, write the effective
//! configuration, start the recorder, the drafter and the target workers, train on the
//! calling thread, stop the workers, close the trace, write the summary.
//!
//! The rooms: [`super::plan`] (checks, resume point, recorder set-up),
//! [`super::target_worker`], [`super::drafter_loop`], [`super::run_log`] (metrics,
//! console, live summary), [`super::run_dir`] (lock, leftovers, summary) and
//! [`super::error`].
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use tch::Device;

use crate::cuda::{
    self,
    kernel_trace::{self, MergeInput},
};
use crate::model;
use crate::run_files;
use crate::trace::{self, Recorder};

use super::config::TrainConfig;
use super::drafter_loop::DrafterLoop;
use super::error::Standing;
use super::plan::{self, device_name, Plan};
use super::run_dir::{self, Mode, RunDir};
use super::run_log;
use super::target_worker::Workers;

pub use super::error::TrainError;
pub use super::plan::{
    byte_target_dir, default_corpus, default_data, default_target_dir, fixtures_dir, parse_device,
};
pub use super::report::{Eval, RunOptions, RunReport, RunStatus};
pub use super::step::step_seed;

/// SIGINT and SIGTERM set the returned flag to their number; a second one exits at once
/// with 128 + its number (checkpoints are atomic and leftovers are cleaned at the next
/// start, so that is safe).
fn install_signal_handlers() -> Result<Arc<AtomicUsize>, TrainError> {
    let stop = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, armed.clone())
            .map_err(TrainError::Signals)?;
        signal_hook::flag::register(sig, armed.clone()).map_err(TrainError::Signals)?;
        signal_hook::flag::register_usize(sig, stop.clone(), sig as usize)
            .map_err(TrainError::Signals)?;
    }
    Ok(stop)
}

/// Runs a training job. Returns when `steps` (or `stop_after`) are done, on SIGINT/SIGTERM,
/// when a resume has nothing to do, or on the first error of any worker.
pub fn run(cfg: TrainConfig, opts: &RunOptions) -> Result<RunReport, TrainError> {
    let plan = Plan::new(cfg, opts)?;
    for w in &plan.data.warnings {
        eprintln!("warning: {w}");
    }
    let mode = if opts.resume {
        Mode::Resume
    } else {
        Mode::Fresh
    };
    let dir = RunDir::open(&opts.run_dir, mode)?;
    let start = match plan::resume_point(dir.path(), &plan.cfg, opts)? {
        Ok(start) => start,
        Err(nothing_to_do) => return Ok(nothing_to_do),
    };
    if opts.resume && !opts.quiet {
        match &start.from {
            Some(c) => eprintln!("resuming from {}", c.describe()),
            None => eprintln!(
                "{} has no checkpoint yet: starting over from step 0 with its configuration",
                dir.path().display()
            ),
        }
    }
    let standing = Standing::new(dir.path(), plan.cfg.save_checkpoints, start.from.clone());
    dir.write_config(&plan.cfg).map_err(|e| {
        let what = format!("writing {}", dir.file(run_files::CONFIG).display());
        standing.write_failed(what, e)
    })?;
    super::step::set_sync_sections(plan.cfg.sync_sections);
    prepare_kernels(&plan);
    let stop = install_signal_handlers()?;
    let recorder = match opts.trace {
        true => Some(plan::start_recorder(&plan, dir.path())?),
        false => None,
    };
    if recorder.is_some() && plan.cfg.trace_kernels {
        let on_cuda =
            plan.drafter_device.is_cuda() || plan.target_devices.iter().any(|d| d.is_cuda());
        let armed = if on_cuda {
            cuda::capture::arm()
        } else {
            Err("this run has no CUDA device".into())
        };
        if let Err(why) = armed {
            eprintln!("warning: --trace-kernels: {why}; the trace has no kernels");
        }
    }

    // the drafter side, started before the workers so the trace names the thread first
    trace::set_thread_name(&format!("drafter {}", device_name(plan.drafter_device)));
    trace::set_thread_recording(false);
    let stream = match plan.drafter_device {
        Device::Cuda(i) => {
            let s = cuda::use_new_stream(i).map_err(TrainError::Cuda)?;
            trace::bind_gpu(i, "drafter");
            Some(s)
        }
        _ => None,
    };
    // the drafter's init draws from libtorch's global generator: do it before the workers
    // start loading targets (which draw from it too), so a seed gives one drafter
    let drafter = model::new_drafter(
        &plan.drafter_cfg,
        &plan.target_cfg,
        plan.drafter_device,
        plan.cfg.seed as i64,
    )
    .map_err(TrainError::Drafter)?;

    let workers = Workers::start(&plan, start.data_position)?;
    let result = DrafterLoop {
        plan: &plan,
        opts,
        dir: &dir,
        queue: &workers.queue,
        head: &workers.head,
        resume_from: start.from.as_ref(),
        stream: stream.as_ref(),
        recorder: recorder.as_ref(),
        stop: &stop,
    }
    .run(drafter);
    workers.stop(match &result {
        Ok(_) => "training finished".into(),
        Err(e) => e.to_string(),
    });
    let mut report = result?;
    if let Some(rec) = recorder {
        close_trace(rec, &plan, &dir, opts, &mut report)?;
    }
    run_dir::write_summary(dir.path(), &report).map_err(|e| {
        let what = format!("writing {}", dir.file(run_files::SUMMARY).display());
        Standing::new(
            dir.path(),
            plan.cfg.save_checkpoints,
            report.last_checkpoint(),
        )
        .write_failed(what, e)
    })?;
    Ok(report)
}

/// Switches the fused kernels on or off as configured and, on CUDA, compiles them now for
/// each device that runs them (the targets', and the drafter's when its kernels are on),
/// so that a failure is said once before training (everything then runs ATen's kernels).
fn prepare_kernels(plan: &Plan) {
    let (all, drafter) = (
        plan.cfg.fused_kernels,
        plan.cfg.fused_kernels && plan.cfg.fused_drafter_kernels,
    );
    cuda::kernels::set_enabled(all);
    cuda::kernels::set_drafter_enabled(drafter);
    if !all {
        return;
    }
    let mut devices: Vec<Device> = plan.target_devices.clone();
    if drafter && !devices.contains(&plan.drafter_device) {
        devices.push(plan.drafter_device);
    }
    for d in devices {
        if let Device::Cuda(i) = d {
            if let Err(e) = cuda::kernels::prepare(i) {
                eprintln!(
                    "warning: fused kernels unavailable on cuda:{i} ({e}); using ATen's kernels"
                );
                cuda::kernels::set_enabled(false);
                return;
            }
        }
    }
}

/// Stops recording, writes `fidelity.json` in the validation mode, and closes the trace;
/// a trace that could not be written whole is a failed write.
fn close_trace(
    rec: Recorder,
    plan: &Plan,
    dir: &RunDir,
    opts: &RunOptions,
    report: &mut RunReport,
) -> Result<(), TrainError> {
    rec.set_active(false);
    let standing = Standing::new(
        dir.path(),
        plan.cfg.save_checkpoints,
        report.last_checkpoint(),
    );
    if plan.cfg.sync_sections {
        run_log::write_fidelity(&rec, dir.path(), opts.quiet).map_err(|e| match e {
            run_log::FidelityError::Trace(t) => TrainError::Fidelity(t),
            w @ run_log::FidelityError::Write { .. } => {
                standing.write_failed(format!("writing {}", run_files::FIDELITY), w)
            }
        })?;
    }
    let path = rec.path().to_path_buf();
    let (summary, merged) = if cuda::capture::armed() {
        let (activities, dropped) = cuda::capture::take();
        let (tx, rx) = std::sync::mpsc::channel();
        let append: trace::Appender = Box::new(move |view, w| {
            let input = MergeInput {
                pid: view.pid,
                base_clock_ns: view.base_clock_ns,
                gpu_spans: view.gpu_spans.to_vec(),
                threads: view.threads.to_vec(),
                activities,
                dropped,
            };
            dump_capture(&input);
            let _ = tx.send(kernel_trace::merge(&input, w));
        });
        (rec.finish_with(append), rx.recv().ok())
    } else {
        (rec.finish(), None)
    };
    let summary = summary.map_err(|e| {
        standing.write_failed(format!("the trace {} is incomplete", path.display()), e)
    })?;
    report.trace = Some(summary.path);
    report.trace_gpu_cost = Some(summary.gpu_cost).filter(|c| c.spans > 0);
    if let Some(m) = merged {
        if !opts.quiet {
            eprintln!("{}", m.describe());
        }
        let steps = traced_steps(plan, report).max(1) as f64;
        if let Some(c) = report.cuda_per_step.as_mut() {
            c.kernels = Some(m.kernels as f64 / steps);
            c.launch_us = Some(m.launch_ns as f64 / 1e3 / steps);
            c.sync_us = Some(m.sync_ns as f64 / 1e3 / steps);
        }
        report.kernel_trace = Some(m);
    }
    Ok(())
}

/// Drafter steps of the traced window this run did.
fn traced_steps(plan: &Plan, report: &RunReport) -> i64 {
    let (a, b) = plan.window;
    (b.min(report.step) - a.max(report.start_step)).max(0)
}

/// With `DFLASH_KERNEL_DUMP=FILE`: the capture and what the recorder placed, as JSON,
/// for testing the merge on real records (see `src/cuda/kernel_trace`).
fn dump_capture(input: &MergeInput) {
    let Some(path) = std::env::var_os("DFLASH_KERNEL_DUMP") else {
        return;
    };
    let r = std::fs::File::create(&path)
        .map_err(anyhow::Error::from)
        .and_then(|f| {
            let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
            serde_json::to_writer(&mut gz, input)?;
            gz.finish()?;
            Ok(())
        });
    if let Err(e) = r {
        eprintln!("warning: DFLASH_KERNEL_DUMP: {e}");
    }
}
