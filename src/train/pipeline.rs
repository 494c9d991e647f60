//! `dflash train`: target worker threads feed the hidden-state queue, the drafter worker
//! (the calling thread) trains from it. Everything that can be checked is checked before
//! any training work starts; errors found then are [`TrainError::Setup`] (exit code 2).
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::cuda;
use crate::model::{
    self, objective, DrafterConfig, LayerType, ModelError, Qwen3Config, Qwen3ConfigFile,
};
use crate::trace::{self, Recorder, RecorderConfig};
use crate::trace_name;
use crate::{durable, run_files};

use super::checkpoint::{self, Checkpoint, RunState};
use super::config::TrainConfig;
use super::data::{self, bytes, Dataset, Loader};
use super::memory;
use super::optim::{lr_at, AdamWConfig};
use super::queue::{HiddenQueue, QueueError};
use super::run_dir::{self, MetricsLog, RunDir};
use super::step::{Batch, DrafterTrainer, StepConfig, StepMetrics};

/// Failures of a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Found before training started, or a problem the user must fix (bad path, config,
    /// device, full disk): exit code 2.
    #[error("{0}")]
    Setup(String),
    #[error("training failed: {0}")]
    Runtime(String),
}

impl TrainError {
    fn setup(e: impl std::fmt::Display) -> Self {
        Self::Setup(e.to_string())
    }
    fn runtime(e: impl std::fmt::Display) -> Self {
        Self::Runtime(e.to_string())
    }
}

/// How to run, beyond the configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub run_dir: PathBuf,
    /// Write `RUN_DIR/trace.json`.
    pub trace: bool,
    /// Continue from the run directory's latest checkpoint.
    pub resume: bool,
    /// Save and stop once this many steps are done (the schedule still spans `steps`).
    pub stop_after: Option<i64>,
    /// No progress lines.
    pub quiet: bool,
}

/// Held-out evaluation figures.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Eval {
    pub loss: f64,
    pub accuracy: f64,
    pub tau_hat: f64,
}

/// Where a run ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// All `steps` done, the drafter exported.
    #[default]
    Finished,
    /// Stopped before the end (a signal or `--stop-after`); continue with `--resume`.
    Stopped,
    /// A resume found nothing to do (finished, or already at `--stop-after`); nothing
    /// was changed.
    AlreadyDone,
}

/// What a run did (`RUN_DIR/summary.json`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunReport {
    pub status: RunStatus,
    /// Steps done in all, where the run stands.
    pub step: i64,
    /// Steps the run is planned for.
    pub steps: i64,
    pub start_step: i64,
    pub steps_done: i64,
    pub losses: Vec<f64>,
    pub tokens_per_s: f64,
    pub mean_step_ms: f64,
    pub heldout_before: Option<Eval>,
    pub heldout_after: Option<Eval>,
    pub stopped_by_signal: bool,
    /// The signal that stopped the run ("SIGINT", "SIGTERM").
    pub signal: Option<String>,
    #[serde(skip)]
    pub signal_number: Option<i32>,
    /// The last complete checkpoint.
    pub checkpoint: Option<PathBuf>,
    /// The exported drafter (finished runs).
    pub drafter: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// What GPU-timed spans cost the workers' CPU (traced CUDA runs).
    pub trace_gpu_cost: Option<trace::GpuTimingCost>,
}

impl RunReport {
    /// The last complete checkpoint, if the run saved one.
    fn last_checkpoint(&self) -> Option<Checkpoint> {
        let dir = self.checkpoint.clone()?;
        let step = checkpoint::read_state(&dir).ok()?.step;
        Some(Checkpoint { dir, step })
    }
}

/// Seed of step `step`'s anchor draw: a function of the run seed and the step alone, so a
/// resumed run draws what the straight run drew.
pub fn step_seed(seed: u64, step: i64) -> u64 {
    seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Parses `cpu`, `cuda` or `cuda:N`, checking that the device exists.
pub fn parse_device(s: &str) -> Result<Device, TrainError> {
    let s = s.trim();
    let idx = match s {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => Some(0),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok()),
    };
    let Some(idx) = idx else {
        return Err(TrainError::Setup(format!(
            "unknown device {s:?}: use cpu, cuda or cuda:N"
        )));
    };
    let n = tch::Cuda::device_count() as usize;
    if n == 0 {
        return Err(TrainError::Setup(format!(
            "device {s} requested but CUDA is not available on this machine: use --drafter-device cpu --target-devices cpu"
        )));
    }
    if idx >= n {
        return Err(TrainError::Setup(format!(
            "device {s} does not exist: this machine has {n} CUDA device(s), cuda:0..cuda:{}",
            n - 1
        )));
    }
    Ok(Device::Cuda(idx))
}

/// Where the embedded default's files live.
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("DFLASH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"))
}

pub fn default_target_dir() -> PathBuf {
    fixtures_dir().join("tiny-target")
}

pub fn default_corpus() -> PathBuf {
    fixtures_dir().join("corpus").join("train.txt")
}

/// Where the target comes from.
#[derive(Debug, Clone)]
enum TargetSource {
    Dir(PathBuf),
    Preset(Qwen3Config, i64),
}

