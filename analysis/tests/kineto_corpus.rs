//! The analyzer on real PyTorch-profiler traces (`fixtures/traces/kineto/`, recorded on
//! a GPU host and on a CPU; see fixtures/traces/README.md): every file loads, what is
//! skipped is what the file holds, a file cut anywhere never panics, kernels are
//! attributed to sections as a brute-force search over the raw events says, the first
//! finding names the bound each trace was made with, and HTA's figures match the raw
//! events. Comparisons of runs made from these traces are in `kineto_compare.rs`.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use common::{fixture, gunzip};
use dflash_analyze::breakdown::breakdown;
use dflash_analyze::hta::{Hta, Memory};
use dflash_analyze::kernels::kernel_view;
use dflash_analyze::load::SkipReason;
use dflash_analyze::{load, LoadOptions};
use serde_json::Value;

fn corpus() -> Vec<PathBuf> {
    let dir = fixture("kineto");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "the corpus is in {}", dir.display());
    files
}

fn events(path: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&gunzip(path)).unwrap();
    v["traceEvents"].as_array().unwrap().clone()
}

fn opts() -> LoadOptions {
    LoadOptions {
        threads: 1,
        ..Default::default()
    }
}

#[test]
fn every_corpus_trace_loads_and_skips_only_unused_phases() {
    for path in corpus() {
        let t = load(&path, &opts()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let evs = events(&path);
        // Independently: the phases the analysis uses are X, C, M and the flow letters.
        let unused = evs
            .iter()
            .filter(|e| !matches!(e["ph"].as_str(), Some("X" | "C" | "M" | "s" | "t" | "f")))
            // Kineto's allocator records are read as counters.
            .filter(|e| !(e["ph"] == "i" && e["name"] == "[memory]"))
            .count() as u64;
        let skipped: BTreeMap<SkipReason, u64> = t
            .stats
            .skipped
            .iter()
            .map(|s| (s.reason, s.count))
            .collect();
        let want: BTreeMap<SkipReason, u64> = if unused > 0 {
            [(SkipReason::UnusedPhase, unused)].into()
        } else {
            BTreeMap::new()
        };
        assert_eq!(skipped, want, "{}", path.display());
        assert_eq!(t.stats.events, evs.len() as u64, "{}", path.display());
        let spans = evs.iter().filter(|e| e["ph"] == "X").count();
        assert_eq!(
            t.spans.height(),
            spans,
            "{}: every X event is a span",
            path.display()
        );
        assert!(
            !t.warnings
                .iter()
                .any(|w| matches!(w, dflash_analyze::warning::Warning::Skipped { .. })),
            "{}: {:?}",
            path.display(),
            t.warnings
        );
    }
}

#[test]
fn cupti_overhead_records_with_pid_minus_one_are_spans() {
    let path = fixture("kineto/h200-launch-bound.json.gz");
    let t = load(&path, &opts()).unwrap();
    let want = events(&path)
        .iter()
        .filter(|e| e["pid"] == -1 && e["ph"] == "X")
        .count();
    assert!(want > 0);
    let pids = t.spans.column("pid").unwrap().i64().unwrap().clone();
    let got = pids.iter().filter(|p| *p == Some(-1)).count();
    assert_eq!(got, want);
}

/// A tiny deterministic generator (xorshift), so the cut points are the same every run.
fn cuts(n: usize, len: usize, seed: u64) -> Vec<usize> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % len as u64) as usize
        })
        .collect()
}

#[test]
fn a_corpus_trace_cut_at_100_random_offsets_never_panics() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, seed) in [("h200-peer-compiled", 7), ("h200-two-streams", 11)] {
        let gz_path = fixture(&format!("kineto/{name}.json.gz"));
        let json = gunzip(&gz_path);
        let gz = std::fs::read(&gz_path).unwrap();
        for (k, at) in cuts(50, json.len(), seed).into_iter().enumerate() {
            let p = tmp.path().join(format!("{name}-{k}.json"));
            std::fs::write(&p, &json[..at]).unwrap();
            // Loads what is there, or says why not; a cut inside the events keeps some.
            if let Ok(t) = load(&p, &opts()) {
                assert!(t.stats.json_bytes <= at as u64);
            }
        }
        for (k, at) in cuts(50, gz.len(), seed + 1).into_iter().enumerate() {
            let p = tmp.path().join(format!("{name}-{k}.json.gz"));
            std::fs::write(&p, &gz[..at]).unwrap();
            let _ = load(&p, &opts());
        }
    }
}

