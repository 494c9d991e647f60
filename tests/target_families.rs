//! Target families (llama, qwen2, qwen3) selected from `config.json`: tiny random
//! checkpoints in the exact Hugging Face layout (HF names and `[out, in]` shapes, the
//! config fields HF writes, sharded in two files with an index; written by
//! `common::hf_checkpoint`) load through the real loader and give the logits and tapped
//! hidden states of an independent reference forward written here from plain tensor ops on
//! the weights read back from the files. Checkpoints that do not fit their config are
//! refused before the run directory exists.
mod common;

use std::collections::HashMap;
use std::path::Path;

use common::hf_checkpoint::{random_weights, read_back, write_checkpoint, Spec};
use common::{dflash, stderr, NO_HELDOUT, SMALL};
use dflash::model::{self, DrafterConfig, Family};
use dflash::train::optim::AdamWConfig;
use dflash::train::step::{Batch, DrafterTrainer, StepConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;
use tch::{Device, Kind, Tensor};

/// The inverse RoPE frequencies, in f64: `theta^(-2j/d)`, and the `llama3` remap written
/// from Hugging Face's `_compute_llama3_parameters`.
fn reference_inv_freq(spec: &Spec, with_scaling: bool) -> Vec<f64> {
    let d = spec.head_dim();
    let plain: Vec<f64> = (0..d / 2)
        .map(|j| 1.0 / spec.theta.powf((2 * j) as f64 / d as f64))
        .collect();
    let Some((factor, low_ff, high_ff, old)) = spec.llama3.filter(|_| with_scaling) else {
        return plain;
    };
    let old = old as f64;
    let (low_wavelen, high_wavelen) = (old / low_ff, old / high_ff);
    plain
        .iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / factor
            } else {
                let s = (old / wavelen - low_ff) / (high_ff - low_ff);
                (1.0 - s) * f / factor + s * f
            }
        })
        .collect()
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    let ms = (x * x).mean_dim(-1, true, Kind::Float);
    x / (ms + eps).sqrt() * w
}

fn linear(w: &HashMap<String, Tensor>, name: &str, x: &Tensor) -> Tensor {
    let y = x.matmul(&w[&format!("{name}.weight")].transpose(0, 1));
    match w.get(&format!("{name}.bias")) {
        Some(b) => y + b,
        None => y,
    }
}

/// Rotates `x` `[S, heads, d]` at positions 0..S: HF's `x * cos + rotate_half(x) * sin`
/// with `rotate_half(x) = [-x2, x1]`, cos/sin of the angle `p * f_j` on both halves.
fn rope(x: &Tensor, inv_freq: &[f64]) -> Tensor {
    let (s, d) = (x.size()[0], x.size()[2]);
    let half = d / 2;
    let angles: Vec<f32> = (0..s)
        .flat_map(|p| inv_freq.iter().map(move |f| (p as f64 * f) as f32))
        .collect();
    let ang = Tensor::from_slice(&angles).view([s, 1, half]);
    let (cos, sin) = (ang.cos(), ang.sin());
    let x1 = x.narrow(2, 0, half);
    let x2 = x.narrow(2, half, half);
    Tensor::cat(&[&x1 * &cos - &x2 * &sin, &x2 * &cos + &x1 * &sin], 2)
}

