//! The target's configuration, the config side of [`super::target`]: which Hugging Face
//! layout of the Llama lineage a checkpoint is, selected by `model_type` (or
//! `architectures`) in its `config.json`:
//!
//! - `llama` (`LlamaForCausalLM`: Llama 2, Llama 3.x): optional biases on the attention
//!   projections (`attention_bias`) and on the MLP (`mlp_bias`), no q/k norms, RoPE with the
//!   `llama3` `rope_scaling` frequency remap where the config has one;
//! - `qwen2` (`Qwen2ForCausalLM`: Qwen2, Qwen2.5): biases on q/k/v (not on o), no q/k norms;
//! - `qwen3` (`Qwen3ForCausalLM`): per-head RMSNorm of q and k before RoPE, biases only with
//!   `attention_bias`.
//!
//! This module owns the families ([`Family`]), `config.json` as written
//! ([`TargetConfigFile`]: reading, with `rope_scaling`, and writing back) and the resolved
//! configuration ([`TargetConfig`]) whose fields carry the family differences.
//! [`TargetConfig::expected_tensors`] lists the checkpoint tensors (names and shapes) a config
//! implies, so a checkpoint can be checked from its headers before anything is loaded; the
//! named presets are the shapes of random-weight targets. The model itself is in
//! [`super::target`].
use serde::{Deserialize, Serialize};

use super::error::ModelError;
use super::layers::RopeScaling;

/// The model families a target may be, by Hugging Face `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Llama,
    Qwen2,
    Qwen3,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Llama, Family::Qwen2, Family::Qwen3];

    /// The `model_type` of its `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
        }
    }

    /// The causal-LM class named in its `architectures`.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    pub fn from_model_type(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_type() == s)
    }

    pub fn from_architecture(s: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.architecture() == s)
    }

    /// `(qk_norm, qkv_bias, o_bias, mlp_bias)` of the family, given the config's
    /// `attention_bias` and `mlp_bias` (each family reads only the ones its HF class reads).
    fn layout(
        self,
        attention_bias: Option<bool>,
        mlp_bias: Option<bool>,
    ) -> (bool, bool, bool, bool) {
        let attn = attention_bias.unwrap_or(false);
        match self {
            Family::Llama => (false, attn, attn, mlp_bias.unwrap_or(false)),
            Family::Qwen2 => (false, true, false, false),
            Family::Qwen3 => (true, attn, attn, false),
        }
    }

    /// Defaults of `rope_theta` and `max_position_embeddings` where the config omits them.
    fn defaults(self) -> (f64, i64) {
        match self {
            Family::Llama => (10_000.0, 2048),
            Family::Qwen2 => (10_000.0, 32768),
            Family::Qwen3 => (1_000_000.0, 40960),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.model_type())
    }
}

/// `config.json` of a Hugging Face Llama, Qwen2 or Qwen3 checkpoint, as written (HF field
/// names, options). Fields the model does not use are ignored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TargetConfigFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architectures: Option<Vec<String>>,
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
    /// `null`, `{"rope_type": "default"}` or `{"rope_type": "llama3", ...}` (`type` is
    /// accepted for `rope_type`, as Hugging Face does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    /// The MLP activation: only `silu` (every family's default) is implemented.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    /// Qwen2/Qwen3's sliding-window attention: refused when `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
}

/// A resolved, validated target configuration: the shapes, and the family's layout as
/// flags (q/k norms, which projections have a bias, the RoPE scaling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetConfig {
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
    /// Which `model_type` the checkpoint is (what `config.json` is written as).
    #[serde(default = "default_family")]
    pub family: Family,
    /// Per-head RMSNorm of q and k before RoPE (`q_norm`, `k_norm`: Qwen3).
    #[serde(default = "yes")]
    pub qk_norm: bool,
    /// Biases on q_proj, k_proj and v_proj.
    #[serde(default)]
    pub qkv_bias: bool,
    /// A bias on o_proj.
    #[serde(default)]
    pub o_bias: bool,
    /// Biases on gate_proj, up_proj and down_proj.
    #[serde(default)]
    pub mlp_bias: bool,
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
}

fn default_family() -> Family {
    Family::Qwen3
}

fn yes() -> bool {
    true
}

