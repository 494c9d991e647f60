//! One drafter training step, section by section: host-to-device copy, anchors, noised
//! block embedding, RoPE tables, masks, fc, layers, final norm, chunked lm_head loss,
//! backward, gradient clipping and the AdamW update. Each section is a trace span at its
//! call site; the model code itself carries no instrumentation.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use chrome_trace_format::dflash as names;
use rand::Rng;
use tch::{Device, Kind, Tensor};

use crate::cuda;

use crate::model::drafter::LayerMasks;
use crate::model::layers::Rope;
use crate::model::objective::{self, LossOutput};
use crate::model::{Drafter, LayerType, ModelError};
use crate::trace::{self, Name};
use crate::trace_name;

use super::optim::{AdamW, AdamWConfig};

/// Seed of step `step`'s anchor draw: a function of the run seed and the step alone, so a
/// resumed run draws what the straight run drew.
pub fn step_seed(seed: u64, step: i64) -> u64 {
    seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// One batch as the target side hands it over.
pub struct Batch {
    /// `[B, S]` i64, on the host.
    pub input_ids: Tensor,
    /// `[B, S]` (any integer/float kind; nonzero = train on it), on the host.
    pub loss_mask: Tensor,
    /// `[B, S, L_d * H]`, on the target's device.
    pub features: Tensor,
    /// Batch sequence number from the data loader.
    pub index: u64,
}

/// Settings of the drafter step.
#[derive(Debug, Clone, Copy)]
pub struct StepConfig {
    pub num_anchors: i64,
    pub gamma: f64,
    pub chunk_blocks: i64,
    /// Blocks per attention query group (see `objective::query_groups`).
    pub attn_group_blocks: i64,
    /// Blocks per batched attention group (see `objective::batched_block_mask`); 0: off.
    /// The trainer sets it from `TrainConfig::effective_batch_blocks`, 0 whenever
    /// `attn_group_blocks` is set.
    pub attn_batch_blocks: i64,
    /// The loss through `objective::weighted_ce_fused` (else the autograd path).
    pub fused_loss: bool,
    pub grad_clip: f64,
}

/// What one step measured (all host values).
#[derive(Debug, Clone, Copy, Default)]
pub struct StepMetrics {
    pub loss: f64,
    pub accuracy: f64,
    pub tau_hat: f64,
    /// Tokens in the batch (B * S).
    pub tokens: i64,
    pub grad_norm: f64,
}

/// Validation mode: time each section also by synchronizing the thread's stream before
/// and after it (slow; for checking CUDA-event GPU times against the CPU clock).
static SYNC_SECTIONS: AtomicBool = AtomicBool::new(false);
/// Host synchronizations the trainer's own code made (reading metrics, waiting for a
/// stream), all threads, since the process started.
static HOST_SYNCS: AtomicU64 = AtomicU64::new(0);

/// Counts one host synchronization made by our code.
pub(crate) fn count_host_sync() {
    HOST_SYNCS.fetch_add(1, Ordering::Relaxed);
}

/// Host synchronizations made by our code so far.
pub(crate) fn host_syncs() -> u64 {
    HOST_SYNCS.load(Ordering::Relaxed)
}
/// Synchronized wall times per section name, in ns (collected while tracing is on).
static SYNC_TIMES: Mutex<BTreeMap<String, (u64, u64)>> = Mutex::new(BTreeMap::new());

pub fn set_sync_sections(on: bool) {
    SYNC_SECTIONS.store(on, Ordering::Relaxed);
}

/// `name -> (count, total ns)` of the synchronized timings, cleared.
pub fn take_sync_times() -> BTreeMap<String, (u64, u64)> {
    std::mem::take(&mut *SYNC_TIMES.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A GPU-timed section; in validation mode also synchronized and wall-timed.
pub struct Section {
    _span: trace::Span,
    sync: Option<(Name, cuda::Stream, Instant)>,
}

pub fn section(name: Name, device: Device) -> Section {
    let sync = match device {
        Device::Cuda(i) if SYNC_SECTIONS.load(Ordering::Relaxed) && trace::enabled() => {
            cuda::current_stream(i).ok().and_then(|s| {
                count_host_sync();
                s.synchronize().ok().map(|_| (name, s, Instant::now()))
            })
        }
        _ => None,
    };
    let span = trace::gpu_span(name);
    // only sections that are traced are compared with their GPU spans
    let sync = sync.filter(|_| span.is_recording());
    Section { _span: span, sync }
}

impl Drop for Section {
    fn drop(&mut self) {
        if let Some((name, stream, t0)) = self.sync.take() {
            count_host_sync();
            let _ = stream.synchronize();
            let ns = t0.elapsed().as_nanos() as u64;
            let mut map = SYNC_TIMES.lock().unwrap_or_else(|e| e.into_inner());
            let e = map.entry(name.text().to_string()).or_insert((0, 0));
            e.0 += 1;
            e.1 += ns;
        }
    }
}

/// Span names of per-layer sections, interned once.
struct LayerNames {
    layer: Name,
    attn: Name,
    mlp: Name,
}

/// The drafter, its optimizer and the frozen target pieces it borrows.
pub struct DrafterTrainer {
    pub drafter: Drafter,
    pub vs: tch::nn::VarStore,
    pub opt: AdamW,
    embed: Tensor,
    lm_head: Tensor,
    pub device: Device,
    pub kind: Kind,
    pub cfg: StepConfig,
    weights: Tensor,
    layer_names: Vec<LayerNames>,
}

/// `t` on `device`. From the host to CUDA through pinned memory: a copy the host does not
/// wait for. A copy from pageable memory returns only when the stream has run everything
/// queued before it, so preparing the next step during this one's backward would stall
/// there, and the GPU would then idle while the host prepared the rest.
fn upload(t: &Tensor, device: Device) -> Result<Tensor, ModelError> {
    if device.is_cuda() && t.device() == Device::Cpu {
        Ok(t.f_pin_memory(device)?
            .f_to_device_(device, t.kind(), true, false)?)
    } else {
        Ok(t.f_to_device(device)?)
    }
}

/// A step's weight-independent inputs, from [`DrafterTrainer::prepare`].
pub struct Prepared {
    input_ids: Tensor,
    loss_mask: Tensor,
    features: Tensor,
    anchors: objective::Anchors,
    noise: Tensor,
    rope: Rope,
    masks: LayerMasks,
}

/// A step whose update is launched, its metrics not yet read
/// ([`DrafterTrainer::launch_step`]).
pub struct Launched {
    out: LossOutput,
    m: Tensor,
    norm: Tensor,
}

impl DrafterTrainer {
    /// `embed` and `lm_head` are the target's frozen `[vocab, H]` tensors; they are copied
    /// to the drafter's device if needed. The drafter's variables are cast to `kind`, with
    /// fp32 master weights in the optimizer.
    pub fn new(
        drafter: Drafter,
        mut vs: tch::nn::VarStore,
        embed: &Tensor,
        lm_head: &Tensor,
        kind: Kind,
        cfg: StepConfig,
        adamw: AdamWConfig,
    ) -> Result<Self, ModelError> {
        let device = vs.device();
        vs.set_kind(kind);
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let opt = AdamW::new(named, adamw)?;
        let layer_names = (0..drafter.layers.len())
            .map(|i| LayerNames {
                layer: trace::intern(&names::layer(i)),
                attn: trace::intern(&names::layer_attn(i)),
                mlp: trace::intern(&names::layer_mlp(i)),
            })
            .collect();
        let weights = objective::decay_weights(drafter.cfg.block_size, cfg.gamma, device);
        Ok(Self {
            embed: embed.detach().to_device(device).to_kind(kind),
            lm_head: lm_head.detach().to_device(device).to_kind(kind),
            drafter,
            vs,
            opt,
            device,
            kind,
            cfg,
            weights,
            layer_names,
        })
    }

    /// Forward pass and loss of one batch, instrumented. Returns the loss output and the
    /// weight mask `m`.
    pub fn forward(
        &self,
        batch: &Batch,
        rng: &mut impl Rng,
    ) -> Result<(LossOutput, Tensor), ModelError> {
        let prep = self.prepare(batch, rng)?;
        self.forward_prepared(&prep)
    }

    /// The inputs of a step's forward that do not depend on the drafter's weights: the
    /// batch on the device, the anchors (drawn from `rng`), the noised block's embedding,
    /// the rotary tables and the attention masks. Made ahead, while the previous step
    /// still runs on the GPU (see [`DrafterTrainer::launch_step`]), they cost the GPU no
    /// idle time between steps.
    pub fn prepare(&self, batch: &Batch, rng: &mut impl Rng) -> Result<Prepared, ModelError> {
        let cfg = &self.drafter.cfg;
        let bs = cfg.block_size;
        let s = batch.input_ids.size()[1];
        let (input_ids, loss_mask, features) = {
            let _s = section(trace_name!(names::DRAFTER_H2D), self.device);
            (
                upload(&batch.input_ids, self.device)?,
                upload(&batch.loss_mask, self.device)?,
                batch
                    .features
                    .f_to_device(self.device)?
                    .f_to_kind(self.kind)?,
            )
        };
        let (anchors, groups) = {
            let _s = trace::span(trace_name!(names::DRAFTER_ANCHORS));
            let a = objective::sample_anchors(&batch.loss_mask, self.cfg.num_anchors, rng)?;
            let groups = objective::query_groups(
                &Vec::<i64>::try_from(a.anchors.reshape([-1]))?,
                &Vec::<bool>::try_from(a.keep.reshape([-1]))?,
                self.cfg.num_anchors,
                s,
                bs,
                self.cfg.attn_group_blocks,
            );
            let a = objective::Anchors {
                anchors: upload(&a.anchors, self.device)?,
                keep: upload(&a.keep, self.device)?,
            };
            (a, groups)
        };
        let noise = {
            let _s = section(trace_name!(names::DRAFTER_NOISE_EMBED), self.device);
            let ids =
                objective::noise_block_ids(&input_ids, &anchors.anchors, bs, cfg.mask_token_id);
            Tensor::embedding(&self.embed, &ids, -1, false, false)
        };
        let rope = {
            let _s = section(trace_name!(names::DRAFTER_ROPE), self.device);
            let pos = objective::positions(s, &anchors.anchors, bs);
            Rope::new(&pos, cfg.head_dim, cfg.rope_theta, self.kind)
        };
        let masks = {
            let _s = section(trace_name!(names::DRAFTER_MASK), self.device);
            let (a, keep) = (&anchors.anchors, &anchors.keep);
            // batched groups, else query groups or the dense mask (one group over every key)
            let grouped = |window| match self.cfg.attn_batch_blocks {
                0 => {
                    let dense = objective::block_mask(a, keep, s, bs, window);
                    objective::group_masks(&dense, &groups, s, self.kind)
                }
                n => {
                    let len = objective::batch_blocks(self.cfg.num_anchors, n) * bs;
                    objective::batched_block_mask(a, keep, s, bs, window, len, self.kind)
                }
            };
            let full = grouped(None);
            let sliding = cfg
                .layer_types
                .contains(&LayerType::Sliding)
                .then(|| grouped(Some(cfg.sliding_window)));
            LayerMasks { full, sliding }
        };
        Ok(Prepared {
            input_ids,
            loss_mask,
            features,
            anchors,
            noise,
            rope,
            masks,
        })
    }

    /// The forward pass and loss from [`DrafterTrainer::prepare`]'s inputs.
    pub fn forward_prepared(&self, prep: &Prepared) -> Result<(LossOutput, Tensor), ModelError> {
        let cfg = &self.drafter.cfg;
        let bs = cfg.block_size;
        let Prepared {
            input_ids,
            loss_mask,
            features,
            anchors,
            noise,
            rope,
            masks,
        } = prep;
        let ctx = {
            let _s = section(trace_name!(names::DRAFTER_FC), self.device);
            self.drafter.context(features)
        };
        let mut x = noise.shallow_clone();
        for (layer, names) in self.drafter.layers.iter().zip(&self.layer_names) {
            let _l = section(names.layer, self.device);
            x = {
                let _s = section(names.attn, self.device);
                layer.attn_block(&x, &ctx, rope, masks.for_layer(layer.layer_type))
            };
            x = {
                let _s = section(names.mlp, self.device);
                layer.mlp_block(&x)
            };
        }
        let hidden = {
            let _s = section(trace_name!(names::DRAFTER_NORM), self.device);
            self.drafter.final_norm(&x)
        };
        let _s = section(trace_name!(names::DRAFTER_LM_HEAD_LOSS), self.device);
        let (labels, m) =
            objective::labels_and_mask(input_ids, loss_mask, &anchors.anchors, &anchors.keep, bs);
        let (head, w, chunk) = (&self.lm_head, &self.weights, self.cfg.chunk_blocks);
        let out = if self.cfg.fused_loss {
            objective::weighted_ce_fused(
                &hidden,
                head,
                &labels,
                &m,
                w,
                chunk,
                objective::FIRST_WEIGHTED,
            )
        } else {
            objective::weighted_ce_chunked(&hidden, head, &labels, &m, w, chunk)
        };
        Ok((out, m))
    }

    /// Forward, backward, clip and AdamW update at learning rate `lr`.
    pub fn train_step(
        &mut self,
        batch: &Batch,
        rng: &mut impl Rng,
        lr: f64,
    ) -> Result<StepMetrics, ModelError> {
        let prep = self.prepare(batch, rng)?;
        let launched = self.launch_step(&prep, lr)?;
        self.finish_step(launched, batch)
    }

    /// [`DrafterTrainer::train_step`] up to its metrics: forward, backward, clip and
    /// AdamW update from prepared inputs, launched. On CUDA the host returns while the GPU
    /// still runs the backward, in time to [`send_metrics`](DrafterTrainer::send_metrics)
    /// and [`prepare`](DrafterTrainer::prepare) the next step before it waits for this
    /// one's metrics ([`PendingMetrics::wait`]).
    pub fn launch_step(&mut self, prep: &Prepared, lr: f64) -> Result<Launched, ModelError> {
        let (out, m) = self.forward_prepared(prep)?;
        {
            let _s = section(trace_name!(names::DRAFTER_BACKWARD), self.device);
            out.loss.f_backward()?;
        }
        // the clip section computes the norm and the divisor; the optimizer's pass divides
        let (grad, norm, divisor) = {
            let _s = section(trace_name!(names::DRAFTER_CLIP), self.device);
            let grad = self.opt.flat_grad();
            let (norm, divisor) = AdamW::clip_divisor(&grad, self.cfg.grad_clip);
            (grad, norm, divisor)
        };
        {
            let _s = section(trace_name!(names::DRAFTER_OPTIMIZER), self.device);
            self.opt.step_divided(&grad, lr, Some(&divisor));
        }
        Ok(Launched { out, m, norm })
    }

    /// Reads a launched step's metrics: the step's one host sync.
    pub fn finish_step(
        &self,
        launched: Launched,
        batch: &Batch,
    ) -> Result<StepMetrics, ModelError> {
        self.send_metrics(launched, batch)?.wait_traced()
    }

    /// Starts the copy of a launched step's metrics to the host;
    /// [`PendingMetrics::wait_traced`] reads them. Sent before the next step's inputs are
    /// prepared, the copy does not wait for their kernels.
    pub fn send_metrics(
        &self,
        launched: Launched,
        batch: &Batch,
    ) -> Result<PendingMetrics, ModelError> {
        send_metrics(&launched.out, &launched.m, Some(&launched.norm), batch)
    }

    /// Loss and metrics without updating anything.
    pub fn evaluate(&self, batch: &Batch, rng: &mut impl Rng) -> Result<StepMetrics, ModelError> {
        let (out, m) = tch::no_grad(|| self.forward(batch, rng))?;
        send_metrics(&out, &m, None, batch)?.wait()
    }
}

/// Starts the copy of a step's metrics to the host: on CUDA an asynchronous copy into
/// pinned memory and an event after it, so the host can go on launching work (the next
/// step's inputs) before it waits.
fn send_metrics(
    out: &LossOutput,
    m: &Tensor,
    norm: Option<&Tensor>,
    batch: &Batch,
) -> Result<PendingMetrics, ModelError> {
    // a zero norm (one fill kernel) only where there is none
    let zero;
    let norm = match norm {
        Some(n) => n,
        None => {
            zero = out.loss.zeros_like();
            &zero
        }
    };
    let values = Tensor::f_cat(
        &[
            out.loss.detach().to_kind(Kind::Float).reshape([1]),
            norm.detach().to_kind(Kind::Float).reshape([1]),
            objective::accuracy_counts(&out.correct, m),
            objective::tau_counts(&out.correct, m),
        ],
        0,
    )?;
    let tokens = batch.input_ids.numel() as i64;
    let Device::Cuda(d) = values.device() else {
        return Ok(PendingMetrics {
            host: values.f_to_kind(Kind::Double)?,
            ready: None,
            tokens,
        });
    };
    // non-blocking to the host: ATen allocates the destination in pinned memory
    let host = values.f_to_device_(Device::Cpu, Kind::Double, true, false)?;
    let ready = cuda::Event::new(d)?;
    ready.record(&cuda::current_stream(d)?)?;
    Ok(PendingMetrics {
        host,
        ready: Some(ready),
        tokens,
    })
}

/// A step's metrics on their way to the host ([`DrafterTrainer::send_metrics`]).
pub struct PendingMetrics {
    host: Tensor,
    ready: Option<cuda::Event>,
    tokens: i64,
}

impl PendingMetrics {
    /// [`wait`](Self::wait) inside a `drafter.metrics` span.
    pub fn wait_traced(self) -> Result<StepMetrics, ModelError> {
        let _s = trace::span(trace_name!(names::DRAFTER_METRICS));
        self.wait()
    }

    /// Waits for the copy (the step's one host sync) and reads the metrics.
    pub fn wait(self) -> Result<StepMetrics, ModelError> {
        if let Some(ready) = &self.ready {
            ready.synchronize()?;
            count_host_sync();
        }
        let v = Vec::<f64>::try_from(&self.host)?;
        Ok(StepMetrics {
            loss: v[0],
            grad_norm: v[1],
            accuracy: objective::ratio(v[2], v[3]),
            tau_hat: objective::ratio(v[4], v[5]),
            tokens: self.tokens,
        })
    }
}
