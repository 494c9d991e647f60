//! Links libtorch so that CUDA stays available, sets an rpath to it, and compiles the
//! small C++ shim over c10::cuda (streams, events) that tch does not expose, and the
//! CUDA activity capture (CUPTI, loaded at run time; only its headers are needed here).
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/cuda/shim.cpp");
    println!("cargo:rerun-if-changed=src/cuda/activity.cpp");
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
    cc::Build::new()
        .cpp(true)
        .file("src/cuda/shim.cpp")
        .file("src/cuda/activity.cpp")
        .include(torch.join("include"))
        .include(torch.join("include/torch/csrc/api/include"))
        .include(&cuda_include)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        .compile("dflash_cuda_shim");
    println!("cargo:rustc-link-search=native={}", cuda_lib.display());
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", cuda_lib.display());
    println!("cargo:rustc-link-lib=dylib=c10_cuda");
    println!("cargo:rustc-link-lib=dylib:+verbatim=libcudart.so.13");
}
