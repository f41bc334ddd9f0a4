#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pipeprof pack`: torchvision ImageFolder's files, classes and order; the sizes asked for
//! and the per-image index; version 1 files still read; the command's refusals.
//! (python/tests/test_packed.py compares with torchvision itself.)

mod common;
use common::{output_within, pipeprof, text};
use std::io::{BufRead, Read};

use pipeprof_trainer::cache::{build, BuildOptions, Header, Meta, Packed, Size, PIXELS_OFF};
use pipeprof_trainer::data::scan::Rules;
use std::path::Path;

fn png(path: &Path, w: u32, h: u32, px: [u8; 3]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image::RgbImage::from_pixel(w, h, image::Rgb(px)).save_with_format(path, image::ImageFormat::Png).unwrap();
}

fn jpeg(path: &Path, w: u32, h: u32, px: [u8; 3]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image::RgbImage::from_pixel(w, h, image::Rgb(px)).save_with_format(path, image::ImageFormat::Jpeg).unwrap();
}

fn pack_opts(data: &Path, out: &Path, size: Size) -> BuildOptions {
    BuildOptions {
        data: data.to_path_buf(),
        out: out.to_path_buf(),
        size,
        channels: 3,
        rules: Rules::ImageFolder,
        exact_decode: true,
        model: Default::default(),
        workers: 2,
        progress: false,
        fail_after: None,
        abort_after: None,
        panic_on: None,
    }
}

/// A folder where ImageFolder's rules and pipeprof's loader's differ: a hidden class, a hidden
/// file, a GIF, upper-case extensions, nested folders whose path order is not their string
/// order, a non-ASCII name.
fn odd_folder(root: &Path) {
    let c = [9, 99, 199];
    png(&root.join(".hidden_cls/a.png"), 8, 8, c);
    for name in [".h.jpg", "a b.JPEG", "z.jpg"] {
        jpeg(&root.join("Bee").join(name), 8, 8, c);
    }
    for name in ["x.PNG", "sub/b.png", "sub-x/a.png", "sub/c/a.png"] {
        png(&root.join("Bee").join(name), 8, 8, c);
    }
    std::fs::write(root.join("Bee/notes.txt"), "not an image").unwrap();
    image::RgbaImage::from_pixel(8, 8, image::Rgba([1, 2, 3, 255])).save(root.join("Bee/anim.gif")).unwrap();
    png(&root.join("ant/1.png"), 8, 8, c);
    png(&root.join("zebra/é.png"), 8, 8, c);
    png(&root.join("zebra/z.png"), 8, 8, c);
}

#[test]
fn pack_takes_imagefolders_classes_files_and_order() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    odd_folder(&data);
    let out = d.path().join("x.ppk");
    build(&pack_opts(&data, &out, Size::Fixed { height: 4, width: 4 })).unwrap();
    let p = Packed::open(&out).unwrap();
    // find_classes: every folder, hidden ones too, sorted by name.
    assert_eq!(p.classes(), [".hidden_cls", "Bee", "ant", "zebra"]);
    let names: Vec<&str> = (0..p.len()).map(|i| p.name(i)).collect();
    // sorted(os.walk(class)) orders folders by path string ("sub-x" < "sub/c"), files by name
    // within; hidden files count, GIF and .txt do not.
    let want = [
        ".hidden_cls/a.png",
        "Bee/.h.jpg",
        "Bee/a b.JPEG",
        "Bee/x.PNG",
        "Bee/z.jpg",
        "Bee/sub/b.png",
        "Bee/sub-x/a.png",
        "Bee/sub/c/a.png",
        "ant/1.png",
        "zebra/z.png",
        "zebra/é.png",
    ];
    assert_eq!(names, want);
    assert_eq!(p.labels(), [0, 1, 1, 1, 1, 1, 1, 1, 2, 3, 3]);

    // pipeprof's own loader's rules (what `cache` packs) differ on each point.
    let own = pipeprof_trainer::data::scan(&data).unwrap();
    assert_eq!(own.classes, ["Bee", "ant", "zebra"]);
    let own_names: Vec<String> =
        own.samples.iter().map(|s| s.path.strip_prefix(&data).unwrap().display().to_string()).collect();
    assert_eq!(
        own_names,
        [
            "Bee/a b.JPEG",
            "Bee/anim.gif",
            "Bee/sub/b.png",
            "Bee/sub/c/a.png",
            "Bee/sub-x/a.png",
            "Bee/x.PNG",
            "Bee/z.jpg",
            "ant/1.png",
            "zebra/z.png",
            "zebra/é.png"
        ]
    );
}

