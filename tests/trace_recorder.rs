//! Integration tests of the trace recorder: the file it writes is valid Chrome-trace JSON
//! per docs/trace-format.md (header, metadata, names, nesting per track, flows,
//! counters, escaping), survives being cut at any byte after a flush (and a `kill -9`),
//! and places mock-GPU spans inside their CPU step with matched flows.
//!
//! The recorder is process-global, so every test that starts one holds `LOCK`.
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use dflash::trace::{self, MockGpu, Recorder, RecorderConfig};
use serde_json::Value;

static LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn config(path: &Path) -> RecorderConfig {
    RecorderConfig {
        path: path.to_path_buf(),
        metadata: serde_json::json!({"producer": "test", "config": {"lr": 1e-4}}),
        process_name: "test trainer".into(),
        ..Default::default()
    }
}

/// Copies the trace to `$TRACE_TEST_OUT/<name>` when set, for checking by hand.
fn keep(path: &Path, name: &str) {
    if let Ok(dir) = std::env::var("TRACE_TEST_OUT") {
        let _ = std::fs::copy(path, Path::new(&dir).join(name));
    }
}

fn read(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).expect("trace file");
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        // A truncated gzip stream is read up to the cut.
        let _ = flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut out);
        out
    } else {
        raw
    }
}

fn parse(path: &Path) -> Value {
    serde_json::from_slice(&read(path)).expect("trace is valid JSON")
}

fn events(doc: &Value) -> &Vec<Value> {
    doc["traceEvents"].as_array().expect("traceEvents array")
}

fn ns(v: &Value) -> i64 {
    (v.as_f64().expect("number") * 1000.0).round() as i64
}

/// Lenient reader of a possibly truncated trace: the events of `traceEvents` that are
/// complete, each with the offset just past it.
fn lenient_events(bytes: &[u8]) -> Vec<(Value, usize)> {
    let key = b"\"traceEvents\":[";
    let Some(start) = bytes.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let mut pos = start + key.len();
    let mut out = Vec::new();
    loop {
        while pos < bytes.len() && (bytes[pos].is_ascii_whitespace() || bytes[pos] == b',') {
            pos += 1;
        }
        if pos >= bytes.len() || bytes[pos] == b']' {
            break;
        }
        let mut it = serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => {
                pos += it.byte_offset();
                out.push((v, pos));
            }
            _ => break,
        }
    }
    out
}

type Track = (i64, i64);

/// X events per (pid, tid) in file order.
fn tracks(evs: &[Value]) -> BTreeMap<Track, Vec<&Value>> {
    let mut m: BTreeMap<Track, Vec<&Value>> = BTreeMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        m.entry((e["pid"].as_i64().unwrap(), e["tid"].as_i64().unwrap()))
            .or_default()
            .push(e);
    }
    m
}

/// No two X events of a track partially overlap; ends are non-decreasing in file order.
fn assert_tracks_valid(evs: &[Value]) {
    for (key, list) in tracks(evs) {
        let mut last_end = i64::MIN;
        for e in &list {
            let end = ns(&e["ts"]) + ns(&e["dur"]);
            assert!(end >= last_end, "track {key:?}: ends go back at {e}");
            last_end = end;
        }
        let mut iv: Vec<(i64, i64, &Value)> = list
            .iter()
            .map(|e| (ns(&e["ts"]), ns(&e["ts"]) + ns(&e["dur"]), *e))
            .collect();
        iv.sort_by_key(|&(s, e, _)| (s, std::cmp::Reverse(e)));
        let mut stack: Vec<i64> = Vec::new();
        for (s, e, ev) in iv {
            while stack.last().is_some_and(|&top| top <= s) {
                stack.pop();
            }
            if let Some(&top) = stack.last() {
                assert!(
                    e <= top,
                    "track {key:?}: {ev} overlaps its parent (ends {top})"
                );
            }
            stack.push(e);
        }
    }
}

fn names_of(evs: &[Value], pid: i64) -> (Option<String>, HashMap<i64, String>) {
    let mut process = None;
    let mut threads = HashMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "M" && e["pid"] == pid) {
        let n = e["args"]["name"].as_str().map(String::from);
        match e["name"].as_str() {
            Some("process_name") => process = n,
            Some("thread_name") => {
                threads.insert(e["tid"].as_i64().unwrap(), n.unwrap_or_default());
            }
            _ => {}
        }
    }
    (process, threads)
}

