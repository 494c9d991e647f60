//! Scans one trace event (`{"ph":..., ...}`) into an [`Event`] of byte ranges and numbers.
//!
//! Only the keys the analyzer uses are decoded; the rest (Kineto's long `args` of input
//! shapes, for instance) are skipped. Type checks happen here so a message can name the
//! field: a field of the wrong type is skipped and noted on the event, which the loader
//! then skips and counts; range checks (negative durations, huge values) happen in the
//! loader, which knows the event index. Only broken JSON stops the scan.

use super::json::{Cursor, JsonType, Scan, Str};
use super::skips::SkipReason;

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
    /// The first field of a wrong type, if any: the event is skipped for it.
    pub problem: Option<(SkipReason, String)>,
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
        self.problem = None;
    }

    fn bad(&mut self, reason: SkipReason, what: String) {
        self.problem.get_or_insert((reason, what));
    }
}

/// A field's value, or what was wrong with its type (the value skipped).
type Typed<T> = Result<T, String>;

fn mismatch<T>(
    c: &mut Cursor<'_>,
    field: &str,
    want: &str,
    found: Option<JsonType>,
) -> Scan<Typed<T>> {
    let what = format!(
        "field `{field}` must be {want}, found {}",
        found.map_or("something that is not JSON", JsonType::name)
    );
    c.skip_value()?;
    Ok(Err(what))
}

#[inline(always)]
fn want_string(c: &mut Cursor<'_>, field: &str) -> Scan<Typed<Str>> {
    match c.next_type()? {
        Some(JsonType::String) => Ok(Ok(c.string()?)),
        other => mismatch(c, field, "a string", other),
    }
}

/// A number; `NaN` and `Infinity` are read as such (the loader rejects them as values).
#[inline(always)]
fn want_number(c: &mut Cursor<'_>, field: &str) -> Scan<Typed<f64>> {
    match c.next_type()? {
        Some(JsonType::Number) => {
            if let Some(v) = c.non_finite()? {
                return Ok(Ok(v));
            }
            Ok(Ok(c.number()?))
        }
        None if matches!(c.peek()?, b'N' | b'I') => match c.non_finite()? {
            Some(v) => Ok(Ok(v)),
            None => mismatch(c, field, "a number", None),
        },
        other => mismatch(c, field, "a number", other),
    }
}

#[inline(always)]
fn want_id(c: &mut Cursor<'_>, field: &str) -> Scan<Typed<IdVal>> {
    match c.next_type()? {
        Some(JsonType::Number) => Ok(Ok(IdVal::Num(c.number()?))),
        Some(JsonType::String) => Ok(Ok(IdVal::Str(c.string()?))),
        other => mismatch(c, field, "a number or a string", other),
    }
}

#[inline(always)]
fn want_bool(c: &mut Cursor<'_>, field: &str) -> Scan<Typed<bool>> {
    match c.next_type()? {
        Some(JsonType::Bool) => Ok(Ok(c.boolean()?)),
        other => mismatch(c, field, "a boolean", other),
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
        // A field of the wrong type makes the event one to skip (for the fields a span
        // cannot do without) or is ignored (`cat`, flow flags).
        macro_rules! field {
            ($slot:expr, $want:expr, $reason:expr) => {
                match $want {
                    Ok(v) => $slot = v,
                    Err(what) => ev.bad($reason, what),
                }
            };
        }
        // Byte patterns rather than string literals: compared inline, without a call.
        match c.bytes(key) {
            [b'p', b'h'] => field!(ev.ph, want_string(c, "ph")?.map(Some), SkipReason::NoPhase),
            [b'n', b'a', b'm', b'e'] => {
                field!(
                    ev.name,
                    want_string(c, "name")?.map(Some),
                    SkipReason::NoName
                )
            }
            [b'c', b'a', b't'] => ev.cat = want_string(c, "cat")?.ok(),
            [b'p', b'i', b'd'] => field!(ev.pid, want_id(c, "pid")?, SkipReason::BadId),
            [b't', b'i', b'd'] => field!(ev.tid, want_id(c, "tid")?, SkipReason::BadId),
            [b't', b's'] => field!(
                ev.ts,
                want_number(c, "ts")?.map(Some),
                SkipReason::BadTimestamp
            ),
            [b'd', b'u', b'r'] => field!(
                ev.dur,
                want_number(c, "dur")?.map(Some),
                SkipReason::BadDuration
            ),
            [b'i', b'd'] => field!(ev.id, want_id(c, "id")?, SkipReason::BadFlowId),
            [b'b', b'i', b'n', b'd', b'_', b'i', b'd'] => field!(
                ev.bind_id,
                want_number(c, "bind_id")?.map(Some),
                SkipReason::BadFlowId
            ),
            [b'f', b'l', b'o', b'w', b'_', b'i', b'n'] => {
                ev.flow_in = want_bool(c, "flow_in")?.unwrap_or(false)
            }
            [b'f', b'l', b'o', b'w', b'_', b'o', b'u', b't'] => {
                ev.flow_out = want_bool(c, "flow_out")?.unwrap_or(false)
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
        // `args` that is not an object holds nothing the analyzer reads.
        _ => return c.skip_value(),
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
                if c.non_finite()?.is_none() {
                    let v = c.number()?;
                    ev.args.push((key, ArgVal::Num(v)));
                }
            }
            Some(JsonType::String) => {
                let s = c.string()?;
                ev.args.push((key, ArgVal::Str(s)));
            }
            _ => c.skip_value()?,
        }
        if object_closed(c, "`args`")? {
            return Ok(());
        }
    }
}
