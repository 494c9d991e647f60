//! The DFlash training objective, one function per piece: anchor sampling, the noised
//! block and its positions, the block mask and its layouts (in [`super::masks`],
//! re-exported here), labels with the decayed weight mask,
//! the weighted cross-entropy over a chunked lm_head, token accuracy and the
//! acceptance-length proxy tau_hat.
use rand::seq::index::sample;
use rand::Rng;
use tch::{Device, Kind, Tensor};

use super::error::ModelError;
pub use super::masks::*;

/// Anchors of one step: `anchors [B, N]` (i64, sorted ascending among kept slots) and
/// `keep [B, N]` (bool, false for unused slots, whose anchor is 0).
#[derive(Debug)]
pub struct Anchors {
    pub anchors: Tensor,
    pub keep: Tensor,
}

/// Draws anchors on the host. Candidates are positions `i` in `[0, S-2]` with
/// `loss_mask[i]` and `loss_mask[i+1]`; each sequence draws `min(slots, candidates)` of
/// them without replacement. The slot count is fixed so that shapes stay static.
pub fn sample_anchors(
    loss_mask: &Tensor,
    slots: i64,
    rng: &mut impl Rng,
) -> Result<Anchors, ModelError> {
    let (b, s) = (loss_mask.size()[0], loss_mask.size()[1]);
    let mask: Vec<i64> = Vec::try_from(
        loss_mask
            .f_to_kind(Kind::Int64)?
            .f_to_device(Device::Cpu)?
            .f_view([-1])?,
    )?;
    let mut anchors = vec![0i64; (b * slots) as usize];
    let mut keep = vec![false; (b * slots) as usize];
    for row in 0..b as usize {
        let m = &mask[row * s as usize..(row + 1) * s as usize];
        let candidates: Vec<i64> = (0..s.saturating_sub(1) as usize)
            .filter(|&i| m[i] != 0 && m[i + 1] != 0)
            .map(|i| i as i64)
            .collect();
        let n = candidates.len().min(slots as usize);
        let mut chosen: Vec<i64> = sample(rng, candidates.len(), n)
            .into_iter()
            .map(|i| candidates[i])
            .collect();
        chosen.sort_unstable();
        for (j, a) in chosen.into_iter().enumerate() {
            anchors[row * slots as usize + j] = a;
            keep[row * slots as usize + j] = true;
        }
    }
    Ok(Anchors {
        anchors: Tensor::from_slice(&anchors).view([b, slots]),
        keep: Tensor::from_slice(&keep).view([b, slots]),
    })
}

/// Token ids of the noised blocks, `[B, N * bs]`: per anchor `[input_ids[anchor], MASK x (bs-1)]`.
pub fn noise_block_ids(
    input_ids: &Tensor,
    anchors: &Tensor,
    block_size: i64,
    mask_token_id: i64,
) -> Tensor {
    let (b, n) = (anchors.size()[0], anchors.size()[1]);
    let first = input_ids.gather(1, anchors, false).unsqueeze(-1);
    let masks = Tensor::full(
        [b, n, block_size - 1],
        mask_token_id,
        (Kind::Int64, input_ids.device()),
    );
    Tensor::cat(&[first, masks], -1).view([b, n * block_size])
}

/// Positions of all keys, `[B, S + N * bs]`: `cat(arange(S), anchor + arange(bs) per block)`.
pub fn positions(seq_len: i64, anchors: &Tensor, block_size: i64) -> Tensor {
    let (b, n) = (anchors.size()[0], anchors.size()[1]);
    let dev = anchors.device();
    let ctx = Tensor::arange(seq_len, (Kind::Int64, dev))
        .unsqueeze(0)
        .expand([b, seq_len], false);
    let blocks = (anchors.unsqueeze(-1) + Tensor::arange(block_size, (Kind::Int64, dev)))
        .view([b, n * block_size]);
    Tensor::cat(&[ctx, blocks], 1)
}

