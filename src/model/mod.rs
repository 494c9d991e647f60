//! The models: the frozen target ([`target`]: a Llama, Qwen2/Qwen2.5 or Qwen3 checkpoint,
//! the family selected by its `config.json`, read by [`target_config`]) and the DFlash
//! block-diffusion drafter ([`drafter`]), each a plain tch module, plus the pieces of the
//! DFlash training objective ([`objective`]) and Hugging Face-style checkpoint I/O
//! ([`checkpoint`]). A target checkpoint's tensors are checked against its config from the
//! safetensors headers ([`check_target_weights`]) before any weight is read. Every part
//! reports [`ModelError`].
use std::path::Path;

use tch::{nn, Device, Kind};

pub mod checkpoint;
pub mod drafter;
mod error;
pub mod layers;
pub mod masks;
pub mod objective;
pub mod target;
pub mod target_config;

pub use drafter::{Drafter, DrafterConfig, LayerType};
pub use error::ModelError;
pub use layers::RopeScaling;
pub use target::Target;
/// The names of the target types from when only the Qwen3 layout was read.
pub use target::Target as Qwen3;
pub use target_config::{Family, TargetConfig, TargetConfigFile};
/// The names of the target config types from when only the Qwen3 layout was read.
pub use target_config::{TargetConfig as Qwen3Config, TargetConfigFile as Qwen3ConfigFile};

/// A target loaded for inference: its variables are frozen.
pub struct LoadedTarget {
    pub vs: nn::VarStore,
    pub model: Target,
}

/// Reads and resolves a target checkpoint's `config.json`; errors name the file.
pub fn read_target_config(dir: &Path) -> Result<TargetConfig, ModelError> {
    checkpoint::read_config::<TargetConfigFile>(dir)?
        .into_config()
        .map_err(|e| match e {
            ModelError::Config(m) => {
                ModelError::Config(format!("{}: {m}", dir.join("config.json").display()))
            }
            e => e,
        })
}

/// Checks, from the safetensors headers alone (no weight is read), that the checkpoint in
/// `dir` holds exactly the tensors `cfg` implies ([`TargetConfig::expected_tensors`]) with
/// their shapes, in a dtype the loader reads. Tensors Hugging Face would ignore are allowed
/// ([`TargetConfig::ignorable_tensor`]); any other extra tensor is refused, since it means
/// the config does not describe the checkpoint (a bias or q/k norm the model would drop).
/// The error is one line naming the file, the tensor and expected vs found.
pub fn check_target_weights(dir: &Path, cfg: &TargetConfig) -> Result<(), ModelError> {
    let headers = checkpoint::read_headers(dir)?;
    let config = dir.join("config.json");
    let fail = |m: String| Err(ModelError::Checkpoint(m));
    let expected = cfg.expected_tensors();
    for (name, shape) in &expected {
        let Some(h) = headers.tensors.get(name) else {
            return fail(format!(
                "{}: tensor `{name}` is missing ({} expects shape {shape:?})",
                headers.where_missing(name).display(),
                config.display()
            ));
        };
        if &h.shape != shape {
            return fail(format!(
                "{}: tensor `{name}` has shape {:?}, {} expects {shape:?}",
                h.file.display(),
                h.shape,
                config.display()
            ));
        }
        checkpoint::check_dtype(name, h)?;
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    if let Some((name, h)) = headers
        .tensors
        .iter()
        .find(|(n, _)| !known.contains(n.as_str()) && !cfg.ignorable_tensor(n))
    {
        return fail(format!(
            "{}: unexpected tensor `{name}` (shape {:?}): the {} target {} describes has no such tensor",
            h.file.display(),
            h.shape,
            cfg.family,
            config.display()
        ));
    }
    Ok(())
}

/// Loads a Hugging Face Llama, Qwen2 or Qwen3 checkpoint directory onto `device`, in
/// `kind`, after checking its tensors against its config ([`check_target_weights`]).
pub fn load_target(dir: &Path, device: Device, kind: Kind) -> Result<LoadedTarget, ModelError> {
    let cfg = read_target_config(dir)?;
    check_target_weights(dir, &cfg)?;
    let mut vs = nn::VarStore::new(device);
    let model = Target::new(&vs.root(), &cfg);
    vs.set_kind(kind);
    checkpoint::load_into(&vs.variables(), dir)?;
    vs.freeze();
    Ok(LoadedTarget { vs, model })
}

/// A target with random weights (for benchmarks at realistic sizes), frozen.
pub fn random_target(cfg: &TargetConfig, device: Device, kind: Kind, seed: i64) -> LoadedTarget {
    tch::manual_seed(seed);
    let mut vs = nn::VarStore::new(device);
    let model = Target::new(&vs.root(), cfg);
    vs.set_kind(kind);
    vs.freeze();
    LoadedTarget { vs, model }
}

/// Writes a target as a Hugging Face checkpoint directory (atomically). A configuration
/// whose layout flags are not those of its family cannot be written as a `config.json`
/// and is refused.
pub fn save_target(target: &LoadedTarget, dir: &Path) -> Result<(), ModelError> {
    save_target_with(target, dir, &[])
}

/// [`save_target`] with more files (name, contents) in the directory, such as the
/// target's tokenizer.
pub fn save_target_with(
    target: &LoadedTarget,
    dir: &Path,
    files: &[(String, Vec<u8>)],
) -> Result<(), ModelError> {
    let mut tensors: Vec<(String, tch::Tensor)> = target.vs.variables().into_iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    let dtype = match target.vs.kind() {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    };
    let file = target.model.cfg.to_file(dtype);
    if file.clone().into_config().ok().as_ref() != Some(&target.model.cfg) {
        return Err(ModelError::Config(format!(
            "this target's layout (q/k norm {}, q/k/v bias {}, o bias {}, mlp bias {}) is not a {} layout: it has no config.json",
            target.model.cfg.qk_norm,
            target.model.cfg.qkv_bias,
            target.model.cfg.o_bias,
            target.model.cfg.mlp_bias,
            target.model.cfg.family
        )));
    }
    checkpoint::write_dir_atomically(dir, |tmp| {
        for (name, bytes) in files {
            let path = tmp.join(name);
            std::fs::write(&path, bytes).map_err(|e| ModelError::io(&path, e))?;
        }
        checkpoint::write_json(&file, &tmp.join("config.json"))?;
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
    target: &TargetConfig,
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
    target: &TargetConfig,
    device: Device,
) -> Result<LoadedDrafter, ModelError> {
    let cfg: DrafterConfig = checkpoint::read_config(dir)?;
    cfg.validate(target)?;
    let vs = nn::VarStore::new(device);
    let model = Drafter::new(&vs.root(), &cfg);
    checkpoint::load_into(&vs.variables(), dir)?;
    Ok(LoadedDrafter { vs, model })
}
