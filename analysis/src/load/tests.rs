//! Loading against traces built by hand: parts load like one file, nesting does not
//! depend on file order, columns are as documented, truncation and errors.

use super::parts::event_boundary;
use super::*;
use std::fmt::Write as _;

/// A trace whose strings and args hold what looks like event boundaries.
fn tricky_trace(events: usize) -> String {
    let mut s = String::from(
        "{\"metadata\":{\"producer\":\"dflash\",\"list\":[{\"a\":1},{\"b\":2}]},\n\"traceEvents\":[\n",
    );
    let names = [
        "plain",
        "brace },{ inside",
        "spaced }, { too",
        "line },\\n{ escaped",
        "quote \\\"},{\\\" here",
        "ProfilerStep#1",
    ];
    s.push_str(
        "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":7,\"args\":{\"name\":\"proc },{\"}},\n",
    );
    s.push_str("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":7,\"tid\":\"worker },{ a\",\"args\":{\"name\":\"thr\"}},\n");
    for i in 0..events {
        let name = names[i % names.len()];
        let ts = i as f64 * 1.5;
        let sep = match i % 4 {
            0 => ",\n",
            1 => ",",
            2 => ", ",
            _ => " ,\n  ",
        };
        match i % 7 {
            0 => write!(
                s,
                "{{\"ph\":\"C\",\"name\":\"mem }},{{\",\"pid\":7,\"ts\":{ts},\"args\":{{\"bytes\":{i},\"k }},{{\":2}}}}"
            ),
            1 => write!(
                s,
                "{{\"ph\":\"s\",\"id\":\"flow-{i}\",\"pid\":7,\"tid\":\"worker }},{{ a\",\"ts\":{ts}}}"
            ),
            2 => write!(
                s,
                "{{\"ph\":\"X\",\"name\":\"{name}\",\"cat\":\"gpu\",\"pid\":0,\"tid\":1,\"ts\":{ts},\"dur\":1.0,\"args\":{{\"step\":{},\"shapes\":[{{\"x\":[1]}},{{\"y\":\"}},{{\"}}]}}}}",
                i / 10
            ),
            3 => write!(s, "{{\"ph\":\"i\",\"name\":\"{name}\",\"pid\":7,\"ts\":{ts}}}"),
            _ => write!(
                s,
                "{{\"ph\":\"X\",\"name\":\"{name}\",\"cat\":\"cpu\",\"pid\":7,\"tid\":\"worker }},{{ a\",\"ts\":{ts},\"dur\":{},\"bind_id\":{i},\"flow_out\":true,\"args\":{{\"wait_us\":{i}}}}}",
                if i % 3 == 0 { 20.0 } else { 0.5 }
            ),
        }
        .unwrap();
        if i + 1 < events {
            s.push_str(sep);
        }
    }
    s.push_str("\n],\n\"tail\":{\"x\":[{\"a\":1},{\"b\":2}]}}\n");
    s
}

fn load_with(path: &Path, threads: usize) -> Result<Trace, LoadError> {
    load(
        path,
        &LoadOptions {
            progress: false,
            threads,
            min_part_bytes: 1,
        },
    )
}

fn same(a: &Trace, b: &Trace) {
    assert!(a.spans.equals_missing(&b.spans), "{}\n{}", a.spans, b.spans);
    assert!(a.counters.equals_missing(&b.counters));
    assert!(a.flows.equals_missing(&b.flows), "{}\n{}", a.flows, b.flows);
    assert!(a.threads.equals_missing(&b.threads));
    assert_eq!(a.top, b.top);
    assert_eq!(a.stats.events, b.stats.events);
    assert_eq!(a.stats.json_bytes, b.stats.json_bytes);
    let w = |t: &Trace| t.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    assert_eq!(w(a), w(b));
}

#[test]
fn parts_load_like_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    std::fs::write(&path, tricky_trace(400)).unwrap();
    let one = load_with(&path, 1).unwrap();
    assert!(one.spans.height() > 100);
    for threads in 2..=13 {
        let many = load_with(&path, threads).unwrap();
        same(&one, &many);
    }
}

