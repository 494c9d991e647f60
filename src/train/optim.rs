//! AdamW on fp32 master weights, gradient clipping and the learning-rate schedule.
//!
//! All trainable parameters are gathered into one flat fp32 master buffer, and the model's
//! parameters become views of one flat buffer in their own dtype (the master itself when
//! that dtype is fp32). A step is then a handful of kernels over one tensor instead of a
//! dozen per parameter, and the bf16 copy is refreshed with a single cast.
use std::f64::consts::PI;

use tch::{Kind, Tensor};

use crate::model::ModelError;

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// AdamW over a fixed, named list of parameters.
pub struct AdamW {
    names: Vec<String>,
    params: Vec<Tensor>,
    /// fp32 master weights, flat.
    pub master: Tensor,
    /// The flat buffer the parameters view into, when their dtype is not fp32.
    model_flat: Option<Tensor>,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    pub step: i64,
    /// The step count on the device, for the fused kernel (CUDA only).
    step_count: Option<Tensor>,
    cfg: AdamWConfig,
}

impl AdamW {
    /// Takes ownership of the parameters' storage: afterwards each parameter is a view of a
    /// flat buffer. `named` must be sorted the same way on every run (for checkpoints).
    pub fn new(named: Vec<(String, Tensor)>, cfg: AdamWConfig) -> Result<Self, ModelError> {
        let (names, mut params): (Vec<String>, Vec<Tensor>) = named.into_iter().unzip();
        let kind = params.first().map(|p| p.kind()).unwrap_or(Kind::Float);
        let flat: Vec<Tensor> = params
            .iter()
            .map(|p| p.detach().to_kind(Kind::Float).reshape([-1]))
            .collect();
        let master = Tensor::f_cat(&flat, 0)?;
        let model_flat = (kind != Kind::Float).then(|| master.to_kind(kind));
        let backing = model_flat.as_ref().unwrap_or(&master);
        let mut offset = 0;
        for p in params.iter_mut() {
            let n = p.numel() as i64;
            let view = backing.narrow(0, offset, n).view(p.size().as_slice());
            tch::no_grad(|| p.f_set_data(&view))?;
            offset += n;
        }
        Ok(Self {
            names,
            params,
            exp_avg: master.zeros_like(),
            exp_avg_sq: master.zeros_like(),
            master,
            model_flat,
            step: 0,
            step_count: None,
            cfg,
        })
    }

    /// The gradients of all parameters as one flat fp32 tensor (zeros where a parameter
    /// got none): concatenated in the parameters' dtype, then converted. Concatenating
    /// straight into an fp32 buffer (`cat_out`) is slower on CUDA: mixed dtypes leave
    /// ATen's batched concatenation for one copy per parameter (the clip section took
    /// 0.64 instead of 0.37 ms of GPU time a step on one H100).
    pub fn flat_grad(&self) -> Tensor {
        let grads: Vec<Tensor> = self
            .params
            .iter()
            .map(|p| {
                let g = p.grad();
                if g.defined() {
                    g.reshape([-1])
                } else {
                    p.zeros_like().reshape([-1])
                }
            })
            .collect();
        Tensor::cat(&grads, 0).to_kind(Kind::Float)
    }

    /// Scales `grad` in place so its L2 norm is at most `max_norm`, without a host sync.
    /// Returns the norm before clipping (a device scalar).
    pub fn clip(grad: &mut Tensor, max_norm: f64) -> Tensor {
        let norm = grad.norm();
        let scale = (max_norm / (&norm + 1e-6)).clamp_max(1.0);
        let _ = grad.g_mul_(&scale);
        norm
    }

    /// The norm of `grad` (a device scalar) and the divisor that clips it to at most
    /// `max_norm`, `max(1, (norm + 1e-6) / max_norm)`, for [`AdamW::step_divided`]: the
    /// clipping [`AdamW::clip`] does, left to the update's own pass over the gradient.
    pub fn clip_divisor(grad: &Tensor, max_norm: f64) -> (Tensor, Tensor) {
        let norm = grad.norm();
        let divisor = ((&norm + 1e-6) / max_norm).clamp_min(1.0);
        (norm, divisor)
    }

