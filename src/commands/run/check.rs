//! `pipeprof run --check-advice [--steps N] -- CMD`: after the report, the user's own program
//! runs again, briefly, once as it was and once per piece of advice the start-up hook can
//! apply without an edit to it (a typed change whose loader arguments
//! [`pipeprof_core::diagnose::frameworks::knobs`] gives: `DataLoader` `num_workers`,
//! `persistent_workers`, `prefetch_factor`, `pin_memory`, `batch_size`; Keras `PyDataset`
//! workers; and where its images are read from: [`Change::CopyLocal`] and
//! [`Change::PackFolder`], the folder the diagnosis named replaced by a local copy or by the
//! file `pipeprof pack` made of it), so predicted and measured gains sit side by side in
//! `profile --check-advice`'s table.
//!
//! Each re-run is `pipeprof run --once --summary FILE -- CMD` with [`ENV`] set to the
//! arguments to change, the folder to redirect and the steps to run: `pipeprof._override`
//! (loaded by the hook) sets them on every `DataLoader` (and `ImageFolder`, Keras directory
//! reader) the program builds and ends the program (`SystemExit(0)`) when it asks for the
//! batch after the last step. The copy and the pack are made before their re-run, outside
//! its timing, in this run's private temporary folder (removed after, also on Ctrl-C); what
//! each cost is a line of its own under the table, with the epochs after which it pays. The
//! program's output is kept from the terminal (the last line of its errors says why a re-run
//! failed); its side effects are its own.

use crate::commands::profile::check::MAX_FOLLOW_UPS;
use crate::commands::rerun::{self, FollowUp, Measured, NoRate, Outcome};
use crate::commands::scratch;
use crate::report::json::Checked;
use pipeprof_core::aggregate::settings::RunSettings;
use pipeprof_core::aggregate::Summary;
use pipeprof_core::diagnose::frameworks::knobs;
use pipeprof_core::diagnose::{Change, LoaderKnobs, PackSize, Verdict};
use serde::Serialize;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The environment variable a re-run's hook reads: JSON, the [`LoaderKnobs`] to set, `steps`,
/// the training steps after which the program is stopped, and a [`Redirect`] of its images.
pub use probes::env::CHECK_ENV as ENV;

/// What `pipeprof run --check-advice` needs of the run.
#[derive(Debug, Clone)]
pub struct Options {
    pub command: Vec<OsString>,
    pub steps: u64,
    pub sample_hz: f64,
    pub no_gpu: bool,
}

/// Where a re-run reads the program's images instead of the folder the diagnosis named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataMove {
    /// A copy of the folder on the local disk, read as the folder was.
    Copy,
    /// The file `pipeprof pack` makes of it at `size` (the advice's; as stored where the run
    /// did not say), read by `PackedImageFolder` / `packed_dataset` (`keras`: packed with
    /// Keras's folder rules, `--layout keras`).
    Pack { size: PackSize, keras: bool },
}

/// A re-run: its row, the arguments it sets (none: the baseline) and where it reads its images.
#[derive(Debug, Clone, PartialEq)]
pub struct ReRun {
    pub row: FollowUp,
    pub set: Option<LoaderKnobs>,
    pub moves: Option<DataMove>,
}

/// The redirect the hook makes (`pipeprof._override`): the folder the program names (`from`,
/// compared by its real path) is read from `to`, a folder or a packed file (`as`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Redirect {
    pub from: PathBuf,
    pub to: PathBuf,
    #[serde(rename = "as")]
    pub kind: RedirectKind,
}

/// What a [`Redirect`] points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RedirectKind {
    Folder,
    Packed,
}

/// The row of advice that moves the images, when the program named its folder (`data`).
fn data_move(a: &pipeprof_core::diagnose::Advice, data: &str) -> Option<(String, DataMove)> {
    if data.is_empty() {
        return None;
    }
    match &a.change {
        Change::CopyLocal => Some(("copy the folder to a local temporary folder".into(), DataMove::Copy)),
        Change::PackFolder { keras, size, .. } => {
            let reader = if *keras { "pipeprof.keras.packed_dataset" } else { "PackedImageFolder" };
            let size = match size {
                PackSize::Unknown => PackSize::AsStored,
                s => *s,
            };
            Some((format!("pipeprof pack {}, read by {reader}", size.flag()), DataMove::Pack { size, keras: *keras }))
        }
        _ => None,
    }
}

