//! The allowed range of every setting, checked in one place before anything is loaded or
//! written. A value outside its range is refused with one line naming the field, the
//! value and the range (`lr = -1 is outside its allowed range (0, 1]`). What needs the
//! target or the data (layer ids, the mask token, memory) is checked in planning.
use super::config::{ConfigError, TrainConfig};

/// An inclusive integer range.
fn int(field: &str, v: i64, lo: i64, hi: i64, note: &str) -> Result<(), ConfigError> {
    if (lo..=hi).contains(&v) {
        return Ok(());
    }
    Err(ConfigError::Range {
        field: field.into(),
        value: v.to_string(),
        allowed: format!("{lo}..={hi}{note}"),
    })
}

/// A float range, each end open or closed; NaN is never inside.
fn float(
    field: &str,
    v: f64,
    lo: (f64, bool),
    hi: (f64, bool),
    note: &str,
) -> Result<(), ConfigError> {
    let above = if lo.1 { v >= lo.0 } else { v > lo.0 };
    let below = if hi.1 { v <= hi.0 } else { v < hi.0 };
    if above && below {
        return Ok(());
    }
    Err(ConfigError::Range {
        field: field.into(),
        value: v.to_string(),
        allowed: format!(
            "{}{}, {}{}{note}",
            if lo.1 { "[" } else { "(" },
            lo.0,
            hi.0,
            if hi.1 { "]" } else { ")" }
        ),
    })
}

const CLOSED: bool = true;
const OPEN: bool = false;
/// Bounds that only keep arithmetic sane; real limits come from memory.
const MAX_TOKENS: i64 = 1 << 30;
const MAX_COUNT: i64 = 1_000_000_000;

/// The attention's layout: query groups (`attn_group_blocks`), else batched groups
/// (`attn_batch_blocks`, whose groups take the largest divisor of `num_anchors` up to it),
/// else the dense mask.
fn attention_layout(cfg: &TrainConfig) -> Result<(), ConfigError> {
    int(
        "attn_group_blocks",
        cfg.attn_group_blocks,
        0,
        MAX_TOKENS,
        " (0: off)",
    )?;
    int(
        "attn_batch_blocks",
        cfg.attn_batch_blocks,
        0,
        MAX_TOKENS,
        " (0: the dense mask)",
    )
}

/// Checks every setting of `cfg` against its allowed range.
pub fn check(cfg: &TrainConfig) -> Result<(), ConfigError> {
    let seq = cfg.seq_len as i64;
    int("seq_len", seq, 2, 1 << 20, "")?;
    int(
        "batch_tokens",
        cfg.batch_tokens as i64,
        seq,
        MAX_TOKENS,
        " (at least seq_len)",
    )?;
    if let Some(n) = cfg.synthetic_seq_len {
        int("synthetic_seq_len", n as i64, 2, seq, " (at most seq_len)")?;
    }
    float(
        "heldout_fraction",
        cfg.heldout_fraction,
        (0.0, CLOSED),
        (1.0, OPEN),
        "",
    )?;
    int("steps", cfg.steps, 1, MAX_COUNT, "")?;
    float("lr", cfg.lr, (0.0, OPEN), (1.0, CLOSED), "")?;
    float(
        "warmup_ratio",
        cfg.warmup_ratio,
        (0.0, CLOSED),
        (1.0, CLOSED),
        "",
    )?;
    float(
        "weight_decay",
        cfg.weight_decay,
        (0.0, CLOSED),
        (1.0, CLOSED),
        "",
    )?;
    float("grad_clip", cfg.grad_clip, (0.0, OPEN), (1e9, CLOSED), "")?;
    int("block_size", cfg.block_size, 2, seq, " (at most seq_len)")?;
    int("num_anchors", cfg.num_anchors, 1, seq, " (at most seq_len)")?;
    float(
        "gamma",
        cfg.gamma,
        (0.0, CLOSED),
        (1e6, CLOSED),
        " (0: the reference value)",
    )?;
    int("chunk_blocks", cfg.chunk_blocks, 1, MAX_TOKENS, "")?;
    attention_layout(cfg)?;
    int("drafter_layers", cfg.drafter_layers, 1, 1024, "")?;
    int(
        "sliding_layers",
        cfg.sliding_layers,
        0,
        cfg.drafter_layers,
        " (at most drafter_layers)",
    )?;
    int("sliding_window", cfg.sliding_window, 1, MAX_TOKENS, "")?;
    int(
        "mask_token_id",
        cfg.mask_token_id,
        -1,
        i64::MAX,
        " (-1: automatic)",
    )?;
    int(
        "target_devices",
        cfg.target_devices.len() as i64,
        1,
        1024,
        " devices, e.g. --target-devices cpu",
    )?;
    int("queue_capacity", cfg.queue_capacity as i64, 1, 4096, "")?;
    int(
        "checkpoint_every",
        cfg.checkpoint_every,
        0,
        MAX_COUNT,
        " (0: off)",
    )?;
    float(
        "checkpoint_minutes",
        cfg.checkpoint_minutes,
        (0.0, CLOSED),
        (1e6, CLOSED),
        " (0: off)",
    )?;
    int(
        "keep_checkpoints",
        cfg.keep_checkpoints,
        0,
        MAX_COUNT,
        " (0: all)",
    )?;
    int("log_every", cfg.log_every, 0, MAX_COUNT, "")?;
    int(
        "summary_every",
        cfg.summary_every,
        0,
        MAX_COUNT,
        " (0: never)",
    )?;
    cfg.trace_window()?;
    Ok(())
}

