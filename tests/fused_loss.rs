//! The fused loss (gradient computed in the forward chunks) against the autograd path:
//! value, accuracy flags and the gradient reaching the hidden states, on random data with
//! masked positions, over several chunk sizes; nothing computed for the gradient when none
//! is wanted; and bf16 logits against casting them to fp32 first.
use dflash::model::objective;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tch::{Device, Kind, Tensor};

const B: i64 = 2;
const N: i64 = 5;
const BS: i64 = 4;
const H: i64 = 8;
const V: i64 = 37;

fn uniform(shape: &[i64], seed: u64, scale: f32) -> Tensor {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = shape.iter().product::<i64>() as usize;
    let v: Vec<f32> = (0..n)
        .map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * scale)
        .collect();
    Tensor::from_slice(&v).view(shape)
}

struct Case {
    hidden: Tensor,
    head: Tensor,
    labels: Tensor,
    m: Tensor,
    w: Tensor,
}

fn case() -> Case {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let labels: Vec<i64> = (0..B * N * BS).map(|_| rng.gen_range(0..V)).collect();
    // about a third of the positions carry no loss weight
    let m: Vec<f32> = (0..B * N * BS)
        .map(|_| if rng.gen::<f32>() < 0.33 { 0.0 } else { 1.0 })
        .collect();
    Case {
        hidden: uniform(&[B, N * BS, H], 1, 1.0),
        head: uniform(&[V, H], 2, 2.0),
        labels: Tensor::from_slice(&labels).view([B, N, BS]),
        m: Tensor::from_slice(&m).view([B, N, BS]),
        w: objective::decay_weights(BS, 3.0, Device::Cpu),
    }
}

/// Loss, correct flags and d loss / d hidden of one of the two paths.
fn run(c: &Case, fused: bool, chunk: i64) -> (f64, Vec<bool>, Tensor) {
    let hidden = c.hidden.copy().set_requires_grad(true);
    let out = if fused {
        objective::weighted_ce_fused(&hidden, &c.head, &c.labels, &c.m, &c.w, chunk, 0)
    } else {
        objective::weighted_ce_chunked(&hidden, &c.head, &c.labels, &c.m, &c.w, chunk)
    };
    let grad = Tensor::run_backward(&[&out.loss], &[&hidden], false, false).remove(0);
    let correct = Vec::try_from(out.correct.reshape([-1])).unwrap();
    (out.loss.double_value(&[]), correct, grad)
}

#[test]
fn fused_loss_equals_the_autograd_loss_in_value_flags_and_gradient() {
    let c = case();
    let (want, want_correct, want_grad) = run(&c, false, N);
    assert!(want_grad.abs().sum(Kind::Float).double_value(&[]) > 0.0);
    for chunk in [1, 2, 3, N] {
        let (got, correct, grad) = run(&c, true, chunk);
        assert!((got - want).abs() < 1e-5, "chunk {chunk}: {got} vs {want}");
        assert_eq!(correct, want_correct, "chunk {chunk}");
        let d = (&grad - &want_grad).abs().max().double_value(&[]);
        assert!(d < 1e-6, "chunk {chunk}: gradients differ by {d}");
    }
    // a masked position gets no gradient, a weighted one does
    let g =
        want_grad
            .view([B, N, BS, H])
            .abs()
            .sum_dim_intlist([-1].as_slice(), false, Kind::Float);
    let m: Vec<f32> = Vec::try_from(c.m.reshape([-1])).unwrap();
    let w: Vec<f32> = Vec::try_from(c.w.repeat([B * N])).unwrap();
    let g: Vec<f32> = Vec::try_from(g.reshape([-1])).unwrap();
    for i in 0..m.len() {
        assert_eq!(g[i] == 0.0, m[i] * w[i] == 0.0, "position {i}");
    }
}