/// Which family `config.json` names: `model_type` first (as Hugging Face's `AutoModel`
/// does), then `architectures`; an `architectures` that disagrees with `model_type` is
/// refused, since the tensors would not be the ones the model expects.
fn family_of(
    model_type: Option<&str>,
    architectures: Option<&[String]>,
) -> Result<Family, ModelError> {
    let supported = "supported: llama, qwen2, qwen3";
    let arch_family = || {
        architectures
            .unwrap_or(&[])
            .iter()
            .find_map(|a| Family::from_architecture(a))
    };
    let family = match model_type {
        Some(mt) => Family::from_model_type(mt).ok_or_else(|| {
            ModelError::Config(format!("model_type `{mt}` is not supported ({supported})"))
        })?,
        None => match (arch_family(), architectures) {
            (Some(f), _) => f,
            (None, Some(a)) if !a.is_empty() => {
                return Err(ModelError::Config(format!(
                    "architectures {a:?} names no supported model and there is no model_type ({supported})"
                )))
            }
            _ => {
                return Err(ModelError::Config(format!(
                    "missing field `model_type` ({supported})"
                )))
            }
        },
    };
    if let Some(a) = architectures {
        if !a.is_empty() && !a.iter().any(|x| x == family.architecture()) {
            return Err(ModelError::Config(format!(
                "model_type `{family}` expects architectures [\"{}\"], the config has {a:?}",
                family.architecture()
            )));
        }
    }
    Ok(family)
}

/// Parses Hugging Face's `rope_scaling`: `null` and the `default` type are plain RoPE.
fn rope_scaling_of(v: Option<&serde_json::Value>) -> Result<Option<RopeScaling>, ModelError> {
    let bad = |m: String| ModelError::Config(format!("rope_scaling: {m}"));
    let obj = match v {
        None | Some(serde_json::Value::Null) => return Ok(None),
        Some(serde_json::Value::Object(o)) => o,
        Some(other) => return Err(bad(format!("expected an object or null, got {other}"))),
    };
    let ty = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(|t| t.as_str());
    match ty {
        Some("default") => Ok(None),
        Some("llama3") => {
            let num = |key: &str| match obj.get(key).and_then(|x| x.as_f64()) {
                Some(x) if x > 0.0 && x.is_finite() => Ok(x),
                Some(x) => Err(bad(format!("`{key}` must be positive, got {x}"))),
                None => Err(bad(format!("rope_type llama3 needs a number `{key}`"))),
            };
            let factor = num("factor")?;
            let low_freq_factor = num("low_freq_factor")?;
            let high_freq_factor = num("high_freq_factor")?;
            let original = num("original_max_position_embeddings")?;
            if high_freq_factor <= low_freq_factor {
                return Err(bad(format!(
                    "high_freq_factor ({high_freq_factor}) must be larger than low_freq_factor ({low_freq_factor})"
                )));
            }
            if original.fract() != 0.0 {
                return Err(bad(format!(
                    "original_max_position_embeddings must be an integer, got {original}"
                )));
            }
            Ok(Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: original as i64,
            }))
        }
        Some(other) => Err(bad(format!(
            "rope_type `{other}` is not supported (only default and llama3)"
        ))),
        None => Err(bad("names no `rope_type`".into())),
    }
}

