//! A memory estimate made before training: what the largest batch needs at least on each
//! device (weights, optimizer state, the dense block mask, saved activations, one loss
//! chunk's logits, the queued hidden states), against what the device has (on the CPU:
//! the host's available memory). A configuration that cannot fit is refused with one
//! line instead of panicking inside libtorch or being killed by the host.
//!
//! The figures are lower bounds of the real peak (temporaries of libtorch's kernels are
//! left out), so a refusal is certain; passing the check does not promise a fit.
use tch::Device;

use crate::model::{DrafterConfig, LayerType};

/// What the estimate needs to know besides the model shapes.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Sequences per batch and padded length of the largest batch.
    pub batch: i64,
    pub seq: i64,
    pub num_anchors: i64,
    pub chunk_blocks: i64,
    pub attn_group_blocks: i64,
    /// In effect (`TrainConfig::effective_batch_blocks`): 0 when `attn_group_blocks` is set.
    pub attn_batch_blocks: i64,
    pub queue_capacity: i64,
}

/// Bytes per element of a compute kind: bf16 on CUDA, fp32 on the CPU.
pub fn elt(device: Device) -> i64 {
    if device.is_cuda() {
        2
    } else {
        4
    }
}

/// The parts of a drafter step, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DrafterParts {
    /// Parameters, gradients, fp32 master weights, AdamW moments, flat gradient.
    pub weights: u64,
    /// The target's embedding and lm_head copied to the drafter's device.
    pub head: u64,
    /// Block masks: the dense `[B, 1, Q, S + Q]` boolean mask and a temporary while it is
    /// built, and the float masks of the query groups (`[B, 1, Q, at most S + group]` in
    /// all); twice with sliding layers.
    pub mask: u64,
    /// Activations saved for the backward pass, and the step's input features.
    pub activations: u64,
    /// One lm_head chunk's logits, their log-softmax and gradient (fp32).
    pub logits: u64,
}

impl DrafterParts {
    pub fn total(&self) -> u64 {
        self.weights + self.head + self.mask + self.activations + self.logits
    }
}

fn layer_params(c: &DrafterConfig) -> i64 {
    let (h, q, kv) = (
        c.hidden_size,
        c.num_attention_heads * c.head_dim,
        c.num_key_value_heads * c.head_dim,
    );
    h * q * 2 + h * kv * 2 + 3 * h * c.intermediate_size + 2 * h + 2 * c.head_dim
}

fn as_bytes(v: i128) -> u64 {
    v.clamp(0, u64::MAX as i128) as u64
}

/// The drafter's share of one step on a device with `elt` bytes per element.
pub fn drafter_step(c: &DrafterConfig, l: &Load, elt: i64) -> DrafterParts {
    let i = |v: i64| v as i128;
    let (b, s, h, taps) = (
        i(l.batch),
        i(l.seq),
        i(c.hidden_size),
        i(c.target_layer_ids.len() as i64),
    );
    let q = i(l.num_anchors) * i(c.block_size);
    let k = s + q;
    let e = i(elt);
    let params = i(c.num_hidden_layers) * i(layer_params(c)) + taps * h * h + 2 * h;
    let masks = if c.layer_types.contains(&LayerType::Sliding) {
        2
    } else {
        1
    };
    let per_token = 6 * h + 3 * i(c.intermediate_size);
    let chunk = i(l.chunk_blocks.min(l.num_anchors));
    // keys per query row of a mask: all S + Q (dense), or S + the group's own block keys
    let group = match (l.attn_group_blocks, l.attn_batch_blocks) {
        (0, 0) => q,
        (0, g) => i(crate::model::objective::batch_blocks(l.num_anchors, g)) * i(c.block_size),
        (g, _) => i(g.clamp(1, l.num_anchors.max(1))) * i(c.block_size),
    };
    // batched groups keep each group's copy of all context keys, for keys and values, with
    // the key/value heads and, where the kernel cannot take grouped heads (the CPU), repeated
    // to the query heads: per layer
    // 2 x B x G x (S + len) x (Hkv + Hq) x D
    let batched_keys = if l.attn_batch_blocks > 0 {
        let heads = i(c.num_key_value_heads + c.num_attention_heads);
        2 * b * (q / group) * (s + group) * heads * i(c.head_dim)
    } else {
        0
    };
    DrafterParts {
        weights: as_bytes(params * (2 * e + 16)),
        head: as_bytes(2 * i(c.vocab_size) * h * e),
        mask: as_bytes(masks * b * q * (2 * k + (s + group) * e)),
        activations: as_bytes(
            i(c.num_hidden_layers) * (b * (q * per_token + 2 * s * h) + batched_keys) * e
                + b * s * taps * h * e,
        ),
        logits: as_bytes(3 * b * chunk * i(c.block_size) * i(c.vocab_size) * 4),
    }
}