/// The baseline, then the top advice the hook can apply, best first: at most
/// [`MAX_FOLLOW_UPS`] loader changes (the arguments [`knobs`] sets for the run's framework,
/// from its settings `st`), and the local copy and the pack of the folder the run read
/// (`st.data`) once each. Pure.
pub fn plan(v: &Verdict, st: &RunSettings) -> Vec<ReRun> {
    let data = st.data.as_str();
    let mut out = vec![ReRun { row: FollowUp::baseline(), set: None, moves: None }];
    let mut loaders = 0;
    for a in &v.advice {
        if let Some((label, moves)) = data_move(a, data) {
            let same = |r: &ReRun| {
                matches!(
                    (r.moves, moves),
                    (Some(DataMove::Copy), DataMove::Copy) | (Some(DataMove::Pack { .. }), DataMove::Pack { .. })
                )
            };
            if !out.iter().any(same) {
                out.push(ReRun { row: FollowUp::of(a, label), set: None, moves: Some(moves) });
            }
            continue;
        }
        let Some(set) = knobs(&a.change, st) else { continue };
        if loaders >= MAX_FOLLOW_UPS || out.iter().any(|r| r.set.as_ref() == Some(&set)) {
            continue;
        }
        loaders += 1;
        // The learning rate is the program's: a larger batch runs with its own, as the
        // advice's words say to change it too.
        let code = a.command.clone().unwrap_or_default();
        let label = if set.batch_size.is_some() { format!("{code} (learning rate as it was)") } else { code };
        out.push(ReRun { row: FollowUp::of(a, label), set: Some(set), moves: None });
    }
    out
}

/// Where a re-run's hook writes what the check needs back: why it could not make the redirect
/// (`why_file`), and the images it read from the copy or the pack, a file per process
/// (`reads_dir`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Back<'a> {
    pub why_file: Option<&'a Path>,
    pub reads_dir: Option<&'a Path>,
}

/// The value of [`ENV`] for a re-run: the arguments to set, the steps, the redirect and where
/// the hook writes back ([`Back`]). Pure.
pub fn env_value(set: Option<&LoaderKnobs>, steps: u64, redirect: Option<&Redirect>, back: Back) -> String {
    let mut v = serde_json::to_value(set.cloned().unwrap_or_default()).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(m) = v.as_object_mut() {
        m.insert("steps".into(), steps.into());
        if let Some(r) = redirect.and_then(|r| serde_json::to_value(r).ok()) {
            m.insert("redirect".into(), r);
        }
        for (key, p) in [("why_file", back.why_file), ("reads_dir", back.reads_dir)] {
            if let Some(p) = p {
                m.insert(key.into(), p.to_string_lossy().into_owned().into());
            }
        }
    }
    v.to_string()
}

/// The images a re-run's processes read from the copy or the pack: the counts the hook wrote
/// in `dir`, a file per process (a count in decimal).
fn reads_in(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| t.trim().parse::<u64>().ok())
        .fold(0u64, u64::saturating_add)
}

/// Whether a data re-run measured `what` ("the copy", "the pack"): it read some of its images
/// (`reads`, counted by the hook) and its program saw as many images and classes as the main
/// run's (`main`, `ran`: the two runs' settings). The note that says so, or why not
/// ([`NoRate::Skipped`]). Pure.
fn proven(what: &str, reads: u64, main: &RunSettings, ran: &RunSettings) -> Result<String, NoRate> {
    if reads == 0 {
        return Err(NoRate::Skipped(format!(
            "the re-run read no image from {what}: the program trained on data it did not open through the folder reader the hook redirects (a dataset of its own, one loaded back from a cache)"
        )));
    }
    let (images, classes) = (ran.images, ran.classes.len());
    if (images, classes) != (main.images, main.classes.len()) {
        return Err(NoRate::Skipped(format!(
            "the re-run saw {images} images of {classes} classes in {what}, the main run {} of {}: not the same data",
            main.images,
            main.classes.len()
        )));
    }
    Ok(format!("{images} images, {classes} classes, as the main run; {reads} read from {what}"))
}

/// `pipeprof run` arguments of a re-run. Pure.
pub fn child_args(opts: &Options, summary: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec!["run".into(), "--once".into(), "--summary".into(), summary.as_os_str().into()];
    a.extend(["--sample-hz".into(), opts.sample_hz.to_string().into()]);
    if opts.no_gpu {
        a.push("--no-gpu".into());
    }
    a.push("--".into());
    a.extend(opts.command.iter().cloned());
    a
}

