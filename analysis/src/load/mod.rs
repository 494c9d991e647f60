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
    /// Threads that scan parts of an uncompressed file at once; 0: one per core.
    pub threads: usize,
    /// The smallest part worth a thread of its own, in bytes; 0: 16 MiB. Tests set it low
    /// to split small files.
    #[doc(hidden)]
    pub min_part_bytes: u64,
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
    /// Wall time of the whole load.
    pub seconds: f64,
    /// Of which scanning the JSON into raw columns (the rest builds the tables).
    pub scan_seconds: f64,
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
    let gz = n == 2 && magic == [0x1f, 0x8b];
    let starts = if gz {
        Vec::new()
    } else {
        part_starts(&file, file_bytes, opts).map_err(io_err)?
    };
    let counted = Counted {
        inner: io::Cursor::new(magic[..n].to_vec()).chain(file),
        bar: bar.clone(),
    };
    let src: Box<dyn Read + Send> = if gz {
        Box::new(flate2::read::MultiGzDecoder::new(
            io::BufReader::with_capacity(1 << 20, counted),
        ))
    } else {
        Box::new(counted)
    };
    let mut first = Parser::new(path.clone(), gz, src, 0);
    first.stops = starts
        .iter()
        .enumerate()
        .map(|(k, &at)| (at, k + 1))
        .collect();
    first.set_stop();
    // parts[k] is the part that starts at starts[k - 1]; parts[0] stays empty.
    let mut parts: Vec<Option<Result<Part, LoadError>>> = vec![None];
    let first = std::thread::scope(|scope| {
        let others: Vec<_> = (0..starts.len())
            .map(|k| {
                let (path, bar, starts) = (&path, &bar, &starts);
                scope.spawn(move || parse_part(path, bar, starts, k))
            })
            .collect();
        let first = first.parse_document().map(|()| first.into_part());
        for h in others {
            match h.join() {
                Ok(part) => parts.push(Some(part)),
                // A bug, not bad input: fail as loudly as on one thread.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        first
    });
    let mut acc = first?;
    let mut raws = vec![std::mem::take(&mut acc.raw)];
    while let Some(next) = acc
        .stopped
        .and_then(|k| parts.get_mut(k).and_then(Option::take))
    {
        let mut next = next.map_err(|e| e.after_events(acc.index))?;
        raws.push(std::mem::take(&mut next.raw));
        for w in &mut next.warnings {
            if let Warning::Truncated { events_kept, .. } = w {
                *events_kept += acc.index;
            }
        }
        acc.warnings.append(&mut next.warnings);
        acc.index += next.index;
        acc.top.extend(next.top);
        acc.json_bytes = next.json_bytes;
        acc.stopped = next.stopped;
    }
    acc.raw = Raw::concat(raws, opts.threads);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let Part {
        raw,
        index,
        top,
        mut warnings,
        json_bytes,
        ..
    } = acc;
    let scan_seconds = start.elapsed().as_secs_f64();
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
        scan_seconds,
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

/// What one part of the file scanned to.
struct Part {
    raw: Raw,
    /// Events scanned.
    index: u64,
    top: serde_json::Map<String, serde_json::Value>,
    warnings: Vec<Warning>,
    /// Offset in the JSON just past what was read.
    json_bytes: u64,
    /// The part whose first event this one stopped at; `None` at the end of the input.
    stopped: Option<usize>,
}

impl LoadError {
    /// The error of a part whose first event is event `before` of the file.
    fn after_events(mut self, before: u64) -> LoadError {
        if let LoadError::BadEvent { index, .. } = &mut self {
            *index += before;
        }
        self
    }
}

/// Where the parts after the first one start: at `{` of an event, near equal fractions of
/// the file. A start is a guess (a string or a nested value can hold `},{`): the part
/// before it checks it by stopping there exactly, at the start of an event of
/// `traceEvents`; otherwise that part scans on and the guessed part is dropped.
fn part_starts(file: &File, len: u64, opts: &LoadOptions) -> io::Result<Vec<u64>> {
    let min = if opts.min_part_bytes == 0 {
        16 << 20
    } else {
        opts.min_part_bytes
    };
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    };
    let parts = (threads as u64).min(len / min.max(1)).max(1);
    let mut starts: Vec<u64> = Vec::new();
    let mut window = vec![0u8; (1 << 20).min(len as usize)];
    for k in 1..parts {
        let from = (len / parts * k).max(starts.last().map_or(0, |&s| s + 1));
        let got = read_at(file, &mut window, from)?;
        if let Some(at) = event_boundary(&window[..got]) {
            starts.push(from + at as u64);
        }
    }
    Ok(starts)
}

/// The first `{` in `s` that follows `}` and `,` (blanks allowed between them).
fn event_boundary(s: &[u8]) -> Option<usize> {
    let blank = |b: u8| matches!(b, b' ' | b'\n' | b'\r' | b'\t');
    for comma in memchr::memchr_iter(b',', s) {
        let before = s[..comma].iter().rposition(|&b| !blank(b));
        let after = s[comma + 1..].iter().position(|&b| !blank(b));
        if let (Some(b), Some(a)) = (before, after) {
            if s[b] == b'}' && s[comma + 1 + a] == b'{' {
                return Some(comma + 1 + a);
            }
        }
    }
    None
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(not(unix))]
fn read_at(file: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    use std::io::{Seek, SeekFrom};
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(at))?;
    read_full(&mut f, buf)
}

