//! End to end on the CPU through the `dflash` binary: the embedded default learns,
//! resume equals a straight run, shutdown propagates both ways, and user errors exit 2
//! with one line naming the problem and leave no run directory behind.

mod common;
use common::{dflash, losses, stderr, train_ok, SMALL};

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

#[test]
fn default_slice_trains_and_the_loss_falls() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    train_ok(&run, &["--steps", "30"]);
    let l = losses(&run);
    assert_eq!(l.len(), 30);
    assert!(mean(&l[25..]) < 0.85 * mean(&l[..5]), "{l:?}");
    for f in [
        "config.toml",
        "summary.json",
        "drafter/config.json",
        "drafter/model.safetensors",
        "checkpoints/latest",
    ] {
        assert!(run.join(f).exists(), "{f}");
    }
}

#[test]
fn the_embedded_default_passes_a_held_out_tau_hat_of_2() {
    // the whole default run (150 steps of the BPE target's continuations), as a user runs
    // it: the drafter must predict its target's next tokens, not only lower a loss
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = dflash()
        .args(["train", "--quiet", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    let before = summary["heldout_before"]["tau_hat"].as_f64().unwrap();
    let after = summary["heldout_after"]["tau_hat"].as_f64().unwrap();
    assert!(
        before < 1.1,
        "an untrained drafter accepts almost nothing: {before}"
    );
    assert!(after > 2.0, "held-out tau_hat {before} -> {after}");
}

#[test]
fn ten_steps_plus_resume_ten_equals_twenty_straight() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    train_ok(&a, &["--steps", "20"]);
    train_ok(&b, &["--steps", "20", "--stop-after", "10"]);
    assert_eq!(losses(&b).len(), 10);
    // the resumed run takes its settings from the run directory
    train_ok(&b, &["--resume"]);
    let (la, lb) = (losses(&a), losses(&b));
    assert_eq!(lb.len(), 20);
    for (i, (x, y)) in la.iter().zip(&lb).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * x.abs().max(1.0),
            "step {i}: {x} vs {y}"
        );
    }
}

fn fails_with(args: &[&str], code: i32, needle: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let out = dflash()
        .arg("train")
        .args(args)
        .arg("--run-dir")
        .arg(&run)
        .args(SMALL)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    err
}

#[test]
fn a_failing_target_worker_stops_the_drafter_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::cargo_bin("dflash")
        .unwrap()
        .env("DFLASH_INJECT_FAULT", "target:5")
        .args(["train", "--steps", "30", "--run-dir"])
        .arg(dir.path().join("r"))
        .args(SMALL)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("a target worker failed: injected fault"),
        "{err}"
    );
}

#[test]
fn a_failing_drafter_releases_the_target_workers() {
    let dir = tempfile::tempdir().unwrap();
    let out = assert_cmd::Command::cargo_bin("dflash")
        .unwrap()
        .env("DFLASH_INJECT_FAULT", "drafter:3")
        .args([
            "train",
            "--steps",
            "30",
            "--set",
            "queue_capacity=1",
            "--run-dir",
        ])
        .arg(dir.path().join("r"))
        .args(SMALL)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("injected fault"), "{err}");
}

#[test]
fn user_errors_exit_2_with_one_line_and_no_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let bad_jsonl = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad_jsonl,
        "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, 99999]}\n",
    )
    .unwrap();
    let bad_target = dir.path().join("bad-target");
    std::fs::create_dir(&bad_target).unwrap();
    std::fs::write(bad_target.join("config.json"), "{\"hidden_size\": 8}").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--data".into(), "/nonexistent/data.jsonl".into()],
            "cannot read data /nonexistent/data.jsonl",
        ),
        (
            vec!["--data".into(), bad_jsonl.display().to_string()],
            "bad.jsonl:2: token id 99999",
        ),
        (
            vec!["--target".into(), "/nonexistent/ckpt".into()],
            "is not a directory",
        ),
        (
            vec!["--target".into(), bad_target.display().to_string()],
            "missing field",
        ),
        (
            vec!["--set".into(), "target_layer_ids=[1, 99]".into()],
            "target layer id 99 is out of range",
        ),
        (
            vec!["--drafter-device".into(), "cuda:0".into()],
            "CUDA is not available",
        ),
        (
            vec!["--drafter-device".into(), "tpu".into()],
            "unknown device",
        ),
        (vec!["--set".into(), "lrr=1".into()], "unknown field `lrr`"),
        (vec!["--set".into(), "block_size=1".into()], "block_size"),
    ];
    for (args, needle) in cases {
        if needle.contains("CUDA") && tch::Cuda::is_available() {
            continue;
        }
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let err = fails_with(&args, 2, needle);
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    // a run directory that already holds a run is not overwritten
    let run = dir.path().join("done");
    train_ok(&run, &["--steps", "2"]);
    let o = dflash()
        .args(["train", "--steps", "2", "--run-dir"])
        .arg(&run)
        .args(SMALL)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already holds a run"));
}

