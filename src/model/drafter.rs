//! The DFlash drafter: `fc` over the concatenated target layer features plus
//! `hidden_norm` make a context that is fixed across layers; each layer takes its queries
//! from the noised block tokens and its keys/values from `[context ; block]` with the same
//! `Wk`/`Wv`; a final norm and the target's frozen lm_head produce the block's tokens.
//! Whatever the target's family (llama, qwen2, qwen3), the drafter is the same Qwen3-style
//! stack (q/k norms, no biases) shaped from the target's config (hidden size, heads,
//! `head_dim`, MLP width), with plain RoPE at the target's `rope_theta`: the target's
//! `rope_scaling` is not carried over, and its `config.json` does not name one.
use serde::{Deserialize, Serialize};
use tch::nn::{self, Module};
use tch::Tensor;

use super::error::ModelError;
use super::layers::{
    self, attention, heads_first, merge_heads, norm_rope, split_heads, Linear, Mlp, RmsNorm, Rope,
};
use super::objective::GroupedMask;
use super::target_config::TargetConfig;

/// Attention span of a drafter layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LayerType {
    #[serde(rename = "full_attention")]
    Full,
    #[serde(rename = "sliding_attention")]
    Sliding,
}

/// The drafter's `config.json` (Hugging Face style, with the DFlash fields top-level).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrafterConfig {
    #[serde(default = "default_arch")]
    pub architectures: Vec<String>,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub vocab_size: i64,
    /// Number of layers of the target the features come from.
    pub num_target_layers: i64,
    pub block_size: i64,
    pub target_layer_ids: Vec<usize>,
    pub mask_token_id: i64,
    pub layer_types: Vec<LayerType>,
    pub sliding_window: i64,
}

fn default_arch() -> Vec<String> {
    vec!["DFlashDraftModel".into()]
}

/// Target layer ids tapped by a drafter of `drafter_layers` layers:
/// `round(1 + i * (L_t - 4) / (L_d - 1))`, or `[L_t / 2]` for a single layer.
pub fn default_target_layer_ids(target_layers: i64, drafter_layers: i64) -> Vec<usize> {
    if drafter_layers == 1 {
        return vec![(target_layers / 2) as usize];
    }
    (0..drafter_layers)
        .map(|i| {
            (1.0 + i as f64 * (target_layers - 4) as f64 / (drafter_layers - 1) as f64).round()
                as usize
        })
        .collect()
}

impl DrafterConfig {
    /// A drafter shaped like the target's layers (same hidden size, heads, MLP width).
    pub fn for_target(
        target: &TargetConfig,
        num_layers: i64,
        block_size: i64,
        mask_token_id: i64,
    ) -> Self {
        Self {
            architectures: default_arch(),
            hidden_size: target.hidden_size,
            intermediate_size: target.intermediate_size,
            num_hidden_layers: num_layers,
            num_attention_heads: target.num_attention_heads,
            num_key_value_heads: target.num_key_value_heads,
            head_dim: target.head_dim,
            rms_norm_eps: target.rms_norm_eps,
            rope_theta: target.rope_theta,
            vocab_size: target.vocab_size,
            num_target_layers: target.num_hidden_layers,
            block_size,
            target_layer_ids: default_target_layer_ids(target.num_hidden_layers, num_layers),
            mask_token_id,
            layer_types: vec![LayerType::Full; num_layers as usize],
            sliding_window: 2048,
        }
    }

