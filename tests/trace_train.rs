//! Traces of real CPU training runs: every documented section is present, spans nest
//! properly on every track, timestamps are sane, metadata is there; a run stopped by
//! SIGINT closes a complete trace and a checkpoint; a run killed with SIGKILL leaves a
//! trace the analyzer still loads.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use chrome_trace_format::dflash as names;
use serde_json::Value;

mod common;
use common::{dflash, spawn_endless_traced, wait_for_steps, SMALL};

fn load(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("a complete trace is valid JSON")
}

fn spans(trace: &Value) -> Vec<&Value> {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect()
}

#[test]
fn cpu_trace_has_every_section_nested_with_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // --trace-kernels on a CPU run: one warning, and the trace it would be without it
    let out = dflash()
        .args([
            "train",
            "--steps",
            "8",
            "--trace-steps",
            "2..6",
            "--trace-kernels",
            "--trace",
        ])
        .arg(&run)
        .args(SMALL)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("--trace-kernels"))
        .collect();
    assert_eq!(
        warnings,
        ["warning: --trace-kernels: this run has no CUDA device; the trace has no kernels"]
    );
    let trace = load(&run.join("trace.json"));

    // metadata and HTA compatibility
    let md = &trace["metadata"];
    assert_eq!(md["producer"], "dflash");
    assert_eq!(md["gpu_timing"], "none", "CPU-only runs say so");
    assert_eq!(md["trace_steps"], "2..6");
    assert!(md["config"]["steps"] == 8 && md["devices"].as_array().is_some_and(|d| !d.is_empty()));
    assert!(
        md["torch_version"].is_string()
            && md["git_revision"].is_string()
            && md["dflash_version"].is_string()
    );
    assert_eq!(trace["distributedInfo"]["rank"], 0);

    check_structure(
        &trace,
        2,
        &[
            "ProfilerStep#2",
            "ProfilerStep#3",
            "ProfilerStep#4",
            "ProfilerStep#5",
        ],
    );
}

#[test]
fn trace_kernels_without_trace_is_a_usage_error() {
    let out = dflash()
        .args(["train", "--steps", "2", "--trace-kernels"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--trace-kernels") && stderr.contains("--trace"),
        "{stderr}"
    );
}

/// Structure every trace of a training run must have: all documented sections, the
/// traced steps as `ProfilerStep#N` with `drafter.step` args, queue args and counters,
/// proper nesting on every track, drafter sections inside their step, matched flows.
fn check_structure(trace: &Value, layers: usize, want_steps: &[&str]) {
    let xs = spans(trace);
    let names: BTreeSet<&str> = xs.iter().map(|e| e["name"].as_str().unwrap()).collect();
    let mut required: Vec<String> = names::TARGET_SECTIONS
        .iter()
        .chain(&[names::QUEUE_PUT, names::QUEUE_GET, names::DRAFTER_STEP])
        .chain(&names::DRAFTER_SECTIONS)
        .map(|s| s.to_string())
        .collect();
    for i in 0..layers {
        required.extend([names::layer(i), names::layer_attn(i), names::layer_mlp(i)]);
    }
    for r in &required {
        assert!(names.contains(r.as_str()), "missing {r}");
    }
    // traced steps only, each with a drafter.step carrying args
    let steps: Vec<&&Value> = xs
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("ProfilerStep#"))
        .collect();
    let ids: BTreeSet<&str> = steps.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(ids, want_steps.iter().copied().collect::<BTreeSet<&str>>());
    for e in xs.iter().filter(|e| e["name"] == "drafter.step") {
        assert!(
            e["args"]["step"].is_u64()
                && e["args"]["tokens"].as_u64().unwrap() > 0
                && e["args"]["loss"].is_f64()
        );
    }
    for e in xs
        .iter()
        .filter(|e| e["name"] == "queue.put" || e["name"] == "queue.get")
    {
        assert!(
            e["args"]["wait_us"].is_number() && e["args"]["depth"].is_number(),
            "{e}"
        );
    }
    assert!(trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["ph"] == "C" && e["name"] == "queue"));

    // per track: non-negative times, proper nesting (no partial overlap)
    type Track<'a> = Vec<(f64, f64, &'a str)>;
    let mut tracks: BTreeMap<(u64, u64), Track> = BTreeMap::new();
    for e in &xs {
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        assert!(ts >= 0.0 && dur >= 0.0, "{e}");
        tracks
            .entry((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
            .or_default()
            .push((ts, ts + dur, e["name"].as_str().unwrap()));
    }
    for (track, mut v) in tracks {
        v.sort_by(|a, b| {
            a.0.partial_cmp(&b.0)
                .unwrap()
                .then(b.1.partial_cmp(&a.1).unwrap())
        });
        let mut open: Vec<(f64, f64, &str)> = Vec::new();
        for s in v {
            while open.last().is_some_and(|o| o.1 <= s.0 + 1e-3) {
                open.pop();
            }
            if let Some(parent) = open.last() {
                assert!(
                    s.1 <= parent.1 + 1e-3,
                    "{track:?}: {} [{}, {}] overlaps {} [{}, {}]",
                    s.2,
                    s.0,
                    s.1,
                    parent.2,
                    parent.0,
                    parent.1
                );
            }
            open.push(s);
        }
    }
    // the drafter sections of a step lie inside its drafter.step, which lies in ProfilerStep
    let step_spans: Vec<(f64, f64)> = xs
        .iter()
        .filter(|e| e["name"] == "drafter.step")
        .map(|e| {
            (
                e["ts"].as_f64().unwrap(),
                e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap(),
            )
        })
        .collect();
    for e in xs.iter().filter(|e| e["name"] == "drafter.backward") {
        let ts = e["ts"].as_f64().unwrap();
        assert!(step_spans.iter().any(|(a, b)| *a <= ts && ts <= *b));
    }
    // flows: every queue.get's flow_in has a queue.put flow_out with the same id
    let outs: BTreeSet<u64> = xs
        .iter()
        .filter(|e| e["name"] == "queue.put" && e["flow_out"] == true)
        .map(|e| e["bind_id"].as_u64().unwrap())
        .collect();
    let ins: Vec<u64> = xs
        .iter()
        .filter(|e| e["name"] == "queue.get")
        .map(|e| e["bind_id"].as_u64().expect("queue.get has a flow"))
        .collect();
    assert!(
        !ins.is_empty() && ins.iter().all(|i| outs.contains(i)),
        "{ins:?} vs {outs:?}"
    );
}

#[test]
fn sigint_stops_cleanly_with_a_complete_trace_and_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = spawn_endless_traced(&run);
    wait_for_steps(&run, 3);
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    // interrupted is not finished: 128 + SIGINT, as shells expect
    assert_eq!(status.code(), Some(130), "{status:?}");
    let trace = load(&run.join("trace.json"));
    assert!(!spans(&trace).is_empty());
    assert!(run.join("checkpoints/latest").exists());
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["stopped_by_signal"], true);
}