#[test]
fn failed_setup_leaves_no_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("never");
    let o = dflash()
        .args(["train", "--data", "/nonexistent.txt", "--run-dir"])
        .arg(&run)
        .args(SMALL)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(!run.exists());
}

/// The threaded pipeline (target worker -> queue -> drafter) computes exactly what a
/// single-thread loop over the same library calls computes.
#[test]
fn pipeline_equals_the_single_thread_path() {
    use dflash::model;
    use dflash::train::config::TrainConfig;
    use dflash::train::data::{self, bytes, Loader};
    use dflash::train::optim::{lr_at, AdamWConfig};
    use dflash::train::pipeline::{self, step_seed};
    use dflash::train::step::{Batch, DrafterTrainer, StepConfig};
    use rand::SeedableRng;
    use tch::{Device, Kind, Tensor};

    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let steps = 6;
    // the byte-level tiny target on the text corpus: byte ids need no tokenizer here
    let (target_dir, corpus) = (pipeline::byte_target_dir(), pipeline::default_corpus());
    train_ok(
        &run,
        &[
            "--steps",
            &steps.to_string(),
            "--set",
            "queue_capacity=3",
            "--target",
            target_dir.to_str().unwrap(),
            "--data",
            corpus.to_str().unwrap(),
        ],
    );
    let threaded = losses(&run);

    let cfg = TrainConfig::default()
        .with_overrides(&[
            "seq_len=128".into(),
            "batch_tokens=1024".into(),
            "num_anchors=16".into(),
        ])
        .unwrap();
    let target =
        model::load_target(&pipeline::byte_target_dir(), Device::Cpu, Kind::Float).unwrap();
    let tcfg = target.model.cfg.clone();
    let dcfg =
        model::DrafterConfig::for_target(&tcfg, cfg.drafter_layers, cfg.block_size, bytes::MASK);
    let d = model::new_drafter(&dcfg, &tcfg, Device::Cpu, cfg.seed as i64).unwrap();
    let step_cfg = StepConfig {
        num_anchors: cfg.num_anchors,
        gamma: 4.0,
        chunk_blocks: cfg.chunk_blocks,
        attn_group_blocks: cfg.attn_group_blocks,
        attn_batch_blocks: cfg.attn_batch_blocks,
        fused_loss: cfg.fused_loss,
        grad_clip: cfg.grad_clip,
    };
    let mut trainer = DrafterTrainer::new(
        d.model,
        d.vs,
        &target.model.embed_tokens,
        &target.model.lm_head,
        Kind::Float,
        step_cfg,
        AdamWConfig::default(),
    )
    .unwrap();
    let ds = data::load(
        &pipeline::default_corpus(),
        cfg.seq_len,
        tcfg.vocab_size,
        cfg.heldout_fraction,
    )
    .unwrap();
    let mut loader = Loader::new(ds.train, cfg.batch_tokens, cfg.seed, bytes::PAD, 0);
    let warmup = (steps as f64 * cfg.warmup_ratio).round() as i64;
    for step in 0..steps {
        let host = loader.next_batch();
        let out = tch::no_grad(|| {
            target
                .model
                .forward(&host.input_ids, &dcfg.target_layer_ids, false)
        })
        .unwrap();
        let batch = Batch {
            input_ids: host.input_ids,
            loss_mask: host.loss_mask,
            features: Tensor::cat(&out.hidden, -1),
            index: host.index,
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(step_seed(cfg.seed, step));
        let m = trainer
            .train_step(&batch, &mut rng, lr_at(step, steps, warmup, cfg.lr))
            .unwrap();
        let t = threaded[step as usize];
        assert!(
            (m.loss - t).abs() <= 1e-5 * t.abs(),
            "step {step}: single-thread {} vs pipeline {t}",
            m.loss
        );
    }
}