/// The reference forward of one sequence: logits `[S, V]` and every layer's raw output.
fn reference(
    spec: &Spec,
    w: &HashMap<String, Tensor>,
    ids: &[i64],
    inv_freq: &[f64],
) -> (Tensor, Vec<Tensor>) {
    let eps = 1e-5;
    let (s, d) = (ids.len() as i64, spec.head_dim());
    let n_rep = spec.heads / spec.kv_heads;
    let embed = &w["model.embed_tokens.weight"];
    let mut x = embed.index_select(0, &Tensor::from_slice(ids));
    let mut hidden = Vec::new();
    for l in 0..spec.layers {
        let p = format!("model.layers.{l}");
        // attention
        let h = rms_norm(&x, &w[&format!("{p}.input_layernorm.weight")], eps);
        let mut q = linear(w, &format!("{p}.self_attn.q_proj"), &h).view([s, spec.heads, d]);
        let mut k = linear(w, &format!("{p}.self_attn.k_proj"), &h).view([s, spec.kv_heads, d]);
        let v = linear(w, &format!("{p}.self_attn.v_proj"), &h).view([s, spec.kv_heads, d]);
        if spec.qk_norm() {
            q = rms_norm(&q, &w[&format!("{p}.self_attn.q_norm.weight")], eps);
            k = rms_norm(&k, &w[&format!("{p}.self_attn.k_norm.weight")], eps);
        }
        let (q, k) = (rope(&q, inv_freq), rope(&k, inv_freq));
        // causal: position i sees keys 0..=i
        let mut mask = vec![0f32; (s * s) as usize];
        for i in 0..s {
            for j in i + 1..s {
                mask[(i * s + j) as usize] = f32::NEG_INFINITY;
            }
        }
        let mask = Tensor::from_slice(&mask).view([s, s]);
        let mut heads = Vec::new();
        for hq in 0..spec.heads {
            let g = hq / n_rep; // HF repeat_kv: query head hq reads key/value head hq / n_rep
            let qh = q.select(1, hq);
            let kh = k.select(1, g);
            let vh = v.select(1, g);
            let scores = qh.matmul(&kh.transpose(0, 1)) / (d as f64).sqrt() + &mask;
            heads.push(scores.softmax(-1, Kind::Float).matmul(&vh));
        }
        let a = Tensor::cat(&heads, 1);
        x = &x + linear(w, &format!("{p}.self_attn.o_proj"), &a);
        // MLP
        let h = rms_norm(&x, &w[&format!("{p}.post_attention_layernorm.weight")], eps);
        let gate = linear(w, &format!("{p}.mlp.gate_proj"), &h);
        let up = linear(w, &format!("{p}.mlp.up_proj"), &h);
        let silu = &gate * gate.sigmoid();
        x = &x + linear(w, &format!("{p}.mlp.down_proj"), &(silu * up));
        hidden.push(x.shallow_clone());
    }
    let head = if spec.tied {
        embed
    } else {
        &w["lm_head.weight"]
    };
    let logits = rms_norm(&x, &w["model.norm.weight"], eps).matmul(&head.transpose(0, 1));
    (logits, hidden)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn ids(spec: &Spec) -> Vec<Vec<i64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    (0..2)
        .map(|_| {
            (0..12)
                .map(|_| rand::Rng::gen_range(&mut rng, 0..spec.vocab))
                .collect()
        })
        .collect()
}

