//! What the recorder reports: live per-name totals ([`Stats`], from
//! [`Recorder::stats_snapshot`](crate::Recorder::stats_snapshot)) and what
//! [`Recorder::finish`](crate::Recorder::finish) wrote ([`Summary`]); the writer adds
//! to the totals as it writes.
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::cost::GpuTimingCost;
use crate::names::Name;

/// Totals of one name since the previous [`Recorder::stats_snapshot`](crate::Recorder::stats_snapshot).
#[derive(Clone, Debug)]
pub struct NameStats {
    pub name: Name,
    pub text: Arc<str>,
    /// CPU spans ended.
    pub count: u64,
    /// Their total CPU time.
    pub cpu_ns: u64,
    /// GPU spans resolved, and their total GPU time.
    pub gpu_count: u64,
    pub gpu_ns: u64,
}

/// A [`Recorder::stats_snapshot`](crate::Recorder::stats_snapshot): names sorted by CPU
/// time, most first.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub names: Vec<NameStats>,
    /// Events lost since the recorder started because a thread's buffer was full.
    pub dropped_events: u64,
    /// GPU events that could not be recorded since the recorder started.
    pub gpu_errors: u64,
    /// What GPU timing has cost the recording threads so far.
    pub gpu_cost: GpuTimingCost,
}

/// What [`Recorder::finish`](crate::Recorder::finish) wrote.
#[derive(Clone, Debug)]
pub struct Summary {
    pub path: PathBuf,
    /// Events written (metadata events included).
    pub events: u64,
    pub dropped_events: u64,
    /// GPU spans written, and those given up (events never completed or failed).
    pub gpu_spans: u64,
    pub gpu_spans_dropped: u64,
    pub gpu_errors: u64,
    /// What GPU timing cost the recording threads.
    pub gpu_cost: GpuTimingCost,
}

impl Stats {
    /// One line for a progress display: the `n` names with most CPU time.
    pub fn summary_line(&self, n: usize) -> String {
        let mut s = String::new();
        for (i, e) in self.names.iter().take(n).enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            let _ = write!(s, "{} {:.1}ms", e.text, e.cpu_ns as f64 / 1e6);
            if e.gpu_count > 0 {
                let _ = write!(s, "/{:.1}ms gpu", e.gpu_ns as f64 / 1e6);
            }
        }
        s
    }

    pub fn get(&self, text: &str) -> Option<&NameStats> {
        self.names.iter().find(|e| &*e.text == text)
    }
}

#[derive(Default, Clone, Copy)]
pub(crate) struct Acc {
    pub count: u64,
    pub cpu_ns: u64,
    pub gpu_count: u64,
    pub gpu_ns: u64,
}

pub(crate) type SharedStats = Arc<Mutex<HashMap<Name, Acc>>>;

/// Per-name totals since the last snapshot, for [`Stats`], most CPU time first.
pub(crate) fn snapshot(stats: &SharedStats) -> Vec<NameStats> {
    let taken = std::mem::take(&mut *stats.lock().unwrap_or_else(|p| p.into_inner()));
    let mut v: Vec<NameStats> = taken
        .into_iter()
        .map(|(name, a)| NameStats {
            name,
            text: name.text(),
            count: a.count,
            cpu_ns: a.cpu_ns,
            gpu_count: a.gpu_count,
            gpu_ns: a.gpu_ns,
        })
        .collect();
    v.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.name.cmp(&b.name)));
    v
}
