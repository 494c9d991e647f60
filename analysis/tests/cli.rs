//! Command-line behaviour: compare verdicts and exit codes, bad and truncated input,
//! exports, plots and reports.

mod common;

use common::*;
use dflash_analyze::synth::SynthSpec;
use predicates::prelude::*;
use serde_json::Value;

fn flagged(v: &Value) -> Vec<(String, String)> {
    v["sections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["verdict"] == "regression" || s["verdict"] == "improvement")
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_string(),
                s["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn injected_regression_flags_exactly_that_section() {
    let tmp = tempfile::tempdir().unwrap();
    let a = run_dir(
        tmp.path(),
        "a",
        &SynthSpec {
            seed: 1,
            ..SynthSpec::default()
        },
    );
    let b = run_dir(
        tmp.path(),
        "b",
        &SynthSpec {
            seed: 2,
            scale: vec![("drafter.fc".into(), 1.2)],
            ..SynthSpec::default()
        },
    );
    let v = json_of(bin().args(["compare", "--json"]).arg(&a).arg(&b));
    let mut got = flagged(&v);
    got.sort();
    assert_eq!(
        got,
        vec![
            ("drafter.fc".into(), "cpu".into()),
            ("drafter.fc".into(), "gpu".into())
        ]
    );
    let fc = v["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "drafter.fc" && s["kind"] == "cpu")
        .unwrap();
    assert_eq!(fc["verdict"], "regression");
    let r = fc["ratio"].as_f64().unwrap();
    assert!((r - 1.2).abs() < 0.05, "{r}");
    assert!(fc["ci_low"].as_f64().unwrap() > 1.02);
    assert!(fc["p_value"].as_f64().unwrap() < 0.05);
    assert_eq!(fc["n_a"], 30);
    assert!(v["host_shift"].is_null());

    // Exit code 1 only with --fail-on-regression.
    bin().args(["compare"]).arg(&a).arg(&b).assert().code(0);
    bin()
        .args(["compare", "--fail-on-regression"])
        .arg(&a)
        .arg(&b)
        .assert()
        .code(1)
        .stdout(predicate::str::contains("drafter.fc (cpu) regressed"));
}

#[test]
fn null_pair_flags_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let a = run_dir(
        tmp.path(),
        "a",
        &SynthSpec {
            seed: 11,
            ..SynthSpec::default()
        },
    );
    let b = run_dir(
        tmp.path(),
        "b",
        &SynthSpec {
            seed: 12,
            ..SynthSpec::default()
        },
    );
    let v = json_of(bin().args(["compare", "--json"]).arg(&a).arg(&b));
    assert_eq!(flagged(&v), Vec::<(String, String)>::new());
    assert!(v["host_shift"].is_null());
    bin()
        .args(["compare", "--fail-on-regression"])
        .arg(&a)
        .arg(&b)
        .assert()
        .code(0);
}

#[test]
fn uniform_host_slowdown_is_one_verdict() {
    let tmp = tempfile::tempdir().unwrap();
    let a = run_dir(
        tmp.path(),
        "a",
        &SynthSpec {
            seed: 1,
            ..SynthSpec::default()
        },
    );
    let b = run_dir(
        tmp.path(),
        "b",
        &SynthSpec {
            seed: 2,
            host_factor: 1.5,
            ..SynthSpec::default()
        },
    );
    let v = json_of(bin().args(["compare", "--json"]).arg(&a).arg(&b));
    let f = v["host_shift"]["factor"].as_f64().expect("a host shift");
    assert!((f - 1.5).abs() < 0.05, "{f}");
    assert_eq!(v["regressions"], 0);
    for s in v["sections"].as_array().unwrap() {
        if s["kind"] == "cpu" && s["verdict"] == "regression" {
            assert_eq!(s["explained_by_host"], true, "{s}");
        }
        if s["kind"] == "gpu" {
            assert_eq!(s["verdict"], "unchanged", "{s}");
        }
    }
    bin()
        .args(["compare", "--fail-on-regression"])
        .arg(&a)
        .arg(&b)
        .assert()
        .code(0)
        .stdout(predicate::str::contains("the whole host ran slower (x1.5"));
}

#[test]
fn host_slowdown_plus_a_real_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let a = run_dir(
        tmp.path(),
        "a",
        &SynthSpec {
            seed: 1,
            ..SynthSpec::default()
        },
    );
    let b = run_dir(
        tmp.path(),
        "b",
        &SynthSpec {
            seed: 2,
            host_factor: 1.5,
            scale: vec![("drafter.backward".into(), 1.3)],
            ..SynthSpec::default()
        },
    );
    let v = json_of(bin().args(["compare", "--json"]).arg(&a).arg(&b));
    assert!(v["host_shift"].is_object());
    let bw = v["sections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "drafter.backward" && s["kind"] == "cpu")
        .unwrap();
    assert_eq!(bw["relative_verdict"], "regression", "{bw}");
    bin()
        .args(["compare", "--fail-on-regression"])
        .arg(&a)
        .arg(&b)
        .assert()
        .code(1);
}

fn bad(file: &str, needle: &str) {
    bin()
        .args(["breakdown"])
        .arg(fixture(&format!("bad/{file}")))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(needle))
        .stderr(predicate::str::contains("panicked").not());
}

/// A trace with an event the loader cannot use: the event is skipped, the rest loads, and
/// stderr says what was skipped in one line (and, with --verbose, the first of it).
fn skipped(file: &str, summary: &str, first: &str) {
    bin()
        .args(["breakdown", "--verbose"])
        .arg(fixture(&format!("bad/{file}")))
        .assert()
        .success()
        .stderr(predicate::str::contains(format!(
            "skipped 1 event it cannot use: 1 {summary}"
        )))
        .stderr(predicate::str::contains(first))
        .stderr(predicate::str::contains("panicked").not());
}

#[test]
fn malformed_inputs_give_clear_errors() {
    // Not a trace at all: exit 2.
    bad("empty.json", "the file is empty");
    bad("not_json.json", "byte 0: a trace is a JSON object");
    // A trace with odd events: they are skipped and counted.
    skipped(
        "wrong_type.json",
        "without a usable `ts`",
        "first: event 1, byte 87: is not usable: field `ts` must be a number, found a string",
    );
    skipped(
        "negative_dur.json",
        "without a usable `dur`",
        "first: event 1, byte 87: has a negative duration (-3.5 us)",
    );
    skipped(
        "nan_dur.json",
        "without a usable `dur`",
        "first: event 0, byte 17: has a duration of NaN",
    );
    skipped(
        "unknown_phase.json",
        "with an unknown `ph`",
        "first: event 1, byte 87: has an unknown phase `Q`",
    );
    skipped(
        "huge_value.json",
        "without a usable `dur`",
        "first: event 0, byte 17: has a duration of 1e300 us, more than 1e12 us",
    );
    skipped(
        "huge_pid.json",
        "with an unusable `pid`/`tid`",
        "first: event 0, byte 17: `pid` 1e20 is not an integer in -2^32..2^32",
    );
    skipped(
        "not_an_object.json",
        "not objects",
        "first: event 1, byte 87: is not an object: found `4`",
    );
    bin()
        .args(["breakdown", "/nonexistent/run"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no such file"));
    let tmp = tempfile::tempdir().unwrap();
    bin()
        .arg("breakdown")
        .arg(tmp.path())
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "neither trace.json nor trace.json.gz",
        ));
}

#[test]
fn truncated_traces_keep_complete_events_and_warn() {
    let full = std::fs::read(fixture("dflash_small.json")).unwrap();
    let all = json_of(
        bin()
            .args(["info", "--json"])
            .arg(fixture("dflash_small.json")),
    );
    let total = all["events"].as_u64().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    // Cut at many places: mid-event, between events, inside the header.
    let mut last = 0;
    for frac in [0.999, 0.9, 0.5, 0.2, 0.05] {
        let cut = (full.len() as f64 * frac) as usize;
        let p = tmp.path().join(format!("cut{cut}.json"));
        std::fs::write(&p, &full[..cut]).unwrap();
        let out = bin().args(["info", "--json"]).arg(&p).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("the trace is truncated"), "{err}");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let n = v["events"].as_u64().unwrap();
        assert!(n < total && (last == 0 || n <= last), "{n} {total}");
        last = n;
    }
    // Missing only the closing brackets: every event kept.
    let text = String::from_utf8(full).unwrap();
    let p = tmp.path().join("unclosed.json");
    std::fs::write(
        &p,
        text.trim_end()
            .trim_end_matches('}')
            .trim_end()
            .trim_end_matches(']'),
    )
    .unwrap();
    let v = json_of(bin().args(["info", "--json"]).arg(&p));
    assert_eq!(v["events"].as_u64().unwrap(), total);
    // The committed truncated fixture (gzip cut mid-stream) loads too.
    bin()
        .args(["breakdown"])
        .arg(fixture("dflash_truncated.json.gz"))
        .assert()
        .code(0)
        .stderr(predicate::str::contains("the trace is truncated"));
}

