//! A fake NVML driver for testing the GPU path without a GPU.
//!
//! [`build`] compiles a small C library that implements the NVML functions the GPU sampler
//! calls, with values scripted by `FAKE_NVML_*` environment variables (see [`SOURCE`]).
//! Point the sampler at it with `PIPEPROF_NVML_LIB=<path>`:
//!
//! ```text
//! cargo run -p pipeprof-fake-nvml -- /tmp/libfake_nvml.so
//! FAKE_NVML_DEVICES=2 PIPEPROF_NVML_LIB=/tmp/libfake_nvml.so pipeprof profile ...
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// The C source of the fake driver; its header comment lists the `FAKE_NVML_*` variables.
pub const SOURCE: &str = include_str!("../../tests/fake_nvml.c");

/// File name [`build`] gives the library.
pub const LIB_NAME: &str = "libfake_nvml.so";

/// Compiles the fake driver into `out_dir/libfake_nvml.so` and returns its path.
///
/// Uses `$CC`, else `cc`, else `gcc`. Safe to call concurrently (from several test binaries
/// at once): each call compiles to its own temporary name and renames it into place.
pub fn build(out_dir: &Path) -> io::Result<PathBuf> {
    build_to(&out_dir.join(LIB_NAME))
}

/// Compiles the fake driver as an older driver would be: without the PCIe link functions and
/// `nvmlDeviceGetComputeRunningProcesses_v3`, into `out_dir/libfake_nvml_old.so`.
pub fn build_old_driver(out_dir: &Path) -> io::Result<PathBuf> {
    build_with(&out_dir.join("libfake_nvml_old.so"), &["-DFAKE_NVML_OLD_DRIVER"])
}

/// Compiles the fake driver to exactly `lib_path`.
pub fn build_to(lib_path: &Path) -> io::Result<PathBuf> {
    build_with(lib_path, &[])
}

fn build_with(lib_path: &Path, defines: &[&str]) -> io::Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = match lib_path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let unique = format!("{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
    let src = dir.join(format!("fake_nvml-{unique}.c"));
    let tmp_lib = dir.join(format!(".{LIB_NAME}-{unique}.tmp"));
    std::fs::write(&src, SOURCE)?;
    let result = compile(&src, &tmp_lib, defines).and_then(|()| std::fs::rename(&tmp_lib, lib_path));
    // Best effort: leftovers are small and uniquely named.
    let _ = std::fs::remove_file(&src);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp_lib);
    }
    result.map(|()| lib_path.to_path_buf())
}

fn compile(src: &Path, out: &Path, defines: &[&str]) -> io::Result<()> {
    let mut compilers: Vec<String> = Vec::new();
    if let Some(cc) = std::env::var_os("CC").and_then(|c| c.into_string().ok()).filter(|c| !c.is_empty()) {
        compilers.push(cc);
    }
    compilers.extend(["cc".to_string(), "gcc".to_string()]);
    let mut last_err = io::Error::new(io::ErrorKind::NotFound, "no C compiler");
    for cc in &compilers {
        match Command::new(cc).args(["-shared", "-fPIC", "-O1"]).args(defines).arg("-o").arg(out).arg(src).output() {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => {
                return Err(io::Error::other(format!(
                    "{cc} failed to compile the fake NVML driver ({}): {}",
                    o.status,
                    String::from_utf8_lossy(&o.stderr).trim()
                )));
            }
            // Not installed: try the next name.
            Err(e) => last_err = e,
        }
    }
    Err(io::Error::new(
        last_err.kind(),
        format!("no C compiler to build the fake NVML driver (tried {}): {last_err}", compilers.join(", ")),
    ))
}
