//! Breakdown numbers against values computed independently from the trace text.

mod common;

use std::collections::BTreeMap;

use common::*;
use dflash_analyze::synth::SynthSpec;
use serde_json::Value;

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let h = (v.len() - 1) as f64 * q;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    v[lo] + (h - lo as f64) * (v[hi] - v[lo])
}

#[test]
fn section_numbers_match_an_independent_computation() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        steps: 12,
        seed: 5,
        ..SynthSpec::default()
    };
    let dir = run_dir(tmp.path(), "a", &spec);

    // Independent: parse the whole file with serde_json, group by hand.
    let text = std::fs::read_to_string(dir.join("trace.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let steps: Vec<(f64, f64)> = events
        .iter()
        .filter(|e| {
            e["name"]
                .as_str()
                .unwrap_or("")
                .starts_with("ProfilerStep#")
        })
        .map(|e| (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap()))
        .collect();
    let step_total: f64 = steps.iter().map(|s| s.1).sum();
    let mut groups: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let cat = e["cat"].as_str().unwrap();
        let kind = match cat {
            "cpu" | "queue" => "cpu",
            "gpu" => "gpu",
            _ => continue,
        };
        groups
            .entry((e["name"].as_str().unwrap().to_string(), kind.to_string()))
            .or_default()
            .push(e["dur"].as_f64().unwrap());
    }

    let got = json_of(bin().args(["breakdown", "--json"]).arg(&dir));
    let sections = got["sections"].as_array().unwrap();
    assert_eq!(sections.len(), groups.len());
    for s in sections {
        let key = (
            s["name"].as_str().unwrap().to_string(),
            s["kind"].as_str().unwrap().to_string(),
        );
        let mut d = groups[&key].clone();
        let total: f64 = d.iter().sum();
        let close = |field: &str, want: f64| {
            let v = s[field].as_f64().unwrap();
            assert!(
                (v - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{key:?} {field}: {v} != {want}"
            );
        };
        assert_eq!(s["count"].as_u64().unwrap(), d.len() as u64, "{key:?}");
        close("total_us", total);
        close("mean_us", total / d.len() as f64);
        close("p50_us", quantile(&mut d, 0.5));
        close("p95_us", quantile(&mut d, 0.95));
        // Every synthetic span lies inside a step.
        close("share", total / step_total);
    }
    assert_eq!(got["steps"]["count"].as_u64().unwrap(), 12);
    let tokens: f64 = 4096.0 * 12.0;
    let tps = got["steps"]["tokens_per_s"].as_f64().unwrap();
    assert!((tps - tokens / (step_total / 1e6)).abs() < 1e-6 * tps);

    // Self time of drafter.layer.0 = its duration minus attn and mlp.
    let layer = sections
        .iter()
        .find(|s| s["name"] == "drafter.layer.0" && s["kind"] == "cpu")
        .unwrap();
    let children: f64 = ["drafter.layer.0.attn", "drafter.layer.0.mlp"]
        .iter()
        .map(|n| {
            groups[&(n.to_string(), "cpu".to_string())]
                .iter()
                .sum::<f64>()
        })
        .sum();
    let want = layer["total_us"].as_f64().unwrap() - children;
    assert!((layer["self_us"].as_f64().unwrap() - want).abs() < 1e-6 * want.max(1.0));
}

#[test]
fn findings_tell_the_story() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), "a", &SynthSpec::default());
    let got = json_of(bin().args(["breakdown", "--json"]).arg(&dir));
    let texts: Vec<&str> = got["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["text"].as_str().unwrap())
        .collect();
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("drafter waits on the queue")
                && t.contains("target side is the bottleneck")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("target.forward CPU time is 3.0x its GPU time: launch-bound")),
        "{texts:?}"
    );
    let q = got["queue"].as_array().unwrap();
    assert!(q.iter().any(|s| s["name"] == "queue.get"));
}

#[test]
fn kineto_cpu_trace_loads_with_expected_kinds() {
    let got = json_of(
        bin()
            .args(["breakdown", "--json"])
            .arg(fixture("kineto_cpu.json.gz")),
    );
    assert_eq!(got["producer"], "kineto");
    assert_eq!(got["steps"]["count"].as_u64().unwrap(), 6);
    let sections = got["sections"].as_array().unwrap();
    for name in [
        "model.forward",
        "model.loss",
        "model.backward",
        "model.optimizer",
    ] {
        let s = sections
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("{name}"));
        assert_eq!(s["kind"], "cpu");
        assert_eq!(s["count"].as_u64().unwrap(), 6, "{name}");
    }
    // cpu_op events are ops, not sections.
    assert!(sections
        .iter()
        .all(|s| !s["name"].as_str().unwrap().starts_with("aten::")));
}

#[test]
fn kineto_gpu_shaped_trace_has_gpu_sections_and_idle() {
    let got = json_of(
        bin()
            .args(["breakdown", "--json"])
            .arg(fixture("kineto_gpu_shaped.json")),
    );
    let sections = got["sections"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> = sections
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["kind"].as_str().unwrap()))
        .collect();
    for want in [
        ("model.forward", "cpu"),
        ("model.forward", "gpu"),
        ("model.backward", "cpu"),
        ("model.backward", "gpu"),
    ] {
        assert!(kinds.contains(&want), "{kinds:?}");
    }
    let steps = got["per_step"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    // Kernels of step 0: 40 + 60 + 120 + 80 us busy.
    let busy = steps[0]["gpu_busy_us"].as_f64().unwrap();
    assert!((busy - 300.0).abs() < 1e-6, "{busy}");
    let cg = got["cpu_gpu"].as_array().unwrap();
    assert!(cg.iter().any(|c| c["name"] == "model.forward"));
}
