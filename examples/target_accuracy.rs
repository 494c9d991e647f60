//! How well a target predicts the next token of held-out text, and what that allows a
//! drafter's acceptance length:
//!
//! ```sh
//! cargo run --release --example target_accuracy -- fixtures/tiny-target-bpe
//! cargo run --release --example target_accuracy -- fixtures/tiny-target [CORPUS]
//! ```
//!
//! Reads the target checkpoint and its tokenizer (the byte tokenizer when the directory
//! has no `tokenizer.json`), tokenizes the corpus (default: the bundled one) and takes its
//! last 5% as held-out text, as `dflash pretrain-target` splits it. Prints the target's
//! teacher-forced top-1 accuracy on it, and the target's own tau_hat with block 16: from
//! each held-out position as the anchor, 1 + the number of the next 15 tokens the target
//! predicts in a row, each from the true text before it. That is what a drafter with the
//! target's knowledge would reach if it saw the true tokens inside the block as well; a
//! real drafter predicts the block from the context up to the anchor only, so on the same
//! text its tau_hat stays below this (unless it is a better language model than the
//! target).
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dflash::model;
use dflash::train::pipeline::default_corpus;
use dflash::train::tokenizer::resolve;
use tch::{Device, Kind, Tensor};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        bail!("usage: target_accuracy TARGET_DIR [CORPUS]");
    };
    let corpus = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(default_corpus);
    let text = std::fs::read_to_string(&corpus)
        .with_context(|| format!("reading {}", corpus.display()))?;
    let cfg = model::read_target_config(&dir)?;
    let tok = resolve(None, Some(&dir), cfg.vocab_size)?;
    let target = model::load_target(&dir, Device::Cpu, Kind::Float)?;
    let ids: Vec<i64> = tok
        .encode(&text)
        .map_err(anyhow::Error::msg)?
        .into_iter()
        .map(i64::from)
        .collect();
    let held = &ids[ids.len() * 95 / 100..];
    let seq = 256usize.min(held.len() - 1);
    let bos = tok.bos().map(i64::from);
    let mut correct: Vec<bool> = Vec::with_capacity(held.len());
    let _guard = tch::no_grad_guard();
    for start in (0..held.len() - 1).step_by(seq) {
        let end = (start + seq).min(held.len() - 1);
        if end - start < 2 {
            break;
        }
        let mut input: Vec<i64> = bos.into_iter().collect();
        input.extend_from_slice(&held[start..end]);
        let skip = bos.is_some() as i64; // the position after BOS predicts held[start]
        let labels = Tensor::from_slice(&held[start + 1..end + 1]);
        let x = Tensor::from_slice(&input).view([1, -1]);
        let logits = target
            .model
            .forward(&x, &[], true)?
            .logits
            .context("the target gave no logits")?;
        let pred = logits
            .squeeze_dim(0)
            .narrow(0, skip, (end - start) as i64)
            .argmax(-1, false);
        correct.extend(Vec::<bool>::try_from(pred.eq_tensor(&labels))?);
    }
    // correct[t]: the target predicts held[t + 1] from held[..=t]
    let total = correct.len();
    let a = correct.iter().filter(|&&c| c).count() as f64 / total as f64;
    const BLOCK: usize = 16;
    let anchors = total.saturating_sub(BLOCK - 1);
    if anchors == 0 {
        bail!("the held-out text is shorter than one block");
    }
    let tau: f64 = (0..anchors)
        .map(|t| 1 + correct[t..t + BLOCK - 1].iter().take_while(|&&c| c).count())
        .sum::<usize>() as f64
        / anchors as f64;
    println!(
        "{}: {} held-out tokens ({}); next-token top-1 accuracy {:.3}; the target's own tau_hat (block {BLOCK}, teacher-forced): {:.2}",
        dir.display(),
        total,
        tok.describe(),
        a,
        tau
    );
    Ok(())
}
