//! Links libtorch so that CUDA stays available, sets an rpath to it, compiles the small
//! C++ shim over c10::cuda (streams, events) that tch does not expose and the CUDA
//! activity capture (CUPTI, loaded at run time; only its headers are needed here), and
//! captures the git revision the binary is built from (`DFLASH_GIT_REVISION`; "unknown"
//! outside a git checkout, or set that variable when building from an archive).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env::var("CARGO_MANIFEST_DIR").ok()?)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The revision of HEAD, and a rerun whenever HEAD or the branch it names moves.
fn git_revision() {
    println!("cargo:rerun-if-env-changed=DFLASH_GIT_REVISION");
    let rev = env::var("DFLASH_GIT_REVISION")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=DFLASH_GIT_REVISION={rev}");
    let mut watch = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(r);
    }
    for w in watch {
        if let Some(p) = git(&["rev-parse", "--git-path", &w]) {
            let p = Path::new(&env::var("CARGO_MANIFEST_DIR").unwrap_or_default()).join(p);
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
}

/// The C++ sources of the shim library (the CUDA adapter's, and the drafter's grouped
/// attention node).
const SHIM_SOURCES: [&str; 4] = [
    "src/cuda/shim.cpp",
    "src/cuda/activity.cpp",
    "src/cuda/kernels.cpp",
    "src/model/attention.cpp",
];

/// Whether the shim library in OUT_DIR is newer than its sources and this script, so a
/// rerun for a new git revision does not compile it again.
fn shim_is_fresh() -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let out = PathBuf::from(env::var("OUT_DIR").unwrap_or_default()).join("libdflash_cuda_shim.a");
    let Some(lib) = modified(&out) else {
        return false;
    };
    SHIM_SOURCES
        .iter()
        .chain(&["build.rs"])
        .all(|f| modified(Path::new(f)).is_some_and(|m| lib > m))
}

fn main() {
    git_revision();
    println!("cargo:rerun-if-changed=build.rs");
    for src in SHIM_SOURCES {
        println!("cargo:rerun-if-changed={src}");
    }
    println!("cargo:rerun-if-env-changed=DFLASH_NVIDIA_DIR");
    let lib = PathBuf::from(
        env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys did not report DEP_TCH_LIBTORCH_LIB"),
    );
    // libtorch_cuda registers the CUDA backend from static initialisers; nothing references
    // it by symbol, so the linker would drop it and CUDA would be silently unavailable.
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg=-ltorch_cuda");
    println!("cargo:rustc-link-arg=-lc10_cuda");
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());

    let torch = lib
        .parent()
        .expect("libtorch lib dir has a parent")
        .to_path_buf();
    let nvidia = env::var("DFLASH_NVIDIA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| torch.parent().expect("site-packages").join("nvidia"));
    let cuda_include = nvidia.join("cu13").join("include");
    let cuda_lib = nvidia.join("cu13").join("lib");
    if !cuda_include.join("crt").join("host_defines.h").exists() {
        panic!(
            "CUDA headers not found under {}: run scripts/setup.sh (it installs nvidia-cuda-crt)",
            cuda_include.display()
        );
    }
    if shim_is_fresh() {
        println!(
            "cargo:rustc-link-search=native={}",
            env::var("OUT_DIR").unwrap()
        );
        println!("cargo:rustc-link-lib=static=dflash_cuda_shim");
        println!("cargo:rustc-link-lib=stdc++");
    } else {
        cc::Build::new()
            .cpp(true)
            .files(SHIM_SOURCES)
            .include(torch.join("include"))
            .include(torch.join("include/torch/csrc/api/include"))
            .include(&cuda_include)
            .flag("-std=c++17")
            .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
            .flag_if_supported("-Wno-unused-parameter")
            .flag_if_supported("-Wno-deprecated-declarations")
            .warnings(false)
            .compile("dflash_cuda_shim");
    }
    println!("cargo:rustc-link-search=native={}", cuda_lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cuda_lib.display());
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-link-lib=dylib:+verbatim=libcudart.so.13");
}