#[test]
fn a_folder_linked_twice_is_walked_twice_and_a_loop_once() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    png(&data.join("cat/real/a.png"), 4, 4, [1, 2, 3]);
    std::os::unix::fs::symlink(data.join("cat/real"), data.join("cat/link")).unwrap();
    std::os::unix::fs::symlink(&data, data.join("cat/real/loop")).unwrap();
    let ds = pipeprof_trainer::data::scan::scan_with(&data, Rules::ImageFolder).unwrap();
    let names: Vec<String> =
        ds.samples.iter().map(|s| s.path.strip_prefix(&data).unwrap().display().to_string()).collect();
    // os.walk(followlinks=True) lists the linked folder under both names; the loop back to
    // the root is reported, not followed.
    assert_eq!(names, ["cat/link/a.png", "cat/real/a.png"]);
    assert!(ds.problems.iter().any(|p| p.reason.contains("already visited")), "{:?}", ds.problems);
    // pipeprof's loader enters each folder once.
    assert_eq!(pipeprof_trainer::data::scan(&data).unwrap().samples.len(), 1);
}

/// Two images of different sizes and colours: 8 wide × 6 high, and 10 wide × 20 high.
fn two_sizes(root: &Path) -> [[u8; 3]; 2] {
    let colours = [[200, 10, 30], [5, 150, 250]];
    png(&root.join("a/wide.png"), 8, 6, colours[0]);
    png(&root.join("b/tall.png"), 10, 20, colours[1]);
    colours
}

#[test]
fn each_size_is_stored_as_asked_and_the_index_finds_every_image() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    let colours = two_sizes(&data);
    let out = d.path().join("x.ppk");
    // (size asked, header (h, w), each image's (h, w)): Shorter is torchvision's Resize(4):
    // 6×8 → 4×int(4·8/6) = 4×5; 20×10 → int(4·20/10)×4 = 8×4.
    let table = [
        (Size::Fixed { height: 5, width: 5 }, (5, 5), [(5, 5), (5, 5)]),
        (Size::Fixed { height: 4, width: 7 }, (4, 7), [(4, 7), (4, 7)]),
        (Size::Shorter { shorter: 4 }, (0, 0), [(4, 5), (8, 4)]),
        (Size::AsStored, (0, 0), [(6, 8), (20, 10)]),
    ];
    for (size, header, each) in table {
        let r = build(&pack_opts(&data, &out, size)).unwrap();
        let p = Packed::open(&out).unwrap();
        assert_eq!((p.shape().0, p.shape().1), header, "{size:?}");
        assert_eq!(r.size, (header != (0, 0)).then_some(header), "{size:?}");
        assert_eq!(p.meta().size, size);
        for (i, ((h, w), colour)) in each.iter().zip(colours).enumerate() {
            assert_eq!(p.size_of(i), (*h, *w), "{size:?} image {i}");
            let px = p.pixels(i).unwrap();
            assert_eq!(px.len(), (h * w * 3) as usize);
            // A flat colour resizes to itself: every pixel read through the index is its own.
            assert!(px.chunks_exact(3).all(|c| c == colour), "{size:?} image {i}");
        }
    }
}

#[test]
fn without_a_size_differing_images_are_refused_and_nothing_is_written() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    two_sizes(&data);
    let out = d.path().join("x.ppk");
    let msg = build(&pack_opts(&data, &out, Size::Common)).unwrap_err().to_string();
    assert!(msg.contains("a/wide.png is 8×6") && msg.contains("b/tall.png is 10×20"), "{msg}");
    assert!(msg.contains("--size 224") && msg.contains("--shorter 256") && msg.contains("--as-stored"), "{msg}");
    let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("imgs")], "no file, no temporary file");
    // One size throughout: stored as it is, the header saying it.
    std::fs::remove_file(data.join("b/tall.png")).unwrap();
    png(&data.join("b/tall.png"), 8, 6, [1, 1, 1]);
    build(&pack_opts(&data, &out, Size::Common)).unwrap();
    assert_eq!(Packed::open(&out).unwrap().shape(), (6, 8, 3));
}