    /// One AdamW update with learning rate `lr` from the flat fp32 gradient `grad`, then
    /// refreshes the model's parameters and drops their gradients.
    pub fn step(&mut self, grad: &Tensor, lr: f64) {
        self.step_divided(grad, lr, None);
    }

    /// [`AdamW::step`] from `grad / divisor` (a device scalar, see [`AdamW::clip_divisor`]).
    /// On CUDA the fused kernel divides as it reads the gradient; `grad` then holds the
    /// divided gradient.
    pub fn step_divided(&mut self, grad: &Tensor, lr: f64, divisor: Option<&Tensor>) {
        self.step += 1;
        let c = self.cfg;
        let t = self.step as f64;
        if self.master.device().is_cuda() && self.fused_step(grad, lr, divisor) {
            self.clear_grads();
            return;
        }
        let divided = divisor.map(|d| grad / d);
        let grad = divided.as_ref().unwrap_or(grad);
        tch::no_grad(|| {
            if c.weight_decay != 0.0 {
                let _ = self.master.g_mul_scalar_(1.0 - lr * c.weight_decay);
            }
            let _ = self.exp_avg.lerp_(grad, 1.0 - c.beta1);
            let _ = self
                .exp_avg_sq
                .g_mul_scalar_(c.beta2)
                .addcmul_(&(grad * (1.0 - c.beta2)), grad);
            let bias1 = 1.0 - c.beta1.powf(t);
            let bias2 = 1.0 - c.beta2.powf(t);
            let denom = (&self.exp_avg_sq / bias2).sqrt() + c.eps;
            let _ = self
                .master
                .addcdiv_(&(&self.exp_avg * (-lr / bias1)), &denom);
            if let Some(flat) = &mut self.model_flat {
                flat.copy_(&self.master);
            }
        });
        self.clear_grads();
    }

    /// Drops the parameters' gradients once the update has read them, so the next backward
    /// pass writes fresh ones (no zero fill, no accumulation kernel per parameter).
    fn clear_grads(&mut self) {
        if let Err(e) = crate::cuda::ops::clear_grads(&self.params) {
            // the shim only fails if ATen throws; zeroing is the same update
            eprintln!("warning: {e}; zeroing the gradients instead");
            for p in &mut self.params {
                p.zero_grad();
            }
        }
    }

    /// The update of [`AdamW::step`] as ATen's fused kernel (CUDA): one pass instead of
    /// about ten kernels over the flat buffers (the H200 figures are in
    /// docs/gpu-results.md). False, with a warning once, if the kernel is unavailable.
    fn fused_step(&mut self, grad: &Tensor, lr: f64, divisor: Option<&Tensor>) -> bool {
        use std::sync::atomic::{AtomicBool, Ordering};
        static WARNED: AtomicBool = AtomicBool::new(false);
        let c = self.cfg;
        let step = self
            .step_count
            .get_or_insert_with(|| Tensor::zeros([1], (Kind::Float, self.master.device())));
        let _ = tch::no_grad(|| step.fill_(self.step as f64));
        let h = crate::cuda::ops::AdamWStep {
            lr,
            beta1: c.beta1,
            beta2: c.beta2,
            weight_decay: c.weight_decay,
            eps: c.eps,
        };
        match crate::cuda::ops::fused_adamw(
            &self.master,
            grad,
            &self.exp_avg,
            &self.exp_avg_sq,
            step,
            divisor,
            h,
        ) {
            Ok(()) => {
                if let Some(flat) = &mut self.model_flat {
                    tch::no_grad(|| flat.copy_(&self.master));
                }
                true
            }
            Err(e) => {
                if !WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!("warning: fused AdamW unavailable ({e}); using the unfused update");
                }
                false
            }
        }
    }

    /// Optimizer state for checkpoints: names and tensors.
    pub fn state(&self) -> Vec<(String, Tensor)> {
        vec![
            ("master".into(), self.master.shallow_clone()),
            ("exp_avg".into(), self.exp_avg.shallow_clone()),
            ("exp_avg_sq".into(), self.exp_avg_sq.shallow_clone()),
            ("step".into(), Tensor::from_slice(&[self.step as f32])),
        ]
    }

    /// Restores state written by [`AdamW::state`] (shapes must match) and the parameters.
    pub fn load_state(
        &mut self,
        state: &std::collections::HashMap<String, Tensor>,
    ) -> Result<(), ModelError> {
        let get = |k: &str| {
            state
                .get(k)
                .ok_or_else(|| ModelError::Checkpoint(format!("optimizer state has no `{k}`")))
        };
        for (k, dst) in [
            ("master", &mut self.master),
            ("exp_avg", &mut self.exp_avg),
            ("exp_avg_sq", &mut self.exp_avg_sq),
        ] {
            let src = get(k)?;
            if src.size() != dst.size() {
                return Err(ModelError::Checkpoint(format!(
                    "optimizer `{k}` has {} values, the drafter has {}",
                    src.numel(),
                    dst.numel()
                )));
            }
            tch::no_grad(|| dst.f_copy_(src))?;
        }
        self.step = get("step")?.double_value(&[0]) as i64;
        if let Some(flat) = &mut self.model_flat {
            tch::no_grad(|| flat.f_copy_(&self.master))?;
        }
        Ok(())
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }
}

