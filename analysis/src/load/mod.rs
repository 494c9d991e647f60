//! Loads a trace file (ours or a PyTorch-profiler/Kineto one), or every trace file of a
//! run directory, into polars frames.
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
//! `nesting` turn those into the frames; `segments` joins the files of a run directory
//! that was resumed with `--trace` onto one clock. What a `cat`, a phase or a name means
//! comes from the `chrome-trace-format` crate.

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
mod segments;
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

/// What was read, for `info` and the benchmark; sums over the files when a run directory
/// holds several segments.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoadStats {
    /// The trace files read, in segment order (one for a file or a run traced once).
    pub segments: Vec<PathBuf>,
    /// Bytes of the files on disk.
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
    /// The trace file read; the run directory when it held several segments (listed in
    /// [`LoadStats::segments`]).
    pub path: PathBuf,
    /// One row per complete event; columns in [`SPAN_COLUMNS`].
    pub spans: DataFrame,
    /// `pid, name, key, ts, value`: one row per counter key per `C` event.
    pub counters: DataFrame,
    /// `id, dir (out|in), pid, tid, ts, span`: flow ends (`bind_id` or `s`/`f` events).
    pub flows: DataFrame,
    /// `pid, tid, process, thread, track`: names of every track that has spans.
    pub threads: DataFrame,
    /// The top-level keys other than `traceEvents` (`metadata`, `baseTimeNanoseconds`, ...);
    /// the first segment's, whose clock every `ts` is on.
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

/// A run directory becomes its first trace file (`trace.json`, else `trace.json.gz`); a
/// file stays itself.
pub fn resolve_input(path: &Path) -> Result<PathBuf, LoadError> {
    let mut files = resolve_inputs(path)?;
    Ok(files.swap_remove(0))
}

/// The trace files an input stands for: a run directory's segments in order (one file per
/// segment: `trace.N.json` before `trace.N.json.gz`, as [`run_dir::find_trace`] prefers),
/// or the file itself.
pub fn resolve_inputs(path: &Path) -> Result<Vec<PathBuf>, LoadError> {
    if path.is_dir() {
        let mut seen = std::collections::BTreeSet::new();
        let files: Vec<PathBuf> = run_dir::trace_files(path)
            .into_iter()
            .filter(|p| p.is_file())
            .filter(|p| {
                let seg = p
                    .file_name()
                    .and_then(|n| run_dir::trace_segment(n.to_str()?));
                seg.is_some_and(|(n, _)| seen.insert(n))
            })
            .collect();
        if files.is_empty() {
            return Err(LoadError::NoTraceInDir { path: path.into() });
        }
        return Ok(files);
    }
    if !path.exists() {
        return Err(LoadError::NotFound { path: path.into() });
    }
    Ok(vec![path.into()])
}

/// The run label of an input path: `runs/a/trace.json` and `runs/a` are both "a".
pub fn run_label(input: &Path) -> String {
    run_dir::run_label(input)
}

/// Loads a run directory or trace file, on a rayon pool of `opts.threads` threads. A run
/// directory's segments are read in order and joined into one trace on the first
/// segment's clock (the `segments` module says how).
pub fn load(input: &Path, opts: &LoadOptions) -> Result<Trace, LoadError> {
    let start = Instant::now();
    let files = resolve_inputs(input)?;
    let path = match files.as_slice() {
        [one] => one.clone(),
        _ => input.to_path_buf(),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .build()
        .map_err(|e| LoadError::Io {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
    pool.install(|| {
        let scanned = scan_files(&files, opts)?;
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
        let built = frames::build(scanned.raw, &scanned.superseded, &run, &mut warnings).map_err(
            |source| LoadError::Frame {
                path: path.clone(),
                source,
            },
        )?;
        let stats = LoadStats {
            segments: files.clone(),
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

/// What scanning every file of an input found, joined.
struct ScannedFiles {
    raw: raw::Raw,
    superseded: Vec<segments::Superseded>,
    events: u64,
    top: serde_json::Map<String, serde_json::Value>,
    warnings: Vec<Warning>,
    skips: Vec<Skipped>,
    file_bytes: u64,
    json_bytes: u64,
}

/// Scans the files one after the other (each on the whole pool); several are joined by
/// [`segments::join`], each file's own warnings and skips labelled with its name.
fn scan_files(files: &[PathBuf], opts: &LoadOptions) -> Result<ScannedFiles, LoadError> {
    if let [one] = files {
        let s = parts::scan(one, opts)?;
        return Ok(ScannedFiles {
            raw: s.raw,
            superseded: Vec::new(),
            events: s.events,
            top: s.top,
            warnings: s.warnings,
            skips: s.skips,
            file_bytes: s.file_bytes,
            json_bytes: s.json_bytes,
        });
    }
    let mut out = ScannedFiles {
        raw: raw::Raw::default(),
        superseded: Vec::new(),
        events: 0,
        top: serde_json::Map::new(),
        warnings: Vec::new(),
        skips: Vec::new(),
        file_bytes: 0,
        json_bytes: 0,
    };
    let mut segs = Vec::with_capacity(files.len());
    let mut skips = Vec::with_capacity(files.len());
    for (k, f) in files.iter().enumerate() {
        let s = parts::scan(f, opts)?;
        let file = f.file_name().map_or_else(
            || f.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        out.events += s.events;
        out.file_bytes += s.file_bytes;
        out.json_bytes += s.json_bytes;
        out.warnings
            .extend(s.warnings.into_iter().map(|w| Warning::Segment {
                file: file.clone(),
                inner: Box::new(w),
            }));
        skips.push((file.clone(), s.skips));
        let base_ns = segments::base_ns(&s.top);
        if k == 0 {
            out.top = s.top;
        }
        segs.push(segments::Segment {
            file,
            raw: s.raw,
            base_ns,
        });
    }
    out.skips = skips::join_files(skips);
    let joined = segments::join(segs);
    out.raw = joined.raw;
    out.superseded = joined.superseded;
    out.warnings.extend(joined.warnings);
    Ok(out)
}

/// Reads one span column as `f64` values; for pure functions that want slices.
pub fn f64_column(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<f64>>> {
    Ok(df.column(name)?.f64()?.iter().collect())
}

#[cfg(test)]
mod tests;