/// One target worker's need: its weights, a forward's activations and the queued
/// hidden states it may hold.
pub fn target_worker(c: &DrafterConfig, l: &Load, elt: i64) -> u64 {
    let i = |v: i64| v as i128;
    let (b, s, h) = (i(l.batch), i(l.seq), i(c.hidden_size));
    let params = i(c.num_target_layers) * i(layer_params(c)) + 2 * i(c.vocab_size) * h;
    let taps = i(c.target_layer_ids.len() as i64);
    let act = b * s * (4 * h + 3 * i(c.intermediate_size));
    let queued = (i(l.queue_capacity) + 1) * b * s * taps * h;
    as_bytes((params + act + queued) * i(elt))
}

/// Memory the device can give, in bytes: the host's available memory for the CPU, the
/// device's total memory for a GPU; `None` when it cannot be read.
pub fn available(device: Device) -> Option<u64> {
    match device {
        Device::Cuda(i) => crate::cuda::device_properties(i)
            .ok()
            .map(|p| p.total_global_mem),
        _ => {
            let text = std::fs::read_to_string("/proc/meminfo").ok()?;
            parse_meminfo_available(&text)
        }
    }
}

fn parse_meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", units[u])
}

/// A configuration that cannot fit a device: one line naming the need, the device and
/// what to lower.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MemoryError(String);

