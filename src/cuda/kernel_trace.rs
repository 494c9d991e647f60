//! CUDA activity into the trace (`--trace-kernels`): turns the [`Activity`] records of a
//! capture into trace events, written through the recorder's writer when the trace
//! finishes. Pure: it takes the records and what the recorder placed (GPU spans, threads,
//! the clock), so it is tested on recorded data without a GPU.
//!
//! - **Tracks.** Runtime and driver calls go on the calling thread's track (`pid` the
//!   trainer, `tid` the recorder's id of that OS thread); calls from threads that recorded
//!   nothing (libtorch's autograd workers) get a track of their own, `CUDA calls <os tid>`.
//!   Kernels, copies and sets go on the GPU stream track where the recorder put the GPU
//!   spans of the same stream: CUPTI's stream id is matched to a track by where the
//!   launching CPU section's GPU span went (a vote per stream); streams with no GPU span
//!   get a track of their own, `stream <id> (CUDA)`. A launch from a thread that recorded
//!   nothing belongs to the innermost GPU-timed section open on any thread at that moment
//!   whose GPU span is on the record's stream track (the backward's kernels belong to the
//!   section that called backward).
//! - **Clock.** CUPTI takes its timestamps from the recorder's clock, so calls land on
//!   their CPU spans as they are. GPU spans are placed from CUDA events by a calibration
//!   that may be off by microseconds, so GPU records are moved onto them: for each
//!   outermost GPU span (a step's), the shift that puts every kernel launched inside one of
//!   its sections inside that section's GPU span, the one closest to the previous shift
//!   when several do. GPU records launched elsewhere take the shift of the outermost span
//!   they fall in (or the last one before them). What still crosses a GPU span's edge is
//!   cut at the edge (`trimmed`), so every track stays properly nested.
//! - **Window.** Calls outside their thread's recorded extent (for a thread that recorded
//!   nothing: outside the window, from the first recorded event of any thread to the last)
//!   are left out. A GPU record whose launch was left out is kept, without a flow, when it
//!   starts inside the window (the GPU ran it then: work launched before the window, or
//!   by a thread that runs ahead of the others), and left out otherwise.
//! - **Flows.** Each launch gets Kineto's `ac2g` flow to its kernel (`s` on the call,
//!   `f` on the kernel, id = the correlation id).
//! - **Names.** Kineto's categories (`kernel`, `gpu_memcpy`, `gpu_memset`,
//!   `cuda_runtime`, `cuda_driver`, `cuda_sync`, `overhead`) and argument keys, so tools
//!   made for PyTorch traces read ours.
use chrome_trace_format::EventWriter;

mod place;
mod report;
mod write;

pub use report::{MergeInput, MergeReport, SectionKernels};

/// Writes the capture into the trace through `w` and says what it did.
pub fn merge(input: &MergeInput, w: &mut EventWriter) -> MergeReport {
    let mut rep = MergeReport {
        dropped: input.dropped,
        ..Default::default()
    };
    if let Some(mut placed) = place::place(input, &mut rep) {
        write::section_figures(input, &placed, &mut rep);
        write::write(input, &mut placed, w, &mut rep);
    }
    rep
}

#[cfg(test)]
mod tests;
