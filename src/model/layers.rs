//! Building blocks shared by the target and the drafter: linear layers (bias optional),
//! RMSNorm, rotary position embeddings (plain, or with Llama 3's `llama3` frequency remap)
//! and grouped-query attention. Variable names mirror the Hugging Face checkpoint keys so
//! loading needs no renaming table.
use serde::{Deserialize, Serialize};
use tch::nn::{self, Init, Module};
use tch::{Device, Kind, Tensor};

/// Standard deviation of the normal init used by Llama/Qwen-style models for every linear.
pub const INIT_STD: f64 = 0.02;

/// A linear layer `y = x W^T (+ b)`, with `W` stored as `[out, in]` like PyTorch and the
/// optional bias `[out]` (initialised to zero).
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Without bias.
    pub fn new(p: nn::Path, in_dim: i64, out_dim: i64) -> Self {
        Self::with_bias(p, in_dim, out_dim, false)
    }

    pub fn with_bias(p: nn::Path, in_dim: i64, out_dim: i64, bias: bool) -> Self {
        let weight = p.var(
            "weight",
            &[out_dim, in_dim],
            Init::Randn {
                mean: 0.,
                stdev: INIT_STD,
            },
        );
        let bias = bias.then(|| p.var("bias", &[out_dim], Init::Const(0.)));
        Self { weight, bias }
    }
}

impl Module for Linear {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let ys = xs.matmul(&self.weight.tr());
        match &self.bias {
            Some(b) => ys + b,
            None => ys,
        }
    }
}

/// Root-mean-square layer norm over the last dimension, weight initialised to one.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    dim: i64,
    eps: f64,
}

impl RmsNorm {
    pub fn new(p: nn::Path, dim: i64, eps: f64) -> Self {
        let weight = p.var("weight", &[dim], Init::Const(1.0));
        Self { weight, dim, eps }
    }
}

/// `norm(x + y)` with the sum: `(x + y, norm(x + y))`. On CUDA in bf16 outside autograd,
/// one fused kernel (the target's residual sums and the norms that follow them).
pub fn add_norm(x: &Tensor, y: &Tensor, norm: &RmsNorm) -> (Tensor, Tensor) {
    if x.device().is_cuda() {
        if let Some(r) = crate::cuda::kernels::add_rms_norm(x, y, &norm.weight, norm.eps) {
            return r;
        }
    }
    let sum = x + y;
    let normed = norm.forward(&sum);
    (sum, normed)
}

/// Per-head `norm` (where given) then rotary embedding of `xs`, `[B, L, heads, D]`. On
/// CUDA in bf16, one fused kernel instead of four; under autograd only with a norm (the
/// drafter's), with a fused backward.
pub fn norm_rope(xs: &Tensor, norm: Option<&RmsNorm>, rope: &Rope) -> Tensor {
    if xs.device().is_cuda() {
        let (weight, eps) = norm.map_or((None, 0.0), |n| (Some(&n.weight), n.eps));
        if let Some(y) = crate::cuda::kernels::norm_rope(xs, weight, &rope.cos, &rope.sin, eps) {
            return y;
        }
    }
    match norm {
        Some(n) => rope.apply(&n.forward(xs)),
        None => rope.apply(xs),
    }
}

impl Module for RmsNorm {
    /// ATen's fused `rms_norm(x) * weight`. Its backward computes the weight's gradient
    /// with a kernel of `ceil(columns / 32)` blocks, 4 for a per-head norm (128 columns):
    /// taking the product outside the fused kernel, so that the gradient is a plain column
    /// sum, made no measurable difference to the realistic GPU step (docs/gpu-results.md),
    /// so the fused kernel stays.
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs.rms_norm([self.dim], Some(&self.weight), self.eps)
    }
}