impl TargetSource {
    fn load(&self, device: Device, kind: Kind) -> Result<model::LoadedTarget, ModelError> {
        // building a model draws from libtorch's global generator; one at a time keeps
        // seeded presets reproducible
        static LOAD: Mutex<()> = Mutex::new(());
        let _one = LOAD.lock().unwrap_or_else(|e| e.into_inner());
        match self {
            TargetSource::Dir(d) => model::load_target(d, device, kind),
            TargetSource::Preset(cfg, seed) => Ok(model::random_target(cfg, device, kind, *seed)),
        }
    }
}

fn compute_kind(device: Device) -> Kind {
    if device.is_cuda() {
        Kind::BFloat16
    } else {
        Kind::Float
    }
}

/// Everything checked and resolved before training.
struct Plan {
    cfg: TrainConfig,
    target_cfg: Qwen3Config,
    source: TargetSource,
    drafter_cfg: DrafterConfig,
    target_devices: Vec<Device>,
    drafter_device: Device,
    data: Dataset,
}

fn plan(cfg: TrainConfig, opts: &RunOptions) -> Result<Plan, TrainError> {
    cfg.validate().map_err(TrainError::setup)?;
    super::limits::check_stop_after(opts.stop_after).map_err(TrainError::setup)?;
    let target_devices = cfg
        .target_devices
        .iter()
        .map(|d| parse_device(d))
        .collect::<Result<Vec<_>, _>>()?;
    let drafter_device = parse_device(&cfg.drafter_device)?;
    let (source, target_cfg) = match (&cfg.target_preset, &cfg.target) {
        (Some(_), Some(_)) => {
            return Err(TrainError::Setup(
                "give either target or target_preset, not both".into(),
            ))
        }
        (Some(p), None) => {
            let c = Qwen3Config::preset(p).ok_or_else(|| {
                TrainError::Setup(format!(
                    "unknown target_preset {p:?}: use realistic or tiny"
                ))
            })?;
            (TargetSource::Preset(c.clone(), cfg.seed as i64), c)
        }
        (None, dir) => {
            let dir = dir.clone().unwrap_or_else(default_target_dir);
            if !dir.is_dir() {
                return Err(TrainError::Setup(format!(
                    "target checkpoint {} is not a directory: pass a Hugging Face checkpoint directory with --target",
                    dir.display()
                )));
            }
            let c = model::checkpoint::read_config::<Qwen3ConfigFile>(&dir)
                .and_then(|f| f.into_config())
                .map_err(|e| TrainError::Setup(format!("target {}: {e}", dir.display())))?;
            model::checkpoint::weight_files(&dir).map_err(TrainError::setup)?;
            (TargetSource::Dir(dir), c)
        }
    };
    let mask_id = if cfg.mask_token_id >= 0 {
        cfg.mask_token_id
    } else if target_cfg.vocab_size == bytes::VOCAB {
        bytes::MASK
    } else {
        target_cfg.vocab_size - 1
    };
    let mut drafter_cfg =
        DrafterConfig::for_target(&target_cfg, cfg.drafter_layers, cfg.block_size, mask_id);
    if !cfg.target_layer_ids.is_empty() {
        drafter_cfg.target_layer_ids = cfg.target_layer_ids.clone();
    }
    drafter_cfg.sliding_window = cfg.sliding_window;
    for t in drafter_cfg
        .layer_types
        .iter_mut()
        .take(cfg.sliding_layers as usize)
    {
        *t = LayerType::Sliding;
    }
    drafter_cfg
        .validate(&target_cfg)
        .map_err(|e| TrainError::Setup(format!("drafter does not fit the target: {e}")))?;
    let data = match (cfg.synthetic_seq_len, &cfg.data) {
        (Some(len), _) => data::synthetic(64, len, target_cfg.vocab_size, cfg.seed),
        (None, path) => {
            let path = path.clone().unwrap_or_else(default_corpus);
            data::load(
                &path,
                cfg.seq_len,
                target_cfg.vocab_size,
                cfg.heldout_fraction,
            )
            .map_err(TrainError::setup)?
        }
    };
    check_loss_weights(&data, &cfg)?;
    let load = largest_load(&data, &cfg);
    memory::check(&drafter_cfg, &load, drafter_device, &target_devices)
        .map_err(TrainError::Setup)?;
    Ok(Plan {
        cfg,
        target_cfg,
        source,
        drafter_cfg,
        target_devices,
        drafter_device,
        data,
    })
}

/// Refuses data on which no position has a loss weight: every step would train on
/// nothing (loss 0, gradient 0).
fn check_loss_weights(data: &Dataset, cfg: &TrainConfig) -> Result<(), TrainError> {
    // an anchor needs two neighbouring positions with a weight (see sample_anchors)
    let trainable = data
        .train
        .iter()
        .any(|s| s.mask.windows(2).any(|w| w[0] != 0 && w[1] != 0));
    if trainable {
        return Ok(());
    }
    let what = cfg
        .data
        .as_ref()
        .map_or_else(|| "the data".to_string(), |p| p.display().to_string());
    Err(TrainError::Setup(format!(
        "{what}: no position has a loss weight (loss_mask is 0 everywhere, or never 1 on two neighbouring tokens): there is nothing to train on"
    )))
}

