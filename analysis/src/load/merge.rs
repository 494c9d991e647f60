//! Joins the [`Raw`] columns of the parts of a file scanned in parallel, in file order,
//! into one: ids of strings, string pids and tracks are mapped onto the first part's,
//! span rows shifted. The ids are merged in order; then every column is copied into
//! place with rayon, a part and a column at a time, each part's column freed as soon as
//! it is copied.

use std::mem::{take, MaybeUninit};

use chrome_trace_format::limits::{MAX_FLOW_ID, MAX_ID};

use super::raw::{ArgColumn, ArgKey, Raw, NO_SPAN};

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
        if f >= MAX_FLOW_ID {
            MAX_FLOW_ID + self.string_ids[(f - MAX_FLOW_ID) as usize] as u64
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

impl Raw {
    /// Joins parts of the file, in file order, into one (on the current rayon pool).
    pub fn concat(mut parts: Vec<Raw>) -> Raw {
        if parts.len() <= 1 {
            return parts.pop().unwrap_or_default();
        }
        let mut rest = parts.split_off(1);
        let mut base = parts.pop().unwrap_or_default();
        let maps = base.absorb_ids(&mut rest);
        copy_columns(&mut base, rest, &maps);
        base
    }

    /// Takes the ids and names of `rest` into this part's; returns how each part's ids
    /// map onto the merged ones.
    fn absorb_ids(&mut self, rest: &mut [Raw]) -> Vec<PartMap> {
        let mut maps = Vec::with_capacity(rest.len());
        let mut rows = self.span_ts.len();
        for other in rest {
            let strings = self.strings.absorb(&other.strings);
            let string_ids = self.string_ids.absorb(&other.string_ids);
            let mut map = PartMap {
                strings,
                string_ids,
                tracks: Vec::new(),
                rows: rows as u32,
            };
            map.tracks = other
                .tracks
                .iter()
                .map(|&(p, t)| self.track(map.id(p), map.id(t)))
                .collect();
            for (pid, label) in take(&mut other.process_names) {
                self.process_names.insert(map.id(pid), label);
            }
            for ((pid, tid), label) in take(&mut other.thread_names) {
                self.thread_names.insert((map.id(pid), map.id(tid)), label);
            }
            rows += other.span_ts.len();
            maps.push(map);
        }
        maps
    }
}

/// Appends every part's columns to `base`'s, mapping ids with `maps`: one rayon task per
/// column, each copying its parts in parallel.
fn copy_columns(base: &mut Raw, mut rest: Vec<Raw>, maps: &[PartMap]) {
    macro_rules! cols {
        ($field:ident) => {
            rest.iter_mut()
                .map(|r| take(&mut r.$field))
                .collect::<Vec<_>>()
        };
    }
    let (track, name, cat) = (cols!(span_track), cols!(span_name), cols!(span_cat));
    let (ts, dur, step) = (cols!(span_ts), cols!(span_dur), cols!(span_step));
    let (c_pid, c_name, c_key) = (cols!(ctr_pid), cols!(ctr_name), cols!(ctr_key));
    let (c_ts, c_value) = (cols!(ctr_ts), cols!(ctr_value));
    let (f_id, f_dir, f_pid) = (cols!(flow_id), cols!(flow_dir), cols!(flow_pid));
    let (f_tid, f_ts, f_span) = (cols!(flow_tid), cols!(flow_ts), cols!(flow_span));
    let args: Vec<Vec<ArgColumn>> = (0..ArgKey::ALL.len())
        .map(|a| rest.iter_mut().map(|r| take(&mut r.span_args[a])).collect())
        .collect();
    drop(rest);
    let b = base;
    rayon::scope(|s| {
        s.spawn(|_| merge(&mut b.span_track, track, |k, v| maps[k].tracks[v as usize]));
        s.spawn(|_| merge(&mut b.span_name, name, |k, v| maps[k].strings[v as usize]));
        s.spawn(|_| merge(&mut b.span_cat, cat, |k, v| maps[k].strings[v as usize]));
        s.spawn(|_| merge(&mut b.span_ts, ts, |_, v| v));
        s.spawn(|_| merge(&mut b.span_dur, dur, |_, v| v));
        s.spawn(|_| merge(&mut b.span_step, step, |_, v| v));
        s.spawn(|_| merge(&mut b.ctr_pid, c_pid, |k, v| maps[k].id(v)));
        s.spawn(|_| merge(&mut b.ctr_name, c_name, |k, v| maps[k].strings[v as usize]));
        s.spawn(|_| merge(&mut b.ctr_key, c_key, |k, v| maps[k].strings[v as usize]));
        s.spawn(|_| merge(&mut b.ctr_ts, c_ts, |_, v| v));
        s.spawn(|_| merge(&mut b.ctr_value, c_value, |_, v| v));
        s.spawn(|_| merge(&mut b.flow_id, f_id, |k, v| maps[k].flow_id(v)));
        s.spawn(|_| merge(&mut b.flow_dir, f_dir, |_, v| v));
        s.spawn(|_| merge(&mut b.flow_pid, f_pid, |k, v| maps[k].id(v)));
        s.spawn(|_| merge(&mut b.flow_tid, f_tid, |k, v| maps[k].id(v)));
        s.spawn(|_| merge(&mut b.flow_ts, f_ts, |_, v| v));
        s.spawn(|_| merge(&mut b.flow_span, f_span, |k, v| maps[k].span(v)));
        for (col, parts) in b.span_args.iter_mut().zip(args) {
            let (rows, values): (Vec<Vec<u32>>, Vec<Vec<f64>>) =
                parts.into_iter().map(|c| (c.rows, c.values)).unzip();
            let ArgColumn {
                rows: dest_rows,
                values: dest_values,
            } = col;
            s.spawn(|_| merge(dest_rows, rows, |k, v| v + maps[k].rows));
            s.spawn(|_| merge(dest_values, values, |_, v| v));
        }
    });
}

/// Appends the parts `srcs` to `dest`, each mapped by `f(part, value)`, the parts copied
/// in parallel, each freed once copied.
fn merge<T: Send, U: Send>(dest: &mut Vec<T>, srcs: Vec<Vec<U>>, f: impl Fn(usize, U) -> T + Sync) {
    let extra: usize = srcs.iter().map(Vec::len).sum();
    let len = dest.len() + extra;
    dest.reserve_exact(extra);
    let mut spare = &mut dest.spare_capacity_mut()[..extra];
    let f = &f;
    rayon::scope(|s| {
        for (k, src) in srcs.into_iter().enumerate() {
            let (place, rest) = take(&mut spare).split_at_mut(src.len());
            spare = rest;
            s.spawn(move |_| fill(place, src, |v| f(k, v)));
        }
    });
    // SAFETY: the scope has returned, so every task has run (a panicking one would have
    // unwound past this line); each wrote its whole place (`fill` checks that a place and
    // its source have the same length), and the places cover `dest[old len..len]`.
    unsafe { dest.set_len(len) };
}

/// Writes `src`, mapped by `f`, into `place` (of the same length), then frees `src`.
fn fill<T, U>(place: &mut [MaybeUninit<T>], src: Vec<U>, f: impl Fn(U) -> T) {
    assert_eq!(place.len(), src.len(), "a part's column changed size");
    for (d, s) in place.iter_mut().zip(src) {
        d.write(f(s));
    }
}
