//! Planning: everything that can be checked is checked before the run directory exists or
//! any training work starts (settings, devices, the target, the drafter's fit, the data,
//! its loss weights, the memory the largest batch needs), then where a resume starts and
//! the trace recorder's set-up. A target directory's `config.json` picks its family
//! (llama, qwen2, qwen3) and every tensor of its safetensors headers is checked against
//! that config (name, shape, dtype) without reading the weights.
use chrome_trace_format::dflash as names;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tch::{Device, Kind};

use crate::cuda;
use crate::model::{self, DrafterConfig, LayerType, ModelError, TargetConfig};
use crate::run_files;
use crate::trace::{self, Recorder, RecorderConfig};

use super::checkpoint::{self, Checkpoint};
use super::config::TrainConfig;
use super::data::{self, bytes, Dataset};
use super::error::{DeviceError, TrainError};
use super::memory;
use super::report::{RunOptions, RunReport, RunStatus};
use super::run_dir;
use super::tokenizer;

/// Where the embedded default's files live.
pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("DFLASH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"))
}

/// The embedded default's target: a tiny Qwen3-layout model with its own BPE tokenizer
/// (`fixtures/tiny-target-bpe`).
pub fn default_target_dir() -> PathBuf {
    fixtures_dir().join("tiny-target-bpe")
}

/// The tiny target of the same recipe with the byte-level tokenizer (`fixtures/tiny-target`),
/// the default before the BPE one; tests that need byte ids use it.
pub fn byte_target_dir() -> PathBuf {
    fixtures_dir().join("tiny-target")
}

/// The bundled text corpus: what a target given without `--data` trains on, and what the
/// tiny targets and their tokenizer were made from.
pub fn default_corpus() -> PathBuf {
    fixtures_dir().join("corpus").join("train.txt")
}

/// The embedded default's data: the default target's own continuations of prompts from
/// the corpus (token-id JSONL; see `fixtures/corpus/README.md`), since a drafter learns
/// to predict its target, as drafter recipes train on target-generated responses.
pub fn default_data() -> PathBuf {
    fixtures_dir().join("corpus").join("continuations.jsonl")
}

/// Parses `cpu`, `cuda` or `cuda:N`, checking that the device exists.
pub fn parse_device(s: &str) -> Result<Device, DeviceError> {
    let s = s.trim();
    let idx = match s {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => Some(0),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok()),
    };
    let Some(idx) = idx else {
        return Err(DeviceError::Unknown(s.into()));
    };
    let n = tch::Cuda::device_count() as usize;
    if n == 0 {
        return Err(DeviceError::NoCuda(s.into()));
    }
    if idx >= n {
        return Err(DeviceError::Missing {
            spec: s.into(),
            count: n,
        });
    }
    Ok(Device::Cuda(idx))
}

pub(super) fn device_name(d: Device) -> String {
    match d {
        Device::Cuda(i) => format!("cuda:{i}"),
        _ => "cpu".into(),
    }
}

/// bf16 on CUDA, fp32 on the CPU.
pub(super) fn compute_kind(device: Device) -> Kind {
    if device.is_cuda() {
        Kind::BFloat16
    } else {
        Kind::Float
    }
}

/// Where the target comes from.
#[derive(Debug, Clone)]
pub(super) enum TargetSource {
    Dir(PathBuf),
    Preset(TargetConfig, i64),
}

