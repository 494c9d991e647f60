//! The README's main command, `bash scripts/run-default.sh`, end to end: it builds what it
//! runs, trains and traces the embedded default, analyses the trace and ends by saying
//! where to look. The run here is the script itself with the dev profile (reusing the
//! binaries the test build made) and a shorter training; everything else is the path a
//! new user takes. A second test holds the README to the script: every program a README
//! command calls is one the script builds.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `bins=(...)` list of scripts/run-default.sh: the programs it builds and runs.
fn script_bins(script: &str) -> BTreeSet<String> {
    let line = script
        .lines()
        .find(|l| l.trim_start().starts_with("bins=("))
        .expect("scripts/run-default.sh declares bins=(...)");
    let inner = line
        .split_once('(')
        .and_then(|(_, r)| r.split_once(')'))
        .map(|(l, _)| l)
        .expect("bins=( ... ) on one line");
    inner.split_whitespace().map(str::to_string).collect()
}

/// Every project program a shell line of the README runs: a command word `dflash` or
/// `dflash-*`, or a binary at `target/<profile>/<name>` (examples, under
/// `target/<profile>/examples/`, have build commands of their own).
fn programs_called(line: &str) -> Vec<String> {
    let code = line.split(" #").next().unwrap_or("").trim();
    if code.starts_with('#') {
        return Vec::new();
    }
    let words: Vec<&str> = code.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let first = i == 0 || matches!(words[i - 1], "|" | "&&" | ";");
        if let Some(rest) = word.split("target/").nth(1) {
            let parts: Vec<&str> = rest.split('/').collect();
            if let [_profile, name] = parts[..] {
                out.push(name.to_string());
            }
            continue;
        }
        if first && (*word == "dflash" || word.starts_with("dflash-")) {
            out.push(word.to_string());
        }
    }
    out
}

/// The lines of the README's ```sh blocks.
fn readme_shell_lines(readme: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut inside = false;
    for l in readme.lines() {
        if l.trim_start().starts_with("```") {
            inside = !inside && l.trim_start().trim_start_matches('`').starts_with("sh");
            continue;
        }
        if inside {
            lines.push(l.to_string());
        }
    }
    lines
}

#[test]
fn readme_commands_call_only_what_the_main_command_builds() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let script = std::fs::read_to_string(root().join("scripts/run-default.sh")).unwrap();
    let built = script_bins(&script);
    assert!(built.contains("dflash") && built.contains("dflash-analyze"));
    let lines = readme_shell_lines(&readme);
    assert!(
        lines
            .iter()
            .any(|l| l.trim() == "bash scripts/run-default.sh"
                || l.trim().starts_with("bash scripts/run-default.sh ")),
        "the README's main command is bash scripts/run-default.sh"
    );
    let mut called = BTreeSet::new();
    for l in &lines {
        for p in programs_called(l) {
            called.insert(p);
        }
        // every script a README line runs exists
        if let Some(s) = l.split_whitespace().find(|w| w.starts_with("scripts/")) {
            assert!(
                root().join(s).exists(),
                "README runs {s}, which does not exist"
            );
        }
    }
    assert!(called.contains("dflash-analyze"), "{called:?}");
    let missing: Vec<_> = called.difference(&built).collect();
    assert!(
        missing.is_empty(),
        "README commands call {missing:?}, which scripts/run-default.sh does not build"
    );
}

#[test]
fn the_readme_parser_sees_what_a_line_runs() {
    assert_eq!(
        programs_called("dflash-analyze compare runs/a runs/b   # a comment dflash"),
        ["dflash-analyze"]
    );
    assert_eq!(
        programs_called("./target/release/dflash-analyze breakdown runs/a"),
        ["dflash-analyze"]
    );
    assert!(programs_called("cp target/release/examples/gpu_span_cost x").is_empty());
    assert!(programs_called("# copy target/release/dflash to the host").is_empty());
    assert_eq!(
        programs_called("cargo build --bins && dflash train --trace runs/a"),
        ["dflash"]
    );
    assert!(programs_called("bash scripts/test.sh").is_empty());
    let s = "x=1\nbins=(dflash other-tool)\n";
    assert_eq!(
        script_bins(s).into_iter().collect::<Vec<_>>(),
        ["dflash", "other-tool"]
    );
}

fn files_under(dir: &Path, ext: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == ext))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn main_command_trains_analyses_and_says_where_to_look() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let out = Command::new("bash")
        .arg(root().join("scripts/run-default.sh"))
        .arg(&run)
        .current_dir(root())
        .env("DFLASH_PROFILE", "dev")
        .env(
            "DFLASH_TRAIN_ARGS",
            "--steps 12 --set seq_len=128 --set batch_tokens=1024 --set num_anchors=16 --quiet",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let trace = run.join("trace.json");
    assert!(trace.is_file(), "{stdout}");
    assert!(files_under(&run.join("plots"), "png") >= 3, "{stdout}");
    assert!(files_under(&run.join("plots"), "svg") >= 3, "{stdout}");
    // the breakdown table, then where to look
    assert!(stdout.contains("drafter.backward"), "{stdout}");
    let tail = stdout
        .split("Where to look")
        .nth(1)
        .unwrap_or_else(|| panic!("no 'Where to look' block:\n{stdout}"));
    let trace_abs = std::fs::canonicalize(&trace).unwrap();
    assert!(
        tail.contains(&format!("trace:        {}", trace_abs.display())),
        "{tail}"
    );
    assert!(tail.contains("ui.perfetto.dev"), "{tail}");
    let plots_abs = std::fs::canonicalize(run.join("plots")).unwrap();
    assert!(tail.contains(&plots_abs.display().to_string()), "{tail}");
    let finding = tail
        .lines()
        .find_map(|l| l.trim().strip_prefix("top finding:"))
        .unwrap_or_else(|| panic!("no top finding line:\n{tail}"))
        .trim();
    assert!(finding.len() > 10, "{tail}");
    // the top finding is the analyzer's own first finding for this run
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    let json = Command::new(target.join("debug").join("dflash-analyze"))
        .args(["breakdown", "--json"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(json.status.success());
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(v["findings"][0]["text"].as_str(), Some(finding));
}
