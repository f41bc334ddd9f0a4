//! Builds the libjpeg shim (src/data/jpeg/shim.c) against the system libjpeg-turbo when its
//! header is installed (Debian: libjpeg62-turbo-dev), and sets `cfg(pipeprof_libjpeg)`.
//! libjpeg is linked statically when its archive (`libjpeg.a`) is there: the binary then runs
//! on machines without libjpeg, and the Python wheel that carries it stays manylinux.
//! Without it, or with PIPEPROF_NO_LIBJPEG=1, JPEGs are decoded by the `image` crate at full
//! size: slower on large photos, same results otherwise.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pipeprof_libjpeg)");
    println!("cargo::rerun-if-changed=src/data/jpeg/shim.c");
    println!("cargo::rerun-if-env-changed=PIPEPROF_NO_LIBJPEG");
    if std::env::var_os("PIPEPROF_NO_LIBJPEG").is_some_and(|v| v != "0") {
        println!("cargo::warning=PIPEPROF_NO_LIBJPEG set: JPEGs decode through the image crate (no scaled decode)");
        return;
    }
    let built = cc::Build::new()
        .file("src/data/jpeg/shim.c")
        .opt_level(2)
        .warnings(true)
        .cargo_warnings(false)
        .try_compile("pipeprof_jpeg_shim");
    match built {
        Ok(()) => {
            match static_libjpeg_dir() {
                Some(dir) => {
                    println!("cargo::rustc-link-search=native={}", dir.display());
                    println!("cargo::rustc-link-lib=static=jpeg");
                }
                None => println!("cargo::rustc-link-lib=dylib=jpeg"),
            }
            println!("cargo::rustc-cfg=pipeprof_libjpeg");
        }
        Err(e) => println!(
            "cargo::warning=libjpeg headers not found ({e}): JPEGs decode through the image crate at full size; \
             install libjpeg62-turbo-dev (Debian) or libjpeg-turbo-devel for the faster scaled decode"
        ),
    }
}

/// The folder holding `libjpeg.a` for this target, if there is one.
fn static_libjpeg_dir() -> Option<std::path::PathBuf> {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").ok()?;
    let os = std::env::var("CARGO_CFG_TARGET_OS").ok()?;
    if os != "linux" {
        return None;
    }
    let multiarch = format!("/usr/lib/{arch}-linux-gnu");
    [multiarch.as_str(), "/usr/lib64", "/usr/lib", "/usr/local/lib"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|d| d.join("libjpeg.a").is_file())
}