/// Why the program's input cannot be given to it again, if so: standard input is a pipe, a
/// socket or a file (a terminal or `/dev/null` gives nothing that is used up).
pub fn stdin_refusal() -> Option<String> {
    // SAFETY: fstat on fd 0 into a zeroed, writable stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(0, &mut st) } != 0 {
        return None;
    }
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => "a pipe",
        libc::S_IFSOCK => "a socket",
        libc::S_IFREG => "a file",
        _ => return None,
    };
    Some(format!(
        "--check-advice runs the program again, several times, and its standard input here is {kind}, which can be read only once: give the program its input as a file it opens itself, or run without --check-advice"
    ))
}

/// Epochs after which a one-off cost of `cost_s` seconds has paid for itself, when an epoch
/// of `images` takes `images / before` seconds now and `images / after` after the change;
/// `None` where it never does (not faster, or nothing known). Pure.
fn break_even_epochs(cost_s: f64, images: usize, before: f64, after: f64) -> Option<u64> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    if !(ok(before) && ok(after)) || images == 0 || !cost_s.is_finite() || cost_s < 0.0 {
        return None;
    }
    let saved = images as f64 / before - images as f64 / after;
    (saved > 0.0).then(|| ((cost_s / saved).ceil() as u64).max(1))
}

/// The line under the table saying what making the copy or the pack cost (`what`: "the
/// copy"), and when it pays: "the copy took 41.0 s: worth it after 2 epochs (…)". Pure.
fn cost_line(what: &str, cost_s: f64, images: usize, before: f64, after: f64) -> String {
    let epoch = |rate: f64| images as f64 / rate;
    match break_even_epochs(cost_s, images, before, after) {
        Some(n) => format!(
            "{what} took {cost_s:.1} s: worth it after {n} epoch{} (an epoch of {images} images: {:.1} s now, {:.1} s after)",
            if n == 1 { "" } else { "s" },
            epoch(before),
            epoch(after)
        ),
        None if images == 0 => format!("{what} took {cost_s:.1} s (the epoch's length is unknown: no break-even)"),
        None => format!("{what} took {cost_s:.1} s: never worth it at the rates measured (no faster than as run)"),
    }
}

/// Images whose headers [`pack_bytes`] reads at most: spread evenly over the data set, their
/// mean size stands for the rest (each header read is an open on slow storage, where a data
/// set of 100 000 files would take minutes; the free-space margin covers the estimate's error).
const SIZED_AT_MOST: usize = 256;

/// Bytes `pipeprof pack` writes for the images of `data` at `size` (3 channels each; the index
/// is small beside them): the files its layout takes (`keras`: Keras's folder rules, else
/// ImageFolder's), each at the size it is stored at (`--size`: known; `--as-stored`,
/// `--shorter`: from the image's header, up to [`SIZED_AT_MOST`] of them, their mean for the
/// rest). Stops at an interrupt.
fn pack_bytes(data: &Path, size: PackSize, keras: bool) -> Result<u64, NoRate> {
    use pipeprof_trainer::data::scan::{scan_with, Rules};
    let rules = if keras { Rules::Keras } else { Rules::ImageFolder };
    let ds = scan_with(data, rules).map_err(|e| e.to_string())?;
    let count = ds.samples.len() as u64;
    let stored = match size {
        PackSize::Exact { height, width } => return Ok(count.saturating_mul(height as u64 * width as u64 * 3)),
        PackSize::Shorter(s) => pipeprof_trainer::cache::Size::Shorter { shorter: s as u32 },
        PackSize::AsStored | PackSize::Unknown => pipeprof_trainer::cache::Size::AsStored,
    };
    let step = ds.samples.len().div_ceil(SIZED_AT_MOST).max(1);
    let (mut sized, mut pixels) = (0u64, 0u64);
    for s in ds.samples.iter().step_by(step) {
        rerun::stop_check()?;
        // An image whose size cannot be read is one pack skips: nothing written.
        if let Some((w, h)) = image_size(&s.path) {
            let (h, w) = stored.output(h, w);
            pixels = pixels.saturating_add(u64::from(h) * u64::from(w));
        }
        sized += 1;
    }
    if sized == 0 {
        return Ok(0);
    }
    // The sampled images' mean, for every image (exact where all were read).
    let total = (u128::from(pixels) * u128::from(count) / u128::from(sized)) as u64;
    Ok(total.saturating_mul(3))
}

