//! Test and benchmark support: synthetic dflash traces (format version 1), written through
//! the format crate's own writer, so they have the bytes of a real trace. The integration
//! tests build their runs with it, and `dflash-analyze synth` (used by
//! `scripts/bench-analyze.sh`) writes the load benchmark's input.
//!
//! The shape follows a real run: a target worker whose forward pass is launch-bound (CPU
//! time about 3x its GPU time) feeds a queue, and a drafter that waits on that queue for
//! part of each step. Durations are lognormal around fixed means, seeded, so two runs with
//! different seeds are samples of the same distribution.

use std::io::{self, Write};

use chrome_trace_format::dflash::{self, args};
use chrome_trace_format::header::meta;
use chrome_trace_format::names::{CPU_TS_ARG, STEP_ARG};
use chrome_trace_format::{
    Arg, ArgValue, Bind, Category, Counter, DeviceEntry, DistributedInfo, EventWriter, Header,
    Meta, Span, Text,
};

use crate::stats::SplitMix64;

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    pub seed: u64,
    pub steps: u32,
    pub layers: u32,
    /// Relative spread of durations (sd of the log).
    pub noise: f64,
    /// Multiply one section's CPU and GPU durations: `(name, factor)`.
    pub scale: Vec<(String, f64)>,
    /// Multiply every CPU-side duration (a slower host).
    pub host_factor: f64,
    /// Write GPU spans (as on a CUDA device).
    pub gpu: bool,
    /// The number of the first step (a resumed run's trace continues its numbering).
    pub first_step: u32,
    /// `baseTimeNanoseconds`: Unix ns of the trace's time zero.
    pub base_time_ns: u128,
    /// The trainer's pid (a resumed run is a new process).
    pub pid: u32,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            seed: 1,
            steps: 30,
            layers: 2,
            noise: 0.03,
            scale: Vec::new(),
            host_factor: 1.0,
            gpu: true,
            first_step: 0,
            base_time_ns: 1_764_750_000_123_456_789,
            pid: 4242,
        }
    }
}

const GPU_PID: u32 = 0;
const TARGET_TID: u32 = 1;
const DRAFTER_TID: u32 = 2;
const GPU_DRAFTER_TID: u32 = 1;
const GPU_TARGET_TID: u32 = 2;
/// Bytes of events buffered before they go to the output.
const CHUNK: usize = 1 << 16;

/// Microseconds (as the generator computes them) to the writer's nanoseconds.
fn ns(us: f64) -> u64 {
    (us * 1000.0).round().max(0.0) as u64
}