/// The shape of the largest batch the loader will make, for the memory estimate.
fn largest_load(data: &Dataset, cfg: &TrainConfig) -> memory::Load {
    let (batch, seq) = data::plan_batches(&data.train, cfg.batch_tokens)
        .iter()
        .map(|b| {
            let longest = b
                .iter()
                .map(|&i| data.train[i].ids.len())
                .max()
                .unwrap_or(0);
            (b.len() as i64, longest as i64)
        })
        .max_by_key(|&(b, s)| {
            let q = cfg.num_anchors * cfg.block_size;
            (b as i128) * (q as i128) * ((s + q) as i128)
        })
        .unwrap_or((1, cfg.seq_len as i64));
    memory::Load {
        batch,
        seq,
        num_anchors: cfg.num_anchors,
        chunk_blocks: cfg.chunk_blocks,
        queue_capacity: cfg.queue_capacity as i64,
    }
}

/// One item on the hidden-state queue.
struct Item {
    batch: Batch,
    /// Recorded on the producer's stream after the features were computed.
    ready: Option<cuda::Event>,
    /// Flow id of the recorded `queue.put`, if it was recorded.
    flow: Option<u64>,
}

/// The frozen pieces of the target the drafter borrows, sent once by worker 0.
struct TargetHead {
    embed: Tensor,
    lm_head: Tensor,
}

/// Fails the queue if the worker leaves without finishing normally (error or panic).
struct FailGuard<'a> {
    queue: &'a HiddenQueue<Item>,
    armed: bool,
}

impl Drop for FailGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.queue.fail("the target worker panicked".into());
        }
    }
}

struct WorkerCtx {
    index: usize,
    device: Device,
    source: TargetSource,
    taps: Vec<usize>,
    loader: Arc<Mutex<Loader>>,
    queue: Arc<HiddenQueue<Item>>,
    head_tx: Option<crossbeam_channel::Sender<TargetHead>>,
    /// Traced steps; batch N is consumed by step N.
    window: (i64, i64),
}

fn target_worker(ctx: WorkerCtx) {
    let queue = ctx.queue.clone();
    let mut guard = FailGuard {
        queue: &queue,
        armed: true,
    };
    match target_loop(ctx) {
        Ok(()) => queue.producer_done(),
        Err(e) => queue.fail(e),
    }
    guard.armed = false;
}

