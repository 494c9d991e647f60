//! The two recorded H200 traces differ in one known way (256 vs 512 anchors per
//! sequence, everything else equal; see docs/gpu-results.md): `compare` must flag the
//! sections whose work scales with the anchor count and leave the optimizer alone, whose
//! work depends only on the drafter's size.
use std::path::Path;
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

#[test]
fn compare_reports_the_anchor_count_difference_of_two_gpu_runs() {
    let traces = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/traces");
    let out = Command::cargo_bin("dflash-analyze")
        .unwrap()
        .args(["compare", "--json"])
        .arg(traces.join("h200-anchors256.json.gz"))
        .arg(traces.join("h200-anchors512.json.gz"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
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