#[test]
fn gzip_and_plain_give_the_same_breakdown() {
    let plain = json_of(
        bin()
            .args(["breakdown", "--json"])
            .arg(fixture("dflash_small.json")),
    );
    let tmp = tempfile::tempdir().unwrap();
    let gz = tmp.path().join("trace.json.gz");
    let f = std::fs::File::create(&gz).unwrap();
    let mut enc = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
    std::io::Write::write_all(
        &mut enc,
        &std::fs::read(fixture("dflash_small.json")).unwrap(),
    )
    .unwrap();
    enc.finish().unwrap();
    let zipped = json_of(bin().args(["breakdown", "--json"]).arg(tmp.path()));
    assert_eq!(plain["sections"], zipped["sections"]);
}

/// `report RUN RUN` into `dir`; the page's text.
fn report_of(run: &std::path::Path, dir: &std::path::Path) -> String {
    let html = dir.join("r.html");
    bin()
        .args(["report", "--out"])
        .arg(&html)
        .arg(run)
        .arg(run)
        .assert()
        .success();
    std::fs::read_to_string(&html).unwrap()
}

#[test]
fn export_plot_and_report_write_files() {
    let tmp = tempfile::tempdir().unwrap();
    let run = fixture("dflash_small.json");
    for fmt in ["parquet", "csv"] {
        let out = tmp.path().join(fmt);
        bin()
            .args(["export", "--format", fmt, "--out"])
            .arg(&out)
            .arg(&run)
            .assert()
            .success();
        for stem in ["spans", "counters", "flows", "threads", "sections", "steps"] {
            assert!(out.join(format!("{stem}.{fmt}")).is_file(), "{stem}.{fmt}");
        }
    }
    let csv = std::fs::read_to_string(tmp.path().join("csv/sections.csv")).unwrap();
    assert!(csv
        .lines()
        .next()
        .unwrap()
        .starts_with("name,kind,count,total_us"));
    let plots = tmp.path().join("plots");
    bin()
        .args(["plot", "--out"])
        .arg(&plots)
        .arg(&run)
        .assert()
        .success();
    for stem in [
        "step_sections",
        "section_share",
        "cpu_vs_gpu",
        "step_time_hist",
        "queue_depth",
    ] {
        for ext in ["png", "svg"] {
            let p = plots.join(format!("{stem}.{ext}"));
            assert!(
                std::fs::metadata(&p)
                    .map(|m| m.len() > 1000)
                    .unwrap_or(false),
                "{}",
                p.display()
            );
        }
    }
    let text = report_of(&run, tmp.path());
    assert!(text.contains("<svg") && text.contains("Top findings") && text.contains("Comparison"));
    assert!(!text.contains("src=\"http"));
}