/// An image's (width, height): from a JPEG's frame header or a PNG's IHDR in its first 64 KiB,
/// else (another format, a header further in) decoded.
fn image_size(path: &Path) -> Option<(u32, u32)> {
    use std::io::Read;
    let mut head = Vec::with_capacity(64 << 10);
    std::fs::File::open(path).ok()?.take(64 << 10).read_to_end(&mut head).ok()?;
    if let Some(wh) = header_size(&head) {
        return Some(wh);
    }
    let bytes = std::fs::read(path).ok()?;
    pipeprof_trainer::data::image::decode(&bytes, 3).ok().map(|p| (p.width, p.height))
}

/// (width, height) from the start of a PNG (IHDR) or a JPEG (its first SOF marker). Pure.
fn header_size(b: &[u8]) -> Option<(u32, u32)> {
    let be32 = |i: usize| Some(u32::from_be_bytes(b.get(i..i + 4)?.try_into().ok()?));
    let be16 = |i: usize| Some(u32::from(u16::from_be_bytes(b.get(i..i + 2)?.try_into().ok()?)));
    if b.starts_with(b"\x89PNG\r\n\x1a\n") && b.get(12..16) == Some(b"IHDR") {
        return Some((be32(16)?, be32(20)?));
    }
    if !b.starts_with(&[0xff, 0xd8]) {
        return None;
    }
    let mut i = 2;
    while i + 4 <= b.len() {
        if b[i] != 0xff {
            return None;
        }
        let marker = b[i + 1];
        // Fill bytes, and markers with no length (TEM, RSTn).
        if marker == 0xff {
            i += 1;
            continue;
        }
        if marker == 0x01 || (0xd0..=0xd7).contains(&marker) {
            i += 2;
            continue;
        }
        let len = be16(i + 2)? as usize;
        // SOF0–SOF15 but DHT (C4), JPG (C8) and DAC (CC): height then width.
        if (0xc0..=0xcf).contains(&marker) && ![0xc4, 0xc8, 0xcc].contains(&marker) {
            return Some((be16(i + 7)?, be16(i + 5)?));
        }
        i += 2 + len;
    }
    None
}

/// The pack of `data` in `tmp`, when it fits there (its size [`pack_bytes`] against the free
/// space, with the copy's margin: else [`NoRate::Skipped`]): `pipeprof pack`, watched
/// as a re-run is (an interrupt passed on, never outliving this process).
fn make_pack(exe: &Path, data: &Path, tmp: &Path, size: PackSize, keras: bool) -> Result<PathBuf, NoRate> {
    let needed = pack_bytes(data, size, keras)?;
    scratch::room_for("pack the data set", needed, scratch::free_bytes(tmp), tmp)
        .map_err(|e| NoRate::Skipped(format!("{e} (pipeprof pack {})", size.flag())))?;
    let out = tmp.join("data.ppk");
    let mut c = std::process::Command::new(exe);
    c.arg("pack").arg(data).arg(&out).args(size.flag().split(' '));
    if keras {
        c.args(["--layout", "keras"]);
    }
    let (status, err) = rerun::run_watched(c, exe)?;
    if !status.success() {
        return Err(NoRate::Failed(format!("pipeprof pack failed: {err}")));
    }
    Ok(out)
}

/// The copy or the pack a re-run reads, made in `tmp` from `data` (timed, before the re-run):
/// the redirect, what it is called in the cost line, and its cost in seconds.
fn make_data(moves: DataMove, exe: &Path, data: &Path, tmp: &Path) -> Result<(Redirect, &'static str, f64), NoRate> {
    let from = std::path::absolute(data).map_err(|e| format!("cannot resolve {} ({e})", data.display()))?;
    let t0 = Instant::now();
    let (to, kind, what) = match moves {
        DataMove::Copy => {
            let (copy, _) = scratch::copy_local(data, tmp)?;
            (copy, RedirectKind::Folder, "the copy")
        }
        DataMove::Pack { size, keras } => (make_pack(exe, data, tmp, size, keras)?, RedirectKind::Packed, "the pack"),
    };
    Ok((Redirect { from, to, kind }, what, t0.elapsed().as_secs_f64()))
}

