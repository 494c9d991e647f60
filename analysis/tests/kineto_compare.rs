//! Comparisons of runs made from the real PyTorch-profiler traces
//! (`fixtures/traces/kineto/`): a corpus trace repeated into runs of several steps, one
//! run with every host-side event slower, one with some kernels slower on top; the
//! comparison names the slower host once and the kernels that moved.

mod common;

use common::{fixture, gunzip};
use dflash_analyze::{load, LoadOptions};
use serde_json::Value;

fn opts() -> LoadOptions {
    LoadOptions {
        threads: 1,
        ..Default::default()
    }
}

/// `copies` copies of a corpus trace one after another (steps renumbered, ids offset),
/// each copy's durations jittered a little; `host` scales the time of every host-side
/// event (and its place within its copy), `kernel` scales the kernels whose name
/// contains the given text.
fn repeated(name: &str, copies: usize, host: f64, kernel: Option<(&str, f64)>) -> Value {
    let path = fixture(&format!("kineto/{name}.json.gz"));
    let doc: Value = serde_json::from_slice(&gunzip(&path)).unwrap();
    let evs = doc["traceEvents"].as_array().unwrap();
    let f = |e: &Value, k: &str| e[k].as_f64();
    let t0 = evs
        .iter()
        .filter_map(|e| f(e, "ts"))
        .fold(f64::MAX, f64::min);
    let t1 = evs
        .iter()
        .filter_map(|e| Some(f(e, "ts")? + f(e, "dur").unwrap_or(0.0)))
        .fold(f64::MIN, f64::max);
    let period = (t1 - t0) * host.max(1.0) * 1.1;
    let device = |e: &Value| {
        matches!(
            e["cat"].as_str(),
            Some("kernel" | "gpu_memcpy" | "gpu_memset" | "gpu_user_annotation")
        )
    };
    let mut out = Vec::new();
    for k in 0..copies {
        let jitter = 1.0 + 0.02 * ((k as f64) * 1.7).sin();
        for e in evs {
            if k > 0 && e["ph"] == "M" {
                continue;
            }
            let mut e = e.clone();
            let scale = if device(&e) { 1.0 } else { host };
            if let Some(ts) = f(&e, "ts") {
                e["ts"] = (t0 + (ts - t0) * scale + k as f64 * period).into();
            }
            if let Some(d) = f(&e, "dur") {
                let mut d = d * scale * jitter;
                if let Some((pat, by)) = kernel {
                    if e["cat"] == "kernel" && e["name"].as_str().unwrap_or("").contains(pat) {
                        d *= by;
                    }
                }
                e["dur"] = d.into();
            }
            if let Some(n) = e["name"]
                .as_str()
                .and_then(|n| n.strip_prefix("ProfilerStep#"))
            {
                let n: u64 = n.parse().unwrap();
                e["name"] = format!("ProfilerStep#{}", n + 100 * k as u64).into();
            }
            if let Some(c) = e["args"]["correlation"].as_u64() {
                e["args"]["correlation"] = (c + 10_000_000 * k as u64).into();
            }
            if let (Some(id), Some("s" | "f")) = (e["id"].as_u64(), e["ph"].as_str()) {
                e["id"] = (id + 10_000_000 * k as u64).into();
            }
            out.push(e);
        }
    }
    let mut doc = doc.clone();
    doc["traceEvents"] = Value::Array(out);
    doc
}

fn compare_of(a: &Value, b: &Value) -> dflash_analyze::compare::Comparison {
    let tmp = tempfile::tempdir().unwrap();
    let (pa, pb) = (tmp.path().join("a.json"), tmp.path().join("b.json"));
    std::fs::write(&pa, serde_json::to_vec(a).unwrap()).unwrap();
    std::fs::write(&pb, serde_json::to_vec(b).unwrap()).unwrap();
    let (ta, tb) = (load(&pa, &opts()).unwrap(), load(&pb, &opts()).unwrap());
    dflash_analyze::compare::compare(&ta, &tb, &Default::default())
        .unwrap()
        .0
}

#[test]
fn a_slower_host_is_one_verdict_and_a_kernel_regression_on_top_is_found() {
    let a = repeated("h200-mlp-train", 4, 1.0, None);
    // The host 1.5x slower on every CPU-side event, the GPU's kernels unchanged.
    let c = compare_of(&a, &repeated("h200-mlp-train", 4, 1.5, None));
    let h = c.host_shift.as_ref().expect("a host shift");
    assert!((h.factor - 1.5).abs() < 0.1, "{h:?}");
    assert_eq!(c.regressions, 0, "{:#?}", c.summary);
    let k = c.kernels.as_ref().unwrap();
    assert!(!k.changed && k.moved.is_empty(), "{k:?}");
    // The step's wall time is judged too (Kineto's steps enclose no section of their own):
    // 1.5x, a change the slower host explains.
    let step = c
        .sections
        .iter()
        .find(|s| s.name == dflash_analyze::compare::STEP_SECTION)
        .expect("the step as a section");
    assert!((step.ratio.unwrap() - 1.5).abs() < 0.1, "{step:?}");
    assert!(step.explained_by_host, "{step:?}");
    assert!(
        c.summary
            .iter()
            .any(|l| l.contains("the whole host ran slower (x1.5")
                && l.contains("kernel time unchanged")),
        "{:#?}",
        c.summary
    );
    // The same, with the GEMM kernels 40% slower as well.
    let c = compare_of(&a, &repeated("h200-mlp-train", 4, 1.5, Some(("gemm", 1.4))));
    assert!(c.host_shift.is_some());
    let k = c.kernels.as_ref().unwrap();
    assert!(k.changed, "{k:?}");
    assert!(
        !k.moved.is_empty() && k.moved.iter().all(|m| m.name.contains("gemm")),
        "{k:?}"
    );
    // The per-step kernel busy time is no section regression here: the three steps of a
    // copy differ so much that four copies leave its interval across 1. (This used to
    // count one regression: `model.backward`'s GPU annotation, 0.7 -> 1.0 us a step, a
    // change far below `min_effect` of the step.)
    assert_eq!(c.regressions, 0, "{:#?}", c.summary);
    let tiny = c
        .sections
        .iter()
        .find(|s| s.name == "model.backward" && s.kind == "gpu")
        .unwrap();
    assert!(
        tiny.negligible && tiny.verdict == dflash_analyze::compare::Verdict::Unchanged,
        "{tiny:?}"
    );
    assert!(
        c.sections
            .iter()
            .filter(
                |s| s.side.is_some() && s.verdict == dflash_analyze::compare::Verdict::Regression
            )
            .all(|s| s.side == Some("device")),
        "{:#?}",
        c.sections
    );
}
