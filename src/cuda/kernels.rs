//! Fused bf16 kernels of our own on CUDA (`kernels.cu`, compiled at run time with NVRTC
//! by the shim in `kernels.cpp`): the frozen target's forward pass, the drafter's per-head
//! norms with rotary embedding (forward and backward), and the loss's pass over logits.
//!
//! What they beat: on the realistic GPU step the target's forward spent 6.6 of its 13.4 ms
//! of kernel time per step in ATen's elementwise and norm kernels (the rotary embedding's
//! `mul`, `roll` and `addcmul` alone 3.3 ms, one H100, docs/gpu-results.md); on the
//! drafter's stream ATen's RMSNorm weight-gradient kernel took 1.9 ms a step (4 blocks for
//! a per-head norm) and the loss's softmax, argmax and sums 2.9 ms. Each fused kernel
//! reads its inputs and writes its outputs once, and rounds to bf16 where ATen's chain
//! does, so outputs match ATen's to the order of fp32 sums.
//!
//! Each op returns `None` where it does not apply (CPU tensors, another dtype, a shape or
//! layout it does not serve, or autograd recording where the op has no backward: only
//! `norm_rope` with a weight has one), and the caller runs the ATen chain. A kernel that
//! fails to compile or launch is reported once on stderr and the fused path is switched
//! off for the rest of the process.
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

use tch::Tensor;

use super::{CudaError, Result};

/// The kernels' CUDA C++ source.
pub const SOURCE: &str = include_str!("kernels.cu");

