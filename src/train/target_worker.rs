//! The target workers: one thread per target device, each loading its own frozen target,
//! taking batches from the shared loader, running the forward pass with the tapped layers
//! and putting the hidden states on the bounded queue. Worker 0 also sends the frozen
//! embedding and lm_head the drafter borrows. A worker that fails (or panics) fails the
//! queue, which stops the drafter with its error; a drafter that stops releases them.
use chrome_trace_format::dflash as names;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use tch::{Device, Tensor};

use crate::cuda::{self, CudaError};
use crate::model::ModelError;
use crate::trace;
use crate::trace_name;

use super::data::Loader;
use super::error::TrainError;
use super::plan::{compute_kind, device_name, Plan, TargetSource};
use super::queue::{HiddenQueue, QueueError};
use super::step::Batch;

/// One item on the hidden-state queue.
pub(super) struct Item {
    pub batch: Batch,
    /// Recorded on the producer's stream after the features were computed.
    pub ready: Option<cuda::Event>,
    /// Flow id of the recorded `queue.put`, if it was recorded.
    pub flow: Option<u64>,
}

/// The frozen pieces of the target the drafter borrows, sent once by worker 0.
pub(super) struct TargetHead {
    pub embed: Tensor,
    pub lm_head: Tensor,
}

/// What stops a target worker; the queue carries its message to the drafter.
#[derive(Debug, thiserror::Error)]
enum WorkerError {
    #[error("{0}")]
    Cuda(#[from] CudaError),
    #[error("loading the target: {0}")]
    Load(#[source] ModelError),
    #[error("{0}")]
    Forward(#[from] ModelError),
    #[error("{0}")]
    Queue(#[from] QueueError),
    #[error("injected fault (DFLASH_INJECT_FAULT)")]
    Injected,
}

/// Fails the queue if the worker leaves without finishing normally (error or panic).
struct FailGuard<'a> {
    queue: &'a HiddenQueue<Item>,
    armed: bool,
}

impl Drop for FailGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.queue.fail("the target worker panicked".into());
        }
    }
}

struct WorkerCtx {
    index: usize,
    device: Device,
    source: TargetSource,
    taps: Vec<usize>,
    loader: Arc<Mutex<Loader>>,
    queue: Arc<HiddenQueue<Item>>,
    head_tx: Option<Sender<TargetHead>>,
    /// Traced steps; batch N is consumed by step N.
    window: (i64, i64),
}

/// The running workers.
pub(super) struct Workers {
    pub queue: Arc<HiddenQueue<Item>>,
    /// Worker 0's target head; closed without a message if it failed before sending.
    pub head: Receiver<TargetHead>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts one worker per target device, reading batches from `data_position` on.
    pub fn start(plan: &Plan, data_position: u64) -> Result<Workers, TrainError> {
        let cfg = &plan.cfg;
        let loader = Arc::new(Mutex::new(Loader::new(
            plan.data.train.clone(),
            cfg.batch_tokens,
            cfg.seed,
            plan.pad,
            data_position,
        )));
        let queue = Arc::new(HiddenQueue::<Item>::new(
            cfg.queue_capacity,
            plan.target_devices.len(),
        ));
        let (head_tx, head) = crossbeam_channel::bounded(1);
        let mut handles = Vec::new();
        for (i, &device) in plan.target_devices.iter().enumerate() {
            let ctx = WorkerCtx {
                index: i,
                device,
                source: plan.source.clone(),
                taps: plan.drafter_cfg.target_layer_ids.clone(),
                loader: loader.clone(),
                queue: queue.clone(),
                head_tx: (i == 0).then(|| head_tx.clone()),
                window: plan.window,
            };
            let h = std::thread::Builder::new()
                .name(format!("target-{i}"))
                .spawn(move || target_worker(ctx))
                .map_err(TrainError::Spawn)?;
            handles.push(h);
        }
        Ok(Workers {
            queue,
            head,
            handles,
        })
    }

    /// Stops the producers whatever happened (`why` is what they are told) and waits.
    pub fn stop(self, why: String) {
        self.queue.stop(why);
        for h in self.handles {
            let _ = h.join();
        }
    }
}

