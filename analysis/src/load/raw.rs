//! Accumulates validated events as plain columns while the file streams past.
//!
//! Strings are interned to `u32` ids (names repeat millions of times in a trace), args are
//! kept sparse (most spans carry none), and every check that needs the event's index or
//! offset for its message happens here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::event::{ArgVal, Event, IdVal};
use super::json::{unescape, Str};

/// FxHash (rustc's hasher): names are short and trusted enough, SipHash is overkill here.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            h = (h.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
        self.0 = h;
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.0 = (self.0.rotate_left(5) ^ i as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Raw (still escaped) string bytes to a dense id, and ids back to decoded strings.
#[derive(Default)]
pub(crate) struct Interner {
    ids: FxMap<Box<[u8]>, u32>,
    pub strings: Vec<String>,
}

impl Interner {
    #[inline]
    pub fn intern(&mut self, raw: &[u8], escaped: bool) -> u32 {
        if let Some(&id) = self.ids.get(raw) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(if escaped {
            unescape(raw)
        } else {
            String::from_utf8_lossy(raw).into_owned()
        });
        self.ids.insert(raw.into(), id);
        id
    }

    pub fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s.as_bytes()).copied()
    }

    /// The id of `raw`, storing `decoded` as its text when it is new; for merging.
    fn intern_decoded(&mut self, raw: &[u8], decoded: &str) -> u32 {
        if let Some(&id) = self.ids.get(raw) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(decoded.to_string());
        self.ids.insert(raw.into(), id);
        id
    }

    /// For each id of `other`, its id here (interning what is new).
    fn absorb(&mut self, other: &Interner) -> Vec<u32> {
        let mut by_id: Vec<&[u8]> = vec![&[]; other.strings.len()];
        for (raw, &id) in &other.ids {
            by_id[id as usize] = raw;
        }
        // In id order, so new strings get ids in the order the file showed them.
        by_id
            .iter()
            .zip(&other.strings)
            .map(|(raw, text)| self.intern_decoded(raw, text))
            .collect()
    }
}

/// The args the analyzer keeps as span columns, by their key in the trace. `args.step`
/// is read too, into the step column (see [`Raw::span_step`]); other args are skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ArgKey {
    WaitUs,
    Depth,
    Tokens,
    Loss,
    Batch,
}

/// What an `args` key is to the loader.
enum ArgUse {
    Column(ArgKey),
    Step,
}

impl ArgKey {
    /// In declaration order (so `ALL[k].index() == k`), which is also the order of the
    /// arg columns in the span table.
    pub const ALL: [ArgKey; 5] = [
        ArgKey::WaitUs,
        ArgKey::Depth,
        ArgKey::Tokens,
        ArgKey::Loss,
        ArgKey::Batch,
    ];

    /// The key in `args`.
    pub fn key(self) -> &'static str {
        match self {
            ArgKey::WaitUs => "wait_us",
            ArgKey::Depth => "depth",
            ArgKey::Tokens => "tokens",
            ArgKey::Loss => "loss",
            ArgKey::Batch => "batch",
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
    fn of_key(k: &[u8]) -> Option<ArgUse> {
        // Byte patterns rather than string literals: compared inline, without a call.
        Some(match k {
            [b's', b't', b'e', b'p'] => ArgUse::Step,
            [b'w', b'a', b'i', b't', b'_', b'u', b's'] => ArgUse::Column(ArgKey::WaitUs),
            [b'd', b'e', b'p', b't', b'h'] => ArgUse::Column(ArgKey::Depth),
            [b't', b'o', b'k', b'e', b'n', b's'] => ArgUse::Column(ArgKey::Tokens),
            [b'l', b'o', b's', b's'] => ArgUse::Column(ArgKey::Loss),
            [b'b', b'a', b't', b'c', b'h'] => ArgUse::Column(ArgKey::Batch),
            _ => return None,
        })
    }
}

/// Limits past which a value is taken as corrupt rather than as data.
pub(crate) const MAX_ABS_TS_US: f64 = 9_007_199_254_740_992.0; // 2^53 us: beyond f64's integer range
pub(crate) const MAX_DUR_US: f64 = 1e12; // about 11.6 days
const MAX_ID: f64 = 4_294_967_296.0; // pid/tid below 2^32, as Perfetto requires
const MAX_FLOW_ID: f64 = 9_007_199_254_740_992.0; // flow ids below 2^53

/// Every phase of the Chrome trace event format. Ones not in this list are errors.
const KNOWN_PHASES: &[u8] = b"BEXiIbneSTpFstfPCMNODRcVv()";

/// A message about one event, before the loader adds path, index and offset.
pub(crate) struct EventProblem(pub String);

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
    track_ids: FxMap<(i64, i64), u32>,
    /// The track of the previous span: consecutive spans often share one.
    last_track: Option<((i64, i64), u32)>,
    /// String pids/tids get ids from 2^32 up, so they never meet numeric ones.
    string_ids: Interner,

