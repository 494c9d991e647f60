//! Scans one trace event (`{"ph":..., ...}`) into an [`Event`] of byte ranges and numbers.
//!
//! Only the keys the analyzer uses are decoded; the rest (Kineto's long `args` of input
//! shapes, for instance) are skipped. Type checks happen here so a message can name the
//! field; range checks (negative durations, huge values) happen in the loader, which knows
//! the event index.

use super::json::{Cursor, JsonType, Scan, Str};

/// A pid, tid or flow id: a number or a string.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) enum IdVal {
    #[default]
    Missing,
    Num(f64),
    Str(Str),
}

/// An argument value the analyzer may use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ArgVal {
    Num(f64),
    Str(Str),
}

/// One event, as ranges of the scanned slice. Reused between events to avoid allocation.
#[derive(Debug, Default)]
pub(crate) struct Event {
    pub ph: Option<Str>,
    pub name: Option<Str>,
    pub cat: Option<Str>,
    pub pid: IdVal,
    pub tid: IdVal,
    pub ts: Option<f64>,
    pub dur: Option<f64>,
    pub id: IdVal,
    pub bind_id: Option<f64>,
    pub flow_in: bool,
    pub flow_out: bool,
    /// `args` members that are numbers or strings, in file order.
    pub args: Vec<(Str, ArgVal)>,
}

impl Event {
    fn clear(&mut self) {
        self.ph = None;
        self.name = None;
        self.cat = None;
        self.pid = IdVal::Missing;
        self.tid = IdVal::Missing;
        self.ts = None;
        self.dur = None;
        self.id = IdVal::Missing;
        self.bind_id = None;
        self.flow_in = false;
        self.flow_out = false;
        self.args.clear();
    }
}

fn type_error<T>(c: &Cursor<'_>, field: &str, want: &str, found: Option<JsonType>) -> Scan<T> {
    c.syntax(format!(
        "field `{field}` must be {want}, found {}",
        found.map_or("something that is not JSON", JsonType::name)
    ))
}

#[inline(always)]
fn want_string(c: &mut Cursor<'_>, field: &str) -> Scan<Str> {
    match c.next_type()? {
        Some(JsonType::String) => c.string(),
        other => type_error(c, field, "a string", other),
    }
}

#[inline(always)]
fn want_number(c: &mut Cursor<'_>, field: &str) -> Scan<f64> {
    match c.next_type()? {
        Some(JsonType::Number) => c.number(),
        None if matches!(c.peek()?, b'N' | b'I') => c.number(),
        other => type_error(c, field, "a number", other),
    }
}

#[inline(always)]
fn want_id(c: &mut Cursor<'_>, field: &str) -> Scan<IdVal> {
    match c.next_type()? {
        Some(JsonType::Number) => Ok(IdVal::Num(c.number()?)),
        Some(JsonType::String) => Ok(IdVal::Str(c.string()?)),
        other => type_error(c, field, "a number or a string", other),
    }
}

#[inline(always)]
fn want_bool(c: &mut Cursor<'_>, field: &str) -> Scan<bool> {
    match c.next_type()? {
        Some(JsonType::Bool) => c.boolean(),
        other => type_error(c, field, "a boolean", other),
    }
}

/// Scans the event object at the cursor into `ev`.
pub(crate) fn scan_event(c: &mut Cursor<'_>, ev: &mut Event) -> Scan<()> {
    ev.clear();
    c.eat(b'{')?;
    if c.peek()? == b'}' {
        c.i += 1;
        return Ok(());
    }
    loop {
        let key = match c.next_type()? {
            Some(JsonType::String) => c.string()?,
            _ => return c.syntax("expected a quoted key in the event object"),
        };
        c.eat(b':')?;
        // Byte patterns rather than string literals: compared inline, without a call.
        match c.bytes(key) {
            [b'p', b'h'] => ev.ph = Some(want_string(c, "ph")?),
            [b'n', b'a', b'm', b'e'] => ev.name = Some(want_string(c, "name")?),
            [b'c', b'a', b't'] => ev.cat = Some(want_string(c, "cat")?),
            [b'p', b'i', b'd'] => ev.pid = want_id(c, "pid")?,
            [b't', b'i', b'd'] => ev.tid = want_id(c, "tid")?,
            [b't', b's'] => ev.ts = Some(want_number(c, "ts")?),
            [b'd', b'u', b'r'] => ev.dur = Some(want_number(c, "dur")?),
            [b'i', b'd'] => ev.id = want_id(c, "id")?,
            [b'b', b'i', b'n', b'd', b'_', b'i', b'd'] => {
                ev.bind_id = Some(want_number(c, "bind_id")?)
            }
            [b'f', b'l', b'o', b'w', b'_', b'i', b'n'] => ev.flow_in = want_bool(c, "flow_in")?,
            [b'f', b'l', b'o', b'w', b'_', b'o', b'u', b't'] => {
                ev.flow_out = want_bool(c, "flow_out")?
            }
            [b'a', b'r', b'g', b's'] => scan_args(c, ev)?,
            _ => c.skip_value()?,
        }
        if object_closed(c, "the event object")? {
            return Ok(());
        }
    }
}

/// After a member of an object: eats the `,` (false: another member follows) or the
/// closing `}` (true).
#[inline(always)]
fn object_closed(c: &mut Cursor<'_>, inside: &str) -> Scan<bool> {
    match c.peek()? {
        b',' => {
            c.i += 1;
            Ok(false)
        }
        b'}' => {
            c.i += 1;
            Ok(true)
        }
        b => c.syntax(format!(
            "expected `,` or `}}` in {inside}, found {}",
            super::json::describe_byte(b)
        )),
    }
}

fn scan_args(c: &mut Cursor<'_>, ev: &mut Event) -> Scan<()> {
    match c.next_type()? {
        Some(JsonType::Object) => {}
        Some(JsonType::Null) => return c.skip_value(),
        other => return type_error(c, "args", "an object", other),
    }
    c.eat(b'{')?;
    if c.peek()? == b'}' {
        c.i += 1;
        return Ok(());
    }
    loop {
        let key = match c.next_type()? {
            Some(JsonType::String) => c.string()?,
            _ => return c.syntax("expected a quoted key in `args`"),
        };
        c.eat(b':')?;
        match c.next_type()? {
            Some(JsonType::Number) => {
                let v = c.number()?;
                ev.args.push((key, ArgVal::Num(v)));
            }
            Some(JsonType::String) => {
                let s = c.string()?;
                ev.args.push((key, ArgVal::Str(s)));
            }
            None if matches!(c.peek()?, b'N' | b'I') => {
                c.number()?;
            }
            _ => c.skip_value()?,
        }
        if object_closed(c, "`args`")? {
            return Ok(());
        }
    }
}