/// The SwiGLU MLP of Llama and Qwen: `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// Without biases.
    pub fn new(p: nn::Path, hidden: i64, intermediate: i64) -> Self {
        Self::with_bias(p, hidden, intermediate, false)
    }

    /// With biases on all three projections when `bias` (Llama's `mlp_bias`).
    pub fn with_bias(p: nn::Path, hidden: i64, intermediate: i64, bias: bool) -> Self {
        Self {
            gate_proj: Linear::with_bias(&p / "gate_proj", hidden, intermediate, bias),
            up_proj: Linear::with_bias(&p / "up_proj", hidden, intermediate, bias),
            down_proj: Linear::with_bias(&p / "down_proj", intermediate, hidden, bias),
        }
    }
}

impl Module for Mlp {
    /// On CUDA in bf16, `silu(gate) * up` is one fused kernel (under autograd with the
    /// drafter's kernels on, its backward too).
    fn forward(&self, xs: &Tensor) -> Tensor {
        let gate = self.gate_proj.forward(xs);
        let up = self.up_proj.forward(xs);
        if gate.device().is_cuda() {
            if let Some(h) = crate::cuda::kernels::silu_mul(&gate, &up) {
                return self.down_proj.forward(&h);
            }
        }
        self.down_proj.forward(&(gate.silu() * up))
    }
}

/// A `rope_scaling` of a Hugging Face config that changes the rotary frequencies. Only
/// Llama 3's `llama3` type is implemented (`default`, or no `rope_scaling`, is plain RoPE);
/// serialised in Hugging Face's form, `{"rope_type": "llama3", "factor": ..., ...}`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "lowercase")]
pub enum RopeScaling {
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: i64,
    },
}

/// The `head_dim / 2` inverse frequencies `theta^(-2i/d)` (fp32), remapped by `scaling`.
///
/// The `llama3` remap is Hugging Face's `_compute_llama3_parameters`: with
/// `low = old_context / low_freq_factor` and `high = old_context / high_freq_factor`
/// wavelengths (`old_context` = `original_max_position_embeddings`), frequencies of
/// wavelength above `low` are divided by `factor`, those below `high` are kept, and those
/// in between are interpolated, `(1 - s) f / factor + s f` with
/// `s = (old_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)`.
/// Its attention factor is 1: the cos/sin tables are not scaled.
pub fn rope_inv_freq(
    head_dim: i64,
    theta: f64,
    scaling: Option<&RopeScaling>,
    device: Device,
) -> Tensor {
    let inv_freq = (Tensor::arange_start_step(0, head_dim, 2, (Kind::Float, device))
        / head_dim as f64
        * theta.ln())
    .exp()
    .reciprocal();
    match scaling {
        None => inv_freq,
        Some(&RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let old_context = original_max_position_embeddings as f64;
            let low_freq_wavelen = old_context / low_freq_factor;
            let high_freq_wavelen = old_context / high_freq_factor;
            let wavelen = inv_freq.full_like(2.0 * std::f64::consts::PI) / &inv_freq;
            // wavelen > low_freq_wavelen: divide by factor; below high_freq_wavelen: keep
            let low = wavelen.gt(low_freq_wavelen);
            let scaled = (&inv_freq / factor).where_self(&low, &inv_freq);
            // otherwise interpolate between the two with a smooth factor
            let smooth = (wavelen.full_like(old_context) / &wavelen - low_freq_factor)
                / (high_freq_factor - low_freq_factor);
            let smoothed = (smooth.ones_like() - &smooth) * &scaled / factor + &smooth * &scaled;
            let medium = wavelen
                .lt(high_freq_wavelen)
                .logical_not()
                .logical_and(&low.logical_not());
            smoothed.where_self(&medium, &scaled)
        }
    }
}

