//! Helpers shared by the end-to-end tests that drive the `dflash` binary, and
//! ([`hf_checkpoint`]) tiny Hugging Face checkpoints written without the library.
#![allow(dead_code)]
pub mod hf_checkpoint;

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

/// No held-out split: saves a run two evaluations (about 1.5 s) where they do not matter.
pub const NO_HELDOUT: &[&str] = &["--set", "heldout_fraction=0"];

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

/// `dflash train ARGS --run-dir RUN` on the small slice, whatever its outcome.
pub fn train(run: &Path, args: &[&str]) -> Output {
    dflash()
        .arg("train")
        .args(args)
        .arg("--run-dir")
        .arg(run)
        .args(SMALL)
        .output()
        .unwrap()
}

/// Starts `dflash train ARGS --run-dir RUN` on the small slice.
pub fn spawn_train(run: &Path, args: &[&str]) -> Child {
    dflash()
        .arg("train")
        .args(args)
        .arg("--run-dir")
        .arg(run)
        .args(SMALL)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The `step` of every line of the run's metrics.jsonl, in file order.
pub fn metric_steps(run: &Path) -> Vec<i64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_i64()
                .unwrap()
        })
        .collect()
}

/// Complete lines in the run's metrics.jsonl right now.
pub fn metric_lines(run: &Path) -> usize {
    std::fs::read(run.join("metrics.jsonl"))
        .map(|b| b.iter().filter(|&&c| c == b'\n').count())
        .unwrap_or(0)
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Sends `sig` to a child process.
pub fn signal(child: &Child, sig: i32) {
    // SAFETY: a signal to a process we started.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// The temporary leftovers of crashed writers under `dir` (recursively).
pub fn leftovers(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if dflash::durable::is_leftover(&e.file_name().to_string_lossy()) {
            out.push(e.path());
        } else if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(leftovers(&e.path()));
        }
    }
    out
}

/// The analyzer binary of the same build (another package of the workspace, so cargo
/// does not hand its path to a test; `cargo test --workspace` builds it).
pub fn analyzer() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join(format!("dflash-analyze{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test --workspace`",
        bin.display()
    );
    bin
}