impl TargetConfigFile {
    pub fn into_config(self) -> Result<TargetConfig, ModelError> {
        fn need(v: Option<i64>, key: &str) -> Result<i64, ModelError> {
            match v {
                Some(v) if v > 0 => Ok(v),
                Some(v) => Err(ModelError::Config(format!(
                    "`{key}` must be positive, got {v}"
                ))),
                None => Err(ModelError::Config(format!("missing field `{key}`"))),
            }
        }
        // 1. the family: which tensors exist, the defaults of omitted fields
        let family = family_of(self.model_type.as_deref(), self.architectures.as_deref())?;
        if self.use_sliding_window == Some(true) {
            return Err(ModelError::Config(format!(
                "use_sliding_window = true is not supported for a {family} target"
            )));
        }
        if let Some(act) = self.hidden_act.as_deref().filter(|&a| a != "silu") {
            return Err(ModelError::Config(format!(
                "hidden_act `{act}` is not supported (only silu)"
            )));
        }
        let (qk_norm, qkv_bias, o_bias, mlp_bias) =
            family.layout(self.attention_bias, self.mlp_bias);
        let (default_theta, default_max_pos) = family.defaults();
        let rope_scaling = rope_scaling_of(self.rope_scaling.as_ref())?;
        // 2. the shapes
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
        Ok(TargetConfig {
            vocab_size: need(self.vocab_size, "vocab_size")?,
            hidden_size,
            intermediate_size: need(self.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(self.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: self.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: self.rope_theta.unwrap_or(default_theta),
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: self.max_position_embeddings.unwrap_or(default_max_pos),
            family,
            qk_norm,
            qkv_bias,
            o_bias,
            mlp_bias,
            rope_scaling,
        })
    }
}

impl TargetConfig {
    /// The `config.json` this configuration round-trips through (the fields Hugging Face
    /// writes for its family). A configuration whose flags are not its family's layout has
    /// no such file: `into_config` of the result differs from `self` (see
    /// [`crate::model::save_target`], which refuses it).
    pub fn to_file(&self, dtype: &str) -> TargetConfigFile {
        let (attention_bias, mlp_bias) = match self.family {
            Family::Llama => (Some(self.qkv_bias), Some(self.mlp_bias)),
            Family::Qwen2 => (None, None),
            Family::Qwen3 => (Some(self.qkv_bias), None),
        };
        TargetConfigFile {
            architectures: Some(vec![self.family.architecture().into()]),
            model_type: Some(self.family.model_type().into()),
            vocab_size: Some(self.vocab_size),
            hidden_size: Some(self.hidden_size),
            intermediate_size: Some(self.intermediate_size),
            num_hidden_layers: Some(self.num_hidden_layers),
            num_attention_heads: Some(self.num_attention_heads),
            num_key_value_heads: Some(self.num_key_value_heads),
            head_dim: Some(self.head_dim),
            rms_norm_eps: Some(self.rms_norm_eps),
            rope_theta: Some(self.rope_theta),
            rope_scaling: self
                .rope_scaling
                .map(|r| serde_json::to_value(r).expect("rope_scaling serializes")),
            attention_bias,
            mlp_bias,
            hidden_act: None,
            use_sliding_window: None,
            tie_word_embeddings: Some(self.tie_word_embeddings),
            max_position_embeddings: Some(self.max_position_embeddings),
            torch_dtype: Some(dtype.into()),
        }
    }

    /// Every tensor a checkpoint of this configuration holds, with its shape, in model
    /// order (Hugging Face names; linear weights `[out, in]`). A tied model has no
    /// `lm_head.weight`.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<i64>)> {
        let (h, d, i) = (self.hidden_size, self.head_dim, self.intermediate_size);
        let (q, kv) = (self.num_attention_heads * d, self.num_key_value_heads * d);
        let mut out = vec![(
            "model.embed_tokens.weight".to_string(),
            vec![self.vocab_size, h],
        )];
        for l in 0..self.num_hidden_layers {
            let mut add = |name: &str, shape: Vec<i64>| {
                out.push((format!("model.layers.{l}.{name}"), shape));
            };
            add("input_layernorm.weight", vec![h]);
            for (proj, rows, cols, bias) in [
                ("q_proj", q, h, self.qkv_bias),
                ("k_proj", kv, h, self.qkv_bias),
                ("v_proj", kv, h, self.qkv_bias),
                ("o_proj", h, q, self.o_bias),
            ] {
                add(&format!("self_attn.{proj}.weight"), vec![rows, cols]);
                if bias {
                    add(&format!("self_attn.{proj}.bias"), vec![rows]);
                }
            }
            if self.qk_norm {
                add("self_attn.q_norm.weight", vec![d]);
                add("self_attn.k_norm.weight", vec![d]);
            }
            add("post_attention_layernorm.weight", vec![h]);
            for (proj, rows, cols) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)]
            {
                add(&format!("mlp.{proj}.weight"), vec![rows, cols]);
                if self.mlp_bias {
                    add(&format!("mlp.{proj}.bias"), vec![rows]);
                }
            }
        }
        out.push(("model.norm.weight".into(), vec![h]));
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".into(), vec![self.vocab_size, h]));
        }
        out
    }

    /// Whether a checkpoint tensor this configuration does not use may be present anyway
    /// (and is ignored, as Hugging Face ignores it): the `rotary_emb.inv_freq` buffers some
    /// older checkpoints carry, and `lm_head.weight` of a tied model.
    pub fn ignorable_tensor(&self, name: &str) -> bool {
        name.ends_with(".rotary_emb.inv_freq")
            || (self.tie_word_embeddings && name == "lm_head.weight")
    }
}

