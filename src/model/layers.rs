//! Building blocks shared by the target and the drafter: bias-free linear layers, RMSNorm,
//! rotary position embeddings and grouped-query attention. Variable names mirror the
//! Hugging Face checkpoint keys so loading needs no renaming table.
use tch::nn::{self, Init, Module};
use tch::{Kind, Tensor};

/// Standard deviation of the normal init used by Qwen3-style models for every linear.
pub const INIT_STD: f64 = 0.02;

/// A linear layer without bias, `y = x W^T`, with `W` stored as `[out, in]` like PyTorch.
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
}

impl Linear {
    pub fn new(p: nn::Path, in_dim: i64, out_dim: i64) -> Self {
        let weight = p.var(
            "weight",
            &[out_dim, in_dim],
            Init::Randn {
                mean: 0.,
                stdev: INIT_STD,
            },
        );
        Self { weight }
    }
}

impl Module for Linear {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs.matmul(&self.weight.tr())
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

impl Module for RmsNorm {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs.rms_norm([self.dim], Some(&self.weight), self.eps)
    }
}

/// The SwiGLU MLP of Qwen3: `down(silu(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn new(p: nn::Path, hidden: i64, intermediate: i64) -> Self {
        Self {
            gate_proj: Linear::new(&p / "gate_proj", hidden, intermediate),
            up_proj: Linear::new(&p / "up_proj", hidden, intermediate),
            down_proj: Linear::new(&p / "down_proj", intermediate, hidden),
        }
    }
}

impl Module for Mlp {
    fn forward(&self, xs: &Tensor) -> Tensor {
        let gate = self.gate_proj.forward(xs).silu();
        self.down_proj.forward(&(gate * self.up_proj.forward(xs)))
    }
}

/// Cosine and sine tables for rotary embeddings at arbitrary positions.
///
/// `positions` is `[B, L]` (integer); the tables are `[B, 1, L, head_dim]` in `kind`,
/// laid out for the non-interleaved `rotate_half` convention of Hugging Face Qwen3.
#[derive(Debug)]
pub struct Rope {
    pub cos: Tensor,
    pub sin: Tensor,
}

impl Rope {
    pub fn new(positions: &Tensor, head_dim: i64, theta: f64, kind: Kind) -> Self {
        let device = positions.device();
        // 1. inverse frequencies (head_dim / 2)
        let inv_freq = (Tensor::arange_start_step(0, head_dim, 2, (Kind::Float, device))
            / head_dim as f64
            * theta.ln())
        .exp()
        .reciprocal();
        // 2. (B, L, 1) x (D/2) -> (B, L, D/2) -> (B, L, D)
        let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        Self {
            cos: emb.cos().to_kind(kind),
            sin: emb.sin().to_kind(kind),
        }
    }

    /// Restrict the tables to positions `start..start+len` of the L axis.
    pub fn narrow(&self, start: i64, len: i64) -> Self {
        Self {
            cos: self.cos.narrow(2, start, len),
            sin: self.sin.narrow(2, start, len),
        }
    }

    /// Rotates `xs` of shape `[B, heads, L, head_dim]`.
    pub fn apply(&self, xs: &Tensor) -> Tensor {
        let half = xs.size()[3] / 2;
        let x1 = xs.narrow(3, 0, half);
        let x2 = xs.narrow(3, half, half);
        let rotated = Tensor::cat(&[&x2.neg(), &x1], -1);
        xs * &self.cos + rotated * &self.sin
    }
}

/// Scaled dot-product attention with grouped-query heads.
///
/// `q` is `[B, Hq, Lq, D]`, `k`/`v` are `[B, Hkv, Lk, D]`. With a mask, key/value heads are
/// repeated explicitly, because the memory-efficient kernels that take an arbitrary mask do
/// not all support grouped heads; without one the kernel handles the grouping itself.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
) -> Tensor {
    let groups = q.size()[1] / k.size()[1];
    match mask {
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

/// `[B, L, heads * D] -> [B, heads, L, D]`.
pub fn split_heads(xs: &Tensor, heads: i64, head_dim: i64) -> Tensor {
    let (b, l) = (xs.size()[0], xs.size()[1]);
    xs.view([b, l, heads, head_dim]).transpose(1, 2)
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
    fn rope_rotates_pairs_by_position_angle() {
        // head_dim 2: one frequency (1.0); position p rotates (x1, x2) by angle p.
        let pos = Tensor::from_slice(&[0i64, 1, 2]).view([1, 3]);
        let rope = Rope::new(&pos, 2, 10000.0, Kind::Float);
        let x = Tensor::from_slice(&[1f32, 0., 1., 0., 1., 0.]).view([1, 1, 3, 2]);
        let y = Vec::<f32>::try_from(rope.apply(&x).view([-1])).unwrap();
        for p in 0..3 {
            let a = p as f32;
            assert!((y[2 * p] - a.cos()).abs() < 1e-6);
            assert!((y[2 * p + 1] - a.sin()).abs() < 1e-6);
        }
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