/// Cosine and sine tables for rotary embeddings at arbitrary positions.
///
/// `positions` is `[B, L]` (integer); the tables are `[B, L, 1, head_dim]` in `kind`, for
/// `[B, L, heads, head_dim]` inputs (see [`split_heads`]), laid out for the
/// non-interleaved `rotate_half` convention of Hugging Face Llama/Qwen.
/// `sin` carries `rotate_half`'s sign: its first half is negated (see [`Rope::apply`]).
#[derive(Debug)]
pub struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl Rope {
    /// Plain RoPE.
    pub fn new(positions: &Tensor, head_dim: i64, theta: f64, kind: Kind) -> Self {
        Self::scaled(positions, head_dim, theta, None, kind)
    }

    /// RoPE with the frequencies of [`rope_inv_freq`].
    pub fn scaled(
        positions: &Tensor,
        head_dim: i64,
        theta: f64,
        scaling: Option<&RopeScaling>,
        kind: Kind,
    ) -> Self {
        // 1. inverse frequencies (head_dim / 2)
        let inv_freq = rope_inv_freq(head_dim, theta, scaling, positions.device());
        // 2. (B, L, 1) x (D/2) -> (B, L, D/2) -> (B, L, 1, D)
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(2);
        let sin = freqs.sin();
        Self {
            cos: emb.cos().to_kind(kind),
            sin: Tensor::cat(&[&sin.neg(), &sin], -1)
                .unsqueeze(2)
                .to_kind(kind),
        }
    }

    /// Restrict the tables to positions `start..start+len` of the L axis.
    pub fn narrow(&self, start: i64, len: i64) -> Self {
        Self {
            cos: self.cos.narrow(1, start, len),
            sin: self.sin.narrow(1, start, len),
        }
    }

    /// Rotates `xs` of shape `[B, L, heads, head_dim]`: `x * cos + rotate_half(x) * sin`
    /// with `rotate_half(x) = cat(-x2, x1)`, computed as `roll(x, D/2) * cat(-sin, sin)`
    /// (the same products, a sign flip being exact) added in one `addcmul`. Why: the
    /// negation, concatenation, product and sum of `rotate_half` are four kernels forward
    /// and about nine backward (each half's slice gradient is a zero fill and a copy); here
    /// three forward (product, roll, addcmul) and four backward.
    pub fn apply(&self, xs: &Tensor) -> Tensor {
        let half = xs.size()[3] / 2;
        (xs * &self.cos).addcmul(&xs.roll([half].as_slice(), [3].as_slice()), &self.sin)
    }
}

/// Scaled dot-product attention with grouped-query heads.
///
/// `q` is `[B, Hq, Lq, D]`, `k`/`v` are `[B, Hkv, Lk, D]`. Without a mask the kernel
/// handles the grouping itself. With one, only cuDNN's kernel takes grouped heads (the
/// memory-efficient kernel refuses them, and the dispatcher would fall back to the math
/// path), so the heads are repeated explicitly unless the dispatcher picks cuDNN for the
/// grouped call ([`masked_gqa_native`]). On one H100 (realistic batched layout, one layer
/// forward and backward) that saves the repeat's copy and its backward's reduction: 1.85 ms
/// against 1.56.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
) -> Tensor {
    let groups = q.size()[1] / k.size()[1];
    match mask {
        Some(mask) if groups > 1 && masked_gqa_native(q, k, v, mask) => {
            Tensor::scaled_dot_product_attention(q, k, v, Some(mask), 0.0, false, None, true)
        }
        Some(mask) if groups > 1 => {
            let k = k.repeat_interleave_self_int(groups, 1, None);
            let v = v.repeat_interleave_self_int(groups, 1, None);
            Tensor::scaled_dot_product_attention(q, &k, &v, Some(mask), 0.0, false, None, false)
        }
        Some(mask) => {
            Tensor::scaled_dot_product_attention(q, k, v, Some(mask), 0.0, false, None, false)
        }
        None => Tensor::scaled_dot_product_attention::<Tensor>(
            q,
            k,
            v,
            None,
            0.0,
            causal,
            None,
            groups > 1,
        ),
    }
}

/// Whether a masked attention call with grouped heads can go to a kernel that takes them
/// as they are: ATen's dispatcher picks cuDNN (backend 3 of `_fused_sdp_choice`) for it.
/// Never on the CPU, whose path stays the explicit repeat the tests were written against.
pub fn masked_gqa_native(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> bool {
    const CUDNN_ATTENTION: i64 = 3;
    q.device().is_cuda()
        && Tensor::internal_fused_sdp_choice(q, k, v, Some(mask), 0.0, false, None, true)
            == CUDNN_ATTENTION
}

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn dflash_attention_last_error() -> *const c_char;
        pub fn dflash_grouped_attention(
            q: *mut c_void,
            k: *mut c_void,
            v: *mut c_void,
            masks: *const *mut c_void,
            spec: *const i64,
            n: i64,
            seq_len: i64,
            out: *mut *mut c_void,
        ) -> c_int;
    }
}