impl TargetSource {
    pub(super) fn load(
        &self,
        device: Device,
        kind: Kind,
    ) -> Result<model::LoadedTarget, ModelError> {
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

/// Everything checked and resolved before training.
pub(super) struct Plan {
    pub cfg: TrainConfig,
    pub target_cfg: TargetConfig,
    pub source: TargetSource,
    pub drafter_cfg: DrafterConfig,
    pub target_devices: Vec<Device>,
    pub drafter_device: Device,
    pub data: Dataset,
    /// The token that pads a batch's shorter sequences (see [`special_ids`]).
    pub pad: i64,
    /// The traced step window `[a, b)`.
    pub window: (i64, i64),
}

impl Plan {
    /// Checks and resolves everything a run needs, without writing anything.
    pub fn new(cfg: TrainConfig, opts: &RunOptions) -> Result<Plan, TrainError> {
        super::limits::check(&cfg)?;
        super::limits::check_stop_after(opts.stop_after)?;
        let window = cfg.trace_window()?;
        let target_devices = cfg
            .target_devices
            .iter()
            .map(|d| parse_device(d))
            .collect::<Result<Vec<_>, _>>()?;
        let drafter_device = parse_device(&cfg.drafter_device)?;
        let (source, target_cfg) = resolve_target(&cfg)?;
        let vocab = target_cfg.vocab_size;
        // synthetic data is token ids already: no tokenizer
        let tok = match cfg.synthetic_seq_len {
            Some(_) => None,
            None => {
                let target_dir = match &source {
                    TargetSource::Dir(d) => Some(d.as_path()),
                    TargetSource::Preset(..) => None,
                };
                Some(tokenizer::resolve(
                    cfg.tokenizer.as_deref(),
                    target_dir,
                    vocab,
                )?)
            }
        };
        let (mask, pad) = special_ids(tok.as_ref(), vocab);
        let mask = if cfg.mask_token_id >= 0 {
            cfg.mask_token_id
        } else {
            mask
        };
        let drafter_cfg = drafter_config(&cfg, &target_cfg, mask)?;
        let data = match (cfg.synthetic_seq_len, &tok) {
            (Some(len), _) => data::synthetic(64, len, vocab, cfg.seed),
            (None, tok) => {
                let path = cfg.data.clone().unwrap_or_else(|| {
                    // the continuations belong to the default target; any other (a
                    // checkpoint or a preset) reads the corpus
                    if cfg.target.is_none() && cfg.target_preset.is_none() {
                        default_data()
                    } else {
                        default_corpus()
                    }
                });
                let tok = tok.as_ref().expect("resolved for file data");
                data::load_with(&path, tok, cfg.seq_len, vocab, cfg.heldout_fraction)?
            }
        };
        check_loss_weights(&data, &cfg)?;
        let load = largest_load(&data, &cfg);
        memory::check(&drafter_cfg, &load, drafter_device, &target_devices)?;
        Ok(Plan {
            cfg,
            target_cfg,
            source,
            drafter_cfg,
            target_devices,
            drafter_device,
            data,
            pad,
            window,
        })
    }
}

/// The mask and pad ids of a run whose data `tok` tokenizes (`None`: synthetic ids) for
/// a target of `vocab` ids: the tokenizer's `mask_token` / `pad_token`; without them, the
/// byte tokenizer's ids where the vocabulary is the byte tokenizer's, else the last id
/// (mask) and the byte tokenizer's PAD or the last id (pad; padding carries no weight).
pub fn special_ids(tok: Option<&tokenizer::Tokenizer>, vocab: i64) -> (i64, i64) {
    let mask = tok.and_then(|t| t.mask()).map_or_else(
        || {
            if vocab == bytes::VOCAB {
                bytes::MASK
            } else {
                vocab - 1
            }
        },
        i64::from,
    );
    let pad = tok
        .and_then(|t| t.pad())
        .map_or_else(|| bytes::PAD.min(vocab - 1), i64::from);
    (mask, pad)
}

fn resolve_target(cfg: &TrainConfig) -> Result<(TargetSource, TargetConfig), TrainError> {
    match (&cfg.target_preset, &cfg.target) {
        (Some(_), Some(_)) => Err(TrainError::TargetAndPreset),
        (Some(p), None) => {
            let c = TargetConfig::preset(p).ok_or_else(|| TrainError::UnknownPreset(p.clone()))?;
            Ok((TargetSource::Preset(c.clone(), cfg.seed as i64), c))
        }
        (None, dir) => {
            let dir = dir.clone().unwrap_or_else(default_target_dir);
            if !dir.is_dir() {
                return Err(TrainError::NoTarget(dir));
            }
            let c = model::read_target_config(&dir).map_err(|source| TrainError::Target {
                dir: dir.clone(),
                source,
            })?;
            model::check_target_weights(&dir, &c).map_err(TrainError::TargetWeights)?;
            Ok((TargetSource::Dir(dir), c))
        }
    }
}

fn drafter_config(
    cfg: &TrainConfig,
    target: &TargetConfig,
    mask_id: i64,
) -> Result<DrafterConfig, TrainError> {
    let mut d = DrafterConfig::for_target(target, cfg.drafter_layers, cfg.block_size, mask_id);
    if !cfg.target_layer_ids.is_empty() {
        d.target_layer_ids = cfg.target_layer_ids.clone();
    }
    d.sliding_window = cfg.sliding_window;
    for t in d.layer_types.iter_mut().take(cfg.sliding_layers as usize) {
        *t = LayerType::Sliding;
    }
    d.validate(target).map_err(TrainError::DrafterFit)?;
    Ok(d)
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
    Err(TrainError::NoLossWeight {
        data: cfg
            .data
            .as_ref()
            .map_or_else(|| "the data".to_string(), |p| p.display().to_string()),
    })
}

/// The shape of the largest batch the loader will make, for the memory estimate.
fn largest_load(data: &Dataset, cfg: &TrainConfig) -> memory::Load {
    let q = cfg.num_anchors * cfg.block_size;
    let (batch, seq) = data::plan_batches(&data.train, cfg.batch_tokens)
        .iter()
        .map(|b| {
            let longest = b.iter().map(|&i| data.train[i].ids.len()).max();
            (b.len() as i64, longest.unwrap_or(0) as i64)
        })
        .max_by_key(|&(b, s)| (b as i128) * (q as i128) * ((s + q) as i128))
        .unwrap_or((1, cfg.seq_len as i64));
    memory::Load {
        batch,
        seq,
        num_anchors: cfg.num_anchors,
        chunk_blocks: cfg.chunk_blocks,
        attn_group_blocks: cfg.attn_group_blocks,
        attn_batch_blocks: cfg.effective_batch_blocks(),
        queue_capacity: cfg.queue_capacity as i64,
    }
}

/// Where a run starts.
pub(super) struct Start {
    /// The checkpoint a resume continues from (`None`: step 0).
    pub from: Option<Checkpoint>,
    /// Batches already consumed.
    pub data_position: u64,
}

/// Where a resume starts, or, when it has nothing to do (the run finished, or is already
/// at `--stop-after`), the report that says so.
pub(super) fn resume_point(
    dir: &Path,
    cfg: &TrainConfig,
    opts: &RunOptions,
) -> Result<Result<Start, RunReport>, TrainError> {
    if !opts.resume {
        return Ok(Ok(Start {
            from: None,
            data_position: 0,
        }));
    }
    let from = checkpoint::latest(dir).map_err(TrainError::Resume)?;
    let at = from.as_ref().map_or(0, |c| c.step);
    let finished = run_dir::read_summary(dir)
        .is_some_and(|s| s["status"] == "finished" && s["steps"].as_i64() == Some(cfg.steps));
    let stopped_there = opts.stop_after.is_some_and(|n| n < cfg.steps && at >= n);
    if finished || stopped_there {
        return Ok(Err(RunReport {
            status: RunStatus::AlreadyDone,
            step: if finished { cfg.steps } else { at },
            steps: cfg.steps,
            start_step: at,
            ..Default::default()
        }));
    }
    let data_position = match &from {
        Some(c) => {
            checkpoint::read_state(&c.dir)
                .map_err(TrainError::Resume)?
                .data_position
        }
        None => 0,
    };
    Ok(Ok(Start {
        from,
        data_position,
    }))
}

/// The git revision this binary was built from (captured by `build.rs`).
pub fn git_revision() -> &'static str {
    env!("DFLASH_GIT_REVISION")
}

fn torch_version() -> String {
    // libtorch does not export its version string through tch; the wheel pins it
    option_env!("DFLASH_TORCH_VERSION")
        .unwrap_or("2.11.0")
        .to_string()
}

/// Starts the recorder on the run directory's next trace file.
pub(super) fn start_recorder(plan: &Plan, dir: &Path) -> Result<Recorder, TrainError> {
    let cfg = &plan.cfg;
    let gpu: Option<Arc<dyn trace::GpuBackend>> =
        if plan.drafter_device.is_cuda() || plan.target_devices.iter().any(|d| d.is_cuda()) {
            Some(Arc::new(cuda::CudaEvents::new().map_err(TrainError::Cuda)?))
        } else {
            None
        };
    let segment = run_files::next_trace_segment(dir);
    let name = run_files::trace_file_name(segment, cfg.trace_gzip);
    let mut devices: Vec<String> = cfg.target_devices.clone();
    devices.push(cfg.drafter_device.clone());
    devices.dedup();
    let (a, b) = plan.window;
    let metadata = serde_json::json!({
        "producer": names::PRODUCER,
        "format": names::FORMAT,
        "dflash_version": env!("CARGO_PKG_VERSION"),
        "torch_version": torch_version(),
        "git_revision": git_revision(),
        "devices": devices,
        "trace_steps": format!("{a}..{b}"),
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
        keep_gpu_spans: cfg.trace_kernels,
        ..Default::default()
    };
    Recorder::start(rc).map_err(TrainError::TraceStart)
}