mod ffi {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn dflash_kernels_last_error() -> *const c_char;
        pub fn dflash_kernels_set_source(src: *const c_char, len: usize);
        pub fn dflash_kernels_compile(
            src: *const c_char,
            len: usize,
            major: c_int,
            minor: c_int,
            size: *mut usize,
        ) -> c_int;
        pub fn dflash_kernels_prepare(device: c_int) -> c_int;
        pub fn dflash_norm_rope(
            x: *mut c_void,
            weight: *mut c_void,
            cos: *mut c_void,
            sin: *mut c_void,
            eps: f64,
            allow_grad: c_int,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_add_rms_norm(
            a: *mut c_void,
            b: *mut c_void,
            weight: *mut c_void,
            eps: f64,
            sum: *mut *mut c_void,
            normed: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_silu_mul(
            gate: *mut c_void,
            up: *mut c_void,
            allow_grad: c_int,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_softmax_xent(
            logits: *mut c_void,
            labels: *mut c_void,
            p_label: *mut *mut c_void,
            rest: *mut *mut c_void,
            argmax: *mut *mut c_void,
        ) -> c_int;
    }
}

static ENABLED: AtomicBool = AtomicBool::new(true);
static DRAFTER: AtomicBool = AtomicBool::new(true);
static LAUNCHES: AtomicU64 = AtomicU64::new(0);
static SOURCE_SET: Once = Once::new();

/// Turns the fused kernels on or off for the process (on by default; the trainer sets it
/// from `fused_kernels`).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Turns the drafter's kernels on or off (`norm_rope` and `silu_mul` under autograd, and
/// `softmax_xent`; on by default, the trainer sets it from `fused_drafter_kernels`). They
/// also need [`enabled`].
pub fn set_drafter_enabled(on: bool) {
    DRAFTER.store(on, Ordering::Relaxed);
}

/// Whether the drafter's kernels may run.
pub fn drafter_enabled() -> bool {
    DRAFTER.load(Ordering::Relaxed)
}

/// How many fused kernels this process has launched (for tests and diagnostics).
pub fn launches() -> u64 {
    LAUNCHES.load(Ordering::Relaxed)
}

/// Whether the fused kernels are in use.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn last_error() -> String {
    // SAFETY: an accessor without arguments.
    super::shim_text(unsafe { ffi::dflash_kernels_last_error() })
}

fn set_source() {
    SOURCE_SET.call_once(|| {
        // SAFETY: the shim copies `len` bytes of the static source.
        unsafe { ffi::dflash_kernels_set_source(SOURCE.as_ptr() as *const c_char, SOURCE.len()) }
    });
}

/// Compiles the kernels for compute capability `major.minor` without a device (NVRTC
/// alone) and returns the size of the image: a check that the source builds and defines
/// every kernel the shim launches.
pub fn compile(major: i32, minor: i32) -> Result<usize> {
    compile_source(SOURCE, major, minor)
}

fn compile_source(source: &str, major: i32, minor: i32) -> Result<usize> {
    let mut size = 0usize;
    // SAFETY: pointer and length of a live string; `size` is a local out-pointer.
    let rc = unsafe {
        ffi::dflash_kernels_compile(
            source.as_ptr() as *const c_char,
            source.len(),
            major,
            minor,
            &mut size,
        )
    };
    if rc < 0 {
        return Err(CudaError::Call {
            op: "compile kernels",
            code: rc,
            message: last_error(),
        });
    }
    Ok(size)
}

/// Compiles and loads the kernels for `device` now, so that a failure shows before
/// training rather than at the first launch.
pub fn prepare(device: usize) -> Result<()> {
    set_source();
    // SAFETY: plain call; the shim checks the device.
    let rc = unsafe { ffi::dflash_kernels_prepare(device as c_int) };
    if rc < 0 {
        return Err(CudaError::Call {
            op: "prepare kernels",
            code: rc,
            message: last_error(),
        });
    }
    Ok(())
}

fn ptr(t: &Tensor) -> *mut c_void {
    t.as_ptr() as *mut c_void
}

/// Takes a tensor the shim allocated with `new at::Tensor`.
///
/// SAFETY: `p` must come from the shim's `new at::Tensor(..)` and be taken once.
unsafe fn take(p: *mut c_void) -> Tensor {
    // SAFETY: see the function's contract.
    unsafe { Tensor::from_ptr(p as *mut _) }
}

/// Runs one shim op: `Some(())` when it ran, `None` when it does not apply or failed
/// (reported once, then the fused path is off).
fn run(op: &str, f: impl FnOnce() -> c_int) -> Option<()> {
    if !enabled() {
        return None;
    }
    set_source();
    match f() {
        0 => {
            LAUNCHES.fetch_add(1, Ordering::Relaxed);
            Some(())
        }
        rc if rc > 0 => None,
        rc => {
            static WARNED: Once = Once::new();
            let msg = last_error();
            WARNED.call_once(|| {
                eprintln!(
                    "warning: fused CUDA kernel {op} failed (code {rc}): {msg}; using ATen's kernels"
                )
            });
            set_enabled(false);
            None
        }
    }
}

/// `rope(rms_norm(x) * weight)`, or `rope(x)` without a weight: `x` is `[B, L, heads, D]`,
/// the tables `[B, L, 1, D]` (`sin` with its first half negated, as [`crate::model::Rope`]
/// keeps it). Under autograd (`x` or the weight requiring a gradient) only with a weight
/// and the drafter's kernels on ([`set_drafter_enabled`]): the result's backward is the
/// fused `norm_rope_bwd` kernel.
pub fn norm_rope(
    x: &Tensor,
    weight: Option<&Tensor>,
    cos: &Tensor,
    sin: &Tensor,
    eps: f64,
) -> Option<Tensor> {
    let mut out = std::ptr::null_mut();
    run("norm_rope", || {
        // SAFETY: live tensors; the shim writes `out` only when it returns 0.
        unsafe {
            ffi::dflash_norm_rope(
                ptr(x),
                weight.map_or(std::ptr::null_mut(), ptr),
                ptr(cos),
                ptr(sin),
                eps,
                c_int::from(drafter_enabled()),
                &mut out,
            )
        }
    })?;
    // SAFETY: written by the shim on success.
    Some(unsafe { take(out) })
}

/// `(a + b, rms_norm(a + b) * weight)` over the last dimension.
pub fn add_rms_norm(a: &Tensor, b: &Tensor, weight: &Tensor, eps: f64) -> Option<(Tensor, Tensor)> {
    let (mut sum, mut normed) = (std::ptr::null_mut(), std::ptr::null_mut());
    run("add_rms_norm", || {
        // SAFETY: live tensors; the shim writes both outputs only when it returns 0.
        unsafe { ffi::dflash_add_rms_norm(ptr(a), ptr(b), ptr(weight), eps, &mut sum, &mut normed) }
    })?;
    // SAFETY: written by the shim on success.
    Some(unsafe { (take(sum), take(normed)) })
}

/// `silu(gate) * up`. Under autograd only with the drafter's kernels on
/// ([`set_drafter_enabled`]): the result's backward is the fused `silu_mul_bwd` kernel.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Option<Tensor> {
    let mut out = std::ptr::null_mut();
    run("silu_mul", || {
        // SAFETY: live tensors; the shim writes `out` only when it returns 0.
        unsafe {
            ffi::dflash_silu_mul(ptr(gate), ptr(up), c_int::from(drafter_enabled()), &mut out)
        }
    })?;
    // SAFETY: written by the shim on success.
    Some(unsafe { take(out) })
}