/// Scans the part that starts at `starts[k]` (part `k + 1`) up to the start of a later
/// part, or to the end.
fn parse_part(
    path: &Path,
    bar: &Option<indicatif::ProgressBar>,
    starts: &[u64],
    k: usize,
) -> Result<Part, LoadError> {
    use std::io::{Seek, SeekFrom};
    let io_err = |source| LoadError::Io {
        path: path.into(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let from = starts[k];
    file.seek(SeekFrom::Start(from)).map_err(io_err)?;
    let src = Box::new(Counted {
        inner: file,
        bar: bar.clone(),
    });
    let mut p = Parser::new(path.into(), false, src, from);
    p.stops = starts
        .iter()
        .enumerate()
        .skip(k + 1)
        .map(|(j, &at)| (at, j + 1))
        .collect();
    p.set_stop();
    // What kind of document this is was settled by the first part; a part only needs to
    // know whether the array sits in an object.
    let bare = {
        let mut head = [0u8; 64];
        let got = File::open(path)
            .and_then(|f| read_at(&f, &mut head, 0))
            .map_err(io_err)?;
        head[..got]
            .iter()
            .find(|b| !matches!(b, b' ' | b'\n' | b'\r' | b'\t' | 0xEF | 0xBB | 0xBF))
            == Some(&b'[')
    };
    if let EventsEnd::Closed = p.events()? {
        if !bare {
            p.object(true)?;
        }
    }
    Ok(p.into_part())
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
    src: Box<dyn Read + Send>,
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
    /// Offsets where later parts start, with their numbers, ascending: an event that
    /// starts at one ends this part.
    stops: Vec<(u64, usize)>,
    /// The first entry of `stops` not yet passed, and its offset (`u64::MAX`: none).
    next_stop: usize,
    stop_at: u64,
    /// The part this one stopped at.
    stopped: Option<usize>,
}

/// How the `traceEvents` array ended.
enum EventsEnd {
    /// At its `]`.
    Closed,
    /// The input ended inside it (a truncated trace; the warning is recorded).
    Cut,
    /// At the first event of a later part.
    Stopped,
}

/// What a step of the top-level scan found.
enum Step<T> {
    Got(T),
    /// The input ended first.
    Eof,
}

impl Parser {
    fn new(path: PathBuf, gz: bool, src: Box<dyn Read + Send>, base: u64) -> Parser {
        Parser {
            path,
            gz,
            src,
            buf: vec![0; 1 << 20],
            pos: 0,
            end: 0,
            base,
            eof: false,
            raw: Raw::default(),
            index: 0,
            top: serde_json::Map::new(),
            warnings: Vec::new(),
            stops: Vec::new(),
            next_stop: 0,
            stop_at: u64::MAX,
            stopped: None,
        }
    }

    fn set_stop(&mut self) {
        self.stop_at = self.stops.get(self.next_stop).map_or(u64::MAX, |s| s.0);
    }

    fn into_part(self) -> Part {
        Part {
            json_bytes: self.base + self.end as u64,
            raw: self.raw,
            index: self.index,
            top: self.top,
            warnings: self.warnings,
            stopped: self.stopped,
        }
    }

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
                Err(ScanError::Syntax(e)) => {
                    let json::SyntaxError { at, what } = *e;
                    return Err(LoadError::Syntax {
                        path: self.path.clone(),
                        offset: self.offset() + at as u64,
                        what,
                    });
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
                self.object(false)
            }
            Step::Got(b) => self.syntax(format!(
                "a trace is a JSON object with a `traceEvents` array (or a bare array of events); found {}",
                json::describe_byte(b)
            )),
        }
    }

    /// The top-level object: `traceEvents` streams, other keys are kept as JSON values.
    /// `seen_events` when it goes on after the `traceEvents` array.
    fn object(&mut self, mut seen_events: bool) -> Result<(), LoadError> {
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
                        if !matches!(self.events()?, EventsEnd::Closed) {
                            return Ok(());
                        }
                    } else {
                        let start = self.offset();
                        let value = match self.scan(|c| {
                            let from = c.i;
                            c.skip_value()?;
                            serde_json::from_slice::<serde_json::Value>(&c.s[from..c.i]).map_err(
                                |e| ScanError::syntax(from, format!("top-level `{key}`: {e}")),
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

    /// The `traceEvents` array, after its `[`.
    fn events(&mut self) -> Result<EventsEnd, LoadError> {
        let mut ev = Event::default();
        loop {
            let b = match self.peek()? {
                Step::Got(b) => b,
                Step::Eof => {
                    self.truncated("the `traceEvents` array (between events)");
                    return Ok(EventsEnd::Cut);
                }
            };
            match b {
                b']' => {
                    self.pos += 1;
                    return Ok(EventsEnd::Closed);
                }
                // Trailing commas are tolerated, as Perfetto does.
                b',' => self.pos += 1,
                b'{' => {
                    let at = self.offset();
                    if at >= self.stop_at {
                        while self.stops.get(self.next_stop).is_some_and(|s| s.0 < at) {
                            self.next_stop += 1;
                        }
                        if let Some(&(s, part)) = self.stops.get(self.next_stop) {
                            if s == at {
                                self.stopped = Some(part);
                                return Ok(EventsEnd::Stopped);
                            }
                        }
                        self.set_stop();
                    }
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
                                    return Ok(EventsEnd::Cut);
                                }
                            }
                            Err(ScanError::Syntax(e)) => {
                                let json::SyntaxError { at: rel, what } = *e;
                                return Err(LoadError::BadEvent {
                                    path: self.path.clone(),
                                    index: self.index,
                                    offset: self.offset() + rel as u64,
                                    what: format!("is not valid: {what}"),
                                });
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

    /// A trace whose strings and args hold what looks like event boundaries.
    fn tricky_trace(events: usize) -> String {
        let mut s = String::from(
            "{\"metadata\":{\"producer\":\"dflash\",\"list\":[{\"a\":1},{\"b\":2}]},\n\"traceEvents\":[\n",
        );
        let names = [
            "plain",
            "brace },{ inside",
            "spaced }, { too",
            "line },\\n{ escaped",
            "quote \\\"},{\\\" here",
            "ProfilerStep#1",
        ];
        s.push_str("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":7,\"args\":{\"name\":\"proc },{\"}},\n");
        s.push_str("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":7,\"tid\":\"worker },{ a\",\"args\":{\"name\":\"thr\"}},\n");
        for i in 0..events {
            let name = names[i % names.len()];
            let ts = i as f64 * 1.5;
            let sep = match i % 4 {
                0 => ",\n",
                1 => ",",
                2 => ", ",
                _ => " ,\n  ",
            };
            match i % 7 {
                0 => write!(
                    s,
                    "{{\"ph\":\"C\",\"name\":\"mem }},{{\",\"pid\":7,\"ts\":{ts},\"args\":{{\"bytes\":{i},\"k }},{{\":2}}}}"
                ),
                1 => write!(
                    s,
                    "{{\"ph\":\"s\",\"id\":\"flow-{i}\",\"pid\":7,\"tid\":\"worker }},{{ a\",\"ts\":{ts}}}"
                ),
                2 => write!(
                    s,
                    "{{\"ph\":\"X\",\"name\":\"{name}\",\"cat\":\"gpu\",\"pid\":0,\"tid\":1,\"ts\":{ts},\"dur\":1.0,\"args\":{{\"step\":{},\"shapes\":[{{\"x\":[1]}},{{\"y\":\"}},{{\"}}]}}}}",
                    i / 10
                ),
                3 => write!(s, "{{\"ph\":\"i\",\"name\":\"{name}\",\"pid\":7,\"ts\":{ts}}}"),
                _ => write!(
                    s,
                    "{{\"ph\":\"X\",\"name\":\"{name}\",\"cat\":\"cpu\",\"pid\":7,\"tid\":\"worker }},{{ a\",\"ts\":{ts},\"dur\":{},\"bind_id\":{i},\"flow_out\":true,\"args\":{{\"wait_us\":{i}}}}}",
                    if i % 3 == 0 { 20.0 } else { 0.5 }
                ),
            }
            .unwrap();
            if i + 1 < events {
                s.push_str(sep);
            }
        }
        s.push_str("\n],\n\"tail\":{\"x\":[{\"a\":1},{\"b\":2}]}}\n");
        s
    }

    fn load_with(path: &Path, threads: usize) -> Result<Trace, LoadError> {
        load(
            path,
            &LoadOptions {
                progress: false,
                threads,
                min_part_bytes: 1,
            },
        )
    }

    fn same(a: &Trace, b: &Trace) {
        assert!(a.spans.equals_missing(&b.spans), "{}\n{}", a.spans, b.spans);
        assert!(a.counters.equals_missing(&b.counters));
        assert!(a.flows.equals_missing(&b.flows), "{}\n{}", a.flows, b.flows);
        assert!(a.threads.equals_missing(&b.threads));
        assert_eq!(a.top, b.top);
        assert_eq!(a.stats.events, b.stats.events);
        assert_eq!(a.stats.json_bytes, b.stats.json_bytes);
        let w = |t: &Trace| t.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(w(a), w(b));
    }

    #[test]
    fn parts_load_like_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, tricky_trace(400)).unwrap();
        let one = load_with(&path, 1).unwrap();
        assert!(one.spans.height() > 100);
        for threads in 2..=13 {
            let many = load_with(&path, threads).unwrap();
            same(&one, &many);
        }
    }

    /// Spans of a random tree per track: (tid, ts, dur, name). Durations are distinct and
    /// children sit strictly inside their parent, so nesting is unambiguous.
    fn random_tree(seed: u64) -> Vec<(u32, f64, f64, String)> {
        let mut x = seed;
        let mut rand = move |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        let mut spans = Vec::new();
        fn fill(
            spans: &mut Vec<(u32, f64, f64, String)>,
            rand: &mut dyn FnMut(u64) -> u64,
            tid: u32,
            from: f64,
            to: f64,
            level: u32,
        ) {
            let mut t = from + 1.0 + rand(5) as f64;
            while level < 4 && t + 12.0 < to - 1.0 {
                let len = (6 + rand(40)) as f64 + 0.001 * rand(997) as f64;
                let end = (t + len).min(to - 1.0);
                spans.push((tid, t, end - t, format!("s{level}.{}", rand(3))));
                fill(spans, rand, tid, t, end, level + 1);
                t = end + 1.0 + rand(4) as f64;
            }
        }
        for tid in 1..=2 {
            for step in 0..6u32 {
                let from = step as f64 * 400.0;
                spans.push((tid, from, 390.0, format!("ProfilerStep#{step}")));
                fill(&mut spans, &mut rand, tid, from, from + 390.0, 0);
            }
        }
        spans
    }

    #[test]
    fn nesting_does_not_depend_on_file_order() {
        let spans = random_tree(7);
        assert!(spans.len() > 100);
        // Independently: the parent is the innermost span of the track that contains it.
        let contains = |o: &(u32, f64, f64, String), s: &(u32, f64, f64, String)| {
            o.0 == s.0 && o.1 <= s.1 && s.1 + s.2 <= o.1 + o.2 && o.2 > s.2
        };
        // (tid, ts, depth, parent's ts, step) per span.
        type Row = (u32, String, u32, Option<String>, Option<i64>);
        let mut want: Vec<Row> = spans
            .iter()
            .map(|s| {
                let outer: Vec<_> = spans.iter().filter(|o| contains(o, s)).collect();
                let parent = outer.iter().min_by(|a, b| a.2.total_cmp(&b.2));
                let step = outer
                    .iter()
                    .chain(std::iter::once(&s))
                    .find_map(|o| o.3.strip_prefix("ProfilerStep#"))
                    .map(|n| n.parse().unwrap());
                (
                    s.0,
                    format!("{:.3}", s.1),
                    outer.len() as u32,
                    parent.map(|p| format!("{:.3}", p.1)),
                    step,
                )
            })
            .collect();
        want.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));

        let by_start = {
            let mut v = spans.clone();
            v.sort_by(|a, b| a.1.total_cmp(&b.1).then(b.2.total_cmp(&a.2)));
            v
        };
        let by_end = {
            let mut v = spans.clone();
            v.sort_by(|a, b| {
                (a.1 + a.2)
                    .total_cmp(&(b.1 + b.2))
                    .then(a.2.total_cmp(&b.2))
            });
            v
        };
        let shuffled = {
            let mut v = spans.clone();
            v.reverse();
            v.swap(3, 40);
            v
        };
        let dir = tempfile::tempdir().unwrap();
        for (label, order) in [("start", by_start), ("end", by_end), ("shuffled", shuffled)] {
            let mut text = String::from("[");
            for (k, (tid, ts, dur, name)) in order.iter().enumerate() {
                if k > 0 {
                    text.push(',');
                }
                write!(
                    text,
                    "{{\"ph\":\"X\",\"cat\":\"cpu\",\"name\":\"{name}\",\"pid\":1,\"tid\":{tid},\"ts\":{ts:.3},\"dur\":{dur:.3}}}"
                )
                .unwrap();
            }
            text.push(']');
            let path = dir.path().join(format!("{label}.json"));
            std::fs::write(&path, text).unwrap();
            let t = load_with(&path, 1).unwrap();
            assert!(t.warnings.is_empty(), "{label}: {:?}", t.warnings);
            let df = &t.spans;
            let tid = df.column("tid").unwrap().i64().unwrap();
            let ts = df.column("ts").unwrap().f64().unwrap();
            let depth = df.column("depth").unwrap().u32().unwrap();
            let parent = df.column("parent").unwrap().u32().unwrap();
            let step = df.column("step").unwrap().i64().unwrap();
            let mut got: Vec<_> = (0..df.height())
                .map(|i| {
                    (
                        tid.get(i).unwrap() as u32,
                        format!("{:.3}", ts.get(i).unwrap()),
                        depth.get(i).unwrap(),
                        parent
                            .get(i)
                            .map(|p| format!("{:.3}", ts.get(p as usize).unwrap())),
                        step.get(i),
                    )
                })
                .collect();
            got.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
            assert_eq!(got, want, "file in {label} order");
        }
    }

    #[test]
    fn span_columns_are_as_documented() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        std::fs::write(&path, tricky_trace(60)).unwrap();
        let t = load_with(&path, 1).unwrap();
        let got: Vec<(String, String)> = t
            .spans
            .columns()
            .iter()
            .map(|c| {
                let dtype = match c.dtype() {
                    DataType::Enum(..) => "Enum".to_string(),
                    other => format!("{other:?}"),
                };
                (c.name().to_string(), dtype)
            })
            .collect();
        let want: Vec<(String, String)> = SPAN_COLUMNS
            .iter()
            .map(|(name, what)| {
                let dtype = what.rsplit("; ").next().unwrap();
                (name.to_string(), dtype.to_string())
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn parts_of_a_bare_array() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let t = tricky_trace(200);
        let from = t.find("\"traceEvents\":").unwrap() + "\"traceEvents\":".len();
        let to = t.rfind(']').unwrap() + 1;
        std::fs::write(&path, &t[from..to]).unwrap();
        let one = load_with(&path, 1).unwrap();
        for threads in 2..=9 {
            same(&one, &load_with(&path, threads).unwrap());
        }
    }

    #[test]
    fn parts_of_a_truncated_trace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let t = tricky_trace(300);
        for cut in [t.len() / 2, t.len() * 3 / 4 + 7, t.len() - 40] {
            std::fs::write(&path, &t[..cut]).unwrap();
            let one = load_with(&path, 1).unwrap();
            assert!(one
                .warnings
                .iter()
                .any(|w| matches!(w, Warning::Truncated { .. })));
            for threads in 2..=7 {
                same(&one, &load_with(&path, threads).unwrap());
            }
        }
    }

    #[test]
    fn parts_report_the_first_error_with_its_global_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let t = tricky_trace(300);
        // Two bad events late in the file: the first one is reported.
        let mut bad = t.clone();
        let at = bad.rfind("\"dur\":1.0").unwrap();
        bad.replace_range(at..at + 9, "\"dur\":-1.0");
        let at = bad[..at].rfind("\"dur\":1.0").unwrap();
        bad.replace_range(at..at + 9, "\"dur\":\"x\"");
        std::fs::write(&path, &bad).unwrap();
        let one = load_with(&path, 1).err().unwrap().to_string();
        assert!(one.contains("event "), "{one}");
        for threads in 2..=9 {
            assert_eq!(load_with(&path, threads).err().unwrap().to_string(), one);
        }
    }

    #[test]
    fn boundaries_need_a_closing_brace_and_a_comma() {
        assert_eq!(event_boundary(b"1},{\"a\""), Some(3));
        assert_eq!(event_boundary(b" } ,\n {"), Some(6));
        assert_eq!(event_boundary(b"1,{},2"), None);
        assert_eq!(event_boundary(b"},"), None);
    }
}
