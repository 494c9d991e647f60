//! What a CUDA runtime or driver call does to the step, by its name as CUPTI reports it
//! (Kineto's `cuda_runtime`/`cuda_driver` spans; the recorder's, once it captures them):
//! launches work, waits for the device, or allocates device memory. A reader attributes
//! host time by these classes: launch-bound, sync-bound and allocator-bound steps are told
//! apart by them.

/// The class of a CUDA API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ApiClass {
    /// Puts work on a stream: kernel launches (`cudaLaunchKernel`, `cuLaunchKernel`,
    /// `cuLaunchKernelEx`, graph launches) and asynchronous copies and sets.
    Launch,
    /// Blocks the host until the device (or a stream, or an event) catches up; a
    /// synchronous `cudaMemcpy` too.
    Sync,
    /// Takes device memory from the driver (`cudaMalloc`, `cuMemAlloc`, ...).
    Alloc,
    /// Gives it back (`cudaFree`, ...), which also synchronizes the device.
    Free,
    /// Anything else (`cudaGetDevice`, `cudaStreamIsCapturing`, event records...).
    Other,
}

impl ApiClass {
    /// The class of a call by its name.
    pub fn of(name: &str) -> ApiClass {
        // Driver names carry version suffixes (`cuMemAlloc_v2`); runtime ones `_ptsz`.
        let base = name.split("_v").next().unwrap_or(name);
        let base = base.strip_suffix("_ptsz").unwrap_or(base);
        if base.ends_with("Synchronize")
            || matches!(
                base,
                "cudaMemcpy" | "cudaMemcpy2D" | "cuMemcpyDtoH" | "cuMemcpyHtoD" | "cuMemcpy"
            )
        {
            return ApiClass::Sync;
        }
        if base.contains("Launch")
            || ((base.starts_with("cudaMemcpy") || base.starts_with("cuMemcpy"))
                && base.ends_with("Async"))
            || (base.starts_with("cudaMemset") || base.starts_with("cuMemset"))
        {
            return ApiClass::Launch;
        }
        if matches!(
            base,
            "cudaMalloc" | "cudaMallocAsync" | "cudaMallocHost" | "cuMemAlloc" | "cuMemCreate"
        ) {
            return ApiClass::Alloc;
        }
        if matches!(
            base,
            "cudaFree" | "cudaFreeAsync" | "cudaFreeHost" | "cuMemFree" | "cuMemRelease"
        ) {
            return ApiClass::Free;
        }
        ApiClass::Other
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            ApiClass::Launch => "launch",
            ApiClass::Sync => "sync",
            ApiClass::Alloc => "alloc",
            ApiClass::Free => "free",
            ApiClass::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_as_cupti_reports_them() {
        for (name, class) in [
            ("cudaLaunchKernel", ApiClass::Launch),
            ("cuLaunchKernelEx", ApiClass::Launch),
            ("cudaLaunchKernelExC", ApiClass::Launch),
            ("cudaGraphLaunch", ApiClass::Launch),
            ("cudaMemcpyAsync", ApiClass::Launch),
            ("cudaMemsetAsync", ApiClass::Launch),
            ("cuMemcpyHtoDAsync_v2", ApiClass::Launch),
            ("cudaStreamSynchronize", ApiClass::Sync),
            ("cudaDeviceSynchronize", ApiClass::Sync),
            ("cudaEventSynchronize", ApiClass::Sync),
            ("cudaMemcpy", ApiClass::Sync),
            ("cuMemcpyDtoH_v2", ApiClass::Sync),
            ("cudaMalloc", ApiClass::Alloc),
            ("cuMemAlloc_v2", ApiClass::Alloc),
            ("cudaFree", ApiClass::Free),
            ("cudaStreamIsCapturing", ApiClass::Other),
            ("cudaEventRecord", ApiClass::Other),
            ("cudaStreamWaitEvent", ApiClass::Other),
            ("cudaGetErrorString", ApiClass::Other),
        ] {
            assert_eq!(ApiClass::of(name), class, "{name}");
        }
    }
}