/// Labels `[B, N, bs]` (`y[b,n,k] = input_ids[anchor + k]`, clamped inside the sequence)
/// and the weight mask `m = keep * [anchor+k < S] * [k > 0] * loss_mask[anchor+k]` (float).
pub fn labels_and_mask(
    input_ids: &Tensor,
    loss_mask: &Tensor,
    anchors: &Tensor,
    keep: &Tensor,
    block_size: i64,
) -> (Tensor, Tensor) {
    let (b, s) = (input_ids.size()[0], input_ids.size()[1]);
    let n = anchors.size()[1];
    let dev = input_ids.device();
    let k = Tensor::arange(block_size, (Kind::Int64, dev));
    let idx = anchors.to_device(dev).unsqueeze(-1) + &k;
    let inside = idx.lt(s);
    let idx = idx.clamp_max(s - 1).view([b, n * block_size]);
    let labels = input_ids.gather(1, &idx, false).view([b, n, block_size]);
    let lm = loss_mask
        .to_device(dev)
        .to_kind(Kind::Float)
        .gather(1, &idx, false)
        .view([b, n, block_size]);
    let m = lm
        * inside.to_kind(Kind::Float)
        * keep.to_device(dev).to_kind(Kind::Float).unsqueeze(-1)
        * k.gt(0).to_kind(Kind::Float);
    (labels, m)
}

/// The first position of a block that carries loss weight: the anchor's own token
/// (`k = 0`) is given, so `labels_and_mask` weighs it 0 and its logits are never needed.
pub const FIRST_WEIGHTED: i64 = 1;

/// Decay weights `w_k = exp(-(k-1)/gamma)`, `[bs]` (float).
pub fn decay_weights(block_size: i64, gamma: f64, device: Device) -> Tensor {
    ((Tensor::arange(block_size, (Kind::Float, device)) - 1.0) * (-1.0 / gamma)).exp()
}

/// The gamma of the reference recipes: 7 for bs=16, 5 for bs=10, 4 for bs=8; otherwise
/// interpolated as `7 * bs / 16`.
pub fn default_gamma(block_size: i64) -> f64 {
    match block_size {
        16 => 7.0,
        10 => 5.0,
        8 => 4.0,
        bs => 7.0 * bs as f64 / 16.0,
    }
}

/// Result of the weighted cross-entropy.
#[derive(Debug)]
pub struct LossOutput {
    /// Scalar, differentiable: `sum(m*w*CE) / sum(m*w)`.
    pub loss: Tensor,
    /// `[B, N, bs]` bool: argmax equals the label.
    pub correct: Tensor,
}

/// `sum(m * w * CE(lm_head(h), y)) / sum(m * w)` with the lm_head applied `chunk_blocks`
/// blocks at a time so the `[B, N*bs, vocab]` logits never exist at once.
/// `hidden` is `[B, N*bs, H]`, `lm_head` `[vocab, H]`.
pub fn weighted_ce_chunked(
    hidden: &Tensor,
    lm_head: &Tensor,
    labels: &Tensor,
    m: &Tensor,
    w: &Tensor,
    chunk_blocks: i64,
) -> LossOutput {
    let (b, n, bs) = (labels.size()[0], labels.size()[1], labels.size()[2]);
    let h = hidden.size()[2];
    let hidden = hidden.view([b, n, bs, h]);
    let mw = m * w;
    let denom = mw.sum(Kind::Float).clamp_min(1e-6);
    let step = chunk_blocks.max(1);
    let mut total: Option<Tensor> = None;
    let mut correct = Vec::new();
    let mut start = 0;
    while start < n {
        let len = step.min(n - start);
        // (B, len, bs, H) -> (B*len*bs, vocab)
        let hc = hidden.narrow(1, start, len).reshape([-1, h]);
        // The logits stay in `hidden`'s kind; log-softmax reads them and writes fp32
        // (on CUDA one kernel converts as it loads, and its backward writes the gradient
        // in the logits' kind), so no fp32 copy of the logits is made or cast back. The
        // values are those of casting first: the cast is exact, the sums run in fp32.
        let logits = hc.matmul(&lm_head.tr());
        let y = labels.narrow(1, start, len).reshape([-1]);
        let logp = logits.log_softmax(-1, Kind::Float);
        let ce = logp.nll_loss_nd::<Tensor>(&y, None, tch::Reduction::None, -100);
        let part = (ce * mw.narrow(1, start, len).reshape([-1])).sum(Kind::Float);
        total = Some(match total {
            Some(t) => t + part,
            None => part,
        });
        correct.push(tch::no_grad(|| {
            logits.argmax(-1, false).eq_tensor(&y).view([b, len, bs])
        }));
        start += len;
    }
    LossOutput {
        loss: total.expect("at least one block") / denom,
        correct: Tensor::cat(&correct, 1),
    }
}

