//! A run directory traced in segments (`trace.json`, then `trace.N.json[.gz]` per
//! `--resume --trace`) loads as one trace on the first segment's clock. Every expectation
//! is computed from each file loaded on its own.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use chrome_trace_format::{Category, DistributedInfo, EventWriter, Header, Meta, Span, Text};
use common::*;
use dflash_analyze::breakdown::breakdown;
use dflash_analyze::load::{self, f64_column};
use dflash_analyze::synth::{self, SynthSpec};
use dflash_analyze::warning::Warning;
use dflash_analyze::{LoadError, LoadOptions, Trace};
use polars::prelude::*;
use predicates::prelude::*;

const B0: u128 = 1_764_750_000_123_456_789;

fn opts() -> LoadOptions {
    LoadOptions {
        progress: false,
        threads: 2,
        // Several parts per uncompressed file, as a large trace has.
        min_part_bytes: 1 << 14,
    }
}

fn try_load(p: &Path) -> Result<Trace, LoadError> {
    load::load(p, &opts())
}

fn load_ok(p: &Path) -> Trace {
    try_load(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn spec(seed: u64, first_step: u32, steps: u32, base_time_ns: u128) -> SynthSpec {
    SynthSpec {
        seed,
        first_step,
        steps,
        base_time_ns,
        ..SynthSpec::default()
    }
}

/// Writes `text` to `dir/name`, gzipped when the name ends in `.gz`.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    if name.ends_with(".gz") {
        let f = std::fs::File::create(&path).unwrap();
        let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
        gz.write_all(text.as_bytes()).unwrap();
        gz.finish().unwrap();
    } else {
        std::fs::write(&path, text).unwrap();
    }
    path
}

/// A synthetic trace without its `baseTimeNanoseconds`.
fn without_base(spec: &SynthSpec) -> String {
    let text = synth::trace_string(spec);
    let key = format!("\"baseTimeNanoseconds\":{},", spec.base_time_ns);
    assert!(text.contains(&key), "the header spells the key as expected");
    text.replacen(&key, "", 1)
}

/// One span row: name, pid, tid, ts, dur, step.
#[derive(Debug, Clone, PartialEq)]
struct Row {
    name: String,
    pid: i64,
    tid: i64,
    ts: f64,
    dur: f64,
    step: Option<i64>,
}

fn strings(df: &DataFrame, col: &str) -> Vec<String> {
    df.column(col)
        .unwrap()
        .cast(&DataType::String)
        .unwrap()
        .str()
        .unwrap()
        .iter()
        .map(|v| v.unwrap_or_default().to_string())
        .collect()
}

fn i64s(df: &DataFrame, col: &str) -> Vec<Option<i64>> {
    df.column(col).unwrap().i64().unwrap().iter().collect()
}

fn rows(t: &Trace) -> Vec<Row> {
    let s = &t.spans;
    let names = strings(s, "name");
    let (pid, tid, step) = (i64s(s, "pid"), i64s(s, "tid"), i64s(s, "step"));
    let ts = f64_column(s, "ts").unwrap();
    let dur = f64_column(s, "dur").unwrap();
    (0..s.height())
        .map(|i| Row {
            name: names[i].clone(),
            pid: pid[i].unwrap(),
            tid: tid[i].unwrap(),
            ts: ts[i].unwrap(),
            dur: dur[i].unwrap(),
            step: step[i],
        })
        .collect()
}

/// The first start and the last end of a trace's spans, counters and flows.
fn extent(t: &Trace) -> (f64, f64) {
    let ts = |df: &DataFrame| -> Vec<f64> {
        f64_column(df, "ts")
            .unwrap()
            .into_iter()
            .flatten()
            .collect()
    };
    let (span_ts, dur) = (ts(&t.spans), f64_column(&t.spans, "dur").unwrap());
    let points: Vec<f64> = ts(&t.counters).into_iter().chain(ts(&t.flows)).collect();
    let first = span_ts
        .iter()
        .chain(&points)
        .copied()
        .fold(f64::INFINITY, f64::min);
    let last = span_ts
        .iter()
        .zip(dur)
        .map(|(t, d)| t + d.unwrap())
        .chain(points)
        .fold(f64::NEG_INFINITY, f64::max);
    (first, last)
}

