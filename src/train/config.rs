//! The training configuration: one struct, [`TrainConfig`], and one override order. A
//! base (the defaults, or on `--resume` the run's own `config.toml`) is overridden by
//! [`Layer`]s in order: the `--config` file, then `--set key=value`, then the dedicated
//! flags. A layer holds only the keys the user gave, so a resume keeps every setting of
//! the run except those this command sets explicitly, whatever their value. The result
//! is written to the run directory as the effective configuration.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The default time between checkpoints: a killed run loses at most this much.
pub const DEFAULT_CHECKPOINT_MINUTES: f64 = 10.0;

/// Every setting of a training run. Defaults are the embedded default run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Target checkpoint directory (Hugging Face layout). Empty: the embedded tiny target.
    pub target: Option<PathBuf>,
    /// Random-weight target of a named shape instead of a checkpoint ("realistic": the
    /// 28-layer, hidden-1024 shape used for GPU benchmarks).
    pub target_preset: Option<String>,
    /// Training data: plain text, JSONL (`input_ids` + optional `loss_mask`, `text`,
    /// `messages` or `conversations` per line), or a token file from `dflash
    /// prepare-data`. Empty: the embedded corpus.
    pub data: Option<PathBuf>,
    /// Tokenizer of text data: a `tokenizer.json`, or a directory holding one (and
    /// `tokenizer_config.json` with the chat template). Empty: the target directory's
    /// `tokenizer.json` if it has one (the embedded default's does), else the byte-level
    /// tokenizer (that of `fixtures/tiny-target`).
    pub tokenizer: Option<PathBuf>,
    /// Synthetic random-token data of this sequence length instead of a file (benchmarks).
    pub synthetic_seq_len: Option<usize>,
    /// Longest sequence, in tokens; text is cut into sequences of this length.
    pub seq_len: usize,
    /// Token budget of one batch (batch size x padded length).
    pub batch_tokens: usize,
    /// Fraction of sequences held out for evaluation at the end.
    pub heldout_fraction: f64,
    /// Optimizer steps to run.
    pub steps: i64,
    pub lr: f64,
    pub warmup_ratio: f64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    pub seed: u64,
    pub block_size: i64,
    pub num_anchors: i64,
    /// Loss decay gamma; 0 picks the reference value for the block size.
    pub gamma: f64,
    /// Blocks per lm_head chunk in the loss.
    pub chunk_blocks: i64,
    /// Blocks per attention query group: each group attends only to the context its
    /// anchors reach and to its own blocks, instead of the dense `Q x (S + Q)` mask (0:
    /// off, the default). Off by default: on the GPU each new key width makes cuDNN build a
    /// new attention plan and its many small calls cost host time (docs/gpu-results.md).
    /// When set, it replaces `attn_batch_blocks`.
    pub attn_group_blocks: i64,
    /// Blocks per batched attention group: the queries of each group of N blocks attend to
    /// all context keys and their own block keys, and the groups run as one attention call
    /// (`objective::batched_block_mask`; 42% of the dense mask's work with groups of 32
    /// blocks on the realistic shape). When N does not divide `num_anchors`, the groups
    /// take its largest divisor below N. 32 by default; 0: the dense mask.
    pub attn_batch_blocks: i64,
    /// The loss's input gradient computed in its forward chunks, in the logits' kind, no
    /// logits kept for the backward (the default: the realistic step on the GPU takes 27.1
    /// instead of 37.5 ms, docs/gpu-results.md); false: autograd's fp32 log-softmax path.
    pub fused_loss: bool,
    /// On CUDA, our fused bf16 kernels (`src/cuda/kernels.cu`, compiled at start-up) run
    /// in the frozen target's forward instead of ATen's chains of elementwise kernels
    /// (the default): its per-head norms with rotary embedding, residual sums with the next
    /// norm, and SwiGLU. false: ATen's kernels everywhere. No effect on the CPU.
    pub fused_kernels: bool,
    /// With `fused_kernels`, also the drafter's (the default): its per-head norms with
    /// rotary embedding and its SwiGLU, forward and a fused backward, and the fused loss's
    /// softmax pass
    /// over each chunk of logits (checked against ATen by `tests/cuda_kernels.rs` on a GPU;
    /// the realistic step on one H100 takes 22.4-22.7 instead of 26.2 ms with them,
    /// docs/gpu-results.md).
    pub fused_drafter_kernels: bool,
    pub drafter_layers: i64,
    /// Target layers tapped; empty: the DFlash formula.
    pub target_layer_ids: Vec<usize>,
    /// Number of leading drafter layers that use sliding-window attention.
    pub sliding_layers: i64,
    pub sliding_window: i64,
    /// Mask token id; negative: the tokenizer's mask id, or the last vocabulary id.
    pub mask_token_id: i64,
    /// Devices of the target workers, one worker each ("cpu", "cuda:0", ...).
    pub target_devices: Vec<String>,
    pub drafter_device: String,
    /// Capacity of the hidden-state queue, in batches.
    pub queue_capacity: usize,
    /// Save a checkpoint every N steps (0: no step interval).
    pub checkpoint_every: i64,
    /// Save a checkpoint when this many minutes have passed since the last one, so a
    /// killed run loses at most that much (0: no time interval).
    pub checkpoint_minutes: f64,
    /// Keep the newest K checkpoints (0: all).
    pub keep_checkpoints: i64,
    /// Print a progress line every N steps.
    pub log_every: i64,
    /// Traced steps, `a..b` (half-open); empty: a short window after warm-up.
    pub trace_steps: Option<String>,
    pub trace_gzip: bool,
    /// With a trace on CUDA: also record every kernel, copy and set, and the CUDA calls
    /// that launch, wait or allocate, during the traced window (CUPTI).
    pub trace_kernels: bool,
    /// Print the live per-section summary every N steps while tracing (0: never).
    pub summary_every: i64,
    /// Validation: also time each section by synchronizing around it (slow).
    pub sync_sections: bool,
    /// Write checkpoints and the final drafter (off for throwaway benchmark runs).
    pub save_checkpoints: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            target: None,
            target_preset: None,
            data: None,
            tokenizer: None,
            synthetic_seq_len: None,
            seq_len: 256,
            batch_tokens: 2048,
            heldout_fraction: 0.05,
            steps: 150,
            lr: 3e-3,
            warmup_ratio: 0.04,
            weight_decay: 0.0,
            grad_clip: 1.0,
            seed: 0,
            block_size: 8,
            num_anchors: 32,
            gamma: 0.0,
            chunk_blocks: 16,
            attn_group_blocks: 0,
            attn_batch_blocks: 32,
            fused_loss: true,
            fused_kernels: true,
            fused_drafter_kernels: true,
            drafter_layers: 2,
            target_layer_ids: Vec::new(),
            sliding_layers: 0,
            sliding_window: 2048,
            mask_token_id: -1,
            target_devices: vec!["cpu".into()],
            drafter_device: "cpu".into(),
            queue_capacity: 4,
            checkpoint_every: 0,
            checkpoint_minutes: DEFAULT_CHECKPOINT_MINUTES,
            keep_checkpoints: 2,
            log_every: 10,
            trace_steps: None,
            trace_gzip: false,
            trace_kernels: false,
            summary_every: 20,
            sync_sections: false,
            save_checkpoints: true,
        }
    }
}

