//! Things worth telling the user that do not stop the analysis. Each `Display` says what
//! happened and what to do about it; they are printed to stderr.

use std::fmt;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "warning", rename_all = "snake_case")]
pub enum Warning {
    /// The file ended before the JSON did (a writer killed mid-run).
    Truncated {
        offset: u64,
        events_kept: u64,
        inside: &'static str,
    },
    /// Spans on one track partially overlap (out of the Chrome trace spec).
    Overlaps { count: u64 },
    /// Events the loader could not use, skipped and counted (the list is in
    /// `Trace::skipped`).
    Skipped { events: u64, summary: String },
    /// No `ProfilerStep#N` spans: per-step numbers are unavailable.
    NoSteps,
    /// Fewer steps than a statistical comparison needs.
    FewSamples {
        run: String,
        steps: usize,
        min: usize,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::Truncated {
                offset,
                events_kept,
                inside,
            } => write!(
                f,
                "the trace is truncated: it ends at byte {offset} inside {inside}; kept the \
                 {events_kept} complete events before the cut (a writer killed before it \
                 closed the file leaves this; the last step may be partial)"
            ),
            Warning::Overlaps { count } => write!(
                f,
                "{count} spans partially overlap a span on the same track; they were treated \
                 as siblings (self times on those tracks may be off)"
            ),
            Warning::Skipped { summary, .. } => f.write_str(summary),
            Warning::NoSteps => write!(
                f,
                "no ProfilerStep#N spans: per-step tables and shares of step are empty (trace \
                 with a step window, e.g. torch.profiler schedule or `dflash train --trace`)"
            ),
            Warning::FewSamples { run, steps, min } => write!(
                f,
                "{run} has {steps} steps; sections need at least {min} steps per run to be \
                 judged (trace more steps)"
            ),
        }
    }
}
