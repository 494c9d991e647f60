//! Fault injection at every write, sync and rename of a checkpoint and of the drafter
//! export (in process: the N-th crash point panics, which like a crash skips every
//! clean-up): after each, `latest` names a complete checkpoint (the old one or the new
//! one, byte for byte), the drafter directory is the old or the new one, and the next
//! start's clean-up leaves no temporary behind. `tests/crash.rs` does the same through
//! the binary with SIGKILL.
use std::path::{Path, PathBuf};

use dflash::model::{self, checkpoint as ckpt};
use dflash::train::checkpoint::{self, RunState};
use dflash::train::data::{self, bytes, Loader};
use dflash::train::optim::AdamWConfig;
use dflash::train::pipeline;
use dflash::train::step::{Batch, DrafterTrainer, StepConfig};
use dflash::{durable, run_files};
use rand::SeedableRng;
use tch::{Device, Kind, Tensor};

struct Setup {
    trainer: DrafterTrainer,
    scratch: DrafterTrainer,
    tcfg: model::Qwen3Config,
}

fn trainer(target: &model::LoadedTarget, seed: i64) -> DrafterTrainer {
    let tcfg = &target.model.cfg;
    let dcfg = model::DrafterConfig::for_target(tcfg, 2, 8, bytes::MASK);
    let d = model::new_drafter(&dcfg, tcfg, Device::Cpu, seed).unwrap();
    let step = StepConfig {
        num_anchors: 8,
        gamma: 4.0,
        chunk_blocks: 16,
        attn_group_blocks: 32,
        attn_batch_blocks: 0,
        fused_loss: true,
        grad_clip: 1.0,
    };
    DrafterTrainer::new(
        d.model,
        d.vs,
        &target.model.embed_tokens,
        &target.model.lm_head,
        Kind::Float,
        step,
        AdamWConfig::default(),
    )
    .unwrap()
}

fn setup() -> Setup {
    let target =
        model::load_target(&pipeline::byte_target_dir(), Device::Cpu, Kind::Float).unwrap();
    let ds = data::load(&pipeline::default_corpus(), 64, 260, 0.0).unwrap();
    let mut loader = Loader::new(ds.train, 256, 0, bytes::PAD, 0);
    let host = loader.next_batch();
    let taps =
        model::DrafterConfig::for_target(&target.model.cfg, 2, 8, bytes::MASK).target_layer_ids;
    let out = tch::no_grad(|| target.model.forward(&host.input_ids, &taps, false)).unwrap();
    let batch = Batch {
        input_ids: host.input_ids,
        loss_mask: host.loss_mask,
        features: Tensor::cat(&out.hidden, -1),
        index: 0,
    };
    let mut t = trainer(&target, 0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    t.train_step(&batch, &mut rng, 1e-3).unwrap();
    Setup {
        trainer: t,
        scratch: trainer(&target, 1),
        tcfg: target.model.cfg.clone(),
    }
}

fn state(step: i64) -> RunState {
    RunState {
        step,
        data_position: step as u64,
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if durable::is_leftover(&e.file_name().to_string_lossy()) {
            out.push(e.path());
        } else if e.file_type().unwrap().is_dir() {
            out.extend(leftovers(&e.path()));
        }
    }
    out
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Runs `write` with a crash at point 1, 2, ... until it completes; after each crash,
/// `check` sees the directory (`false`), then the next start's clean-up runs and must
/// leave no temporary, and `check` sees it again (`true`). Returns the number of crash
/// points.
fn every_crash_point(
    base: &Path,
    work: &Path,
    write: &dyn Fn(&Path) -> Result<(), model::ModelError>,
    check: &mut dyn FnMut(&Path, u64, bool),
) -> u64 {
    for n in 1.. {
        let trial = work.join(format!("trial-{n}"));
        copy_dir(base, &trial);
        durable::panic_at_crash_point(n);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&trial)));
        durable::panic_at_crash_point(0);
        match r {
            Ok(done) => {
                done.unwrap();
                check(&trial, n, false);
                return n - 1;
            }
            Err(_) => {
                check(&trial, n, false);
                durable::clean_leftovers(&trial).unwrap();
                checkpoint::clean_leftovers(&trial).unwrap();
                assert_eq!(leftovers(&trial), Vec::<PathBuf>::new(), "crash point {n}");
                check(&trial, n, true);
                std::fs::remove_dir_all(&trial).unwrap();
            }
        }
    }
    unreachable!()
}

