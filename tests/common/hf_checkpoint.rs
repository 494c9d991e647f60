//! Tiny Hugging Face checkpoints of the Llama lineage (llama, qwen2, qwen3), written
//! independently of the library: a [`Spec`] of the layout choices, the `config.json`
//! Hugging Face writes for it, the tensor names and `[out, in]` shapes written out here,
//! random fp32 weights, two safetensors shards with an index ([`write_checkpoint`]), and
//! the tensors read back from the shards ([`read_back`]).
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{json, Value};
use tch::Tensor;

/// One test checkpoint: family and the layout choices that matter to the forward pass.
#[derive(Debug, Clone)]
pub struct Spec {
    pub model_type: &'static str,
    pub vocab: i64,
    pub hidden: i64,
    pub inter: i64,
    pub layers: i64,
    pub heads: i64,
    pub kv_heads: i64,
    /// `Some`: written to config.json; `None`: absent (hidden / heads).
    pub head_dim: Option<i64>,
    pub tied: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub theta: f64,
    /// `(factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)`.
    pub llama3: Option<(f64, f64, f64, i64)>,
}

impl Spec {
    pub fn head_dim(&self) -> i64 {
        self.head_dim.unwrap_or(self.hidden / self.heads)
    }

    pub fn qk_norm(&self) -> bool {
        self.model_type == "qwen3"
    }

    /// q/k/v biases and the o_proj bias, as each HF class builds them.
    pub fn biases(&self) -> (bool, bool) {
        match self.model_type {
            "qwen2" => (true, false),
            _ => (self.attention_bias, self.attention_bias),
        }
    }

    pub fn mlp_bias(&self) -> bool {
        self.model_type == "llama" && self.mlp_bias
    }

    pub fn llama_tied_biased() -> Self {
        Spec {
            model_type: "llama",
            vocab: 48,
            hidden: 16,
            inter: 24,
            layers: 3,
            heads: 4,
            kv_heads: 2,
            head_dim: None,
            tied: true,
            attention_bias: true,
            mlp_bias: true,
            theta: 10_000.0,
            // head_dim 4, theta 1e4: wavelengths 6.3 and 628; with an old context of 64
            // and factors 1 and 4 the first is kept (< 16), the second divided (> 64)
            llama3: Some((8.0, 1.0, 4.0, 64)),
        }
    }

    pub fn llama_untied() -> Self {
        Spec {
            head_dim: Some(8),
            hidden: 32,
            tied: false,
            attention_bias: false,
            mlp_bias: false,
            theta: 500_000.0,
            // head_dim 8, theta 5e5: wavelengths 6.3, 167, 4.4e3, 1.2e5; old context 256,
            // factors 1 and 4: keep, interpolate (64 < 167 < 256), divide, divide
            llama3: Some((8.0, 1.0, 4.0, 256)),
            ..Self::llama_tied_biased()
        }
    }

    pub fn qwen2() -> Self {
        Spec {
            model_type: "qwen2",
            tied: false,
            attention_bias: false,
            mlp_bias: false,
            theta: 1_000_000.0,
            llama3: None,
            ..Self::llama_tied_biased()
        }
    }

    pub fn qwen3() -> Self {
        Spec {
            model_type: "qwen3",
            // Qwen3's head_dim is not hidden / heads
            head_dim: Some(8),
            tied: false,
            attention_bias: false,
            mlp_bias: false,
            theta: 1_000_000.0,
            llama3: None,
            ..Self::llama_tied_biased()
        }
    }

    /// The `config.json` Hugging Face writes for the family (with fields the model ignores).
    pub fn config(&self) -> Value {
        let arch = match self.model_type {
            "llama" => "LlamaForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            _ => "Qwen3ForCausalLM",
        };
        let mut c = json!({
            "architectures": [arch],
            "model_type": self.model_type,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.inter,
            "max_position_embeddings": 512,
            "num_attention_heads": self.heads,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "rms_norm_eps": 1e-5,
            "rope_theta": self.theta,
            "tie_word_embeddings": self.tied,
            "torch_dtype": "float32",
            "transformers_version": "4.51.0",
            "use_cache": true,
            "vocab_size": self.vocab,
        });
        let o = c.as_object_mut().unwrap();
        if let Some(d) = self.head_dim {
            o.insert("head_dim".into(), d.into());
        }
        match self.model_type {
            "llama" => {
                o.insert("attention_bias".into(), self.attention_bias.into());
                o.insert("mlp_bias".into(), self.mlp_bias.into());
                o.insert("pretraining_tp".into(), 1.into());
            }
            _ => {
                o.insert("use_sliding_window".into(), false.into());
                o.insert("sliding_window".into(), Value::Null);
                o.insert("max_window_layers".into(), self.layers.into());
                if self.model_type == "qwen3" {
                    o.insert("attention_bias".into(), false.into());
                }
            }
        }
        o.insert(
            "rope_scaling".into(),
            match self.llama3 {
                Some((factor, low, high, old)) => json!({
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": old,
                }),
                None => Value::Null,
            },
        );
        c
    }