/// One re-run: the data it reads made first (a copy or a pack, timed apart), then the program;
/// a data re-run is a measurement only where it proved it read the data ([`proven`]).
fn re_run(opts: &Options, r: &ReRun, k: usize, exe: &Path, tmp: &Path, main: &Summary) -> Outcome {
    let (redirect, cost) = match r.moves {
        None => (None, None),
        Some(m) => {
            let (redirect, what, secs) = make_data(m, exe, Path::new(&main.settings.data), tmp)?;
            (Some(redirect), Some((what, secs)))
        }
    };
    // Interrupted while the copy or the pack was made: no re-run.
    rerun::stop_check()?;
    let summary = tmp.join(format!("run-{k}.json"));
    let why = tmp.join(format!("run-{k}.why"));
    let reads = tmp.join(format!("run-{k}.reads"));
    let counted = redirect.is_some() && std::fs::create_dir(&reads).is_ok();
    let back = Back { why_file: Some(&why), reads_dir: counted.then_some(reads.as_path()) };
    let env = [(ENV, env_value(r.set.as_ref(), opts.steps, redirect.as_ref(), back))];
    let limit = rerun::time_limit(main, opts.steps);
    let ran = rerun::run_child_summary(exe, &child_args(opts, &summary), &env, &summary, limit);
    if let Some(r) = &redirect {
        // The copy or the pack is not needed past its run: the space goes back at once.
        let _ = if r.to.is_dir() { std::fs::remove_dir_all(&r.to) } else { std::fs::remove_file(&r.to) };
    }
    // The hook could not make the redirect as the program asked: the row says why.
    match std::fs::read_to_string(&why) {
        Ok(w) if !w.trim().is_empty() && ran != Err(NoRate::Interrupted) => {
            return Err(NoRate::Skipped(w.trim().to_string()))
        }
        _ => {}
    }
    let m = Measured::of(ran?)?;
    let Some((what, secs)) = cost else { return Ok(m) };
    let ran_settings = m.summary.as_ref().map(|s| s.settings.clone()).unwrap_or_default();
    let note = proven(what, reads_in(&reads), &main.settings, &ran_settings)?;
    Ok(Measured { note: Some(note), cost: Some((what, secs)), ..m })
}