/// A configuration problem the user can fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("bad --set {assignment:?}: {message} (use --set key=value with a TOML value, e.g. --set lr=1e-3)")]
    Set { assignment: String, message: String },
    #[error("bad config: {0}")]
    Invalid(String),
    #[error("bad config: {field} = {value} is outside its allowed range {allowed}")]
    Range {
        field: String,
        value: String,
        allowed: String,
    },
}

impl TrainConfig {
    /// The batched attention's group size in effect: `attn_batch_blocks`, or 0 (off) when
    /// `attn_group_blocks` chooses the query groups instead.
    pub fn effective_batch_blocks(&self) -> i64 {
        match self.attn_group_blocks {
            0 => self.attn_batch_blocks,
            _ => 0,
        }
    }

    /// Reads a TOML file (unknown keys are errors, so a typo does not go unnoticed).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: e.to_string().trim().replace('\n', " "),
        })
    }

    /// Applies `key=value` overrides, each value parsed as TOML (a bare word is a string).
    pub fn with_overrides(self, sets: &[String]) -> Result<Self, ConfigError> {
        self.layered(&[Layer::from_sets(sets)?])
    }

    /// This configuration with `layers` applied in order (a later layer wins).
    pub fn layered(self, layers: &[Layer]) -> Result<Self, ConfigError> {
        let mut table = toml::Table::try_from(&self).expect("config serializes to a table");
        for layer in layers {
            for (k, v) in &layer.0 {
                table.insert(k.clone(), v.clone());
            }
        }
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| {
                ConfigError::Invalid(e.to_string().trim().replace('\n', " "))
            })
    }

    fn field_names() -> Vec<&'static str> {
        vec![
            "target",
            "target_preset",
            "data",
            "tokenizer",
            "synthetic_seq_len",
            "seq_len",
            "batch_tokens",
            "heldout_fraction",
            "steps",
            "lr",
            "warmup_ratio",
            "weight_decay",
            "grad_clip",
            "seed",
            "block_size",
            "num_anchors",
            "gamma",
            "chunk_blocks",
            "attn_group_blocks",
            "attn_batch_blocks",
            "fused_loss",
            "fused_kernels",
            "fused_drafter_kernels",
            "drafter_layers",
            "target_layer_ids",
            "sliding_layers",
            "sliding_window",
            "mask_token_id",
            "target_devices",
            "drafter_device",
            "queue_capacity",
            "checkpoint_every",
            "checkpoint_minutes",
            "keep_checkpoints",
            "log_every",
            "trace_steps",
            "trace_gzip",
            "trace_kernels",
            "summary_every",
            "sync_sections",
            "save_checkpoints",
        ]
    }

    /// The traced step window `[a, b)`.
    pub fn trace_window(&self) -> Result<(i64, i64), ConfigError> {
        match &self.trace_steps {
            None => {
                // a short window after warm-up, so long runs do not write gigabytes
                let warm = (self.steps / 10).clamp(1, 5).min(self.steps - 1).max(0);
                Ok((warm, (warm + 50).min(self.steps)))
            }
            Some(s) => {
                let parse = |v: &str| v.trim().parse::<i64>().ok();
                match s.split_once("..").map(|(a, b)| (parse(a), parse(b))) {
                    Some((Some(a), Some(b))) if 0 <= a && a < b => Ok((a, b)),
                    _ => Err(ConfigError::Invalid(format!(
                        "trace_steps {s:?} is not a window `a..b` with 0 <= a < b, e.g. 100..200"
                    ))),
                }
            }
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("config serializes")
    }
}

