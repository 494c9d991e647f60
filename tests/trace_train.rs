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
use common::{analyzer, dflash, spawn_endless_traced, wait_for_steps, SMALL};

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

fn load_gz(rel: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let mut text = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()),
        &mut text,
    )
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

const KERNEL_FIXTURE: &str = "fixtures/traces/h100-kernels.json.gz";

#[test]
/// A real `--trace-kernels` run (committed by scripts/gpu-kernels.sh, see
/// docs/gpu-results.md): the structure of every GPU trace, plus every kernel, copy and set
/// inside the GPU span of the section that launched it (correlation -> the launching call
/// -> the innermost GPU-timed CPU span open on the call's thread -> its flow -> that
/// span's GPU side), every runtime call inside a CPU span of its thread, and every launch
/// flow matched: one start at a call and one end at a GPU record of that correlation.
fn recorded_kernel_trace_nests_kernels_and_calls_in_their_sections_with_matched_flows() {
    let trace = load_gz(KERNEL_FIXTURE);
    let want: Vec<String> = (8..11).map(|i| format!("ProfilerStep#{i}")).collect();
    check_structure(
        &trace,
        3,
        &want.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
    );
    let events = trace["traceEvents"].as_array().unwrap();
    let xs = spans(&trace);
    let is_gpu_record = |e: &Value| {
        matches!(
            e["cat"].as_str(),
            Some("kernel" | "gpu_memcpy" | "gpu_memset")
        )
    };
    let is_call = |e: &Value| matches!(e["cat"].as_str(), Some("cuda_runtime" | "cuda_driver"));
    let records: Vec<&&Value> = xs.iter().filter(|e| is_gpu_record(e)).collect();
    let calls: Vec<&&Value> = xs.iter().filter(|e| is_call(e)).collect();
    assert!(records.iter().filter(|e| e["cat"] == "kernel").count() > 1000);
    assert!(
        calls.len() > 1000,
        "runtime/driver calls captured: {}",
        calls.len()
    );

    // CPU spans by track; GPU-timed ones (flow_out) give their GPU span by bind_id
    let gpu_by_flow: BTreeMap<u64, &&Value> = xs
        .iter()
        .filter(|e| e["cat"] == "gpu")
        .map(|e| (e["bind_id"].as_u64().unwrap(), e))
        .collect();
    let mut cpu_by_track: BTreeMap<(u64, u64), Vec<&&Value>> = BTreeMap::new();
    for e in xs.iter().filter(|e| e["cat"] == "cpu") {
        cpu_by_track.entry(track(e)).or_default().push(e);
    }
    let call_by_corr: BTreeMap<u64, &&Value> = calls
        .iter()
        .map(|c| (c["args"]["correlation"].as_u64().unwrap(), *c))
        .collect();
    calls_lie_in_cpu_spans_of_their_threads(&calls, &cpu_by_track);
    records_lie_in_their_sections_gpu_spans(&records, &call_by_corr, &cpu_by_track, &gpu_by_flow);
    launch_flows_match(events, &records, &call_by_corr);
}

fn num(e: &Value, k: &str) -> f64 {
    e[k].as_f64().unwrap()
}

fn track(e: &Value) -> (u64, u64) {
    (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())
}

/// Every call on a recorder thread lies in a CPU span of that thread.
fn calls_lie_in_cpu_spans_of_their_threads(
    calls: &[&&Value],
    cpu_by_track: &BTreeMap<(u64, u64), Vec<&&Value>>,
) {
    let f = num;
    let (mut on_recorder_threads, mut between) = (0, 0);
    for c in calls {
        let Some(cpu) = cpu_by_track.get(&track(c)) else {
            continue; // a thread that recorded no span (autograd's): its own track
        };
        on_recorder_threads += 1;
        let (a, b) = (f(c, "ts"), f(c, "ts") + f(c, "dur"));
        if !cpu
            .iter()
            .any(|s| f(s, "ts") <= a + 1e-3 && b <= f(s, "ts") + f(s, "dur") + 1e-3)
        {
            // between sections: only the recorder's closing event records and the
            // queue's hand-off (an event recorded by the target, waited on by the drafter)
            assert!(
                matches!(
                    c["name"].as_str(),
                    Some("cuEventRecord" | "cudaEventRecord" | "cudaStreamWaitEvent")
                ),
                "{c} lies in no CPU span of its thread"
            );
            between += 1;
        }
    }
    assert!(on_recorder_threads > 100);
    assert!(
        between * 50 < on_recorder_threads,
        "{between} of {on_recorder_threads} calls between sections"
    );
}