/// Checks `--stop-after`.
pub fn check_stop_after(stop_after: Option<i64>) -> Result<(), ConfigError> {
    match stop_after {
        Some(n) => int("--stop-after", n, 1, MAX_COUNT, ""),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(set: &str) -> String {
        let cfg = TrainConfig::default()
            .with_overrides(&[set.into()])
            .unwrap();
        check(&cfg).unwrap_err().to_string()
    }

    #[test]
    fn the_default_passes_and_each_out_of_range_value_names_field_value_and_range() {
        check(&TrainConfig::default()).unwrap();
        for (set, want) in [
            ("lr=-1", "lr = -1 is outside its allowed range (0, 1]"),
            ("lr=nan", "lr = NaN is outside"),
            (
                "grad_clip=-1",
                "grad_clip = -1 is outside its allowed range (0, 1000000000]",
            ),
            ("grad_clip=0", "grad_clip = 0 is outside"),
            (
                "warmup_ratio=5",
                "warmup_ratio = 5 is outside its allowed range [0, 1]",
            ),
            (
                "num_anchors=100000",
                "num_anchors = 100000 is outside its allowed range 1..=256 (at most seq_len)",
            ),
            (
                "block_size=100000",
                "block_size = 100000 is outside its allowed range 2..=256",
            ),
            ("block_size=1", "block_size = 1 is outside"),
            ("steps=0", "steps = 0 is outside"),
            (
                "batch_tokens=100",
                "batch_tokens = 100 is outside its allowed range 256..=",
            ),
            (
                "sliding_layers=3",
                "sliding_layers = 3 is outside its allowed range 0..=2",
            ),
            ("queue_capacity=0", "queue_capacity = 0 is outside"),
            (
                "checkpoint_minutes=-1",
                "checkpoint_minutes = -1 is outside",
            ),
            ("keep_checkpoints=-1", "keep_checkpoints = -1 is outside"),
            (
                "heldout_fraction=1",
                "heldout_fraction = 1 is outside its allowed range [0, 1)",
            ),
            (
                "target_devices=[]",
                "target_devices = 0 is outside its allowed range 1..=1024 devices",
            ),
            ("trace_steps=\"5..2\"", "trace_steps"),
            (
                "attn_batch_blocks=-1",
                "attn_batch_blocks = -1 is outside its allowed range 0..=",
            ),
        ] {
            let e = refused(set);
            assert!(e.contains(want), "{set}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        // the batched attention layout: any group size (the groups take the largest
        // divisor of num_anchors up to it), with or without query groups (which win)
        for set in [
            vec!["attn_batch_blocks=2", "attn_group_blocks=2"],
            vec!["attn_batch_blocks=3"],
            vec!["attn_batch_blocks=1000", "num_anchors=8"],
        ] {
            let set: Vec<String> = set.into_iter().map(String::from).collect();
            check(&TrainConfig::default().with_overrides(&set).unwrap()).unwrap();
        }
        check_stop_after(Some(0)).unwrap_err();
        check_stop_after(Some(5)).unwrap();
    }
}
