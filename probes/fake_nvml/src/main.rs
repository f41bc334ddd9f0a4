#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Builds the fake NVML driver used to test the GPU path without a GPU.
//!
//! `cargo run -p pipeprof-fake-nvml -- /tmp/libfake_nvml.so`, then
//! `PIPEPROF_NVML_LIB=/tmp/libfake_nvml.so FAKE_NVML_DEVICES=2 pipeprof profile ...`.
//! The `FAKE_NVML_*` variables are listed at the top of `probes/tests/fake_nvml.c`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let out = std::env::args_os().nth(1).map_or_else(|| PathBuf::from(fake_nvml::LIB_NAME), PathBuf::from);
    match fake_nvml::build_to(&out) {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