#[test]
fn broken_pipe_is_not_an_error() {
    // `head -c1` closes the pipe after one byte of many megabytes; exit status stays 0.
    let bin_path = assert_cmd::cargo::cargo_bin("dflash-analyze");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; '{}' synth --steps 20000 --out - | head -c1 >/dev/null",
            bin_path.display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The run line names only what the run has: nothing stands in for a missing tokens/s
/// (a Kineto trace has no token counts) or GPU idle share (a CPU-only trace).
#[test]
fn run_line_omits_what_a_run_lacks() {
    let first_line = |file: &str| {
        let out = bin().arg("breakdown").arg(fixture(file)).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        text.lines().next().unwrap().to_string()
    };
    let neither = first_line("kineto_cpu.json.gz");
    assert!(
        neither.starts_with("run ") && neither.ends_with(" ms"),
        "{neither}"
    );
    let gpu_only = first_line("kineto_gpu_shaped.json");
    assert!(
        gpu_only.contains(" ms, GPU idle ") && gpu_only.ends_with('%'),
        "{gpu_only}"
    );
    let both = first_line("dflash_small.json");
    assert!(both.contains(" tokens/s, GPU idle "), "{both}");

    let tmp = tempfile::tempdir().unwrap();
    let text = report_of(&fixture("kineto_cpu.json.gz"), tmp.path());
    assert!(
        text.contains(" ms</p>"),
        "the run line ends at its last figure"
    );
    assert!(!text.contains("ms-"), "no placeholder after the figures");
}
