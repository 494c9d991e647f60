//! The target model: a frozen causal language model of the Llama lineage (Llama, Qwen2 /
//! Qwen2.5, Qwen3). All families share one model, [`Target`]: RMSNorm, RoPE (`rotate_half`
//! convention), grouped-query attention, SwiGLU MLP, tied or untied lm_head; the
//! differences are fields of [`TargetConfig`], read from a checkpoint's `config.json` by
//! [`super::target_config`] (its types are re-exported here). The forward pass returns the
//! logits and, in the same pass, the raw outputs of requested layers.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::error::ModelError;
use super::layers::{
    add_norm, attention, heads_first, merge_heads, norm_rope, split_heads, Linear, Mlp, RmsNorm,
    Rope,
};
pub use super::target_config::{Family, TargetConfig, TargetConfigFile};

#[derive(Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// `(q_norm, k_norm)` where the family has them.
    qk_norm: Option<(RmsNorm, RmsNorm)>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn new(p: nn::Path, cfg: &TargetConfig) -> Self {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (q, kv) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
        Self {
            q_proj: Linear::with_bias(&p / "q_proj", h, q, cfg.qkv_bias),
            k_proj: Linear::with_bias(&p / "k_proj", h, kv, cfg.qkv_bias),
            v_proj: Linear::with_bias(&p / "v_proj", h, kv, cfg.qkv_bias),
            o_proj: Linear::with_bias(&p / "o_proj", q, h, cfg.o_bias),
            qk_norm: cfg.qk_norm.then(|| {
                (
                    RmsNorm::new(&p / "q_norm", d, cfg.rms_norm_eps),
                    RmsNorm::new(&p / "k_norm", d, cfg.rms_norm_eps),
                )
            }),
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: d,
        }
    }

    fn forward(&self, xs: &Tensor, rope: &Rope) -> Tensor {
        // 1. (B, L, H) -> (B, L, heads, D), per-head norms (Qwen3), rotary positions
        let q = split_heads(&self.q_proj.forward(xs), self.heads, self.head_dim);
        let k = split_heads(&self.k_proj.forward(xs), self.kv_heads, self.head_dim);
        let v = heads_first(&split_heads(
            &self.v_proj.forward(xs),
            self.kv_heads,
            self.head_dim,
        ));
        let (q_norm, k_norm) = match &self.qk_norm {
            Some((q_norm, k_norm)) => (Some(q_norm), Some(k_norm)),
            None => (None, None),
        };
        let q = heads_first(&norm_rope(&q, q_norm, rope));
        let k = heads_first(&norm_rope(&k, k_norm, rope));
        // 2. causal attention, (B, heads, L, D) -> (B, L, heads * D)
        let a = attention(&q, &k, &v, None, true);
        self.o_proj.forward(&merge_heads(&a))
    }
}

#[derive(Debug)]
struct DecoderLayer {
    input_layernorm: RmsNorm,
    self_attn: Attention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl DecoderLayer {
    fn new(p: nn::Path, cfg: &TargetConfig) -> Self {
        Self {
            input_layernorm: RmsNorm::new(
                &p / "input_layernorm",
                cfg.hidden_size,
                cfg.rms_norm_eps,
            ),
            self_attn: Attention::new(&p / "self_attn", cfg),
            post_attention_layernorm: RmsNorm::new(
                &p / "post_attention_layernorm",
                cfg.hidden_size,
                cfg.rms_norm_eps,
            ),
            mlp: Mlp::with_bias(
                &p / "mlp",
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg.mlp_bias,
            ),
        }
    }

    /// The layer over the residual stream `xs`, given `normed`, its input norm
    /// (`input_layernorm(xs)`, which the caller fuses into the previous residual sum).
    /// Returns `(h, m)`: the layer's output is `h + m`, left to the caller for the same
    /// reason.
    fn forward(&self, xs: &Tensor, normed: &Tensor, rope: &Rope) -> (Tensor, Tensor) {
        // 1. attention and its residual sum, fused with the MLP's norm
        let a = self.self_attn.forward(normed, rope);
        let (h, n) = add_norm(xs, &a, &self.post_attention_layernorm);
        // 2. MLP
        (h, self.mlp.forward(&n))
    }
}

/// The output of one target forward pass.
#[derive(Debug)]
pub struct TargetOutput {
    /// `[B, S, vocab]`, or `None` when logits were not asked for.
    pub logits: Option<Tensor>,
    /// Raw outputs of the requested layers (pre-final-norm), in request order, each `[B, S, H]`.
    pub hidden: Vec<Tensor>,
}

/// A Llama/Qwen2/Qwen3 causal LM. Variables live under `model.*` and `lm_head.*` as in HF
/// checkpoints (the names of [`TargetConfig::expected_tensors`]).
#[derive(Debug)]
pub struct Target {
    pub cfg: TargetConfig,
    pub embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `[vocab, H]`; the same tensor as `embed_tokens` when tied.
    pub lm_head: Tensor,
}

impl Target {
    pub fn new(root: &nn::Path, cfg: &TargetConfig) -> Self {
        let p = root / "model";
        let embed_tokens = (&p / "embed_tokens").var(
            "weight",
            &[cfg.vocab_size, cfg.hidden_size],
            nn::Init::Randn {
                mean: 0.,
                stdev: super::layers::INIT_STD,
            },
        );
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| DecoderLayer::new(&p / "layers" / i, cfg))
            .collect();
        let norm = RmsNorm::new(&p / "norm", cfg.hidden_size, cfg.rms_norm_eps);
        let lm_head = if cfg.tie_word_embeddings {
            embed_tokens.shallow_clone()
        } else {
            Linear::new(root / "lm_head", cfg.hidden_size, cfg.vocab_size).weight
        };
        Self {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
        }
    }