/// Loads `spec`'s checkpoint through the real loader and compares with the reference.
fn check_family(spec: &Spec, family: Family, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    write_checkpoint(&ckpt, &spec.config(), &random_weights(spec, seed));
    let w = read_back(&ckpt);

    let target = model::load_target(&ckpt, Device::Cpu, Kind::Float).unwrap();
    let cfg = &target.model.cfg;
    assert_eq!(cfg.family, family);
    assert_eq!(cfg.head_dim, spec.head_dim());

    let rows = ids(spec);
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    let input = Tensor::from_slice(&flat).view([2, rows[0].len() as i64]);
    let taps: Vec<usize> = (0..spec.layers as usize).rev().collect();
    let out = tch::no_grad(|| target.model.forward(&input, &taps, true).unwrap());
    let logits = out.logits.as_ref().unwrap();
    assert_eq!(logits.size(), vec![2, 12, spec.vocab]);

    let inv_freq = reference_inv_freq(spec, true);
    for (b, row) in rows.iter().enumerate() {
        let (want, hidden) = reference(spec, &w, row, &inv_freq);
        let got = logits.select(0, b as i64);
        let diff = max_diff(&got, &want);
        assert!(diff < 1e-4, "{spec:?}: logits differ by {diff}");
        assert!(
            want.abs().max().double_value(&[]) > 0.1,
            "non-trivial logits"
        );
        for (slot, &layer) in taps.iter().enumerate() {
            let diff = max_diff(&out.hidden[slot].select(0, b as i64), &hidden[layer]);
            assert!(diff < 1e-4, "{spec:?}: layer {layer} differs by {diff}");
        }
        if spec.llama3.is_some() {
            // the remap changes some frequencies, and the loader must have applied it
            let plain = reference_inv_freq(spec, false);
            assert!(
                plain
                    .iter()
                    .zip(&inv_freq)
                    .any(|(p, s)| (p - s).abs() > 1e-3 * p),
                "the test's rope_scaling changes no frequency: {plain:?}"
            );
            assert_eq!(plain[0], inv_freq[0], "the highest frequency is kept");
            let (unscaled, _) = reference(spec, &w, row, &plain);
            let diff = max_diff(&got, &unscaled);
            assert!(diff > 1e-3, "plain RoPE gives the same logits ({diff})");
        }
    }

    // the drafter takes its shapes from this target and trains on its features
    let dcfg = DrafterConfig::for_target(cfg, 2, 4, spec.vocab - 1);
    assert_eq!(dcfg.head_dim, spec.head_dim());
    let d = model::new_drafter(&dcfg, cfg, Device::Cpu, 1).unwrap();
    let mut tr = DrafterTrainer::new(
        d.model,
        d.vs,
        &target.model.embed_tokens,
        &target.model.lm_head,
        Kind::Float,
        StepConfig {
            num_anchors: 4,
            gamma: 4.0,
            chunk_blocks: 2,
            attn_group_blocks: 1,
            attn_batch_blocks: 0,
            fused_loss: true,
            grad_clip: 1.0,
        },
        AdamWConfig::default(),
    )
    .unwrap();
    let feats = tch::no_grad(|| {
        target
            .model
            .forward(&input, &dcfg.target_layer_ids, false)
            .unwrap()
    });
    let batch = Batch {
        input_ids: input.shallow_clone(),
        loss_mask: input.ones_like(),
        features: Tensor::cat(&feats.hidden, -1),
        index: 0,
    };
    let m = tr
        .train_step(&batch, &mut ChaCha8Rng::seed_from_u64(1), 1e-3)
        .unwrap();
    assert!(m.loss.is_finite() && m.loss > 0.0, "{m:?}");
}

#[test]
fn llama_tied_with_biases_and_llama3_rope_matches_the_reference() {
    check_family(&Spec::llama_tied_biased(), Family::Llama, 1);
}

#[test]
fn llama_untied_with_llama3_rope_matches_the_reference() {
    check_family(&Spec::llama_untied(), Family::Llama, 2);
}

#[test]
fn qwen2_matches_the_reference() {
    check_family(&Spec::qwen2(), Family::Qwen2, 3);
}

#[test]
fn qwen3_matches_the_reference() {
    check_family(&Spec::qwen3(), Family::Qwen3, 4);
}

/// `dflash train --target DIR` on the small slice, with data that fits a small vocabulary.
fn train(target: &Path, run: &Path, extra: &[&str]) -> std::process::Output {
    dflash()
        .arg("train")
        .arg("--target")
        .arg(target)
        .arg("--run-dir")
        .arg(run)
        .args(SMALL)
        .args(NO_HELDOUT)
        .args(["--set", "synthetic_seq_len=32", "--steps", "2"])
        .args(extra)
        .output()
        .unwrap()
}

