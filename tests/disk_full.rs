//! A full disk, on a small tmpfs (needs root to mount one; otherwise each test says why it
//! skips): while writing metrics, the trace, a checkpoint and the final drafter export,
//! the run exits 2 with one true line naming the last good checkpoint (or saying there is
//! none), every trace left behind loads, and after space is freed `--resume` finishes
//! the run with the drafter an uninterrupted run makes.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{analyzer, metric_steps, stderr, train, train_ok};

/// A tmpfs mounted on a temporary directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(bytes: u64) -> Result<Tmpfs, String> {
        // SAFETY: a plain query of the effective user id.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root, so no tmpfs can be mounted".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount failed: {}", stderr(&out).trim()));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Frees space: the same file system, larger.
    fn grow(&self, bytes: u64) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(self.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.path()).status();
    }
}

fn tmpfs_or_skip(bytes: u64, test: &str) -> Option<Tmpfs> {
    match Tmpfs::mount(bytes) {
        Ok(t) => Some(t),
        Err(why) => {
            println!("{test}: skipped: {why}");
            None
        }
    }
}

/// Bytes a directory tree takes on tmpfs: every file rounded up to whole pages.
fn pages(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        n += if m.is_dir() {
            pages(&e.path())
        } else {
            m.len().div_ceil(4096) * 4096
        };
    }
    n
}

fn full_disk_line(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
    let e = stderr(out);
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(!e.contains("panicked"), "{e}");
    assert!(e.contains("error: the disk is full: "), "{e}");
    println!("{}", e.trim());
    e
}

fn analyzer_loads(trace: &Path) {
    let out = Command::new(analyzer())
        .args(["breakdown", "--json"])
        .arg(trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        trace.display(),
        stderr(&out)
    );
}

#[test]
fn metrics_on_a_full_disk_exit_2_and_resume_after_space_is_freed() {
    let Some(fs) = tmpfs_or_skip(12 << 10, "metrics") else {
        return;
    };
    // three pages: the lock, config.toml and one page of metrics (about 19 lines)
    let run = fs.path().join("run");
    let out = train(
        &run,
        &[
            "--steps",
            "40",
            "--set",
            "save_checkpoints=false",
            "--set",
            "heldout_fraction=0",
        ],
    );
    let e = full_disk_line(&out);
    assert!(
        e.contains(&format!("writing {}", run.join("metrics.jsonl").display())),
        "{e}"
    );
    assert!(
        e.contains("no checkpoint is saved (save_checkpoints is off)"),
        "{e}"
    );
    let logged = metric_steps(&run);
    assert!(!logged.is_empty() && logged.len() < 40, "{logged:?}");
    assert!(!run.join("summary.json").exists(), "no empty summary");
    fs.grow(64 << 20);
    train_ok(&run, &["--resume"]);
    assert_eq!(metric_steps(&run), (0..40).collect::<Vec<_>>());
}

#[test]
fn a_trace_on_a_full_disk_exits_2_loads_and_resume_writes_the_next_one() {
    // five pages: the lock, config.toml, metrics.jsonl and two for a trace that needs
    // about six (3 KiB a step)
    let Some(fs) = tmpfs_or_skip(20 << 10, "trace") else {
        return;
    };
    let run = fs.path().join("run");
    let r = run.to_str().unwrap();
    let args = [
        "--steps",
        "8",
        "--set",
        "save_checkpoints=false",
        "--set",
        "heldout_fraction=0",
        "--trace",
        r,
        "--trace-steps",
        "0..8",
    ];
    let out = train(&run, &args);
    let e = full_disk_line(&out);
    let trace = run.join("trace.json");
    assert!(
        e.contains(&format!("the trace {} is incomplete", trace.display())),
        "{e}"
    );
    assert!(e.contains("no checkpoint is saved"), "{e}");
    analyzer_loads(&trace);
    fs.grow(64 << 20);
    let resumed: Vec<&str> = ["--resume"]
        .into_iter()
        .chain(args[6..].iter().copied())
        .collect();
    train_ok(&run, &resumed);
    analyzer_loads(&run.join("trace.json"));
    analyzer_loads(&run.join("trace.1.json"));
    assert_eq!(metric_steps(&run), (0..8).collect::<Vec<_>>());
}

/// An uninterrupted run with `args` outside the tmpfs: its drafter bytes and the bytes
/// one checkpoint and the drafter take.
fn reference(args: &[&str]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("ref");
    train_ok(&run, args);
    (dir, run)
}

#[test]
fn a_checkpoint_on_a_full_disk_names_the_last_good_one_and_resume_continues_from_it() {
    let args = [
        "--steps",
        "8",
        "--set",
        "checkpoint_every=2",
        "--set",
        "heldout_fraction=0",
    ];
    let (_keep, r) = reference(&args);
    let ckpt = pages(&r.join("checkpoints/step-00000008"));
    // room for one checkpoint and a half
    let Some(fs) = tmpfs_or_skip(64 * 1024 + ckpt * 3 / 2, "checkpoint") else {
        return;
    };
    let run = fs.path().join("run");
    let e = full_disk_line(&train(&run, &args));
    let last = run.join("checkpoints/step-00000002");
    assert!(e.contains("checkpoint of step 4 not written"), "{e}");
    assert!(
        e.contains(&format!(
            "the last good checkpoint is {} (step 2)",
            last.display()
        )),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("checkpoints/latest")).unwrap(),
        "step-00000002"
    );
    fs.grow(256 << 20);
    train_ok(&run, &["--resume"]);
    assert_eq!(metric_steps(&run), (0..8).collect::<Vec<_>>());
    assert!(
        std::fs::read(run.join("drafter/model.safetensors")).unwrap()
            == std::fs::read(r.join("drafter/model.safetensors")).unwrap()
    );
}

#[test]
fn the_drafter_export_on_a_full_disk_names_the_final_checkpoint_and_resume_exports_it() {
    let args = ["--steps", "4", "--set", "heldout_fraction=0"];
    let (_keep, r) = reference(&args);
    let ckpt = pages(&r.join("checkpoints/step-00000004"));
    let drafter = pages(&r.join("drafter"));
    // the final checkpoint fits, the exported drafter does not
    let Some(fs) = tmpfs_or_skip(64 * 1024 + ckpt + drafter / 2, "drafter export") else {
        return;
    };
    let run = fs.path().join("run");
    let e = full_disk_line(&train(&run, &args));
    let drafter_dir = run.join("drafter");
    assert!(
        e.contains(&format!(
            "training finished but the drafter was not exported to {}",
            drafter_dir.display()
        )),
        "{e}"
    );
    let last = run.join("checkpoints/step-00000004");
    assert!(
        e.contains(&format!(
            "the last good checkpoint is {} (step 4)",
            last.display()
        )),
        "{e}"
    );
    assert!(!drafter_dir.exists());
    fs.grow(256 << 20);
    train_ok(&run, &["--resume"]);
    assert!(
        std::fs::read(drafter_dir.join("model.safetensors")).unwrap()
            == std::fs::read(r.join("drafter/model.safetensors")).unwrap()
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["status"], "finished");
}