fn x_named<'a>(evs: &'a [Value], name: &str) -> Vec<&'a Value> {
    evs.iter()
        .filter(|e| e["ph"] == "X" && e["name"] == name)
        .collect()
}

#[test]
fn cpu_trace_is_valid_json_with_names_nesting_counters_and_flows() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let rec = Recorder::start(config(&path)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<(u64, u64)>();
    let producer = std::thread::spawn(move || {
        trace::set_thread_name("target 0 cpu");
        let put = trace::intern("queue.put");
        let fwd = dflash::trace_name!("target.forward");
        let depth = trace::intern("queue");
        for batch in 0..5u64 {
            {
                let mut s = trace::span(fwd);
                s.arg("batch", batch);
                std::thread::sleep(Duration::from_micros(200));
            }
            let id = trace::next_flow_id();
            let mut q = trace::queue_span(put);
            q.flow_out(id);
            q.arg("depth", 1u64);
            trace::counter(depth, "depth", 1.0);
            tx.send((batch, id)).unwrap();
        }
    });
    // A flow's destination must not start before its source (Perfetto drops such
    // arrows), so the consumer here only starts once every put has begun.
    producer.join().unwrap();
    trace::set_thread_name("drafter cpu");
    let get = trace::intern("queue.get");
    let depth = trace::intern("queue");
    for step in 0..5u64 {
        let _step = trace::step_span(step);
        let (batch, id) = {
            let mut q = trace::queue_span(get);
            let (batch, id) = rx.recv().unwrap();
            q.flow_in(id);
            q.arg("batch", batch);
            q.arg("wait_us", 1.5f64);
            trace::counter(depth, "depth", 0.0);
            (batch, id)
        };
        assert_eq!(batch, step);
        assert!(id > 0);
        let mut s = trace::span(dflash::trace_name!("drafter.step"));
        s.arg("step", step);
        s.arg("loss", 2.5f64);
        for layer in 0..2 {
            let name = trace::intern(&format!("drafter.layer.{layer}"));
            let _l = trace::span(name);
            let _a = trace::span(trace::intern(&format!("drafter.layer.{layer}.attn")));
        }
    }
    let summary = rec.finish().unwrap();
    assert_eq!(summary.dropped_events, 0);
    keep(&path, "cpu.json");

    let text = String::from_utf8(read(&path)).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["schemaVersion"], 1);
    assert!(doc["baseTimeNanoseconds"].as_u64().unwrap() > 1_600_000_000_000_000_000);
    assert_eq!(doc["distributedInfo"]["rank"], 0);
    assert_eq!(doc["metadata"]["gpu_timing"], "none");
    assert_eq!(doc["metadata"]["producer"], "test");
    assert_eq!(doc["metadata"]["config"]["lr"], 1e-4);
    assert!(
        text.trim_end().ends_with("]}"),
        "traceEvents is the last key"
    );
    let evs = events(&doc);
    assert_tracks_valid(evs);

    // Names: the process and both threads.
    let pid = evs.iter().find(|e| e["ph"] == "X").unwrap()["pid"]
        .as_i64()
        .unwrap();
    let (process, threads) = names_of(evs, pid);
    assert_eq!(process.as_deref(), Some("test trainer"));
    let mut names: Vec<&String> = threads.values().collect();
    names.sort();
    assert!(names.contains(&&"drafter cpu".to_string()), "{names:?}");
    assert!(names.contains(&&"target 0 cpu".to_string()), "{names:?}");
    assert!(evs.iter().any(|e| e["name"] == "process_sort_index"));
    assert!(evs.iter().any(|e| e["name"] == "thread_sort_index"));
    // No GPU process on a CPU-only run.
    assert!(evs.iter().all(|e| e["cat"] != "gpu"));

    // Timestamps are relative µs with exactly 3 decimals.
    for line in text.lines().filter(|l| l.contains("\"ph\":\"X\"")) {
        let ts = line.split("\"ts\":").nth(1).unwrap();
        let num: String = ts
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        assert_eq!(num.split('.').nth(1).map(str::len), Some(3), "{line}");
    }

    // Steps enclose the drafter's work, the get comes before drafter.step.
    let steps = x_named(evs, "ProfilerStep#3");
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0]["cat"], "step");
    let (s0, s1) = (
        ns(&steps[0]["ts"]),
        ns(&steps[0]["ts"]) + ns(&steps[0]["dur"]),
    );
    let inside = |e: &Value| ns(&e["ts"]) >= s0 && ns(&e["ts"]) + ns(&e["dur"]) <= s1;
    let step3 = x_named(evs, "drafter.step")
        .into_iter()
        .find(|e| e["args"]["step"] == 3)
        .unwrap();
    assert!(inside(step3));
    assert_eq!(step3["args"]["loss"], 2.5);
    let get3 = x_named(evs, "queue.get")
        .into_iter()
        .find(|e| e["args"]["batch"] == 3)
        .unwrap();
    assert!(inside(get3) && ns(&get3["ts"]) + ns(&get3["dur"]) <= ns(&step3["ts"]));
    assert_eq!(get3["cat"], "queue");
    assert_eq!(x_named(evs, "drafter.layer.1.attn").len(), 5);

    // Flows: each put's flow_out meets exactly one get's flow_in, not earlier.
    let puts = x_named(evs, "queue.put");
    assert_eq!(puts.len(), 5);
    for p in puts {
        assert_eq!(p["flow_out"], true);
        let id = &p["bind_id"];
        let gets: Vec<_> = evs
            .iter()
            .filter(|e| &e["bind_id"] == id && e["flow_in"] == true)
            .collect();
        assert_eq!(gets.len(), 1, "flow {id}");
        assert!(ns(&gets[0]["ts"]) >= ns(&p["ts"]));
    }

    // Counters.
    let counters: Vec<_> = evs.iter().filter(|e| e["ph"] == "C").collect();
    assert_eq!(counters.len(), 10);
    assert!(counters
        .iter()
        .all(|c| c["name"] == "queue" && c["cat"] == "queue" && c["args"]["depth"].is_number()));
}

