//! Tensor operations of ATen that tch does not bind, called through the C++ shim.
use std::ffi::c_void;

use super::{check, ffi, Result};

/// AdamW's hyper-parameters for [`fused_adamw`].
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

/// One update with ATen's fused AdamW kernel (one pass over the tensors instead of about
/// ten elementwise kernels). All tensors are fp32 and on one device; `step` holds the
/// step count of this update (one element). With `grad_divisor` (one element) the kernel
/// first divides the gradient by it, in place: gradient clipping without a pass of its own.
/// The update is made in place.
pub fn fused_adamw(
    param: &tch::Tensor,
    grad: &tch::Tensor,
    exp_avg: &tch::Tensor,
    exp_avg_sq: &tch::Tensor,
    step: &tch::Tensor,
    grad_divisor: Option<&tch::Tensor>,
    h: AdamWStep,
) -> Result<()> {
    let p = |t: &tch::Tensor| t.as_ptr() as *mut c_void;
    let divisor = grad_divisor.map_or(std::ptr::null_mut(), p);
    // SAFETY: each pointer is tch's `torch::Tensor*`, valid while borrowed here; the
    // kernel writes the tensors' data in place, which tch allows for these owned buffers.
    check("fused_adamw", unsafe {
        ffi::dflash_fused_adamw(
            p(param),
            p(grad),
            p(exp_avg),
            p(exp_avg_sq),
            p(step),
            divisor,
            h.lr,
            h.beta1,
            h.beta2,
            h.weight_decay,
            h.eps,
        )
    })
}

/// Drops the gradients of `tensors` (PyTorch's `p.grad = None`; any device). The next
/// backward pass then gives each tensor its gradient as computed, where tch's
/// `zero_grad` keeps a zeroed buffer that the backward fills and adds into: one fill and
/// one add kernel per parameter and step.
pub fn clear_grads(tensors: &[tch::Tensor]) -> Result<()> {
    let ptrs: Vec<*mut c_void> = tensors.iter().map(|t| t.as_ptr() as *mut c_void).collect();
    // SAFETY: `ptrs` holds tch's `torch::Tensor*` of tensors borrowed for this call; the
    // shim resets each one's gradient field and keeps no pointer.
    check("clear_grads", unsafe {
        ffi::dflash_clear_grads(ptrs.as_ptr(), ptrs.len() as i64)
    })
}
