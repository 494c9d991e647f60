//! Loads a trace file (ours or a PyTorch-profiler/Kineto one) into polars frames.
//!
//! The file is streamed: a fixed read buffer, one event scanned at a time, values nobody
//! reads skipped unparsed, strings interned. Nothing like a `serde_json::Value` of the
//! whole file is ever built, so memory follows the number of spans, not the file size.
//! A file that ends early (a writer killed mid-run) keeps every complete event before the
//! cut and says so in a [`Warning`].
//!
//! Rooms: `parts` splits an uncompressed file into parts scanned in parallel and joins
//! what they found; `parser` walks one part's JSON (the top-level object, the
//! `traceEvents` array) with the scanner of `json` and `event`; `raw` keeps the events as
//! plain columns (`intern`: strings to ids; `merge`: joining parts); `frames` and
//! `nesting` turn those into the frames. What a `cat`, a phase or a name means comes from
//! the `chrome-trace-format` crate.

mod event;
mod frames;
mod input;
mod intern;
mod json;
mod merge;
mod nesting;
mod parser;
mod parts;
mod raw;
mod skips;

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use chrome_trace_format::header::{meta, top};
use chrome_trace_format::{dflash, run_dir};
use polars::prelude::*;

use crate::warning::Warning;

pub use chrome_trace_format::{Clock, SpanKind as Kind};
pub use frames::SPAN_COLUMNS;
pub use input::{LoadError, LoadOptions};
pub use skips::{SkipReason, Skipped};

/// What was read, for `info` and the benchmark.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoadStats {
    /// Bytes of the file on disk.
    pub file_bytes: u64,
    /// Bytes of JSON scanned (decompressed for `.gz`).
    pub json_bytes: u64,
    pub events: u64,
    pub spans: usize,
    pub counters: usize,
    pub flows: usize,
    /// Wall time of the whole load.
    pub seconds: f64,
    /// Of which scanning the JSON into raw columns (the rest builds the tables).
    pub scan_seconds: f64,
    /// Events not used, by reason (those of phases the analysis does not use included).
    pub skipped: Vec<Skipped>,
}

/// A loaded trace.
pub struct Trace {
    /// Label of the run: its directory name, or the file stem.
    pub run: String,
    pub path: PathBuf,
    /// One row per complete event; columns in [`SPAN_COLUMNS`].
    pub spans: DataFrame,
    /// `pid, name, key, ts, value`: one row per counter key per `C` event.
    pub counters: DataFrame,
    /// `id, dir (out|in), pid, tid, ts, span`: flow ends (`bind_id` or `s`/`f` events).
    pub flows: DataFrame,
    /// `pid, tid, process, thread, track`: names of every track that has spans.
    pub threads: DataFrame,
    /// The top-level keys other than `traceEvents` (`metadata`, `baseTimeNanoseconds`, ...).
    pub top: serde_json::Map<String, serde_json::Value>,
    pub warnings: Vec<Warning>,
    pub stats: LoadStats,
}

impl Trace {
    /// `true` when the file says it was written by dflash.
    pub fn is_dflash(&self) -> bool {
        self.top
            .get(top::METADATA)
            .and_then(|m| m.get(meta::PRODUCER))
            .and_then(|p| p.as_str())
            == Some(dflash::PRODUCER)
    }
}

/// A run directory becomes its trace file; a file stays itself.
pub fn resolve_input(path: &Path) -> Result<PathBuf, LoadError> {
    if path.is_dir() {
        return run_dir::find_trace(path)
            .ok_or_else(|| LoadError::NoTraceInDir { path: path.into() });
    }
    if !path.exists() {
        return Err(LoadError::NotFound { path: path.into() });
    }
    Ok(path.into())
}

/// The run label of an input path: `runs/a/trace.json` and `runs/a` are both "a".
pub fn run_label(input: &Path) -> String {
    run_dir::run_label(input)
}

/// Loads a run directory or trace file, on a rayon pool of `opts.threads` threads.
pub fn load(input: &Path, opts: &LoadOptions) -> Result<Trace, LoadError> {
    let start = Instant::now();
    let path = resolve_input(input)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| LoadError::Io {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
    pool.install(|| {
        let scanned = parts::scan(&path, opts)?;
        let scan_seconds = start.elapsed().as_secs_f64();
        let run = run_label(input);
        let mut warnings = scanned.warnings;
        if let Some(line) = skips::summary(&scanned.skips) {
            warnings.push(Warning::Skipped {
                events: scanned
                    .skips
                    .iter()
                    .filter(|s| s.reason.is_problem())
                    .map(|s| s.count)
                    .sum(),
                summary: line,
            });
        }
        let built =
            frames::build(scanned.raw, &run, &mut warnings).map_err(|source| LoadError::Frame {
                path: path.clone(),
                source,
            })?;
        let stats = LoadStats {
            file_bytes: scanned.file_bytes,
            json_bytes: scanned.json_bytes,
            events: scanned.events,
            spans: built.spans.height(),
            counters: built.counters.height(),
            flows: built.flows.height(),
            seconds: start.elapsed().as_secs_f64(),
            scan_seconds,
            skipped: scanned.skips,
        };
        Ok(Trace {
            run,
            path: path.clone(),
            spans: built.spans,
            counters: built.counters,
            flows: built.flows,
            threads: built.threads,
            top: scanned.top,
            warnings,
            stats,
        })
    })
}

/// Reads one span column as `f64` values; for pure functions that want slices.
pub fn f64_column(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<f64>>> {
    Ok(df.column(name)?.f64()?.iter().collect())
}

#[cfg(test)]
mod tests;
