//! What GPU timing costs the recording threads ([`GpuTimingCost`]): GPU-timed spans,
//! the CPU time their begins and ends spent in the recorder, the part of it inside the
//! backend's event records, events recorded and reused, and a histogram of the spans'
//! own cost. Each thread keeps running totals in [`COST_FIELDS`] counters
//! (see `thread::ThreadSlot::gpu_cost`); a snapshot is their sum.

/// Buckets of the per-span cost histogram ([`GpuTimingCost::span_cost_hist`]): bucket `i`
/// counts spans that cost `[i, i + 1) * COST_BUCKET_NS`; the last is open.
pub const COST_BUCKETS: usize = 64;
pub const COST_BUCKET_NS: u64 = 250;

/// The bucket of a span that cost `ns`.
pub(crate) fn cost_bucket(ns: u64) -> usize {
    ((ns / COST_BUCKET_NS) as usize).min(COST_BUCKETS - 1)
}

/// Counters per thread: spans, ticks, events recorded, events reused, record ticks,
/// then [`COST_BUCKETS`] histogram counts.
pub(crate) const COST_SCALARS: usize = 5;
pub(crate) const COST_FIELDS: usize = COST_SCALARS + COST_BUCKETS;

/// The CPU cost of GPU timing as the program ran, since the recorder started: every
/// GPU-timed span's begin and end as spent in the recorder, event records included.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GpuTimingCost {
    /// GPU-timed spans that ended with both events.
    pub spans: u64,
    /// Their begins and ends in the recorder, in total.
    pub cpu_ns: u64,
    /// Span boundaries that recorded a new event, and those that reused the thread's
    /// previous one (back-to-back sections).
    pub events_recorded: u64,
    pub events_reused: u64,
    /// Of `cpu_ns`, the time inside the GPU backend's event records (for CUDA, the
    /// driver's `cuEventRecord`).
    pub record_ns: u64,
    /// The spans by their own cost (begin and end together): bucket `i` counts those
    /// that cost `[i, i + 1) * COST_BUCKET_NS`; the last bucket is open-ended.
    #[serde(serialize_with = "serialize_hist")]
    pub span_cost_hist: [u64; COST_BUCKETS],
    /// The reuse window in force at the end (see [`set_gpu_event_reuse_window`](crate::set_gpu_event_reuse_window)).
    pub reuse_window_ns: u64,
}

impl Default for GpuTimingCost {
    fn default() -> Self {
        GpuTimingCost {
            spans: 0,
            cpu_ns: 0,
            events_recorded: 0,
            events_reused: 0,
            record_ns: 0,
            span_cost_hist: [0; COST_BUCKETS],
            reuse_window_ns: 0,
        }
    }
}

fn serialize_hist<S: serde::Serializer>(h: &[u64; COST_BUCKETS], s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(h.as_slice(), s)
}

impl GpuTimingCost {
    /// What was spent between `earlier` (an older snapshot of the same recorder) and this
    /// one; the window is this one's.
    pub fn since(&self, earlier: &GpuTimingCost) -> GpuTimingCost {
        GpuTimingCost {
            spans: self.spans.saturating_sub(earlier.spans),
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            events_recorded: self.events_recorded.saturating_sub(earlier.events_recorded),
            events_reused: self.events_reused.saturating_sub(earlier.events_reused),
            record_ns: self.record_ns.saturating_sub(earlier.record_ns),
            span_cost_hist: std::array::from_fn(|i| {
                self.span_cost_hist[i].saturating_sub(earlier.span_cost_hist[i])
            }),
            reuse_window_ns: self.reuse_window_ns,
        }
    }

    /// One line for logs: spans, mean and quantiles of their CPU cost, the event
    /// records' share, events per span.
    pub fn describe(&self) -> String {
        let us = |ns: Option<f64>| ns.map_or("-".to_string(), |v| format!("{:.2}", v / 1e3));
        format!(
            "{} GPU-timed spans, {:.2} us of CPU each (median {} us, 90th percentile {} us), \
             {:.2} us of it in event records; {:.2} events recorded per span (reuse window {} ns)",
            self.spans,
            self.cpu_ns_per_span() / 1e3,
            us(self.span_cost_quantile_ns(0.5)),
            us(self.span_cost_quantile_ns(0.9)),
            self.record_ns_per_span() / 1e3,
            self.events_per_span(),
            self.reuse_window_ns
        )
    }

    /// Mean ns per GPU-timed span spent inside the backend's event records.
    pub fn record_ns_per_span(&self) -> f64 {
        self.record_ns as f64 / self.spans.max(1) as f64
    }

    /// The `q` quantile (0..=1) of the per-span cost in ns, interpolated within its
    /// histogram bucket; `None` without spans. A quantile in the open last bucket reads
    /// as that bucket's lower bound.
    pub fn span_cost_quantile_ns(&self, q: f64) -> Option<f64> {
        let n: u64 = self.span_cost_hist.iter().sum();
        if n == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * n as f64;
        let width = COST_BUCKET_NS as f64;
        let mut below = 0u64;
        for (i, &c) in self.span_cost_hist.iter().enumerate() {
            if c > 0 && (below + c) as f64 >= rank {
                let lo = i as f64 * width;
                if i == COST_BUCKETS - 1 {
                    return Some(lo);
                }
                return Some(lo + width * ((rank - below as f64) / c as f64).clamp(0.0, 1.0));
            }
            below += c;
        }
        None
    }

    /// Mean CPU ns per GPU-timed span (0 without any).
    pub fn cpu_ns_per_span(&self) -> f64 {
        self.cpu_ns as f64 / self.spans.max(1) as f64
    }

    /// Events recorded per GPU-timed span (2 without reuse).
    pub fn events_per_span(&self) -> f64 {
        self.events_recorded as f64 / self.spans.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The histogram's quantiles against the exact quantiles of the samples it counts:
    /// within one bucket, and exact at the open last bucket's lower bound.
    #[test]
    fn span_cost_quantiles_match_the_samples() {
        assert_eq!(GpuTimingCost::default().span_cost_quantile_ns(0.5), None);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut samples: Vec<u64> = (0..5000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mostly 0.5-3 us, a tail to 20 us (past the last bucket's bound).
                if i % 10 == 0 {
                    x % 20_000
                } else {
                    500 + x % 2_500
                }
            })
            .collect();
        let mut c = GpuTimingCost::default();
        for &s in &samples {
            c.span_cost_hist[cost_bucket(s)] += 1;
        }
        samples.sort_unstable();
        let width = COST_BUCKET_NS as f64;
        let last_lo = ((COST_BUCKETS - 1) as u64 * COST_BUCKET_NS) as f64;
        for q in [0.01, 0.1, 0.25, 0.5, 0.75, 0.9] {
            let exact = samples[((q * samples.len() as f64) as usize).min(samples.len() - 1)];
            let got = c.span_cost_quantile_ns(q).unwrap();
            assert!(
                (got - exact as f64).abs() <= width,
                "q {q}: {got} vs {exact}"
            );
        }
        assert!(samples[samples.len() * 99 / 100] as f64 >= last_lo);
        assert_eq!(c.span_cost_quantile_ns(0.99), Some(last_lo));
        assert_eq!(c.span_cost_quantile_ns(1.0), Some(last_lo));
        let since = c.since(&GpuTimingCost {
            span_cost_hist: c.span_cost_hist,
            ..Default::default()
        });
        assert_eq!(since.span_cost_quantile_ns(0.5), None);
    }
}