/// Per section name: (kernels, kernel time) by brute force over the raw events. A kernel
/// goes to the runtime call with its correlation id; the call's owner track is its own
/// when a user annotation there encloses it, else the other thread of the process whose
/// innermost enclosing annotation is shortest; every annotation on the owner track that
/// encloses the call (and is not a ProfilerStep) gets the kernel.
fn brute_force(evs: &[Value]) -> (BTreeMap<String, (u64, f64)>, u64, u64) {
    let xs: Vec<&Value> = evs.iter().filter(|e| e["ph"] == "X").collect();
    let cat = |e: &Value| e["cat"].as_str().unwrap_or("").to_string();
    let f = |e: &Value, k: &str| e[k].as_f64().unwrap_or(0.0);
    let sections: Vec<&Value> = xs
        .iter()
        .copied()
        .filter(|e| {
            cat(e) == "user_annotation"
                && !e["name"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("ProfilerStep#")
        })
        .collect();
    let mut launches: HashMap<u64, &Value> = HashMap::new();
    for e in &xs {
        if matches!(cat(e).as_str(), "cuda_runtime" | "cuda_driver") {
            if let Some(c) = e["args"]["correlation"].as_u64() {
                launches.insert(c, e);
            }
        }
    }
    let encloses = |s: &Value, t: f64| f(s, "ts") <= t && t <= f(s, "ts") + f(s, "dur");
    let mut out: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    let (mut via, mut none) = (0, 0);
    for k in &xs {
        if !matches!(cat(k).as_str(), "kernel" | "gpu_memcpy" | "gpu_memset") {
            continue;
        }
        let Some(l) = k["args"]["correlation"]
            .as_u64()
            .and_then(|c| launches.get(&c))
        else {
            none += 1;
            continue;
        };
        let t = f(l, "ts");
        let own: Vec<&Value> = sections
            .iter()
            .copied()
            .filter(|s| s["pid"] == l["pid"] && s["tid"] == l["tid"] && encloses(s, t))
            .collect();
        let owners = if !own.is_empty() {
            own
        } else {
            let best = sections
                .iter()
                .copied()
                .filter(|s| s["pid"] == l["pid"] && s["tid"] != l["tid"] && encloses(s, t))
                .min_by(|a, b| f(a, "dur").total_cmp(&f(b, "dur")));
            match best {
                Some(b) => {
                    via += 1;
                    sections
                        .iter()
                        .copied()
                        .filter(|s| s["pid"] == b["pid"] && s["tid"] == b["tid"] && encloses(s, t))
                        .collect()
                }
                None => {
                    none += 1;
                    continue;
                }
            }
        };
        for s in owners {
            let e = out
                .entry(s["name"].as_str().unwrap().to_string())
                .or_default();
            e.0 += 1;
            e.1 += f(k, "dur");
        }
    }
    (out, via, none)
}

#[test]
fn kernels_are_attributed_as_a_brute_force_search_says() {
    let mut checked = 0;
    for path in corpus() {
        let evs = events(&path);
        let t = load(&path, &opts()).unwrap();
        let Some(v) = kernel_view(&t.spans).unwrap() else {
            assert!(
                !evs.iter().any(|e| e["cat"] == "kernel"),
                "{}",
                path.display()
            );
            continue;
        };
        let (want, via, none) = brute_force(&evs);
        let got: BTreeMap<String, (u64, f64)> = v
            .sections
            .iter()
            .filter(|s| s.kernels > 0)
            .map(|s| (s.name.clone(), (s.kernels, s.kernel_us)))
            .collect();
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{}",
            path.display()
        );
        for (name, (n, us)) in &want {
            let (gn, gus) = got[name];
            assert_eq!(gn, *n, "{}: {name}", path.display());
            assert!(
                (gus - us).abs() < 1e-6 * us.max(1.0),
                "{}: {name}: {gus} vs {us}",
                path.display()
            );
        }
        assert_eq!(
            (v.via_waiting_thread, v.unattributed),
            (via, none),
            "{}",
            path.display()
        );
        let kernels = evs
            .iter()
            .filter(|e| {
                matches!(
                    e["cat"].as_str(),
                    Some("kernel" | "gpu_memcpy" | "gpu_memset")
                )
            })
            .count() as u64;
        assert_eq!(v.kernels, kernels);
        checked += 1;
    }
    assert!(checked >= 9, "{checked} traces with kernels");
}