/// The settings one source gives explicitly (a file, the `--set`s, the flags), as TOML
/// values by field name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layer(toml::Table);

impl Layer {
    /// The keys of a TOML file, checked as [`TrainConfig::from_file`] checks them.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        TrainConfig::from_file(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let table = toml::from_str(&text).map_err(|e: toml::de::Error| ConfigError::Parse {
            path: path.into(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        Ok(Self(table))
    }

    /// `key=value` assignments, each value parsed as TOML (a bare word is a string);
    /// `-` in a key reads as `_`.
    pub fn from_sets(sets: &[String]) -> Result<Self, ConfigError> {
        let mut layer = Self::default();
        for s in sets {
            let err = |message: String| ConfigError::Set {
                assignment: s.clone(),
                message,
            };
            let (key, raw) = s.split_once('=').ok_or_else(|| err("missing `=`".into()))?;
            let key = key.trim().replace('-', "_");
            let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
                .map(|mut t| t.remove("v").expect("parsed key"))
                .unwrap_or_else(|_| toml::Value::String(raw.to_string()));
            if !TrainConfig::field_names().contains(&key.as_str()) {
                return Err(err(format!("unknown field `{key}`")));
            }
            layer.0.insert(key, value);
        }
        Ok(layer)
    }

    /// Sets one field (a dedicated flag).
    pub fn set(&mut self, key: &str, value: impl Into<toml::Value>) {
        debug_assert!(TrainConfig::field_names().contains(&key), "{key}");
        self.0.insert(key.into(), value.into());
    }

