//! CPU cost of one GPU-timed span (begin + end, two CUDA event records) on a real GPU,
//! next to a CPU-only span, on a thread bound to its own stream. Needs CUDA.
//!
//!     cargo build --release --example gpu_span_cost && target/release/examples/gpu_span_cost
use std::sync::Arc;
use std::time::Instant;

use dflash::cuda;
use dflash::trace::{self, GpuBackend, Recorder, RecorderConfig};

fn per_span_ns(rec: &Recorder, rounds: usize, batch: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        samples.push(t.elapsed().as_nanos() as f64 / batch as f64);
        rec.flush().expect("flush");
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (samples[0], samples[samples.len() / 2])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !cuda::is_available() {
        eprintln!("CUDA is not available: this measurement needs a GPU");
        std::process::exit(2);
    }
    let backend = Arc::new(cuda::CudaEvents::new()?);
    let gpu: Arc<dyn trace::GpuBackend> = backend.clone();
    let rec = Recorder::start(RecorderConfig {
        path: "/dev/null".into(),
        gpu: Some(gpu),
        ..Default::default()
    })?;
    let stream = cuda::use_new_stream(0)?;
    trace::bind_gpu(0, "bench");
    let name = dflash::trace_name!("bench.gpu_section");
    let cpu = dflash::trace_name!("bench.cpu_section");
    println!(
        "event record path: {}",
        if cuda::CudaEvents::uses_driver_record() {
            "driver cuEventRecord"
        } else {
            "runtime cudaEventRecord"
        }
    );
    // warm the event pool
    per_span_ns(&rec, 5, 500, || drop(trace::gpu_span(name)));
    let (gmin, gmed) = per_span_ns(&rec, 50, 500, || drop(trace::gpu_span(name)));
    let (cmin, cmed) = per_span_ns(&rec, 50, 500, || drop(trace::span(cpu)));
    trace::set_gpu_event_reuse_window(Some(std::time::Duration::ZERO));
    let (nmin, nmed) = per_span_ns(&rec, 50, 500, || drop(trace::gpu_span(name)));
    trace::set_gpu_event_reuse_window(None);
    println!("gpu_span, back to back:     best {gmin:.0} ns, median {gmed:.0} ns per span");
    println!("gpu_span, 2 records each:   best {nmin:.0} ns, median {nmed:.0} ns per span");
    println!("cpu span:                   best {cmin:.0} ns, median {cmed:.0} ns per span");

    // The parts: one backend record (current stream + record) of an event taken once,
    // and one bare runtime cudaEventRecord on the same stream.
    let mut taken = Vec::new();
    backend.take(0, 1, &mut taken)?;
    let own = taken[0];
    let (bmin, bmed) = per_span_ns(&rec, 50, 500, || {
        let _ = backend.record(0, own);
    });
    backend.release(0, own);
    let ev = cuda::Event::new(0)?;
    let (rmin, rmed) = per_span_ns(&rec, 50, 500, || {
        let _ = ev.record(&stream);
    });
    println!("backend record (1 event):   best {bmin:.0} ns, median {bmed:.0} ns");
    println!("bare cudaEventRecord:       best {rmin:.0} ns, median {rmed:.0} ns");

    // In use: a span around one small kernel launch, against the launch alone.
    let x = tch::Tensor::zeros([1024], (tch::Kind::Float, tch::Device::Cuda(0)));
    launch_costs(&rec, name, &x, &stream)?;
    host_call_costs(&stream, &x)?;
    let s = rec.finish()?;
    println!(
        "gpu spans written {}, dropped {}, errors {}",
        s.gpu_spans, s.gpu_spans_dropped, s.gpu_errors
    );
    Ok(())
}