#[test]
fn skipping_the_unweighted_first_positions_changes_nothing_but_their_flags() {
    // the objective weighs k = 0 zero; the fused loss then never computes those rows
    let mut c = case();
    let k = Tensor::arange(BS, (Kind::Int64, Device::Cpu));
    c.m = &c.m * k.gt(0).to_kind(Kind::Float);
    // the first positions' labels are their argmax, so their flags would be true
    let best = c
        .hidden
        .matmul(&c.head.tr())
        .argmax(-1, false)
        .view([B, N, BS]);
    let first = k.eq(0).view([1, 1, BS]);
    c.labels = best.where_self(&first, &c.labels);
    let (want, want_correct, want_grad) = run(&c, false, N);
    for chunk in [1, 2, 3, N] {
        let hidden = c.hidden.copy().set_requires_grad(true);
        let out = objective::weighted_ce_fused(
            &hidden,
            &c.head,
            &c.labels,
            &c.m,
            &c.w,
            chunk,
            objective::FIRST_WEIGHTED,
        );
        let grad = Tensor::run_backward(&[&out.loss], &[&hidden], false, false).remove(0);
        let got = out.loss.double_value(&[]);
        assert!((got - want).abs() < 1e-5, "chunk {chunk}: {got} vs {want}");
        let d = (&grad - &want_grad).abs().max().double_value(&[]);
        assert!(d < 1e-6, "chunk {chunk}: gradients differ by {d}");
        let correct: Vec<bool> = Vec::try_from(out.correct.reshape([-1])).unwrap();
        for (i, (&a, &b)) in correct.iter().zip(&want_correct).enumerate() {
            let first = i as i64 % BS == 0;
            assert_eq!(a, b && !first, "chunk {chunk}: position {i}");
        }
        let g0 = grad.view([B, N, BS, H]).narrow(2, 0, 1).abs().max();
        assert_eq!(g0.double_value(&[]), 0.0);
    }
    // every first position was correct on the autograd path, so the flags were tested
    assert!((0..want_correct.len()).all(|i| i as i64 % BS != 0 || want_correct[i]));
}

#[test]
fn the_gradient_is_the_hand_formula_on_one_token() {
    // one weighted token: d loss / d h = (softmax(W h) - onehot(y))^T W
    let hidden = Tensor::from_slice(&[0.5f32, -1.0])
        .view([1, 1, 2])
        .set_requires_grad(true);
    let head = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0]).view([3, 2]);
    let labels = Tensor::from_slice(&[2i64]).view([1, 1, 1]);
    let m = Tensor::from_slice(&[1.0f32]).view([1, 1, 1]);
    let w = Tensor::from_slice(&[1.0f32]);
    let out = objective::weighted_ce_fused(&hidden, &head, &labels, &m, &w, 1, 0);
    let g = Tensor::run_backward(&[&out.loss], &[&hidden], false, false).remove(0);
    let logits = [0.5f64, -1.0, -0.5];
    let z: f64 = logits.iter().map(|l| l.exp()).sum();
    let p: Vec<f64> = logits.iter().map(|l| l.exp() / z).collect();
    let want = [p[0] + p[2] - 1.0, p[1] + p[2] - 1.0];
    let got: Vec<f32> = Vec::try_from(g.reshape([-1])).unwrap();
    for k in 0..2 {
        assert!(
            (got[k] as f64 - want[k]).abs() < 1e-6,
            "{got:?} vs {want:?}"
        );
    }
    assert!((out.loss.double_value(&[]) - (z.ln() + 0.5)).abs() < 1e-6);
}

#[test]
fn without_a_gradient_only_the_value_is_computed() {
    let c = case();
    let out = tch::no_grad(|| {
        objective::weighted_ce_fused(&c.hidden, &c.head, &c.labels, &c.m, &c.w, 2, 0)
    });
    assert!(!out.loss.requires_grad());
    let (want, _, _) = run(&c, false, 2);
    assert!((out.loss.double_value(&[]) - want).abs() < 1e-5);
}

#[test]
fn bf16_logits_give_the_loss_and_gradient_of_casting_them_to_fp32_first() {
    // The chunked loss takes log-softmax of the bf16 logits straight into fp32; the
    // reference casts the logits first and writes the cross-entropy out by hand.
    let c = case();
    let head = c.head.to_kind(Kind::BFloat16);
    let reference = {
        let hidden = c.hidden.to_kind(Kind::BFloat16).set_requires_grad(true);
        let logits = hidden
            .reshape([-1, H])
            .matmul(&head.tr())
            .to_kind(Kind::Float);
        let lse = logits.logsumexp([-1].as_slice(), false);
        let picked = logits
            .gather(1, &c.labels.reshape([-1, 1]), false)
            .squeeze_dim(1);
        let mw = (&c.m * &c.w).reshape([-1]);
        let loss = ((lse - picked) * &mw).sum(Kind::Float) / mw.sum(Kind::Float);
        let g = Tensor::run_backward(&[&loss], &[&hidden], false, false).remove(0);
        (loss.double_value(&[]), g.to_kind(Kind::Float))
    };
    for chunk in [1, 2, N] {
        let hidden = c.hidden.to_kind(Kind::BFloat16).set_requires_grad(true);
        let out = objective::weighted_ce_chunked(&hidden, &head, &c.labels, &c.m, &c.w, chunk);
        assert_eq!(out.loss.kind(), Kind::Float);
        let g = Tensor::run_backward(&[&out.loss], &[&hidden], false, false).remove(0);
        assert_eq!(g.kind(), Kind::BFloat16);
        let got = out.loss.double_value(&[]);
        assert!(
            (got - reference.0).abs() < 1e-5,
            "chunk {chunk}: {got} vs {}",
            reference.0
        );
        let d = (g.to_kind(Kind::Float) - &reference.1)
            .abs()
            .max()
            .double_value(&[]);
        // the gradients are rounded to bf16 on both sides: within a unit in the last place
        let scale = reference.1.abs().max().double_value(&[]);
        assert!(
            d <= scale / 128.0,
            "chunk {chunk}: gradients differ by {d} (max {scale})"
        );
    }
}