fn target_loop(ctx: WorkerCtx) -> Result<(), String> {
    trace::set_thread_name(&format!("target {} {}", ctx.index, device_name(ctx.device)));
    trace::set_thread_recording(false);
    let stream = match ctx.device {
        Device::Cuda(i) => {
            let s = cuda::use_new_stream(i).map_err(|e| e.to_string())?;
            trace::bind_gpu(i, &format!("target {}", ctx.index));
            Some(s)
        }
        _ => None,
    };
    let kind = compute_kind(ctx.device);
    let target = ctx
        .source
        .load(ctx.device, kind)
        .map_err(|e| format!("loading the target: {e}"))?;
    if let Some(s) = &stream {
        // the drafter reads the embedding and lm_head from its own stream
        s.synchronize().map_err(|e| e.to_string())?;
    }
    if let Some(tx) = ctx.head_tx {
        let head = TargetHead {
            embed: target.model.embed_tokens.shallow_clone(),
            lm_head: target.model.lm_head.shallow_clone(),
        };
        if tx.send(head).is_err() {
            return Ok(());
        }
    }
    let put_name = trace_name!("queue.put");
    let fail_at = injected_fault("target");
    loop {
        if fail_at.is_some_and(|n| {
            ctx.loader
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .position
                >= n
        }) {
            return Err("injected fault (DFLASH_INJECT_FAULT)".into());
        }
        let host = ctx
            .loader
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_batch();
        let index = host.index;
        // batch N feeds step N: record the batches of the traced steps, on this side too
        trace::set_thread_recording((ctx.window.0..ctx.window.1).contains(&(index as i64)));
        let out = {
            let mut s = trace::gpu_span(trace_name!("target.forward"));
            s.arg("batch", index);
            let ids = host.input_ids.to_device(ctx.device);
            tch::no_grad(|| target.model.forward(&ids, &ctx.taps, false))
                .map_err(|e| e.to_string())?
        };
        let features = {
            let _s = trace::gpu_span(trace_name!("target.extract"));
            Tensor::cat(&out.hidden, -1)
        };
        drop(out);
        let ready = match (&stream, ctx.device) {
            (Some(s), Device::Cuda(i)) => {
                let ev = cuda::Event::new(i).map_err(|e| e.to_string())?;
                ev.record(s).map_err(|e| e.to_string())?;
                Some(ev)
            }
            _ => None,
        };
        let mut span = trace::queue_span(put_name);
        let flow = span.is_recording().then(trace::next_flow_id);
        if let Some(id) = flow {
            span.flow_out(id);
        }
        let item = Item {
            batch: Batch {
                input_ids: host.input_ids,
                loss_mask: host.loss_mask,
                features,
                index,
            },
            ready,
            flow,
        };
        match ctx.queue.put(item) {
            Ok(info) => {
                span.arg("wait_us", info.wait.as_secs_f64() * 1e6);
                span.arg("depth", info.depth as u64);
                span.arg("batch", index);
                trace::counter(trace_name!("queue"), "depth", info.depth as f64);
            }
            // the drafter stopped (done, signal or its own error): nothing more to do
            Err(QueueError::ConsumerStopped(_)) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// `DFLASH_INJECT_FAULT=target:N` or `drafter:N` makes that side fail at batch/step N, to
/// exercise shutdown propagation end to end.
fn injected_fault(side: &str) -> Option<u64> {
    let v = std::env::var("DFLASH_INJECT_FAULT").ok()?;
    let (s, n) = v.split_once(':')?;
    (s == side).then(|| n.parse().ok()).flatten()
}

fn device_name(d: Device) -> String {
    match d {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".into(),
    }
}

fn git_revision() -> String {
    std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn torch_version() -> String {
    // libtorch does not export its version string through tch; the wheel pins it
    option_env!("DFLASH_TORCH_VERSION")
        .unwrap_or("2.11.0")
        .to_string()
}

/// A write that failed, as one true line: what was not written, why, and where the run
/// stands (the last good checkpoint, or that there is none). Exit code 2.
fn write_failed(
    what: &str,
    e: &(dyn std::error::Error + 'static),
    last: Option<&Checkpoint>,
    run_dir: &Path,
    saving: bool,
) -> TrainError {
    let cause = if durable::chain_is_disk_full(e) {
        "the disk is full"
    } else {
        "the write failed"
    };
    let resume = format!("dflash train --resume --run-dir {}", run_dir.display());
    let state = match last {
        Some(c) => format!(
            "the last good checkpoint is {}: free space (or fix the cause), then `{resume}` continues from it",
            c.describe()
        ),
        None if saving => format!(
            "there is no checkpoint yet: free space (or fix the cause), then `{resume}` starts over from step 0"
        ),
        None => format!(
            "no checkpoint is saved (save_checkpoints is off): free space (or fix the cause), then `{resume}` starts over from step 0"
        ),
    };
    TrainError::Setup(format!("{cause}: {what}: {e}; {state}"))
}

/// What the signal handlers set: 0, or the number of the signal that asked to stop.
type StopFlag = Arc<AtomicUsize>;

fn install_signal_handlers() -> Result<StopFlag, TrainError> {
    let stop = Arc::new(AtomicUsize::new(0));
    let armed = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // a second signal stops at once (checkpoints are atomic, leftovers are cleaned)
        signal_hook::flag::register_conditional_shutdown(sig, 128 + sig, armed.clone())
            .map_err(TrainError::setup)?;
        signal_hook::flag::register(sig, armed.clone()).map_err(TrainError::setup)?;
        signal_hook::flag::register_usize(sig, stop.clone(), sig as usize)
            .map_err(TrainError::setup)?;
    }
    Ok(stop)
}

fn signal_name(sig: i32) -> String {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT".into(),
        signal_hook::consts::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// A resume with nothing to do: the run finished, or is already at `--stop-after`.
fn nothing_to_do(
    dir: &Path,
    cfg: &TrainConfig,
    opts: &RunOptions,
    latest: Option<&Checkpoint>,
) -> Option<RunReport> {
    let at = latest.map_or(0, |c| c.step);
    let summary = run_dir::read_summary(dir);
    let finished = summary
        .as_ref()
        .is_some_and(|s| s["status"] == "finished" && s["steps"].as_i64() == Some(cfg.steps));
    let stopped_there = opts.stop_after.is_some_and(|n| n < cfg.steps && at >= n);
    (finished || stopped_there).then(|| RunReport {
        status: RunStatus::AlreadyDone,
        step: if finished { cfg.steps } else { at },
        steps: cfg.steps,
        start_step: at,
        ..Default::default()
    })
}

/// Starts the recorder on the run directory's next trace file.
fn start_recorder(plan: &Plan, dir: &Path, window: (i64, i64)) -> Result<Recorder, TrainError> {
    let cfg = &plan.cfg;
    let gpu: Option<Arc<dyn trace::GpuBackend>> =
        if plan.drafter_device.is_cuda() || plan.target_devices.iter().any(|d| d.is_cuda()) {
            Some(Arc::new(
                cuda::CudaEvents::new().map_err(TrainError::setup)?,
            ))
        } else {
            None
        };
    let segment = run_files::next_trace_segment(dir);
    let name = run_files::trace_file_name(segment, cfg.trace_gzip);
    let mut devices: Vec<String> = cfg.target_devices.clone();
    devices.push(cfg.drafter_device.clone());
    devices.dedup();
    let metadata = serde_json::json!({
        "producer": "dflash",
        "format": "dflash-trace/1",
        "dflash_version": env!("CARGO_PKG_VERSION"),
        "torch_version": torch_version(),
        "git_revision": git_revision(),
        "devices": devices,
        "trace_steps": format!("{}..{}", window.0, window.1),
        "config": serde_json::to_value(cfg).expect("config serializes"),
    });
    let rc = RecorderConfig {
        path: dir.join(name),
        gzip: cfg.trace_gzip,
        metadata,
        gpu,
        process_name: "dflash trainer".into(),
        // each thread records its own window (see set_thread_recording)
        active: true,
        ..Default::default()
    };
    Recorder::start(rc).map_err(|e| TrainError::Setup(format!("cannot start the trace: {e}")))
}

/// Runs a training job. Returns when `steps` (or `stop_after`) are done, on SIGINT/SIGTERM,
/// or on the first error of any worker.
pub fn run(cfg: TrainConfig, opts: &RunOptions) -> Result<RunReport, TrainError> {
    let plan = plan(cfg, opts)?;
    let cfg = plan.cfg.clone();
    let mode = if opts.resume {
        run_dir::Mode::Resume
    } else {
        run_dir::Mode::Fresh
    };
    let dir = RunDir::open(&opts.run_dir, mode).map_err(TrainError::setup)?;
    let resume_from = if opts.resume {
        checkpoint::latest(dir.path()).map_err(|e| TrainError::Setup(format!("--resume: {e}")))?
    } else {
        None
    };
    if opts.resume {
        if let Some(done) = nothing_to_do(dir.path(), &cfg, opts, resume_from.as_ref()) {
            return Ok(done);
        }
        if !opts.quiet {
            match &resume_from {
                Some(c) => eprintln!("resuming from {}", c.describe()),
                None => eprintln!(
                    "{} has no checkpoint yet: starting over from step 0 with its configuration",
                    dir.path().display()
                ),
            }
        }
    }
    dir.write_config(&cfg).map_err(|e| {
        let what = format!("writing {}", dir.file(run_files::CONFIG).display());
        write_failed(
            &what,
            &e,
            resume_from.as_ref(),
            dir.path(),
            cfg.save_checkpoints,
        )
    })?;
    super::step::set_sync_sections(cfg.sync_sections);
    let stop = install_signal_handlers()?;

    let window = cfg.trace_window().map_err(TrainError::setup)?;
    let recorder = if opts.trace {
        Some(start_recorder(&plan, dir.path(), window)?)
    } else {
        None
    };

    // the drafter side, started before the workers so the trace names the thread first
    trace::set_thread_name(&format!("drafter {}", device_name(plan.drafter_device)));
    trace::set_thread_recording(false);
    let drafter_stream = match plan.drafter_device {
        Device::Cuda(i) => {
            let s = cuda::use_new_stream(i).map_err(TrainError::setup)?;
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
    .map_err(TrainError::setup)?;

    // target workers
    let start_position = match &resume_from {
        Some(c) => {
            checkpoint::read_state(&c.dir)
                .map_err(|e| TrainError::Setup(format!("--resume: {e}")))?
                .data_position
        }
        None => 0,
    };
    let loader = Arc::new(Mutex::new(Loader::new(
        plan.data.train.clone(),
        cfg.batch_tokens,
        cfg.seed,
        bytes::PAD.min(plan.target_cfg.vocab_size - 1),
        start_position,
    )));
    let queue = Arc::new(HiddenQueue::<Item>::new(
        cfg.queue_capacity,
        plan.target_devices.len(),
    ));
    let (head_tx, head_rx) = crossbeam_channel::bounded(1);
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    for (i, &device) in plan.target_devices.iter().enumerate() {
        let ctx = WorkerCtx {
            index: i,
            device,
            source: plan.source.clone(),
            taps: plan.drafter_cfg.target_layer_ids.clone(),
            loader: loader.clone(),
            queue: queue.clone(),
            head_tx: (i == 0).then(|| head_tx.clone()),
            window,
        };
        let h = std::thread::Builder::new()
            .name(format!("target-{i}"))
            .spawn(move || target_worker(ctx))
            .map_err(TrainError::runtime)?;
        workers.push(h);
    }
    drop(head_tx);

    let result = drafter_side(
        &plan,
        drafter,
        opts,
        &dir,
        &queue,
        &head_rx,
        resume_from.as_ref(),
        drafter_stream.as_ref(),
        recorder.as_ref(),
        &stop,
        window,
    );
    // stop the producers whatever happened, and wait for them
    queue.stop(match &result {
        Ok(_) => "training finished".into(),
        Err(e) => e.to_string(),
    });
    for w in workers {
        let _ = w.join();
    }
    let mut report = result?;
    if let Some(rec) = recorder {
        rec.set_active(false);
        if cfg.sync_sections {
            write_fidelity(&rec, dir.path(), opts.quiet)?;
        }
        let path = rec.path().to_path_buf();
        let last = report.last_checkpoint();
        let summary = rec.finish().map_err(|e| {
            write_failed(
                &format!("the trace {} is incomplete", path.display()),
                &e,
                last.as_ref(),
                dir.path(),
                cfg.save_checkpoints,
            )
        })?;
        report.trace = Some(summary.path);
        report.trace_gpu_cost = Some(summary.gpu_cost).filter(|c| c.spans > 0);
    }
    run_dir::write_summary(dir.path(), &report).map_err(|e| {
        let last = report.last_checkpoint();
        let what = format!("writing {}", dir.file(run_files::SUMMARY).display());
        write_failed(&what, &e, last.as_ref(), dir.path(), cfg.save_checkpoints)
    })?;
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn drafter_side(
    plan: &Plan,
    d: model::LoadedDrafter,
    opts: &RunOptions,
    dir: &RunDir,
    queue: &HiddenQueue<Item>,
    head_rx: &crossbeam_channel::Receiver<TargetHead>,
    resume_from: Option<&Checkpoint>,
    stream: Option<&cuda::Stream>,
    recorder: Option<&Recorder>,
    stop: &AtomicUsize,
    window: (i64, i64),
) -> Result<RunReport, TrainError> {
    let cfg = &plan.cfg;
    let head = match head_rx.recv() {
        Ok(h) => h,
        // worker 0 failed before it could send: its error is on the queue
        Err(_) => {
            return Err(match queue.get() {
                Err(e) => TrainError::Setup(e.to_string()),
                _ => TrainError::Runtime("the target worker stopped before starting".into()),
            })
        }
    };
    let device = plan.drafter_device;
    let kind = compute_kind(device);
    let step_cfg = StepConfig {
        num_anchors: cfg.num_anchors,
        gamma: if cfg.gamma > 0.0 {
            cfg.gamma
        } else {
            objective::default_gamma(cfg.block_size)
        },
        chunk_blocks: cfg.chunk_blocks,
        grad_clip: cfg.grad_clip,
    };
    let adamw = AdamWConfig {
        weight_decay: cfg.weight_decay,
        ..Default::default()
    };
    let mut trainer = DrafterTrainer::new(
        d.model,
        d.vs,
        &head.embed,
        &head.lm_head,
        kind,
        step_cfg,
        adamw,
    )
    .map_err(TrainError::setup)?;
    drop(head);
    let mut state = RunState {
        step: 0,
        data_position: 0,
    };
    if let Some(c) = resume_from {
        state = checkpoint::restore(&c.dir, &mut trainer)
            .map_err(|e| TrainError::Setup(format!("--resume: {e}")))?;
    }
    let mut last_checkpoint = resume_from.cloned();
    let mut report = RunReport {
        start_step: state.step,
        steps: cfg.steps,
        ..Default::default()
    };
    let heldout = heldout_batches(plan, 8);
    if state.step == 0 && !heldout.is_empty() {
        report.heldout_before =
            Some(evaluate(plan, &trainer, &heldout).map_err(TrainError::runtime)?);
    }
    let metrics_path = dir.file(run_files::METRICS);
    let mut metrics = MetricsLog::open(&metrics_path, state.step).map_err(|e| {
        write_failed(
            &format!("writing {}", metrics_path.display()),
            &e,
            last_checkpoint.as_ref(),
            dir.path(),
            cfg.save_checkpoints,
        )
    })?;
    let keep = cfg.keep_checkpoints as usize;
    let save = |trainer: &DrafterTrainer,
                state: RunState,
                metrics: &MetricsLog,
                last: &Option<Checkpoint>|
     -> Result<Checkpoint, TrainError> {
        let fail = |e: &(dyn std::error::Error + 'static)| {
            write_failed(
                &format!("checkpoint of step {} not written", state.step),
                e,
                last.as_ref(),
                dir.path(),
                cfg.save_checkpoints,
            )
        };
        metrics.sync().map_err(|e| fail(&e))?;
        checkpoint::save(dir.path(), trainer, state, keep).map_err(|e| fail(&e))
    };
    let interval = (cfg.checkpoint_minutes > 0.0)
        .then(|| Duration::from_secs_f64(cfg.checkpoint_minutes * 60.0));
    let mut last_save = Instant::now();
    let warmup = (cfg.steps as f64 * cfg.warmup_ratio).round() as i64;
    let end = opts.stop_after.map_or(cfg.steps, |s| s.min(cfg.steps));
    let get_name = trace_name!("queue.get");
    let mut timed_tokens = 0i64;
    let mut timed = Duration::ZERO;
    let mut log_window = (Instant::now(), 0i64, Duration::ZERO);
    let fail_at = injected_fault("drafter");
    while state.step < end {
        if fail_at.is_some_and(|n| state.step as u64 >= n) {
            return Err(TrainError::Runtime(
                "injected fault (DFLASH_INJECT_FAULT)".into(),
            ));
        }
        let sig = stop.load(Ordering::Relaxed);
        if sig != 0 {
            report.stopped_by_signal = true;
            report.signal_number = Some(sig as i32);
            report.signal = Some(signal_name(sig as i32));
            break;
        }
        let step = state.step;
        trace::set_thread_recording((window.0..window.1).contains(&step));
        let t0 = Instant::now();
        let profiler_step = trace::step_span(step as u64);
        let (item, wait) = {
            // the wait and the get are separate spans so the flow from queue.put always
            // lands on a span that starts after the put began
            let wait = {
                let _w = trace::queue_span(trace_name!("queue.wait"));
                queue.wait_ready()
            };
            let mut span = trace::queue_span(get_name);
            let got = queue
                .get()
                .map_err(|e| TrainError::Runtime(e.to_string()))?;
            let Some((item, info)) = got else {
                return Err(TrainError::Runtime(
                    "the target workers stopped early".into(),
                ));
            };
            if let Some(flow) = item.flow {
                span.flow_in(flow);
            }
            let wait = wait + info.wait;
            span.arg("wait_us", wait.as_secs_f64() * 1e6);
            span.arg("depth", info.depth as u64);
            span.arg("batch", item.batch.index);
            trace::counter(trace_name!("queue"), "depth", info.depth as f64);
            (item, wait)
        };
        if let (Some(ev), Some(s)) = (&item.ready, stream) {
            s.wait_event(ev).map_err(TrainError::runtime)?;
            cuda::record_stream(&item.batch.features, s).map_err(TrainError::runtime)?;
        }
        let lr = lr_at(step, cfg.steps, warmup, cfg.lr);
        let mut rng = ChaCha8Rng::seed_from_u64(step_seed(cfg.seed, step));
        let m: StepMetrics = {
            let mut span = trace::span(trace_name!("drafter.step"));
            let m = trainer
                .train_step(&item.batch, &mut rng, lr)
                .map_err(TrainError::runtime)?;
            span.arg("step", step as u64);
            span.arg("tokens", m.tokens as u64);
            span.arg("loss", m.loss);
            m
        };
        drop(profiler_step);
        drop(item);
        if !m.loss.is_finite() {
            return Err(TrainError::Runtime(format!(
                "the loss became {} at step {step}; lower the learning rate (--set lr=...)",
                m.loss
            )));
        }
        let dt = t0.elapsed();
        state.step += 1;
        state.data_position += 1;
        report.losses.push(m.loss);
        if step >= 2 {
            // the first steps pay for allocator warm-up and kernel selection
            timed += dt;
            timed_tokens += m.tokens;
        }
        log_window.1 += m.tokens;
        log_window.2 += wait;
        let line = serde_json::json!({"step": step, "loss": m.loss, "accuracy": m.accuracy, "tau_hat": m.tau_hat,
            "lr": lr, "tokens": m.tokens, "step_ms": dt.as_secs_f64() * 1e3, "queue_wait_ms": wait.as_secs_f64() * 1e3, "grad_norm": m.grad_norm});
        metrics.append(&line).map_err(|e| {
            write_failed(
                &format!("writing {}", metrics.path().display()),
                &e,
                last_checkpoint.as_ref(),
                dir.path(),
                cfg.save_checkpoints,
            )
        })?;
        if !opts.quiet && (state.step % cfg.log_every.max(1) == 0 || state.step == end) {
            let secs = log_window.0.elapsed().as_secs_f64();
            eprintln!(
                "step {:>6}/{}  loss {:.4}  acc {:.3}  tau {:.2}  lr {:.2e}  {:.0} tok/s  queue wait {:.0}%",
                state.step,
                cfg.steps,
                m.loss,
                m.accuracy,
                m.tau_hat,
                lr,
                log_window.1 as f64 / secs,
                100.0 * log_window.2.as_secs_f64() / secs
            );
            log_window = (Instant::now(), 0, Duration::ZERO);
        }
        if let Some(rec) = recorder {
            if cfg.summary_every > 0
                && !cfg.sync_sections
                && (window.0..window.1).contains(&step)
                && state.step % cfg.summary_every == 0
                && !opts.quiet
            {
                eprintln!(
                    "{}",
                    live_summary(
                        &rec.stats_snapshot(),
                        trainer.drafter.layers.len(),
                        m.tokens
                    )
                );
            }
        }
        let due = (cfg.checkpoint_every > 0 && state.step % cfg.checkpoint_every == 0)
            || interval.is_some_and(|i| last_save.elapsed() >= i);
        if cfg.save_checkpoints && due && state.step < end {
            last_checkpoint = Some(save(&trainer, state, &metrics, &last_checkpoint)?);
            last_save = Instant::now();
        }
    }
    report.steps_done = state.step - report.start_step;
    report.step = state.step;
    if timed > Duration::ZERO {
        report.tokens_per_s = timed_tokens as f64 / timed.as_secs_f64();
        report.mean_step_ms = timed.as_secs_f64() * 1e3 / (report.steps_done - 2).max(1) as f64;
    }
    let finished = state.step == cfg.steps;
    if cfg.save_checkpoints {
        if last_checkpoint.as_ref().map(|c| c.step) != Some(state.step) {
            last_checkpoint = Some(save(&trainer, state, &metrics, &last_checkpoint)?);
        }
        if finished {
            let out = dir.file(run_files::DRAFTER);
            model::save_drafter(&trainer.vs, &trainer.drafter.cfg, &out).map_err(|e| {
                write_failed(
                    &format!(
                        "training finished but the drafter was not exported to {}",
                        out.display()
                    ),
                    &e,
                    last_checkpoint.as_ref(),
                    dir.path(),
                    cfg.save_checkpoints,
                )
            })?;
            report.drafter = Some(out);
        }
    }
    report.checkpoint = last_checkpoint.map(|c| c.dir);
    report.status = if finished {
        RunStatus::Finished
    } else {
        RunStatus::Stopped
    };
    trace::set_thread_recording(false);
    if !heldout.is_empty() && !report.stopped_by_signal {
        report.heldout_after =
            Some(evaluate(plan, &trainer, &heldout).map_err(TrainError::runtime)?);
    }
    if report.stopped_by_signal && !opts.quiet {
        let saved = if cfg.save_checkpoints {
            "checkpoint saved"
        } else {
            "no checkpoint (save_checkpoints is off)"
        };
        eprintln!(
            "stopped by {} after step {}; {saved}: continue with --resume {}",
            report.signal.as_deref().unwrap_or("a signal"),
            state.step,
            dir.path().display()
        );
    }
    Ok(report)
}

fn heldout_batches(plan: &Plan, max: usize) -> Vec<data::HostBatch> {
    let seqs: Vec<&data::Sequence> = plan.data.heldout.iter().collect();
    let per = (plan.cfg.batch_tokens / plan.cfg.seq_len).max(1);
    seqs.chunks(per)
        .take(max)
        .enumerate()
        .map(|(i, c)| data::collate(c, bytes::PAD.min(plan.target_cfg.vocab_size - 1), i as u64))
        .collect()
}

/// Loss, accuracy and tau_hat on held-out batches, with a target loaded on the drafter's
/// device (anchors drawn with a fixed seed, so before/after figures are comparable).
fn evaluate(
    plan: &Plan,
    trainer: &DrafterTrainer,
    batches: &[data::HostBatch],
) -> Result<Eval, String> {
    let target = plan
        .source
        .load(trainer.device, trainer.kind)
        .map_err(|e| e.to_string())?;
    let taps = &plan.drafter_cfg.target_layer_ids;
    let mut sum = Eval::default();
    let mut rng = ChaCha8Rng::seed_from_u64(12345);
    for b in batches {
        let ids = b.input_ids.to_device(trainer.device);
        let out =
            tch::no_grad(|| target.model.forward(&ids, taps, false)).map_err(|e| e.to_string())?;
        let batch = Batch {
            input_ids: b.input_ids.shallow_clone(),
            loss_mask: b.loss_mask.shallow_clone(),
            features: Tensor::cat(&out.hidden, -1),
            index: b.index,
        };
        let m = trainer
            .evaluate(&batch, &mut rng)
            .map_err(|e| e.to_string())?;
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

/// Validation mode: compares, per section, the mean CUDA-event GPU time with the mean
/// time measured by synchronizing the stream around the section, and writes
/// `RUN_DIR/fidelity.json`. Agreement: within 5%, or 20 us for tiny sections.
fn write_fidelity(rec: &Recorder, run_dir: &Path, quiet: bool) -> Result<(), TrainError> {
    rec.flush().map_err(TrainError::runtime)?;
    // GPU events resolve on the writer thread shortly after they complete
    std::thread::sleep(Duration::from_millis(600));
    rec.flush().map_err(TrainError::runtime)?;
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
    let path = run_dir.join("fidelity.json");
    fs::write(
        &path,
        serde_json::to_string_pretty(&rows).expect("serializes"),
    )
    .map_err(|e| TrainError::Runtime(format!("{}: {e}", path.display())))
}

/// One line: share of the step per top-level drafter section, queue waits on both sides,
/// GPU vs CPU time of the step, from the recorder's totals since the last line.
fn live_summary(stats: &trace::Stats, layers: usize, tokens_per_step: i64) -> String {
    let get = |n: &str| stats.names.iter().find(|s| &*s.text == n);
    let step_cpu = get("drafter.step").map_or(0, |s| s.cpu_ns).max(1) as f64;
    let steps = get("drafter.step").map_or(0, |s| s.count).max(1) as f64;
    let mut parts: Vec<(String, u64)> = [
        "drafter.h2d",
        "drafter.anchors",
        "drafter.noise_embed",
        "drafter.rope",
        "drafter.mask",
        "drafter.fc",
        "drafter.norm",
        "drafter.lm_head_loss",
        "drafter.backward",
        "drafter.clip",
        "drafter.optimizer",
    ]
    .iter()
    .filter_map(|n| get(n).map(|s| (n.trim_start_matches("drafter.").to_string(), s.cpu_ns)))
    .collect();
    let layer_ns: u64 = (0..layers)
        .filter_map(|i| get(&format!("drafter.layer.{i}")))
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
        .filter(|s| {
            s.text.starts_with("drafter.")
                && s.text.matches('.').count() == 1
                && &*s.text != "drafter.step"
        })
        .map(|s| s.gpu_ns)
        .sum();
    let gpu_part = if gpu > 0 {
        format!("  gpu/cpu {:.2}", gpu as f64 / step_cpu)
    } else {
        String::new()
    };
    format!(
        "  profile: step {:.1} ms ({:.0} tok/s) = {}  | queue wait: drafter {:.1} ms, target {:.1} ms per step{}",
        step_cpu / 1e6 / steps,
        tokens_per_step as f64 / (step_cpu / 1e9 / steps),
        shares.join(", "),
        wait("queue.wait") + wait("queue.get"),
        wait("queue.put"),
        gpu_part
    )
}