    /// The field names this layer sets.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_toml_values_and_reject_unknown_fields() {
        let cfg = TrainConfig::default()
            .with_overrides(&[
                "lr=1e-3".into(),
                "target-devices=[\"cpu\", \"cpu\"]".into(),
                "drafter_device=cpu".into(),
            ])
            .unwrap();
        assert_eq!(cfg.lr, 1e-3);
        assert_eq!(cfg.target_devices, vec!["cpu", "cpu"]);
        let e = TrainConfig::default()
            .with_overrides(&["lrr=1".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `lrr`"), "{e}");
        let e = TrainConfig::default()
            .with_overrides(&["steps=abc".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("steps"), "{e}");
    }

    #[test]
    fn layers_apply_in_order_and_a_resume_keeps_what_no_layer_sets() {
        let saved = TrainConfig {
            lr: 1e-3,
            steps: 40,
            seed: 7,
            ..Default::default()
        };
        let sets = Layer::from_sets(&["lr=3e-3".into(), "steps=50".into()]).unwrap();
        let mut flags = Layer::default();
        flags.set("steps", 60);
        let cfg = saved.clone().layered(&[sets, flags]).unwrap();
        // lr set explicitly to the default value still wins over the saved one
        assert_eq!((cfg.lr, cfg.steps, cfg.seed), (3e-3, 60, 7));
        assert_eq!(cfg.block_size, saved.block_size);
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("run.toml");
        std::fs::write(&file, "seed = 9\nlr = 2e-3\n").unwrap();
        let layer = Layer::from_file(&file).unwrap();
        assert_eq!(layer.keys().collect::<Vec<_>>(), ["lr", "seed"]);
        let cfg = saved
            .layered(&[layer, Layer::from_sets(&["lr=5e-3".into()]).unwrap()])
            .unwrap();
        assert_eq!((cfg.seed, cfg.lr, cfg.steps), (9, 5e-3, 40));
        std::fs::write(&file, "lrr = 1\n").unwrap();
        assert!(Layer::from_file(&file)
            .unwrap_err()
            .to_string()
            .contains("lrr"));
    }

    #[test]
    fn every_field_is_overridable() {
        let table = toml::Table::try_from(TrainConfig {
            target: Some("x".into()),
            target_preset: Some("p".into()),
            data: Some("d".into()),
            tokenizer: Some("t".into()),
            synthetic_seq_len: Some(1),
            trace_steps: Some("1..2".into()),
            ..Default::default()
        })
        .unwrap();
        let mut keys: Vec<&str> = table.keys().map(|k| k.as_str()).collect();
        let mut names = TrainConfig::field_names();
        keys.sort();
        names.sort();
        assert_eq!(keys, names);
    }

    #[test]
    fn trace_window_parses_and_defaults_after_warmup() {
        let c = TrainConfig {
            trace_steps: Some("100..200".into()),
            ..Default::default()
        };
        assert_eq!(c.trace_window().unwrap(), (100, 200));
        let c = TrainConfig {
            steps: 1000,
            ..Default::default()
        };
        assert_eq!(c.trace_window().unwrap(), (5, 55));
        let c = TrainConfig {
            trace_steps: Some("5..2".into()),
            ..Default::default()
        };
        assert!(c.trace_window().is_err());
    }
}