#[test]
fn nasty_strings_are_escaped_and_round_trip() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let nasty = "q\"uote \\back\\slash\nnew\rline\ttab \u{1} \u{1f} é 中 😀 </script>";
    let mut cfg = config(&path);
    cfg.metadata = serde_json::json!({"note": nasty, nasty: [nasty]});
    cfg.process_name = nasty.to_string();
    let rec = Recorder::start(cfg).unwrap();
    trace::set_thread_name(nasty);
    let name = trace::intern(nasty);
    {
        let mut s = trace::span(name);
        s.arg("k\"e\\y\n", -1i64);
        s.arg("f", f64::NAN);
    }
    trace::counter(name, "c\"nt", 4.0);
    rec.finish().unwrap();
    keep(&path, "nasty.json");
    let doc = parse(&path);
    assert_eq!(doc["metadata"]["note"], nasty);
    assert_eq!(doc["metadata"][nasty][0], nasty);
    let evs = events(&doc);
    let x = x_named(evs, nasty);
    assert_eq!(x.len(), 1);
    assert_eq!(x[0]["args"]["k\"e\\y\n"], -1);
    assert!(x[0]["args"]["f"].is_null(), "NaN has no JSON form");
    let pid = x[0]["pid"].as_i64().unwrap();
    let (process, threads) = names_of(evs, pid);
    assert_eq!(process.as_deref(), Some(nasty));
    assert_eq!(threads[&x[0]["tid"].as_i64().unwrap()], nasty);
    let c = evs.iter().find(|e| e["ph"] == "C").unwrap();
    assert_eq!(c["name"], nasty);
    assert_eq!(c["args"]["c\"nt"], 4.0);
}

#[test]
fn truncated_file_keeps_every_complete_event() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    for gzip in [false, true] {
        let path = dir
            .path()
            .join(if gzip { "trace.json.gz" } else { "trace.json" });
        let mut cfg = config(&path);
        cfg.gzip = gzip;
        let rec = Recorder::start(cfg).unwrap();
        let n = trace::intern("cut.section");
        for i in 0..300u64 {
            let _step = trace::step_span(i);
            let mut s = trace::span(n);
            s.arg("i", i);
            s.arg("x", i as f64 * 0.5);
            trace::counter(n, "v", i as f64);
        }
        rec.flush().unwrap();
        // As a `kill -9` right now would leave it: no closing `]}`.
        let bytes = read(&path);
        assert!(!bytes.ends_with(b"]}\n"));
        let all = lenient_events(&bytes);
        assert!(all.len() >= 900, "{} events after flush", all.len());
        assert_eq!(
            all.iter()
                .filter(|(e, _)| e["name"] == "cut.section")
                .count(),
            300 + 300
        );
        // Every byte of a window in the middle, and 300 cuts spread over the file
        // (from inside the header on).
        let mid = bytes.len() / 2;
        let spread = (0..=300).map(|i| all[0].1 - 200 + i * (bytes.len() - all[0].1 + 200) / 300);
        for cut in (mid..mid + 400).chain(spread) {
            let got = lenient_events(&bytes[..cut]);
            let want = all.iter().take_while(|(_, end)| *end <= cut).count();
            assert_eq!(got.len(), want, "cut at byte {cut}");
        }
        rec.finish().unwrap();
        let done = parse(&path);
        assert_eq!(events(&done).len(), all.len());
    }
}

