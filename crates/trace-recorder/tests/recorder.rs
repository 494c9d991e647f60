//! Integration tests of the trace recorder: the file it writes is valid Chrome-trace JSON
//! per docs/trace-format.md (header, metadata, names, nesting per track, flows,
//! counters, escaping), survives being cut at any byte after a flush (and a `kill -9`).
//! The mock-GPU tests are in `gpu_spans.rs`.
//!
//! The recorder is process-global, so every test that starts one holds `LOCK`.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use trace_recorder::{self as trace, Recorder};

mod common;
use common::*;

/// Records what a trainer does on CPU: a producer thread (forward, put, counter) and a
/// consumer (steps with a get, a counter, `drafter.step` and layers), five batches.
fn record_queue_run(path: &Path) -> trace::Summary {
    let rec = Recorder::start(config(path)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<(u64, u64)>();
    let producer = std::thread::spawn(move || {
        trace::set_thread_name("target 0 cpu");
        let put = trace::intern("queue.put");
        let fwd = trace::trace_name!("target.forward");
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
        let mut s = trace::span(trace::trace_name!("drafter.step"));
        s.arg("step", step);
        s.arg("loss", 2.5f64);
        for layer in 0..2 {
            let name = trace::intern(&format!("drafter.layer.{layer}"));
            let _l = trace::span(name);
            let _a = trace::span(trace::intern(&format!("drafter.layer.{layer}.attn")));
        }
    }
    rec.finish().unwrap()
}

#[test]
fn cpu_trace_is_valid_json_with_names_nesting_counters_and_flows() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let summary = record_queue_run(&path);
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
