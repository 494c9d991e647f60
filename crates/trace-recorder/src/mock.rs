//! A scripted [`GpuBackend`] for tests and benches, so the GPU half of the recorder is
//! exercised on machines without a GPU. Its "GPU clock" is the host's monotonic clock;
//! each stream executes in order: an event recorded at host time `t` on a stream gets
//! GPU time `max(t + launch_latency, previous event on the stream + work_per_event)` and
//! completes once the host clock passes that time (unless [`MockGpu::hold`] is set).
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backend::{DeviceProperties, GpuBackend, GpuError, GpuEvent};

thread_local! {
    static STREAM: Cell<u64> = const { Cell::new(7) };
}

#[derive(Clone, Copy)]
struct Ev {
    gpu_ns: i64,
    /// Host time from which `query` reports it complete.
    done_ns: i64,
    in_use: bool,
}

#[derive(Default)]
struct State {
    events: Vec<Ev>,
    free: Vec<usize>,
    streams: HashMap<(usize, u64), i64>,
    recorded: u64,
}

/// The mock GPU. Share it as `Arc<MockGpu>` and pass a clone as the recorder's backend.
pub struct MockGpu {
    epoch: Instant,
    devices: usize,
    /// Host-to-GPU delay of a recorded event.
    pub launch_latency: Duration,
    /// GPU time between consecutive events of a stream (the "kernels" between them).
    pub work_per_event: Duration,
    /// Added to the GPU time of calibration events while their completion time stays
    /// put: a positive skew makes the recorder's mapping place spans too early, which it
    /// must correct (no GPU span before its CPU span).
    cal_skew_ns: AtomicI64,
    hold: AtomicBool,
    fail: AtomicBool,
    /// CPU time each record takes (spun), in ns.
    record_cost_ns: AtomicU64,
    state: Mutex<State>,
}

impl MockGpu {
    pub fn new(devices: usize, launch_latency: Duration, work_per_event: Duration) -> Self {
        MockGpu {
            epoch: Instant::now(),
            devices,
            launch_latency,
            work_per_event,
            cal_skew_ns: AtomicI64::new(0),
            hold: AtomicBool::new(false),
            fail: AtomicBool::new(false),
            record_cost_ns: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        }
    }

    /// Sets the current stream key of the calling thread (default 7).
    pub fn set_current_stream(stream: u64) {
        STREAM.with(|s| s.set(stream));
    }

    pub fn set_cal_skew(&self, ns: i64) {
        self.cal_skew_ns.store(ns, Ordering::Relaxed);
    }

    /// While set, no event completes (a busy GPU).
    pub fn hold(&self, on: bool) {
        self.hold.store(on, Ordering::Relaxed);
    }

    /// While set, recording fails.
    pub fn fail_records(&self, on: bool) {
        self.fail.store(on, Ordering::Relaxed);
    }

    /// Makes every record (span and calibration events) take `cost` of CPU time, as a
    /// real driver call does.
    pub fn set_record_cost(&self, cost: Duration) {
        self.record_cost_ns
            .store(cost.as_nanos() as u64, Ordering::Relaxed);
    }

    fn spend_record_cost(&self) {
        let ns = self.record_cost_ns.load(Ordering::Relaxed);
        if ns > 0 {
            let t = Instant::now();
            while (t.elapsed().as_nanos() as u64) < ns {
                std::hint::spin_loop();
            }
        }
    }

    /// Events taken from the pool and not yet released.
    pub fn outstanding(&self) -> usize {
        let s = self.lock();
        s.events.iter().filter(|e| e.in_use).count()
    }

    /// Events created so far (the pool's size).
    pub fn created(&self) -> usize {
        self.lock().events.len()
    }

