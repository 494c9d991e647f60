//! The run directory through the `dflash` binary: one trainer per directory, nothing
//! earlier overwritten (a resumed traced run writes the next trace file, metrics hold
//! each step once, a fresh run refuses a killed run's directory), signals exit 130/143
//! with a summary that says stopped, a resume of a finished run changes nothing, and the
//! trace header is on disk from the start.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{
    analyzer, leftovers, metric_lines, metric_steps, signal, spawn_train, stderr, train, train_ok,
    wait_for_steps,
};

fn one_line(out: &Output) -> String {
    let e = stderr(out);
    let lines: Vec<&str> = e
        .lines()
        .filter(|l| !l.starts_with("dflash train:"))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {e}");
    lines[0].to_string()
}

#[test]
fn concurrent_starts_exactly_one_runs_and_a_resume_meanwhile_names_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let children: Vec<_> = (0..4)
        .map(|_| spawn_train(&run, &["--steps", "6", "--set", "heldout_fraction=0"]))
        .collect();
    let pids: Vec<u32> = children.iter().map(|c| c.id()).collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let winners: Vec<usize> = (0..4).filter(|&i| outs[i].status.success()).collect();
    assert_eq!(
        winners.len(),
        1,
        "{:?}",
        outs.iter().map(stderr).collect::<Vec<_>>()
    );
    let winner = pids[winners[0]];
    for (i, out) in outs.iter().enumerate().filter(|(i, _)| *i != winners[0]) {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
        let line = one_line(out);
        let in_use = format!("is in use by another dflash process (pid {winner})");
        assert!(
            line.contains(&in_use) || line.contains("already holds a run"),
            "process {i}: {line}"
        );
        assert!(line.contains(&run.display().to_string()), "{line}");
    }
    assert_eq!(metric_steps(&run), (0..6).collect::<Vec<_>>());

    // a resume while another process trains in the directory is refused too
    let other = dir.path().join("other");
    let mut a = spawn_train(
        &other,
        &["--steps", "100000", "--set", "heldout_fraction=0"],
    );
    wait_for_steps(&other, 1);
    let b = train(&other, &["--resume"]);
    assert_eq!(b.status.code(), Some(2));
    let line = one_line(&b);
    assert!(
        line.contains(&format!(
            "is in use by another dflash process (pid {})",
            a.id()
        )),
        "{line}"
    );
    signal(&a, libc::SIGTERM);
    let status = a.wait().unwrap();
    assert_eq!(status.code(), Some(143), "SIGTERM exits 128 + 15");
}

#[test]
fn a_resumed_traced_run_writes_the_next_trace_file_and_metrics_hold_each_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let trace = ["--trace", run.to_str().unwrap(), "--trace-steps", "0..8"];
    let mut first = vec![
        "--steps",
        "8",
        "--stop-after",
        "4",
        "--set",
        "heldout_fraction=0",
    ];
    first.extend(trace);
    train_ok(&run, &first);
    let before = std::fs::read(run.join("trace.json")).unwrap();
    let mut second = vec!["--resume"];
    second.extend(trace);
    train_ok(&run, &second);
    assert_eq!(
        std::fs::read(run.join("trace.json")).unwrap(),
        before,
        "the first trace is kept"
    );
    let steps_in = |name: &str| -> Vec<u64> {
        let t: Value =
            serde_json::from_str(&std::fs::read_to_string(run.join(name)).unwrap()).unwrap();
        let mut s: Vec<u64> = t["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| {
                e["name"]
                    .as_str()?
                    .strip_prefix("ProfilerStep#")?
                    .parse()
                    .ok()
            })
            .collect();
        s.sort();
        s
    };
    assert_eq!(steps_in("trace.json"), [0, 1, 2, 3]);
    assert_eq!(steps_in("trace.1.json"), [4, 5, 6, 7]);
    assert_eq!(
        dflash::run_files::trace_files(&run),
        [run.join("trace.json"), run.join("trace.1.json")]
    );
    assert_eq!(metric_steps(&run), (0..8).collect::<Vec<_>>());
    // the analyzer reads both segments as one run, on one clock
    let out = std::process::Command::new(analyzer())
        .args(["breakdown", "--json"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["steps"]["count"], 8, "{}", report["steps"]);
    assert_eq!(
        report["warnings"].as_array().map_or(0, |w| w.len()),
        0,
        "{}",
        report["warnings"]
    );
}

