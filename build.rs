//! Build script: find (or fetch) the pinned MLX wheel, compile our C++ shim over MLX's C++ API,
//! check (or, with `--features regen-bindings`, regenerate) the Rust bindings of the shim's flat C
//! header, and link libmlx with a runpath.
//!
//! Environment:
//! - `MLX_DIR`: an unpacked MLX prefix (holding `mlx/include` and `mlx/lib`); skips the fetch.
//! - `MLEX_BACKEND=cpu|cuda|metal`: which pinned wheel to fetch (default metal on macOS, cpu on Linux).
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/mlx/shim.h");
    println!("cargo:rerun-if-changed=src/mlx/shim.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_quantized_matmul.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_quantized_matmul.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cuda_quantized_matvec.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_fast_ops.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_strided.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_simd.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_primitive.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_thread_pool.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_thread_pool.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_fast_ops.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_decode_attention.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_decode_attention.h");
    println!("cargo:rerun-if-changed=src/mlx/cuda_quantized_matvec.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cuda_qk_norm_rope.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cuda_qk_norm_rope.h");
    println!("cargo:rerun-if-changed=src/mlx/cuda_short_attention.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cuda_short_attention.h");
    println!("cargo:rerun-if-changed=src/mlx/cuda_half_helpers.h");
    println!("cargo:rerun-if-changed=src/mlx/gated_delta.h");
    println!("cargo:rerun-if-changed=src/mlx/ablation.h");
    println!("cargo:rerun-if-changed=src/mlx/gated_delta.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cuda_jit.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_gemm.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_bitstream.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_scales.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_dense_matmul.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_dense_matmul.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_dense_rows.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_dense_rows.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_gemm.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_matvec_avx512.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_matvec_avx512.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_matvec_vnni.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cpu_matvec_vnni.h");
    println!("cargo:rerun-if-changed=src/mlx/cpu_avx512_blocks.h");
    println!("cargo:rerun-if-changed=src/mlx/quant_epilogue.h");
    println!("cargo:rerun-if-changed=src/mlx/cuda_jit.cpp");
    println!("cargo:rerun-if-changed=src/mlx/cuda_launch.h");
    println!("cargo:rerun-if-changed=src/mlx/cuda_launch.cpp");
    println!("cargo:rerun-if-changed=vendor/mlx.lock");
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLEX_BACKEND");

    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap();
    let backend = env::var("MLEX_BACKEND").unwrap_or_else(|_| {
        if target_os == "macos" { "metal".into() } else { "cpu".into() }
    });
    let prefix = match env::var("MLX_DIR") {
        Ok(dir) => PathBuf::from(dir),
        Err(_) => fetch_mlx(&backend),
    };
    if target_os == "macos" {
        macos_deployment_target();
    }
    let include = prefix.join("mlx/include");
    let lib = prefix.join("mlx/lib");
    if !include.join("mlx/mlx.h").exists() {
        panic!("MLX headers not found under {} (set MLX_DIR to an unpacked MLX wheel)", include.display());
    }

    cc::Build::new()
        .cpp(true)
        .std("c++20") // C++17 fails inside mlx/device.h
        .file("src/mlx/shim.cpp")
        .file("src/mlx/cpu_quantized_matmul.cpp")
        .file("src/mlx/cuda_quantized_matvec.cpp")
        .file("src/mlx/cuda_qk_norm_rope.cpp")
        .file("src/mlx/cuda_short_attention.cpp")
        .file("src/mlx/cpu_fast_ops.cpp")
        .file("src/mlx/cpu_decode_attention.cpp")
        .file("src/mlx/cpu_thread_pool.cpp")
        .file("src/mlx/gated_delta.cpp")
        .file("src/mlx/cuda_jit.cpp")
        .file("src/mlx/cuda_launch.cpp")
        .file("src/mlx/cpu_gemm.cpp")
        .file("src/mlx/cpu_dense_matmul.cpp")
        .file("src/mlx/cpu_dense_rows.cpp")
        .file("src/mlx/cpu_matvec_avx512.cpp")
        .file("src/mlx/cpu_matvec_vnni.cpp")
        .include(&include)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .opt_level(2)
        .compile("mlex_shim");

    bindings();

    println!("cargo:rerun-if-env-changed=MLEX_OPENBLAS");
    // Opt-in: MLEX_OPENBLAS=<dir holding libopenblas.so.0> (Debian: /usr/lib/x86_64-linux-gnu/openblas-pthread).
    // The CPU wheel's libmlx calls the reference BLAS it bundles (30× slower at sgemm). Linking
    // OpenBLAS ahead of libmlx puts it earlier in the symbol lookup order, so MLX's BLAS calls
    // bind to OpenBLAS (the bundled library still loads, unused). `src/mlx/blas.rs` references an
    // OpenBLAS symbol so the linker keeps it.
    if let Ok(dir) = env::var("MLEX_OPENBLAS") {
        if target_os == "linux" && !dir.is_empty() {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-lib=dylib:+verbatim=libopenblas.so.0");
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            println!("cargo:rustc-cfg=mlex_openblas");
        }
    }
    println!("cargo:rustc-check-cfg=cfg(mlex_openblas)");
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // The shim is C++: link the C++ runtime libmlx was built against.
    if target_os == "macos" {
        println!("cargo:rustc-link-lib=dylib=c++");
        // Packaged: libmlx.dylib (and mlx.metallib beside it) in mlx/lib next to the .node/binary.
        // @loader_path, not @executable_path: for the addon the executable is node or Electron.
        // libmlx.dylib's install name is @rpath/libmlx.dylib, so these rpaths find it; the second
        // (this build's prefix, for running from target/) is deleted from packaged copies
        // (scripts/package-darwin-arm64.sh).
        println!("cargo:rustc-link-arg=-Wl,-rpath,@loader_path/mlx/lib");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    } else {
        println!("cargo:rustc-link-lib=dylib=stdc++");
        // RUNPATH (new dtags), not RPATH, so LD_LIBRARY_PATH can swap in the CUDA libmlx.so.
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags");
        println!("cargo:rustc-link-arg=-Wl,-rpath,$ORIGIN/mlx/lib");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
        // The CUDA libmlx.so names NVIDIA libraries that only the GPU machine has.
        println!("cargo:rustc-link-arg=-Wl,--allow-shlib-undefined");
    }
    println!("cargo:rustc-env=MLEX_MLX_PREFIX={}", prefix.display());
    println!("cargo:rustc-env=MLEX_MLX_BACKEND={backend}");

    if env::var_os("CARGO_FEATURE_NODE").is_some() {
        napi_build::setup();
    }
}