/// Attention of query groups over their own keys, as one autograd node
/// (`src/model/attention.cpp`): `q` `[B, Hq, Q, D]`, `k`/`v` `[B, Hkv, S + Q, D]`; group
/// `i` is `(q0, len, ctx)` with its additive mask `[B, 1, len, ctx + len]`: queries
/// `[q0, q0 + len)` over keys `[0, ctx)` and `[S + q0, S + q0 + len)`. The groups tile the
/// queries in order. Equal to [`attention`] per group (the same ATen kernels), without
/// autograd's per-group graph over the full key tensors: each narrow's backward there
/// fills a zero tensor of all the keys. Once differentiable.
///
/// Panics (as tch's ops do) when ATen fails, e.g. out of device memory.
pub fn grouped_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    groups: &[((i64, i64, i64), &Tensor)],
    seq_len: i64,
) -> Tensor {
    let spec: Vec<i64> = groups
        .iter()
        .flat_map(|((q0, len, ctx), _)| [*q0, *len, *ctx])
        .collect();
    let masks: Vec<*mut std::ffi::c_void> =
        groups.iter().map(|(_, m)| m.as_ptr() as *mut _).collect();
    let raw = |t: &Tensor| t.as_ptr() as *mut std::ffi::c_void;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors and arrays of `groups.len()` entries; the shim writes `out`
    // only when it returns 0.
    let rc = unsafe {
        ffi::dflash_grouped_attention(
            raw(q),
            raw(k),
            raw(v),
            masks.as_ptr(),
            spec.as_ptr(),
            groups.len() as i64,
            seq_len,
            &mut out,
        )
    };
    if rc != 0 {
        // SAFETY: an accessor without arguments.
        let msg = crate::cuda::shim_text(unsafe { ffi::dflash_attention_last_error() });
        panic!("grouped attention: {msg}");
    }
    // SAFETY: a tensor the shim allocated with `new at::Tensor`, taken once.
    unsafe { Tensor::from_ptr(out as *mut _) }
}

/// Attention in batched groups of `len` queries (see `objective::batched_mask`): `q`
/// `[B, Hq, Q, D]` becomes `[B * G, Hq, len, D]` (a view), each group's keys the `S`
/// context keys followed by its own `len` block keys, `[B * G, Hkv, S + len, D]` (one copy),
/// and one attention call over the `[B * G, 1, len, S + len]` mask computes every group.
/// The copy is laid out `[B * G, S + len, Hkv, D]` (handed over as a transposed view, which
/// the attention kernels take): the keys arrive in that layout from the projections, so it
/// copies whole rows instead of gathering them into `[.., Hkv, S + len, D]`.
pub fn batched_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    s: i64,
    len: i64,
) -> Tensor {
    let (b, hq, ql, d) = (q.size()[0], q.size()[1], q.size()[2], q.size()[3]);
    let hkv = k.size()[1];
    let g = ql / len;
    let qb = q
        .reshape([b, hq, g, len, d])
        .permute([0, 2, 1, 3, 4])
        .reshape([b * g, hq, len, d]);
    let keys = |t: &Tensor| {
        // [B, Hkv, S + Q, D] -> [B, S + Q, Hkv, D]; split, not narrow: the backward of a
        // split is one concatenation, of each narrow a zero fill, a copy and an add
        let rows = t.transpose(1, 2).split_with_sizes([s, ql], 1);
        let ctx = rows[0].unsqueeze(1).expand([b, g, s, hkv, d], false);
        let own = rows[1].reshape([b, g, len, hkv, d]);
        Tensor::cat(&[ctx, own], 2)
            .reshape([b * g, s + len, hkv, d])
            .transpose(1, 2)
    };
    attention(&qb, &keys(k), &keys(v), Some(mask), false)
        .reshape([b, g, hq, len, d])
        .permute([0, 2, 1, 3, 4])
        .reshape([b, hq, ql, d])
}