/// Run as a child process by `killed_writer_leaves_a_readable_prefix`: records until
/// killed.
#[test]
fn child_records_until_killed() {
    let Ok(path) = std::env::var("TRACE_CHILD_PATH") else {
        return;
    };
    let mut cfg = config(Path::new(&path));
    cfg.flush_interval = Duration::from_millis(50);
    let _rec = Recorder::start(cfg).unwrap();
    let n = trace::intern("child.section");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0u64;
    while Instant::now() < deadline {
        let mut s = trace::span(n);
        s.arg("i", i);
        i += 1;
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn killed_writer_leaves_a_readable_prefix() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_records_until_killed", "--nocapture"])
        .env("TRACE_CHILD_PATH", &path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = 0;
    while Instant::now() < deadline && seen < 300 {
        std::thread::sleep(Duration::from_millis(50));
        seen = std::fs::read(&path)
            .map(|b| lenient_events(&b).len())
            .unwrap_or(0);
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(seen >= 300, "child wrote {seen} events");
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        serde_json::from_slice::<Value>(&bytes).is_err(),
        "cut inside traceEvents"
    );
    let evs = lenient_events(&bytes);
    assert!(evs.len() >= seen);
    let xs: Vec<Value> = evs.into_iter().map(|(e, _)| e).collect();
    assert_tracks_valid(&xs);
    // Every byte after the last complete event is an unfinished one.
    let last = lenient_events(&bytes).last().unwrap().1;
    assert!(bytes.len() - last < 4096);
}

#[test]
fn guard_dropped_out_of_order_keeps_the_track_nested() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let rec = Recorder::start(config(&path)).unwrap();
    let outer = trace::span(trace::intern("ooo.outer"));
    let inner = trace::span(trace::intern("ooo.inner"));
    std::thread::sleep(Duration::from_micros(300));
    drop(outer);
    std::thread::sleep(Duration::from_micros(300));
    drop(inner);
    rec.finish().unwrap();
    let doc = parse(&path);
    let evs = events(&doc);
    assert_tracks_valid(evs);
    let o = x_named(evs, "ooo.outer")[0];
    let i = x_named(evs, "ooo.inner")[0];
    assert_eq!(
        ns(&i["ts"]) + ns(&i["dur"]),
        ns(&o["ts"]) + ns(&o["dur"]),
        "inner cut at the outer's end"
    );
}

#[test]
fn inactive_window_records_nothing_and_stats_count() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let mut cfg = config(&path);
    cfg.active = false;
    let rec = Recorder::start(cfg).unwrap();
    assert!(matches!(
        Recorder::start(config(&dir.path().join("other.json"))),
        Err(trace::TraceError::AlreadyRunning)
    ));
    let n = trace::intern("window.section");
    drop(trace::span(n));
    assert!(!trace::enabled());
    rec.set_active(true);
    for _ in 0..3 {
        let _s = trace::span(n);
        std::thread::sleep(Duration::from_micros(50));
    }
    rec.set_active(false);
    drop(trace::span(n));
    rec.flush().unwrap();
    let stats = rec.stats_snapshot();
    let st = stats.get("window.section").expect("stats for the name");
    assert_eq!(st.count, 3);
    assert!(st.cpu_ns >= 150_000);
    assert!(!stats.summary_line(3).is_empty());
    // Since the last snapshot: nothing new.
    assert!(rec.stats_snapshot().get("window.section").is_none());
    rec.finish().unwrap();
    let doc = parse(&path);
    assert_eq!(x_named(events(&doc), "window.section").len(), 3);
}

