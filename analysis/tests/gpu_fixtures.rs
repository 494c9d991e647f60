//! `compare` on recorded GPU traces. The two H200 traces differ in one known way (256 vs
//! 512 anchors per sequence, everything else equal; see docs/gpu-results.md): `compare`
//! must flag the sections whose work scales with the anchor count and leave the optimizer
//! alone, whose work depends only on the drafter's size. The H100 traces are two runs of
//! one build (a real null pair) and a run of a build with a faster loss pass.
use std::path::Path;
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

/// `dflash-analyze ARGS FIXTURES...` (trace files under fixtures/traces), which must
/// succeed; its JSON output.
fn analyze_json(args: &[&str], fixtures: &[&str]) -> Value {
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/traces");
    let out = Command::cargo_bin("dflash-analyze")
        .unwrap()
        .args(args)
        .args(fixtures.iter().map(|f| traces.join(f)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn compare_reports_the_anchor_count_difference_of_two_gpu_runs() {
    let report = analyze_json(
        &["compare", "--json"],
        &["h200-anchors256.json.gz", "h200-anchors512.json.gz"],
    );
    let verdict = |name: &str, kind: &str| -> (String, f64) {
        let s = report["sections"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name && s["kind"] == kind)
            .unwrap_or_else(|| panic!("no section {name} ({kind})"));
        (
            s["verdict"].as_str().unwrap().to_string(),
            s["ratio"].as_f64().unwrap(),
        )
    };
    // twice the query tokens: attention, mask, lm_head and backward about double
    for name in [
        "drafter.layer.0.attn",
        "drafter.mask",
        "drafter.lm_head_loss",
        "drafter.backward",
        "drafter.step",
    ] {
        let kind = if name == "drafter.step" { "cpu" } else { "gpu" };
        let (v, r) = verdict(name, kind);
        assert_eq!(v, "regression", "{name} ({kind}) ratio {r}");
        assert!((1.6..3.0).contains(&r), "{name} ratio {r}");
    }
    // the optimizer updates the same parameters in both runs
    let (v, r) = verdict("drafter.optimizer", "gpu");
    assert_eq!(v, "unchanged", "optimizer ratio {r}");
    let (a, b) = (
        report["tokens_per_s_a"].as_f64().unwrap(),
        report["tokens_per_s_b"].as_f64().unwrap(),
    );
    assert!(b < 0.6 * a, "throughput {a} -> {b}");
}

#[test]
fn a_streams_busy_time_per_step_counts_only_the_work_the_steps_launched() {
    // The kernel fixture (one H100, 3 complete drafter steps of 36 ms) holds kernels
    // from before and after its steps: the target stream works ahead of the drafter. Per
    // step, a stream cannot be busy longer than the step; counted over the whole trace
    // the drafter's stream would be 81 ms "per step". Counted by hand over the kernels
    // each step launched (docs/gpu-results.md): drafter stream 32.4 ms, target 14.3 ms.
    let b = analyze_json(&["breakdown", "--json"], &["h100-kernels.json.gz"]);
    let steps = b["steps"]["count"].as_f64().unwrap();
    let step_us = b["steps"]["mean_us"].as_f64().unwrap();
    let per_step: Vec<f64> = b["kernels"]["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step_busy_us"].as_f64().unwrap() / steps)
        .collect();
    assert_eq!(per_step.len(), 2);
    for us in &per_step {
        assert!(*us <= step_us, "{us} us busy per {step_us} us step");
    }
    assert!((31_500.0..33_500.0).contains(&per_step[0]), "{per_step:?}");
    assert!((13_500.0..15_000.0).contains(&per_step[1]), "{per_step:?}");
    let text = b["findings"][0]["text"].as_str().unwrap();
    assert!(text.contains("stream 2 32.39 ms"), "{text}");
}

/// `compare --json --fail-on-regression A B`: it must exit 0 (no regression).
fn compare_json(a: &str, b: &str) -> Value {
    analyze_json(&["compare", "--json", "--fail-on-regression"], &[a, b])
}

fn changed(report: &Value) -> Vec<(String, String, String)> {
    report["sections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["verdict"] == "regression" || s["verdict"] == "improvement")
        .filter(|s| s["host_slack"] == false && s["explained_by_host"] == false)
        .map(|s| {
            let f = |k: &str| s[k].as_str().unwrap().to_string();
            (f("name"), f("kind"), f("verdict"))
        })
        .collect()
}

/// Two runs of one build on one GPU, one after the other: the drafter is GPU-bound and
/// its host waits for the GPU somewhere each step, in a different section from run to
/// run (`drafter.metrics` 5.1 vs 7.4 ms at the median, the launching sections 0.6-0.8x).
/// None of that is a change of the step; nor are the small GPU spans that share the GPU
/// with the target's kernels.
#[test]
fn a_real_null_pair_flags_nothing() {
    let r = compare_json("h100-head-1.json.gz", "h100-head-2.json.gz");
    assert_eq!(changed(&r), vec![], "{:#?}", r["summary"]);
    assert_eq!(r["regressions"], 0);
    assert_eq!(r["improvements"], 0);
    assert_eq!(r["gpu_bound"], "drafter");
    // The CPU sections did move, significantly: reported once, as host slack.
    let slack = r["sections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["host_slack"] == true && s["verdict"] != "unchanged")
        .count();
    assert!(slack >= 5, "{slack}");
    assert!(
        r["summary"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("both runs are GPU-bound")),
        "{:#?}",
        r["summary"]
    );
}

/// The faster loss pass (its `softmax_xent` kernel 1.71 -> 1.16 ms a step in the kernel
/// trace of the same call) is found, and nothing regresses.
#[test]
fn a_real_improvement_is_found_alone() {
    let r = compare_json("h100-head-1.json.gz", "h100-xent-1.json.gz");
    let c = changed(&r);
    assert!(
        c.contains(&(
            "drafter.lm_head_loss".into(),
            "gpu".into(),
            "improvement".into()
        )),
        "{c:?}"
    );
    assert!(c.iter().all(|x| x.2 == "improvement"), "{c:?}");
    assert_eq!(r["regressions"], 0);
    let loss = r["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "drafter.lm_head_loss" && s["kind"] == "gpu")
        .unwrap();
    let ratio = loss["ratio"].as_f64().unwrap();
    assert!((0.85..0.95).contains(&ratio), "{ratio}");
}
