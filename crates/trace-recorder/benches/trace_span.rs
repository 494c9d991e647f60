//! Cost of one span (begin + end) on the recording thread: disabled, enabled, enabled
//! with two args, a counter sample, and a GPU-timed span against the mock backend
//! (recorder overhead only; real CUDA adds two `cudaEventRecord`s).
//!
//! Enabled spans are timed in batches that fit a thread's ring; between batches, outside
//! the timing, the writer drains and formats them (to /dev/null), so what is measured is
//! the steady-state hot path, not the writer's throughput.
//!
//! Run: `cargo bench -p trace-recorder --bench trace_span`; `TRACE_BENCH_MIN=1` also
//! prints best-of-200 figures, which filter out time slices lost to other processes, and
//! the recorder's own path of a GPU-timed span with a backend that records nothing, warm,
//! cache-cold, and warm on two threads at once.
//!
//! The figures measured so far, and what they say, are in docs/recorder-bench.md.
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use trace_recorder::{self as trace, MockGpu, Recorder, RecorderConfig};

/// Spans per timed batch: below the ring's capacity, so nothing is dropped.
const BATCH: u64 = 2000;

fn batched(rec: &Recorder, iters: u64, mut f: impl FnMut()) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BATCH);
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        total += t.elapsed();
        left -= n;
        rec.flush().expect("flush");
    }
    total
}

fn start(gpu: Option<Arc<dyn trace::GpuBackend>>) -> Recorder {
    Recorder::start(RecorderConfig {
        path: "/dev/null".into(),
        gpu,
        ..Default::default()
    })
    .expect("recorder")
}

fn spans(c: &mut Criterion) {
    let name = trace::trace_name!("bench.section");
    let mut g = c.benchmark_group("trace_span");

    // What the harness itself costs per iteration, for reading the `disabled` figure.
    g.bench_function("empty_iter", |b| b.iter(|| black_box(())));
    // As spans are used: the guard lives in the caller and is dropped there, so the
    // compiler sees it is off (one relaxed load and a branch remain).
    g.bench_function("disabled", |b| {
        b.iter(|| {
            let _s = trace::span(black_box(name));
        })
    });
    // The guard's address escapes (it is stored, then reloaded for the drop check).
    g.bench_function("disabled_guard_escapes", |b| {
        b.iter(|| {
            let s = trace::span(black_box(name));
            black_box(&s);
        })
    });

    // Reference points for this machine's state: two clock reads as the recorder does
    // them (raw TSC), and two `Instant::now()`.
    let clock = quanta::Clock::new();
    let mut floor: Vec<(u32, u64, u64)> = Vec::with_capacity(BATCH as usize);
    g.bench_function("floor_2_rdtsc_vec_push", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(BATCH);
                floor.clear();
                let t = Instant::now();
                for _ in 0..n {
                    let s = clock.raw();
                    let e = clock.raw();
                    floor.push((black_box(7), s, e));
                }
                total += t.elapsed();
                left -= n;
            }
            total
        })
    });
    g.bench_function("instant_now_pair", |b| {
        b.iter(|| {
            let s = Instant::now();
            black_box(Instant::now() - s)
        })
    });

    let rec = start(None);
    g.bench_function("enabled", |b| {
        b.iter_custom(|iters| batched(&rec, iters, || drop(black_box(trace::span(name)))))
    });
    g.bench_function("enabled_2_args", |b| {
        b.iter_custom(|iters| {
            batched(&rec, iters, || {
                let mut s = trace::span(name);
                s.arg("batch", black_box(3u64));
                s.arg("loss", black_box(0.5f64));
            })
        })
    });
    g.bench_function("counter", |b| {
        b.iter_custom(|iters| {
            batched(&rec, iters, || {
                trace::counter(name, "depth", black_box(2.0))
            })
        })
    });
    let stats = rec.finish().expect("finish");
    assert_eq!(stats.dropped_events, 0, "bench batches must fit the ring");

    let gpu = Arc::new(MockGpu::new(1, Duration::ZERO, Duration::ZERO));
    let rec = start(Some(gpu));
    trace::bind_gpu(0, "bench");
    g.bench_function("gpu_span_mock", |b| {
        b.iter_custom(|iters| batched(&rec, iters, || drop(black_box(trace::gpu_span(name)))))
    });
    trace::unbind_gpu();
    rec.finish().expect("finish");
    g.finish();
}