/// The loss of [`weighted_ce_chunked`] with its gradient computed chunk by chunk in the
/// forward pass, in the logits' kind (bf16 on the GPU), reading the logits once:
///
/// 1. `p = softmax(logits)` in the logits' kind (the sums run in fp32 inside the kernel;
///    this is the gradient's precision on every entry but the label's), and
///    `correct = argmax(p) == y` (softmax is monotonic);
/// 2. the label's entry: `p_y` is gathered, then zeroed, and `s = sum_j p_j` over the rest
///    in fp32 (one read). The label's gradient is `p_y - 1 = -s`, exact where `p_y` is
///    near 1 (where `p_y` rounded to bf16 would cancel to 0), and the token's loss is
///    `-log1p(-s)` there and `-log(p_y)` where `p_y <= 1/2` (both to bf16's relative
///    precision);
/// 3. `p[y] = -s`, and the input gradient `(p @ lm_head) * m * w / sum(m * w)`.
///
/// Positions `k < first_weighted` of each block are not computed at all: they must carry
/// no loss weight (the objective's `k = 0`, see [`labels_and_mask`] and
/// [`FIRST_WEIGHTED`]); their correct flags are false and their gradient 0. On the
/// realistic shape that is one token in 16 of the lm_head's two GEMMs and the softmax.
/// The chunks are `chunk_blocks` blocks' worth of rows of the whole batch.
///
/// Nothing of the `[tokens, vocab]` block outlives its chunk; the returned loss carries
/// the gradient as `value + <hidden, g> - stop_gradient(<hidden, g>)`, so the backward
/// pass of the whole loss costs one scale of `g`. The lm_head is frozen: no gradient
/// reaches it here.
///
/// Why: the autograd path ([`weighted_ce_chunked`]) converts the bf16 logits to fp32
/// (ATen's log-softmax converts on load for fp16 only), keeps each chunk's fp32
/// log-softmax for the backward, then writes a zero-filled fp32 gradient, scatters into
/// it, runs log-softmax's backward and casts the result back to bf16: about ten fp32
/// passes over the logits against four bf16 ones here (softmax, argmax, sum, scatter);
/// the figures on the GPU are in docs/gpu-results.md.
pub fn weighted_ce_fused(
    hidden: &Tensor,
    lm_head: &Tensor,
    labels: &Tensor,
    m: &Tensor,
    w: &Tensor,
    chunk_blocks: i64,
    first_weighted: i64,
) -> LossOutput {
    let (b, n, bs) = (labels.size()[0], labels.size()[1], labels.size()[2]);
    let h = hidden.size()[2];
    let k0 = first_weighted.clamp(0, bs - 1);
    let kept = bs - k0;
    let want_grad = hidden.requires_grad();
    // rows of the same count as `chunk_blocks` whole blocks of the batch; the skipped
    // positions do not shrink the chunks, so the lm_head GEMMs keep their shape
    let step = chunk_blocks.max(1) * b * bs;
    let (value, correct, grad) = tch::no_grad(|| {
        // the kept positions as rows (a view when nothing is skipped)
        let rows = |t: &Tensor, last: i64| {
            t.view([b, n, bs, last])
                .narrow(2, k0, kept)
                .reshape([-1, last])
        };
        let hd = rows(&hidden.detach(), h);
        let mw = m * w;
        let denom = mw.sum(Kind::Float).clamp_min(1e-6);
        let scale = rows(&(&mw / &denom).to_kind(Kind::Float), 1);
        let labels = rows(labels, 1);
        let total_rows = b * n * kept;
        let mut total: Option<Tensor> = None;
        let (mut correct, mut grads) = (Vec::new(), Vec::new());
        let mut start = 0;
        while start < total_rows {
            let len = step.min(total_rows - start);
            let hc = hd.narrow(0, start, len);
            let logits = hc.matmul(&lm_head.tr());
            let y = labels.narrow(0, start, len);
            let sc = scale.narrow(0, start, len);
            // p = softmax(logits) with the label entry zeroed (ATen) or set to -rest
            // (the fused kernel, on CUDA in bf16), p_y, rest = the sum of p's other entries
            let y_flat = y.view([-1]);
            let mut p = logits;
            let (p_y, rest, fused) = match crate::cuda::kernels::softmax_xent(&mut p, &y_flat) {
                Some(x) => {
                    correct.push(x.argmax.eq_tensor(&y_flat));
                    (x.p_label.view([-1, 1]), x.rest.view([-1, 1]), true)
                }
                None => {
                    p = p.softmax(-1, p.kind());
                    correct.push(p.argmax(-1, false).eq_tensor(&y_flat));
                    let p_y = p.gather(1, &y, false).to_kind(Kind::Float);
                    let _ = p.scatter_value_(1, &y, 0.0);
                    let rest = p.sum_dim_intlist([-1].as_slice(), true, Kind::Float);
                    (p_y, rest, false)
                }
            };
            // -log(p_y), from the side that does not cancel
            let ce = (-&rest).log1p().neg().where_self(
                &p_y.gt(0.5),
                &p_y.clamp_min(f64::from(f32::MIN_POSITIVE)).log().neg(),
            );
            let part = (ce * &sc).sum(Kind::Float);
            total = Some(match total {
                Some(t) => t + part,
                None => part,
            });
            if want_grad {
                if !fused {
                    let _ = p.scatter_(1, &y, &rest.neg().to_kind(p.kind()));
                }
                let g = p.matmul(lm_head).to_kind(Kind::Float) * &sc;
                grads.push(g.to_kind(hidden.kind()));
            }
            start += len;
        }
        // the skipped positions: not correct (they carry no weight), no gradient
        let front = |t: Tensor, last: i64| {
            let t = t.view([b, n, kept, last]);
            if k0 == 0 {
                t
            } else {
                let skipped = Tensor::zeros([b, n, k0, last], (t.kind(), t.device()));
                Tensor::cat(&[skipped, t], 2)
            }
        };
        let correct = front(Tensor::cat(&correct, 0), 1).view([b, n, bs]);
        let grad = want_grad.then(|| front(Tensor::cat(&grads, 0), h).view([b, n * bs, h]));
        (total.expect("at least one block"), correct, grad)
    });
    let loss = match grad {
        Some(g) => {
            let s = (hidden * &g).sum(Kind::Float);
            value + (&s - s.detach())
        }
        None => value,
    };
    LossOutput { loss, correct }
}

