//! Accumulates validated events as plain columns while the file streams past.
//!
//! Strings are interned to `u32` ids (names repeat millions of times in a trace), args are
//! kept sparse (most spans carry none), and every check that needs the event's index or
//! offset for its message happens here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::mem::MaybeUninit;

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

/// Work that fills one part's share of a merged column.
type Task<'a> = Box<dyn FnOnce() + Send + 'a>;

/// Grows `dest` by the lengths of the parts that follow it and hands out each part's
/// uninitialised place, in order. The caller sets the length once every place is written.
fn places<'a, T>(dest: &'a mut Vec<T>, lens: &[usize]) -> (usize, Vec<&'a mut [MaybeUninit<T>]>) {
    let extra: usize = lens.iter().sum();
    let len = dest.len() + extra;
    dest.reserve_exact(extra);
    let mut spare = &mut dest.spare_capacity_mut()[..extra];
    let mut out = Vec::with_capacity(lens.len());
    for &l in lens {
        let (here, rest) = std::mem::take(&mut spare).split_at_mut(l);
        out.push(here);
        spare = rest;
    }
    (len, out)
}

/// Writes `src`, mapped by `f`, into `place` (of the same length), then frees `src`.
fn fill<T, U>(place: &mut [MaybeUninit<T>], src: Vec<U>, f: impl Fn(U) -> T) {
    assert_eq!(place.len(), src.len(), "a part's column changed size");
    for (d, s) in place.iter_mut().zip(src) {
        d.write(f(s));
    }
}

/// Queues one task per part that fills its place in `dest` from its column, mapped by
/// `f(part, value)`; returns the length `dest` has once they have run.
fn queue<'a, T: Send + 'a, U: Send + 'a>(
    tasks: &mut Vec<Task<'a>>,
    dest: &'a mut Vec<T>,
    srcs: Vec<Vec<U>>,
    f: impl Fn(usize, U) -> T + Copy + Send + 'a,
) -> usize {
    let lens: Vec<usize> = srcs.iter().map(Vec::len).collect();
    let (len, places) = places(dest, &lens);
    for (k, (place, src)) in places.into_iter().zip(srcs).enumerate() {
        tasks.push(Box::new(move || fill(place, src, |v| f(k, v))));
    }
    len
}

/// How the ids of one part map onto the merged part's.
struct PartMap {
    strings: Vec<u32>,
    string_ids: Vec<u32>,
    tracks: Vec<u32>,
    /// Span rows before this part.
    rows: u32,
}

impl PartMap {
    /// A pid or tid: string ids move, numbers stay.
    fn id(&self, v: i64) -> i64 {
        let max_id = MAX_ID as i64;
        if v >= max_id {
            max_id + self.string_ids[(v - max_id) as usize] as i64
        } else {
            v
        }
    }

    fn flow_id(&self, f: u64) -> u64 {
        let base = 1u64 << 53;
        if f >= base {
            base + self.string_ids[(f - base) as usize] as u64
        } else {
            f
        }
    }

    fn span(&self, r: u32) -> u32 {
        if r == NO_SPAN {
            NO_SPAN
        } else {
            r + self.rows
        }
    }
}