impl TargetConfig {
    /// Named shapes for random-weight (Qwen3-layout) targets. `realistic`: 28 layers, hidden 1024,
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
                ..Self::QWEN3_LAYOUT
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
                ..Self::QWEN3_LAYOUT
            }),
            _ => None,
        }
    }

    /// A Qwen3 layout with zero shapes, for `..TargetConfig::QWEN3_LAYOUT` in literals.
    pub const QWEN3_LAYOUT: TargetConfig = TargetConfig {
        vocab_size: 0,
        hidden_size: 0,
        intermediate_size: 0,
        num_hidden_layers: 0,
        num_attention_heads: 0,
        num_key_value_heads: 0,
        head_dim: 0,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        tie_word_embeddings: false,
        max_position_embeddings: 40960,
        family: Family::Qwen3,
        qk_norm: true,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
        rope_scaling: None,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn err(json: serde_json::Value) -> String {
        file(json).into_config().unwrap_err().to_string()
    }

    #[test]
    fn each_family_has_its_layout() {
        let llama = file(base("llama")).into_config().unwrap();
        assert_eq!(llama.family, Family::Llama);
        assert!(!llama.qk_norm && !llama.qkv_bias && !llama.o_bias && !llama.mlp_bias);
        assert_eq!(llama.head_dim, 4, "hidden_size / num_attention_heads");
        assert_eq!(llama.rope_theta, 10_000.0);
        let mut j = base("llama");
        j["attention_bias"] = true.into();
        j["mlp_bias"] = true.into();
        let biased = file(j).into_config().unwrap();
        assert!(biased.qkv_bias && biased.o_bias && biased.mlp_bias && !biased.qk_norm);

        let qwen2 = file(base("qwen2")).into_config().unwrap();
        assert!(!qwen2.qk_norm && qwen2.qkv_bias && !qwen2.o_bias && !qwen2.mlp_bias);
        let qwen3 = file(base("qwen3")).into_config().unwrap();
        assert!(qwen3.qk_norm && !qwen3.qkv_bias && !qwen3.o_bias && !qwen3.mlp_bias);

        // architectures alone selects too
        let mut j = base("qwen2");
        j.as_object_mut().unwrap().remove("model_type");
        j["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
        assert_eq!(file(j).into_config().unwrap().family, Family::Qwen2);
    }

    #[test]
    fn unsupported_or_inconsistent_configs_are_one_line_errors() {
        let e = err(base("mistral"));
        assert!(e.contains("model_type `mistral` is not supported"), "{e}");
        assert_eq!(e.lines().count(), 1);
        let mut j = base("llama");
        j["architectures"] = serde_json::json!(["Qwen3ForCausalLM"]);
        let e = err(j);
        assert!(
            e.contains("LlamaForCausalLM") && e.contains("Qwen3ForCausalLM"),
            "{e}"
        );
        let mut j = base("llama");
        j.as_object_mut().unwrap().remove("model_type");
        assert!(err(j).contains("missing field `model_type`"));
        let mut j = base("qwen2");
        j["hidden_act"] = "gelu".into();
        assert!(err(j).contains("hidden_act `gelu`"));
        let mut j = base("qwen2");
        j["use_sliding_window"] = true.into();
        assert!(err(j).contains("use_sliding_window"));
        let mut j = base("llama");
        j["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        assert!(err(j).contains("rope_type `yarn` is not supported"));
        let mut j = base("llama");
        j["rope_scaling"] = serde_json::json!({"type": "llama3", "factor": 8.0});
        assert!(err(j).contains("low_freq_factor"));
    }

    #[test]
    fn rope_scaling_reads_both_spellings_and_round_trips() {
        let mut j = base("llama");
        j["rope_scaling"] = serde_json::json!({
            "type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192
        });
        let c = file(j).into_config().unwrap();
        assert_eq!(
            c.rope_scaling,
            Some(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            })
        );
        let written = serde_json::to_value(c.to_file("bfloat16")).unwrap();
        assert_eq!(written["rope_scaling"]["rope_type"], "llama3");
        assert_eq!(written["architectures"][0], "LlamaForCausalLM");
        let mut j = base("llama");
        j["rope_scaling"] = serde_json::json!({"rope_type": "default"});
        assert_eq!(file(j).into_config().unwrap().rope_scaling, None);
    }
}
