//! The models: the frozen Qwen3-layout target ([`qwen3`]) and the DFlash block-diffusion
//! drafter ([`drafter`]), each a plain tch module, plus the pieces of the DFlash training
//! objective ([`objective`]) and Hugging Face-style checkpoint I/O ([`checkpoint`]).
use std::path::Path;

use tch::{nn, Device, Kind};

pub mod checkpoint;
pub mod drafter;
pub mod layers;
pub mod objective;
pub mod qwen3;

pub use drafter::{Drafter, DrafterConfig, LayerType};
pub use qwen3::{Qwen3, Qwen3Config, Qwen3ConfigFile};

/// Errors of model construction, checkpoint I/O and the objective.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("bad model config: {0}")]
    Config(String),
    #[error("bad checkpoint: {0}")]
    Checkpoint(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

impl ModelError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// A target loaded for inference: its variables are frozen.
pub struct LoadedTarget {
    pub vs: nn::VarStore,
    pub model: Qwen3,
}

/// Loads a Hugging Face Qwen3 checkpoint directory onto `device`, in `kind`.
pub fn load_target(dir: &Path, device: Device, kind: Kind) -> Result<LoadedTarget, ModelError> {
    let cfg = checkpoint::read_config::<Qwen3ConfigFile>(dir)?.into_config()?;
    let mut vs = nn::VarStore::new(device);
    let model = Qwen3::new(&vs.root(), &cfg);
    vs.set_kind(kind);
    checkpoint::load_into(&vs.variables(), dir)?;
    vs.freeze();
    Ok(LoadedTarget { vs, model })
}

/// A target with random weights (for benchmarks at realistic sizes), frozen.
pub fn random_target(cfg: &Qwen3Config, device: Device, kind: Kind, seed: i64) -> LoadedTarget {
    tch::manual_seed(seed);
    let mut vs = nn::VarStore::new(device);
    let model = Qwen3::new(&vs.root(), cfg);
    vs.set_kind(kind);
    vs.freeze();
    LoadedTarget { vs, model }
}

/// Writes a target as a Hugging Face checkpoint directory (atomically).
pub fn save_target(target: &LoadedTarget, dir: &Path) -> Result<(), ModelError> {
    let mut tensors: Vec<(String, tch::Tensor)> = target.vs.variables().into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let dtype = match target.vs.kind() {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    };
    checkpoint::write_dir_atomically(dir, |tmp| {
        checkpoint::write_json(&target.model.cfg.to_file(dtype), &tmp.join("config.json"))?;
        checkpoint::write_safetensors(&tensors, &tmp.join("model.safetensors"))
    })
}

/// A drafter with its variables.
pub struct LoadedDrafter {
    pub vs: nn::VarStore,
    pub model: Drafter,
}

/// A freshly initialised drafter (Linear ~ N(0, 0.02), norms = 1) for `target`.
pub fn new_drafter(
    cfg: &DrafterConfig,
    target: &Qwen3Config,
    device: Device,
    seed: i64,
) -> Result<LoadedDrafter, ModelError> {
    cfg.validate(target)?;
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(device);
    let model = Drafter::new(&vs.root(), cfg);
    Ok(LoadedDrafter { vs, model })
}

/// Writes the drafter as a Hugging Face-style directory (`config.json` +
/// `model.safetensors`), atomically.
pub fn save_drafter(vs: &nn::VarStore, cfg: &DrafterConfig, dir: &Path) -> Result<(), ModelError> {
    let mut tensors: Vec<(String, tch::Tensor)> = vs.variables().into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    checkpoint::write_dir_atomically(dir, |tmp| {
        checkpoint::write_json(cfg, &tmp.join("config.json"))?;
        checkpoint::write_safetensors(&tensors, &tmp.join("model.safetensors"))
    })
}

/// Loads a drafter directory written by [`save_drafter`] and checks it fits `target`.
pub fn load_drafter(
    dir: &Path,
    target: &Qwen3Config,
    device: Device,
) -> Result<LoadedDrafter, ModelError> {
    let cfg: DrafterConfig = checkpoint::read_config(dir)?;
    cfg.validate(target)?;
    let vs = nn::VarStore::new(device);
    let model = Drafter::new(&vs.root(), &cfg);
    checkpoint::load_into(&vs.variables(), dir)?;
    Ok(LoadedDrafter { vs, model })
}