/// The analyzer binary of the same build (another package of the workspace, so cargo
/// does not hand its path to this test; `cargo test --workspace` builds it).
fn analyzer() -> std::path::PathBuf {
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

#[test]
fn sigkill_leaves_a_trace_the_analyzer_loads() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = spawn_endless_traced(&run);
    wait_for_steps(&run, 4);
    // the recorder flushes at least every 500 ms
    std::thread::sleep(Duration::from_millis(1200));
    child.kill().unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(run.join("trace.json")).unwrap();
    assert!(
        serde_json::from_str::<Value>(&text).is_err(),
        "a killed writer leaves the array open"
    );
    let out = Command::new(analyzer())
        .args(["breakdown", "--json"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = report["sections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"drafter.backward") && names.contains(&"target.forward"),
        "{names:?}"
    );
}

/// A real H200 trace (committed by the GPU runs, see docs/gpu-results.md): the same
/// structure, plus GPU spans on their own GPU tracks, every GPU span joined to its CPU
/// span by a flow, never before it, and the drafter's GPU spans inside their step.
#[test]
fn recorded_gpu_trace_has_matched_flows_and_gpu_spans_inside_their_steps() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/traces/h200-realistic-perf.json.gz");
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()),
        &mut text,
    )
    .unwrap();
    let trace: Value = serde_json::from_str(&text).unwrap();
    let want: Vec<String> = (20..40).map(|i| format!("ProfilerStep#{i}")).collect();
    check_structure(
        &trace,
        3,
        &want.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    );
    assert_eq!(trace["metadata"]["gpu_timing"], "cuda-events");
    let xs = spans(&trace);
    let gpu: Vec<&&Value> = xs.iter().filter(|e| e["cat"] == "gpu").collect();
    assert!(gpu.len() > 100);
    let cpu_by_flow: BTreeMap<u64, &&Value> = xs
        .iter()
        .filter(|e| e["cat"] == "cpu" && e["flow_out"] == true)
        .map(|e| (e["bind_id"].as_u64().unwrap(), e))
        .collect();
    let trainer_pid = xs.iter().find(|e| e["name"] == "drafter.step").unwrap()["pid"]
        .as_u64()
        .unwrap();
    let steps: BTreeMap<u64, (f64, f64)> = xs
        .iter()
        .filter(|e| e["pid"].as_u64() == Some(trainer_pid))
        .filter_map(|e| {
            let n = e["name"]
                .as_str()?
                .strip_prefix("ProfilerStep#")?
                .parse()
                .ok()?;
            let ts = e["ts"].as_f64()?;
            Some((n, (ts, ts + e["dur"].as_f64()?)))
        })
        .collect();
    for g in &gpu {
        assert_ne!(
            g["pid"].as_u64(),
            Some(trainer_pid),
            "GPU spans live on the GPU process"
        );
        let cpu = cpu_by_flow
            .get(&g["bind_id"].as_u64().unwrap())
            .expect("every GPU span has its CPU span");
        assert_eq!(cpu["name"], g["name"]);
        let (gts, cts) = (g["ts"].as_f64().unwrap(), cpu["ts"].as_f64().unwrap());
        assert!(
            gts >= cts,
            "{} starts on the GPU before its launch",
            g["name"]
        );
        if g["name"].as_str().unwrap().starts_with("drafter.") {
            let step = g["args"]["step"]
                .as_u64()
                .expect("drafter GPU spans carry their step");
            let (a, b) = steps[&step];
            let end = gts + g["dur"].as_f64().unwrap();
            assert!(
                a <= gts && end <= b + 1.0,
                "{} of step {step} [{gts}, {end}] outside [{a}, {b}]",
                g["name"]
            );
        }
    }
    // one GPU track per worker stream
    let tracks: BTreeSet<(u64, u64)> = gpu
        .iter()
        .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    assert_eq!(tracks.len(), 2, "{tracks:?}");
}
