//! Settings that used to be accepted, panic or exhaust the host are refused through the
//! binary with exit 2, one line naming the field, the value and the allowed range (or
//! the memory they need), no panic, and no run directory left behind.
mod common;
use common::{dflash, stderr, SMALL};

fn refused(args: &[&str], needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let t0 = std::time::Instant::now();
    let out = dflash()
        .arg("train")
        .arg("--run-dir")
        .arg(&run)
        // the small slice first: a later `--set` of the same field wins
        .args(SMALL)
        .args(args)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in {err}"
    );
    assert!(!run.exists(), "{args:?}: a run directory was made");
    assert!(
        t0.elapsed().as_secs() < 60,
        "{args:?}: refused only after {:?}",
        t0.elapsed()
    );
}

#[test]
fn out_of_range_settings_are_refused_before_anything_is_written() {
    for (set, needle) in [
        ("lr=-1", "lr = -1 is outside its allowed range (0, 1]"),
        (
            "grad_clip=-1",
            "grad_clip = -1 is outside its allowed range (0, ",
        ),
        (
            "warmup_ratio=5",
            "warmup_ratio = 5 is outside its allowed range [0, 1]",
        ),
        (
            "num_anchors=100000",
            "num_anchors = 100000 is outside its allowed range 1..=128",
        ),
        (
            "block_size=100000",
            "block_size = 100000 is outside its allowed range 2..=128",
        ),
        (
            "checkpoint_minutes=-5",
            "checkpoint_minutes = -5 is outside",
        ),
        ("keep_checkpoints=-1", "keep_checkpoints = -1 is outside"),
        ("weight_decay=-0.1", "weight_decay = -0.1 is outside"),
    ] {
        refused(&["--steps", "3", "--set", set], needle);
    }
    refused(
        &["--stop-after", "0"],
        "--stop-after = 0 is outside its allowed range 1..=",
    );
}

#[test]
fn a_configuration_whose_block_mask_cannot_fit_is_refused_with_its_size() {
    // 4096 anchors of 64 tokens over 4096-token sequences: a 268 GiB mask per sequence
    refused(
        &[
            "--set",
            "synthetic_seq_len=4096",
            "--set",
            "seq_len=4096",
            "--set",
            "batch_tokens=4096",
            "--set",
            "num_anchors=4096",
            "--set",
            "block_size=64",
        ],
        "memory: the largest batch (1 x 4096 tokens) needs at least",
    );
}

#[test]
fn data_without_any_loss_weight_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("zero.jsonl");
    let row = |ids: &str| format!("{{\"input_ids\": [{ids}], \"loss_mask\": [0, 0, 0, 0]}}\n");
    std::fs::write(&data, row("1, 2, 3, 4").repeat(20) + &row("5, 6, 7, 8")).unwrap();
    refused(
        &["--data", data.to_str().unwrap()],
        "zero.jsonl: no position has a loss weight",
    );
}
