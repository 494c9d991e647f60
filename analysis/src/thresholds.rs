//! The numbers the findings judge a breakdown by, in one place: the thresholds of the
//! general findings ([`crate::findings`]: queue waits, launch-bound sections, GPU idle,
//! top sections, uneven steps) and of the bounds ([`crate::bound`]: what bounds a step),
//! and how a share of step time reads in their sentences ([`pct`]). The queue-wait share
//! serves both: the queue finding, and the side a pipelined run's bound is on.

/// A share of step time as the findings write it: `0.234` -> `23%`.
pub(crate) fn pct(x: f64) -> String {
    // `+ 0.0` turns the -0.0 of an empty float sum into 0 (it printed "-0%").
    format!("{:.0}%", x * 100.0 + 0.0)
}

// The general findings.

/// A queue side that waits this share of the step time or more is starved (or blocked).
pub const QUEUE_WAIT_SHARE: f64 = 0.10;
/// A section whose CPU time is this many times its GPU time is launch-bound.
pub const LAUNCH_BOUND_RATIO: f64 = 1.5;
/// ... provided its CPU time is at least this share of the step time.
pub const MIN_SECTION_SHARE: f64 = 0.03;
/// The GPU idle this share of step time or more is worth a sentence.
pub const GPU_IDLE_SHARE: f64 = 0.20;
/// Steps are uneven when p95 exceeds the median by this factor.
pub const UNEVEN_STEPS: f64 = 1.3;
/// Sections named as the largest share of a step.
pub const TOP_SECTIONS: usize = 3;

// What bounds a step.

/// The GPU busy this share of the step time or more bounds the step.
pub const GPU_BOUND_BUSY: f64 = 0.8;
/// Host syncs that wait this share of the step time or more, while the GPU is not busy
/// enough to bound it.
pub const SYNC_BOUND_SHARE: f64 = 0.25;
/// Device allocations and frees taking this share of the step time or more.
pub const ALLOC_BOUND_SHARE: f64 = 0.15;
/// Launch calls taking this share of the step time or more...
pub const LAUNCH_BOUND_SHARE: f64 = 0.3;
/// ... while a kernel lasts less than this many times a launch call, on average.
pub const LAUNCH_OVER_KERNEL: f64 = 2.0;
/// A top-level section that launches (almost) nothing and takes this share of the step.
pub const INPUT_BOUND_SHARE: f64 = 0.3;
/// ... "almost nothing": launches, syncs and its kernels below this share of its time.
pub const INPUT_GPU_SHARE: f64 = 0.1;
/// Syncs this frequent (per step) with this few kernels between two of them drain the
/// GPU's queue again and again: the idle GPU is theirs.
pub const FREQUENT_SYNCS: f64 = 20.0;
pub const KERNELS_PER_SYNC: f64 = 10.0;
/// The GPU idle this share of the step or more, with no other bound standing out: the
/// host bounds the step.
pub const HOST_BOUND_IDLE: f64 = 0.2;

#[cfg(test)]
mod tests {
    use super::pct;

    #[test]
    fn an_empty_share_prints_as_zero_percent_not_minus_zero() {
        // An empty f64 sum is -0.0; it printed as "-0%" in a finding.
        let empty: f64 = std::iter::empty::<f64>().sum();
        assert_eq!(pct(empty), "0%");
        assert_eq!(pct(-0.0), "0%");
        assert_eq!(pct(0.256), "26%");
        assert_eq!(pct(1.0), "100%");
    }
}
