//! Walks one part of a trace's JSON: the top-level object (keys other than
//! `traceEvents` kept as JSON values) or a bare array, and the `traceEvents` array, one
//! event at a time through the scanner, refilling the read buffer whenever an event is
//! cut by its end. Knows where later parts start, and stops at the first of them it
//! meets.

use std::io::{self, Read};
use std::path::PathBuf;

use chrome_trace_format::header::top::TRACE_EVENTS;

use super::event::{scan_event, Event};
use super::input::LoadError;
use super::json::{self, Cursor, ScanError};
use super::raw::Raw;
use super::skips::{SkipReason, Skips};
use crate::warning::Warning;

/// What one part of the file scanned to.
pub(super) struct Part {
    pub raw: Raw,
    /// Events scanned.
    pub index: u64,
    pub top: serde_json::Map<String, serde_json::Value>,
    pub warnings: Vec<Warning>,
    pub skips: Skips,
    /// Offset in the JSON just past what was read.
    pub json_bytes: u64,
    /// The part whose first event this one stopped at; `None` at the end of the input.
    pub stopped: Option<usize>,
}

pub(super) struct Parser {
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
    skips: Skips,
    /// Offsets where later parts start, with their numbers, ascending: an event that
    /// starts at one ends this part.
    pub stops: Vec<(u64, usize)>,
    /// The first entry of `stops` not yet passed, and its offset (`u64::MAX`: none).
    next_stop: usize,
    stop_at: u64,
    /// The part this one stopped at.
    stopped: Option<usize>,
}

/// How the `traceEvents` array ended.
pub(super) enum EventsEnd {
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
    pub(super) fn new(path: PathBuf, gz: bool, src: Box<dyn Read + Send>, base: u64) -> Parser {
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
            skips: Skips::default(),
            stops: Vec::new(),
            next_stop: 0,
            stop_at: u64::MAX,
            stopped: None,
        }
    }

    pub(super) fn set_stop(&mut self) {
        self.stop_at = self.stops.get(self.next_stop).map_or(u64::MAX, |s| s.0);
    }

    pub(super) fn into_part(self) -> Part {
        Part {
            json_bytes: self.base + self.end as u64,
            raw: self.raw,
            index: self.index,
            top: self.top,
            warnings: self.warnings,
            skips: self.skips,
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

    pub(super) fn parse_document(&mut self) -> Result<(), LoadError> {
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
    pub(super) fn object(&mut self, mut seen_events: bool) -> Result<(), LoadError> {
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
                    if key == TRACE_EVENTS {
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
    pub(super) fn events(&mut self) -> Result<EventsEnd, LoadError> {
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
                                    self.skips.add(p.reason, self.index, at, || p.what);
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
                    let at = self.offset();
                    loop {
                        let mut c = Cursor::new(&self.buf[self.pos..self.end]);
                        match c.skip_value() {
                            Ok(()) => {
                                self.pos += c.i;
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
                                    offset: at + rel as u64,
                                    what: format!("is not valid: {what}"),
                                });
                            }
                        }
                    }
                    self.skips.add(SkipReason::NotAnObject, self.index, at, || {
                        format!("is not an object: found {}", json::describe_byte(other))
                    });
                    self.index += 1;
                }
            }
        }
    }
}