#[test]
fn autograds_thread_launches_go_to_the_waiting_section() {
    // The MLP's backward runs on autograd's thread: its kernels belong to model.backward
    // (or whatever the training loop called the section around loss.backward()).
    let t = load(&fixture("kineto/h200-mlp-train.json.gz"), &opts()).unwrap();
    let v = kernel_view(&t.spans).unwrap().unwrap();
    assert!(v.via_waiting_thread > 0, "{v:?}");
    let back = v
        .sections
        .iter()
        .find(|s| s.name.contains("backward"))
        .unwrap_or_else(|| panic!("{:?}", v.sections));
    assert!(back.kernels > 0 && back.launches > 0, "{back:?}");
}

#[test]
fn a_compiled_trace_without_sections_still_breaks_down() {
    let t = load(&fixture("kineto/h200-peer-compiled.json.gz"), &opts()).unwrap();
    let b = breakdown(&t).unwrap();
    let v = b.kernels.as_ref().unwrap();
    assert!(v.by_name.len() > 20, "{}", v.by_name.len());
    let names: Vec<&str> = b.sections.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.iter().any(|n| n.starts_with("Torch-Compiled Region")),
        "{names:?}"
    );
}

/// Per-step evidence from the raw events, independent of the analyzer: step count and
/// CPU step time, and host time by call name.
struct Evidence {
    steps: f64,
    step_us: f64,
    calls: HashMap<String, (u64, f64)>,
}

fn evidence(evs: &[Value]) -> Evidence {
    let mut e = Evidence {
        steps: 0.0,
        step_us: 0.0,
        calls: HashMap::new(),
    };
    for x in evs.iter().filter(|x| x["ph"] == "X") {
        let name = x["name"].as_str().unwrap_or("");
        let dur = x["dur"].as_f64().unwrap_or(0.0);
        match x["cat"].as_str() {
            Some("user_annotation") if name.starts_with("ProfilerStep#") => {
                e.steps += 1.0;
                e.step_us += dur;
            }
            Some("cuda_runtime" | "cuda_driver") => {
                let c = e.calls.entry(name.to_string()).or_default();
                c.0 += 1;
                c.1 += dur;
            }
            _ => {}
        }
    }
    e
}

#[test]
fn the_first_finding_names_the_bound_each_corpus_trace_was_made_with() {
    for (name, rule) in [
        ("h200-gpu-bound", "gpu_bound"),
        ("h200-two-streams", "gpu_bound"),
        ("h200-launch-bound", "launch_bound"),
        ("h200-sync-bound", "sync_bound"),
        ("h200-alloc-bound", "allocator_bound"),
        ("h200-input-bound", "input_bound"),
    ] {
        let path = fixture(&format!("kineto/{name}.json.gz"));
        let b = breakdown(&load(&path, &opts()).unwrap()).unwrap();
        let first = &b.findings[0];
        assert_eq!(first.rule, rule, "{name}: {}", first.text);
        // The evidence the finding gives holds in the raw events.
        let e = evidence(&events(&path));
        let calls = |f: &dyn Fn(&str) -> bool| -> (f64, f64) {
            e.calls
                .iter()
                .filter(|(n, _)| f(n))
                .fold((0.0, 0.0), |a, (_, c)| (a.0 + c.0 as f64, a.1 + c.1))
        };
        match rule {
            "launch_bound" => {
                let (_, us) = calls(&|n| n.contains("Launch"));
                assert!(
                    us / e.step_us >= 0.3,
                    "{name}: launches {us} us of {}",
                    e.step_us
                );
            }
            "sync_bound" => {
                let (n, _) = calls(&|n| n.ends_with("Synchronize"));
                assert!(
                    n / e.steps >= 20.0,
                    "{name}: {n} syncs in {} steps",
                    e.steps
                );
            }
            "allocator_bound" => {
                let (_, us) = calls(&|n| n == "cudaMalloc" || n == "cudaFree");
                assert!(us / e.step_us >= 0.15, "{name}: {us} us of {}", e.step_us);
            }
            "input_bound" => assert!(first.text.contains("data.next"), "{}", first.text),
            _ => {}
        }
        // Never contradicted by another finding.
        let idle = b.findings.iter().any(|f| f.rule == "gpu_idle");
        assert!(!(rule == "gpu_bound" && idle), "{name}: {:?}", b.findings);
    }
}

