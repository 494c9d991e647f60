//! Helpers shared by the end-to-end tests that drive the `dflash` binary.
#![allow(dead_code)]
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;

/// A small slice of the embedded default: short sequences, few anchors, no progress.
pub const SMALL: &[&str] = &[
    "--set",
    "seq_len=128",
    "--set",
    "batch_tokens=1024",
    "--set",
    "num_anchors=16",
    "--quiet",
];

pub fn dflash() -> Command {
    Command::cargo_bin("dflash").unwrap()
}

/// Runs `dflash train ARGS --run-dir RUN` on the small slice and asserts success.
pub fn train_ok(run: &Path, args: &[&str]) -> Output {
    let out = dflash()
        .arg("train")
        .args(args)
        .arg("--run-dir")
        .arg(run)
        .args(SMALL)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Per-step losses from the run's metrics.jsonl.
pub fn losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}

/// Starts an endless traced training run in `run`, every step traced.
pub fn spawn_endless_traced(run: &Path) -> Child {
    dflash()
        .args([
            "train",
            "--steps",
            "100000",
            "--trace-steps",
            "0..100000",
            "--trace",
        ])
        .arg(run)
        .args(SMALL)
        .spawn()
        .unwrap()
}

/// Waits until the run has logged `n` steps.
pub fn wait_for_steps(run: &Path, n: usize) {
    for _ in 0..600 {
        let lines = std::fs::read_to_string(run.join("metrics.jsonl"))
            .map(|s| s.lines().count())
            .unwrap_or(0);
        if lines >= n {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("training did not reach {n} steps");
}