#[test]
fn a_crash_at_any_point_of_a_checkpoint_or_drafter_write_leaves_old_or_new() {
    // the injected crashes are expected panics: keep them off the output
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !info.to_string().contains("injected crash") {
            default_hook(info);
        }
    }));
    let mut s = setup();
    let dir = tempfile::tempdir().unwrap();
    // reference checkpoints of steps 1 and 2 (different drafter bytes: the step trained)
    let base = dir.path().join("base");
    checkpoint::save(&base, &s.trainer, state(1), 1).unwrap();
    let old_bytes = read(&base.join("checkpoints/step-00000001/drafter/model.safetensors"));
    let new_ref = dir.path().join("new-ref");
    model::save_drafter(&s.trainer.vs, &s.trainer.drafter.cfg, &new_ref).unwrap();
    assert_eq!(read(&new_ref.join("model.safetensors")), old_bytes);
    // the step-2 checkpoint differs only in its state; make its drafter differ too
    tch::no_grad(|| {
        for (_, v) in s.trainer.vs.variables() {
            let _ = v.shallow_clone().g_add_scalar_(0.5);
        }
    });
    let new_ref = dir.path().join("new-ref2");
    model::save_drafter(&s.trainer.vs, &s.trainer.drafter.cfg, &new_ref).unwrap();
    let new_bytes = read(&new_ref.join("model.safetensors"));
    assert_ne!(old_bytes, new_bytes);

    // 1. a checkpoint of step 2 with keep 1 over one of step 1: write, sync, rename,
    //    `latest`, pruning of step 1
    let trainer = &s.trainer;
    let mut outcomes = [0u32; 2];
    let points = every_crash_point(
        &base,
        &dir.path().join("ckpt"),
        &|run| checkpoint::save(run, trainer, state(2), 1).map(|_| ()),
        &mut |run, n, cleaned| {
            let c = checkpoint::latest(run)
                .unwrap_or_else(|e| panic!("crash point {n}: {e}"))
                .unwrap_or_else(|| panic!("crash point {n}: no latest"));
            let st = checkpoint::read_state(&c.dir).unwrap();
            assert_eq!(st.step, c.step, "crash point {n}");
            let bytes = read(&c.dir.join("drafter/model.safetensors"));
            let want = if c.step == 1 { &old_bytes } else { &new_bytes };
            assert_eq!(&bytes, want, "crash point {n}: step {}", c.step);
            model::load_drafter(&c.dir.join("drafter"), &s.tcfg, Device::Cpu).unwrap();
            ckpt::read_tensors(&c.dir.join("optimizer.safetensors")).unwrap();
            if !cleaned {
                outcomes[(c.step - 1) as usize] += 1;
            }
        },
    );
    checkpoint::restore(
        &checkpoint::latest(&base).unwrap().unwrap().dir,
        &mut s.scratch,
    )
    .unwrap();
    println!(
        "checkpoint: {points} crash points and the completed write; latest named the old checkpoint after {}, the new one after {}",
        outcomes[0], outcomes[1]
    );
    assert!(points >= 10, "{points}");
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");

    // 2. the final drafter export over an existing drafter directory
    let run = dir.path().join("export");
    let drafter_dir = run.join(run_files::DRAFTER);
    std::fs::create_dir_all(&run).unwrap();
    model::save_drafter(&s.trainer.vs, &s.trainer.drafter.cfg, &drafter_dir).unwrap();
    // overwrite with the old bytes so the export below changes something
    std::fs::write(drafter_dir.join("model.safetensors"), &old_bytes).unwrap();
    let mut seen = [0u32; 2];
    let points = every_crash_point(
        &run,
        &dir.path().join("drafter"),
        &|r| {
            model::save_drafter(
                &trainer.vs,
                &trainer.drafter.cfg,
                &r.join(run_files::DRAFTER),
            )
        },
        &mut |r, n, cleaned| {
            let bytes = read(&r.join("drafter/model.safetensors"));
            assert!(bytes == old_bytes || bytes == new_bytes, "crash point {n}");
            if !cleaned {
                seen[usize::from(bytes == new_bytes)] += 1;
            }
            model::load_drafter(&r.join("drafter"), &s.tcfg, Device::Cpu).unwrap();
        },
    );
    println!(
        "drafter export: {points} crash points and the completed write; the old drafter after {}, the new one after {}",
        seen[0], seen[1]
    );
    assert!(
        points >= 4 && seen[0] > 0 && seen[1] > 0,
        "{points} {seen:?}"
    );
}
