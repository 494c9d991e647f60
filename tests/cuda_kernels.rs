//! The fused kernels (`src/cuda/kernels.cu`), the target's and the drafter's, against
//! ATen's chains on a CUDA device, and the drafter's grouped attention node against dense
//! attention there (cuDNN's kernels, bf16). Ignored by default, since they need a GPU: run them
//! there with `cargo test --release --test cuda_kernels -- --ignored` (or the built test
//! binary with `--ignored`). Without a GPU, `src/cuda/kernels.rs` checks that the source
//! compiles.
use std::sync::Mutex;

use dflash::cuda::kernels;
use dflash::model::layers::{add_norm, norm_rope, Rope};
use dflash::model::objective;
use dflash::model::{random_target, TargetConfigFile};
use tch::{Device, Kind, Tensor};

/// The fused path is a process-wide switch: tests that flip it or count launches hold this.
static SWITCH: Mutex<()> = Mutex::new(());

/// Takes the switch, with every kernel on (the drafter's are off by default).
fn lock() -> std::sync::MutexGuard<'static, ()> {
    let guard = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    kernels::set_enabled(true);
    kernels::set_drafter_enabled(true);
    guard
}

fn cuda() -> Device {
    assert!(
        dflash::cuda::is_available(),
        "these tests need a CUDA device (they are ignored by default)"
    );
    Device::Cuda(0)
}

fn randn(shape: &[i64], seed: i64) -> Tensor {
    tch::manual_seed(seed);
    Tensor::randn(shape, (Kind::Float, cuda())).to_kind(Kind::BFloat16)
}

/// Worst difference relative to the reference's scale, and the share of bitwise-equal
/// values: the kernels round where ATen does, so they differ only where an fp32 sum taken
/// in another order rounds to the neighbouring bf16 value.
fn compare(got: &Tensor, want: &Tensor) -> (f64, f64) {
    assert_eq!(got.size(), want.size());
    assert_eq!(got.kind(), want.kind());
    let (g, w) = (got.to_kind(Kind::Float), want.to_kind(Kind::Float));
    let scale = w.abs().max().double_value(&[]).max(1e-6);
    let worst = (&g - &w).abs().max().double_value(&[]) / scale;
    let equal = g
        .eq_tensor(&w)
        .to_kind(Kind::Float)
        .mean(Kind::Float)
        .double_value(&[]);
    (worst, equal)
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    let (worst, equal) = compare(got, want);
    assert!(
        worst <= 1.0 / 64.0 && equal >= 0.97,
        "{what}: worst difference {worst:.2e} of the scale, {:.2}% bitwise equal",
        100.0 * equal
    );
}