    /// HF tensor names and shapes, written out here (not taken from the library).
    pub fn tensors(&self) -> Vec<(String, Vec<i64>)> {
        let (h, d, i) = (self.hidden, self.head_dim(), self.inter);
        let (q, kv) = (self.heads * d, self.kv_heads * d);
        let (qkv_bias, o_bias) = self.biases();
        let mut t = vec![("model.embed_tokens.weight".to_string(), vec![self.vocab, h])];
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            t.push((format!("{p}.input_layernorm.weight"), vec![h]));
            t.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            for (name, rows, cols, bias) in [
                ("q_proj", q, h, qkv_bias),
                ("k_proj", kv, h, qkv_bias),
                ("v_proj", kv, h, qkv_bias),
                ("o_proj", h, q, o_bias),
            ] {
                t.push((format!("{p}.self_attn.{name}.weight"), vec![rows, cols]));
                if bias {
                    t.push((format!("{p}.self_attn.{name}.bias"), vec![rows]));
                }
            }
            if self.qk_norm() {
                t.push((format!("{p}.self_attn.q_norm.weight"), vec![d]));
                t.push((format!("{p}.self_attn.k_norm.weight"), vec![d]));
            }
            for (name, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
            {
                t.push((format!("{p}.mlp.{name}.weight"), vec![rows, cols]));
                if self.mlp_bias() {
                    t.push((format!("{p}.mlp.{name}.bias"), vec![rows]));
                }
            }
        }
        t.push(("model.norm.weight".into(), vec![h]));
        if !self.tied {
            t.push(("lm_head.weight".into(), vec![self.vocab, h]));
        }
        t
    }
}

/// Random fp32 data for each tensor: norms around 1, everything else around 0.
pub fn random_weights(spec: &Spec, seed: u64) -> BTreeMap<String, (Vec<i64>, Vec<f32>)> {
    use rand::Rng;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    spec.tensors()
        .into_iter()
        .map(|(name, shape)| {
            let n = shape.iter().product::<i64>() as usize;
            let (center, spread) = if name.contains("norm") {
                (1.0, 0.3)
            } else if name.contains("embed") || name.contains("lm_head") {
                (0.0, 1.0)
            } else {
                (0.0, 0.25)
            };
            let data = (0..n)
                .map(|_| center + spread * (rng.gen::<f32>() * 2.0 - 1.0))
                .collect();
            (name, (shape, data))
        })
        .collect()
}

/// Writes `weights` as two safetensors shards plus `model.safetensors.index.json`, with the
/// `safetensors` crate directly, and `config` as `config.json`.
pub fn write_checkpoint(
    dir: &Path,
    config: &Value,
    weights: &BTreeMap<String, (Vec<i64>, Vec<f32>)>,
) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    let names: Vec<&String> = weights.keys().collect();
    let half = names.len() / 2;
    let mut weight_map = BTreeMap::new();
    let mut total = 0usize;
    for (i, part) in [&names[..half], &names[half..]].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = part
            .iter()
            .map(|&name| {
                let (shape, data) = &weights[name];
                let b: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name.clone(), shape.iter().map(|&d| d as usize).collect(), b)
            })
            .collect();
        let views: Vec<(String, TensorView)> = bytes
            .iter()
            .map(|(n, s, b)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
                )
            })
            .collect();
        let mut meta = HashMap::new();
        meta.insert("format".to_string(), "pt".to_string());
        safetensors::serialize_to_file(views, &Some(meta), &dir.join(&file)).unwrap();
        for (n, _, b) in &bytes {
            total += b.len();
            weight_map.insert(n.clone(), file.clone());
        }
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_string_pretty(&index).unwrap(),
    )
    .unwrap();
}

/// Every tensor of the checkpoint's shards, read back with the `safetensors` crate.
pub fn read_back(dir: &Path) -> HashMap<String, Tensor> {
    let mut out = HashMap::new();
    for i in 1..=2 {
        let bytes = std::fs::read(dir.join(format!("model-0000{i}-of-00002.safetensors"))).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            assert_eq!(view.dtype(), Dtype::F32);
            let vals: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            out.insert(name, Tensor::from_slice(&vals).view(shape.as_slice()));
        }
    }
    out
}