    pub span_track: Vec<u32>,
    pub span_name: Vec<u32>,
    pub span_cat: Vec<u32>,
    pub span_ts: Vec<f64>,
    pub span_dur: Vec<f64>,
    /// `args.step` as written, [`NO_STEP`] without one; the frame's step column is built
    /// in place from it.
    pub span_step: Vec<i64>,
    /// By [`ArgKey`] index.
    pub span_args: [ArgColumn; 5],

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

    pub process_names: FxMap<i64, String>,
    pub thread_names: FxMap<(i64, i64), String>,
    /// Events of phases the analyzer does not use, by phase.
    pub ignored: FxMap<u8, u64>,
}

/// Moves `from` onto the end of `to`, freeing `from`'s memory right away.
fn append_vec<T: Copy>(to: &mut Vec<T>, from: &mut Vec<T>) {
    if to.is_empty() && to.capacity() < from.len() {
        std::mem::swap(to, from);
    } else {
        to.extend_from_slice(from);
    }
    *from = Vec::new();
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
    if v.fract() != 0.0 || !(0.0..MAX_ID).contains(&v) {
        return Err(EventProblem(format!(
            "`{field}` {} is not an integer in 0..2^32",
            shown(v)
        )));
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

    /// Appends `other`, the events that follow this part's in the file: ids of strings,
    /// string pids and tracks are mapped onto this part's, span rows shifted.
    pub fn append(&mut self, mut other: Raw) {
        let strings = self.strings.absorb(&other.strings);
        let sids = &self.string_ids.absorb(&other.string_ids);
        let strings = &strings;
        let max_id = MAX_ID as i64;
        let id = |v: i64| {
            if v >= max_id {
                max_id + sids[(v - max_id) as usize] as i64
            } else {
                v
            }
        };
        let tracks: Vec<u32> = other
            .tracks
            .iter()
            .map(|&(p, t)| self.track(id(p), id(t)))
            .collect();
        let rows = self.span_ts.len();
        let name = |v: &u32| strings[*v as usize];
        let Raw {
            span_track,
            span_name,
            span_cat,
            span_ts,
            span_dur,
            span_step,
            span_args,
            ctr_pid,
            ctr_name,
            ctr_key,
            ctr_ts,
            ctr_value,
            flow_id,
            flow_dir,
            flow_pid,
            flow_tid,
            flow_ts,
            flow_span,
            ..
        } = self;
        // Flows and counters on a second core, spans here: the columns are disjoint.
        std::thread::scope(|scope| {
            let mut o = Raw {
                ctr_pid: std::mem::take(&mut other.ctr_pid),
                ctr_name: std::mem::take(&mut other.ctr_name),
                ctr_key: std::mem::take(&mut other.ctr_key),
                ctr_ts: std::mem::take(&mut other.ctr_ts),
                ctr_value: std::mem::take(&mut other.ctr_value),
                flow_id: std::mem::take(&mut other.flow_id),
                flow_dir: std::mem::take(&mut other.flow_dir),
                flow_pid: std::mem::take(&mut other.flow_pid),
                flow_tid: std::mem::take(&mut other.flow_tid),
                flow_ts: std::mem::take(&mut other.flow_ts),
                flow_span: std::mem::take(&mut other.flow_span),
                ..Raw::default()
            };
            let flows_and_counters = scope.spawn(move || {
                ctr_pid.extend(o.ctr_pid.iter().map(|&p| id(p)));
                ctr_name.extend(o.ctr_name.iter().map(name));
                ctr_key.extend(o.ctr_key.iter().map(name));
                append_vec(ctr_ts, &mut o.ctr_ts);
                append_vec(ctr_value, &mut o.ctr_value);

                let flow_base = 1u64 << 53;
                flow_id.extend(o.flow_id.iter().map(|&f| {
                    if f >= flow_base {
                        flow_base + sids[(f - flow_base) as usize] as u64
                    } else {
                        f
                    }
                }));
                drop(std::mem::take(&mut o.flow_id));
                append_vec(flow_dir, &mut o.flow_dir);
                flow_pid.extend(o.flow_pid.iter().map(|&p| id(p)));
                drop(std::mem::take(&mut o.flow_pid));
                flow_tid.extend(o.flow_tid.iter().map(|&p| id(p)));
                drop(std::mem::take(&mut o.flow_tid));
                append_vec(flow_ts, &mut o.flow_ts);
                flow_span.extend(o.flow_span.iter().map(|&r| {
                    if r == NO_SPAN {
                        NO_SPAN
                    } else {
                        r + rows as u32
                    }
                }));
                drop(std::mem::take(&mut o.flow_span));
            });
            span_track.extend(other.span_track.iter().map(|&t| tracks[t as usize]));
            drop(std::mem::take(&mut other.span_track));
            span_name.extend(other.span_name.iter().map(name));
            drop(std::mem::take(&mut other.span_name));
            span_cat.extend(other.span_cat.iter().map(name));
            drop(std::mem::take(&mut other.span_cat));
            append_vec(span_ts, &mut other.span_ts);
            append_vec(span_dur, &mut other.span_dur);
            append_vec(span_step, &mut other.span_step);
            for (mine, theirs) in span_args.iter_mut().zip(other.span_args.iter_mut()) {
                mine.rows
                    .extend(theirs.rows.iter().map(|&r| r + rows as u32));
                drop(std::mem::take(&mut theirs.rows));
                append_vec(&mut mine.values, &mut theirs.values);
            }
            if let Err(panic) = flows_and_counters.join() {
                std::panic::resume_unwind(panic);
            }
        });

        for (pid, label) in other.process_names {
            self.process_names.insert(id(pid), label);
        }
        for ((pid, tid), label) in other.thread_names {
            self.thread_names.insert((id(pid), id(tid)), label);
        }
        for (ph, n) in other.ignored {
            *self.ignored.entry(ph).or_default() += n;
        }
    }

    fn track(&mut self, pid: i64, tid: i64) -> u32 {
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
        let Some(ph) = ev.ph else {
            return Err(EventProblem("has no `ph` (phase)".into()));
        };
        let ph_raw = &s[ph.range()];
        let phase = match ph_raw {
            [p] if KNOWN_PHASES.contains(p) => *p,
            _ => {
                return Err(EventProblem(format!(
                    "has an unknown phase `{}`; the Chrome trace format knows {}",
                    String::from_utf8_lossy(ph_raw),
                    String::from_utf8_lossy(KNOWN_PHASES)
                )))
            }
        };
        match phase {
            b'X' => self.push_span(s, ev),
            b'C' => self.push_counter(s, ev),
            b'M' => self.push_meta(s, ev),
            b's' | b'f' | b't' => self.push_flow_event(s, ev, phase),
            other => {
                *self.ignored.entry(other).or_default() += 1;
                Ok(())
            }
        }
    }

    fn ts(ev: &Event) -> Result<f64, EventProblem> {
        let Some(ts) = ev.ts else {
            return Err(EventProblem("has no `ts`".into()));
        };
        if ts.abs() > MAX_ABS_TS_US {
            return Err(EventProblem(format!(
                "`ts` {} is out of range (|ts| must stay below 2^53 us)",
                shown(ts)
            )));
        }
        Ok(ts)
    }

    fn push_span(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        let ts = Self::ts(ev)?;
        let Some(dur) = ev.dur else {
            return Err(EventProblem(
                "is a complete event (`X`) without `dur`".into(),
            ));
        };
        if dur < 0.0 {
            return Err(EventProblem(format!("has a negative duration ({dur} us)")));
        }
        if dur > MAX_DUR_US {
            return Err(EventProblem(format!(
                "has a duration of {} us, more than 1e12 us (11 days)",
                shown(dur)
            )));
        }
        let Some(name) = ev.name else {
            return Err(EventProblem(
                "is a complete event (`X`) without `name`".into(),
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
        let mut step = NO_STEP;
        for &(k, v) in &ev.args {
            let Some(which) = ArgUse::of_key(&s[k.range()]) else {
                continue;
            };
            let x = match v {
                ArgVal::Num(x) => x,
                ArgVal::Str(_) => {
                    let key = match which {
                        ArgUse::Step => "step",
                        ArgUse::Column(c) => c.key(),
                    };
                    return Err(EventProblem(format!(
                        "`args.{key}` must be a number, found a string"
                    )));
                }
            };
            match which {
                ArgUse::Step => step = x as i64,
                ArgUse::Column(c) => self.span_args[c.index()].set(row, x),
            }
        }
        if let Some(b) = ev.bind_id {
            if ev.flow_in || ev.flow_out {
                let id = Self::flow_id_num(b)?;
                for (flag, dir) in [(ev.flow_out, 0u8), (ev.flow_in, 1u8)] {
                    if flag {
                        self.flow_id.push(id);
                        self.flow_dir.push(dir);
                        self.flow_pid.push(pid);
                        self.flow_tid.push(tid);
                        self.flow_ts.push(ts);
                        self.flow_span.push(row);
                    }
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
            return Err(EventProblem(format!(
                "flow id {} is not an integer in 0..2^53",
                shown(b)
            )));
        }
        Ok(b as u64)
    }

    fn push_counter(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        let ts = Self::ts(ev)?;
        let Some(name) = ev.name else {
            return Err(EventProblem("is a counter (`C`) without `name`".into()));
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
        let which = &s[name.range()];
        if which != b"process_name".as_slice() && which != b"thread_name".as_slice() {
            return Ok(());
        }
        let label = ev.args.iter().find_map(|&(k, v)| match v {
            ArgVal::Str(st) if &s[k.range()] == b"name" => Some(if st.escaped() {
                unescape(&s[st.range()])
            } else {
                String::from_utf8_lossy(&s[st.range()]).into_owned()
            }),
            _ => None,
        });
        let Some(label) = label else { return Ok(()) };
        let pid = self.id(s, ev.pid, "pid")?;
        if which == b"process_name" {
            self.process_names.insert(pid, label);
        } else {
            let tid = self.id(s, ev.tid, "tid")?;
            self.thread_names.insert((pid, tid), label);
        }
        Ok(())
    }

    fn push_flow_event(&mut self, s: &[u8], ev: &Event, phase: u8) -> Result<(), EventProblem> {
        let ts = Self::ts(ev)?;
        let id = match ev.id {
            IdVal::Missing => return Err(EventProblem("is a flow event without `id`".into())),
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
                    None => (1u64 << 53) + self.string_ids.intern(t.as_bytes(), false) as u64,
                }
            }
        };
        let pid = self.id(s, ev.pid, "pid")?;
        let tid = self.id(s, ev.tid, "tid")?;
        self.flow_id.push(id);
        self.flow_dir.push(if phase == b'f' { 1 } else { 0 });
        self.flow_pid.push(pid);
        self.flow_tid.push(tid);
        self.flow_ts.push(ts);
        self.flow_span.push(NO_SPAN);
        Ok(())
    }
}
