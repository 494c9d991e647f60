//! Accumulates validated events as plain columns while the file streams past.
//!
//! Strings are interned to `u32` ids (names repeat millions of times in a trace), args are
//! kept sparse (most spans carry none), and every check that needs the event's index or
//! offset for its message happens here.

use chrome_trace_format::limits;
use chrome_trace_format::names::{
    CORRELATION_ARG, KINETO_MEMORY, MEMORY_ALLOCATED, MEMORY_RESERVED,
};
use chrome_trace_format::phase::KNOWN_PHASES;
use chrome_trace_format::{dflash, FlowDir, MetaName, Phase};
use rustc_hash::FxHashMap;

use super::event::{ArgVal, Event, IdVal};
use super::intern::Interner;
use super::json::{unescape, Str};
use super::skips::SkipReason;

/// The args the analyzer keeps as span columns, by their key in the trace. `args.step`
/// is read too, into the step column (see [`Raw::span_step`]); other args are skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ArgKey {
    WaitUs,
    Depth,
    Tokens,
    Loss,
    Batch,
    /// Kineto's launch-to-kernel link.
    Correlation,
}

/// What an `args` key is to the loader.
enum ArgUse {
    Column(ArgKey),
    Step,
}

impl ArgKey {
    /// In declaration order (so `ALL[k].index() == k`), which is also the order of the
    /// arg columns in the span table.
    pub const ALL: [ArgKey; 6] = [
        ArgKey::WaitUs,
        ArgKey::Depth,
        ArgKey::Tokens,
        ArgKey::Loss,
        ArgKey::Batch,
        ArgKey::Correlation,
    ];

    /// The key in `args`.
    pub fn key(self) -> &'static str {
        match self {
            ArgKey::WaitUs => dflash::args::WAIT_US,
            ArgKey::Depth => dflash::args::DEPTH,
            ArgKey::Tokens => dflash::args::TOKENS,
            ArgKey::Loss => dflash::args::LOSS,
            ArgKey::Batch => dflash::args::BATCH,
            ArgKey::Correlation => CORRELATION_ARG,
        }
    }

    /// The column it becomes in the spans frame.
    pub fn column(self) -> &'static str {
        match self {
            ArgKey::Depth => "queue_depth",
            other => other.key(),
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// A count (queue depth, batch, tokens): its column is `Float32`, exact below 2^24.
    pub fn is_count(self) -> bool {
        matches!(self, ArgKey::Depth | ArgKey::Batch | ArgKey::Tokens)
    }
}

impl ArgUse {
    /// The use of an `args` key. Byte patterns rather than the format crate's constants:
    /// compared inline, without a call (a test checks they spell the same keys).
    fn of_key(k: &[u8]) -> Option<ArgUse> {
        Some(match k {
            [b's', b't', b'e', b'p'] => ArgUse::Step,
            [b'w', b'a', b'i', b't', b'_', b'u', b's'] => ArgUse::Column(ArgKey::WaitUs),
            [b'd', b'e', b'p', b't', b'h'] => ArgUse::Column(ArgKey::Depth),
            [b't', b'o', b'k', b'e', b'n', b's'] => ArgUse::Column(ArgKey::Tokens),
            [b'l', b'o', b's', b's'] => ArgUse::Column(ArgKey::Loss),
            [b'b', b'a', b't', b'c', b'h'] => ArgUse::Column(ArgKey::Batch),
            [b'c', b'o', b'r', b'r', b'e', b'l', b'a', b't', b'i', b'o', b'n'] => {
                ArgUse::Column(ArgKey::Correlation)
            }
            _ => return None,
        })
    }
}

/// Limits past which a value is taken as corrupt rather than as data.
pub(crate) const MAX_ABS_TS_US: f64 = 9_007_199_254_740_992.0; // 2^53 us: beyond f64's integer range
pub(crate) const MAX_DUR_US: f64 = 1e12; // about 11.6 days
const MAX_ID: f64 = limits::MAX_ID as f64; // |pid|, |tid| below 2^32
const MAX_FLOW_ID: f64 = limits::MAX_FLOW_ID as f64; // flow ids below 2^53

/// A message about one event, before the loader adds path, index and offset.
pub(crate) struct EventProblem {
    pub reason: SkipReason,
    pub what: String,
}

fn problem(reason: SkipReason, what: impl Into<String>) -> EventProblem {
    EventProblem {
        reason,
        what: what.into(),
    }
}

/// `flow_span` of a flow end that belongs to no span.
pub(crate) const NO_SPAN: u32 = u32::MAX;

/// `span_step` of a span without a step (yet).
pub(crate) const NO_STEP: i64 = i64::MIN;

