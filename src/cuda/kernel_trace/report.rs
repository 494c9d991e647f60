//! What the merge reads (the capture and what the recorder placed) and what it reports.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cuda::activity::Activity;
use crate::trace::{PlacedGpuSpan, TraceThread};

/// What the merge reads: the capture and what the recorder placed. Serializable, so that
/// a capture can be kept (`DFLASH_KERNEL_DUMP`) and the merge tested on it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MergeInput {
    /// The trainer's `pid` in the file.
    pub pid: u32,
    /// The recorder's clock at the trace's time zero, ns.
    pub base_clock_ns: u64,
    pub gpu_spans: Vec<PlacedGpuSpan>,
    pub threads: Vec<TraceThread>,
    pub activities: Vec<Activity>,
    /// Records CUPTI reported dropped during the capture.
    pub dropped: u64,
}

/// What the merge wrote and how it placed it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MergeReport {
    pub kernels: u64,
    pub memcpys: u64,
    pub memsets: u64,
    /// Runtime and driver calls written, and those by class (time in ns, outermost calls
    /// only: a driver call inside a runtime call is not counted twice).
    pub api_calls: u64,
    pub launches: u64,
    pub launch_ns: u64,
    pub syncs: u64,
    pub sync_ns: u64,
    pub allocs: u64,
    pub alloc_ns: u64,
    /// CUPTI's synchronization records and overhead records ("Command Buffer Full").
    pub sync_records: u64,
    pub overhead_records: u64,
    pub overhead_ns: u64,
    pub command_buffer_full_ns: u64,
    pub flows: u64,
    /// Records left out: outside the traced window, or with nothing to place them by.
    pub left_out: u64,
    /// GPU records whose launch was not captured (placed by time only).
    pub unlaunched: u64,
    /// Records CUPTI dropped (its buffers were full).
    pub dropped: u64,
    /// GPU records moved to fit the GPU spans: the shift per device (median over steps,
    /// ns, record time minus trace time), steps where no single shift fit every kernel,
    /// and records cut at a GPU span's edge.
    pub shift_ns: BTreeMap<u32, i64>,
    pub unfit_groups: u64,
    pub trimmed: u64,
    /// Tracks made for threads and streams the recorder had none for.
    pub new_tracks: u64,
    /// Per GPU-timed section (by name): kernels launched inside it, their busy time, and
    /// the section's GPU time (CUDA events) over the same spans.
    pub sections: BTreeMap<String, SectionKernels>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SectionKernels {
    pub spans: u64,
    pub kernels: u64,
    pub kernel_ns: u64,
    pub gpu_ns: u64,
}

impl MergeReport {
    /// One line for the run's end.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "kernel trace: {} kernels, {} copies, {} sets, {} CUDA calls ({} launches {:.1} ms, {} syncs {:.1} ms, {} allocations {:.1} ms)",
            self.kernels,
            self.memcpys,
            self.memsets,
            self.api_calls,
            self.launches,
            self.launch_ns as f64 / 1e6,
            self.syncs,
            self.sync_ns as f64 / 1e6,
            self.allocs,
            self.alloc_ns as f64 / 1e6,
        );
        if self.command_buffer_full_ns > 0 {
            s += &format!(
                ", command buffer full {:.1} ms",
                self.command_buffer_full_ns as f64 / 1e6
            );
        }
        if self.dropped > 0 {
            s += &format!(
                "; CUPTI dropped {} records (buffers full: raise DFLASH_CUPTI_BUFFER_MB)",
                self.dropped
            );
        }
        s
    }
}