/// Checks that the largest batch fits every device.
pub fn check(
    c: &DrafterConfig,
    l: &Load,
    drafter_device: Device,
    target_devices: &[Device],
) -> Result<(), MemoryError> {
    let mut need: Vec<(Device, u64)> = Vec::new();
    let mut add = |d: Device, bytes: u64| match need.iter_mut().find(|(x, _)| *x == d) {
        Some(e) => e.1 = e.1.saturating_add(bytes),
        None => need.push((d, bytes)),
    };
    let parts = drafter_step(c, l, elt(drafter_device));
    add(drafter_device, parts.total());
    for &d in target_devices {
        add(d, target_worker(c, l, elt(d)));
    }
    for (device, bytes) in need {
        let Some(have) = available(device) else {
            continue;
        };
        if bytes > have {
            let name = match device {
                Device::Cuda(i) => format!("cuda:{i}, which has {} in all", human(have)),
                _ => format!("the CPU, where the host has {} available", human(have)),
            };
            let q = l.num_anchors * c.block_size;
            return Err(MemoryError(format!(
                "memory: the largest batch ({} x {} tokens) needs at least {} on {name} (block mask {} x {q} x {} alone: {}); lower num_anchors, block_size or batch_tokens",
                l.batch,
                l.seq,
                human(bytes),
                l.batch,
                l.seq + q,
                human(parts.mask),
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DrafterConfig {
        DrafterConfig {
            architectures: vec![],
            hidden_size: 8,
            intermediate_size: 16,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 1,
            head_dim: 4,
            rms_norm_eps: 1e-6,
            rope_theta: 1e4,
            vocab_size: 10,
            num_target_layers: 2,
            block_size: 4,
            target_layer_ids: vec![0],
            mask_token_id: 9,
            layer_types: vec![LayerType::Full],
            sliding_window: 16,
        }
    }

    #[test]
    fn parts_follow_the_shapes() {
        let l = Load {
            batch: 2,
            seq: 6,
            num_anchors: 3,
            chunk_blocks: 2,
            attn_group_blocks: 2,
            attn_batch_blocks: 0,
            queue_capacity: 1,
        };
        let p = drafter_step(&cfg(), &l, 4);
        // Q = 3 anchors x 4 = 12 queries, 6 + 12 = 18 keys: bool + temp over all keys, and
        // fp32 group masks over at most 6 context keys + a group of 2 blocks (8 keys)
        assert_eq!(p.mask, 2 * 12 * (18 * 2 + (6 + 8) * 4));
        // q, o: 8x8 each; k, v: 8x4 each; mlp 3x8x16; two norms of 8, two of head_dim 4
        let layer = 64 * 2 + 32 * 2 + 384 + 16 + 8;
        // one layer + fc (1 tap: 8x8) + the context norm and the final norm, 8 each
        assert_eq!(p.weights, ((layer + 64 + 8 + 8) * (8 + 16)) as u64);
        assert_eq!(p.head, 2 * 10 * 8 * 4);
        assert_eq!(p.logits, 3 * 2 * 2 * 4 * 10 * 4);
        // per token 6x8 + 3x16 = 96; queries 12, context keys 2x6x8
        assert_eq!(
            p.activations,
            (2 * (12 * 96 + 2 * 6 * 8) * 4 + 2 * 6 * 8 * 4) as u64
        );
        let mut sliding = cfg();
        sliding.layer_types = vec![LayerType::Sliding];
        assert_eq!(drafter_step(&sliding, &l, 4).mask, 2 * p.mask);
        // batched groups of 2 blocks (3 anchors: groups of 1, its largest divisor up to 2):
        // 3 groups of 4 queries over 6 + 4 keys; their masks, and per layer (one here) the
        // keys' and values' copies with 1 + 2 heads of 4
        let batched = Load {
            attn_group_blocks: 0,
            attn_batch_blocks: 2,
            ..l
        };
        let pb = drafter_step(&cfg(), &batched, 4);
        assert_eq!(pb.mask, 2 * 12 * (18 * 2 + (6 + 4) * 4));
        assert_eq!(
            pb.activations - p.activations,
            (2 * 2 * 3 * (6 + 4) * (1 + 2) * 4 * 4) as u64
        );
    }

    #[test]
    fn an_impossible_mask_is_refused_in_one_line() {
        let mut c = cfg();
        c.block_size = 100_000;
        let l = Load {
            batch: 8,
            seq: 256,
            num_anchors: 32,
            chunk_blocks: 16,
            attn_group_blocks: 32,
            attn_batch_blocks: 0,
            queue_capacity: 4,
        };
        let e = check(&c, &l, Device::Cpu, &[Device::Cpu])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("memory: the largest batch (8 x 256 tokens) needs at least"),
            "{e}"
        );
        assert!(e.contains("block mask 8 x 3200000 x 3200256"), "{e}");
        assert_eq!(e.lines().count(), 1);
        let small = Load {
            batch: 1,
            seq: 8,
            num_anchors: 2,
            chunk_blocks: 1,
            attn_group_blocks: 1,
            attn_batch_blocks: 0,
            queue_capacity: 1,
        };
        check(&cfg(), &small, Device::Cpu, &[Device::Cpu]).unwrap();
    }

    #[test]
    fn meminfo_and_sizes_read_right() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo_available(text), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo_available("MemTotal: 5 kB\n"), None);
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(5 << 40), "5.0 TiB");
        assert!(available(Device::Cpu).is_some_and(|b| b > 0));
    }
}