/// Spans of a random tree per track: (tid, ts, dur, name). Durations are distinct and
/// children sit strictly inside their parent, so nesting is unambiguous.
fn random_tree(seed: u64) -> Vec<(u32, f64, f64, String)> {
    let mut x = seed;
    let mut rand = move |n: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % n
    };
    let mut spans = Vec::new();
    fn fill(
        spans: &mut Vec<(u32, f64, f64, String)>,
        rand: &mut dyn FnMut(u64) -> u64,
        tid: u32,
        from: f64,
        to: f64,
        level: u32,
    ) {
        let mut t = from + 1.0 + rand(5) as f64;
        while level < 4 && t + 12.0 < to - 1.0 {
            let len = (6 + rand(40)) as f64 + 0.001 * rand(997) as f64;
            let end = (t + len).min(to - 1.0);
            spans.push((tid, t, end - t, format!("s{level}.{}", rand(3))));
            fill(spans, rand, tid, t, end, level + 1);
            t = end + 1.0 + rand(4) as f64;
        }
    }
    for tid in 1..=2 {
        for step in 0..6u32 {
            let from = step as f64 * 400.0;
            spans.push((tid, from, 390.0, format!("ProfilerStep#{step}")));
            fill(&mut spans, &mut rand, tid, from, from + 390.0, 0);
        }
    }
    spans
}

#[test]
fn nesting_does_not_depend_on_file_order() {
    let spans = random_tree(7);
    assert!(spans.len() > 100);
    // Independently: the parent is the innermost span of the track that contains it.
    let contains = |o: &(u32, f64, f64, String), s: &(u32, f64, f64, String)| {
        o.0 == s.0 && o.1 <= s.1 && s.1 + s.2 <= o.1 + o.2 && o.2 > s.2
    };
    // (tid, ts, depth, parent's ts, step) per span.
    type Row = (u32, String, u32, Option<String>, Option<i64>);
    let mut want: Vec<Row> = spans
        .iter()
        .map(|s| {
            let outer: Vec<_> = spans.iter().filter(|o| contains(o, s)).collect();
            let parent = outer.iter().min_by(|a, b| a.2.total_cmp(&b.2));
            let step = outer
                .iter()
                .chain(std::iter::once(&s))
                .find_map(|o| o.3.strip_prefix("ProfilerStep#"))
                .map(|n| n.parse().unwrap());
            (
                s.0,
                format!("{:.3}", s.1),
                outer.len() as u32,
                parent.map(|p| format!("{:.3}", p.1)),
                step,
            )
        })
        .collect();
    want.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));

    let by_start = {
        let mut v = spans.clone();
        v.sort_by(|a, b| a.1.total_cmp(&b.1).then(b.2.total_cmp(&a.2)));
        v
    };
    let by_end = {
        let mut v = spans.clone();
        v.sort_by(|a, b| {
            (a.1 + a.2)
                .total_cmp(&(b.1 + b.2))
                .then(a.2.total_cmp(&b.2))
        });
        v
    };
    let shuffled = {
        let mut v = spans.clone();
        v.reverse();
        v.swap(3, 40);
        v
    };
    let dir = tempfile::tempdir().unwrap();
    for (label, order) in [("start", by_start), ("end", by_end), ("shuffled", shuffled)] {
        let mut text = String::from("[");
        for (k, (tid, ts, dur, name)) in order.iter().enumerate() {
            if k > 0 {
                text.push(',');
            }
            write!(
                text,
                "{{\"ph\":\"X\",\"cat\":\"cpu\",\"name\":\"{name}\",\"pid\":1,\"tid\":{tid},\"ts\":{ts:.3},\"dur\":{dur:.3}}}"
            )
            .unwrap();
        }
        text.push(']');
        let path = dir.path().join(format!("{label}.json"));
        std::fs::write(&path, text).unwrap();
        let t = load_with(&path, 1).unwrap();
        assert!(t.warnings.is_empty(), "{label}: {:?}", t.warnings);
        let df = &t.spans;
        let tid = df.column("tid").unwrap().i64().unwrap();
        let ts = df.column("ts").unwrap().f64().unwrap();
        let depth = df.column("depth").unwrap().u32().unwrap();
        let parent = df.column("parent").unwrap().u32().unwrap();
        let step = df.column("step").unwrap().i64().unwrap();
        let mut got: Vec<_> = (0..df.height())
            .map(|i| {
                (
                    tid.get(i).unwrap() as u32,
                    format!("{:.3}", ts.get(i).unwrap()),
                    depth.get(i).unwrap(),
                    parent
                        .get(i)
                        .map(|p| format!("{:.3}", ts.get(p as usize).unwrap())),
                    step.get(i),
                )
            })
            .collect();
        got.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        assert_eq!(got, want, "file in {label} order");
    }
}