/// The fp32 reference of a bf16 run: logits of the bf16 inputs cast to fp32, the
/// cross-entropy written out by hand, and its gradient with respect to the (bf16) hidden
/// states, in fp32.
fn fp32_reference(c: &Case, hidden: &Tensor, head: &Tensor) -> (f64, Tensor) {
    let hidden = hidden.to_kind(Kind::Float).set_requires_grad(true);
    let logits = hidden
        .reshape([-1, H])
        .matmul(&head.to_kind(Kind::Float).tr());
    let lse = logits.logsumexp([-1].as_slice(), false);
    let picked = logits
        .gather(1, &c.labels.reshape([-1, 1]), false)
        .squeeze_dim(1);
    let mw = (&c.m * &c.w).reshape([-1]);
    let loss = ((lse - picked) * &mw).sum(Kind::Float) / mw.sum(Kind::Float);
    let g = Tensor::run_backward(&[&loss], &[&hidden], false, false).remove(0);
    (loss.double_value(&[]), g)
}

#[test]
fn bf16_fused_loss_matches_the_fp32_reference_to_bf16_precision() {
    let c = case();
    let hidden0 = c.hidden.to_kind(Kind::BFloat16);
    let head = c.head.to_kind(Kind::BFloat16);
    let (want, want_grad) = fp32_reference(&c, &hidden0, &head);
    for chunk in [1, 2, N] {
        let hidden = hidden0.copy().set_requires_grad(true);
        let out = objective::weighted_ce_fused(&hidden, &head, &c.labels, &c.m, &c.w, chunk, 0);
        assert_eq!(out.loss.kind(), Kind::Float);
        let g = Tensor::run_backward(&[&out.loss], &[&hidden], false, false).remove(0);
        assert_eq!(g.kind(), Kind::BFloat16);
        let got = out.loss.double_value(&[]);
        // each token's loss is right to bf16's relative precision of its probability
        assert!(
            (got - want).abs() < 4e-3 * want.abs().max(1.0),
            "chunk {chunk}: {got} vs {want}"
        );
        // the gradient's entries to a few bf16 units of the largest
        let d = (g.to_kind(Kind::Float) - &want_grad)
            .abs()
            .max()
            .double_value(&[]);
        let scale = want_grad.abs().max().double_value(&[]);
        assert!(
            d <= scale / 64.0,
            "chunk {chunk}: gradients differ by {d} (max {scale})"
        );
    }
}

#[test]
fn a_confident_token_keeps_its_small_loss_and_gradient_in_bf16() {
    // One token whose label has probability 1 - 3e-4: in bf16 that probability rounds to
    // 1, so `softmax - onehot` computed from it would give the token no gradient and no
    // loss. The fused loss takes the label's entry from the other probabilities instead.
    let v = 64;
    let mut logits = vec![0f32; v as usize];
    logits[7] = 12.0; // p_7 = e^12 / (e^12 + 63) = 1 - 3.9e-4
    let head = Tensor::eye(v, (Kind::BFloat16, Device::Cpu));
    let hidden = Tensor::from_slice(&logits)
        .view([1, 1, v])
        .to_kind(Kind::BFloat16)
        .set_requires_grad(true);
    let labels = Tensor::from_slice(&[7i64]).view([1, 1, 1]);
    let m = Tensor::from_slice(&[1.0f32]).view([1, 1, 1]);
    let w = Tensor::from_slice(&[1.0f32]);
    let out = objective::weighted_ce_fused(&hidden, &head, &labels, &m, &w, 1, 0);
    let g = Tensor::run_backward(&[&out.loss], &[&hidden], false, false).remove(0);
    let rest = 63.0 / (12f64.exp() + 63.0);
    let want_loss = -(1.0 - rest).ln();
    let got_loss = out.loss.double_value(&[]);
    assert!(
        (got_loss - want_loss).abs() < 0.01 * want_loss,
        "{got_loss} vs {want_loss}"
    );
    // identity head: d loss / d h = softmax - onehot; the label's entry is -rest
    let got: Vec<f32> = Vec::try_from(g.to_kind(Kind::Float).reshape([-1])).unwrap();
    assert!(
        (got[7] as f64 + rest).abs() < 0.01 * rest,
        "label entry {} vs {}",
        got[7],
        -rest
    );
    let other = 1.0 / (12f64.exp() + 63.0);
    assert!(
        (got[0] as f64 - other).abs() < 0.01 * other,
        "{} vs {other}",
        got[0]
    );
}
