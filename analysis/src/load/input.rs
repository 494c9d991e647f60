//! What a load takes ([`LoadOptions`]) and how it fails ([`LoadError`]).

use std::io;
use std::path::PathBuf;

use chrome_trace_format::run_dir;
use polars::prelude::PolarsError;

/// Why a trace could not be loaded. Messages name the file and, for bad content, the byte
/// offset (of the decompressed JSON for `.gz`) and the event index.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error(
        "{path}: the directory holds neither {} nor {}",
        run_dir::TRACE_JSON,
        run_dir::TRACE_JSON_GZ
    )]
    NoTraceInDir { path: PathBuf },
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: the file is empty; a trace is a JSON object with a `traceEvents` array")]
    Empty { path: PathBuf },
    #[error("{path}: byte {offset}: {what}")]
    Syntax {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    #[error("{path}: event {index} (byte {offset}) {what}")]
    BadEvent {
        path: PathBuf,
        index: u64,
        offset: u64,
        what: String,
    },
    #[error("{path}: no `traceEvents` array before the end of the file (byte {offset})")]
    NoEvents { path: PathBuf, offset: u64 },
    #[error("{path}: building the span tables")]
    Frame {
        path: PathBuf,
        #[source]
        source: PolarsError,
    },
}

impl LoadError {
    /// Whether the input itself is at fault (exit code 2), rather than the machine.
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, LoadError::Io { .. } | LoadError::Frame { .. })
    }
}

/// How to load.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Show a progress bar on stderr (only drawn when stderr is a terminal).
    pub progress: bool,
    /// Threads that scan parts of an uncompressed file at once and build the tables (a
    /// rayon pool of this size runs the load); 0: one per core.
    pub threads: usize,
    /// The smallest part worth a thread of its own, in bytes; 0: 16 MiB. Tests set it low
    /// to split small files.
    #[doc(hidden)]
    pub min_part_bytes: u64,
}

impl LoadError {
    /// The error of a part whose first event is event `before` of the file.
    pub(super) fn after_events(mut self, before: u64) -> LoadError {
        if let LoadError::BadEvent { index, .. } = &mut self {
            *index += before;
        }
        self
    }
}