/// `[sum(m * correct), sum(m)]` as a device tensor (float), so a step reads all its
/// metrics with one host sync.
pub fn accuracy_counts(correct: &Tensor, m: &Tensor) -> Tensor {
    let valid = m.gt(0.0);
    Tensor::stack(
        &[
            correct.logical_and(&valid).sum(Kind::Float),
            valid.sum(Kind::Float),
        ],
        0,
    )
}

/// `[sum over blocks with a valid position of (1 + accepted), number of such blocks]`:
/// per block, `accepted = sum_k prod_{j<=k} c_j` over positions `k >= 1`, where invalid
/// positions neither break the run nor count.
pub fn tau_counts(correct: &Tensor, m: &Tensor) -> Tensor {
    let valid = m.gt(0.0);
    // invalid positions pass through the running product as "correct" but do not count
    let pass = correct
        .logical_or(&valid.logical_not())
        .to_kind(Kind::Float);
    let run = pass.cumprod(-1, Kind::Float);
    let accepted = (run * valid.to_kind(Kind::Float)).sum_dim_intlist(-1, false, Kind::Float);
    let has_valid = valid.any_dim(-1, false).to_kind(Kind::Float);
    Tensor::stack(
        &[
            ((accepted + 1.0) * &has_valid).sum(Kind::Float),
            has_valid.sum(Kind::Float),
        ],
        0,
    )
}

/// `num / den`, 0 when `den` is 0.
pub fn ratio(num: f64, den: f64) -> f64 {
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

fn ratio_of(counts: &Tensor) -> f64 {
    ratio(counts.double_value(&[0]), counts.double_value(&[1]))
}

/// Token accuracy `sum(m * correct) / sum(m)` (0 when nothing is valid).
pub fn accuracy(correct: &Tensor, m: &Tensor) -> f64 {
    ratio_of(&accuracy_counts(correct, m))
}

/// The acceptance-length proxy tau_hat: the mean of `1 + accepted` over blocks with at
/// least one valid position (0 when there is none); see [`tau_counts`].
pub fn tau_hat(correct: &Tensor, m: &Tensor) -> f64 {
    ratio_of(&tau_counts(correct, m))
}
