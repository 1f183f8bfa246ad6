//! Compiles every `kernels/*.cu` to a fatbin with nvcc and generates
//! `kernels.rs`, which embeds them with `include_bytes!`.
//!
//! nvcc is looked up in order: `KESTREL_NVCC`, the `.cuda/` virtualenv that
//! `scripts/setup-cuda.sh` creates at the workspace root, `CUDA_HOME` /
//! `CUDA_PATH`, then `PATH`. Without nvcc the crate still builds, embeds no
//! kernels and reports why through `available()`, unless
//! `KESTREL_REQUIRE_KERNELS=1`, which turns that into a build failure.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The records and constants shared with the launchers (`src/abi.rs`).
#[allow(dead_code)]
#[path = "src/abi.rs"]
mod abi;

/// Targets in every fatbin: Hopper with its `a` features (wgmma, setmaxnreg),
/// sm_121, and compute_90 PTX so newer GPUs can JIT the kernels.
const GENCODE: &[&str] = &[
    "-gencode=arch=compute_90a,code=sm_90a",
    "-gencode=arch=compute_121,code=sm_121",
    "-gencode=arch=compute_90,code=compute_90",
];

/// Modules whose numerics tolerate approximate exp/rsqrt/division. Anything
/// that feeds a softmax, a decay (`exp`, `softplus`) or RoPE's `sincos` stays
/// exact so the backend tracks the f32 CPU reference.
const FAST_MATH_MODULES: &[&str] = &["elementwise"];

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let kernel_dir = manifest_dir.join("kernels");
    let require = env::var("KESTREL_REQUIRE_KERNELS").is_ok_and(|v| v == "1");

    for var in [
        "KESTREL_NVCC",
        "KESTREL_REQUIRE_KERNELS",
        "CUDA_HOME",
        "CUDA_PATH",
        "PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed={}", kernel_dir.display());
    println!(
        "cargo:rerun-if-changed={}",
        manifest_dir.join("src/abi.rs").display()
    );

    // The shared header, written whether or not nvcc is found.
    let abi_dir = out_dir.join("include");
    fs::create_dir_all(&abi_dir).expect("create the header folder");
    fs::write(abi_dir.join("kestrel_abi.h"), abi::Header.to_string()).expect("write kestrel_abi.h");

    let mut sources: Vec<PathBuf> = fs::read_dir(&kernel_dir)
        .expect("kernels/ directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("cu" | "cuh")))
        .collect();
    sources.sort();
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }
    let modules: Vec<&PathBuf> = sources
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .collect();

    let workspace_root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let venv = workspace_root.join(".cuda");
    // Watch the compiler itself, not the whole virtualenv; a missing path would
    // make cargo rerun this script (and rebuild its dependents) every time.
    if let Some(nvcc) = find_in_venv(&venv) {
        println!("cargo:rerun-if-changed={}", nvcc.display());
    }

    let result = find_nvcc(&venv).and_then(|nvcc| {
        modules
            .iter()
            .map(|src| {
                compile(&nvcc, src, &[&kernel_dir, &abi_dir], &out_dir).map(|fatbin| (*src, fatbin))
            })
            .collect::<Result<Vec<_>, String>>()
    });

    let generated = match result {
        Ok(built) => generate(&modules, Some(&built), None),
        Err(why) => {
            if require {
                panic!("KESTREL_REQUIRE_KERNELS=1 but the CUDA kernels could not be built: {why}");
            }
            println!(
                "cargo:warning=kestrel-kernels: building without CUDA kernels: {why} \
                 (after installing nvcc, `touch crates/kestrel-kernels/build.rs` to rebuild)"
            );
            generate(&modules, None, Some(&why))
        }
    };
    fs::write(out_dir.join("kernels.rs"), generated).expect("write kernels.rs");
}

fn find_nvcc(venv: &Path) -> Result<PathBuf, String> {
    if let Ok(p) = env::var("KESTREL_NVCC") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("KESTREL_NVCC={} is not a file", p.display()))
        };
    }
    if let Some(p) = find_in_venv(venv) {
        return Ok(p);
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(home) = env::var(var) {
            let p = Path::new(&home).join("bin").join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err("nvcc not found (set KESTREL_NVCC, run scripts/setup-cuda.sh, or set CUDA_HOME)".into())
}

/// `.cuda/lib/python3.X/site-packages/nvidia/cu13/bin/nvcc`, any Python version.
fn find_in_venv(venv: &Path) -> Option<PathBuf> {
    let lib = fs::read_dir(venv.join("lib")).ok()?;
    lib.filter_map(|e| e.ok())
        .map(|e| e.path().join("site-packages/nvidia/cu13/bin/nvcc"))
        .find(|p| p.is_file())
}

fn compile(nvcc: &Path, src: &Path, include: &[&Path], out_dir: &Path) -> Result<PathBuf, String> {
    let stem = src.file_stem().unwrap().to_str().unwrap();
    let out = out_dir.join(format!("{stem}.fatbin"));
    let mut cmd = Command::new(nvcc);
    cmd.arg("--fatbin")
        .args(GENCODE)
        .args(["-O3", "-std=c++17", "-lineinfo"])
        .args(include.iter().map(|dir| format!("-I{}", dir.display())))
        .arg("-o")
        .arg(&out)
        .arg(src);
    if FAST_MATH_MODULES.contains(&stem) {
        cmd.arg("--use_fast_math");
    }
    let output = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", nvcc.display()))?;
    if !output.status.success() {
        return Err(format!(
            "nvcc failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(out)
}

/// One `pub static` per module: the fatbin, or an empty slice when not built.
fn generate(
    modules: &[&PathBuf],
    built: Option<&[(&PathBuf, PathBuf)]>,
    why: Option<&str>,
) -> String {
    let mut s = String::new();
    for src in modules {
        let stem = src.file_stem().unwrap().to_str().unwrap();
        let name = stem.to_uppercase();
        let fatbin = built.and_then(|b| b.iter().find(|(s, _)| s == src).map(|(_, f)| f));
        match fatbin {
            Some(f) => writeln!(
                s,
                "/// Fatbin of `kernels/{stem}.cu`.\npub static {name}: &[u8] = include_bytes!({:?});",
                f.display().to_string()
            ),
            None => writeln!(s, "/// `kernels/{stem}.cu` was not built.\npub static {name}: &[u8] = &[];"),
        }
        .unwrap();
    }
    writeln!(s, "const UNAVAILABLE: Option<&str> = {why:?};").unwrap();
    s
}