/// One arg of the spans, sparse: the rows that carry it, ascending, and their values.
/// Most spans carry none of the args, so the frame's dense column is built at the end.
#[derive(Default)]
pub(crate) struct ArgColumn {
    pub rows: Vec<u32>,
    pub values: Vec<f64>,
}

impl ArgColumn {
    #[inline]
    fn set(&mut self, row: u32, v: f64) {
        if self.rows.last() == Some(&row) {
            // The key twice in one event: the last one wins.
            if let Some(last) = self.values.last_mut() {
                *last = v;
            }
            return;
        }
        self.rows.push(row);
        self.values.push(v);
    }
}

#[derive(Default)]
pub(crate) struct Raw {
    pub strings: Interner,
    /// (pid, tid) of each track; a span stores its track id.
    pub tracks: Vec<(i64, i64)>,
    track_ids: FxHashMap<(i64, i64), u32>,
    /// The track of the previous span: consecutive spans often share one.
    last_track: Option<((i64, i64), u32)>,
    /// String pids/tids get ids from 2^32 up, so they never meet numeric ones.
    pub(super) string_ids: Interner,

    pub span_track: Vec<u32>,
    pub span_name: Vec<u32>,
    pub span_cat: Vec<u32>,
    pub span_ts: Vec<f64>,
    pub span_dur: Vec<f64>,
    /// `args.step` as written, [`NO_STEP`] without one; the frame's step column is built
    /// in place from it.
    pub span_step: Vec<i64>,
    /// By [`ArgKey`] index.
    pub span_args: [ArgColumn; ArgKey::ALL.len()],

    pub ctr_pid: Vec<i64>,
    pub ctr_name: Vec<u32>,
    pub ctr_key: Vec<u32>,
    pub ctr_ts: Vec<f64>,
    pub ctr_value: Vec<f64>,

    pub flow_id: Vec<u64>,
    /// 0 = out (source), 1 = in (destination).
    pub flow_dir: Vec<u8>,
    pub flow_pid: Vec<i64>,
    pub flow_tid: Vec<i64>,
    pub flow_ts: Vec<f64>,
    /// The span row, or [`NO_SPAN`].
    pub flow_span: Vec<u32>,

    pub process_names: FxHashMap<i64, String>,
    pub thread_names: FxHashMap<(i64, i64), String>,
}

