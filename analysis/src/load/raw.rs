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
}

/// The args the analyzer reads, by their key in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ArgKey {
    Step,
    WaitUs,
    Depth,
    Tokens,
    Loss,
    Batch,
    CpuTs,
}

impl ArgKey {
    pub const ALL: [ArgKey; 7] = [
        ArgKey::Step,
        ArgKey::WaitUs,
        ArgKey::Depth,
        ArgKey::Tokens,
        ArgKey::Loss,
        ArgKey::Batch,
        ArgKey::CpuTs,
    ];

    /// The key in `args`.
    pub fn key(self) -> &'static str {
        match self {
            ArgKey::Step => "step",
            ArgKey::WaitUs => "wait_us",
            ArgKey::Depth => "depth",
            ArgKey::Tokens => "tokens",
            ArgKey::Loss => "loss",
            ArgKey::Batch => "batch",
            ArgKey::CpuTs => "cpu_ts",
        }
    }

    /// The column it becomes in the spans frame.
    pub fn column(self) -> &'static str {
        match self {
            ArgKey::Step => "arg_step",
            ArgKey::Depth => "queue_depth",
            other => other.key(),
        }
    }

    fn from_key(k: &[u8]) -> Option<ArgKey> {
        Some(match k {
            b"step" => ArgKey::Step,
            b"wait_us" => ArgKey::WaitUs,
            b"depth" => ArgKey::Depth,
            b"tokens" => ArgKey::Tokens,
            b"loss" => ArgKey::Loss,
            b"batch" => ArgKey::Batch,
            b"cpu_ts" => ArgKey::CpuTs,
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

#[derive(Default)]
pub(crate) struct Raw {
    pub strings: Interner,
    /// (pid, tid) of each track; a span stores its track id.
    pub tracks: Vec<(i64, i64)>,
    track_ids: FxMap<(i64, i64), u32>,
    /// String pids/tids get ids from 2^32 up, so they never meet numeric ones.
    string_ids: Interner,

    pub span_track: Vec<u32>,
    pub span_name: Vec<u32>,
    pub span_cat: Vec<u32>,
    pub span_ts: Vec<f64>,
    pub span_dur: Vec<f64>,
    /// (row, key, value), sparse.
    pub span_args: Vec<(u32, ArgKey, f64)>,

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
    pub flow_span: Vec<Option<u32>>,

    pub process_names: FxMap<i64, String>,
    pub thread_names: FxMap<(i64, i64), String>,
    /// Events of phases the analyzer does not use, by phase.
    pub ignored: FxMap<u8, u64>,
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
                let raw = &s[st.start..st.end];
                // Numbers written as strings ("tid": "12") are common in hand-made traces.
                if let Some(n) = std::str::from_utf8(raw)
                    .ok()
                    .and_then(|t| t.parse::<u32>().ok())
                {
                    return Ok(n as i64);
                }
                Ok(MAX_ID as i64 + self.string_ids.intern(raw, st.escaped) as i64)
            }
        }
    }

    /// The label of a string pid/tid, for names.
    pub fn string_id_label(&self, id: i64) -> Option<&str> {
        let k = id.checked_sub(MAX_ID as i64)?;
        self.string_ids.strings.get(k as usize).map(String::as_str)
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
        self.strings.intern(&s[st.start..st.end], st.escaped)
    }

    /// Validates `ev` (ranges into `s`) and appends it to the columns.
    pub fn push(&mut self, s: &[u8], ev: &Event) -> Result<(), EventProblem> {
        let Some(ph) = ev.ph else {
            return Err(EventProblem("has no `ph` (phase)".into()));
        };
        let ph_raw = &s[ph.start..ph.end];
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
        let track = self.track(pid, tid);
        let name = self.text(s, name);
        let cat = match ev.cat {
            Some(c) => self.text(s, c),
            None => self.strings.intern(b"", false),
        };
        for &(k, v) in &ev.args {
            let Some(key) = ArgKey::from_key(&s[k.start..k.end]) else {
                continue;
            };
            match v {
                ArgVal::Num(x) => self.span_args.push((row, key, x)),
                ArgVal::Str(_) => {
                    return Err(EventProblem(format!(
                        "`args.{}` must be a number, found a string",
                        key.key()
                    )))
                }
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
                        self.flow_span.push(Some(row));
                    }
                }
            }
        }
        self.span_track.push(track);
        self.span_name.push(name);
        self.span_cat.push(cat);
        self.span_ts.push(ts);
        self.span_dur.push(dur);
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
        let which = &s[name.start..name.end];
        if which != b"process_name" && which != b"thread_name" {
            return Ok(());
        }
        let label = ev.args.iter().find_map(|&(k, v)| match v {
            ArgVal::Str(st) if &s[k.start..k.end] == b"name" => Some(if st.escaped {
                unescape(&s[st.start..st.end])
            } else {
                String::from_utf8_lossy(&s[st.start..st.end]).into_owned()
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
                let t = String::from_utf8_lossy(&s[st.start..st.end]).into_owned();
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
        self.flow_span.push(None);
        Ok(())
    }
}
