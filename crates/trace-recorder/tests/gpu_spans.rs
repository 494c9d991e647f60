//! Integration tests of GPU spans against the mock backend: they nest inside their CPU
//! step with matched flows, never start before their CPU span, wait for a busy GPU,
//! degrade to CPU-only spans on failure, share boundary events back to back, and every
//! event goes back to the pool.
//!
//! The recorder is process-global, so every test that starts one holds `LOCK`.
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use trace_recorder::{self as trace, MockGpu, Recorder};

mod common;
use common::*;

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

    check_shared_boundaries(&path);
}

/// In the file of `back_to_back_gpu_spans_share_boundary_events`: the shared boundaries
/// are one instant on the GPU track, and the outer span spans them all.
fn check_shared_boundaries(path: &Path) {
    let doc = parse(path);
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

/// `finish_with`: the appender sees every GPU span as written (its track, stream, CPU
/// span and launching thread), each thread's OS id and extent, and the shared clock; what
/// it writes lands in the file before the footer.
#[test]
fn finish_with_hands_the_placed_spans_and_threads_to_the_appender() {
    let _g = lock();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let gpu = Arc::new(MockGpu::new(1, Duration::from_micros(20), Duration::ZERO));
    let mut cfg = config(&path);
    cfg.gpu = Some(gpu.clone());
    cfg.keep_gpu_spans = true;
    let before = trace::clock_ns();
    let rec = Recorder::start(cfg).unwrap();
    let os_tid = std::thread::spawn(move || {
        trace::set_thread_name("drafter cuda:0");
        MockGpu::set_current_stream(5);
        trace::bind_gpu(0, "drafter");
        for step in 0..3 {
            let _s = trace::step_span(step);
            let _a = trace::gpu_span(trace::intern("a"));
            drop(trace::gpu_span(trace::intern("b")));
        }
        // SAFETY: gettid has no arguments.
        unsafe { libc_gettid() }
    })
    .join()
    .unwrap();
    let seen = Arc::new(std::sync::Mutex::new(None));
    let s2 = seen.clone();
    let summary = rec
        .finish_with(Box::new(move |view, w| {
            let now = trace::clock_ns();
            assert!(view.trace_ns(now).is_some());
            assert!(view.trace_ns(before).is_none() || view.base_clock_ns == before);
            w.span(&chrome_trace_format::Span {
                cat: chrome_trace_format::Category::Kernel,
                name: chrome_trace_format::Text::Plain("appended"),
                pid: 0,
                tid: view.gpu_spans[0].track,
                ts_ns: view.gpu_spans[0].ts_ns,
                dur_ns: 1,
                bind: None,
                args: &[],
            });
            *s2.lock().unwrap() = Some((view.gpu_spans.to_vec(), view.threads.to_vec(), view.pid));
        }))
        .unwrap();
    assert_eq!(summary.gpu_spans, 6);
    let (spans, threads, pid) = seen.lock().unwrap().take().unwrap();
    assert_eq!(spans.len(), 6);
    assert_eq!(threads.len(), 1);
    let t = &threads[0];
    assert_eq!(t.os_tid, os_tid);
    let doc = parse(&path);
    let evs = events(&doc);
    for s in &spans {
        assert_eq!((s.device, s.stream, s.thread), (0, 5, t.tid));
        assert!(
            s.cpu_ts_ns <= s.cpu_end_ns && s.cpu_ts_ns >= t.first_ns && s.cpu_end_ns <= t.last_ns
        );
        // the span in the file, on the track the appender was told
        let f = evs
            .iter()
            .find(|e| {
                e["cat"] == "gpu" && e["name"] == s.name.as_str() && ns(&e["ts"]) == s.ts_ns as i64
            })
            .expect("the span is in the file");
        assert_eq!(f["tid"], s.track);
        assert_eq!(f["pid"], 0);
        let cpu = evs
            .iter()
            .find(|e| {
                e["cat"] == "cpu" && e["tid"] == t.tid && ns(&e["ts"]) == ns(&f["args"]["cpu_ts"])
            })
            .expect("its CPU span");
        assert_eq!(ns(&cpu["ts"]) + ns(&cpu["dur"]), s.cpu_end_ns as i64);
    }
    assert!(evs.iter().any(|e| e["name"] == "appended"));
    assert!(pid > 0);
}

unsafe fn libc_gettid() -> u32 {
    extern "C" {
        fn gettid() -> i32;
    }
    // SAFETY: no arguments, cannot fail.
    unsafe { gettid() as u32 }
}