/// Refused with exit 2 and one line containing every needle; no run directory.
fn refused(target: &Path, needles: &[&str]) {
    let run = target.parent().unwrap().join("run");
    let out = train(target, &run, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for n in needles {
        assert!(err.contains(n), "expected {n:?} in {err}");
    }
    assert!(!run.exists(), "a run directory was made: {err}");
}

#[test]
fn a_llama_target_trains_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec::llama_tied_biased();
    let ckpt = dir.path().join("llama");
    write_checkpoint(&ckpt, &spec.config(), &random_weights(&spec, 5));
    let run = dir.path().join("run");
    let out = train(&ckpt, &run, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(common::losses(&run).len(), 2);
}

#[test]
fn checkpoints_that_do_not_fit_their_config_are_refused_before_the_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec::llama_untied();
    let weights = random_weights(&spec, 6);

    // unsupported model_type
    let t = dir.path().join("mistral");
    let mut c = spec.config();
    c["model_type"] = "mistral".into();
    c["architectures"] = json!(["MistralForCausalLM"]);
    write_checkpoint(&t, &c, &weights);
    refused(
        &t,
        &["model_type `mistral` is not supported", "config.json"],
    );

    // a tensor of the wrong shape: the config's MLP is wider than the checkpoint's
    let t = dir.path().join("shape");
    let mut c = spec.config();
    c["intermediate_size"] = 40.into();
    write_checkpoint(&t, &c, &weights);
    refused(
        &t,
        &[
            "-of-00002.safetensors",
            "`model.layers.0.mlp.gate_proj.weight` has shape [24, 32]",
            "expects [40, 32]",
        ],
    );

    // a missing tensor
    let t = dir.path().join("missing");
    let mut fewer = weights.clone();
    fewer.remove("model.layers.1.mlp.up_proj.weight");
    write_checkpoint(&t, &spec.config(), &fewer);
    refused(&t, &["`model.layers.1.mlp.up_proj.weight` is missing"]);

    // a Llama checkpoint whose config says Qwen3: its q/k norms are missing
    let t = dir.path().join("llama-as-qwen3");
    let mut c = spec.config();
    c["model_type"] = "qwen3".into();
    c["architectures"] = json!(["Qwen3ForCausalLM"]);
    c.as_object_mut().unwrap().remove("rope_scaling");
    write_checkpoint(&t, &c, &weights);
    refused(&t, &["`model.layers.0.self_attn.q_norm.weight` is missing"]);

    // a Qwen2 checkpoint whose config says Llama: its q/k/v biases would be dropped
    let q = Spec::qwen2();
    let t = dir.path().join("qwen2-as-llama");
    let mut c = q.config();
    c["model_type"] = "llama".into();
    c["architectures"] = json!(["LlamaForCausalLM"]);
    write_checkpoint(&t, &c, &random_weights(&q, 7));
    refused(
        &t,
        &["unexpected tensor `model.layers.0.self_attn.k_proj.bias`"],
    );
}

#[test]
fn header_checks_name_a_truncated_shard_and_an_unreadable_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let spec = Spec::qwen3();
    let weights = random_weights(&spec, 8);
    let err = |d: &Path| {
        let cfg = model::read_target_config(d).unwrap();
        model::check_target_weights(d, &cfg)
            .unwrap_err()
            .to_string()
    };

    // a shard cut short (an interrupted download): found from its length alone
    let t = dir.path().join("truncated");
    write_checkpoint(&t, &spec.config(), &weights);
    let shard = t.join("model-00002-of-00002.safetensors");
    let len = std::fs::metadata(&shard).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap();
    f.set_len(len - 100).unwrap();
    let e = err(&t);
    assert!(
        e.contains("model-00002-of-00002.safetensors") && e.contains("truncated"),
        "{e}"
    );

    // a tensor stored as integers
    let t = dir.path().join("dtype");
    write_checkpoint(&t, &spec.config(), &weights);
    let shard = t.join("model-00001-of-00002.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut views: Vec<(String, TensorView)> = st.tensors();
    let (name, v) = views[0].clone();
    views[0] = (
        name.clone(),
        TensorView::new(Dtype::I32, v.shape().to_vec(), v.data()).unwrap(),
    );
    let rewritten = safetensors::serialize(views, &None).unwrap();
    std::fs::write(&shard, rewritten).unwrap();
    let e = err(&t);
    assert!(e.contains(&format!("`{name}` has dtype I32")), "{e}");
    assert!(e.contains("model-00001-of-00002.safetensors"), "{e}");
}
