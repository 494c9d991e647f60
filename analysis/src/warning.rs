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
    /// A warning about one trace file of a run directory read in segments.
    Segment { file: String, inner: Box<Warning> },
    /// A segment (or the first one) has no `baseTimeNanoseconds`, so it was placed just
    /// after the segments before it.
    SegmentPlaced {
        file: String,
        /// The file without a base time.
        missing: String,
        /// Where its first event landed, us on the first segment's clock.
        at_us: f64,
    },
    /// Segments overlap in time on the first segment's clock.
    SegmentsOverlap {
        file: String,
        previous: String,
        overlap_us: f64,
        /// Segments that overlap the ones before them, this one included.
        count: usize,
    },
    /// Steps traced in a segment and again in a later one (a run resumed from a
    /// checkpoint older than its last traced step); the earlier copies carry no step.
    RepeatedSteps {
        file: String,
        later: String,
        steps: usize,
        first: i64,
        last: i64,
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
            Warning::Segment { file, inner } => write!(f, "{file}: {inner}"),
            Warning::SegmentPlaced {
                file,
                missing,
                at_us,
            } => write!(
                f,
                "{file} was placed just after the segments before it (its first event at \
                 {at_us:.3} us): {missing} has no `baseTimeNanoseconds`, so the time between \
                 them is unknown"
            ),
            Warning::SegmentsOverlap {
                file,
                previous,
                overlap_us,
                count,
            } => {
                write!(
                    f,
                    "{file} starts {:.3} ms before {previous} ends on the shared clock",
                    overlap_us / 1e3
                )?;
                if *count > 1 {
                    write!(f, " ({count} segments overlap the ones before them)")?;
                }
                f.write_str(
                    "; all were loaded (a wrong `baseTimeNanoseconds`, or two runs traced into \
                     one directory?)",
                )
            }
            Warning::RepeatedSteps {
                file,
                later,
                steps,
                first,
                last,
            } => write!(
                f,
                "{steps} steps of {file} ({first}..={last}) are traced again in {later} (the \
                 run resumed from an earlier checkpoint); their spans in {file} are kept \
                 without a step, so each step counts once, from its later copy"
            ),
        }
    }
}