/// Runs the re-runs and prints the table, then the cost of each copy or pack. Never fails the
/// run: problems are printed.
pub fn run(opts: &Options, main: &Summary, verdict: &Verdict) -> Vec<Option<Checked>> {
    let runs = plan(verdict, &main.settings);
    pipeprof_trainer::progress::out("\n");
    if runs.len() == 1 {
        pipeprof_trainer::progress::out("check-advice: no advice the start-up hook can apply to this program (DataLoader num_workers, persistent_workers, prefetch_factor, pin_memory, batch_size; Keras PyDataset workers; the image folder copied or packed): nothing to check\n");
        return Vec::new();
    }
    let Some((exe, tmp, _tmp_guard)) = scratch::rerun_setup("pipeprof-check-run") else { return Vec::new() };
    pipeprof_trainer::progress::out(&format!(
        "check-advice: running the program again: 1 baseline + {} runs of {} steps each, one change per run (its output hidden; its side effects are its own)\n",
        runs.len() - 1,
        opts.steps
    ));
    let labels: Vec<&str> = runs.iter().map(|r| r.row.label.as_str()).collect();
    let results = rerun::drive(&labels, |k| re_run(opts, &runs[k], k, &exe, &tmp, main));
    drop(_tmp_guard);
    let rows: Vec<FollowUp> = runs.iter().map(|r| r.row.clone()).collect();
    let main_rate = rerun::steady_rate(main).unwrap_or(main.images_per_s);
    let elsewhere = rerun::Elsewhere::of_outcomes(main, &results);
    pipeprof_trainer::progress::out(&rerun::render(&rows[..results.len()], &results, main_rate, &elsewhere));
    let base = rerun::baseline_rate(&results, main_rate);
    for m in results.iter().flatten() {
        if let Some((what, secs)) = m.cost {
            pipeprof_trainer::progress::out(&format!(
                "{}\n",
                cost_line(what, secs, main.settings.images, base, m.rate)
            ));
        }
    }
    rerun::checked(&rows, &results, main_rate, &elsewhere, &verdict.advice)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::rerun::verdict_with as verdict;
    use pipeprof_core::diagnose::{Advice, Basis};

    fn loader(change: Change, code: &str, gain: f64) -> Advice {
        Advice {
            action: "x".into(),
            change,
            command: Some(code.into()),
            predicted_speedup: Some(gain),
            reason: "y".into(),
            basis: Some(Basis {
                now: 100.0,
                from_step: 1,
                to_step: 30,
                predicted: 100.0 * gain,
                model_now: 100.0,
                range: None,
                slow_steps: false,
                compute_split_unknown: false,
                floor: false,
            }),
        }
    }

    /// A PyTorch program's settings with no workers, that read `data`; `framework` empty is
    /// pipeprof's own loop.
    fn settings(framework: &str, data: &str) -> RunSettings {
        RunSettings { framework: framework.into(), data: data.into(), batch_size: 32, ..RunSettings::default() }
    }

    #[test]
    fn only_loader_arguments_are_re_run_after_the_baseline_and_each_once() {
        let w2 = LoaderKnobs { num_workers: Some(2), persistent_workers: Some(true), ..LoaderKnobs::default() };
        let b = LoaderKnobs { batch_size: Some(128), ..LoaderKnobs::default() };
        let v = verdict(vec![
            loader(Change::Workers(2), "DataLoader(..., num_workers=2, persistent_workers=True)", 1.9),
            loader(Change::UseDevice("cpu".into()), "device = \"cpu\"", 1.2),
            loader(Change::Workers(2), "DataLoader(..., num_workers=2, persistent_workers=True)", 1.8),
            loader(Change::BatchSize(128), "DataLoader(..., batch_size=128)", 1.3),
        ]);
        let p = plan(&v, &settings("pytorch", ""));
        let sets: Vec<Option<LoaderKnobs>> = p.iter().map(|r| r.set.clone()).collect();
        assert_eq!(sets, vec![None, Some(w2), Some(b)]);
        assert_eq!(p[1].row.predicted, Some(1.9));
        assert_eq!(p[1].row.against, Some(100.0));
        assert_eq!(p[1].row.label, "DataLoader(..., num_workers=2, persistent_workers=True)");
        assert_eq!(p[2].row.label, "DataLoader(..., batch_size=128) (learning rate as it was)");
        // pipeprof's own loop is never re-run here: that is `profile --check-advice`.
        assert_eq!(plan(&verdict(vec![loader(Change::Workers(4), "--workers 4", 2.0)]), &settings("", "d")).len(), 1);
    }

    fn w2_() -> LoaderKnobs {
        LoaderKnobs { num_workers: Some(2), ..LoaderKnobs::default() }
    }

    #[test]
    fn the_hook_is_told_the_arguments_to_set_and_the_steps() {
        let v: serde_json::Value = serde_json::from_str(&env_value(Some(&w2_()), 30, None, Back::default())).unwrap();
        assert_eq!(v, serde_json::json!({"num_workers": 2, "steps": 30}));
        let v: serde_json::Value = serde_json::from_str(&env_value(None, 12, None, Back::default())).unwrap();
        assert_eq!(v, serde_json::json!({"steps": 12}), "the baseline sets nothing");
    }

    fn moved(change: Change, gain: f64) -> Advice {
        Advice { command: None, ..loader(change, "", gain) }
    }

    fn pack(h: usize, w: usize) -> Change {
        Change::PackFolder { keras: false, data: "/mnt/d".into(), size: PackSize::Exact { height: h, width: w } }
    }

    #[test]
    fn the_copy_and_the_pack_are_a_row_each_when_the_program_named_its_folder() {
        let w = |n| Change::Workers(n);
        let v = verdict(vec![
            loader(w(2), "a", 1.5),
            moved(Change::CopyLocal, 8.0),
            loader(w(3), "b", 1.4),
            loader(w(4), "c", 1.3),
            moved(pack(64, 64), 20.0),
            moved(Change::CopyLocal, 7.0),
            loader(w(5), "d", 1.2),
            moved(pack(32, 32), 19.0),
        ]);
        let p = plan(&v, &settings("pytorch", "/mnt/d"));
        let moves: Vec<Option<DataMove>> = p.iter().map(|r| r.moves).collect();
        // Three loader changes at most; the copy and the pack once each, whatever the cap.
        assert_eq!(
            moves,
            [
                None,
                None,
                Some(DataMove::Copy),
                None,
                None,
                Some(DataMove::Pack { size: PackSize::Exact { height: 64, width: 64 }, keras: false })
            ]
        );
        assert_eq!(p[2].row.predicted, Some(8.0));
        assert_eq!(p[2].row.label, "copy the folder to a local temporary folder");
        assert_eq!(p[5].row.label, "pipeprof pack --size 64, read by PackedImageFolder");
        assert!(p.iter().all(|r| r.moves.is_none() || r.set.is_none()), "a data move sets no loader argument");
        // A program that never named its folder: nothing to redirect.
        assert!(plan(&v, &settings("pytorch", "")).iter().all(|r| r.moves.is_none()));
        let keras = moved(Change::PackFolder { keras: true, data: "d".into(), size: PackSize::Unknown }, 3.0);
        assert_eq!(
            plan(&verdict(vec![keras]), &settings("keras", "d"))[1].row.label,
            "pipeprof pack --as-stored, read by pipeprof.keras.packed_dataset"
        );
    }

    #[test]
    fn the_hook_is_told_where_to_read_the_folder_from_and_where_to_say_why_not() {
        let table =
            [(RedirectKind::Folder, serde_json::json!("folder")), (RedirectKind::Packed, serde_json::json!("packed"))];
        for (kind, want) in table {
            let r = Redirect { from: "/mnt/d".into(), to: "/tmp/x/c".into(), kind };
            let back = Back {
                why_file: Some(Path::new("/tmp/x/run-1.why")),
                reads_dir: Some(Path::new("/tmp/x/run-1.reads")),
            };
            let v: serde_json::Value = serde_json::from_str(&env_value(None, 40, Some(&r), back)).unwrap();
            assert_eq!(
                v,
                serde_json::json!({"steps": 40, "redirect": {"from": "/mnt/d", "to": "/tmp/x/c", "as": want}, "why_file": "/tmp/x/run-1.why", "reads_dir": "/tmp/x/run-1.reads"})
            );
        }
    }

    #[test]
    fn a_copy_or_a_pack_pays_after_the_epochs_its_cost_takes_back() {
        // (cost s, images, before images/s, after images/s) → epochs.
        let table: [(f64, usize, f64, f64, Option<u64>); 8] = [
            // 1000 images: 10 s an epoch now, 2 s after: 8 s saved an epoch.
            (41.0, 1000, 100.0, 500.0, Some(6)),
            (8.0, 1000, 100.0, 500.0, Some(1)),
            (0.0, 1000, 100.0, 500.0, Some(1)),
            (16.1, 1000, 100.0, 500.0, Some(3)),
            // Not faster: never.
            (1.0, 1000, 100.0, 100.0, None),
            (1.0, 1000, 100.0, 50.0, None),
            // Nothing known.
            (1.0, 0, 100.0, 500.0, None),
            (f64::NAN, 1000, 100.0, 500.0, None),
        ];
        for (cost, images, before, after, want) in table {
            assert_eq!(break_even_epochs(cost, images, before, after), want, "{cost} {images} {before} {after}");
        }
    }

    #[test]
    fn the_cost_line_says_what_it_took_and_when_it_pays() {
        assert_eq!(
            cost_line("the copy", 41.0, 1000, 100.0, 500.0),
            "the copy took 41.0 s: worth it after 6 epochs (an epoch of 1000 images: 10.0 s now, 2.0 s after)"
        );
        assert!(cost_line("the pack", 2.0, 1000, 100.0, 500.0).contains("worth it after 1 epoch ("));
        assert!(cost_line("the pack", 2.0, 1000, 100.0, 90.0).contains("never worth it"));
        assert!(cost_line("the pack", 2.0, 0, 100.0, 500.0).contains("epoch's length is unknown"));
    }

    #[test]
    fn a_re_run_is_the_same_program_under_pipeprof_run_with_its_own_summary() {
        let opts = Options {
            command: vec!["python".into(), "train.py".into(), "--lr".into(), "0.1".into()],
            steps: 30,
            sample_hz: 4.0,
            no_gpu: true,
        };
        let a: Vec<String> =
            child_args(&opts, Path::new("/tmp/r.json")).iter().map(|x| x.to_string_lossy().into_owned()).collect();
        assert_eq!(
            a,
            [
                "run",
                "--once",
                "--summary",
                "/tmp/r.json",
                "--sample-hz",
                "4",
                "--no-gpu",
                "--",
                "python",
                "train.py",
                "--lr",
                "0.1"
            ]
        );
    }

    fn seen(images: usize, classes: &[&str]) -> RunSettings {
        RunSettings { images, classes: classes.iter().map(|c| c.to_string()).collect(), ..RunSettings::default() }
    }

    #[test]
    fn a_data_re_run_is_measured_only_where_it_read_the_data_and_saw_the_main_runs_images() {
        let main = seen(192, &["circle", "cross"]);
        // Read from the copy, the same images and classes: measured, and the row says so.
        let note = proven("the copy", 320, &main, &seen(192, &["circle", "cross"])).unwrap();
        assert_eq!(note, "192 images, 2 classes, as the main run; 320 read from the copy");
        // Never read from the pack (a dataset loaded back from a pickle): skipped, why.
        let e = proven("the pack", 0, &main, &main).unwrap_err();
        assert!(matches!(&e, NoRate::Skipped(why) if why.contains("read no image from the pack")), "{e}");
        // A copy that left a linked class out: half the images, one class.
        let e = proven("the copy", 96, &main, &seen(96, &["circle"])).unwrap_err();
        assert!(e.to_string().contains("saw 96 images of 1 classes in the copy, the main run 192 of 2"), "{e}");
    }

    #[test]
    fn the_reads_of_every_process_are_added_up() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(reads_in(d.path()), 0);
        std::fs::write(d.path().join("101"), "40\n").unwrap();
        std::fs::write(d.path().join("102"), "7\n").unwrap();
        std::fs::write(d.path().join("103"), "not a count").unwrap();
        assert_eq!(reads_in(d.path()), 47);
        assert_eq!(reads_in(&d.path().join("missing")), 0);
    }

    fn image(path: &Path, w: u32, h: u32, jpeg: bool) {
        let img = image::RgbImage::from_pixel(w, h, image::Rgb([10, 200, 30]));
        let fmt = if jpeg { image::ImageFormat::Jpeg } else { image::ImageFormat::Png };
        img.save_with_format(path, fmt).unwrap();
    }

    #[test]
    fn the_pack_is_sized_before_it_is_written_and_skipped_where_it_does_not_fit() {
        let d = tempfile::tempdir().unwrap();
        for (class, (w, h)) in [("a", (40, 30)), ("b", (20, 50))] {
            std::fs::create_dir(d.path().join(class)).unwrap();
            image(&d.path().join(class).join("0.jpg"), w, h, true);
            image(&d.path().join(class).join("1.png"), w, h, false);
        }
        std::fs::write(d.path().join("a/notes.txt"), "not an image").unwrap();
        // As stored: each image's own pixels × 3.
        assert_eq!(pack_bytes(d.path(), PackSize::AsStored, false).unwrap(), 2 * (40 * 30 + 20 * 50) * 3);
        // --size: the count × H × W × 3, no header read.
        assert_eq!(pack_bytes(d.path(), PackSize::Exact { height: 8, width: 4 }, false).unwrap(), 4 * 8 * 4 * 3);
        // --shorter 10: 40×30 → 13×10, 20×50 → 10×25.
        assert_eq!(pack_bytes(d.path(), PackSize::Shorter(10), false).unwrap(), 2 * (13 * 10 + 10 * 25) * 3);
        // With the copy's margin against the free space.
        let needed = pack_bytes(d.path(), PackSize::AsStored, false).unwrap();
        let e = scratch::room_for("pack the data set", needed, Some(needed), Path::new("/tmp/x")).unwrap_err();
        assert!(e.starts_with("not enough space to pack the data set: 0.0 MB needed"), "{e}");
        assert!(scratch::room_for("pack the data set", needed, Some(needed * 2), Path::new("/t")).is_ok());
    }

    #[test]
    fn a_jpeg_or_png_header_gives_its_size_and_anything_else_none() {
        let d = tempfile::tempdir().unwrap();
        for (name, jpeg) in [("x.jpg", true), ("x.png", false)] {
            image(&d.path().join(name), 33, 17, jpeg);
            assert_eq!(header_size(&std::fs::read(d.path().join(name)).unwrap()), Some((33, 17)), "{name}");
        }
        for junk in [&b""[..], b"\xff\xd8", b"\xff\xd8\xff\xc0\x00", b"GIF89a", b"\xff\xd8\x00\x00\x00\x00"] {
            assert_eq!(header_size(junk), None, "{junk:?}");
        }
    }
}