#[test]
fn the_drafters_gpu_stream_bounds_a_pipelined_run_whose_target_cpu_span_is_long() {
    // Recorded by dflash on an H200: target.forward spans 88% of the step on the CPU, yet
    // the drafter never waits for input and its GPU sections fill the step.
    let t = load(&fixture("h200-realistic-perf.json.gz"), &opts()).unwrap();
    let b = breakdown(&t).unwrap();
    let target_cpu = b
        .sections
        .iter()
        .find(|s| s.name == "target.forward" && s.kind == chrome_trace_format::Clock::Cpu)
        .unwrap();
    assert!(target_cpu.share > 0.8);
    let first = &b.findings[0];
    assert_eq!(
        (first.rule, first.subject.as_deref()),
        ("gpu_bound", Some("drafter")),
        "{}",
        first.text
    );
}

/// A number field of a raw event.
fn field(e: &Value, k: &str) -> f64 {
    e[k].as_f64().unwrap()
}

/// The correlation id of a kernel or a launch.
fn correlation(e: &Value) -> u64 {
    e["args"]["correlation"].as_u64().unwrap()
}

#[test]
fn hta_figures_match_the_raw_events() {
    for name in [
        "h200-two-streams",
        "h200-sync-bound",
        "h200-peer-eager-rich",
    ] {
        let path = fixture(&format!("kineto/{name}.json.gz"));
        let evs = events(&path);
        let t = load(&path, &opts()).unwrap();
        let b = breakdown(&t).unwrap();
        let h = &b.kernels.as_ref().unwrap().hta;
        let kernels: Vec<&Value> = evs
            .iter()
            .filter(|e| {
                matches!(
                    e["cat"].as_str(),
                    Some("kernel" | "gpu_memcpy" | "gpu_memset")
                )
            })
            .collect();
        let launch: HashMap<u64, &Value> = evs
            .iter()
            .filter(|e| matches!(e["cat"].as_str(), Some("cuda_runtime" | "cuda_driver")))
            .filter_map(|e| Some((e["args"]["correlation"].as_u64()?, e)))
            .collect();
        temporal_matches(name, h, &kernels);
        streams_match(name, h, &kernels, &launch);
        launch_delay_matches(name, h, &kernels, &launch);
        memory_matches(name, &evs, b.memory.as_ref());
    }
}

/// Idle time of the device: its window minus the union of kernels, by a sweep over 1 us
/// cells (coarse, hence the tolerance).
fn temporal_matches(name: &str, h: &Hta, kernels: &[&Value]) {
    let start = kernels
        .iter()
        .map(|e| field(e, "ts"))
        .fold(f64::MAX, f64::min);
    let end = kernels
        .iter()
        .map(|e| field(e, "ts") + field(e, "dur"))
        .fold(f64::MIN, f64::max);
    let cells = (end - start).ceil() as usize + 1;
    let mut busy = vec![false; cells];
    for e in kernels {
        let (a, z) = (
            field(e, "ts") - start,
            field(e, "ts") + field(e, "dur") - start,
        );
        for cell in busy
            .iter_mut()
            .take(z.floor() as usize)
            .skip(a.ceil() as usize)
        {
            *cell = true;
        }
    }
    let idle_cells = busy.iter().filter(|b| !**b).count() as f64;
    let tp = &h.temporal[0];
    assert!(
        (tp.window_us - (end - start)).abs() < 1e-6,
        "{name}: {tp:?}"
    );
    assert!(
        (tp.idle_us - idle_cells).abs() <= 2.0 * kernels.len() as f64 + 2.0,
        "{name}: idle {} vs {idle_cells}",
        tp.idle_us
    );
    assert!((tp.compute_us + tp.non_compute_us + tp.idle_us - tp.window_us).abs() < 1e-6);
}

