//! CPU cost of one GPU-timed span (begin + end, two CUDA event records) on a real GPU,
//! next to a CPU-only span, on a thread bound to its own stream. Needs CUDA.
//!
//!     cargo build --release --example gpu_span_cost && target/release/examples/gpu_span_cost
use std::sync::Arc;
use std::time::Instant;

use dflash::cuda;
use dflash::trace::{self, GpuBackend, Recorder, RecorderConfig};

fn per_span_ns(rec: &Recorder, rounds: usize, batch: usize, f: impl Fn()) -> (f64, f64) {
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
    trace::set_gpu_event_reuse_window(std::time::Duration::ZERO);
    let (nmin, nmed) = per_span_ns(&rec, 50, 500, || drop(trace::gpu_span(name)));
    trace::set_gpu_event_reuse_window(std::time::Duration::from_nanos(200));
    println!("gpu_span, back to back:     best {gmin:.0} ns, median {gmed:.0} ns per span");
    println!("gpu_span, 2 records each:   best {nmin:.0} ns, median {nmed:.0} ns per span");
    println!("cpu span:                   best {cmin:.0} ns, median {cmed:.0} ns per span");

    // The parts: one backend record (pool + current stream + record), and one bare
    // runtime cudaEventRecord on the same stream.
    let (bmin, bmed) = per_span_ns(&rec, 50, 500, || {
        if let Ok((ev, _)) = backend.record(0) {
            backend.release(0, ev);
        }
    });
    let ev = cuda::Event::new(0)?;
    let (rmin, rmed) = per_span_ns(&rec, 50, 500, || {
        let _ = ev.record(&stream);
    });
    println!("backend record (1 event):   best {bmin:.0} ns, median {bmed:.0} ns");
    println!("bare cudaEventRecord:       best {rmin:.0} ns, median {rmed:.0} ns");

    // In use: a span around one small kernel launch, against the launch alone.
    let x = tch::Tensor::zeros([1024], (tch::Kind::Float, tch::Device::Cuda(0)));
    let (kmin, kmed) = per_span_ns(&rec, 50, 200, || {
        let _ = x.g_add_scalar(1.0);
    });
    let (smin, smed) = per_span_ns(&rec, 50, 200, || {
        let _s = trace::gpu_span(name);
        let _ = x.g_add_scalar(1.0);
    });
    // A CPU gap after each span: no event to share with the next one.
    let gap = || {
        let t = Instant::now();
        while t.elapsed().as_nanos() < 1000 {}
    };
    let (gkmin, gkmed) = per_span_ns(&rec, 50, 200, || {
        let _ = x.g_add_scalar(1.0);
        gap();
    });
    let (gsmin, gsmed) = per_span_ns(&rec, 50, 200, || {
        {
            let _s = trace::gpu_span(name);
            let _ = x.g_add_scalar(1.0);
        }
        gap();
    });
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
    let s = rec.finish()?;
    println!(
        "gpu spans written {}, dropped {}, errors {}",
        s.gpu_spans, s.gpu_spans_dropped, s.gpu_errors
    );
    Ok(())
}
