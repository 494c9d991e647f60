//! Helpers of the recorder's integration tests: a recorder configuration, reading a
//! (possibly truncated or gzipped) trace back, and checks every trace must pass.
#![allow(dead_code)]
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;
use trace_recorder::RecorderConfig;

/// The recorder is process-global, so every test that starts one holds this.
pub static LOCK: Mutex<()> = Mutex::new(());

pub fn lock() -> MutexGuard<'static, ()> {
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn config(path: &Path) -> RecorderConfig {
    RecorderConfig {
        path: path.to_path_buf(),
        metadata: serde_json::json!({"producer": "test", "config": {"lr": 1e-4}}),
        process_name: "test trainer".into(),
        ..Default::default()
    }
}

/// Copies the trace to `$TRACE_TEST_OUT/<name>` when set, for checking by hand.
pub fn keep(path: &Path, name: &str) {
    if let Ok(dir) = std::env::var("TRACE_TEST_OUT") {
        let _ = std::fs::copy(path, Path::new(&dir).join(name));
    }
}

pub fn read(path: &Path) -> Vec<u8> {
    let raw = std::fs::read(path).expect("trace file");
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        // A truncated gzip stream is read up to the cut.
        let _ = flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut out);
        out
    } else {
        raw
    }
}

pub fn parse(path: &Path) -> Value {
    serde_json::from_slice(&read(path)).expect("trace is valid JSON")
}

pub fn events(doc: &Value) -> &Vec<Value> {
    doc["traceEvents"].as_array().expect("traceEvents array")
}

pub fn ns(v: &Value) -> i64 {
    (v.as_f64().expect("number") * 1000.0).round() as i64
}

/// Lenient reader of a possibly truncated trace: the events of `traceEvents` that are
/// complete, each with the offset just past it.
pub fn lenient_events(bytes: &[u8]) -> Vec<(Value, usize)> {
    let key = b"\"traceEvents\":[";
    let Some(start) = bytes.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let mut pos = start + key.len();
    let mut out = Vec::new();
    loop {
        while pos < bytes.len() && (bytes[pos].is_ascii_whitespace() || bytes[pos] == b',') {
            pos += 1;
        }
        if pos >= bytes.len() || bytes[pos] == b']' {
            break;
        }
        let mut it = serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => {
                pos += it.byte_offset();
                out.push((v, pos));
            }
            _ => break,
        }
    }
    out
}

pub type Track = (i64, i64);

/// X events per (pid, tid) in file order.
pub fn tracks(evs: &[Value]) -> BTreeMap<Track, Vec<&Value>> {
    let mut m: BTreeMap<Track, Vec<&Value>> = BTreeMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "X") {
        m.entry((e["pid"].as_i64().unwrap(), e["tid"].as_i64().unwrap()))
            .or_default()
            .push(e);
    }
    m
}

/// No two X events of a track partially overlap; ends are non-decreasing in file order.
pub fn assert_tracks_valid(evs: &[Value]) {
    for (key, list) in tracks(evs) {
        let mut last_end = i64::MIN;
        for e in &list {
            let end = ns(&e["ts"]) + ns(&e["dur"]);
            assert!(end >= last_end, "track {key:?}: ends go back at {e}");
            last_end = end;
        }
        let mut iv: Vec<(i64, i64, &Value)> = list
            .iter()
            .map(|e| (ns(&e["ts"]), ns(&e["ts"]) + ns(&e["dur"]), *e))
            .collect();
        iv.sort_by_key(|&(s, e, _)| (s, std::cmp::Reverse(e)));
        let mut stack: Vec<i64> = Vec::new();
        for (s, e, ev) in iv {
            while stack.last().is_some_and(|&top| top <= s) {
                stack.pop();
            }
            if let Some(&top) = stack.last() {
                assert!(
                    e <= top,
                    "track {key:?}: {ev} overlaps its parent (ends {top})"
                );
            }
            stack.push(e);
        }
    }
}

pub fn names_of(evs: &[Value], pid: i64) -> (Option<String>, HashMap<i64, String>) {
    let mut process = None;
    let mut threads = HashMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "M" && e["pid"] == pid) {
        let n = e["args"]["name"].as_str().map(String::from);
        match e["name"].as_str() {
            Some("process_name") => process = n,
            Some("thread_name") => {
                threads.insert(e["tid"].as_i64().unwrap(), n.unwrap_or_default());
            }
            _ => {}
        }
    }
    (process, threads)
}

pub fn x_named<'a>(evs: &'a [Value], name: &str) -> Vec<&'a Value> {
    evs.iter()
        .filter(|e| e["ph"] == "X" && e["name"] == name)
        .collect()
}