#[test]
fn events_of_a_thread_that_exited_are_written() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let rec = Recorder::start(config(&path)).unwrap();
    std::thread::spawn(|| {
        trace::set_thread_name("short-lived");
        for _ in 0..10 {
            drop(trace::span(trace::intern("exited.section")));
        }
    })
    .join()
    .unwrap();
    rec.finish().unwrap();
    let doc = parse(&path);
    assert_eq!(x_named(events(&doc), "exited.section").len(), 10);
}

/// Steps of nested GPU spans on a mock GPU: returns the parsed trace.
fn run_mock_gpu(gpu: Arc<MockGpu>, path: &Path, steps: u64) -> Value {
    let mut cfg = config(path);
    cfg.gpu = Some(gpu.clone());
    cfg.metadata = serde_json::json!({});
    let rec = Recorder::start(cfg).unwrap();
    let worker = std::thread::spawn(move || {
        trace::set_thread_name("drafter cuda:0");
        MockGpu::set_current_stream(3);
        trace::bind_gpu(0, "drafter");
        let step_n = trace::intern("drafter.step");
        let fc = trace::intern("drafter.fc");
        let layer = trace::intern("drafter.layer.0");
        let attn = trace::intern("drafter.layer.0.attn");
        let mlp = trace::intern("drafter.layer.0.mlp");
        for step in 0..steps {
            let _s = trace::step_span(step);
            drop(trace::queue_span(trace::intern("queue.get")));
            let mut st = trace::gpu_span(step_n);
            st.arg("tokens", 128u64);
            drop(trace::gpu_span(fc));
            {
                let _l = trace::gpu_span(layer);
                drop(trace::gpu_span(attn));
                drop(trace::gpu_span(mlp));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    worker.join().unwrap();
    let summary = rec.finish().unwrap();
    assert_eq!(summary.gpu_spans_dropped, 0);
    assert_eq!(summary.gpu_spans, steps * 5);
    parse(path)
}

fn check_gpu_trace(doc: &Value, steps: u64) {
    assert_eq!(doc["metadata"]["gpu_timing"], "cuda-events");
    assert_eq!(doc["deviceProperties"][0]["name"], "Mock GPU");
    let evs = events(doc);
    assert_tracks_valid(evs);
    let gpu: Vec<&Value> = evs.iter().filter(|e| e["cat"] == "gpu").collect();
    assert_eq!(gpu.len() as u64, steps * 5);
    let (process, threads) = names_of(evs, 0);
    assert_eq!(process.as_deref(), Some("GPU 0"));
    assert_eq!(
        threads.get(&1).map(String::as_str),
        Some("stream 3 (drafter)")
    );
    let cpu_pid = evs.iter().find(|e| e["cat"] == "step").unwrap()["pid"].clone();
    for g in &gpu {
        assert_eq!(g["pid"], 0);
        assert_eq!(g["tid"], 1);
        assert_eq!(g["flow_in"], true);
        // Its CPU span: same flow, same name, flow_out, and not later.
        let cpu: Vec<&Value> = evs
            .iter()
            .filter(|e| e["bind_id"] == g["bind_id"] && e["flow_out"] == true)
            .collect();
        assert_eq!(cpu.len(), 1, "flow {} matched once", g["bind_id"]);
        let c = cpu[0];
        assert_eq!(c["name"], g["name"]);
        assert_eq!(c["cat"], "cpu");
        assert_eq!(c["pid"], cpu_pid);
        assert_eq!(ns(&g["args"]["cpu_ts"]), ns(&c["ts"]));
        assert!(
            ns(&g["ts"]) >= ns(&c["ts"]),
            "GPU span before its CPU span: {g}"
        );
        // args.step is the ProfilerStep whose CPU interval holds the CPU span.
        let step = g["args"]["step"].as_u64().expect("args.step");
        let ps = x_named(evs, &format!("ProfilerStep#{step}"))[0];
        assert!(ns(&c["ts"]) >= ns(&ps["ts"]));
        assert!(ns(&c["ts"]) + ns(&c["dur"]) <= ns(&ps["ts"]) + ns(&ps["dur"]));
    }
    // Nesting on the GPU track mirrors the CPU: attn and mlp inside layer.0 inside step.
    for step in 0..steps {
        let of = |name: &str| {
            gpu.iter()
                .find(|g| g["name"] == name && g["args"]["step"] == step)
                .map(|g| (ns(&g["ts"]), ns(&g["ts"]) + ns(&g["dur"])))
                .unwrap()
        };
        let (st, l, a, m, f) = (
            of("drafter.step"),
            of("drafter.layer.0"),
            of("drafter.layer.0.attn"),
            of("drafter.layer.0.mlp"),
            of("drafter.fc"),
        );
        for inner in [l, f] {
            assert!(inner.0 >= st.0 && inner.1 <= st.1, "step {step}");
        }
        for inner in [a, m] {
            assert!(inner.0 >= l.0 && inner.1 <= l.1, "step {step}");
        }
        assert!(f.1 <= l.0 && a.1 <= m.0, "siblings in order");
    }
    let tokens = gpu.iter().find(|g| g["name"] == "drafter.step").unwrap();
    assert_eq!(tokens["args"]["tokens"], 128);
}

#[test]
fn mock_gpu_spans_nest_inside_their_step_with_matched_flows() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let gpu = Arc::new(MockGpu::new(
        1,
        Duration::from_micros(30),
        Duration::from_micros(20),
    ));
    let doc = run_mock_gpu(gpu.clone(), &path, 6);
    keep(&path, "gpu.json");
    check_gpu_trace(&doc, 6);
    assert_eq!(gpu.outstanding(), 0, "every event went back to the pool");
}

#[test]
fn skewed_calibration_never_puts_gpu_before_cpu() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    // The calibration event claims a GPU time 3 ms later than when it completed: the
    // naive mapping would put every GPU span ~3 ms before its CPU span.
    let gpu = Arc::new(MockGpu::new(
        1,
        Duration::from_micros(5),
        Duration::from_micros(5),
    ));
    gpu.set_cal_skew(3_000_000);
    let doc = run_mock_gpu(gpu, &path, 4);
    check_gpu_trace(&doc, 4);
}

#[test]
fn gpu_spans_wait_for_a_busy_gpu_and_failures_degrade_to_cpu() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let gpu = Arc::new(MockGpu::new(
        1,
        Duration::from_micros(5),
        Duration::from_micros(5),
    ));
    let mut cfg = config(&path);
    cfg.gpu = Some(gpu.clone());
    let rec = Recorder::start(cfg).unwrap();
    trace::bind_gpu(0, "busy");
    gpu.hold(true);
    let n = trace::intern("busy.section");
    for _ in 0..3 {
        drop(trace::gpu_span(n));
    }
    rec.flush().unwrap();
    let early = lenient_events(&read(&path));
    assert_eq!(early.iter().filter(|(e, _)| e["cat"] == "gpu").count(), 0);
    assert_eq!(
        early
            .iter()
            .filter(|(e, _)| e["name"] == "busy.section")
            .count(),
        3
    );
    gpu.fail_records(true);
    drop(trace::gpu_span(trace::intern("failed.section")));
    gpu.fail_records(false);
    gpu.hold(false);
    let summary = rec.finish().unwrap();
    assert_eq!(summary.gpu_spans, 3);
    assert!(summary.gpu_errors >= 1);
    trace::unbind_gpu();
    let doc = parse(&path);
    let evs = events(&doc);
    assert_eq!(evs.iter().filter(|e| e["cat"] == "gpu").count(), 3);
    let failed = x_named(evs, "failed.section");
    assert_eq!(failed.len(), 1);
    assert!(
        failed[0].get("bind_id").is_none(),
        "CPU-only after a failed record"
    );
    assert_eq!(gpu.outstanding(), 0);
}

#[test]
fn unwritable_path_fails_at_start() {
    let _g = lock();
    let err = Recorder::start(config(&PathBuf::from("/nonexistent/dir/trace.json")));
    assert!(matches!(err, Err(trace::TraceError::Create { .. })));
    // And the failed start left no recorder behind.
    let dir = tempfile::tempdir().unwrap();
    Recorder::start(config(&dir.path().join("t.json")))
        .unwrap()
        .finish()
        .unwrap();
}

/// Back-to-back GPU-timed spans on one stream share their boundary events: one record
/// per boundary, the next span's GPU start exactly at the previous one's end. A change
/// of stream, or a zero window, records afresh; every event still goes back to the pool.
#[test]
fn back_to_back_gpu_spans_share_boundary_events() {
    /// Puts the default window back even when an assertion fails.
    struct Window;
    impl Drop for Window {
        fn drop(&mut self) {
            trace::set_gpu_event_reuse_window(None);
            MockGpu::set_current_stream(7);
        }
    }
    let _g = lock();
    let _w = Window;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let gpu = Arc::new(MockGpu::new(
        1,
        Duration::from_micros(5),
        Duration::from_micros(20),
    ));
    // Each record spins this long, so the cost counters must see it.
    let record_cost = Duration::from_micros(100);
    gpu.set_record_cost(record_cost);
    let mut cfg = config(&path);
    cfg.gpu = Some(gpu.clone());
    let rec = Recorder::start(cfg).unwrap();
    MockGpu::set_current_stream(7);
    trace::bind_gpu(0, "shared");
    // Each span "works" (sleeps) far longer than the window, which in turn is far longer
    // than a slow build takes from one span's end to the next one's begin.
    trace::set_gpu_event_reuse_window(Some(Duration::from_millis(20)));
    let work = Duration::from_millis(40);
    let (a, b, c) = (
        trace::intern("share.a"),
        trace::intern("share.b"),
        trace::intern("share.c"),
    );
    let before = gpu.recorded();
    {
        // One tree (placed with one calibration), so shared instants map to one time.
        let _outer = trace::gpu_span(trace::intern("share.outer"));
        for _ in 0..4 {
            for n in [a, b] {
                let _s = trace::gpu_span(n);
                std::thread::sleep(work);
            }
        }
    }
    assert_eq!(
        gpu.recorded() - before,
        9,
        "one record per boundary; the outer span shares its first and last"
    );
    // Another stream: the next span cannot reuse the last event.
    MockGpu::set_current_stream(8);
    let before = gpu.recorded();
    drop(trace::gpu_span(c));
    assert_eq!(
        gpu.recorded() - before,
        1,
        "begin recorded afresh, end shared"
    );
    trace::set_gpu_event_reuse_window(Some(Duration::ZERO));
    let before = gpu.recorded();
    drop(trace::gpu_span(c));
    assert_eq!(gpu.recorded() - before, 2, "no reuse with a zero window");
    let summary = rec.finish().unwrap();
    // 11 spans, 22 boundaries: 9 + 1 + 2 recorded, the rest reused.
    let cost = summary.gpu_cost;
    assert_eq!(
        (cost.spans, cost.events_recorded, cost.events_reused),
        (11, 12, 10)
    );
    assert_eq!(cost.reuse_window_ns, 0);
    // Every record's spin is counted; the spans' own work (8 x 40 ms of sleep) is not.
    assert!(
        cost.cpu_ns >= 12 * record_cost.as_nanos() as u64,
        "{cost:?}"
    );
    assert!(cost.cpu_ns < 100_000_000, "{cost:?}");
    // The records' share is counted apart, and every span is in the histogram: each of
    // these spans records at least one event, so all cost over its last bucket's bound.
    assert!(
        cost.record_ns >= 12 * record_cost.as_nanos() as u64 && cost.record_ns <= cost.cpu_ns,
        "{cost:?}"
    );
    let last = trace::SPAN_COST_BUCKETS - 1;
    assert_eq!(cost.span_cost_hist[last], 11, "{cost:?}");
    assert_eq!(cost.span_cost_hist.iter().sum::<u64>(), 11);
    trace::unbind_gpu();
    assert_eq!(
        gpu.outstanding(),
        0,
        "shared events go back to the pool once"
    );

    let doc = parse(&path);
    let evs = events(&doc);
    assert_tracks_valid(evs);
    let mut spans: Vec<(i64, i64)> = evs
        .iter()
        .filter(|e| e["cat"] == "gpu" && (e["name"] == "share.a" || e["name"] == "share.b"))
        .map(|e| (ns(&e["ts"]), ns(&e["dur"])))
        .collect();
    spans.sort();
    assert_eq!(spans.len(), 8);
    let outer = x_named(evs, "share.outer")
        .into_iter()
        .find(|e| e["cat"] == "gpu")
        .map(|e| (ns(&e["ts"]), ns(&e["dur"])))
        .unwrap();
    let (first, last) = (spans[0], spans[7]);
    assert!((outer.0 - first.0).abs() <= 1, "{outer:?} {first:?}");
    assert!(
        (outer.0 + outer.1 - last.0 - last.1).abs() <= 1,
        "{outer:?} {last:?}"
    );
    for w in spans.windows(2) {
        assert!(
            (w[0].0 + w[0].1 - w[1].0).abs() <= 1,
            "{:?} then {:?}: the shared boundary is one instant",
            w[0],
            w[1]
        );
    }
}

/// Binding a thread fills the device's event pool. The reuse window is calibrated from
/// the backend's cheapest event record (within [200 ns, 2 us]) unless one
/// was set; a new recorder calibrates afresh.
#[test]
fn binding_fills_the_pool_and_calibrates_the_reuse_window() {
    let _g = lock();
    trace::set_gpu_event_reuse_window(None);
    let dir = tempfile::tempdir().unwrap();
    let run = |cost: Duration| {
        let gpu = Arc::new(MockGpu::new(1, Duration::ZERO, Duration::ZERO));
        gpu.set_record_cost(cost);
        let mut cfg = config(&dir.path().join("t.json"));
        cfg.gpu = Some(gpu);
        let rec = Recorder::start(cfg).unwrap();
        trace::bind_gpu(0, "w");
        let window = trace::reuse_window_ns();
        trace::unbind_gpu();
        let end = rec.finish().unwrap().gpu_cost.reuse_window_ns;
        assert_eq!(window, end);
        window
    };
    // Binding also fills the event pool, so spans never create events themselves.
    let gpu = Arc::new(MockGpu::new(1, Duration::ZERO, Duration::ZERO));
    let mut cfg = config(&dir.path().join("t.json"));
    cfg.gpu = Some(gpu.clone());
    let rec = Recorder::start(cfg).unwrap();
    trace::bind_gpu(0, "w");
    let created = gpu.created();
    assert!(created >= 1024, "{created}");
    for _ in 0..300 {
        drop(trace::gpu_span(trace::intern("pool")));
    }
    assert_eq!(gpu.created(), created);
    trace::unbind_gpu();
    rec.finish().unwrap();
    let w = run(Duration::from_micros(1));
    assert!((1_000..=2_000).contains(&w), "1 us records: {w}");
    let w = run(Duration::from_millis(1));
    assert_eq!(w, 2_000, "capped");
    trace::set_gpu_event_reuse_window(Some(Duration::from_nanos(300)));
    assert_eq!(run(Duration::from_millis(1)), 300, "a set window wins");
    trace::set_gpu_event_reuse_window(None);
}

/// Span events are recycled: a thread reuses the events its written spans released
/// (the backend's pool is not drained span after span), a thread that exits while its
/// spans are still pending returns them all, and a finished recorder leaves no event
/// held. Each thread records 3000 spans of two events each (no sharing of boundaries),
/// 12000 records in all; what is created is the pool the writer keeps filled (1024)
/// plus what the threads hold between two writer passes (800 records each).
#[test]
fn span_events_are_recycled_and_all_return_when_threads_exit_and_at_finish() {
    let _g = lock();
    trace::set_gpu_event_reuse_window(Some(Duration::ZERO));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let gpu = Arc::new(MockGpu::new(1, Duration::from_micros(5), Duration::ZERO));
    let mut cfg = config(&path);
    cfg.gpu = Some(gpu.clone());
    let rec = Recorder::start(cfg).unwrap();
    let spans = 3000u64;
    let work = move |stream: u64| {
        MockGpu::set_current_stream(stream);
        trace::bind_gpu(0, "w");
        let name = trace::intern("recycled");
        for k in 0..spans {
            drop(trace::gpu_span(name));
            if k % 100 == 99 {
                // The writer drains at least every 100 ms.
                std::thread::sleep(Duration::from_millis(25));
            }
        }
    };
    // The first thread exits (its last spans still unwritten) while the second runs.
    let a = std::thread::spawn(move || work(1));
    let b = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        work(2)
    });
    a.join().unwrap();
    // Without recycling, every record would have taken a new event from the pool.
    let created = gpu.created();
    b.join().unwrap();
    let summary = rec.finish().unwrap();
    trace::set_gpu_event_reuse_window(None);
    assert_eq!(summary.gpu_spans, 2 * spans);
    assert_eq!(summary.gpu_cost.events_recorded, 4 * spans);
    assert!(created <= 4096, "{created} events created");
    assert!(gpu.created() <= 4096, "{} events created", gpu.created());
    assert_eq!(gpu.outstanding(), 0, "every event went back to the pool");
    assert!(gpu.recorded() >= 4 * spans);
}