    /// Checks the drafter's own consistency and that it fits `target`.
    pub fn validate(&self, target: &TargetConfig) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.hidden_size != target.hidden_size {
            return bad(format!(
                "drafter hidden_size {} differs from the target's {}: the drafter uses the target's embedding and lm_head",
                self.hidden_size, target.hidden_size
            ));
        }
        if self.vocab_size != target.vocab_size {
            return bad(format!(
                "drafter vocab_size {} differs from the target's {}",
                self.vocab_size, target.vocab_size
            ));
        }
        if self.mask_token_id < 0 || self.mask_token_id >= target.vocab_size {
            return bad(format!(
                "mask_token_id {} is outside the target vocabulary 0..{}",
                self.mask_token_id, target.vocab_size
            ));
        }
        if self.target_layer_ids.is_empty() {
            return bad("target_layer_ids is empty".into());
        }
        if let Some(id) = self
            .target_layer_ids
            .iter()
            .find(|&&i| i as i64 >= target.num_hidden_layers)
        {
            return bad(format!(
                "target layer id {id} is out of range: the target has {} layers",
                target.num_hidden_layers
            ));
        }
        if self.layer_types.len() as i64 != self.num_hidden_layers {
            return bad(format!(
                "layer_types has {} entries for {} layers",
                self.layer_types.len(),
                self.num_hidden_layers
            ));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 || self.head_dim % 2 != 0 {
            return bad(
                "attention heads must be a multiple of key/value heads and head_dim even".into(),
            );
        }
        if self.block_size < 2 {
            return bad(format!(
                "block_size must be at least 2, got {}",
                self.block_size
            ));
        }
        if self.layer_types.contains(&LayerType::Sliding) && self.sliding_window < self.block_size {
            return bad(format!(
                "sliding_window {} is smaller than block_size {}",
                self.sliding_window, self.block_size
            ));
        }
        Ok(())
    }
}

/// One drafter layer; `attn_block` and `mlp_block` are exposed separately so the training
/// step can time them.
#[derive(Debug)]
pub struct DrafterLayer {
    input_layernorm: RmsNorm,
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
    pub layer_type: LayerType,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl DrafterLayer {
    fn new(p: nn::Path, cfg: &DrafterConfig, layer_type: LayerType) -> Self {
        let (h, d, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
        let a = &p / "self_attn";
        Self {
            input_layernorm: RmsNorm::new(&p / "input_layernorm", h, eps),
            q_proj: Linear::new(&a / "q_proj", h, cfg.num_attention_heads * d),
            k_proj: Linear::new(&a / "k_proj", h, cfg.num_key_value_heads * d),
            v_proj: Linear::new(&a / "v_proj", h, cfg.num_key_value_heads * d),
            o_proj: Linear::new(&a / "o_proj", cfg.num_attention_heads * d, h),
            q_norm: RmsNorm::new(&a / "q_norm", d, eps),
            k_norm: RmsNorm::new(&a / "k_norm", d, eps),
            post_attention_layernorm: RmsNorm::new(&p / "post_attention_layernorm", h, eps),
            mlp: Mlp::new(&p / "mlp", h, cfg.intermediate_size),
            layer_type,
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: d,
        }
    }

    /// `x + Wo attention(q(x), k/v([ctx ; x]))`. `x` is `[B, Q, H]`, `ctx` `[B, S, H]`,
    /// `rope` covers the `S + Q` key positions (the last `Q` are the queries'), `mask` the
    /// block mask group by group: each group's queries attend to its own keys only.
    pub fn attn_block(&self, x: &Tensor, ctx: &Tensor, rope: &Rope, mask: &GroupedMask) -> Tensor {
        let (s, q_len) = (ctx.size()[1], x.size()[1]);
        // 1. pre-norm; queries from the block only
        let h = self.input_layernorm.forward(x);
        let q = split_heads(&self.q_proj.forward(&h), self.heads, self.head_dim);
        // 2. keys/values from [ctx ; block] with the same projections: (B, S+Q, H)
        let kv_in = Tensor::cat(&[ctx, &h], 1);
        let k = split_heads(&self.k_proj.forward(&kv_in), self.kv_heads, self.head_dim);
        let v = heads_first(&split_heads(
            &self.v_proj.forward(&kv_in),
            self.kv_heads,
            self.head_dim,
        ));
        // 3. per-head norms and rotary: queries at the block positions, keys at all S+Q
        // positions (one fused kernel each way on CUDA); then (B, L, heads, D) -> (B, heads, L, D)
        let q = heads_first(&norm_rope(&q, Some(&self.q_norm), &rope.narrow(s, q_len)));
        let k = heads_first(&norm_rope(&k, Some(&self.k_norm), rope));
        // 4. (B, heads, Q, D) -> (B, Q, heads*D) -> (B, Q, H)
        let a = grouped_attention(&q, &k, &v, mask);
        x + self.o_proj.forward(&merge_heads(&a))
    }

    /// `x + mlp(post_attention_layernorm(x))`.
    pub fn mlp_block(&self, x: &Tensor) -> Tensor {
        x + self.mlp.forward(&self.post_attention_layernorm.forward(x))
    }
}

/// Attention of `q` `[B, Hq, Q, D]` over `k`/`v` `[B, Hkv, S + Q, D]`, one query group at a
/// time over the group's keys (the first `ctx` context keys and its own block keys): one
/// group (the dense mask) is plain [`attention`], several are one autograd node
/// ([`layers::grouped_attention`]), batched groups one call ([`layers::batched_attention`]).
pub fn grouped_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &GroupedMask) -> Tensor {
    let s = mask.seq_len;
    if mask.batch > 0 {
        return layers::batched_attention(q, k, v, &mask.groups[0].1, s, mask.batch);
    }
    match mask.groups.as_slice() {
        [(g, m)] => attention(
            &q.narrow(2, g.q0, g.len),
            &g.keys_of(k, s, 2),
            &g.keys_of(v, s, 2),
            Some(m),
            false,
        ),
        groups => {
            let groups: Vec<_> = groups
                .iter()
                .map(|(g, m)| ((g.q0, g.len, g.ctx), m))
                .collect();
            layers::grouped_attention(q, k, v, &groups, s)
        }
    }
}

/// The DFlash drafter. It owns no embedding and no lm_head: those are the target's.
#[derive(Debug)]
pub struct Drafter {
    pub cfg: DrafterConfig,
    fc: Linear,
    hidden_norm: RmsNorm,
    pub layers: Vec<DrafterLayer>,
    norm: RmsNorm,
}

impl Drafter {
    pub fn new(p: &nn::Path, cfg: &DrafterConfig) -> Self {
        let features = cfg.target_layer_ids.len() as i64 * cfg.hidden_size;
        Self {
            cfg: cfg.clone(),
            fc: Linear::new(p / "fc", features, cfg.hidden_size),
            hidden_norm: RmsNorm::new(p / "hidden_norm", cfg.hidden_size, cfg.rms_norm_eps),
            layers: cfg
                .layer_types
                .iter()
                .enumerate()
                .map(|(i, &t)| DrafterLayer::new(p / "layers" / i, cfg, t))
                .collect(),
            norm: RmsNorm::new(p / "norm", cfg.hidden_size, cfg.rms_norm_eps),
        }
    }