/// The bytes of a version 1 file (fixed stride, binary metadata) holding what `p` holds.
fn as_version_1(p: &Packed, bytes: &[u8]) -> Vec<u8> {
    let h = p.header();
    let n = p.len() as u64;
    let pixels = &bytes[PIXELS_OFF as usize..h.labels_off as usize];
    let labels: Vec<u8> = p.labels().iter().flat_map(|l| l.to_le_bytes()).collect();
    let crcs: Vec<u8> = (0..p.len()).flat_map(|i| crc32fast::hash(&p.pixels(i).unwrap()).to_le_bytes()).collect();
    let meta = Meta { size: Size::Common, rules: Rules::Pipeprof, ..p.meta().clone() }.encode();
    let labels_off = PIXELS_OFF + pixels.len() as u64;
    let v1 = Header {
        version: 1,
        labels_off,
        crcs_off: labels_off + 4 * n,
        meta_off: labels_off + 8 * n,
        meta_len: meta.len() as u64,
        file_len: labels_off + 8 * n + meta.len() as u64,
        index_off: 0,
        ..h.clone()
    };
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&Header::crc_input(&v1.encode(0)));
    for part in [&labels, &crcs, &meta] {
        hasher.update(part);
    }
    let mut out = v1.encode(hasher.finalize()).to_vec();
    out.resize(PIXELS_OFF as usize, 0);
    for part in [pixels, &labels, &crcs, &meta] {
        out.extend_from_slice(part);
    }
    assert_eq!(out.len() as u64, v1.file_len);
    out
}

#[test]
fn a_version_1_file_is_still_read() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    common::demo(&data, 2, 5, 3);
    let out = d.path().join("x.ppk");
    let mut o = pack_opts(&data, &out, Size::Fixed { height: 12, width: 10 });
    o.rules = Rules::Pipeprof;
    build(&o).unwrap();
    let v2 = Packed::open(&out).unwrap();
    let old = d.path().join("old.ppk");
    std::fs::write(&old, as_version_1(&v2, &std::fs::read(&out).unwrap())).unwrap();
    let v1 = Packed::open(&old).unwrap();
    assert_eq!(v1.header().version, 1);
    assert_eq!((v1.len(), v1.shape(), v1.classes(), v1.labels()), (v2.len(), v2.shape(), v2.classes(), v2.labels()));
    for i in 0..v1.len() {
        assert_eq!((v1.pixels(i).unwrap(), v1.name(i)), (v2.pixels(i).unwrap(), v2.name(i)), "image {i}");
    }
    // Its source is checked for staleness with the rules v1 had: pipeprof's.
    assert!(v1.source_checked());
}