fn step_count(t: &Trace) -> u64 {
    breakdown(t).unwrap().steps.count
}

/// Asserts that `got` is `alone`'s rows moved by `shift_us`, in order.
fn assert_shifted(got: &[Row], alone: &[Row], shift_us: f64) {
    assert_eq!(got.len(), alone.len());
    for (g, a) in got.iter().zip(alone) {
        let want = Row {
            ts: a.ts + shift_us,
            ..a.clone()
        };
        assert!((g.ts - want.ts).abs() < 1e-6, "{g:?} vs {want:?}");
        assert_eq!(
            Row {
                ts: want.ts,
                ..g.clone()
            },
            want
        );
    }
}

fn segment_warnings(t: &Trace) -> Vec<&Warning> {
    t.warnings
        .iter()
        .filter(|w| {
            matches!(
                w,
                Warning::Segment { .. }
                    | Warning::SegmentPlaced { .. }
                    | Warning::SegmentsOverlap { .. }
                    | Warning::RepeatedSteps { .. }
            )
        })
        .collect()
}

#[test]
fn segments_join_in_order_on_the_first_segments_clock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let bases = [B0, B0 + 90_000_000_123, B0 + 200_000_500_000];
    let files = [
        write(
            &dir,
            "trace.json",
            &synth::trace_string(&spec(1, 0, 6, bases[0])),
        ),
        write(
            &dir,
            "trace.1.json.gz",
            &synth::trace_string(&spec(2, 6, 5, bases[1])),
        ),
        write(
            &dir,
            "trace.2.json",
            &synth::trace_string(&spec(3, 11, 4, bases[2])),
        ),
    ];
    let alone: Vec<Trace> = files.iter().map(|f| load_ok(f)).collect();
    let t = load_ok(&dir);

    assert_eq!(t.run, "r");
    assert_eq!(t.path, dir);
    assert_eq!(t.stats.segments, files);
    assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    let got = rows(&t);
    let mut from = 0;
    for (a, base) in alone.iter().zip(bases) {
        let want = rows(a);
        let shift_us = (base - bases[0]) as f64 / 1e3;
        assert_shifted(&got[from..from + want.len()], &want, shift_us);
        from += want.len();
    }
    assert_eq!(from, got.len());
    let sum = |f: fn(&Trace) -> u64| alone.iter().map(f).sum::<u64>();
    assert_eq!(t.stats.events, sum(|a| a.stats.events));
    assert_eq!(t.stats.file_bytes, sum(|a| a.stats.file_bytes));
    assert_eq!(
        t.counters.height() as u64,
        sum(|a| a.counters.height() as u64)
    );
    // Same pid and tids in every segment: the same tracks.
    assert!(t.threads.equals_missing(&alone[0].threads), "{}", t.threads);

    // Every step of every segment counts, each once.
    assert_eq!(step_count(&t), 15);
    assert_eq!(step_count(&t), alone.iter().map(step_count).sum::<u64>());

    // Each process numbers its flows from 1; joined, no two segments share an id.
    let dirs = strings(&t.flows, "dir");
    let ids: Vec<u64> = t
        .flows
        .column("id")
        .unwrap()
        .u64()
        .unwrap()
        .into_no_null_iter()
        .collect();
    let mut outs: Vec<u64> = ids
        .iter()
        .zip(&dirs)
        .filter(|(_, d)| *d == "out")
        .map(|(i, _)| *i)
        .collect();
    let n = outs.len();
    assert_eq!(n as u64, sum(|a| a.flows.height() as u64) / 2);
    outs.sort();
    outs.dedup();
    assert_eq!(outs.len(), n, "flow ids collide across segments");
}