    /// `RMSNorm(fc(features))`: `[B, S, L_d * H] -> [B, S, H]`.
    pub fn context(&self, features: &Tensor) -> Tensor {
        self.hidden_norm.forward(&self.fc.forward(features))
    }

    /// The final norm over the block hidden states.
    pub fn final_norm(&self, x: &Tensor) -> Tensor {
        self.norm.forward(x)
    }

    /// All layers without instrumentation: `x` `[B, Q, H]` -> normed `[B, Q, H]`.
    /// `masks` holds the full-attention mask and the sliding-window mask.
    pub fn forward(&self, x: &Tensor, ctx: &Tensor, rope: &Rope, masks: &LayerMasks) -> Tensor {
        let mut x = x.shallow_clone();
        for layer in &self.layers {
            x = layer.attn_block(&x, ctx, rope, masks.for_layer(layer.layer_type));
            x = layer.mlp_block(&x);
        }
        self.final_norm(&x)
    }
}

/// The attention masks of one step, by layer type.
#[derive(Debug)]
pub struct LayerMasks {
    pub full: GroupedMask,
    pub sliding: Option<GroupedMask>,
}

impl LayerMasks {
    pub fn for_layer(&self, t: LayerType) -> &GroupedMask {
        match (t, &self.sliding) {
            (LayerType::Sliding, Some(m)) => m,
            _ => &self.full,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_layer_ids_follow_the_reference_formula() {
        assert_eq!(default_target_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
        assert_eq!(default_target_layer_ids(28, 3), vec![1, 13, 25]);
        assert_eq!(default_target_layer_ids(36, 1), vec![18]);
    }
}
