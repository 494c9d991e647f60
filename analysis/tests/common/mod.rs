//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use dflash_analyze::synth::{self, SynthSpec};

pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/traces")
        .join(rel)
}

/// The bytes of a gzipped file, unpacked.
pub fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap();
    out
}

pub fn bin() -> Command {
    let mut c = Command::cargo_bin("dflash-analyze").expect("the binary is built");
    c.env("NO_COLOR", "1");
    c
}

/// Writes a synthetic run directory `dir/name/trace.json`.
pub fn run_dir(dir: &Path, name: &str, spec: &SynthSpec) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("trace.json"), synth::trace_string(spec)).unwrap();
    d
}

pub fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success() || out.status.code() == Some(1),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}