/// libmlx.dylib of the mlx-metal wheel is built for macOS 14 (LC_BUILD_VERSION minos 14.0), so
/// nothing mlex builds can run on an older macOS. The shim is compiled for that floor too: left
/// unset, `cc` would take rustc's default (11.0): libc++ marks some C++20 library parts
/// unavailable below newer floors (availability annotations), and the linker warns about every
/// object built for 11.0 linked against a 14.0 dylib. Set MACOSX_DEPLOYMENT_TARGET=14.0 for the whole build (the release
/// scripts and CI do) so that rustc links for 14.0 as well; a lower value is refused.
fn macos_deployment_target() {
    println!("cargo:rerun-if-env-changed=MACOSX_DEPLOYMENT_TARGET");
    match env::var("MACOSX_DEPLOYMENT_TARGET") {
        Ok(v) => {
            let major: u32 = v.split('.').next().and_then(|m| m.parse().ok()).unwrap_or(0);
            if major < 14 {
                panic!("MACOSX_DEPLOYMENT_TARGET={v}: MLX's libmlx.dylib needs macOS 14 or later (set it to 14.0)");
            }
        }
        Err(_) => {
            println!("cargo:warning=MACOSX_DEPLOYMENT_TARGET is not set: the shim is compiled for macOS 14.0 (libmlx.dylib's floor); export MACOSX_DEPLOYMENT_TARGET=14.0 so that rustc links for it too");
            // Read by `cc` in this process only: the shim's objects are built for 14.0.
            env::set_var("MACOSX_DEPLOYMENT_TARGET", "14.0");
        }
    }
}

/// The Rust bindings of the shim's flat C header are generated by bindgen (which needs libclang)
/// and kept in the repository, `src/mlx/shim_bindings.rs`, headed by a hash of `shim.h`: a build
/// only checks that hash, so a user needs a C++ compiler and no libclang. After changing `shim.h`,
/// `cargo build --features regen-bindings` regenerates them (`.ci/run` checks they are current).
fn bindings() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let header = manifest.join("src/mlx/shim.h");
    let file = manifest.join("src/mlx/shim_bindings.rs");
    let text = std::fs::read(&header).unwrap_or_else(|e| panic!("reading {}: {e}", header.display()));
    let stamp = format!("// shim.h fnv1a64 {:016x}", fnv1a64(&text));
    #[cfg(feature = "regen-bindings")]
    {
        let generated = bindgen::Builder::default()
            .header(header.to_string_lossy())
            .allowlist_function("mlex_.*")
            .allowlist_type("mlex_.*")
            .allowlist_var("MLEX_.*")
            .default_enum_style(bindgen::EnumVariation::Consts)
            .prepend_enum_name(false)
            .layout_tests(false)
            .generate()
            .expect("bindgen failed on src/mlx/shim.h")
            .to_string();
        let body = format!(
            "{stamp}\n// Generated by bindgen from src/mlx/shim.h (`cargo build --features regen-bindings`): do not edit.\n{generated}"
        );
        if std::fs::read_to_string(&file).ok().as_deref() != Some(body.as_str()) {
            std::fs::write(&file, body).unwrap_or_else(|e| panic!("writing {}: {e}", file.display()));
        }
    }
    let current = std::fs::read_to_string(&file).unwrap_or_default();
    if current.lines().next() != Some(stamp.as_str()) {
        eprintln!(
            "error: {} is out of date with src/mlx/shim.h: run `cargo build --features regen-bindings` \
             (needs libclang: apt-get install libclang-dev) and commit the regenerated file",
            file.display()
        );
        std::process::exit(1);
    }
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Runs vendor/fetch-mlx.sh (pip download of the hash-pinned wheel, cached) and returns its prefix.
fn fetch_mlx(backend: &str) -> PathBuf {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let script = manifest.join("vendor/fetch-mlx.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(backend)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", script.display()));
    if !out.status.success() {
        panic!(
            "{} {backend} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let prefix = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(Path::new(&prefix).exists(), "fetch-mlx.sh printed a missing prefix: {prefix}");
    prefix.into()
}
