//! The streaming writer: events become JSON text in one reused buffer, a handful of
//! `push_str`s each, one event per line, every line after the first starting with `,`.
//! The caller moves the text to its file when it likes ([`EventWriter::drain_into`], or
//! [`EventWriter::as_str`] and [`EventWriter::clear`]), writes the [`Header`] before the
//! first event and [`FOOTER`] after the last.
//!
//! [`Header`]: crate::header::Header
//! [`FOOTER`]: crate::header::FOOTER
use std::fmt::Write as _;
use std::io;

use crate::event::{Arg, ArgValue, Counter, Flow, Meta, Span, Text};
use crate::header::FOOTER;
use crate::json::{escape_into, push_us};
use crate::names::STEP_PREFIX;
use crate::phase::{FlowDir, MetaName};

/// Formats events into a buffer. Knows how many it has written (the separator depends
/// on it), not where the text goes.
#[derive(Debug, Default)]
pub struct EventWriter {
    buf: String,
    events: u64,
}

impl EventWriter {
    pub fn new() -> EventWriter {
        EventWriter::default()
    }

    /// A writer whose buffer holds `bytes` before it grows.
    pub fn with_capacity(bytes: usize) -> EventWriter {
        EventWriter {
            buf: String::with_capacity(bytes),
            events: 0,
        }
    }

    /// Events written so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// The text not yet taken.
    pub fn as_str(&self) -> &str {
        &self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Forgets the text (once it is in the file).
    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Writes the text to `w` and clears it.
    pub fn drain_into(&mut self, w: &mut impl io::Write) -> io::Result<()> {
        w.write_all(self.buf.as_bytes())?;
        self.buf.clear();
        Ok(())
    }

    /// Closes `traceEvents` and the file's object.
    pub fn finish(&mut self) {
        self.buf.push_str(FOOTER);
    }

    #[inline]
    fn begin(&mut self) -> &mut String {
        if self.events > 0 {
            self.buf.push_str(",\n");
        }
        self.events += 1;
        &mut self.buf
    }

    pub fn span(&mut self, s: &Span<'_>) {
        let b = self.begin();
        b.push_str("{\"ph\":\"X\",\"cat\":\"");
        b.push_str(s.cat.as_str());
        b.push_str("\",\"name\":");
        push_text(b, s.name);
        let _ = write!(b, ",\"pid\":{},\"tid\":{},\"ts\":", s.pid, s.tid);
        push_us(b, s.ts_ns);
        b.push_str(",\"dur\":");
        push_us(b, s.dur_ns);
        if let Some(f) = s.bind.filter(|f| f.flow_out || f.flow_in) {
            let _ = write!(b, ",\"bind_id\":{}", f.id);
            if f.flow_out {
                b.push_str(",\"flow_out\":true");
            }
            if f.flow_in {
                b.push_str(",\"flow_in\":true");
            }
        }
        push_args(b, s.args);
        b.push('}');
    }

    pub fn counter(&mut self, c: &Counter<'_>) {
        let b = self.begin();
        b.push_str("{\"ph\":\"C\",\"cat\":");
        push_text(b, c.cat);
        b.push_str(",\"name\":");
        push_text(b, c.name);
        let _ = write!(b, ",\"pid\":{},\"ts\":", c.pid);
        push_us(b, c.ts_ns);
        push_args(b, c.args);
        b.push('}');
    }

    pub fn meta(&mut self, m: &Meta<'_>) {
        let (what, pid, tid) = match *m {
            Meta::ProcessName { pid, .. } => (MetaName::ProcessName, pid, 0),
            Meta::ProcessSortIndex { pid, .. } => (MetaName::ProcessSortIndex, pid, 0),
            Meta::ThreadName { pid, tid, .. } => (MetaName::ThreadName, pid, tid),
            Meta::ThreadSortIndex { pid, tid, .. } => (MetaName::ThreadSortIndex, pid, tid),
        };
        let b = self.begin();
        let _ = write!(
            b,
            "{{\"ph\":\"M\",\"name\":\"{}\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"{}\":",
            what.as_str(),
            what.arg()
        );
        match *m {
            Meta::ProcessName { name, .. } | Meta::ThreadName { name, .. } => escape_into(b, name),
            Meta::ProcessSortIndex { index, .. } | Meta::ThreadSortIndex { index, .. } => {
                let _ = write!(b, "{index}");
            }
        }
        b.push_str("}}");
    }

    pub fn flow(&mut self, f: &Flow<'_>) {
        let b = self.begin();
        let ph = match f.dir {
            FlowDir::Out => 's',
            FlowDir::In => 'f',
        };
        let _ = write!(
            b,
            "{{\"ph\":\"{ph}\",\"id\":{},\"pid\":{},\"tid\":{},\"ts\":",
            f.id, f.pid, f.tid
        );
        push_us(b, f.ts_ns);
        b.push_str(",\"cat\":\"");
        b.push_str(f.cat.as_str());
        b.push_str("\",\"name\":");
        escape_into(b, f.name);
        if f.dir == FlowDir::In {
            // Binds to the slice that encloses it (Kineto's kernels).
            b.push_str(",\"bp\":\"e\"");
        }
        b.push('}');
    }
}

fn push_text(b: &mut String, t: Text<'_>) {
    match t {
        Text::Plain(s) => escape_into(b, s),
        Text::Quoted(q) => b.push_str(q.as_json()),
        Text::Step(n) => {
            let _ = write!(b, "\"{STEP_PREFIX}{n}\"");
        }
    }
}

/// Appends an argument value. Non-finite floats have no JSON form and become `null`.
pub fn push_value(out: &mut String, v: ArgValue) {
    let _ = match v {
        ArgValue::I64(x) => write!(out, "{x}"),
        ArgValue::U64(x) => write!(out, "{x}"),
        ArgValue::F64(x) if x.is_finite() => {
            // Display of f64 never uses an exponent and always round-trips; whole numbers
            // print without a dot, which JSON reads as the same number.
            write!(out, "{x}")
        }
        ArgValue::F64(_) => {
            out.push_str("null");
            Ok(())
        }
        ArgValue::Micros(ns) => {
            push_us(out, ns);
            Ok(())
        }
        ArgValue::Triple([x, y, z]) => write!(out, "[{x},{y},{z}]"),
    };
}

/// Appends `,"args":{...}`, unless there are none.
fn push_args(b: &mut String, args: &[Arg<'_>]) {
    let Some((first, rest)) = args.split_first() else {
        return;
    };
    b.push_str(",\"args\":{");
    push_arg(b, first);
    for a in rest {
        b.push(',');
        push_arg(b, a);
    }
    b.push('}');
}

fn push_arg(b: &mut String, a: &Arg<'_>) {
    escape_into(b, a.key);
    b.push(':');
    push_value(b, a.value);
}

#[cfg(test)]
mod tests;