/// `[B, L, heads * D] -> [B, L, heads, D]`, a view. Per-head norms and rotary embeddings
/// work in this layout, then [`heads_first`] hands attention its `[B, heads, L, D]` view.
/// Why not transpose first: the norm kernels take contiguous rows and would copy the
/// transposed view (forward and backward) of every query and key.
pub fn split_heads(xs: &Tensor, heads: i64, head_dim: i64) -> Tensor {
    let (b, l) = (xs.size()[0], xs.size()[1]);
    xs.view([b, l, heads, head_dim])
}

/// `[B, L, heads, D] -> [B, heads, L, D]`, a view (attention kernels take strided inputs).
pub fn heads_first(xs: &Tensor) -> Tensor {
    xs.transpose(1, 2)
}

/// `[B, heads, L, D] -> [B, L, heads * D]`.
pub fn merge_heads(xs: &Tensor) -> Tensor {
    let s = xs.size();
    xs.transpose(1, 2)
        .contiguous()
        .view([s[0], s[2], s[1] * s[3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    #[test]
    fn rms_norm_matches_hand_formula() {
        let vs = nn::VarStore::new(Device::Cpu);
        let norm = RmsNorm::new(vs.root() / "n", 4, 1e-6);
        let x = Tensor::from_slice(&[1f32, 2., 3., 4.]).view([1, 4]);
        let y = norm.forward(&x);
        let rms = ((1. + 4. + 9. + 16.) / 4f64 + 1e-6).sqrt();
        let want: Vec<f32> = [1., 2., 3., 4.].iter().map(|v| (v / rms) as f32).collect();
        let got = Vec::<f32>::try_from(y.view([-1])).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn a_trainable_norms_weight_gradient_is_the_column_sum_of_grad_times_normed_input() {
        // the same norm with its weight trainable and frozen
        let vs = nn::VarStore::new(Device::Cpu);
        let mut norm = RmsNorm::new(vs.root() / "n", 4, 1e-6);
        tch::no_grad(|| {
            norm.weight
                .copy_(&Tensor::from_slice(&[0.5f64, -1.0, 2.0, 1.5]).to_kind(Kind::Float))
        });
        let x = Tensor::from_slice(&[1f32, -2., 3., 0.5, 0.1, 0.2, -0.3, 4.0]).view([2, 4]);
        let y = norm.forward(&x);
        let frozen = tch::no_grad(|| x.rms_norm([4], Some(&norm.weight.detach()), 1e-6));
        assert!(y.allclose(&frozen, 1e-6, 1e-6, false));
        // d sum(y * g) / d w_j = sum over rows of g * x / rms(x), by hand
        let g = Tensor::from_slice(&[1f32, 2., -1., 0.5, -2., 1., 3., 1.]).view([2, 4]);
        let dw = Tensor::run_backward(&[(&y * &g).sum(Kind::Float)], &[&norm.weight], false, false)
            .remove(0);
        let xs: Vec<f32> = Vec::try_from(x.view([-1])).unwrap();
        let gs: Vec<f32> = Vec::try_from(g.view([-1])).unwrap();
        let got: Vec<f32> = Vec::try_from(dw).unwrap();
        for j in 0..4 {
            let want: f64 = (0..2)
                .map(|r| {
                    let row = &xs[r * 4..r * 4 + 4];
                    let rms =
                        (row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / 4.0 + 1e-6).sqrt();
                    gs[r * 4 + j] as f64 * row[j] as f64 / rms
                })
                .sum();
            assert!(
                (got[j] as f64 - want).abs() < 1e-5,
                "{got:?} column {j}: {want}"
            );
        }
    }

    #[test]
    fn rope_rotates_pairs_by_position_angle() {
        // head_dim 2: one frequency (1.0); position p rotates (x1, x2) by angle p.
        let pos = Tensor::from_slice(&[0i64, 1, 2]).view([1, 3]);
        let rope = Rope::new(&pos, 2, 10000.0, Kind::Float);
        let x = Tensor::from_slice(&[1f32, 0., 1., 0., 1., 0.]).view([1, 3, 1, 2]);
        let y = Vec::<f32>::try_from(rope.apply(&x).view([-1])).unwrap();
        for p in 0..3 {
            let a = p as f32;
            assert!((y[2 * p] - a.cos()).abs() < 1e-6);
            assert!((y[2 * p + 1] - a.sin()).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_equals_rotate_half_written_out_per_element() {
        // Hugging Face's formula, element by element: for i < D/2,
        // y_i = x_i cos(p f_i) - x_{i+D/2} sin(p f_i), y_{i+D/2} = x_{i+D/2} cos + x_i sin
        let (d, l, theta) = (8usize, 5usize, 100.0f64);
        let pos = Tensor::from_slice(&[3i64, 0, 7, 1, 12]).view([1, l as i64]);
        let rope = Rope::new(&pos, d as i64, theta, Kind::Double);
        let x: Vec<f64> = (0..2 * l * d)
            .map(|i| ((i * 37 % 11) as f64 - 5.0) / 3.0)
            .collect();
        // x is laid out [head][position][dim]; the rotation takes [B, L, heads, D]
        let xt = Tensor::from_slice(&x).view([1, 2, l as i64, d as i64]);
        let got = rope.apply(&xt.transpose(1, 2)).transpose(1, 2).contiguous();
        let got = Vec::<f64>::try_from(got.view([-1])).unwrap();
        let positions = [3.0, 0.0, 7.0, 1.0, 12.0];
        for h in 0..2 {
            for (t, &p) in positions.iter().enumerate() {
                let row = &x[(h * l + t) * d..(h * l + t + 1) * d];
                for i in 0..d / 2 {
                    let a = p * theta.powf(-((2 * i) as f64) / d as f64);
                    let want = [
                        row[i] * a.cos() - row[i + d / 2] * a.sin(),
                        row[i + d / 2] * a.cos() + row[i] * a.sin(),
                    ];
                    for (k, w) in [(i, want[0]), (i + d / 2, want[1])] {
                        let g = got[(h * l + t) * d + k];
                        assert!((g - w).abs() < 1e-5, "head {h} pos {p} dim {k}: {g} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn llama3_remap_keeps_high_divides_low_and_interpolates_between() {
        // head_dim 8, theta 1e4: frequencies 1, 0.1, 0.01, 0.001 (wavelengths 2 pi / f);
        // old context 64 with factors 1 and 4: keep below 16, divide above 64
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64,
        };
        let got = Vec::<f32>::try_from(rope_inv_freq(8, 1e4, Some(&s), Device::Cpu)).unwrap();
        let smooth = (64.0 / (2.0 * std::f64::consts::PI / 0.1) - 1.0) / 3.0;
        let want = [
            1.0,
            (1.0 - smooth) * 0.1 / 8.0 + smooth * 0.1,
            0.01 / 8.0,
            0.001 / 8.0,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!(
                (*g as f64 - w).abs() < 1e-6 * w.max(1e-3),
                "{got:?} vs {want:?}"
            );
        }
        let plain = Vec::<f32>::try_from(rope_inv_freq(8, 1e4, None, Device::Cpu)).unwrap();
        assert_eq!(plain[0], got[0]);
    }

    #[test]
    fn masked_gqa_equals_unmasked_when_mask_allows_all() {
        tch::manual_seed(0);
        let q = Tensor::randn([1, 4, 3, 8], (Kind::Float, Device::Cpu));
        let k = Tensor::randn([1, 2, 5, 8], (Kind::Float, Device::Cpu));
        let v = Tensor::randn([1, 2, 5, 8], (Kind::Float, Device::Cpu));
        let all = Tensor::ones([1, 1, 3, 5], (Kind::Bool, Device::Cpu));
        let a = attention(&q, &k, &v, Some(&all), false);
        let b = attention(&q, &k, &v, None, false);
        assert!(a.allclose(&b, 1e-5, 1e-5, false));
    }
}
