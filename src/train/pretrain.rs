//! `dflash pretrain-target`: a plain next-token language-model trainer for the small Qwen3
//! target of the embedded default, so that target is a real language model of the corpus.
//! The corpus is tokenized with the given tokenizer (the model's vocabulary is the
//! tokenizer's), whose files are saved with the model, so the checkpoint carries its
//! own tokenizer.
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

use crate::model::{self, ModelError, TargetConfig};

use super::data;
use super::optim::{lr_at, AdamW, AdamWConfig};
use super::tokenizer::Tokenizer;

/// Settings of the pretraining run.
#[derive(Debug, Clone)]
pub struct PretrainConfig {
    pub steps: i64,
    pub batch: i64,
    pub seq_len: i64,
    pub lr: f64,
    pub seed: u64,
}

/// What a pretraining run gave (losses in nats per token).
#[derive(Debug, Clone, Copy)]
pub struct Pretrained {
    pub first_loss: f64,
    pub last_loss: f64,
    /// Mean loss on 8 batches of the held-out last 5% of the corpus's tokens.
    pub heldout_loss: f64,
    /// Held-out tokens per byte of held-out text, to state the held-out loss per byte.
    pub heldout_tokens_per_byte: f64,
    pub tokens: usize,
}

impl Pretrained {
    pub fn heldout_bits_per_byte(&self) -> f64 {
        self.heldout_loss / std::f64::consts::LN_2 * self.heldout_tokens_per_byte
    }
}

/// Trains `cfg`'s model (its `vocab_size` must cover `tok`'s ids) on `text` tokenized by
/// `tok`, each window starting with its BOS when it has one, and saves it (bf16) with
/// `tok`'s files to `out`.
pub fn pretrain(
    text: &str,
    tok: &Tokenizer,
    model_cfg: &TargetConfig,
    cfg: &PretrainConfig,
    out: &Path,
    quiet: bool,
) -> Result<Pretrained, ModelError> {
    if tok.vocab_size() as i64 > model_cfg.vocab_size {
        return Err(ModelError::Config(format!(
            "{} has {} ids, more than the model's vocab_size {}",
            tok.describe(),
            tok.vocab_size(),
            model_cfg.vocab_size
        )));
    }
    let (ids, starts) = tok
        .encode_with_offsets(text)
        .map_err(|e| ModelError::Config(format!("{}: {e}", tok.describe())))?;
    let ids: Vec<i64> = ids.into_iter().map(i64::from).collect();
    let split = ids.len() * 95 / 100;
    let (train, held) = ids.split_at(split);
    let seq = cfg.seq_len as usize;
    if train.len() < seq + 2 || held.len() < seq + 2 {
        return Err(ModelError::Config(format!(
            "the corpus is too short for seq_len {seq}"
        )));
    }
    let heldout_tokens_per_byte = held.len() as f64 / (text.len() - starts[split]) as f64;
    let files = tokenizer_files(tok)?;
    let bos = tok.bos().map(i64::from);
    let mut target = model::random_target(model_cfg, Device::Cpu, Kind::Float, cfg.seed as i64);
    let mut named: Vec<(String, Tensor)> = target.vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    for (_, t) in &mut named {
        let _ = t.set_requires_grad(true);
    }
    let mut opt = AdamW::new(
        named,
        AdamWConfig {
            weight_decay: 0.01,
            ..Default::default()
        },
    )?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let sample = |rng: &mut ChaCha8Rng, src: &[i64]| -> Tensor {
        let mut rows = Vec::with_capacity(cfg.batch as usize * (seq + 1));
        for _ in 0..cfg.batch {
            let at = rng.gen_range(0..src.len() - seq - 1);
            match bos {
                Some(b) => {
                    rows.push(b);
                    rows.extend_from_slice(&src[at..at + seq]);
                }
                None => rows.extend_from_slice(&src[at..at + seq + 1]),
            }
        }
        Tensor::from_slice(&rows).view([cfg.batch, seq as i64 + 1])
    };
    let loss_of = |t: &model::LoadedTarget, batch: &Tensor| -> Result<Tensor, ModelError> {
        let inputs = batch.narrow(1, 0, seq as i64);
        let labels = batch.narrow(1, 1, seq as i64);
        let logits = t
            .model
            .forward(&inputs, &[], true)?
            .logits
            .expect("asked for logits");
        Ok(logits
            .reshape([-1, model_cfg.vocab_size])
            .cross_entropy_for_logits(&labels.reshape([-1])))
    };
    let (mut first, mut last) = (f64::NAN, f64::NAN);
    let start = Instant::now();
    let warmup = cfg.steps / 25;
    for step in 0..cfg.steps {
        let batch = sample(&mut rng, train);
        let loss = loss_of(&target, &batch)?;
        loss.f_backward()?;
        let mut grad = opt.flat_grad();
        let _ = AdamW::clip(&mut grad, 1.0);
        opt.step(&grad, lr_at(step, cfg.steps, warmup, cfg.lr));
        let l = loss.double_value(&[]);
        if step == 0 {
            first = l;
        }
        last = l;
        if !quiet && (step + 1) % 50 == 0 {
            eprintln!(
                "pretrain step {:>5}/{}  loss {l:.4}  {:.1}s",
                step + 1,
                cfg.steps,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let held_loss = tch::no_grad(|| -> Result<f64, ModelError> {
        let mut r = ChaCha8Rng::seed_from_u64(99);
        let mut total = 0.0;
        for _ in 0..8 {
            total += loss_of(&target, &sample(&mut r, held))?.double_value(&[]);
        }
        Ok(total / 8.0)
    })?;
    target.vs.set_kind(Kind::BFloat16);
    model::save_target_with(&target, out, &files)?;
    Ok(Pretrained {
        first_loss: first,
        last_loss: last,
        heldout_loss: held_loss,
        heldout_tokens_per_byte,
        tokens: ids.len(),
    })
}

/// The tokenizer's files (name, contents), read before the output directory is replaced
/// (it may be the directory they come from).
fn tokenizer_files(tok: &Tokenizer) -> Result<Vec<(String, Vec<u8>)>, ModelError> {
    let paths: Vec<(&str, PathBuf)> = match tok {
        Tokenizer::Bytes => Vec::new(),
        Tokenizer::Hf(t) => t.files(),
    };
    paths
        .iter()
        .map(|(name, p)| {
            std::fs::read(p)
                .map(|b| (name.to_string(), b))
                .map_err(|e| ModelError::io(p, e))
        })
        .collect()
}

/// Reads the corpus text for pretraining.
pub fn read_corpus(path: &Path) -> Result<String, data::DataError> {
    std::fs::read_to_string(path).map_err(|source| data::DataError::Read {
        path: path.into(),
        source,
    })
}