/// A time argument, written like `ts`.
fn us_arg(key: &'static str, us: f64) -> Arg<'static> {
    Arg {
        key,
        value: ArgValue::Micros(ns(us)),
    }
}

fn u64_arg(key: &'static str, v: u64) -> Arg<'static> {
    Arg {
        key,
        value: ArgValue::U64(v),
    }
}

/// A section's GPU side: its track and the time its stream is next free.
struct Stream<'a> {
    tid: u32,
    free_us: &'a mut f64,
}

impl<'a> Stream<'a> {
    fn target(free_us: &'a mut f64) -> Stream<'a> {
        Stream {
            tid: GPU_TARGET_TID,
            free_us,
        }
    }

    fn drafter(free_us: &'a mut f64) -> Stream<'a> {
        Stream {
            tid: GPU_DRAFTER_TID,
            free_us,
        }
    }
}

struct Writer<W: Write> {
    out: W,
    events: EventWriter,
    rng: SplitMix64,
    spec: SynthSpec,
    next_flow: u64,
}

impl<W: Write> Writer<W> {
    /// Hands the buffered text to the output once it is large.
    fn spill(&mut self) -> io::Result<()> {
        if self.events.len() >= CHUNK {
            self.events.drain_into(&mut self.out)?;
        }
        Ok(())
    }

    fn factor(&self, name: &str) -> f64 {
        self.spec
            .scale
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| *f)
            .product()
    }

    fn jitter(&mut self, mean: f64) -> f64 {
        mean * (self.spec.noise * self.rng.normal()).exp()
    }

    fn flow_id(&mut self) -> u64 {
        let id = self.next_flow;
        self.next_flow += 1;
        id
    }

    /// A span on the trainer's process.
    #[allow(clippy::too_many_arguments)]
    fn span(
        &mut self,
        cat: Category,
        name: Text<'_>,
        tid: u32,
        ts: f64,
        dur: f64,
        bind: Option<Bind>,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.events.span(&Span {
            cat,
            name,
            pid: self.spec.pid,
            tid,
            ts_ns: ns(ts),
            dur_ns: ns(dur),
            bind,
            args,
        });
        self.spill()
    }

    /// A CPU section and, with GPUs, its GPU span; returns the CPU end.
    fn section(
        &mut self,
        name: &str,
        tid: u32,
        gpu: Stream<'_>,
        ts: f64,
        (cpu_mean, gpu_mean): (f64, f64),
        step: u32,
    ) -> io::Result<f64> {
        let f = self.factor(name);
        let cpu = self.jitter(cpu_mean * f * self.spec.host_factor);
        let gpu_dur = self.jitter(gpu_mean * f);
        let step_arg = u64_arg(STEP_ARG, step.into());
        if self.spec.gpu && gpu_mean > 0.0 {
            let id = self.flow_id();
            self.span(
                Category::Cpu,
                Text::Plain(name),
                tid,
                ts,
                cpu,
                Some(Bind::source(id)),
                &[step_arg],
            )?;
            let gts = (ts + 5.0).max(*gpu.free_us);
            *gpu.free_us = gts + gpu_dur;
            self.events.span(&Span {
                cat: Category::Gpu,
                name: Text::Plain(name),
                pid: GPU_PID,
                tid: gpu.tid,
                ts_ns: ns(gts),
                dur_ns: ns(gpu_dur),
                bind: Some(Bind::destination(id)),
                args: &[step_arg, us_arg(CPU_TS_ARG, ts)],
            });
            self.spill()?;
        } else {
            self.span(
                Category::Cpu,
                Text::Plain(name),
                tid,
                ts,
                cpu,
                None,
                &[step_arg],
            )?;
        }
        Ok(ts + cpu)
    }

    /// The queue counter after a put or a get.
    fn depth(&mut self, ts: f64, depth: u32) -> io::Result<()> {
        self.events.counter(&Counter {
            cat: Text::Plain(dflash::QUEUE_COUNTER),
            name: Text::Plain(dflash::QUEUE_COUNTER),
            pid: self.spec.pid,
            ts_ns: ns(ts),
            args: &[u64_arg(dflash::QUEUE_DEPTH, depth.into())],
        });
        self.spill()
    }
}

/// Drafter sections inside `drafter.step`, in the order they run: (name, CPU mean us,
/// GPU mean us); a layer's own means are zero (its attn and mlp carry the time).
fn drafter_sections(layers: u32) -> Vec<(String, f64, f64)> {
    let means = [
        (dflash::DRAFTER_H2D, 120.0, 100.0),
        (dflash::DRAFTER_ANCHORS, 60.0, 40.0),
        (dflash::DRAFTER_NOISE_EMBED, 80.0, 70.0),
        (dflash::DRAFTER_ROPE, 50.0, 30.0),
        (dflash::DRAFTER_MASK, 40.0, 20.0),
        (dflash::DRAFTER_FC, 300.0, 280.0),
        (dflash::DRAFTER_NORM, 40.0, 30.0),
        (dflash::DRAFTER_LM_HEAD_LOSS, 900.0, 850.0),
        (dflash::DRAFTER_BACKWARD, 2500.0, 2400.0),
        (dflash::DRAFTER_CLIP, 150.0, 100.0),
        (dflash::DRAFTER_OPTIMIZER, 600.0, 500.0),
    ];
    let mut v = Vec::new();
    for (name, cpu, gpu) in means {
        if name == dflash::DRAFTER_NORM {
            v.extend((0..layers as usize).map(|i| (dflash::layer(i), 0.0, 0.0)));
        }
        v.push((name.to_string(), cpu, gpu));
    }
    v
}

/// Everything before the first event.
fn header(spec: &SynthSpec) -> io::Result<String> {
    let devices: Vec<&str> = if spec.gpu {
        vec!["cpu", "cuda:0"]
    } else {
        vec!["cpu"]
    };
    let timing = if spec.gpu {
        meta::GPU_TIMING_CUDA_EVENTS
    } else {
        meta::GPU_TIMING_NONE
    };
    let metadata = serde_json::json!({
        (meta::PRODUCER): dflash::PRODUCER,
        (meta::FORMAT): dflash::FORMAT,
        "dflash_version": "0.1.0",
        "torch_version": "2.11.0",
        "git_revision": "synthetic",
        "devices": devices,
        (meta::GPU_TIMING): timing,
        "trace_steps": format!("{}..{}", spec.first_step, spec.first_step + spec.steps),
        "config": {"seed": spec.seed},
    });
    let serde_json::Value::Object(metadata) = metadata else {
        unreachable!("a JSON object literal")
    };
    Header {
        base_time_ns: spec.base_time_ns,
        distributed: &DistributedInfo::default(),
        devices: &[DeviceEntry {
            id: 0,
            name: "NVIDIA H200".into(),
            total_global_mem: 150_000_000_000,
        }],
        metadata: &metadata,
    }
    .to_json()
    .map_err(io::Error::other)
}

/// Writes a whole trace.
pub fn write_trace<W: Write>(mut out: W, spec: &SynthSpec) -> io::Result<()> {
    out.write_all(header(spec)?.as_bytes())?;
    let mut w = Writer {
        out,
        events: EventWriter::with_capacity(CHUNK * 2),
        rng: SplitMix64::new(spec.seed),
        spec: spec.clone(),
        next_flow: 1,
    };
    w.events.meta(&Meta::ProcessName {
        pid: spec.pid,
        name: "dflash trainer",
    });
    for (tid, name) in [
        (TARGET_TID, "target 0 cuda:0"),
        (DRAFTER_TID, "drafter cuda:0"),
    ] {
        w.events.meta(&Meta::ThreadName {
            pid: spec.pid,
            tid,
            name,
        });
    }
    w.events.meta(&Meta::ProcessName {
        pid: GPU_PID,
        name: "GPU 0",
    });
    for (tid, name) in [
        (GPU_DRAFTER_TID, "stream 7 (drafter)"),
        (GPU_TARGET_TID, "stream 8 (target)"),
    ] {
        w.events.meta(&Meta::ThreadName {
            pid: GPU_PID,
            tid,
            name,
        });
    }
    let sections = drafter_sections(spec.layers);
    let mut clock = Clocks {
        t: 1000.0,
        gpu_drafter: 0.0,
        gpu_target: 0.0,
        depth: 0,
    };
    for step in spec.first_step..spec.first_step + spec.steps {
        write_step(&mut w, &sections, &mut clock, step)?;
    }
    w.events.finish();
    w.events.drain_into(&mut w.out)?;
    w.out.flush()
}

/// Where the generator stands between steps.
struct Clocks {
    /// The next step's start, us.
    t: f64,
    /// When each GPU stream is next free.
    gpu_drafter: f64,
    gpu_target: f64,
    /// Batches in the queue.
    depth: u32,
}

/// One step: the target side (forward, extract, put; its own thread, overlapping the
/// drafter), then the drafter side (`ProfilerStep#N` > `queue.get`, `drafter.step` >
/// sections).
fn write_step<W: Write>(
    w: &mut Writer<W>,
    sections: &[(String, f64, f64)],
    c: &mut Clocks,
    step: u32,
) -> io::Result<()> {
    let host = w.spec.host_factor;
    let step_start = c.t;
    let mut tt = step_start + 10.0;
    tt = w.section(
        dflash::TARGET_FORWARD,
        TARGET_TID,
        Stream::target(&mut c.gpu_target),
        tt,
        (3000.0, 1000.0),
        step,
    )?;
    tt = w.section(
        dflash::TARGET_EXTRACT,
        TARGET_TID,
        Stream::target(&mut c.gpu_target),
        tt + 2.0,
        (300.0, 250.0),
        step,
    )?;
    let put_wait = w.jitter(30.0);
    let put_dur = put_wait + 8.0;
    c.depth += 1;
    let flow = w.flow_id();
    let queue_args = |wait: f64, depth: u32| {
        [
            us_arg(args::WAIT_US, wait),
            u64_arg(args::DEPTH, depth.into()),
            u64_arg(args::BATCH, step.into()),
        ]
    };
    let put = queue_args(put_wait, c.depth);
    w.span(
        Category::Queue,
        Text::Plain(dflash::QUEUE_PUT),
        TARGET_TID,
        tt + 2.0,
        put_dur,
        Some(Bind::source(flow)),
        &put,
    )?;
    w.depth(tt + 2.0 + put_dur, c.depth)?;

    let get_wait = w.jitter(2300.0 * w.factor(dflash::QUEUE_GET) * host);
    let get_ts = step_start + 1.0;
    let get_dur = get_wait + 10.0;
    c.depth = c.depth.saturating_sub(1);
    let get = queue_args(get_wait, c.depth);
    w.span(
        Category::Queue,
        Text::Plain(dflash::QUEUE_GET),
        DRAFTER_TID,
        get_ts,
        get_dur,
        Some(Bind::destination(flow)),
        &get,
    )?;
    w.depth(get_ts + get_dur, c.depth)?;
    let ds_start = get_ts + get_dur + 2.0;
    let mut d = ds_start + 1.0;
    for (name, cpu, gpu) in sections {
        if name.starts_with(dflash::LAYER_PREFIX) {
            d = write_layer(w, name, d, &mut c.gpu_drafter, step)? + 1.0;
        } else {
            let drafter = Stream::drafter(&mut c.gpu_drafter);
            d = w.section(name, DRAFTER_TID, drafter, d, (*cpu, *gpu), step)? + 1.0;
        }
    }
    let loss = ((2.5 / (1.0 + step as f64 * 0.01)) * 1e4).round() / 1e4;
    let step_args = [
        u64_arg(args::STEP, step.into()),
        u64_arg(args::TOKENS, 4096),
        Arg {
            key: args::LOSS,
            value: ArgValue::F64(loss),
        },
    ];
    w.span(
        Category::Cpu,
        Text::Plain(dflash::DRAFTER_STEP),
        DRAFTER_TID,
        ds_start,
        d - ds_start,
        None,
        &step_args,
    )?;
    let step_end = d + 2.0;
    w.span(
        Category::Step,
        Text::Step(step.into()),
        DRAFTER_TID,
        step_start,
        step_end - step_start,
        None,
        &[],
    )?;
    c.t = step_end.max(tt) + 1.0;
    Ok(())
}

/// A drafter layer (a CPU span) around its attention and MLP sections; returns its end.
fn write_layer<W: Write>(
    w: &mut Writer<W>,
    name: &str,
    start: f64,
    gpu_free: &mut f64,
    step: u32,
) -> io::Result<f64> {
    let i: usize = name[dflash::LAYER_PREFIX.len()..].parse().unwrap_or(0);
    let mut ld = start + 1.0;
    for (sub, means) in [
        (dflash::layer_attn(i), (400.0, 380.0)),
        (dflash::layer_mlp(i), (350.0, 330.0)),
    ] {
        let gpu = Stream::drafter(&mut *gpu_free);
        ld = w.section(&sub, DRAFTER_TID, gpu, ld, means, step)? + 1.0;
    }
    let step_arg = [u64_arg(STEP_ARG, step.into())];
    w.span(
        Category::Cpu,
        Text::Plain(name),
        DRAFTER_TID,
        start,
        ld - start,
        None,
        &step_arg,
    )?;
    Ok(ld)
}

/// A trace as a string, for tests.
pub fn trace_string(spec: &SynthSpec) -> String {
    let mut v = Vec::new();
    write_trace(&mut v, spec).expect("writing to a Vec cannot fail");
    String::from_utf8(v).expect("the generator writes UTF-8")
}
