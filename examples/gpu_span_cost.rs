//! CPU cost of one GPU-timed span (begin + end, two CUDA event records) on a real GPU,
//! next to a CPU-only span, on a thread bound to its own stream. Needs CUDA.
//!
//!     cargo build --release --example gpu_span_cost && target/release/examples/gpu_span_cost
use std::sync::Arc;
use std::time::Instant;

use dflash::cuda;
use dflash::trace::{self, Recorder, RecorderConfig};

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
    let gpu: Arc<dyn trace::GpuBackend> = Arc::new(cuda::CudaEvents::new()?);
    let rec = Recorder::start(RecorderConfig {
        path: "/dev/null".into(),
        gpu: Some(gpu),
        ..Default::default()
    })?;
    let _stream = cuda::use_new_stream(0)?;
    trace::bind_gpu(0, "bench");
    let name = dflash::trace_name!("bench.gpu_section");
    let cpu = dflash::trace_name!("bench.cpu_section");
    // warm the event pool
    per_span_ns(&rec, 5, 500, || drop(trace::gpu_span(name)));
    let (gmin, gmed) = per_span_ns(&rec, 50, 500, || drop(trace::gpu_span(name)));
    let (cmin, cmed) = per_span_ns(&rec, 50, 500, || drop(trace::span(cpu)));
    println!("gpu_span (2 event records): best {gmin:.0} ns, median {gmed:.0} ns per span");
    println!("cpu span:                   best {cmin:.0} ns, median {cmed:.0} ns per span");
    let s = rec.finish()?;
    println!(
        "gpu spans written {}, dropped {}, errors {}",
        s.gpu_spans, s.gpu_spans_dropped, s.gpu_errors
    );
    Ok(())
}