fn target_worker(ctx: WorkerCtx) {
    let queue = ctx.queue.clone();
    let mut guard = FailGuard {
        queue: &queue,
        armed: true,
    };
    match target_loop(ctx) {
        Ok(()) => queue.producer_done(),
        Err(e) => queue.fail(e.to_string()),
    }
    guard.armed = false;
}

fn target_loop(ctx: WorkerCtx) -> Result<(), WorkerError> {
    trace::set_thread_name(&format!("target {} {}", ctx.index, device_name(ctx.device)));
    trace::set_thread_recording(false);
    let stream = match ctx.device {
        Device::Cuda(i) => {
            let s = cuda::use_new_stream(i)?;
            trace::bind_gpu(i, &format!("target {}", ctx.index));
            Some(s)
        }
        _ => None,
    };
    let kind = compute_kind(ctx.device);
    let target = ctx
        .source
        .load(ctx.device, kind)
        .map_err(WorkerError::Load)?;
    if let Some(s) = &stream {
        // the drafter reads the embedding and lm_head from its own stream
        super::step::count_host_sync();
        s.synchronize()?;
    }
    if let Some(tx) = &ctx.head_tx {
        let head = TargetHead {
            embed: target.model.embed_tokens.shallow_clone(),
            lm_head: target.model.lm_head.shallow_clone(),
        };
        if tx.send(head).is_err() {
            return Ok(());
        }
    }
    let fail_at = injected_fault("target");
    loop {
        let mut loader = ctx.loader.lock().unwrap_or_else(|e| e.into_inner());
        if fail_at.is_some_and(|n| loader.position >= n) {
            return Err(WorkerError::Injected);
        }
        let host = loader.next_batch();
        drop(loader);
        let index = host.index;
        // batch N feeds step N: record the batches of the traced steps, on this side too
        let traced = (ctx.window.0..ctx.window.1).contains(&(index as i64));
        trace::set_thread_recording(traced);
        if traced {
            cuda::capture::enter_window();
        }
        let out = {
            let mut s = trace::gpu_span(trace_name!(names::TARGET_FORWARD));
            s.arg(names::args::BATCH, index);
            let ids = host.input_ids.to_device(ctx.device);
            tch::no_grad(|| target.model.forward(&ids, &ctx.taps, false))?
        };
        let features = {
            let _s = trace::gpu_span(trace_name!(names::TARGET_EXTRACT));
            Tensor::cat(&out.hidden, -1)
        };
        drop(out);
        let ready = match (&stream, ctx.device) {
            (Some(s), Device::Cuda(i)) => {
                let ev = cuda::Event::new(i)?;
                ev.record(s)?;
                Some(ev)
            }
            _ => None,
        };
        let batch = Batch {
            input_ids: host.input_ids,
            loss_mask: host.loss_mask,
            features,
            index,
        };
        if !put(&ctx.queue, batch, ready)? {
            return Ok(());
        }
    }
}

/// Puts one batch on the queue, traced with its flow; `false` once the drafter stopped
/// (done, a signal or its own error).
fn put(
    queue: &HiddenQueue<Item>,
    batch: Batch,
    ready: Option<cuda::Event>,
) -> Result<bool, WorkerError> {
    let index = batch.index;
    let mut span = trace::queue_span(trace_name!(names::QUEUE_PUT));
    let flow = span.is_recording().then(trace::next_flow_id);
    if let Some(id) = flow {
        span.flow_out(id);
    }
    match queue.put(Item { batch, ready, flow }) {
        Ok(info) => {
            span.arg(names::args::WAIT_US, info.wait.as_secs_f64() * 1e6);
            span.arg(names::args::DEPTH, info.depth as u64);
            span.arg(names::args::BATCH, index);
            trace::counter(
                trace_name!(names::QUEUE_COUNTER),
                names::QUEUE_DEPTH,
                info.depth as f64,
            );
            Ok(true)
        }
        Err(QueueError::ConsumerStopped(_)) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `DFLASH_INJECT_FAULT=target:N` or `drafter:N` makes that side fail at batch/step N, to
/// exercise shutdown propagation end to end.
pub(super) fn injected_fault(side: &str) -> Option<u64> {
    let v = std::env::var("DFLASH_INJECT_FAULT").ok()?;
    let (s, n) = v.split_once(':')?;
    (s == side).then(|| n.parse().ok()).flatten()
}