/// Runs `tasks` on up to `threads` threads (0: one per core).
fn run_tasks(tasks: Vec<Task<'_>>, threads: usize) {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    let queue = std::sync::Mutex::new(tasks);
    let work = || loop {
        let task = queue.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match task {
            Some(t) => t(),
            None => break,
        }
    };
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads).map(|_| scope.spawn(work)).collect();
        work();
        for h in helpers {
            if let Err(panic) = h.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
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

    /// Joins parts of the file, in file order, into one: ids of strings, string pids and
    /// tracks are mapped onto the first part's, span rows shifted. The ids are merged in
    /// order; the columns are copied into place by up to `threads` threads, a part and a
    /// column at a time, each part's column freed as soon as it is copied.
    pub fn concat(mut parts: Vec<Raw>, threads: usize) -> Raw {
        if parts.len() <= 1 {
            return parts.pop().unwrap_or_default();
        }
        let mut rest = parts.split_off(1);
        let mut base = parts.pop().unwrap_or_default();
        let mut maps = Vec::with_capacity(rest.len());
        let mut rows = base.span_ts.len();
        for other in &mut rest {
            let strings = base.strings.absorb(&other.strings);
            let string_ids = base.string_ids.absorb(&other.string_ids);
            let mut map = PartMap {
                strings,
                string_ids,
                tracks: Vec::new(),
                rows: rows as u32,
            };
            map.tracks = other
                .tracks
                .iter()
                .map(|&(p, t)| base.track(map.id(p), map.id(t)))
                .collect();
            for (pid, label) in std::mem::take(&mut other.process_names) {
                base.process_names.insert(map.id(pid), label);
            }
            for ((pid, tid), label) in std::mem::take(&mut other.thread_names) {
                base.thread_names.insert((map.id(pid), map.id(tid)), label);
            }
            for (ph, n) in std::mem::take(&mut other.ignored) {
                *base.ignored.entry(ph).or_default() += n;
            }
            rows += other.span_ts.len();
            maps.push(map);
        }
        let maps = &maps;
        macro_rules! cols {
            ($field:ident) => {
                rest.iter_mut()
                    .map(|r| std::mem::take(&mut r.$field))
                    .collect::<Vec<_>>()
            };
        }
        let (track, name, cat) = (cols!(span_track), cols!(span_name), cols!(span_cat));
        let (ts, dur, step) = (cols!(span_ts), cols!(span_dur), cols!(span_step));
        let (c_pid, c_name, c_key) = (cols!(ctr_pid), cols!(ctr_name), cols!(ctr_key));
        let (c_ts, c_value) = (cols!(ctr_ts), cols!(ctr_value));
        let (f_id, f_dir, f_pid, f_tid) = (
            cols!(flow_id),
            cols!(flow_dir),
            cols!(flow_pid),
            cols!(flow_tid),
        );
        let (f_ts, f_span) = (cols!(flow_ts), cols!(flow_span));
        // Per arg: the parts' rows and values.
        type ArgParts = (Vec<Vec<u32>>, Vec<Vec<f64>>);
        let mut args: Vec<ArgParts> = (0..ArgKey::ALL.len())
            .map(|a| {
                rest.iter_mut()
                    .map(|r| {
                        let c = std::mem::take(&mut r.span_args[a]);
                        (c.rows, c.values)
                    })
                    .unzip()
            })
            .collect();
        drop(rest);

        let b = &mut base;
        let mut tasks: Vec<Task<'_>> = Vec::new();
        let t = &mut tasks;
        let lens = [
            queue(t, &mut b.span_track, track, move |k, v| {
                maps[k].tracks[v as usize]
            }),
            queue(t, &mut b.span_name, name, move |k, v| {
                maps[k].strings[v as usize]
            }),
            queue(t, &mut b.span_cat, cat, move |k, v| {
                maps[k].strings[v as usize]
            }),
            queue(t, &mut b.ctr_name, c_name, move |k, v| {
                maps[k].strings[v as usize]
            }),
            queue(t, &mut b.ctr_key, c_key, move |k, v| {
                maps[k].strings[v as usize]
            }),
            queue(t, &mut b.flow_span, f_span, move |k, v| maps[k].span(v)),
        ];
        let lens64 = [
            queue(t, &mut b.ctr_pid, c_pid, move |k, v| maps[k].id(v)),
            queue(t, &mut b.flow_pid, f_pid, move |k, v| maps[k].id(v)),
            queue(t, &mut b.flow_tid, f_tid, move |k, v| maps[k].id(v)),
        ];
        let id_len = queue(t, &mut b.flow_id, f_id, move |k, v| maps[k].flow_id(v));
        let dir_len = queue(t, &mut b.flow_dir, f_dir, |_, v| v);
        let flen = [
            queue(t, &mut b.span_ts, ts, |_, v| v),
            queue(t, &mut b.span_dur, dur, |_, v| v),
            queue(t, &mut b.ctr_ts, c_ts, |_, v| v),
            queue(t, &mut b.ctr_value, c_value, |_, v| v),
            queue(t, &mut b.flow_ts, f_ts, |_, v| v),
        ];
        let step_len = queue(t, &mut b.span_step, step, |_, v| v);
        let mut arg_lens = Vec::new();
        for (col, (rows, values)) in b.span_args.iter_mut().zip(args.drain(..)) {
            let r = queue(t, &mut col.rows, rows, move |k, v| v + maps[k].rows);
            let v = queue(t, &mut col.values, values, |_, v| v);
            arg_lens.push((r, v));
        }
        run_tasks(tasks, threads);
        // SAFETY: every place handed out by `queue` was written by its task (`fill` checks
        // that a place and its source have the same length), and all tasks have run.
        unsafe {
            let [a, b2, c, d, e, f] = lens;
            base.span_track.set_len(a);
            base.span_name.set_len(b2);
            base.span_cat.set_len(c);
            base.ctr_name.set_len(d);
            base.ctr_key.set_len(e);
            base.flow_span.set_len(f);
            let [a, b2, c] = lens64;
            base.ctr_pid.set_len(a);
            base.flow_pid.set_len(b2);
            base.flow_tid.set_len(c);
            base.flow_id.set_len(id_len);
            base.flow_dir.set_len(dir_len);
            let [a, b2, c, d, e] = flen;
            base.span_ts.set_len(a);
            base.span_dur.set_len(b2);
            base.ctr_ts.set_len(c);
            base.ctr_value.set_len(d);
            base.flow_ts.set_len(e);
            base.span_step.set_len(step_len);
            for (col, (r, v)) in base.span_args.iter_mut().zip(arg_lens) {
                col.rows.set_len(r);
                col.values.set_len(v);
            }
        }
        base
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