#[test]
fn the_pack_command_writes_and_refuses_with_reasons() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    two_sizes(&data);
    let out = d.path().join("x.ppk");
    let (i, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    for (args, want) in [
        (vec!["--size", "0"], "size must be S"),
        (vec!["--size", "224", "--shorter", "2"], "cannot be used with"),
        (vec![], "differ in size"),
    ] {
        let r = pipeprof(&[&["pack", i, o][..], &args].concat());
        assert!(!r.status.success() && text(&r.stderr).contains(want), "{args:?}: {}", text(&r.stderr));
        assert!(!out.exists());
    }
    let r = pipeprof(&["pack", i, o, "--size", "6x3", "--workers", "1"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    assert!(text(&r.stderr).contains("packed 2 images (3×6×3"), "{}", text(&r.stderr));
    assert!(text(&r.stdout).contains("PackedImageFolder("), "{}", text(&r.stdout));
    assert_eq!(Packed::open(&out).unwrap().shape(), (3, 6, 3));

    // Variable sizes: pipeprof's own loop refuses them, saying how to pack for it.
    let r = pipeprof(&["pack", i, o, "--shorter", "4"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let model = d.path().join("tiny.toml");
    std::fs::write(&model, common::tiny_model(1)).unwrap();
    let r = pipeprof(&["profile", "--model", model.to_str().unwrap(), "--data", o, "--steps", "2", "--no-tui"]);
    let err = text(&r.stderr);
    assert!(!r.status.success() && err.contains("images of different sizes") && err.contains("--size 32x32"), "{err}");

    // A damaged file's message names the command that rebuilds it as it was made.
    let mut b = std::fs::read(&out).unwrap();
    let at = b.len() - 2;
    b[at] ^= 1;
    std::fs::write(&out, &b).unwrap();
    let msg = Packed::open(&out).unwrap_err().to_string();
    assert!(msg.contains("header checksum") && msg.contains("pipeprof pack DIR"), "{msg}");
}

#[test]
fn keras_layout_takes_image_dataset_from_directorys_classes_files_and_order() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    odd_folder(&data);
    // Jupyter's checkpoints folder, empty: no class to Keras (ImageFolder's rules refuse it:
    // see the next test).
    std::fs::create_dir_all(data.join(".ipynb_checkpoints")).unwrap();
    png(&data.join("zebra/y.tif.png"), 8, 8, [1, 1, 1]);
    std::fs::write(data.join("zebra/w.webp"), b"RIFF not read by Keras").unwrap();
    // A link to a folder inside a class: os.walk without followlinks does not enter it.
    std::os::unix::fs::symlink(data.join("Bee/sub"), data.join("ant/linked")).unwrap();
    let out = d.path().join("k.ppk");
    let mut o = pack_opts(&data, &out, Size::Fixed { height: 4, width: 4 });
    o.rules = Rules::Keras;
    build(&o).unwrap();
    let p = Packed::open(&out).unwrap();
    // sorted(os.listdir(DIR)), folders only, names starting with "." left out.
    assert_eq!(p.classes(), ["Bee", "ant", "zebra"]);
    let names: Vec<&str> = (0..p.len()).map(|i| p.name(i)).collect();
    // sorted(os.walk(class), key=root), then sorted(files); .bmp .gif .jpeg .jpg .png only
    // (the GIF in, the .webp out); hidden files inside a class kept.
    let want = [
        "Bee/.h.jpg",
        "Bee/a b.JPEG",
        "Bee/anim.gif",
        "Bee/x.PNG",
        "Bee/z.jpg",
        "Bee/sub/b.png",
        "Bee/sub-x/a.png",
        "Bee/sub/c/a.png",
        "ant/1.png",
        "zebra/y.tif.png",
        "zebra/z.png",
        "zebra/é.png",
    ];
    assert_eq!(names, want);
    assert_eq!(p.labels(), [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 2, 2]);
    assert_eq!(p.meta().rules, Rules::Keras);
    let bytes = std::fs::read(&out).unwrap();
    let h = p.header();
    let json = &bytes[h.meta_off as usize..(h.meta_off + h.meta_len) as usize];
    let v: serde_json::Value = serde_json::from_slice(json).unwrap();
    assert_eq!(v["layout"], "keras");
    // A damaged or stale file names the command that re-packs it with the same layout.
    assert!(pipeprof_trainer::cache::rerun_command(Some(p.meta()), &out).ends_with("--size 4 --layout keras"));
}

#[test]
fn an_empty_class_folder_is_refused_under_imagefolders_rules_and_kept_under_keras() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("d");
    png(&data.join("cat/a.png"), 4, 4, [1, 2, 3]);
    png(&data.join("dog/c.png"), 4, 4, [3, 2, 1]);
    std::fs::create_dir_all(data.join(".ipynb_checkpoints")).unwrap();
    std::fs::create_dir_all(data.join("empty")).unwrap();
    std::fs::write(data.join("empty/notes.txt"), "no images here").unwrap();
    let out = d.path().join("x.ppk");
    let (i, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    let r = pipeprof(&["pack", i, o, "--size", "4"]);
    let err = text(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{err}");
    // The first folder named, the other counted, why, and what to do.
    assert!(err.contains(&format!("{}/.ipynb_checkpoints (and 1 more: empty)", data.display())), "{err}");
    assert!(err.contains("raises FileNotFoundError") && err.contains("--layout keras"), "{err}");
    assert!(!err.contains("left out of the classes"), "{err}");
    assert!(!out.exists());
    // Keras's rules: the hidden folder is no class, the empty one is (as Keras keeps it).
    std::fs::remove_dir(data.join(".ipynb_checkpoints")).unwrap();
    let r = pipeprof(&["pack", i, o, "--size", "4", "--layout", "keras"]);
    let err = text(&r.stderr);
    assert!(r.status.success() && err.contains("Keras keeps it as a class too"), "{err}");
    assert_eq!(Packed::open(&out).unwrap().classes(), ["cat", "dog", "empty"]);
    assert!(text(&r.stdout).contains("pipeprof.keras.packed_dataset("), "{}", text(&r.stdout));
}

#[test]
fn the_rebuild_command_in_messages_parses_back_to_the_same_size_and_layout() {
    use clap::Parser;
    let out = Path::new("/tmp/x.ppk");
    let table = [
        (Size::Fixed { height: 224, width: 224 }, Rules::ImageFolder, "--size 224"),
        (Size::Fixed { height: 224, width: 160 }, Rules::ImageFolder, "--size 160x224"),
        (Size::Fixed { height: 3, width: 600 }, Rules::Keras, "--size 600x3 --layout keras"),
        (Size::Shorter { shorter: 256 }, Rules::ImageFolder, "--shorter 256"),
        (Size::AsStored, Rules::Keras, "--as-stored --layout keras"),
        (Size::Common, Rules::ImageFolder, ""),
    ];
    for (size, rules, flags) in table {
        let meta = Meta { source: "/data/imgs".into(), size, rules, ..Meta::default() };
        let cmd = pipeprof_trainer::cache::rerun_command(Some(&meta), out);
        assert_eq!(cmd, format!("pipeprof pack /data/imgs /tmp/x.ppk {flags}").trim_end(), "{size:?}");
        let cli = pipeprof::cli::Cli::try_parse_from(cmd.split_whitespace()).unwrap();
        let Some(pipeprof::cli::Command::Pack(a)) = cli.command else { panic!("{cmd}: not pack") };
        let opts = pipeprof::commands::pack_options(a);
        assert_eq!((opts.size, opts.layout), (size, rules), "{cmd}");
    }
}

/// Kills the child on every path out of a test (no process left holding the build lock).
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: a signal to the child this test started (already reaped: ESRCH, harmless).
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

#[test]
fn ctrl_c_during_pack_removes_the_temporary_and_exits_130() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("imgs");
    // Files that fail to decode, each a warning line: more lines than a pipe holds (64 KiB),
    // so pack blocks on stderr while the test does not read it, and cannot finish before the
    // signal comes. The first warning says the temporary file is being written.
    std::fs::create_dir_all(data.join("c")).unwrap();
    for k in 0..4000 {
        std::fs::write(data.join(format!("c/not-really-an-image-{k:05}.png")), b"not a png").unwrap();
    }
    let out = d.path().join("big.ppk");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pipeprof"))
        .args(["pack", data.to_str().unwrap(), out.to_str().unwrap(), "--size", "8", "--workers", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let guard = KillOnDrop(child.id() as libc::pid_t);
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("skipped") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "pack ended before writing: {line}");
    }
    let temps = |want: &str| -> Vec<String> {
        let names =
            std::fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned());
        names.filter(|n| n.starts_with(want)).collect()
    };
    assert_eq!(temps(".big.ppk.tmp-").len(), 1, "the temporary is being written");
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(guard.0, libc::SIGINT) };
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let r = output_within(child, std::time::Duration::from_secs(120), "pack after Ctrl-C");
    let rest = rest.join().unwrap();
    let last = rest.lines().last().unwrap_or_default().to_string();
    assert_eq!(r.status.code(), Some(130), "{last}");
    assert!(last.contains("pipeprof pack: interrupted") && last.contains("was not written"), "{last}");
    assert_eq!(temps(".big.ppk"), Vec::<String>::new(), "no temporary left");
    assert!(!out.exists());
}