/// Every GPU record launched inside a GPU-timed section lies in that section's GPU span
/// (records launched before the window, or by the target's next steps, have no call in
/// the trace; autograd's launches sit on a track without sections).
fn records_lie_in_their_sections_gpu_spans(
    records: &[&&Value],
    call_by_corr: &BTreeMap<u64, &&Value>,
    cpu_by_track: &BTreeMap<(u64, u64), Vec<&&Value>>,
    gpu_by_flow: &BTreeMap<u64, &&Value>,
) {
    let f = num;
    let (mut checked, mut launched_in_sections) = (0, 0);
    for r in records {
        let corr = r["args"]["correlation"].as_u64().unwrap();
        let Some(call) = call_by_corr.get(&corr) else {
            continue;
        };
        let Some(cpu) = cpu_by_track.get(&track(call)) else {
            continue;
        };
        launched_in_sections += 1;
        let t = f(call, "ts");
        let section = cpu
            .iter()
            .filter(|s| s["flow_out"] == true && f(s, "ts") <= t && t <= f(s, "ts") + f(s, "dur"))
            .filter(|s| gpu_by_flow[&s["bind_id"].as_u64().unwrap()]["pid"] == r["pid"])
            .max_by(|a, b| f(a, "ts").partial_cmp(&f(b, "ts")).unwrap());
        let Some(section) = section else { continue };
        let g = gpu_by_flow[&section["bind_id"].as_u64().unwrap()];
        assert_eq!(
            track(g),
            track(r),
            "{r} is not on its section's stream track"
        );
        let (a, b) = (f(r, "ts"), f(r, "ts") + f(r, "dur"));
        assert!(
            f(g, "ts") - 1e-3 <= a && b <= f(g, "ts") + f(g, "dur") + 1e-3,
            "{} [{a}, {b}] outside {} [{}, {}]",
            r["name"],
            g["name"],
            f(g, "ts"),
            f(g, "ts") + f(g, "dur")
        );
        checked += 1;
    }
    // all but the launches of sections without GPU timing (drafter.metrics, anchors)
    assert!(
        checked * 100 >= launched_in_sections * 95 && checked > 1000,
        "{checked} of {launched_in_sections} records launched in sections checked"
    );
}

/// Launch flows: one start at its call, one end at its GPU record, per correlation.
fn launch_flows_match(
    events: &[Value],
    records: &[&&Value],
    call_by_corr: &BTreeMap<u64, &&Value>,
) {
    let f = num;
    let record_by_corr: BTreeMap<u64, &&Value> = records
        .iter()
        .map(|r| (r["args"]["correlation"].as_u64().unwrap(), *r))
        .collect();
    let mut starts: BTreeMap<u64, &Value> = BTreeMap::new();
    let mut ends: BTreeMap<u64, &Value> = BTreeMap::new();
    for e in events.iter().filter(|e| e["cat"] == "ac2g") {
        let id = e["id"].as_u64().unwrap();
        let slot = match e["ph"].as_str() {
            Some("s") => &mut starts,
            Some("f") => &mut ends,
            other => panic!("ac2g phase {other:?}"),
        };
        assert!(
            slot.insert(id, e).is_none(),
            "flow {id} has two {} events",
            e["ph"]
        );
    }
    assert!(starts.len() > 1000);
    assert_eq!(
        starts.keys().collect::<Vec<_>>(),
        ends.keys().collect::<Vec<_>>(),
        "every launch flow has both ends"
    );
    for (id, s) in &starts {
        let call = call_by_corr[id];
        assert_eq!(track(s), track(call));
        assert!((f(s, "ts") - f(call, "ts")).abs() < 1e-3);
        let end = ends[id];
        let rec = record_by_corr[id];
        assert_eq!(track(end), track(rec));
        assert!((f(end, "ts") - f(rec, "ts")).abs() < 1e-3);
    }
}