/// What [`softmax_xent`] gives per row, each `[R]`.
#[derive(Debug)]
pub struct XentRows {
    /// p at the label (fp32).
    pub p_label: Tensor,
    /// The fp32 sum of p's other entries.
    pub rest: Tensor,
    /// The first index of p's largest entry.
    pub argmax: Tensor,
}

/// The fused loss's pass over `logits` `[R, V]` (bf16), **in place**: each row becomes
/// `softmax(row)` in bf16 with its label entry set to `-rest` (the loss's gradient with
/// respect to the logits there, up to the row's scale), so the input gradient is one GEMM
/// away. `labels`: `R` int64 ids. One kernel instead of softmax, argmax, gather, scatter
/// and sum.
/// Only with the drafter's kernels on ([`set_drafter_enabled`]).
pub fn softmax_xent(logits: &mut Tensor, labels: &Tensor) -> Option<XentRows> {
    if !drafter_enabled() {
        return None;
    }
    let (mut p_label, mut rest, mut argmax) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    run("softmax_xent", || {
        // SAFETY: live tensors, `logits` borrowed mutably for the in-place write; the shim
        // writes the three outputs only when it returns 0.
        unsafe {
            ffi::dflash_softmax_xent(
                ptr(logits),
                ptr(labels),
                &mut p_label,
                &mut rest,
                &mut argmax,
            )
        }
    })?;
    // SAFETY: written by the shim on success.
    Some(unsafe {
        XentRows {
            p_label: take(p_label),
            rest: take(rest),
            argmax: take(argmax),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// The source compiles for the architectures the trainer meets (Hopper, Ampere,
    /// Blackwell) with NVRTC alone: no GPU needed.
    #[test]
    fn the_kernels_compile_for_hopper_ampere_and_blackwell() {
        for (major, minor) in [(9, 0), (8, 0), (10, 0)] {
            let size = compile(major, minor).unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
            assert!(size > 1000, "sm_{major}{minor}: a {size}-byte image");
        }
    }

    /// A source that lacks a kernel the shim launches is refused at compile time, not at
    /// the first launch on a GPU.
    #[test]
    fn a_source_without_a_launched_kernel_is_refused() {
        let renamed = SOURCE.replace("void softmax_xent(", "void softmax_xent_renamed(");
        assert_ne!(renamed, SOURCE);
        let err = compile_source(&renamed, 9, 0).expect_err("softmax_xent is missing");
        assert!(err.to_string().contains("no kernel softmax_xent"), "{err}");
    }

    /// On the CPU (and for other dtypes) every op declines, so callers run ATen.
    #[test]
    fn ops_decline_cpu_tensors() {
        let x = Tensor::ones([1, 2, 2, 64], (Kind::BFloat16, Device::Cpu));
        let t = Tensor::ones([1, 2, 1, 64], (Kind::BFloat16, Device::Cpu));
        assert!(norm_rope(&x, None, &t, &t, 1e-6).is_none());
        let w = Tensor::ones([64], (Kind::BFloat16, Device::Cpu));
        assert!(add_rms_norm(&x, &x, &w, 1e-6).is_none());
        assert!(silu_mul(&x, &x).is_none());
        set_drafter_enabled(true);
        let mut z = Tensor::ones([2, 64], (Kind::BFloat16, Device::Cpu));
        let labels = Tensor::zeros([2], (Kind::Int64, Device::Cpu));
        assert!(softmax_xent(&mut z, &labels).is_none());
        let xg = x.set_requires_grad(true);
        assert!(norm_rope(&xg, Some(&w), &t, &t, 1e-6).is_none());
        assert!(enabled(), "declining is not a failure");
    }
}