/// Best-of-rounds ns per call: the minimum over many short rounds filters out the time
/// slices lost to other processes on a busy 2-core machine, which inflate criterion's
/// means. Printed when `TRACE_BENCH_MIN=1`.
fn best_of(rec: Option<&Recorder>, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..200 {
        let t = Instant::now();
        for _ in 0..BATCH {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / BATCH as f64);
        if let Some(r) = rec {
            r.flush().expect("flush");
        }
    }
    best
}

fn min_figures(_c: &mut Criterion) {
    if std::env::var("TRACE_BENCH_PROFILE").is_ok() {
        // For `perf record`: enabled spans only, for a few seconds.
        let name = trace::trace_name!("bench.section");
        let rec = start(None);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            for _ in 0..BATCH {
                drop(black_box(trace::span(name)));
            }
            rec.flush().expect("flush");
        }
        rec.finish().expect("finish");
        return;
    }
    if std::env::var("TRACE_BENCH_MIN").is_err() {
        return;
    }
    let name = trace::trace_name!("bench.section");
    let clock = quanta::Clock::new();
    let mut floor: Vec<(u32, u64, u64)> = Vec::with_capacity(BATCH as usize);
    let mut rows = vec![
        ("empty_loop", best_of(None, || black_box(()))),
        (
            "disabled",
            best_of(None, || {
                let _s = trace::span(black_box(name));
            }),
        ),
        (
            "disabled_guard_escapes",
            best_of(None, || {
                let s = trace::span(black_box(name));
                black_box(&s);
            }),
        ),
        (
            "floor_2_rdtsc_vec_push",
            best_of(None, || {
                if floor.len() == BATCH as usize {
                    floor.clear();
                }
                let s = clock.raw();
                let e = clock.raw();
                floor.push((black_box(7), s, e));
            }),
        ),
        (
            "instant_now_pair",
            best_of(None, || {
                let s = Instant::now();
                black_box(Instant::now() - s);
            }),
        ),
    ];
    let rec = start(None);
    rows.push((
        "enabled",
        best_of(Some(&rec), || drop(black_box(trace::span(name)))),
    ));
    rows.push((
        "enabled_2_args",
        best_of(Some(&rec), || {
            let mut s = trace::span(name);
            s.arg("batch", black_box(3u64));
            s.arg("loss", black_box(0.5f64));
        }),
    ));
    rows.push((
        "counter",
        best_of(Some(&rec), || trace::counter(name, "depth", black_box(2.0))),
    ));
    // The same spans into ring slots that the writer has not just read (no flush
    // between rounds; 3 rounds fit the ring): the difference to `enabled` is the cost
    // of taking back cache lines from the writer's core.
    rec.flush().expect("flush");
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..BATCH {
            drop(black_box(trace::span(name)));
        }
        best = best.min(t.elapsed().as_nanos() as f64 / BATCH as f64);
    }
    rows.push(("enabled_ring_not_shared", best));
    rec.finish().expect("finish");
    let rec = start(Some(Arc::new(MockGpu::new(
        1,
        Duration::ZERO,
        Duration::ZERO,
    ))));
    trace::bind_gpu(0, "bench");
    rows.push((
        "gpu_span_mock",
        best_of(Some(&rec), || drop(black_box(trace::gpu_span(name)))),
    ));
    trace::unbind_gpu();
    rec.finish().expect("finish");
    for (what, ns) in rows {
        println!("best-of-200 {what:<24} {ns:7.2} ns");
    }
    cold_gpu_spans();
}

