//! Writes synthetic dflash traces (format version 1) for tests and the load benchmark.
//!
//! The shape follows a real run: a target worker whose forward pass is launch-bound (CPU
//! time about 3x its GPU time) feeds a queue, and a drafter that waits on that queue for
//! part of each step. Durations are lognormal around fixed means, seeded, so two runs with
//! different seeds are samples of the same distribution.

use std::io::{self, Write};

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
        }
    }
}

const PID: u32 = 4242;
const TARGET_TID: u32 = 1;
const DRAFTER_TID: u32 = 2;
const GPU_DRAFTER_TID: u32 = 1;
const GPU_TARGET_TID: u32 = 2;

struct Writer<W: Write> {
    out: W,
    first: bool,
    rng: SplitMix64,
    spec: SynthSpec,
    next_flow: u64,
}

impl<W: Write> Writer<W> {
    fn event(&mut self, body: std::fmt::Arguments<'_>) -> io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.out.write_fmt(body)
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

    fn span(
        &mut self,
        cat: &str,
        name: &str,
        tid: u32,
        ts: f64,
        dur: f64,
        args: &str,
    ) -> io::Result<()> {
        let pid = if cat == "gpu" { 0 } else { PID };
        self.event(format_args!(
            r#"{{"ph":"X","cat":"{cat}","name":"{name}","pid":{pid},"tid":{tid},"ts":{ts:.3},"dur":{dur:.3},"args":{{{args}}}}}"#
        ))
    }

    /// A CPU section and, with GPUs, its GPU span; returns the CPU end.
    #[allow(clippy::too_many_arguments)]
    fn section(
        &mut self,
        name: &str,
        tid: u32,
        gpu_tid: u32,
        ts: f64,
        cpu_mean: f64,
        gpu_mean: f64,
        step: u32,
        gpu_free: &mut f64,
    ) -> io::Result<f64> {
        let f = self.factor(name);
        let cpu = self.jitter(cpu_mean * f * self.spec.host_factor);
        let gpu = self.jitter(gpu_mean * f);
        if self.spec.gpu && gpu_mean > 0.0 {
            let id = self.next_flow;
            self.next_flow += 1;
            self.event(format_args!(
                r#"{{"ph":"X","cat":"cpu","name":"{name}","pid":{PID},"tid":{tid},"ts":{ts:.3},"dur":{cpu:.3},"bind_id":{id},"flow_out":true,"args":{{"step":{step}}}}}"#
            ))?;
            let gts = (ts + 5.0).max(*gpu_free);
            *gpu_free = gts + gpu;
            self.event(format_args!(
                r#"{{"ph":"X","cat":"gpu","name":"{name}","pid":0,"tid":{gpu_tid},"ts":{gts:.3},"dur":{gpu:.3},"bind_id":{id},"flow_in":true,"args":{{"step":{step},"cpu_ts":{ts:.3}}}}}"#
            ))?;
        } else {
            self.span("cpu", name, tid, ts, cpu, &format!("\"step\":{step}"))?;
        }
        Ok(ts + cpu)
    }
}

/// Drafter sections inside `drafter.step`: (name, CPU mean us, GPU mean us).
fn drafter_sections(layers: u32) -> Vec<(String, f64, f64)> {
    let mut v: Vec<(String, f64, f64)> = vec![
        ("drafter.h2d".into(), 120.0, 100.0),
        ("drafter.anchors".into(), 60.0, 40.0),
        ("drafter.noise_embed".into(), 80.0, 70.0),
        ("drafter.rope".into(), 50.0, 30.0),
        ("drafter.mask".into(), 40.0, 20.0),
        ("drafter.fc".into(), 300.0, 280.0),
    ];
    for i in 0..layers {
        v.push((format!("drafter.layer.{i}"), 0.0, 0.0));
    }
    v.extend([
        ("drafter.norm".into(), 40.0, 30.0),
        ("drafter.lm_head_loss".into(), 900.0, 850.0),
        ("drafter.backward".into(), 2500.0, 2400.0),
        ("drafter.clip".into(), 150.0, 100.0),
        ("drafter.optimizer".into(), 600.0, 500.0),
    ]);
    v
}

/// Writes a whole trace.
pub fn write_trace<W: Write>(out: W, spec: &SynthSpec) -> io::Result<()> {
    let mut w = Writer {
        out,
        first: true,
        rng: SplitMix64::new(spec.seed),
        spec: spec.clone(),
        next_flow: 1,
    };
    let devices = if spec.gpu {
        r#"["cpu","cuda:0"]"#
    } else {
        r#"["cpu"]"#
    };
    let timing = if spec.gpu { "cuda-events" } else { "none" };
    write!(
        w.out,
        r#"{{"schemaVersion":1,"displayTimeUnit":"ns","baseTimeNanoseconds":1764750000123456789,"distributedInfo":{{"backend":"none","rank":0,"world_size":1}},"deviceProperties":[{{"id":0,"name":"NVIDIA H200","totalGlobalMem":150000000000}}],"metadata":{{"producer":"dflash","format":"dflash-trace/1","dflash_version":"0.1.0","torch_version":"2.11.0","git_revision":"synthetic","devices":{devices},"gpu_timing":"{timing}","trace_steps":"0..{}","config":{{"seed":{}}}}},"traceEvents":["#,
        spec.steps, spec.seed
    )?;
    w.out.write_all(b"\n")?;
    for (pid, tid, what, name) in [
        (PID, 0, "process_name", "dflash trainer"),
        (PID, TARGET_TID, "thread_name", "target 0 cuda:0"),
        (PID, DRAFTER_TID, "thread_name", "drafter cuda:0"),
        (0, 0, "process_name", "GPU 0"),
        (0, GPU_DRAFTER_TID, "thread_name", "stream 7 (drafter)"),
        (0, GPU_TARGET_TID, "thread_name", "stream 8 (target)"),
    ] {
        w.event(format_args!(
            r#"{{"ph":"M","name":"{what}","pid":{pid},"tid":{tid},"args":{{"name":"{name}"}}}}"#
        ))?;
    }
    let sections = drafter_sections(spec.layers);
    let mut t = 1000.0f64;
    let mut gpu_drafter = 0.0f64;
    let mut gpu_target = 0.0f64;
    let mut depth = 0u32;
    for step in 0..spec.steps {
        let step_start = t;
        // Target side: forward, extract, put (its own thread, overlapping the drafter).
        let mut tt = step_start + 10.0;
        tt = w.section(
            "target.forward",
            TARGET_TID,
            GPU_TARGET_TID,
            tt,
            3000.0,
            1000.0,
            step,
            &mut gpu_target,
        )?;
        tt = w.section(
            "target.extract",
            TARGET_TID,
            GPU_TARGET_TID,
            tt + 2.0,
            300.0,
            250.0,
            step,
            &mut gpu_target,
        )?;
        let put_wait = w.jitter(30.0);
        let put_dur = put_wait + 8.0;
        depth += 1;
        let flow = w.next_flow;
        w.next_flow += 1;
        w.event(format_args!(
            r#"{{"ph":"X","cat":"queue","name":"queue.put","pid":{PID},"tid":{TARGET_TID},"ts":{:.3},"dur":{put_dur:.3},"bind_id":{flow},"flow_out":true,"args":{{"wait_us":{put_wait:.3},"depth":{depth},"batch":{step}}}}}"#,
            tt + 2.0
        ))?;
        w.event(format_args!(
            r#"{{"ph":"C","cat":"queue","name":"queue","pid":{PID},"ts":{:.3},"args":{{"depth":{depth}}}}}"#,
            tt + 2.0 + put_dur
        ))?;

        // Drafter side: ProfilerStep#N > queue.get, drafter.step > sections.
        let get_wait = w.jitter(2300.0 * w.factor("queue.get") * spec.host_factor);
        let get_ts = step_start + 1.0;
        let get_dur = get_wait + 10.0;
        depth = depth.saturating_sub(1);
        w.event(format_args!(
            r#"{{"ph":"X","cat":"queue","name":"queue.get","pid":{PID},"tid":{DRAFTER_TID},"ts":{get_ts:.3},"dur":{get_dur:.3},"bind_id":{flow},"flow_in":true,"args":{{"wait_us":{get_wait:.3},"depth":{depth},"batch":{step}}}}}"#
        ))?;
        w.event(format_args!(
            r#"{{"ph":"C","cat":"queue","name":"queue","pid":{PID},"ts":{:.3},"args":{{"depth":{depth}}}}}"#,
            get_ts + get_dur
        ))?;
        let ds_start = get_ts + get_dur + 2.0;
        let mut d = ds_start + 1.0;
        for (name, cpu, gpu) in &sections {
            if name.starts_with("drafter.layer.") {
                let l0 = d;
                let mut ld = d + 1.0;
                for (sub, c, g) in [("attn", 400.0, 380.0), ("mlp", 350.0, 330.0)] {
                    let sname = format!("{name}.{sub}");
                    ld = w.section(
                        &sname,
                        DRAFTER_TID,
                        GPU_DRAFTER_TID,
                        ld,
                        c,
                        g,
                        step,
                        &mut gpu_drafter,
                    )? + 1.0;
                }
                w.span(
                    "cpu",
                    name,
                    DRAFTER_TID,
                    l0,
                    ld - l0,
                    &format!("\"step\":{step}"),
                )?;
                d = ld + 1.0;
            } else {
                d = w.section(
                    name,
                    DRAFTER_TID,
                    GPU_DRAFTER_TID,
                    d,
                    *cpu,
                    *gpu,
                    step,
                    &mut gpu_drafter,
                )? + 1.0;
            }
        }
        let tokens = 4096;
        let loss = 2.5 / (1.0 + step as f64 * 0.01);
        w.span(
            "cpu",
            "drafter.step",
            DRAFTER_TID,
            ds_start,
            d - ds_start,
            &format!("\"step\":{step},\"tokens\":{tokens},\"loss\":{loss:.4}"),
        )?;
        let step_end = d + 2.0;
        w.span(
            "step",
            &format!("ProfilerStep#{step}"),
            DRAFTER_TID,
            step_start,
            step_end - step_start,
            "",
        )?;
        t = step_end.max(tt) + 1.0;
    }
    w.out.write_all(b"\n]}\n")?;
    w.out.flush()
}

/// A trace as a string, for tests.
pub fn trace_string(spec: &SynthSpec) -> String {
    let mut v = Vec::new();
    write_trace(&mut v, spec).expect("writing to a Vec cannot fail");
    String::from_utf8(v).expect("the generator writes UTF-8")
}