/// Linear warmup over `warmup` steps to `peak`, then cosine decay to 0 at `total`.
pub fn lr_at(step: i64, total: i64, warmup: i64, peak: f64) -> f64 {
    if warmup > 0 && step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = (total - warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).clamp(0.0, 1.0);
    peak * 0.5 * (1.0 + (PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_linearly_then_decays_to_zero() {
        assert!((lr_at(0, 100, 4, 1.0) - 0.25).abs() < 1e-12);
        assert!((lr_at(3, 100, 4, 1.0) - 1.0).abs() < 1e-12);
        assert!((lr_at(4, 100, 4, 1.0) - 1.0).abs() < 1e-12);
        assert!((lr_at(52, 100, 4, 1.0) - 0.5).abs() < 1e-12);
        assert!(lr_at(100, 100, 4, 1.0).abs() < 1e-12);
    }

    #[test]
    fn adamw_matches_hand_update() {
        // One parameter [2], grad g: after one step with bias correction,
        // update = lr * g / (|g| + eps) per element (m_hat = g, v_hat = g^2).
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let mut opt = AdamW::new(
            vec![("p".into(), p.shallow_clone())],
            AdamWConfig::default(),
        )
        .unwrap();
        let g = Tensor::from_slice(&[0.5f32, -4.0]);
        opt.step(&g, 0.1);
        let got = Vec::<f32>::try_from(&p.detach()).unwrap();
        assert!((got[0] - 0.9).abs() < 1e-6, "{got:?}");
        assert!((got[1] + 1.9).abs() < 1e-6, "{got:?}");
    }

    #[test]
    fn the_fused_kernel_makes_the_same_updates_as_the_unfused_step() {
        // ATen's fused AdamW runs on the CPU too, so the shim's argument order and the
        // step count are checked here against the unfused formula over several steps
        let cfg = AdamWConfig {
            weight_decay: 0.1,
            ..AdamWConfig::default()
        };
        let init = Tensor::from_slice(&[1.0f32, -2.0, 0.25, 3.0, -0.5]);
        let make = || {
            let p = init.copy().set_requires_grad(true);
            (
                AdamW::new(vec![("p".into(), p.shallow_clone())], cfg).unwrap(),
                p,
            )
        };
        let (mut plain, p1) = make();
        let (mut fused, p2) = make();
        for (i, lr) in [0.1, 0.05, 0.02].into_iter().enumerate() {
            let g = Tensor::from_slice(&[0.5f32, -4.0, 1e-3, 2.0, -0.7]) * (i as f64 + 1.0);
            plain.step(&g, lr);
            fused.step += 1;
            assert!(fused.fused_step(&g, lr, None), "the fused kernel ran");
            let (a, b) = (p1.detach(), p2.detach());
            let d = (&a - &b).abs().max().double_value(&[]);
            assert!(d < 1e-6, "step {i}: {a:?} vs {b:?}");
            let moved = (&b - &init).abs().min().double_value(&[]);
            assert!(moved > 0.0, "every value moved");
        }
    }

    #[test]
    fn clipping_by_the_updates_divisor_matches_clipping_the_gradient_first() {
        // clip() scales the gradient, then the update; clip_divisor() leaves the division
        // to the update, the unfused one and the fused kernel's (on the CPU here)
        let init = Tensor::from_slice(&[1.0f32, -2.0, 0.25, 3.0, -0.5]);
        let make = || {
            let p = init.copy().set_requires_grad(true);
            let opt = AdamW::new(
                vec![("p".into(), p.shallow_clone())],
                AdamWConfig::default(),
            );
            (opt.unwrap(), p)
        };
        let (mut want, p0) = make();
        let (mut unfused, p1) = make();
        let (mut fused, p2) = make();
        // norms 4.6, 0.46 (no clipping) and 9.2 against max_norm 1
        for (i, scale) in [1.0, 0.1, 2.0].into_iter().enumerate() {
            let g = Tensor::from_slice(&[0.5f32, -4.0, 1e-3, 2.0, -0.7]) * scale;
            let mut clipped = g.copy();
            let n0 = AdamW::clip(&mut clipped, 1.0);
            want.step(&clipped, 0.1);
            let (n1, d1) = AdamW::clip_divisor(&g, 1.0);
            unfused.step_divided(&g, 0.1, Some(&d1));
            let g2 = g.copy();
            let (_, d2) = AdamW::clip_divisor(&g2, 1.0);
            fused.step += 1;
            assert!(
                fused.fused_step(&g2, 0.1, Some(&d2)),
                "the fused kernel ran"
            );
            assert!((n0.double_value(&[]) - n1.double_value(&[])).abs() < 1e-6);
            let d = (&g2 - &clipped).abs().max().double_value(&[]);
            assert!(
                d < 1e-6,
                "step {i}: the fused kernel leaves the divided gradient"
            );
            for (name, p) in [("unfused", &p1), ("fused", &p2)] {
                let d = (p.detach() - p0.detach()).abs().max().double_value(&[]);
                assert!(d < 1e-6, "step {i}: {name} differs by {d}");
            }
        }
        let moved = (p0.detach() - &init).abs().min().double_value(&[]);
        assert!(moved > 1e-3, "every value moved");
    }

    #[test]
    fn a_step_drops_the_gradients_so_the_next_backward_does_not_accumulate() {
        let p = Tensor::from_slice(&[1.0f32, -2.0, 0.5]).set_requires_grad(true);
        let q = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
        let mut opt = AdamW::new(
            vec![
                ("p".into(), p.shallow_clone()),
                ("q".into(), q.shallow_clone()),
            ],
            AdamWConfig::default(),
        )
        .unwrap();
        // loss = sum(p^2) * q: dp = 2 p q, dq = sum(p^2), from the values at each step
        let grads_by_hand = |p: &[f32], q: f32| -> Vec<f32> {
            let mut g: Vec<f32> = p.iter().map(|x| 2.0 * x * q).collect();
            g.push(p.iter().map(|x| x * x).sum());
            g
        };
        for step in 0..3 {
            let (pv, qv) = (
                Vec::<f32>::try_from(&p.detach()).unwrap(),
                q.detach().double_value(&[0]) as f32,
            );
            (p.square().sum(Kind::Float) * &q).backward();
            let got = Vec::<f32>::try_from(&opt.flat_grad()).unwrap();
            let want = grads_by_hand(&pv, qv);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "step {step}: {got:?} vs {want:?}");
            }
            let g = opt.flat_grad();
            opt.step(&g, 0.01);
            assert!(!p.grad().defined() && !q.grad().defined(), "step {step}");
        }
    }

    #[test]
    fn clip_bounds_the_norm() {
        let mut g = Tensor::from_slice(&[3.0f32, 4.0]);
        let n = AdamW::clip(&mut g, 1.0);
        assert!((n.double_value(&[]) - 5.0).abs() < 1e-6);
        assert!((g.norm().double_value(&[]) - 1.0).abs() < 1e-5);
    }
}
