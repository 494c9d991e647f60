//! The [`Recorder`] handle: starts a trace file and its writer thread, switches
//! recording on and off for a window of steps, hands out live statistics, and finishes
//! the file. One recorder runs at a time in a process (the span functions are global).
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use chrome_trace_format::header::meta::{GPU_TIMING, GPU_TIMING_NONE};
use chrome_trace_format::tracks::trainer_pid;
use chrome_trace_format::{DeviceEntry, Header};

use crate::backend::GpuBackend;
use crate::calib;
use crate::clock::{clock, Timebase};
use crate::external::Appender;
use crate::holds;
use crate::resolve::Resolver;
use crate::sink::Out;
use crate::state::PROCESS;
use crate::stats::{snapshot, SharedStats, Stats, Summary};
use crate::thread::{gpu_timing_cost, registry, reset_gpu_timing_cost};
use crate::writer::{Cmd, Writer, WriterConfig};

pub use chrome_trace_format::DistributedInfo;

/// Errors of the recorder.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot create trace file {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("a trace recorder is already running in this process")]
    AlreadyRunning,
    #[error("cannot start the trace writer thread: {0}")]
    Spawn(std::io::Error),
    #[error("the trace writer thread is gone (it panicked)")]
    WriterGone,
    #[error("trace writer: {0}")]
    Write(#[source] std::io::Error),
    #[error("trace metadata cannot be serialized: {0}")]
    Metadata(#[from] serde_json::Error),
}

/// How to start a [`Recorder`]. `RecorderConfig { path, ..Default::default() }` is a
/// CPU-only trace, recording from the start, flushed every 500 ms.
#[derive(Clone)]
pub struct RecorderConfig {
    /// `trace.json`, or `trace.json.gz` with `gzip`.
    pub path: PathBuf,
    pub gzip: bool,
    /// Written as the top-level `metadata` object; `gpu_timing` is added unless present.
    pub metadata: serde_json::Value,
    /// At most this much recorded time is lost if the process is killed. Default 500 ms.
    pub flush_interval: Duration,
    /// GPU timing backend; `None` records no GPU spans (`gpu_timing: "none"`).
    pub gpu: Option<Arc<dyn GpuBackend>>,
    /// `process_name` of the recording process's track. Default "trainer".
    pub process_name: String,
    pub distributed: DistributedInfo,
    /// Whether spans record from the start (else from the first `set_active(true)`).
    /// Default true.
    pub active: bool,
    /// Keep every GPU span written and each thread's OS id, for an [`Appender`] given
    /// to [`Recorder::finish_with`]. Default false.
    pub keep_gpu_spans: bool,
}

impl Default for RecorderConfig {
    fn default() -> Self {
        RecorderConfig {
            path: PathBuf::from("trace.json"),
            gzip: false,
            metadata: serde_json::Value::Object(Default::default()),
            flush_interval: Duration::from_millis(500),
            gpu: None,
            process_name: "trainer".into(),
            distributed: DistributedInfo::default(),
            active: true,
            keep_gpu_spans: false,
        }
    }
}

/// The running recorder. Dropping it finishes the file (errors ignored); call
/// [`finish`](Self::finish) to see them.
pub struct Recorder {
    tx: mpsc::Sender<Cmd>,
    join: Option<JoinHandle<()>>,
    stats: SharedStats,
    path: PathBuf,
}

/// Unsets the process's `running` flag unless defused, so a failed start leaves the
/// process clean.
struct StartGuard(bool);
impl Drop for StartGuard {
    fn drop(&mut self) {
        if !self.0 {
            calib::set_backend(None);
            calib::reset();
            PROCESS.running.store(false, Ordering::Release);
        }
    }
}

impl Recorder {
    /// Creates the file, writes its header and starts the writer thread. Fails if the
    /// file cannot be created or another recorder is running.
    pub fn start(cfg: RecorderConfig) -> Result<Recorder, TraceError> {
        if PROCESS
            .running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(TraceError::AlreadyRunning);
        }
        let mut guard = StartGuard(false);
        // Calibrates the TSC once per process (up to ~200 ms) before any span needs it.
        let _ = clock();
        let mut out = Out::create(&cfg.path, cfg.gzip).map_err(|source| TraceError::Create {
            path: cfg.path.clone(),
            source,
        })?;
        calib::reset();
        calib::set_backend(cfg.gpu.clone());
        PROCESS.dropped.store(0, Ordering::Relaxed);
        PROCESS.gpu_errors.store(0, Ordering::Relaxed);
        reset_gpu_timing_cost();
        let tb = Timebase::now();
        let header = header(&cfg, &tb)?;
        // the header reaches the file at once: a run killed in its first second still
        // leaves a trace that names its producer
        out.write_all(header.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|source| TraceError::Create {
                path: cfg.path.clone(),
                source,
            })?;
        // Threads bound before the recorder started get their device calibrated now.
        for slot in registry() {
            let dev = slot.meta().gpu.as_ref().map(|g| g.0);
            if let Some(d) = dev {
                calib::ensure_calibrated(d);
            }
        }
        let stats = SharedStats::default();
        let mut writer = Writer::new(WriterConfig {
            sink: out,
            path: cfg.path.clone(),
            pid: trainer_pid(std::process::id()),
            tb,
            flush_interval: cfg.flush_interval.max(Duration::from_millis(1)),
            resolver: cfg.gpu.clone().map(Resolver::new),
            stats: stats.clone(),
            keep_gpu_spans: cfg.keep_gpu_spans,
        });
        writer.process_meta(&cfg.process_name);
        let (tx, rx) = mpsc::channel();
        let join = std::thread::Builder::new()
            .name("trace-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(TraceError::Spawn)?;
        guard.0 = true;
        PROCESS.active.store(cfg.active, Ordering::Release);
        Ok(Recorder {
            tx,
            join: Some(join),
            stats,
            path: cfg.path,
        })
    }

    /// Starts or stops recording (the traced step window). Spans that began while
    /// active are still recorded when they end.
    pub fn set_active(&self, active: bool) {
        PROCESS.active.store(active, Ordering::Release);
    }

    pub fn is_active(&self) -> bool {
        PROCESS.active.load(Ordering::Relaxed)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Drains every thread's events into the file and flushes it; returns once done.
    /// GPU spans whose events have not completed yet follow later.
    pub fn flush(&self) -> Result<(), TraceError> {
        let (ack, done) = mpsc::channel();
        self.tx
            .send(Cmd::Flush(ack))
            .map_err(|_| TraceError::WriterGone)?;
        done.recv().map_err(|_| TraceError::WriterGone)
    }

    /// Per-name totals of the spans the writer has processed since the last snapshot
    /// (it drains every <= 100 ms, so the newest spans may be in the next one). GPU
    /// totals count GPU spans as they resolve.
    pub fn stats_snapshot(&self) -> Stats {
        Stats {
            names: snapshot(&self.stats),
            dropped_events: PROCESS.dropped.load(Ordering::Relaxed),
            gpu_errors: PROCESS.gpu_errors.load(Ordering::Relaxed),
            gpu_cost: gpu_timing_cost(),
        }
    }

    /// Stops recording, writes the remaining events (waiting up to 2 s for outstanding
    /// GPU spans), closes the `traceEvents` array and the file.
    pub fn finish(mut self) -> Result<Summary, TraceError> {
        self.finish_inner(None)
    }

    /// [`finish`](Self::finish), with `append` writing events of the caller's own into
    /// the file after the last GPU span and before the file is closed (on the writer
    /// thread; see [`FinishView`](crate::FinishView)).
    pub fn finish_with(mut self, append: Appender) -> Result<Summary, TraceError> {
        self.finish_inner(Some(append))
    }

    fn finish_inner(&mut self, append: Option<Appender>) -> Result<Summary, TraceError> {
        let Some(join) = self.join.take() else {
            return Err(TraceError::WriterGone);
        };
        PROCESS.active.store(false, Ordering::Release);
        let (ack, done) = mpsc::channel();
        let sent = self.tx.send(Cmd::Finish(ack, append)).is_ok();
        let result = if sent { done.recv().ok() } else { None };
        let joined = join.join();
        if let Some(b) = calib::backend() {
            calib::release_cals(&*b);
            holds::release_held(&*b);
        }
        calib::set_backend(None);
        calib::reset();
        PROCESS.running.store(false, Ordering::Release);
        match (result, joined) {
            (Some(Ok(s)), Ok(())) => Ok(s),
            (Some(Err(e)), _) => Err(TraceError::Write(e)),
            _ => Err(TraceError::WriterGone),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.join.is_some() {
            let _ = self.finish_inner(None);
        }
    }
}

fn header(cfg: &RecorderConfig, tb: &Timebase) -> Result<String, TraceError> {
    let mut metadata = match &cfg.metadata {
        serde_json::Value::Object(m) => m.clone(),
        serde_json::Value::Null => Default::default(),
        other => {
            let mut m = serde_json::Map::new();
            m.insert("value".into(), other.clone());
            m
        }
    };
    let timing = cfg
        .gpu
        .as_ref()
        .map_or(GPU_TIMING_NONE, |g| g.timing_name());
    metadata
        .entry(GPU_TIMING)
        .or_insert_with(|| serde_json::Value::from(timing));
    let devices: Vec<DeviceEntry> = match &cfg.gpu {
        Some(g) => (0..g.device_count())
            .filter_map(|id| {
                g.device_properties(id).map(|p| DeviceEntry {
                    id,
                    name: p.name,
                    total_global_mem: p.total_global_mem,
                })
            })
            .collect(),
        None => Vec::new(),
    };
    Ok(Header {
        base_time_ns: tb.base_unix_ns,
        distributed: &cfg.distributed,
        devices: &devices,
        metadata: &metadata,
    }
    .to_json()?)
}