/// A number as a message shows it: huge ones in exponent form.
fn shown(v: f64) -> String {
    if v.abs() >= 1e15 {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

fn num_id(v: f64, field: &str) -> Result<i64, EventProblem> {
    // Negative ids are real: Kineto writes CUPTI's overhead records with `pid` -1.
    if v.fract() != 0.0 || !(-MAX_ID..MAX_ID).contains(&v) {
        return Err(problem(
            SkipReason::BadId,
            format!("`{field}` {} is not an integer in -2^32..2^32", shown(v)),
        ));
    }
    Ok(v as i64)
}

impl Raw {
    fn id(&mut self, s: &[u8], v: IdVal, field: &str) -> Result<i64, EventProblem> {
        match v {
            IdVal::Missing => Ok(0),
            IdVal::Num(n) => num_id(n, field),
            IdVal::Str(st) => {
                let raw = &s[st.range()];
                // Numbers written as strings ("tid": "12") are common in hand-made traces.
                if let Some(n) = std::str::from_utf8(raw)
                    .ok()
                    .and_then(|t| t.parse::<u32>().ok())
                {
                    return Ok(n as i64);
                }
                Ok(MAX_ID as i64 + self.string_ids.intern(raw, st.escaped()) as i64)
            }
        }
    }

    /// The label of a string pid/tid, for names.
    pub fn string_id_label(&self, id: i64) -> Option<&str> {
        let k = id.checked_sub(MAX_ID as i64)?;
        self.string_ids.strings.get(k as usize).map(String::as_str)
    }

    pub(super) fn track(&mut self, pid: i64, tid: i64) -> u32 {
        let next = self.tracks.len() as u32;
        let id = *self.track_ids.entry((pid, tid)).or_insert(next);
        if id == next {
            self.tracks.push((pid, tid));
        }
        id
    }

    fn text(&mut self, s: &[u8], st: Str) -> u32 {
        self.strings.intern(&s[st.range()], st.escaped())
    }

    /// Validates `ev` (ranges into `s`) and appends it to the columns.
    pub fn push(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        if let Some((reason, what)) = &ev.problem {
            return Err(problem(*reason, format!("is not usable: {what}")));
        }
        let Some(ph) = ev.ph else {
            return Err(problem(SkipReason::NoPhase, "has no `ph` (phase)"));
        };
        let ph_raw = &s[ph.range()];
        let phase = match ph_raw {
            [p] => Phase::from_byte(*p),
            _ => None,
        };
        let phase = match phase {
            Some(p) => p,
            None => {
                return Err(problem(
                    SkipReason::UnknownPhase,
                    format!(
                        "has an unknown phase `{}`; the Chrome trace format knows {}",
                        String::from_utf8_lossy(ph_raw),
                        String::from_utf8_lossy(KNOWN_PHASES)
                    ),
                ))
            }
        };
        match phase {
            Phase::Complete => self.push_span(s, ev),
            Phase::Counter => self.push_counter(s, ev),
            Phase::Metadata => self.push_meta(s, ev),
            Phase::FlowStart | Phase::FlowStep | Phase::FlowEnd => {
                self.push_flow_event(s, ev, phase)
            }
            Phase::Other(b'i')
                if ev
                    .name
                    .is_some_and(|n| &s[n.range()] == KINETO_MEMORY.as_bytes()) =>
            {
                self.push_memory(s, ev)
            }
            Phase::Other(other) => Err(problem(
                SkipReason::UnusedPhase,
                format!("phase `{}`", other as char),
            )),
        }
    }

    fn ts(ev: &Event) -> Result<f64, EventProblem> {
        let Some(ts) = ev.ts else {
            return Err(problem(SkipReason::BadTimestamp, "has no `ts`"));
        };
        if ts.is_nan() || ts.abs() > MAX_ABS_TS_US {
            return Err(problem(
                SkipReason::BadTimestamp,
                format!(
                    "`ts` {} is out of range (|ts| must stay below 2^53 us)",
                    shown(ts)
                ),
            ));
        }
        Ok(ts)
    }

    fn push_span(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        let ts = Self::ts(ev)?;
        let Some(dur) = ev.dur else {
            return Err(problem(
                SkipReason::BadDuration,
                "is a complete event (`X`) without `dur`",
            ));
        };
        if dur.is_nan() {
            return Err(problem(SkipReason::BadDuration, "has a duration of NaN"));
        }
        if dur < 0.0 {
            return Err(problem(
                SkipReason::BadDuration,
                format!("has a negative duration ({dur} us)"),
            ));
        }
        if dur > MAX_DUR_US {
            return Err(problem(
                SkipReason::BadDuration,
                format!(
                    "has a duration of {} us, more than 1e12 us (11 days)",
                    shown(dur)
                ),
            ));
        }
        let Some(name) = ev.name else {
            return Err(problem(
                SkipReason::NoName,
                "is a complete event (`X`) without `name`",
            ));
        };
        let pid = self.id(s, ev.pid, "pid")?;
        let tid = self.id(s, ev.tid, "tid")?;
        let row = self.span_ts.len() as u32;
        let track = match self.last_track {
            Some((k, t)) if k == (pid, tid) => t,
            _ => {
                let t = self.track(pid, tid);
                self.last_track = Some(((pid, tid), t));
                t
            }
        };
        let name = self.text(s, name);
        let cat = match ev.cat {
            Some(c) => self.text(s, c),
            None => self.strings.intern(b"", false),
        };
        // Checked before anything is written at `row`: a skipped event leaves no trace.
        let flow = match ev.bind_id {
            Some(b) if ev.flow_in || ev.flow_out => Some(Self::flow_id_num(b)?),
            _ => None,
        };
        let mut step = NO_STEP;
        for &(k, v) in &ev.args {
            let Some(which) = ArgUse::of_key(&s[k.range()]) else {
                continue;
            };
            // A string where a number belongs (a hand-edited file) reads as absent.
            let ArgVal::Num(x) = v else { continue };
            match which {
                ArgUse::Step => step = x as i64,
                ArgUse::Column(c) => self.span_args[c.index()].set(row, x),
            }
        }
        if let Some(id) = flow {
            for (flag, dir) in [(ev.flow_out, FlowDir::Out), (ev.flow_in, FlowDir::In)] {
                if flag {
                    self.flow_id.push(id);
                    self.flow_dir.push(dir as u8);
                    self.flow_pid.push(pid);
                    self.flow_tid.push(tid);
                    self.flow_ts.push(ts);
                    self.flow_span.push(row);
                }
            }
        }
        self.span_track.push(track);
        self.span_name.push(name);
        self.span_cat.push(cat);
        self.span_ts.push(ts);
        self.span_dur.push(dur);
        self.span_step.push(step);
        Ok(())
    }

    fn flow_id_num(b: f64) -> Result<u64, EventProblem> {
        if b.fract() != 0.0 || !(0.0..MAX_FLOW_ID).contains(&b) {
            return Err(problem(
                SkipReason::BadFlowId,
                format!("flow id {} is not an integer in 0..2^53", shown(b)),
            ));
        }
        Ok(b as u64)
    }

    /// Kineto's `[memory]` instant event: the allocator's totals as counter samples.
    fn push_memory(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        let ts = Self::ts(ev)?;
        let pid = self.id(s, ev.pid, "pid")?;
        let name = self.strings.intern(KINETO_MEMORY.as_bytes(), false);
        for &(k, v) in &ev.args {
            let key = &s[k.range()];
            if key != MEMORY_ALLOCATED.as_bytes() && key != MEMORY_RESERVED.as_bytes() {
                continue;
            }
            if let ArgVal::Num(x) = v {
                let key = self.text(s, k);
                self.ctr_pid.push(pid);
                self.ctr_name.push(name);
                self.ctr_key.push(key);
                self.ctr_ts.push(ts);
                self.ctr_value.push(x);
            }
        }
        Ok(())
    }

    fn push_counter(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        let ts = Self::ts(ev)?;
        let Some(name) = ev.name else {
            return Err(problem(
                SkipReason::NoName,
                "is a counter (`C`) without `name`",
            ));
        };
        let pid = self.id(s, ev.pid, "pid")?;
        let name = self.text(s, name);
        for &(k, v) in &ev.args {
            if let ArgVal::Num(x) = v {
                let key = self.text(s, k);
                self.ctr_pid.push(pid);
                self.ctr_name.push(name);
                self.ctr_key.push(key);
                self.ctr_ts.push(ts);
                self.ctr_value.push(x);
            }
        }
        Ok(())
    }

    fn push_meta(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        let Some(name) = ev.name else {
            return Ok(());
        };
        let which = match MetaName::parse(&s[name.range()]) {
            Some(m @ (MetaName::ProcessName | MetaName::ThreadName)) => m,
            _ => return Ok(()),
        };
        let key = which.arg().as_bytes();
        let label = ev.args.iter().find_map(|&(k, v)| match v {
            ArgVal::Str(st) if &s[k.range()] == key => Some(if st.escaped() {
                unescape(&s[st.range()])
            } else {
                String::from_utf8_lossy(&s[st.range()]).into_owned()
            }),
            _ => None,
        });
        let Some(label) = label else { return Ok(()) };
        let pid = self.id(s, ev.pid, "pid")?;
        if which == MetaName::ProcessName {
            self.process_names.insert(pid, label);
        } else {
            let tid = self.id(s, ev.tid, "tid")?;
            self.thread_names.insert((pid, tid), label);
        }
        Ok(())
    }

    fn push_flow_event(&mut self, s: &[u8], ev: &Event, phase: Phase) -> Result<(), EventProblem> {
        let ts = Self::ts(ev)?;
        let id = match ev.id {
            IdVal::Missing => {
                return Err(problem(
                    SkipReason::BadFlowId,
                    "is a flow event without `id`",
                ))
            }
            IdVal::Num(n) => Self::flow_id_num(n)?,
            // Hex strings ("0x1f") are how some writers spell flow ids.
            IdVal::Str(st) => {
                let t = String::from_utf8_lossy(&s[st.range()]).into_owned();
                let parsed = t.strip_prefix("0x").map_or_else(
                    || t.parse::<u64>().ok(),
                    |h| u64::from_str_radix(h, 16).ok(),
                );
                match parsed {
                    Some(v) => v,
                    None => {
                        limits::MAX_FLOW_ID + self.string_ids.intern(t.as_bytes(), false) as u64
                    }
                }
            }
        };
        let pid = self.id(s, ev.pid, "pid")?;
        let tid = self.id(s, ev.tid, "tid")?;
        self.flow_id.push(id);
        self.flow_dir
            .push(phase.flow_dir().unwrap_or(FlowDir::Out) as u8);
        self.flow_pid.push(pid);
        self.flow_tid.push(tid);
        self.flow_ts.push(ts);
        self.flow_span.push(NO_SPAN);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrome_trace_format::names::STEP_ARG;

    #[test]
    fn arg_patterns_spell_the_format_keys() {
        for k in ArgKey::ALL {
            assert!(
                matches!(ArgUse::of_key(k.key().as_bytes()), Some(ArgUse::Column(c)) if c == k),
                "{}",
                k.key()
            );
        }
        assert!(matches!(
            ArgUse::of_key(STEP_ARG.as_bytes()),
            Some(ArgUse::Step)
        ));
        assert!(ArgUse::of_key(b"cpu_ts").is_none());
    }
}
