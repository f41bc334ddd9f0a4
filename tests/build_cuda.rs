#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The CUDA build's checks, without CUDA: scripts/check-cuda-bin.sh on small binaries made (with
//! gcc) to pass and to fail each of its checks, and scripts/build-cuda.sh's argument checks,
//! which run before it installs or builds anything.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn gcc(args: &[&str], dir: &Path) {
    let out = Command::new("gcc")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("gcc is needed for this test (apt-get install gcc): {e}"));
    assert!(out.status.success(), "gcc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A shared library with soname `soname`, defining `symbol`, as `dir/lib{name}.so`.
fn stub(dir: &Path, name: &str, soname: &str, symbol: &str) {
    std::fs::write(dir.join(format!("{name}.c")), format!("int {symbol}(void) {{ return 0; }}\n")).unwrap();
    let so = format!("lib{name}.so");
    gcc(&["-shared", "-fPIC", &format!("-Wl,-soname,{soname}"), "-o", &so, &format!("{name}.c")], dir);
}

/// A program calling each library's symbol, with libjpeg-turbo's message in it or not.
fn program(dir: &Path, out: &str, libs: &[(&str, &str)], jpeg_message: bool) -> PathBuf {
    let mut c = String::new();
    for (_, sym) in libs {
        c += &format!("int {sym}(void);\n");
    }
    let msg = if jpeg_message { "Premature end of JPEG file" } else { "no decoder here" };
    c += &format!("const char *volatile msg = \"{msg}\";\nint main(void) {{ int r = msg[0] == 'x';\n");
    for (_, sym) in libs {
        c += &format!("r += {sym}();\n");
    }
    c += "return r; }\n";
    let src = format!("{out}.c");
    std::fs::write(dir.join(&src), c).unwrap();
    let mut args = vec!["-o", out, &src, "-L.", "-Wl,--no-as-needed"];
    let flags: Vec<String> = libs.iter().map(|(name, _)| format!("-l{name}")).collect();
    args.extend(flags.iter().map(String::as_str));
    gcc(&args, dir);
    dir.join(out)
}

fn check(bin: &Path, no_libjpeg: bool) -> (bool, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("scripts/check-cuda-bin.sh")).arg(bin).env_remove("PIPEPROF_NO_LIBJPEG");
    if no_libjpeg {
        cmd.env("PIPEPROF_NO_LIBJPEG", "1");
    }
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_cuda_binary_check_passes_a_cuda_build_with_libjpeg_and_names_what_is_wrong_otherwise() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    stub(dir, "cuda", "libcuda.so.1", "cuInit");
    stub(dir, "cublas", "libcublas.so.13", "cublasCreate_v2");
    stub(dir, "foo", "libfoo.so.1", "foo_init");
    let cuda = ("cuda", "cuInit");
    let cublas = ("cublas", "cublasCreate_v2");
    let good = program(dir, "good", &[cuda, cublas], true);
    let no_jpeg = program(dir, "no_jpeg", &[cuda], false);
    let not_cuda = program(dir, "not_cuda", &[], true);
    let extra_lib = program(dir, "extra_lib", &[cuda, ("foo", "foo_init")], true);
    let text = dir.join("notes.txt");
    std::fs::write(&text, "Premature end of JPEG file\n").unwrap();
    // (binary, PIPEPROF_NO_LIBJPEG, passes, what stderr says)
    let table: [(&Path, bool, bool, &str); 6] = [
        (&good, false, true, "ok: "),
        (&no_jpeg, false, false, "has no libjpeg-turbo in it"),
        (&no_jpeg, true, true, "ok: "),
        (&not_cuda, false, false, "does not link libcuda.so.1"),
        (&extra_lib, false, false, "unexpected shared libraries: libfoo.so.1"),
        (&text, false, false, "is not an ELF binary"),
    ];
    for (bin, no_libjpeg, passes, says) in table {
        let (ok, err) = check(bin, no_libjpeg);
        assert_eq!(ok, passes, "{} (PIPEPROF_NO_LIBJPEG={no_libjpeg}): {err}", bin.display());
        assert!(err.contains(says), "{}: expected {says:?} in: {err}", bin.display());
    }
    let (_, err) = check(&good, false);
    assert!(err.contains("libcublas.so.13") && err.contains("libcuda.so.1"), "{err}");
}

#[test]
fn build_cuda_refuses_bad_arguments_before_installing_anything() {
    for (args, says) in [
        (&["--compute-cap", "9.0"][..], "give the capability without the dot"),
        (&["--compute-cap"][..], "--compute-cap needs a value"),
        (&["--fast"][..], "unknown argument '--fast'"),
    ] {
        let out = Command::new("bash").arg(root().join("scripts/build-cuda.sh")).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("installing"), "{args:?}: {err}");
    }
}