#[test]
fn a_resumed_trainer_with_a_new_pid_stays_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let first = write(&dir, "trace.json", &synth::trace_string(&spec(1, 0, 5, B0)));
    let later = SynthSpec {
        pid: 777,
        ..spec(2, 5, 5, B0 + 60_000_000_000)
    };
    let second = write(&dir, "trace.1.json", &synth::trace_string(&later));
    let (a, b) = (load_ok(&first), load_ok(&second));
    let t = load_ok(&dir);
    assert!(
        t.threads.equals_missing(&a.threads),
        "{}\n{}",
        t.threads,
        a.threads
    );
    let got = rows(&t);
    let moved: Vec<Row> = rows(&b)
        .into_iter()
        .map(|r| Row {
            pid: if r.pid == 777 { 4242 } else { r.pid },
            ..r
        })
        .collect();
    assert_shifted(&got[a.spans.height()..], &moved, 60_000_000.0);
    assert!(i64s(&t.counters, "pid").iter().all(|p| *p == Some(4242)));
    assert_eq!(step_count(&t), step_count(&a) + step_count(&b));
}

/// A trace of one process `pid` named "trainer" with `threads` (tid, name) and one span
/// per thread, named after it.
fn tiny(pid: u32, threads: &[(u32, &str)], base_time_ns: u128) -> String {
    let mut w = EventWriter::new();
    w.meta(&Meta::ProcessName {
        pid,
        name: "trainer",
    });
    for &(tid, name) in threads {
        w.meta(&Meta::ThreadName { pid, tid, name });
        w.span(&Span {
            cat: Category::Cpu,
            name: Text::Plain(name),
            pid,
            tid,
            ts_ns: 1_000 * tid as u64,
            dur_ns: 500,
            bind: None,
            args: &[],
        });
    }
    w.finish();
    let header = Header {
        base_time_ns,
        distributed: &DistributedInfo::default(),
        devices: &[],
        metadata: &serde_json::Map::new(),
    };
    header.to_json().unwrap() + w.as_str()
}

#[test]
fn threads_of_a_new_process_join_the_earlier_threads_of_their_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    write(&dir, "trace.json", &tiny(100, &[(1, "a"), (2, "b")], B0));
    // The resumed process registered its threads the other way round, and has a third.
    let later = tiny(200, &[(1, "b"), (2, "a"), (3, "c")], B0 + 1_000_000);
    write(&dir, "trace.1.json", &later);
    let t = load_ok(&dir);
    let tracks: Vec<(i64, i64, String)> = i64s(&t.threads, "pid")
        .into_iter()
        .zip(i64s(&t.threads, "tid"))
        .zip(strings(&t.threads, "track"))
        .map(|((p, t), n)| (p.unwrap(), t.unwrap(), n))
        .collect();
    assert_eq!(
        tracks,
        [
            (100, 1, "a".into()),
            (100, 2, "b".into()),
            (100, 3, "c".into())
        ]
    );
    let got: Vec<(String, i64, i64)> = rows(&t)
        .into_iter()
        .map(|r| (r.name, r.pid, r.tid))
        .collect();
    let want = [("a", 1), ("b", 2), ("b", 2), ("a", 1), ("c", 3)];
    assert_eq!(got, want.map(|(n, tid)| (n.to_string(), 100, tid)));
}