#[test]
#[ignore = "needs a CUDA device"]
fn norm_rope_matches_atens_norm_then_rope() {
    let _g = lock();
    let dev = cuda();
    for (d, with_norm) in [(64, true), (128, true), (256, true), (128, false)] {
        let (b, l, heads) = (2, 37, 3);
        let x = randn(&[b, l, heads, d], 1) * 3.0;
        let w = randn(&[d], 2) * 0.5 + 1.0;
        // tables over 45 positions, of which this call uses 37 from position 5: a narrowed
        // view, as the drafter's blocks take them
        let positions = Tensor::arange(45, (Kind::Int64, dev))
            .unsqueeze(0)
            .repeat([b, 1])
            + 100;
        let rope = Rope::new(&positions, d, 10_000.0, Kind::BFloat16).narrow(5, l);
        let want = match with_norm {
            true => rope.apply(&x.rms_norm([d], Some(&w), 1e-6)),
            false => rope.apply(&x),
        };
        let before = kernels::launches();
        let got = tch::no_grad(|| {
            kernels::norm_rope(&x, with_norm.then_some(&w), &rope.cos, &rope.sin, 1e-6)
        })
        .unwrap_or_else(|| panic!("D={d}: the fused kernel declined"));
        assert_eq!(kernels::launches(), before + 1);
        assert_close(&format!("norm_rope D={d} norm={with_norm}"), &got, &want);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn add_rms_norm_matches_atens_add_then_rms_norm() {
    let _g = lock();
    for h in [1024, 264, 8] {
        let (a, b) = (randn(&[3, 50, h], 3), randn(&[3, 50, h], 4) * 2.0);
        let w = randn(&[h], 5) + 1.0;
        let sum = &a + &b;
        let normed = sum.rms_norm([h], Some(&w), 1e-5);
        let (got_sum, got_normed) = tch::no_grad(|| kernels::add_rms_norm(&a, &b, &w, 1e-5))
            .unwrap_or_else(|| panic!("H={h}: the fused kernel declined"));
        assert_eq!(
            got_sum, sum,
            "H={h}: the sum is one bf16 rounding, as ATen's"
        );
        assert_close(&format!("add_rms_norm H={h}"), &got_normed, &normed);
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn silu_mul_matches_atens_silu_then_mul() {
    let _g = lock();
    let (g, u) = (randn(&[7, 3072], 6) * 4.0, randn(&[7, 3072], 7));
    let want = g.silu() * &u;
    let got = tch::no_grad(|| kernels::silu_mul(&g, &u)).expect("the fused kernel declined");
    assert_close("silu_mul", &got, &want);
}

/// Where the kernels have no answer they decline and the layers run ATen: inputs that
/// autograd records, another dtype, a layout they do not serve.
#[test]
#[ignore = "needs a CUDA device"]
fn the_kernels_decline_autograd_other_dtypes_and_layouts() {
    let _g = lock();
    let dev = cuda();
    let positions = Tensor::arange(8, (Kind::Int64, dev)).unsqueeze(0);
    let rope = Rope::new(&positions, 64, 10_000.0, Kind::BFloat16);
    let x = randn(&[1, 8, 2, 64], 8).set_requires_grad(true);
    let w = randn(&[64], 9);
    // under autograd, a rotary embedding without a norm has no fused backward
    assert!(kernels::norm_rope(&x, None, &rope.cos, &rope.sin, 1e-6).is_none());
    let cos_grad = rope.cos.detach().set_requires_grad(true);
    assert!(kernels::norm_rope(&x, Some(&w), &cos_grad, &rope.sin, 1e-6).is_none());
    // the drafter's kernels switched off: no autograd node, no loss pass
    kernels::set_drafter_enabled(false);
    assert!(kernels::norm_rope(&x, Some(&w), &rope.cos, &rope.sin, 1e-6).is_none());
    let gate = randn(&[4, 64], 14).set_requires_grad(true);
    assert!(kernels::silu_mul(&gate, &gate).is_none());
    let mut z = randn(&[4, 64], 13);
    assert!(kernels::softmax_xent(&mut z, &Tensor::zeros([4], (Kind::Int64, dev))).is_none());
    kernels::set_drafter_enabled(true);
    assert!(kernels::norm_rope(&x, Some(&w), &rope.cos, &rope.sin, 1e-6).is_some());
    assert!(kernels::silu_mul(&gate, &gate).is_some());
    let x = x.detach();
    let x32 = x.to_kind(Kind::Float);
    let rope32 = Rope::new(&positions, 64, 10_000.0, Kind::Float);
    assert!(kernels::norm_rope(&x32, None, &rope32.cos, &rope32.sin, 1e-6).is_none());
    let strided = x.transpose(1, 2);
    assert!(kernels::norm_rope(&strided, None, &rope.cos, &rope.sin, 1e-6).is_none());
    let odd = randn(&[4, 12], 10);
    assert!(kernels::silu_mul(&odd.narrow(1, 0, 6), &odd.narrow(1, 6, 6)).is_none());
    let labels = Tensor::zeros([4], (Kind::Int64, dev));
    let mut z32 = odd.to_kind(Kind::Float);
    assert!(kernels::softmax_xent(&mut z32, &labels).is_none());
    let mut z_odd_v = randn(&[4, 10], 12);
    assert!(kernels::softmax_xent(&mut z_odd_v, &labels).is_none());
    let mut z_grad = odd.set_requires_grad(true);
    assert!(kernels::softmax_xent(&mut z_grad, &labels).is_none());
    assert!(kernels::enabled(), "declining is not a failure");
    // and the layer functions then give ATen's result, with autograd
    let x = randn(&[1, 8, 2, 64], 11).set_requires_grad(true);
    let y = norm_rope(&x, None, &rope);
    y.sum(Kind::Float).backward();
    assert!(x.grad().defined());
    let (s, _) = add_norm(&x, &x, &dflash_norm(&w));
    assert!(s.requires_grad());
}

fn dflash_norm(w: &Tensor) -> dflash::model::layers::RmsNorm {
    let vs = tch::nn::VarStore::new(w.device());
    let mut n = dflash::model::layers::RmsNorm::new(vs.root() / "n", w.size()[0], 1e-6);
    n.weight = w.shallow_clone();
    n
}

/// A whole bf16 target forward (Qwen3 with per-head norms, Llama without, head sizes 64
/// to 256) with the fused kernels against ATen's: the same taps and logits, and the fused
/// path really taken (five launches per layer).
#[test]
#[ignore = "needs a CUDA device"]
fn a_target_forward_with_the_kernels_matches_aten() {
    let _g = lock();
    let dev = cuda();
    for (model_type, heads, head_dim) in [("qwen3", 4, 64), ("llama", 2, 128), ("qwen3", 2, 256)] {
        let file: TargetConfigFile = serde_json::from_value(serde_json::json!({
            "model_type": model_type,
            "vocab_size": 300, "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 3, "num_attention_heads": heads, "num_key_value_heads": 1,
            "head_dim": head_dim, "tie_word_embeddings": false,
        }))
        .unwrap();
        let cfg = file.into_config().unwrap();
        let target = random_target(&cfg, dev, Kind::BFloat16, 7);
        let ids = Tensor::randint(300, [2, 40], (Kind::Int64, dev));
        let run = |fused: bool| {
            kernels::set_enabled(fused);
            let before = kernels::launches();
            let out = tch::no_grad(|| target.model.forward(&ids, &[0, 2], true)).unwrap();
            kernels::set_enabled(true);
            (out, kernels::launches() - before)
        };
        let (aten, none) = run(false);
        let (fused, launched) = run(true);
        assert_eq!(none, 0);
        assert_eq!(launched, 15, "{model_type}: 5 fused kernels per layer");
        // one value rounded the other way in layer 0 moves everything after it a little:
        // compare as a whole (bf16's own step is 0.4%)
        let mut pairs: Vec<(String, &Tensor, &Tensor)> = fused
            .hidden
            .iter()
            .zip(&aten.hidden)
            .enumerate()
            .map(|(i, (g, w))| (format!("tap {i}"), g, w))
            .collect();
        pairs.push((
            "logits".into(),
            fused.logits.as_ref().unwrap(),
            aten.logits.as_ref().unwrap(),
        ));
        for (what, g, w) in pairs {
            let (g, w) = (g.to_kind(Kind::Float), w.to_kind(Kind::Float));
            let rel = (&g - &w).norm().double_value(&[]) / w.norm().double_value(&[]);
            let (worst, _) = compare(&g, &w);
            assert!(
                rel <= 1e-2 && worst <= 1.0 / 16.0,
                "{model_type} {what}: relative error {rel:.2e}, worst {worst:.2e} of the scale"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn softmax_xent_matches_atens_softmax_argmax_gather_and_sum() {
    let _g = lock();
    let dev = cuda();
    // 9992 columns: more than one 1024-thread sweep of 8 values, and not a multiple of it;
    // up to 400,008 (rows wider than any vocabulary the trainer meets)
    for (rows, v, spread) in [
        (67, 9992, 4.0),
        (5, 64, 1.0),
        (6, 151_936, 12.0),
        (4, 200_000, 8.0),
        (3, 400_008, 8.0),
    ] {
        let z = randn(&[rows, v], 20) * spread;
        let labels = Tensor::randint(v, [rows], (Kind::Int64, dev));
        // labels on either side of a quarter's edge, and the last column
        let _ = labels.get(0).fill_(v / 4);
        let _ = labels.get(1).fill_(v / 4 - 1);
        let _ = labels.get(2).fill_(v - 1);
        // ATen's chain, as the loss ran it before
        let p = z.softmax(-1, Kind::BFloat16);
        let want_arg = p.argmax(-1, false);
        let y = labels.view([-1, 1]);
        let want_py = p.gather(1, &y, false).to_kind(Kind::Float).view([-1]);
        let zeroed = p.scatter_value(1, &y, 0.0);
        let want_rest = zeroed.sum_dim_intlist([-1].as_slice(), false, Kind::Float);
        let want_p = zeroed.scatter(
            1,
            &y,
            &want_rest.view([-1, 1]).neg().to_kind(Kind::BFloat16),
        );

        let mut got_p = z.copy();
        let before = kernels::launches();
        let got = tch::no_grad(|| kernels::softmax_xent(&mut got_p, &labels))
            .expect("the kernel applies to contiguous bf16 rows");
        assert_eq!(kernels::launches(), before + 1);
        assert_close(&format!("p ({rows}x{v})"), &got_p, &want_p);
        let rel = |a: &Tensor, b: &Tensor| {
            ((a - b).abs() / b.abs().clamp_min(1e-12))
                .max()
                .double_value(&[])
        };
        assert!(rel(&got.rest, &want_rest) < 1e-2, "rest ({rows}x{v})");
        assert!(
            rel(&got.p_label, &want_py) < 1e-2,
            "p at the label ({rows}x{v})"
        );
        // the argmax: ATen's index, or an index whose p ties ATen's maximum to one bf16 step
        let same = got
            .argmax
            .eq_tensor(&want_arg)
            .to_kind(Kind::Float)
            .mean(Kind::Float);
        assert!(
            same.double_value(&[]) >= 0.95,
            "argmax agrees on too few rows"
        );
        let at_got = p
            .gather(1, &got.argmax.view([-1, 1]), false)
            .to_kind(Kind::Float);
        let best = p.amax([-1].as_slice(), true).to_kind(Kind::Float);
        let short = (&best - &at_got).max().double_value(&[]);
        assert!(
            short <= best.max().double_value(&[]) / 128.0,
            "the kernel's argmax is {short} below the row's maximum"
        );
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn the_fused_loss_with_the_kernel_matches_the_aten_path() {
    let _g = lock();
    let dev = cuda();
    let (b, n, bs, h, v) = (2, 5, 4, 64, 1000);
    let hidden = randn(&[b, n * bs, h], 30);
    let head = randn(&[v, h], 31) * 0.3;
    let labels = Tensor::randint(v, [b, n, bs], (Kind::Int64, dev));
    let m = Tensor::rand([b, n, bs], (Kind::Float, dev))
        .gt(0.2)
        .to_kind(Kind::Float);
    let w = Tensor::rand([b, n, bs], (Kind::Float, dev)) + 0.5;
    let run = |fused: bool| {
        kernels::set_enabled(fused);
        let x = hidden.detach().set_requires_grad(true);
        let before = kernels::launches();
        let out = objective::weighted_ce_fused(&x, &head, &labels, &m, &w, 2, 0);
        let launched = kernels::launches() - before;
        out.loss.backward();
        (out.loss.double_value(&[]), x.grad(), out.correct, launched)
    };
    let (loss_aten, grad_aten, correct_aten, n_aten) = run(false);
    let (loss_fused, grad_fused, correct_fused, n_fused) = run(true);
    kernels::set_enabled(true);
    assert_eq!(n_aten, 0);
    assert_eq!(
        n_fused, 3,
        "one launch per chunk of two blocks over five blocks"
    );
    assert!(
        (loss_fused - loss_aten).abs() <= 1e-3 * loss_aten.abs(),
        "loss {loss_fused} against ATen's {loss_aten}"
    );
    assert_close("input gradient", &grad_fused, &grad_aten);
    let same = correct_fused
        .eq_tensor(&correct_aten)
        .to_kind(Kind::Float)
        .mean(Kind::Float);
    assert!(same.double_value(&[]) >= 0.97);
}

/// ||got - want|| / ||want||.
fn rel_norm(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.to_kind(Kind::Float), want.to_kind(Kind::Float));
    (&g - &w).norm().double_value(&[]) / w.norm().double_value(&[]).max(1e-30)
}

#[test]
#[ignore = "needs a CUDA device"]
fn silu_mul_under_autograd_matches_atens_gradients() {
    let _g = lock();
    // the drafter's MLP shape (4096 x 3072) and an odd row count
    for (r, c) in [(4096, 3072), (37, 24)] {
        let g0 = randn(&[r, c], 50) * 3.0;
        let u0 = randn(&[r, c], 51);
        let dy = randn(&[r, c], 52);
        let grads = |fused: bool| {
            kernels::set_enabled(fused);
            let g = g0.detach().set_requires_grad(true);
            let u = u0.detach().set_requires_grad(true);
            let before = kernels::launches();
            let y = match fused {
                true => kernels::silu_mul(&g, &u).expect("the fused path applies under autograd"),
                false => g.silu() * &u,
            };
            assert_eq!(kernels::launches() - before, u64::from(fused));
            (&y * &dy).sum(Kind::Float).backward();
            (y.detach(), g.grad(), u.grad())
        };
        let (y_a, dg_a, du_a) = grads(false);
        let (y_f, dg_f, du_f) = grads(true);
        kernels::set_enabled(true);
        let what = format!("[{r}, {c}]");
        assert_close(&format!("y {what}"), &y_f, &y_a);
        assert_close(&format!("dg {what}"), &dg_f, &dg_a);
        assert_close(&format!("du {what}"), &du_f, &du_a);
        // against an fp32 reference, no worse than ATen's
        let g32 = g0.to_kind(Kind::Float).set_requires_grad(true);
        let u32 = u0.to_kind(Kind::Float).set_requires_grad(true);
        (g32.silu() * &u32 * dy.to_kind(Kind::Float))
            .sum(Kind::Float)
            .backward();
        for (name, f, a, r32) in [
            ("dg", &dg_f, &dg_a, g32.grad()),
            ("du", &du_f, &du_a, u32.grad()),
        ] {
            let (ef, ea) = (rel_norm(f, &r32), rel_norm(a, &r32));
            assert!(
                ef <= 1.5 * ea + 1e-3,
                "{name} {what}: {ef:.2e} from fp32, ATen's {ea:.2e}"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA device"]
fn norm_rope_under_autograd_matches_atens_gradients() {
    let _g = lock();
    let dev = cuda();
    // 8400 rows: more than the backward's grid (4 blocks of 8 warps per SM) covers in one sweep
    for (b, l, heads, d) in [
        (2, 37, 3, 64),
        (2, 37, 3, 128),
        (1, 2100, 4, 128),
        (2, 37, 3, 256),
    ] {
        let x0 = randn(&[b, l, heads, d], 40) * 3.0;
        let w0 = randn(&[d], 41) * 0.5 + 1.0;
        let dy = randn(&[b, l, heads, d], 42);
        let positions = Tensor::arange(l + 8, (Kind::Int64, dev))
            .unsqueeze(0)
            .repeat([b, 1]);
        let rope = Rope::new(&positions, d, 10_000.0, Kind::BFloat16).narrow(8, l);
        let grads = |fused: bool| {
            kernels::set_enabled(fused);
            let x = x0.detach().set_requires_grad(true);
            let w = w0.detach().set_requires_grad(true);
            let before = kernels::launches();
            let y = match fused {
                true => kernels::norm_rope(&x, Some(&w), &rope.cos, &rope.sin, 1e-6)
                    .expect("the fused path applies under autograd with a weight"),
                false => rope.apply(&x.rms_norm([d], Some(&w), 1e-6)),
            };
            assert_eq!(kernels::launches() - before, u64::from(fused));
            // y's gradient is dy, transposed in memory as attention hands it back
            // through heads_first
            let dy_t = dy.transpose(1, 2).contiguous().transpose(1, 2);
            (&y * &dy_t).sum(Kind::Float).backward();
            (y.detach(), x.grad(), w.grad())
        };
        let (y_a, dx_a, dw_a) = grads(false);
        let (y_f, dx_f, dw_f) = grads(true);
        kernels::set_enabled(true);
        let what = format!("[{b}, {l}, {heads}, {d}]");
        assert_close(&format!("y {what}"), &y_f, &y_a);
        assert_eq!(dx_f.kind(), Kind::BFloat16);
        assert_eq!(dw_f.kind(), Kind::BFloat16);
        let (ex, ew) = (rel_norm(&dx_f, &dx_a), rel_norm(&dw_f, &dw_a));
        assert!(ex < 1e-2, "dx {what}: relative error {ex:.2e}");
        assert!(ew < 1e-2, "dw {what}: relative error {ew:.2e}");
        // and against an fp32 reference, the fused gradient is no worse than ATen's
        let x32 = x0.to_kind(Kind::Float).set_requires_grad(true);
        let w32 = w0.to_kind(Kind::Float).set_requires_grad(true);
        let r32 = Rope::new(&positions, d, 10_000.0, Kind::Float).narrow(8, l);
        (r32.apply(&x32.rms_norm([d], Some(&w32), 1e-6)) * dy.to_kind(Kind::Float))
            .sum(Kind::Float)
            .backward();
        let (fx, ax) = (rel_norm(&dx_f, &x32.grad()), rel_norm(&dx_a, &x32.grad()));
        assert!(
            fx <= 1.5 * ax + 1e-3,
            "dx {what}: {fx:.2e} from fp32, ATen's {ax:.2e}"
        );
    }
}

/// The dense mask, the grouped attention node and the batched groups against attention
/// over repeated key/value heads under the dense block mask, on the drafter's realistic
/// head shape (16 query heads on 8 key/value heads
/// of 128, bf16): outputs and the gradients of q, k and v, as relative norms.
#[test]
#[ignore = "needs a CUDA device"]
fn the_grouped_attention_node_matches_dense_attention() {
    use dflash::model::drafter::grouped_attention;
    let dev = cuda();
    let (s, n, bs) = (512i64, 32i64, 16i64);
    let q_len = n * bs;
    // sorted anchors of two rows, the second with 5 unused slots
    let mut anc: Vec<i64> = (0..2 * n).map(|i| (i * 37 + 11) % (s - 1)).collect();
    anc[..n as usize].sort_unstable();
    anc[n as usize..].sort_unstable();
    let keep: Vec<bool> = (0..2 * n).map(|i| i < 2 * n - 5).collect();
    let a = Tensor::from_slice(&anc).view([2, n]).to_device(dev);
    let kp = Tensor::from_slice(&keep).view([2, n]).to_device(dev);
    let dense = objective::block_mask(&a, &kp, s, bs, None);
    let probe = randn(&[2, 16, q_len, 128], 24);
    // output and the gradients of q, k, v of one layout, from the same inputs every time
    let run = |mask: &objective::GroupedMask| {
        let q = randn(&[2, 16, q_len, 128], 21).set_requires_grad(true);
        let k = randn(&[2, 8, s + q_len, 128], 22).set_requires_grad(true);
        let v = randn(&[2, 8, s + q_len, 128], 23).set_requires_grad(true);
        let out = grouped_attention(&q, &k, &v, mask);
        let grads = Tensor::run_backward(
            &[(&out * &probe).sum(Kind::Float)],
            &[&q, &k, &v],
            false,
            false,
        );
        (out.detach(), grads)
    };
    let groups = |g| objective::query_groups(&anc, &keep, n, s, bs, g);
    // the reference: ATen's attention over explicitly repeated key/value heads, under the
    // dense mask (the layouts below hand cuDNN the grouped heads as they are)
    let add = Tensor::zeros(dense.size(), (Kind::BFloat16, dev))
        .masked_fill(&dense.logical_not(), f64::NEG_INFINITY);
    let (want, want_grads) = {
        let q = randn(&[2, 16, q_len, 128], 21).set_requires_grad(true);
        let k = randn(&[2, 8, s + q_len, 128], 22).set_requires_grad(true);
        let v = randn(&[2, 8, s + q_len, 128], 23).set_requires_grad(true);
        let rep = |t: &Tensor| t.repeat_interleave_self_int(2, 1, None);
        let out = Tensor::scaled_dot_product_attention(
            &q,
            &rep(&k),
            &rep(&v),
            Some(&add),
            0.0,
            false,
            None,
            false,
        );
        let grads = Tensor::run_backward(
            &[(&out * &probe).sum(Kind::Float)],
            &[&q, &k, &v],
            false,
            false,
        );
        (out.detach(), grads)
    };
    // on this GPU the dispatcher sends the grouped heads with a mask to cuDNN as they are
    {
        let q = randn(&[2, 16, q_len, 128], 21);
        let k = randn(&[2, 8, s + q_len, 128], 22);
        assert!(
            dflash::model::layers::masked_gqa_native(&q, &k, &k, &add),
            "the masked attention with grouped heads goes to cuDNN"
        );
    }
    for (g, batched) in [(0, false), (4, false), (8, false), (4, true), (8, true)] {
        let mask = if batched {
            objective::batched_block_mask(&a, &kp, s, bs, None, g * bs, Kind::BFloat16)
        } else {
            objective::group_masks(&dense, &groups(g), s, Kind::BFloat16)
        };
        assert!(g == 0 || mask.batch > 0 || mask.groups.len() > 1);
        let (got, grads) = run(&mask);
        let g = format!("{g}{}", if batched { " (batched)" } else { "" });
        let o = rel_norm(&got, &want);
        assert!(
            o < 1e-2,
            "groups of {g}: output differs by {o:.2e} (relative norm)"
        );
        for (name, (x, y)) in ["q", "k", "v"].iter().zip(grads.iter().zip(&want_grads)) {
            let d = rel_norm(x, y);
            assert!(
                d < 2e-2,
                "groups of {g}: d{name} differs by {d:.2e} (relative norm)"
            );
        }
    }
}
