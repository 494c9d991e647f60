//! The target: a Qwen3-layout causal language model (RMSNorm, RoPE, grouped-query
//! attention with per-head q/k norms, SwiGLU MLP, tied or untied lm_head). Its forward
//! pass returns the logits and, in the same pass, the raw outputs of requested layers.
use serde::{Deserialize, Serialize};
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::layers::{attention, merge_heads, split_heads, Linear, Mlp, RmsNorm, Rope};
use super::ModelError;

/// `config.json` of a Hugging Face Qwen3 checkpoint, as written (HF field names, options).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Qwen3ConfigFile {
    #[serde(default)]
    pub model_type: Option<String>,
    pub vocab_size: Option<i64>,
    pub hidden_size: Option<i64>,
    pub intermediate_size: Option<i64>,
    pub num_hidden_layers: Option<i64>,
    pub num_attention_heads: Option<i64>,
    #[serde(default)]
    pub num_key_value_heads: Option<i64>,
    #[serde(default)]
    pub head_dim: Option<i64>,
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
}

/// A resolved, validated target configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
    pub vocab_size: i64,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: i64,
}

impl Qwen3ConfigFile {
    pub fn into_config(self) -> Result<Qwen3Config, ModelError> {
        fn need(v: Option<i64>, key: &str) -> Result<i64, ModelError> {
            match v {
                Some(v) if v > 0 => Ok(v),
                Some(v) => Err(ModelError::Config(format!(
                    "`{key}` must be positive, got {v}"
                ))),
                None => Err(ModelError::Config(format!("missing field `{key}`"))),
            }
        }
        let hidden_size = need(self.hidden_size, "hidden_size")?;
        let heads = need(self.num_attention_heads, "num_attention_heads")?;
        let kv_heads = need(
            self.num_key_value_heads.or(Some(heads)),
            "num_key_value_heads",
        )?;
        if heads % kv_heads != 0 {
            return Err(ModelError::Config(format!(
                "num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )));
        }
        let head_dim = match self.head_dim {
            Some(d) => need(Some(d), "head_dim")?,
            None if hidden_size % heads == 0 => hidden_size / heads,
            None => {
                return Err(ModelError::Config(format!(
                    "hidden_size ({hidden_size}) is not divisible by num_attention_heads ({heads}) and head_dim is not given"
                )))
            }
        };
        if head_dim % 2 != 0 {
            return Err(ModelError::Config(format!(
                "head_dim must be even for RoPE, got {head_dim}"
            )));
        }
        Ok(Qwen3Config {
            vocab_size: need(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(self.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(self.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: self.rope_theta.unwrap_or(1_000_000.0),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: self.max_position_embeddings.unwrap_or(40960),
        })
    }
}

impl Qwen3Config {
    /// The `config.json` this configuration round-trips through.
    pub fn to_file(&self, dtype: &str) -> Qwen3ConfigFile {
        Qwen3ConfigFile {
            model_type: Some("qwen3".into()),
            vocab_size: Some(self.vocab_size),
            hidden_size: Some(self.hidden_size),
            intermediate_size: Some(self.intermediate_size),
            num_hidden_layers: Some(self.num_hidden_layers),
            num_attention_heads: Some(self.num_attention_heads),
            num_key_value_heads: Some(self.num_key_value_heads),
            head_dim: Some(self.head_dim),
            rms_norm_eps: Some(self.rms_norm_eps),
            rope_theta: Some(self.rope_theta),
            tie_word_embeddings: Some(self.tie_word_embeddings),
            max_position_embeddings: Some(self.max_position_embeddings),
            torch_dtype: Some(dtype.into()),
        }
    }
}

#[derive(Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
}

impl Attention {
    fn new(p: nn::Path, cfg: &Qwen3Config) -> Self {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        Self {
            q_proj: Linear::new(&p / "q_proj", h, cfg.num_attention_heads * d),
            k_proj: Linear::new(&p / "k_proj", h, cfg.num_key_value_heads * d),
            v_proj: Linear::new(&p / "v_proj", h, cfg.num_key_value_heads * d),
            o_proj: Linear::new(&p / "o_proj", cfg.num_attention_heads * d, h),
            q_norm: RmsNorm::new(&p / "q_norm", d, cfg.rms_norm_eps),
            k_norm: RmsNorm::new(&p / "k_norm", d, cfg.rms_norm_eps),
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            head_dim: d,
        }
    }

    fn forward(&self, xs: &Tensor, rope: &Rope) -> Tensor {
        // 1. (B, L, H) -> (B, heads, L, D), per-head norms, rotary positions
        let q = split_heads(&self.q_proj.forward(xs), self.heads, self.head_dim);
        let k = split_heads(&self.k_proj.forward(xs), self.kv_heads, self.head_dim);
        let v = split_heads(&self.v_proj.forward(xs), self.kv_heads, self.head_dim);
        let q = rope.apply(&self.q_norm.forward(&q));
        let k = rope.apply(&self.k_norm.forward(&k));
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
    fn new(p: nn::Path, cfg: &Qwen3Config) -> Self {
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
            mlp: Mlp::new(&p / "mlp", cfg.hidden_size, cfg.intermediate_size),
        }
    }

    fn forward(&self, xs: &Tensor, rope: &Rope) -> Tensor {
        let xs = xs
            + self
                .self_attn
                .forward(&self.input_layernorm.forward(xs), rope);
        &xs + self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&xs))
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

/// A Qwen3 causal LM. Variables live under `model.*` and `lm_head.*` as in HF checkpoints.
#[derive(Debug)]
pub struct Qwen3 {
    pub cfg: Qwen3Config,
    pub embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    /// `[vocab, H]`; the same tensor as `embed_tokens` when tied.
    pub lm_head: Tensor,
}

impl Qwen3 {
    pub fn new(root: &nn::Path, cfg: &Qwen3Config) -> Self {
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
        let rope = Rope::new(&positions, self.cfg.head_dim, self.cfg.rope_theta, kind);
        // 2. decoder layers, keeping the tapped raw outputs
        let last = if logits {
            n
        } else {
            taps.iter().max().map_or(0, |m| m + 1)
        };
        let mut hidden: Vec<Option<Tensor>> = (0..taps.len()).map(|_| None).collect();
        for (i, layer) in self.layers.iter().enumerate().take(last) {
            xs = layer.forward(&xs, &rope);
            for (slot, _) in taps.iter().enumerate().filter(|(_, &t)| t == i) {
                hidden[slot] = Some(xs.shallow_clone());
            }
        }
        // 3. final norm and lm_head
        let logits = logits.then(|| self.norm.forward(&xs).matmul(&self.lm_head.tr()));
        Ok(TargetOutput {
            logits,
            hidden: hidden
                .into_iter()
                .map(|h| h.expect("every tap is below `last`"))
                .collect(),
        })
    }
}

impl Qwen3Config {
    /// Named shapes for random-weight targets. `realistic`: 28 layers, hidden 1024,
    /// intermediate 3072, 16 heads / 8 KV heads of 128, vocab 151936 (tied embeddings).
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "realistic" => Some(Self {
                vocab_size: 151936,
                hidden_size: 1024,
                intermediate_size: 3072,
                num_hidden_layers: 28,
                num_attention_heads: 16,
                num_key_value_heads: 8,
                head_dim: 128,
                rms_norm_eps: 1e-6,
                rope_theta: 1_000_000.0,
                tie_word_embeddings: true,
                max_position_embeddings: 40960,
            }),
            "tiny" => Some(Self {
                vocab_size: 260,
                hidden_size: 128,
                intermediate_size: 384,
                num_hidden_layers: 6,
                num_attention_heads: 4,
                num_key_value_heads: 2,
                head_dim: 32,
                rms_norm_eps: 1e-6,
                rope_theta: 10_000.0,
                tie_word_embeddings: false,
                max_position_embeddings: 4096,
            }),
            _ => None,
        }
    }
}