#[test]
fn a_fresh_run_refuses_a_killed_runs_directory_and_resume_starts_over_without_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let first = [
        "--steps",
        "100000",
        "--set",
        "heldout_fraction=0",
        "--set",
        "lr=1e-3",
    ];
    let mut a = spawn_train(&run, &first);
    wait_for_steps(&run, 2);
    a.kill().unwrap();
    a.wait().unwrap();
    assert!(
        !run.join("checkpoints/latest").exists(),
        "no checkpoint within 10 minutes"
    );
    let metrics = std::fs::read(run.join("metrics.jsonl")).unwrap();
    // a leftover of a crashed writer, as a kill inside a write leaves one
    std::fs::create_dir_all(run.join("checkpoints/.step-00000002.tmp-999999")).unwrap();

    let again = train(&run, &["--steps", "5"]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        one_line(&again).contains("already holds a run"),
        "{}",
        stderr(&again)
    );
    assert_eq!(
        std::fs::read(run.join("metrics.jsonl")).unwrap(),
        metrics,
        "untouched"
    );

    // the killed run's own settings with what this command sets explicitly: a shorter
    // schedule, and lr back to its default value
    let out = train_ok(&run, &["--resume", "--steps", "5", "--set", "lr=3e-3"]);
    let cfg = dflash::train::config::TrainConfig::from_file(&run.join("config.toml")).unwrap();
    assert_eq!((cfg.steps, cfg.lr, cfg.heldout_fraction), (5, 3e-3, 0.0));
    assert!(stderr(&out).is_empty(), "quiet: {}", stderr(&out));
    assert_eq!(metric_steps(&run), (0..5).collect::<Vec<_>>());
    assert_eq!(leftovers(&run), Vec::<std::path::PathBuf>::new());
    assert!(run.join("drafter/model.safetensors").exists());
}

fn summary(run: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap()
}

fn snapshot(dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_name() == ".lock" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            snapshot(&e.path(), out);
        } else {
            out.insert(
                e.path().display().to_string(),
                std::fs::read(e.path()).unwrap(),
            );
        }
    }
}

#[test]
fn sigterm_stops_with_143_and_a_stopped_summary_and_a_finished_run_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let a = spawn_train(&run, &["--steps", "12", "--set", "heldout_fraction=0"]);
    wait_for_steps(&run, 3);
    signal(&a, libc::SIGTERM);
    let out = a.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    let s = summary(&run);
    let at = s["step"].as_i64().unwrap();
    assert_eq!(s["status"], "stopped");
    assert_eq!(s["signal"], "SIGTERM");
    assert_eq!(s["stopped_by_signal"], true);
    assert!((3..12).contains(&at), "{s}");
    assert_eq!(
        metric_lines(&run) as i64,
        at,
        "stopped at the step it logged"
    );
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(
        latest,
        format!("step-{at:08}"),
        "checkpoint at the exact step"
    );
    assert!(
        !run.join("drafter").exists(),
        "an interrupted run exports no drafter"
    );

    let out = train_ok(&run, &["--resume"]);
    let s = summary(&run);
    assert_eq!(
        (s["status"].as_str(), s["step"].as_i64()),
        (Some("finished"), Some(12))
    );
    assert_eq!(s["start_step"].as_i64(), Some(at));
    assert!(stderr(&out).is_empty());
    assert_eq!(metric_steps(&run), (0..12).collect::<Vec<_>>());

    let mut before = BTreeMap::new();
    snapshot(&run, &mut before);
    let out = common::dflash()
        .args(["train", "--resume", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is already finished (12 of 12 steps): nothing to do"),
        "{}",
        stderr(&out)
    );
    let mut after = BTreeMap::new();
    snapshot(&run, &mut after);
    assert!(before == after, "a resume of a finished run changed files");
}

#[test]
fn the_trace_header_is_on_disk_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = common::spawn_endless_traced(&run);
    let path = run.join("trace.json");
    let t0 = Instant::now();
    while !path.exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no trace file");
        std::thread::sleep(Duration::from_millis(5));
    }
    // killed well within its first second of tracing
    std::thread::sleep(Duration::from_millis(50));
    child.kill().unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("{\"schemaVersion\":1,"), "{text:?}");
    let header_end = text
        .find("\"traceEvents\":[")
        .expect("the header is complete");
    let header: Value =
        serde_json::from_str(&format!("{}\"traceEvents\":[]}}", &text[..header_end])).unwrap();
    assert_eq!(header["metadata"]["producer"], "dflash");
}