#[test]
fn a_segment_without_a_base_time_follows_the_one_before() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let first = write(&dir, "trace.json", &synth::trace_string(&spec(1, 0, 5, B0)));
    let later = spec(2, 5, 5, B0 + 3_600_000_000_000);
    let second = write(&dir, "trace.1.json", &without_base(&later));
    let (a, b) = (load_ok(&first), load_ok(&second));
    assert!(!b.top.contains_key("baseTimeNanoseconds"));
    let t = load_ok(&dir);
    let shift_us = extent(&a).1 - extent(&b).0;
    assert_shifted(&rows(&t)[a.spans.height()..], &rows(&b), shift_us);
    let placed: Vec<&Warning> = segment_warnings(&t);
    assert_eq!(placed.len(), 1, "{placed:?}");
    let Warning::SegmentPlaced {
        file,
        missing,
        at_us,
    } = placed[0]
    else {
        panic!("{placed:?}")
    };
    assert_eq!(
        (file.as_str(), missing.as_str()),
        ("trace.1.json", "trace.1.json")
    );
    assert!((at_us - extent(&a).1).abs() < 1e-6, "{at_us}");
    assert!(placed[0].to_string().contains("no `baseTimeNanoseconds`"));
    assert_eq!(step_count(&t), 10);
}

#[test]
fn a_corrupt_later_segment_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let bad_gz = tmp.path().join("gz");
    write(
        &bad_gz,
        "trace.json",
        &synth::trace_string(&spec(1, 0, 3, B0)),
    );
    // A gzip header, then a deflate block of the reserved type 3, which does not inflate.
    let mut bytes = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 0x07];
    bytes.extend((0u8..200).map(|i| i.wrapping_mul(37) ^ 0xA5));
    std::fs::write(bad_gz.join("trace.1.json.gz"), bytes).unwrap();

    let not_json = tmp.path().join("text");
    write(
        &not_json,
        "trace.json",
        &synth::trace_string(&spec(1, 0, 3, B0)),
    );
    write(
        &not_json,
        "trace.1.json",
        &synth::trace_string(&spec(2, 3, 3, B0 + 1_000_000_000)),
    );
    write(&not_json, "trace.2.json", "this is not a trace\n");

    for (dir, file) in [(&bad_gz, "trace.1.json.gz"), (&not_json, "trace.2.json")] {
        let err = match try_load(dir) {
            Ok(_) => panic!("{} loaded", dir.display()),
            Err(e) => e,
        };
        assert!(err.is_bad_input(), "{err:?}");
        assert!(
            err.to_string()
                .contains(&dir.join(file).display().to_string()),
            "{err}"
        );
        let out = bin().arg("breakdown").arg(dir).output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(file),
            "{stderr}"
        );
    }
}

#[test]
fn a_truncated_later_segment_loads_with_a_warning_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    write(&dir, "trace.json", &synth::trace_string(&spec(1, 0, 4, B0)));
    let text = synth::trace_string(&spec(2, 4, 4, B0 + 1_000_000_000));
    let cut = write(&dir, "trace.1.json", &text[..text.len() * 2 / 3]);
    let t = load_ok(&dir);
    let alone = load_ok(&cut);
    assert!(alone
        .warnings
        .iter()
        .any(|w| matches!(w, Warning::Truncated { .. })));
    let named = segment_warnings(&t);
    assert!(
        matches!(named.as_slice(), [Warning::Segment { file, inner }]
            if file == "trace.1.json" && matches!(**inner, Warning::Truncated { .. })),
        "{named:?}"
    );
    bin()
        .arg("breakdown")
        .arg(&dir)
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "trace.1.json: the trace is truncated",
        ));
}

#[test]
fn steps_traced_again_after_a_resume_count_once_from_the_later_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    // Killed after step 7 with the last checkpoint at step 5: steps 5..=7 run again.
    let first = write(&dir, "trace.json", &synth::trace_string(&spec(1, 0, 8, B0)));
    let later = spec(2, 5, 6, B0 + 600_000_000_000);
    let second = write(&dir, "trace.1.json", &synth::trace_string(&later));
    let (a, b) = (load_ok(&first), load_ok(&second));
    let t = load_ok(&dir);
    assert_eq!(step_count(&t), 11);
    let got = rows(&t);
    let (early, late) = got.split_at(a.spans.height());
    for (g, w) in early.iter().zip(rows(&a)) {
        let want = w.step.filter(|s| !(5..=7).contains(s));
        assert_eq!(g.step, want, "{g:?}");
    }
    assert!(rows(&a).iter().any(|r| r.step == Some(6)));
    assert_shifted(late, &rows(&b), 600_000_000.0);
    let w = segment_warnings(&t);
    assert_eq!(
        w,
        [&Warning::RepeatedSteps {
            file: "trace.json".into(),
            later: "trace.1.json".into(),
            steps: 3,
            first: 5,
            last: 7,
        }]
    );
}