    /// Events recorded so far (calibrations included).
    pub fn recorded(&self) -> u64 {
        self.lock().recorded
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn host_ns(&self) -> i64 {
        self.epoch.elapsed().as_nanos() as i64
    }

    /// An event from the pool (or a new one), in use from now on.
    fn claim(&self, s: &mut State, gpu_ns: i64, done_ns: i64) -> GpuEvent {
        let ev = Ev {
            gpu_ns,
            done_ns,
            in_use: true,
        };
        let i = match s.free.pop() {
            Some(i) => {
                s.events[i] = ev;
                i
            }
            None => {
                s.events.push(ev);
                s.events.len() - 1
            }
        };
        // Handles start at 1: 0 means "no event" to the recorder.
        GpuEvent(i as u64 + 1)
    }

    fn get(&self, s: &State, ev: GpuEvent) -> Result<Ev, GpuError> {
        (ev.0 as usize)
            .checked_sub(1)
            .and_then(|i| s.events.get(i))
            .filter(|e| e.in_use)
            .copied()
            .ok_or(GpuError {
                op: "mock event",
                message: format!("unknown or released event {}", ev.0),
            })
    }
}

impl GpuBackend for MockGpu {
    fn timing_name(&self) -> &'static str {
        chrome_trace_format::header::meta::GPU_TIMING_CUDA_EVENTS
    }

    fn device_count(&self) -> usize {
        self.devices
    }

    fn device_properties(&self, _device: usize) -> Option<DeviceProperties> {
        Some(DeviceProperties {
            name: "Mock GPU".into(),
            total_global_mem: 80 << 30,
        })
    }

    fn current_stream(&self, _device: usize) -> Result<u64, GpuError> {
        Ok(STREAM.with(Cell::get))
    }

    fn take(&self, device: usize, n: usize, out: &mut Vec<GpuEvent>) -> Result<(), GpuError> {
        if device >= self.devices {
            return Err(GpuError {
                op: "mock take",
                message: format!("no device {device}"),
            });
        }
        let mut s = self.lock();
        for k in 0..n.max(1) {
            if k > 0 && s.free.is_empty() {
                break;
            }
            let ev = self.claim(&mut s, 0, 0);
            out.push(ev);
        }
        Ok(())
    }

    fn record(&self, device: usize, event: GpuEvent) -> Result<u64, GpuError> {
        if self.fail.load(Ordering::Relaxed) || device >= self.devices {
            return Err(GpuError {
                op: "mock record",
                message: "scripted failure".into(),
            });
        }
        self.spend_record_cost();
        let stream = STREAM.with(Cell::get);
        let now = self.host_ns();
        let mut s = self.lock();
        self.get(&s, event)?;
        let prev = s.streams.get(&(device, stream)).copied();
        let t = match prev {
            Some(p) => (now + self.launch_latency.as_nanos() as i64)
                .max(p + self.work_per_event.as_nanos() as i64),
            None => now + self.launch_latency.as_nanos() as i64,
        };
        s.streams.insert((device, stream), t);
        s.recorded += 1;
        let e = &mut s.events[event.0 as usize - 1];
        e.gpu_ns = t;
        e.done_ns = t;
        Ok(stream)
    }

    fn record_calibration(&self, device: usize) -> Result<GpuEvent, GpuError> {
        if device >= self.devices {
            return Err(GpuError {
                op: "mock calibration",
                message: format!("no device {device}"),
            });
        }
        self.spend_record_cost();
        let now = self.host_ns();
        let skew = self.cal_skew_ns.load(Ordering::Relaxed);
        let mut s = self.lock();
        // A skewed calibration event completes on time; only its reported GPU time is
        // off.
        s.recorded += 1;
        Ok(self.claim(&mut s, now + skew, now))
    }

    fn query(&self, ev: GpuEvent) -> Result<bool, GpuError> {
        let s = self.lock();
        let e = self.get(&s, ev)?;
        if self.hold.load(Ordering::Relaxed) {
            return Ok(false);
        }
        Ok(self.host_ns() >= e.done_ns)
    }

    fn elapsed_ms(&self, start: GpuEvent, end: GpuEvent) -> Result<f64, GpuError> {
        let s = self.lock();
        let a = self.get(&s, start)?;
        let b = self.get(&s, end)?;
        Ok((b.gpu_ns - a.gpu_ns) as f64 / 1e6)
    }

    fn reserve(&self, _device: usize, free: usize) {
        let mut s = self.lock();
        while s.free.len() < free {
            s.events.push(Ev {
                gpu_ns: 0,
                done_ns: 0,
                in_use: false,
            });
            let i = s.events.len() - 1;
            s.free.push(i);
        }
    }

    fn release(&self, _device: usize, ev: GpuEvent) {
        let mut s = self.lock();
        if let Some(i) = (ev.0 as usize).checked_sub(1) {
            if s.events.get(i).is_some_and(|e| e.in_use) {
                s.events[i].in_use = false;
                s.free.push(i);
            }
        }
    }
}