#[test]
fn span_columns_are_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    std::fs::write(&path, tricky_trace(60)).unwrap();
    let t = load_with(&path, 1).unwrap();
    let got: Vec<(String, String)> = t
        .spans
        .columns()
        .iter()
        .map(|c| {
            let dtype = match c.dtype() {
                DataType::Enum(..) => "Enum".to_string(),
                other => format!("{other:?}"),
            };
            (c.name().to_string(), dtype)
        })
        .collect();
    let want: Vec<(String, String)> = SPAN_COLUMNS
        .iter()
        .map(|(name, what)| {
            let dtype = what.rsplit("; ").next().unwrap();
            (name.to_string(), dtype.to_string())
        })
        .collect();
    assert_eq!(got, want);
}

#[test]
fn parts_of_a_bare_array() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let t = tricky_trace(200);
    let from = t.find("\"traceEvents\":").unwrap() + "\"traceEvents\":".len();
    let to = t.rfind(']').unwrap() + 1;
    std::fs::write(&path, &t[from..to]).unwrap();
    let one = load_with(&path, 1).unwrap();
    for threads in 2..=9 {
        same(&one, &load_with(&path, threads).unwrap());
    }
}

#[test]
fn parts_of_a_truncated_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let t = tricky_trace(300);
    for cut in [t.len() / 2, t.len() * 3 / 4 + 7, t.len() - 40] {
        std::fs::write(&path, &t[..cut]).unwrap();
        let one = load_with(&path, 1).unwrap();
        assert!(one
            .warnings
            .iter()
            .any(|w| matches!(w, Warning::Truncated { .. })));
        for threads in 2..=7 {
            same(&one, &load_with(&path, threads).unwrap());
        }
    }
}

#[test]
fn parts_count_skipped_events_with_their_global_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.json");
    let t = tricky_trace(300);
    // Two bad events late in the file: both skipped, the first one named.
    let mut bad = t.clone();
    let at = bad.rfind("\"dur\":1.0").unwrap();
    bad.replace_range(at..at + 9, "\"dur\":-1.0");
    let at = bad[..at].rfind("\"dur\":1.0").unwrap();
    bad.replace_range(at..at + 9, "\"dur\":\"x\"");
    std::fs::write(&path, &bad).unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, &t).unwrap();
    let spans = load_with(&good, 1).unwrap().spans.height();
    let one = load_with(&path, 1).unwrap();
    assert_eq!(one.spans.height(), spans - 2);
    let skipped = &one.stats.skipped;
    let dur = skipped
        .iter()
        .find(|s| s.reason == SkipReason::BadDuration)
        .unwrap();
    assert_eq!(dur.count, 2);
    assert!(
        dur.example.contains("field `dur` must be a number"),
        "{skipped:?}"
    );
    // The event index counts from the start of the file, as a one-part scan sees it.
    let index = bad[..at].matches("\"ph\"").count() as u64 - 1;
    assert_eq!(dur.first_event, index);
    // The other skips are the instant events the trace holds, unused.
    let instants = bad.matches("\"ph\":\"i\"").count() as u64;
    assert!(skipped.iter().all(|s| s.reason == SkipReason::BadDuration
        || (s.reason == SkipReason::UnusedPhase && s.count == instants)));
    for threads in 2..=9 {
        let many = load_with(&path, threads).unwrap();
        assert_eq!(&many.stats.skipped, skipped, "{threads} threads");
        assert_eq!(many.spans.height(), spans - 2);
    }
}

#[test]
fn boundaries_need_a_closing_brace_and_a_comma() {
    assert_eq!(event_boundary(b"1},{\"a\""), Some(3));
    assert_eq!(event_boundary(b" } ,\n {"), Some(6));
    assert_eq!(event_boundary(b"1,{},2"), None);
    assert_eq!(event_boundary(b"},"), None);
}
