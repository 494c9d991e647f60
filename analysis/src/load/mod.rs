//! Loads a trace file (ours or a PyTorch-profiler/Kineto one) into polars frames.
//!
//! The file is streamed: a fixed read buffer, one event scanned at a time, values nobody
//! reads skipped unparsed, strings interned. Nothing like a `serde_json::Value` of the
//! whole file is ever built, so memory follows the number of spans, not the file size.
//! A file that ends early (a writer killed mid-run) keeps every complete event before the
//! cut and says so in a [`Warning`].

mod event;
mod frames;
mod json;
mod raw;

use std::fs::File;
use std::io::{self, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use polars::prelude::*;

use crate::warning::Warning;
use event::{scan_event, Event};
use json::{Cursor, ScanError};
use raw::Raw;

pub use frames::{Clock, Kind, SPAN_COLUMNS};

/// Why a trace could not be loaded. Messages name the file and, for bad content, the byte
/// offset (of the decompressed JSON for `.gz`) and the event index.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error("{path}: the directory holds neither trace.json nor trace.json.gz")]
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
}

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
    pub seconds: f64,
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
            .get("metadata")
            .and_then(|m| m.get("producer"))
            .and_then(|p| p.as_str())
            == Some("dflash")
    }
}

/// A run directory becomes its trace file; a file stays itself.
pub fn resolve_input(path: &Path) -> Result<PathBuf, LoadError> {
    if path.is_dir() {
        for name in ["trace.json", "trace.json.gz"] {
            let p = path.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
        return Err(LoadError::NoTraceInDir { path: path.into() });
    }
    if !path.exists() {
        return Err(LoadError::NotFound { path: path.into() });
    }
    Ok(path.into())
}

/// The run label of an input path: `runs/a/trace.json` and `runs/a` are both "a".
pub fn run_label(input: &Path) -> String {
    let p = if input.is_dir() {
        input
    } else {
        let stem = input.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if stem.starts_with("trace.json") {
            input.parent().unwrap_or(input)
        } else {
            input
        }
    };
    let name = p
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("run")
        .to_string();
    name.trim_end_matches(".gz")
        .trim_end_matches(".json")
        .to_string()
}

/// Loads a run directory or trace file.
pub fn load(input: &Path, opts: &LoadOptions) -> Result<Trace, LoadError> {
    let start = Instant::now();
    let path = resolve_input(input)?;
    let io_err = |source| LoadError::Io {
        path: path.clone(),
        source,
    };
    let mut file = File::open(&path).map_err(io_err)?;
    let file_bytes = file.metadata().map_err(io_err)?.len();
    let mut magic = [0u8; 2];
    let n = read_full(&mut file, &mut magic).map_err(io_err)?;
    if n == 0 {
        return Err(LoadError::Empty { path });
    }
    let bar = progress_bar(opts, file_bytes);
    let counted = Counted {
        inner: io::Cursor::new(magic[..n].to_vec()).chain(file),
        bar: bar.clone(),
    };
    let gz = n == 2 && magic == [0x1f, 0x8b];
    let src: Box<dyn Read> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(
            io::BufReader::with_capacity(1 << 20, counted),
        ))
    } else {
        Box::new(counted)
    };
    let mut parser = Parser {
        path: path.clone(),
        gz,
        src,
        buf: vec![0; 1 << 20],
        pos: 0,
        end: 0,
        base: 0,
        eof: false,
        raw: Raw::default(),
        index: 0,
        top: serde_json::Map::new(),
        warnings: Vec::new(),
    };
    parser.parse_document()?;
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let json_bytes = parser.base + parser.end as u64;
    let Parser {
        raw,
        index,
        top,
        mut warnings,
        ..
    } = parser;
    let run = run_label(input);
    let built = frames::build(raw, &run, &mut warnings).map_err(|source| LoadError::Frame {
        path: path.clone(),
        source,
    })?;
    let stats = LoadStats {
        file_bytes,
        json_bytes,
        events: index,
        spans: built.spans.height(),
        counters: built.counters.height(),
        flows: built.flows.height(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok(Trace {
        run,
        path,
        spans: built.spans,
        counters: built.counters,
        flows: built.flows,
        threads: built.threads,
        top,
        warnings,
        stats,
    })
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn progress_bar(opts: &LoadOptions, total: u64) -> Option<indicatif::ProgressBar> {
    // Small files load faster than a bar can draw.
    if !opts.progress || !io::stderr().is_terminal() || total < (64 << 20) {
        return None;
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "loading {bar:40} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    Some(bar)
}

/// Counts bytes read off the disk into the progress bar.
struct Counted<R> {
    inner: R,
    bar: Option<indicatif::ProgressBar>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(b) = &self.bar {
            b.inc(n as u64);
        }
        Ok(n)
    }
}

struct Parser {
    path: PathBuf,
    gz: bool,
    src: Box<dyn Read>,
    buf: Vec<u8>,
    /// The unconsumed input is `buf[pos..end]`.
    pos: usize,
    end: usize,
    /// Offset in the JSON stream of `buf[0]`.
    base: u64,
    eof: bool,
    raw: Raw,
    /// Index of the next event in `traceEvents`.
    index: u64,
    top: serde_json::Map<String, serde_json::Value>,
    warnings: Vec<Warning>,
}

/// What a step of the top-level scan found.
enum Step<T> {
    Got(T),
    /// The input ended first.
    Eof,
}

impl Parser {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Reads more input, keeping `buf[pos..end]`. `false` at the end of the input.
    fn fill(&mut self) -> Result<bool, LoadError> {
        if self.eof {
            return Ok(false);
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.end, 0);
            self.base += self.pos as u64;
            self.end -= self.pos;
            self.pos = 0;
        }
        if self.end == self.buf.len() {
            // One value larger than the buffer: grow.
            let len = self.buf.len() * 2;
            self.buf.resize(len, 0);
        }
        loop {
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(false);
                }
                Ok(n) => {
                    self.end += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if self.gz && e.kind() == io::ErrorKind::UnexpectedEof => {
                    // A cut gzip stream: keep what decompressed.
                    self.eof = true;
                    return Ok(false);
                }
                Err(e) if self.gz && e.kind() == io::ErrorKind::InvalidInput => {
                    return Err(LoadError::Syntax {
                        path: self.path.clone(),
                        offset: self.offset(),
                        what: format!("the gzip stream is corrupt ({e})"),
                    })
                }
                Err(source) => {
                    return Err(LoadError::Io {
                        path: self.path.clone(),
                        source,
                    })
                }
            }
        }
    }

    /// Runs `f` on the unconsumed input, refilling and retrying while it is incomplete.
    fn scan<T>(
        &mut self,
        mut f: impl FnMut(&mut Cursor<'_>) -> Result<T, ScanError>,
    ) -> Result<Step<T>, LoadError> {
        loop {
            let mut c = Cursor::new(&self.buf[self.pos..self.end]);
            match f(&mut c) {
                Ok(v) => {
                    self.pos += c.i;
                    return Ok(Step::Got(v));
                }
                Err(ScanError::Incomplete) => {
                    if !self.fill()? {
                        return Ok(Step::Eof);
                    }
                }
                Err(ScanError::Syntax { at, what }) => {
                    return Err(LoadError::Syntax {
                        path: self.path.clone(),
                        offset: self.offset() + at as u64,
                        what,
                    })
                }
            }
        }
    }

    /// The next non-blank byte, not consumed.
    fn peek(&mut self) -> Result<Step<u8>, LoadError> {
        self.scan(|c| c.peek())
    }

    fn syntax<T>(&self, what: impl Into<String>) -> Result<T, LoadError> {
        Err(LoadError::Syntax {
            path: self.path.clone(),
            offset: self.offset(),
            what: what.into(),
        })
    }

    fn truncated(&mut self, inside: &'static str) {
        self.warnings.push(Warning::Truncated {
            offset: self.base + self.end as u64,
            events_kept: self.index,
            inside,
        });
    }

    fn parse_document(&mut self) -> Result<(), LoadError> {
        // A UTF-8 byte order mark is not JSON, but editors write it.
        self.fill()?;
        if self.buf[..self.end].starts_with(b"\xEF\xBB\xBF") {
            self.pos = 3;
        }
        match self.peek()? {
            Step::Eof => Err(LoadError::Empty {
                path: self.path.clone(),
            }),
            Step::Got(b'[') => {
                self.pos += 1;
                self.events().map(|_| ())
            }
            Step::Got(b'{') => {
                self.pos += 1;
                self.object()
            }
            Step::Got(b) => self.syntax(format!(
                "a trace is a JSON object with a `traceEvents` array (or a bare array of events); found {}",
                json::describe_byte(b)
            )),
        }
    }

    /// The top-level object: `traceEvents` streams, other keys are kept as JSON values.
    fn object(&mut self) -> Result<(), LoadError> {
        let mut seen_events = false;
        loop {
            let b = match self.peek()? {
                Step::Got(b) => b,
                Step::Eof => return self.end_of_input(seen_events, "the top-level object"),
            };
            match b {
                b'}' => {
                    self.pos += 1;
                    if !seen_events {
                        return Err(LoadError::NoEvents {
                            path: self.path.clone(),
                            offset: self.offset(),
                        });
                    }
                    return Ok(());
                }
                b',' => self.pos += 1,
                b'"' => {
                    let key = match self.scan(|c| {
                        let k = c.string()?;
                        c.eat(b':')?;
                        Ok(json::unescape(c.bytes(k)))
                    })? {
                        Step::Got(k) => k,
                        Step::Eof => return self.end_of_input(seen_events, "a top-level key"),
                    };
                    if key == "traceEvents" {
                        match self.peek()? {
                            Step::Got(b'[') => self.pos += 1,
                            Step::Got(b) => {
                                return self.syntax(format!(
                                    "`traceEvents` must be an array, found {}",
                                    json::describe_byte(b)
                                ))
                            }
                            Step::Eof => return self.end_of_input(true, "`traceEvents`"),
                        }
                        seen_events = true;
                        if !self.events()? {
                            return Ok(());
                        }
                    } else {
                        let start = self.offset();
                        let value = match self.scan(|c| {
                            let from = c.i;
                            c.skip_value()?;
                            serde_json::from_slice::<serde_json::Value>(&c.s[from..c.i]).map_err(
                                |e| ScanError::Syntax {
                                    at: from,
                                    what: format!("top-level `{key}`: {e}"),
                                },
                            )
                        })? {
                            Step::Got(v) => v,
                            Step::Eof => {
                                return self.end_of_input(seen_events, "a top-level value")
                            }
                        };
                        let _ = start;
                        self.top.insert(key, value);
                    }
                }
                other => {
                    return self.syntax(format!(
                        "expected a key or `}}` in the top-level object, found {}",
                        json::describe_byte(other)
                    ))
                }
            }
        }
    }

    fn end_of_input(&mut self, seen_events: bool, inside: &'static str) -> Result<(), LoadError> {
        if !seen_events {
            return Err(LoadError::NoEvents {
                path: self.path.clone(),
                offset: self.base + self.end as u64,
            });
        }
        self.truncated(inside);
        Ok(())
    }

    /// The `traceEvents` array, after its `[`. Returns `false` when the input ended inside
    /// it (a truncated trace; the warning is recorded).
    fn events(&mut self) -> Result<bool, LoadError> {
        let mut ev = Event::default();
        loop {
            let b = match self.peek()? {
                Step::Got(b) => b,
                Step::Eof => {
                    self.truncated("the `traceEvents` array (between events)");
                    return Ok(false);
                }
            };
            match b {
                b']' => {
                    self.pos += 1;
                    return Ok(true);
                }
                // Trailing commas are tolerated, as Perfetto does.
                b',' => self.pos += 1,
                b'{' => {
                    let at = self.offset();
                    loop {
                        let slice = &self.buf[self.pos..self.end];
                        let mut c = Cursor::new(slice);
                        match scan_event(&mut c, &mut ev) {
                            Ok(()) => {
                                if let Err(p) = self.raw.push(slice, &ev) {
                                    return Err(LoadError::BadEvent {
                                        path: self.path.clone(),
                                        index: self.index,
                                        offset: at,
                                        what: p.0,
                                    });
                                }
                                self.pos += c.i;
                                self.index += 1;
                                break;
                            }
                            Err(ScanError::Incomplete) => {
                                if !self.fill()? {
                                    self.truncated("an event (cut mid-event)");
                                    return Ok(false);
                                }
                            }
                            Err(ScanError::Syntax { at: rel, what }) => {
                                return Err(LoadError::BadEvent {
                                    path: self.path.clone(),
                                    index: self.index,
                                    offset: self.offset() + rel as u64,
                                    what: format!("is not valid: {what}"),
                                })
                            }
                        }
                    }
                }
                other => {
                    return Err(LoadError::BadEvent {
                        path: self.path.clone(),
                        index: self.index,
                        offset: self.offset(),
                        what: format!("is not an object: found {}", json::describe_byte(other)),
                    })
                }
            }
        }
    }
}

/// Reads one span column as `f64` values; for pure functions that want slices.
pub fn f64_column(df: &DataFrame, name: &str) -> PolarsResult<Vec<Option<f64>>> {
    Ok(df.column(name)?.f64()?.iter().collect())
}
