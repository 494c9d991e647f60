//! Keeps one thread's spans nested when guards were dropped out of order (see [`Nest`]).

/// Keeps one thread's spans nested when guards were dropped out of order. Spans reach the
/// writer in the order they ended; a span that ended while `outlived` spans opened inside
/// it were still open is remembered until those have arrived, and each of them is cut at
/// its end (the innermost such end), so they show truncated rather than overlapping it.
/// Spans dropped in order pass through untouched, at no cost beyond an empty-list check.
#[derive(Default)]
pub(crate) struct Nest(Vec<Outlived>);

struct Outlived {
    start: u64,
    /// Its end as recorded, and as written (cut itself if it outlived a parent).
    end: u64,
    cut: u64,
    /// Spans opened inside it and still open at its end that have not arrived yet.
    waiting: u32,
}

impl Nest {
    /// Bound on remembered spans (reached only if their inner spans were never recorded,
    /// e.g. lost to a full ring).
    const MAX: usize = 64;

    /// The end to write for a span that began at `start` and ended at `end` (raw ticks)
    /// while `outlived` spans opened after it were still open.
    pub(crate) fn end(&mut self, start: u64, end: u64, outlived: u32) -> u64 {
        let mut cut = end;
        if !self.0.is_empty() {
            for o in &mut self.0 {
                // Opened inside `o` and still open when it ended.
                if o.start < start && start < o.end {
                    o.waiting = o.waiting.saturating_sub(1);
                    if start < o.cut {
                        cut = cut.min(o.cut);
                    }
                }
            }
            self.0.retain(|o| o.waiting > 0);
        }
        let cut = cut.max(start);
        if outlived > 0 {
            if self.0.len() == Self::MAX {
                self.0.remove(0);
            }
            self.0.push(Outlived {
                start,
                end,
                cut,
                waiting: outlived,
            });
        }
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::Nest;

    /// Random open/close sequences on one thread, the clock ticking once per operation:
    /// `None` opens a span, `Some(k)` ends one (`usize::MAX`: the innermost; else the
    /// `k % open`-th, out of order). Returns the events in the order they ended, as the
    /// recording thread reports them: (start, end, spans opened after it still open).
    fn simulate(ops: &[Option<usize>]) -> Vec<(u64, u64, u32)> {
        let mut open: Vec<u64> = Vec::new();
        let mut out = Vec::new();
        for (t, op) in ops.iter().enumerate() {
            let t = t as u64;
            match op {
                None => open.push(t),
                Some(_) if open.is_empty() => {}
                Some(k) => {
                    let i = if *k == usize::MAX {
                        open.len() - 1
                    } else {
                        k % open.len()
                    };
                    let start = open.remove(i);
                    out.push((start, t, (open.len() - i) as u32));
                }
            }
        }
        out
    }

    fn nested(spans: &[(u64, u64, u32)]) -> Vec<(u64, u64)> {
        let mut nest = Nest::default();
        spans
            .iter()
            .map(|&(s, e, o)| (s, nest.end(s, e, o)))
            .collect()
    }

    #[test]
    fn nest_cuts_out_of_order_spans_only_and_leaves_no_overlap() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..600 {
            let in_order = round % 3 == 0;
            let ops: Vec<Option<usize>> = (0..80)
                .map(|_| {
                    let r = rnd();
                    match r % 10 {
                        0..=3 => None,
                        9 if !in_order => Some((r >> 8) as usize),
                        _ => Some(usize::MAX),
                    }
                })
                .collect();
            let spans = simulate(&ops);
            let got = nested(&spans);
            if in_order {
                let plain: Vec<(u64, u64)> = spans.iter().map(|&(s, e, _)| (s, e)).collect();
                assert_eq!(got, plain, "in-order drops are never changed");
            }
            for (k, (&(s, e, _), &(_, g))) in spans.iter().zip(&got).enumerate() {
                assert!(s <= g && g <= e, "only ever cut: {s}..{e} -> {g}");
                if g < e {
                    assert!(
                        spans[..k]
                            .iter()
                            .zip(&got)
                            .any(|(p, q)| p.0 < s && s < p.1 && q.1 == g),
                        "{s}..{e} cut to {g}, not the end of a span it opened in"
                    );
                }
            }
            for a in &got {
                for b in &got {
                    let partial = a.0 < b.0 && b.0 < a.1 && a.1 < b.1;
                    assert!(!partial, "{a:?} and {b:?} overlap in {spans:?}");
                }
            }
        }
    }

    #[test]
    fn nest_cuts_at_the_innermost_parent_dropped_first() {
        // n opens at 1, p at 2, m at 3; p ends at 4 (m open), n at 5 (m open), m at 6:
        // m began inside p, which ended first, so m ends at 4.
        let spans = [(2, 4, 1), (1, 5, 1), (3, 6, 0)];
        assert_eq!(nested(&spans), vec![(2, 4), (1, 5), (3, 4)]);
        // A span that outlived its parent keeps the rest of the track as it was.
        let spans = [(10, 50, 1), (20, 80, 0), (90, 95, 0)];
        assert_eq!(nested(&spans), vec![(10, 50), (20, 50), (90, 95)]);
    }

    #[test]
    fn nest_forgets_parents_whose_inner_spans_never_arrive() {
        let mut nest = Nest::default();
        for i in 0..1000u64 {
            assert_eq!(nest.end(10 * i, 10 * i + 5, 3), 10 * i + 5);
        }
        assert!(nest.0.len() <= Nest::MAX);
    }
}