    /// Runs the model over `input_ids` `[B, S]`. `taps` lists layer ids whose raw outputs
    /// are returned; with `logits == false` the pass stops after the deepest tapped layer.
    pub fn forward(
        &self,
        input_ids: &Tensor,
        taps: &[usize],
        logits: bool,
    ) -> Result<TargetOutput, ModelError> {
        let n = self.layers.len();
        if let Some(&bad) = taps.iter().find(|&&t| t >= n) {
            return Err(ModelError::Config(format!(
                "target layer id {bad} is out of range: the target has {n} layers (0..{})",
                n - 1
            )));
        }
        let (b, s) = (input_ids.size()[0], input_ids.size()[1]);
        let kind = self.embed_tokens.kind();
        // 1. token embedding (B, S) -> (B, S, H); RoPE tables for positions 0..S
        let mut xs = Tensor::embedding(&self.embed_tokens, input_ids, -1, false, false);
        let positions = Tensor::arange(s, (Kind::Int64, input_ids.device()))
            .unsqueeze(0)
            .expand([b, s], false);
        let rope = Rope::scaled(
            &positions,
            self.cfg.head_dim,
            self.cfg.rope_theta,
            self.cfg.rope_scaling.as_ref(),
            kind,
        );
        // 2. decoder layers, keeping the tapped raw outputs
        let last = if logits {
            n
        } else {
            taps.iter().max().map_or(0, |m| m + 1)
        };
        //    Each layer's residual sum is fused with the norm that reads it next: the next
        //    layer's input norm, or the final norm when logits follow.
        let layers = &self.layers[..last];
        let next_norm = |i: usize| match layers.get(i) {
            Some(l) => Some(&l.input_layernorm),
            None => logits.then_some(&self.norm),
        };
        let mut normed = match next_norm(0) {
            Some(norm) => norm.forward(&xs),
            None => xs.shallow_clone(),
        };
        let mut hidden: Vec<Option<Tensor>> = (0..taps.len()).map(|_| None).collect();
        for (i, layer) in layers.iter().enumerate() {
            let (h, m) = layer.forward(&xs, &normed, &rope);
            (xs, normed) = match next_norm(i + 1) {
                Some(norm) => add_norm(&h, &m, norm),
                None => (&h + m, Tensor::new()),
            };
            for (slot, _) in taps.iter().enumerate().filter(|(_, &t)| t == i) {
                hidden[slot] = Some(xs.shallow_clone());
            }
        }
        // 3. lm_head over the final norm
        let logits = logits.then(|| normed.matmul(&self.lm_head.tr()));
        Ok(TargetOutput {
            logits,
            hidden: hidden
                .into_iter()
                .map(|h| h.expect("every tap is below `last`"))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn file(json: serde_json::Value) -> TargetConfigFile {
        serde_json::from_value(json).unwrap()
    }

    fn base(model_type: &str) -> serde_json::Value {
        serde_json::json!({
            "model_type": model_type,
            "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        })
    }

    /// Every layout variant: the variables the model builds are exactly the listed
    /// checkpoint tensors, and the config round-trips through its `config.json`.
    #[test]
    fn expected_tensors_are_the_model_variables() {
        for (model_type, attention_bias, mlp_bias, tied) in [
            ("llama", false, false, true),
            ("llama", true, true, false),
            ("qwen2", false, false, true),
            ("qwen3", false, false, false),
            ("qwen3", true, false, true),
        ] {
            let mut j = base(model_type);
            j["attention_bias"] = attention_bias.into();
            j["mlp_bias"] = mlp_bias.into();
            j["tie_word_embeddings"] = tied.into();
            let cfg = file(j).into_config().unwrap();
            let vs = nn::VarStore::new(Device::Cpu);
            let _ = Target::new(&vs.root(), &cfg);
            let mut got: Vec<(String, Vec<i64>)> = vs
                .variables()
                .into_iter()
                .map(|(k, v)| (k, v.size()))
                .collect();
            got.sort();
            let mut want = cfg.expected_tensors();
            want.sort();
            assert_eq!(got, want, "{model_type} {attention_bias} {mlp_bias} {tied}");
            let back = serde_json::to_value(cfg.to_file("float32")).unwrap();
            assert_eq!(file(back).into_config().unwrap(), cfg);
        }
    }
}