/// A backend whose records cost (almost) nothing: what a GPU-timed span then costs is
/// the recorder's own path.
struct Trivial(AtomicU64);

impl trace::GpuBackend for Trivial {
    fn device_count(&self) -> usize {
        1
    }
    fn current_stream(&self, _device: usize) -> Result<u64, trace::GpuError> {
        Ok(7)
    }
    fn take(
        &self,
        _device: usize,
        n: usize,
        out: &mut Vec<trace::GpuEvent>,
    ) -> Result<(), trace::GpuError> {
        let first = self.0.fetch_add(n as u64, Ordering::Relaxed) + 1;
        out.extend((first..first + n as u64).map(trace::GpuEvent));
        Ok(())
    }
    fn record(&self, _device: usize, _event: trace::GpuEvent) -> Result<u64, trace::GpuError> {
        Ok(7)
    }
    fn record_calibration(&self, _device: usize) -> Result<trace::GpuEvent, trace::GpuError> {
        Ok(trace::GpuEvent(self.0.fetch_add(1, Ordering::Relaxed) + 1))
    }
    fn query(&self, _event: trace::GpuEvent) -> Result<bool, trace::GpuError> {
        Ok(true)
    }
    fn elapsed_ms(&self, a: trace::GpuEvent, b: trace::GpuEvent) -> Result<f64, trace::GpuError> {
        Ok((b.0 as f64 - a.0 as f64) * 1e-3)
    }
    fn release(&self, _device: usize, _event: trace::GpuEvent) {}
}

/// 300 GPU-timed spans on the calling thread, each followed by a 3 us pause (so no
/// boundary is shared: two events per span); `junk`: CPU writes inside each span.
fn paused_gpu_spans(name: trace::Name, mut junk: Option<&mut [u8]>) {
    for k in 0..300u32 {
        {
            let _s = trace::gpu_span(name);
            if let Some(j) = junk.as_deref_mut() {
                j.iter_mut().step_by(64).for_each(|b| *b = k as u8);
            }
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(3) {}
    }
}

/// The recorder's path of a GPU-timed span warm, and cache-cold as in training (8 MB of
/// CPU writes inside each span evict its data and code), as the recorder counts it
/// (`GpuTimingCost`), with a backend that records nothing; and warm on two threads at
/// once (each its own stream, as the trainer's target and drafter threads). Median of 7
/// rounds of 300 spans ([`paused_gpu_spans`]).
fn cold_gpu_spans() {
    let rec = start(Some(Arc::new(Trivial(AtomicU64::new(0)))));
    trace::bind_gpu(0, "bench");
    let name = trace::trace_name!("bench.cold");
    let mut junk = vec![0u8; 8 << 20];
    for mode in ["warm", "cold (8 MB writes)", "warm, two threads"] {
        let mut rounds = Vec::new();
        for _ in 0..7 {
            let c0 = rec.stats_snapshot().gpu_cost;
            match mode {
                "warm" => paused_gpu_spans(name, None),
                "warm, two threads" => std::thread::scope(|s| {
                    s.spawn(|| {
                        trace::bind_gpu(0, "bench 2");
                        paused_gpu_spans(name, None);
                    });
                    paused_gpu_spans(name, None);
                }),
                _ => paused_gpu_spans(name, Some(&mut junk)),
            }
            rec.flush().expect("flush");
            rounds.push(rec.stats_snapshot().gpu_cost.since(&c0).cpu_ns_per_span());
        }
        rounds.sort_by(f64::total_cmp);
        let what = mode;
        println!(
            "gpu_span, trivial backend, {what:<18} median {:7.0} ns (rounds {:.0}-{:.0})",
            rounds[3], rounds[0], rounds[6]
        );
    }
    trace::unbind_gpu();
    black_box(&junk);
    rec.finish().expect("finish");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = min_figures, spans
}
criterion_main!(benches);
