//! Run checkpoints: `RUN_DIR/checkpoints/step-NNNNNNNN/` holds the drafter (a Hugging
//! Face-style directory), the optimizer state and `state.json` (step, data position).
//! Each is built under a temporary name and renamed; `RUN_DIR/checkpoints/latest` names
//! the newest complete one and is itself replaced atomically, so a crash never leaves a
//! half checkpoint as the latest.
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{self, checkpoint as ckpt, ModelError};

use super::step::DrafterTrainer;

/// Where training stands.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// Optimizer steps completed.
    pub step: i64,
    /// Batches consumed from the data stream.
    pub data_position: u64,
}

pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Saves a checkpoint and points `latest` at it.
pub fn save(
    run_dir: &Path,
    trainer: &DrafterTrainer,
    state: RunState,
) -> Result<PathBuf, ModelError> {
    let root = checkpoints_dir(run_dir);
    let name = format!("step-{:08}", state.step);
    let dir = root.join(&name);
    ckpt::write_dir_atomically(&dir, |tmp| {
        model::save_drafter(&trainer.vs, &trainer.drafter.cfg, &tmp.join("drafter"))?;
        ckpt::write_safetensors(&trainer.opt.state(), &tmp.join("optimizer.safetensors"))?;
        ckpt::write_json(&state, &tmp.join("state.json"))
    })?;
    let tmp = root.join(".latest.tmp");
    fs::write(&tmp, &name).map_err(|e| ModelError::io(&tmp, e))?;
    fs::rename(&tmp, root.join("latest")).map_err(|e| ModelError::io(&root, e))?;
    Ok(dir)
}

/// The newest complete checkpoint of a run, if any.
pub fn latest(run_dir: &Path) -> Result<Option<PathBuf>, ModelError> {
    let root = checkpoints_dir(run_dir);
    let pointer = root.join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = fs::read_to_string(&pointer).map_err(|e| ModelError::io(&pointer, e))?;
    Ok(Some(root.join(name.trim())))
}

/// The run state saved in checkpoint `dir`.
pub fn read_state(dir: &Path) -> Result<RunState, ModelError> {
    let p = dir.join("state.json");
    let text = fs::read_to_string(&p).map_err(|e| ModelError::io(&p, e))?;
    serde_json::from_str(&text).map_err(|e| ModelError::Checkpoint(format!("{}: {e}", p.display())))
}

/// Restores the drafter weights, optimizer state and run state from `dir`.
pub fn restore(dir: &Path, trainer: &mut DrafterTrainer) -> Result<RunState, ModelError> {
    let state = read_state(dir)?;
    let tensors = ckpt::read_tensors(&dir.join("optimizer.safetensors"))?
        .into_iter()
        .map(|(k, t)| {
            Ok((
                k,
                t.f_to_device(trainer.device)?.f_to_kind(tch::Kind::Float)?,
            ))
        })
        .collect::<Result<HashMap<_, _>, ModelError>>()?;
    // the master weights carry the parameters; the drafter directory is for users
    trainer.opt.load_state(&tensors)?;
    Ok(state)
}