#[test]
fn overlapping_segments_warn_once_and_still_load() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    for (k, name) in ["trace.json", "trace.1.json", "trace.2.json"]
        .iter()
        .enumerate()
    {
        let s = spec(k as u64 + 1, 4 * k as u32, 4, B0 + 1_000 * k as u128);
        write(&dir, name, &synth::trace_string(&s));
    }
    let t = load_ok(&dir);
    let w = segment_warnings(&t);
    assert!(
        matches!(w.as_slice(), [Warning::SegmentsOverlap { file, previous, count: 2, .. }]
            if file == "trace.1.json" && previous == "trace.json"),
        "{w:?}"
    );
    assert_eq!(step_count(&t), 12);
    let out = bin().arg("breakdown").arg(&dir).output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        stderr.matches("ends on the shared clock").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn one_trace_file_loads_as_before() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let file = write(&dir, "trace.json", &synth::trace_string(&spec(1, 0, 5, B0)));
    // Segment 0 twice: `trace.json` is read, as before, and the `.gz` beside it is not.
    write(
        &dir,
        "trace.json.gz",
        &synth::trace_string(&spec(9, 0, 2, B0)),
    );
    let from_dir = load_ok(&dir);
    let from_file = load_ok(&file);
    for t in [&from_dir, &from_file] {
        assert_eq!(t.path, file);
        assert_eq!(t.run, "r");
        assert_eq!(t.stats.segments, std::slice::from_ref(&file));
        assert!(t.warnings.is_empty(), "{:?}", t.warnings);
    }
    assert!(from_dir.spans.equals_missing(&from_file.spans));
    assert!(from_dir.counters.equals_missing(&from_file.counters));
    assert!(from_dir.flows.equals_missing(&from_file.flows));
    assert!(from_dir.threads.equals_missing(&from_file.threads));
    assert_eq!(from_dir.top, from_file.top);
    assert_eq!(step_count(&from_dir), 5);

    // A file outside any run directory is itself, with its own clock.
    let lone = write(
        tmp.path(),
        "lone.json",
        &synth::trace_string(&spec(1, 0, 5, B0 + 7)),
    );
    let t = load_ok(&lone);
    assert_eq!((t.path.as_path(), t.run.as_str()), (lone.as_path(), "lone"));
    assert_eq!(rows(&t), rows(&from_file));
}

#[test]
fn info_lists_the_segment_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = run_dir(tmp.path(), "r", &spec(1, 0, 3, B0));
    let one = json_of(bin().args(["info", "--json"]).arg(&dir));
    assert_eq!(one["segments"], serde_json::json!([dir.join("trace.json")]));
    bin()
        .arg("info")
        .arg(&dir)
        .assert()
        .success()
        .stdout(predicate::str::contains(" of 1").not());

    let gz = write(
        &dir,
        "trace.1.json.gz",
        &synth::trace_string(&spec(2, 3, 3, B0 + 60_000_000_000)),
    );
    let two = json_of(bin().args(["info", "--json"]).arg(&dir));
    assert_eq!(
        two["segments"],
        serde_json::json!([dir.join("trace.json"), gz])
    );
    let total = one["events"].as_u64().unwrap() + load_ok(&gz).stats.events;
    assert_eq!(two["events"].as_u64(), Some(total));
    bin()
        .arg("info")
        .arg(&dir)
        .assert()
        .success()
        .stdout(predicate::str::contains(format!(
            "file 2 of 2: {}",
            gz.display()
        )));
}
