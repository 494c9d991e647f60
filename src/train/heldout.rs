//! The held-out evaluation before and after training: batches from the plan's held-out
//! split, their hidden states from a target loaded on the drafter's device.
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tch::Tensor;

use super::data;
use super::error::TrainError;
use super::plan::Plan;
use super::report::Eval;
use super::step::{Batch, DrafterTrainer};

pub(super) fn heldout_batches(plan: &Plan, max: usize) -> Vec<data::HostBatch> {
    let seqs: Vec<&data::Sequence> = plan.data.heldout.iter().collect();
    let per = (plan.cfg.batch_tokens / plan.cfg.seq_len).max(1);
    seqs.chunks(per)
        .take(max)
        .enumerate()
        .map(|(i, c)| data::collate(c, plan.pad, i as u64))
        .collect()
}

/// Loss, accuracy and tau_hat on held-out batches, with a target loaded on the drafter's
/// device (anchors drawn with a fixed seed, so before/after figures are comparable).
pub(super) fn evaluate(
    plan: &Plan,
    trainer: &DrafterTrainer,
    batches: &[data::HostBatch],
) -> Result<Eval, TrainError> {
    let target = plan
        .source
        .load(trainer.device, trainer.kind)
        .map_err(TrainError::Step)?;
    let taps = &plan.drafter_cfg.target_layer_ids;
    let mut sum = Eval::default();
    let mut rng = ChaCha8Rng::seed_from_u64(12345);
    for b in batches {
        let ids = b.input_ids.to_device(trainer.device);
        let out =
            tch::no_grad(|| target.model.forward(&ids, taps, false)).map_err(TrainError::Step)?;
        let batch = Batch {
            input_ids: b.input_ids.shallow_clone(),
            loss_mask: b.loss_mask.shallow_clone(),
            features: Tensor::cat(&out.hidden, -1),
            index: b.index,
        };
        let m = trainer
            .evaluate(&batch, &mut rng)
            .map_err(TrainError::Step)?;
        sum.loss += m.loss;
        sum.accuracy += m.accuracy;
        sum.tau_hat += m.tau_hat;
    }
    let n = batches.len() as f64;
    Ok(Eval {
        loss: sum.loss / n,
        accuracy: sum.accuracy / n,
        tau_hat: sum.tau_hat / n,
    })
}
