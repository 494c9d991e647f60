//! The files of a run directory, shared by the trainer (which writes them) and any
//! reader.
//!
//! A run directory holds `config.toml`, `metrics.jsonl`, `summary.json`, `checkpoints/`,
//! `drafter/`, the lock file `.lock`, and with `--trace` one trace file per traced
//! segment of the run: the first run writes `trace.json`, each `--resume` with `--trace`
//! writes the next free `trace.N.json` (N = 1, 2, ...), so nothing earlier is
//! overwritten. `--trace-gzip` appends `.gz`. Read them in segment order:
//! [`trace_files`]. Each segment's `ts` count from its own process's time zero; a reader
//! that joins them puts a later segment on the first one's clock by the difference of
//! their `baseTimeNanoseconds` (`dflash-analyze` does).
use std::path::{Path, PathBuf};

pub const CONFIG: &str = "config.toml";
pub const METRICS: &str = "metrics.jsonl";
pub const SUMMARY: &str = "summary.json";
pub const CHECKPOINTS: &str = "checkpoints";
pub const DRAFTER: &str = "drafter";
pub const FIDELITY: &str = "fidelity.json";
/// Held (`flock`) by the process that trains in the directory; holds its pid.
pub const LOCK: &str = ".lock";

pub const TRACE_JSON: &str = "trace.json";
pub const TRACE_JSON_GZ: &str = "trace.json.gz";
/// The trace's names, in the order a reader looks for them in a run directory.
pub const TRACE_FILES: [&str; 2] = [TRACE_JSON, TRACE_JSON_GZ];

/// Where a run's first segment writes its trace.
pub fn trace_path(run_dir: &Path, gzip: bool) -> PathBuf {
    run_dir.join(trace_file_name(0, gzip))
}

/// The trace of a run directory: `trace.json`, else `trace.json.gz`; `None` when it
/// holds neither.
pub fn find_trace(run_dir: &Path) -> Option<PathBuf> {
    TRACE_FILES
        .iter()
        .map(|name| run_dir.join(name))
        .find(|p| p.is_file())
}

/// The run label of an input path: `runs/a/trace.json` and `runs/a` are both "a"; any
/// other file is its name without `.json`/`.gz`.
pub fn run_label(input: &Path) -> String {
    let p = if input.is_dir() {
        input
    } else {
        let name = input.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(TRACE_JSON) {
            input.parent().unwrap_or(input)
        } else {
            input
        }
    };
    let name = p
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("run")
        .to_string();
    name.trim_end_matches(".gz")
        .trim_end_matches(".json")
        .to_string()
}

/// The trace file of segment `segment` (0: the run's first): `trace.json`,
/// `trace.1.json`, ... with `.gz` when compressed.
pub fn trace_file_name(segment: u32, gzip: bool) -> String {
    let gz = if gzip { ".gz" } else { "" };
    if segment == 0 {
        format!("trace.json{gz}")
    } else {
        format!("trace.{segment}.json{gz}")
    }
}

/// The segment of a trace file name, and whether it is compressed; `None` if `name` is
/// not a trace file of a run directory.
pub fn trace_segment(name: &str) -> Option<(u32, bool)> {
    let (stem, gzip) = match name.strip_suffix(".gz") {
        Some(s) => (s, true),
        None => (name, false),
    };
    let mid = stem.strip_prefix("trace")?.strip_suffix(".json")?;
    if mid.is_empty() {
        return Some((0, gzip));
    }
    let n = mid.strip_prefix('.')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.starts_with('0') {
        return None;
    }
    Some((n.parse().ok()?, gzip))
}

/// The trace files of a run directory in segment order (an unreadable directory has
/// none).
pub fn trace_files(run_dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir(run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let (seg, _) = trace_segment(name.to_str()?)?;
            Some((seg, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, p)| p).collect()
}

/// The segment a new trace of this run directory gets: one past the last existing one.
pub fn next_trace_segment(run_dir: &Path) -> u32 {
    trace_files(run_dir)
        .iter()
        .filter_map(|p| trace_segment(p.file_name()?.to_str()?))
        .map(|(s, _)| s + 1)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_dir_resolves_to_its_trace_json_first() {
        let tmp = std::env::temp_dir().join(format!("trace-format-run-dir-{}", std::process::id()));
        let run = tmp.join("a");
        std::fs::create_dir_all(&run).unwrap();
        assert_eq!(find_trace(&run), None);
        std::fs::write(run.join("trace.json.gz"), b"").unwrap();
        assert_eq!(find_trace(&run), Some(run.join("trace.json.gz")));
        std::fs::write(trace_path(&run, false), b"").unwrap();
        assert_eq!(find_trace(&run), Some(run.join("trace.json")));
        assert_eq!(run_label(&run), "a");
        assert_eq!(run_label(&run.join("trace.json.gz")), "a");
        assert_eq!(
            run_label(Path::new("x/kineto.pt.trace.json")),
            "kineto.pt.trace"
        );
        assert_eq!(run_label(Path::new("x/b.json.gz")), "b");
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn names_and_segments_round_trip() {
        for seg in [0, 1, 2, 10, 123] {
            for gz in [false, true] {
                assert_eq!(trace_segment(&trace_file_name(seg, gz)), Some((seg, gz)));
            }
        }
        assert_eq!(trace_file_name(0, false), "trace.json");
        assert_eq!(trace_file_name(3, true), "trace.3.json.gz");
        for bad in [
            "trace.json.tmp",
            "trace..json",
            "trace.01.json",
            "trace.x.json",
            "tracejson",
            "metrics.jsonl",
        ] {
            assert_eq!(trace_segment(bad), None, "{bad}");
        }
    }

    #[test]
    fn files_are_listed_in_segment_order_and_the_next_segment_follows_the_last() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(next_trace_segment(d.path()), 0);
        for n in [
            "trace.10.json",
            "trace.json",
            "trace.2.json.gz",
            "metrics.jsonl",
        ] {
            std::fs::write(d.path().join(n), "").unwrap();
        }
        let names: Vec<String> = trace_files(d.path())
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["trace.json", "trace.2.json.gz", "trace.10.json"]);
        assert_eq!(next_trace_segment(d.path()), 11);
    }
}
