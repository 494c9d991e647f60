//! Run checkpoints: `RUN_DIR/checkpoints/step-NNNNNNNN/` holds the drafter (a Hugging
//! Face-style directory), the optimizer state and `state.json` (step, data position).
//! Each is built under a temporary name, synced and renamed; `RUN_DIR/checkpoints/latest`
//! names the newest complete one and is itself replaced atomically, so a crash at any
//! point leaves `latest` naming a complete checkpoint (see [`crate::durable`]). Only the
//! newest `keep_checkpoints` are kept.
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{self, checkpoint as ckpt, ModelError};
use crate::{durable, run_files};

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
    run_dir.join(run_files::CHECKPOINTS)
}

/// A complete checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub step: i64,
}

impl Checkpoint {
    /// `RUN_DIR/checkpoints/step-00000012 (step 12)`.
    pub fn describe(&self) -> String {
        format!("{} (step {})", self.dir.display(), self.step)
    }
}

fn step_name(step: i64) -> String {
    format!("step-{step:08}")
}

fn step_of(name: &str) -> Option<i64> {
    let n = name.strip_prefix("step-")?;
    (n.len() == 8 && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
}

/// Saves a checkpoint, points `latest` at it, then removes all but the `keep` newest
/// checkpoints up to it (0: keep all). Every piece is synced before it is named.
pub fn save(
    run_dir: &Path,
    trainer: &DrafterTrainer,
    state: RunState,
    keep: usize,
) -> Result<Checkpoint, ModelError> {
    let root = checkpoints_dir(run_dir);
    let name = step_name(state.step);
    let dir = root.join(&name);
    ckpt::write_dir_atomically(&dir, |tmp| {
        model::save_drafter(&trainer.vs, &trainer.drafter.cfg, &tmp.join("drafter"))?;
        durable::crash_point("checkpoint drafter written");
        ckpt::write_safetensors(&trainer.opt.state(), &tmp.join("optimizer.safetensors"))?;
        durable::crash_point("checkpoint optimizer written");
        ckpt::write_json(&state, &tmp.join("state.json"))
    })?;
    let pointer = root.join("latest");
    durable::write_file(&pointer, name.as_bytes()).map_err(|e| ModelError::io(&pointer, e))?;
    prune(&root, keep, state.step)?;
    Ok(Checkpoint {
        dir,
        step: state.step,
    })
}

/// The step checkpoints under `root`, oldest first.
fn list(root: &Path) -> Result<Vec<(i64, PathBuf)>, ModelError> {
    let mut out = Vec::new();
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(ModelError::io(root, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| ModelError::io(root, e))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            out.push((step, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// Keeps the `keep` newest checkpoints up to step `latest` (0: all of them); removes the
/// others, and any newer than `latest` (written by a run that crashed before naming it).
fn prune(root: &Path, keep: usize, latest: i64) -> Result<(), ModelError> {
    let all = list(root)?;
    let kept_from = if keep == 0 {
        0
    } else {
        all.iter()
            .filter(|(s, _)| *s <= latest)
            .map(|(s, _)| *s)
            .rev()
            .nth(keep - 1)
            .unwrap_or(0)
    };
    for (step, dir) in all {
        if step > latest || step < kept_from {
            durable::remove_dir(&dir).map_err(|e| ModelError::io(&dir, e))?;
        }
    }
    Ok(())
}

/// The checkpoint `latest` names, if any; an error if it names one that is not complete.
pub fn latest(run_dir: &Path) -> Result<Option<Checkpoint>, ModelError> {
    let root = checkpoints_dir(run_dir);
    let pointer = root.join("latest");
    let name = match fs::read_to_string(&pointer) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ModelError::io(&pointer, e)),
    };
    let name = name.trim();
    let step = step_of(name).ok_or_else(|| {
        ModelError::Checkpoint(format!(
            "{} holds {name:?}, not a checkpoint name",
            pointer.display()
        ))
    })?;
    let dir = root.join(name);
    if !dir.join("state.json").is_file() {
        return Err(ModelError::Checkpoint(format!(
            "{} names {name}, which is missing or incomplete",
            pointer.display()
        )));
    }
    Ok(Some(Checkpoint { dir, step }))
}

/// Removes what a crashed checkpoint write left behind (temporary and half-removed
/// directories, a temporary `latest`). Call under the run lock.
pub fn clean_leftovers(run_dir: &Path) -> std::io::Result<durable::Cleaned> {
    durable::clean_leftovers(&checkpoints_dir(run_dir))
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