/// Gaps per stream add up to the idle breakdown of that stream; the queue length peaks
/// where a brute-force count says.
fn streams_match(name: &str, h: &Hta, kernels: &[&Value], launch: &HashMap<u64, &Value>) {
    let mut streams: BTreeMap<i64, Vec<&Value>> = BTreeMap::new();
    for e in kernels {
        streams
            .entry(e["tid"].as_i64().unwrap())
            .or_default()
            .push(e);
    }
    for (tid, mut ks) in streams {
        ks.sort_by(|a, b| field(a, "ts").total_cmp(&field(b, "ts")));
        let (mut gaps, mut host, mut prev) = (0.0, 0.0, f64::MIN);
        let mut queue_max = 0;
        for k in &ks {
            let gap = field(k, "ts") - prev;
            if prev > f64::MIN && gap > 0.0 {
                gaps += gap;
                if launch
                    .get(&correlation(k))
                    .is_some_and(|l| field(l, "ts") >= prev)
                {
                    host += gap;
                }
            }
            prev = prev.max(field(k, "ts") + field(k, "dur"));
            // Queue length just after this kernel's launch, by brute force.
            if let Some(l) = launch.get(&correlation(k)) {
                let t = field(l, "ts");
                let n = ks
                    .iter()
                    .filter(|o| {
                        launch
                            .get(&correlation(o))
                            .is_some_and(|ol| field(ol, "ts") <= t)
                            && field(o, "ts") + field(o, "dur") > t
                    })
                    .count();
                queue_max = queue_max.max(n);
            }
        }
        let row = h.idle.iter().find(|r| r.tid == tid).unwrap();
        let sum = row.host_wait_us + row.kernel_wait_us + row.other_us;
        assert!(
            (sum - gaps).abs() < 1e-6 * gaps.max(1.0),
            "{name} stream {tid}: {row:?} vs {gaps}"
        );
        assert!(
            (row.host_wait_us - host).abs() < 1e-6 * host.max(1.0),
            "{name} stream {tid}"
        );
        let q = h.queues.iter().find(|q| q.tid == tid).unwrap();
        assert_eq!(q.max as usize, queue_max, "{name} stream {tid}");
    }
}

/// Launch delay median, independently.
fn launch_delay_matches(name: &str, h: &Hta, kernels: &[&Value], launch: &HashMap<u64, &Value>) {
    let mut delays: Vec<f64> = kernels
        .iter()
        .filter_map(|k| Some(field(k, "ts") - field(launch.get(&correlation(k))?, "ts")))
        .collect();
    delays.sort_by(f64::total_cmp);
    let n = delays.len();
    let med = if n % 2 == 1 {
        delays[n / 2]
    } else {
        (delays[n / 2 - 1] + delays[n / 2]) / 2.0
    };
    assert!((h.launches.delay_p50_us - med).abs() < 1e-6, "{name}");
}

/// The memory timeline, where the trace records the allocator.
fn memory_matches(name: &str, evs: &[Value], memory: Option<&Memory>) {
    let peak = evs
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"] == "[memory]")
        .filter_map(|e| e["args"]["Total Allocated"].as_f64())
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
    match (peak, memory) {
        (Some(p), Some(m)) => assert_eq!(m.peak_allocated_bytes, p, "{name}"),
        (None, None) => {}
        other => panic!("{name}: {other:?}"),
    }
}