/// A span around one small kernel launch against the launch alone: back to back, with a
/// CPU gap after each, with the caches polluted between launches, and with another thread
/// launching on its own stream; the recorder's own figures for each.
fn launch_costs(
    rec: &Recorder,
    name: trace::Name,
    x: &tch::Tensor,
    stream: &cuda::Stream,
) -> Result<(), Box<dyn std::error::Error>> {
    let (kmin, kmed) = per_span_ns(rec, 50, 200, || {
        let _ = x.g_add_scalar(1.0);
    });
    let c0 = rec.stats_snapshot().gpu_cost;
    let (smin, smed) = per_span_ns(rec, 50, 200, || {
        let _s = trace::gpu_span(name);
        let _ = x.g_add_scalar(1.0);
    });
    let chained = rec.stats_snapshot().gpu_cost.since(&c0);
    // A CPU gap after each span: no event to share with the next one.
    let gap = || {
        let t = Instant::now();
        while t.elapsed().as_nanos() < 1000 {}
    };
    let (gkmin, gkmed) = per_span_ns(rec, 50, 200, || {
        let _ = x.g_add_scalar(1.0);
        gap();
    });
    let c0 = rec.stats_snapshot().gpu_cost;
    let (gsmin, gsmed) = per_span_ns(rec, 50, 200, || {
        {
            let _s = trace::gpu_span(name);
            let _ = x.g_add_scalar(1.0);
        }
        gap();
    });
    let apart = rec.stats_snapshot().gpu_cost.since(&c0);
    // As in training: CPU work between the launches evicts the driver's data from the
    // caches, and another thread launches kernels on its own stream meanwhile.
    let mut junk = vec![0u8; 8 << 20];
    let mut k = 0u8;
    let c0 = rec.stats_snapshot().gpu_cost;
    per_span_ns(rec, 20, 200, || {
        let _s = trace::gpu_span(name);
        let _ = x.g_add_scalar(1.0);
        k = k.wrapping_add(1);
        junk.iter_mut().step_by(64).for_each(|b| *b = k);
    });
    let polluted = rec.stats_snapshot().gpu_cost.since(&c0);
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let other = {
        let busy = busy.clone();
        std::thread::spawn(move || -> Result<(), cuda::CudaError> {
            let s = cuda::use_new_stream(0)?;
            let y = tch::Tensor::zeros([1024], (tch::Kind::Float, tch::Device::Cuda(0)));
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = y.g_add_scalar(1.0);
                let _ = s.synchronize();
            }
            Ok(())
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(20));
    let c0 = rec.stats_snapshot().gpu_cost;
    per_span_ns(rec, 50, 200, || {
        let _s = trace::gpu_span(name);
        let _ = x.g_add_scalar(1.0);
    });
    let contended = rec.stats_snapshot().gpu_cost.since(&c0);
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = other.join();
    stream.synchronize()?;
    println!("kernel launch alone:        best {kmin:.0} ns, median {kmed:.0} ns");
    println!(
        "launch inside gpu_span:     best {smin:.0} ns, median {smed:.0} ns (span adds {:.0} / {:.0} ns)",
        smin - kmin,
        smed - kmed
    );
    println!(
        "same, 1 us gap after each:  best {gsmin:.0} ns, median {gsmed:.0} ns (span adds {:.0} / {:.0} ns)",
        gsmin - gkmin,
        gsmed - gkmed
    );
    println!(
        "in the recorder, per span around a launch (its begin + end, as the recorder times them; reuse window {} ns):",
        trace::reuse_window_ns()
    );
    for (what, c) in [
        ("back to back", chained),
        ("1 us gap after each", apart),
        ("8 MB of CPU writes after each", polluted),
        ("another thread launching", contended),
    ] {
        let q = |p| c.span_cost_quantile_ns(p).unwrap_or(0.0);
        println!(
            "  {what:<30} mean {:.0} ns (median {:.0}, p90 {:.0}), {:.0} ns in event records, {:.2} events recorded per span",
            c.cpu_ns_per_span(),
            q(0.5),
            q(0.9),
            c.record_ns_per_span(),
            c.events_per_span()
        );
    }
    Ok(())
}

/// Best and median ns of `call`, timed one call at a time, with `before` (untimed) run
/// ahead of each call.
fn each_call_ns(rounds: usize, mut before: impl FnMut(), mut call: impl FnMut()) -> (f64, f64) {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        before();
        let t = Instant::now();
        call();
        samples.push(t.elapsed().as_nanos() as f64);
    }
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (samples[0], samples[samples.len() / 2])
}

/// What a single driver call costs on this host, and what makes an event record dearer
/// right after a launch: a call that queues nothing (querying a completed event), a
/// record on an idle stream, a record right after a kernel launch, and a record after
/// CPU work that evicts the driver's data from the caches.
fn host_call_costs(
    stream: &cuda::Stream,
    x: &tch::Tensor,
) -> Result<(), Box<dyn std::error::Error>> {
    let ev = cuda::Event::new(0)?;
    ev.record(stream)?;
    stream.synchronize()?;
    let n = 2000;
    let (qmin, qmed) = each_call_ns(
        n,
        || {},
        || {
            let _ = ev.query();
        },
    );
    let (imin, imed) = each_call_ns(
        n,
        || {},
        || {
            let _ = ev.record(stream);
        },
    );
    stream.synchronize()?;
    let (lmin, lmed) = each_call_ns(
        n,
        || {
            let _ = x.g_add_scalar(1.0);
        },
        || {
            let _ = ev.record(stream);
        },
    );
    stream.synchronize()?;
    let mut junk = vec![0u8; 8 << 20];
    let mut k = 0u8;
    let (cmin, cmed) = each_call_ns(
        n,
        || {
            k = k.wrapping_add(1);
            junk.iter_mut().step_by(64).for_each(|b| *b = k);
        },
        || {
            let _ = ev.record(stream);
        },
    );
    stream.synchronize()?;
    println!("-- single calls on this host (best / median ns) --");
    println!("event query (queues nothing): {qmin:.0} / {qmed:.0}");
    println!("event record, idle stream:    {imin:.0} / {imed:.0}");
    println!("event record after a launch:  {lmin:.0} / {lmed:.0}");
    println!("event record after 8 MB of CPU writes: {cmin:.0} / {cmed:.0}");
    Ok(())
}
