#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `pipeprof report --html`: the page written (and said where), `-` for stdout, the fragment,
//! refusals, an old summary without a timeline; and the page loaded in a real browser
//! (Debian's `chromium`, headless), which must build its DOM and draw its charts. Fails where
//! `chromium` is not installed (scripts/test.sh installs it); never skips.

use pipeprof_core::aggregate::{Aggregator, RunSettings};
use probes::sampler::HostSample;
use probes::{Event, SpanRecord, Stage, StepRecord, ThreadRole, NONE};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;
use common::{pipeprof, text};

const MS: u64 = 1_000_000;
const HOSTILE_MODEL: &str = "<script>alert(1)</script>&\"q\".toml";

/// A summary file of 60 steps: 30 ms waiting for data, 10 ms computing, a host sample each
/// step, names a page must escape.
fn summary_file(dir: &Path) -> PathBuf {
    let settings = RunSettings {
        model: HOSTILE_MODEL.into(),
        data: "data/<cats & dogs>".into(),
        workers: 1,
        cores: 2,
        batch_size: 4,
        ..Default::default()
    };
    let mut agg = Aggregator::new(settings);
    agg.push(&Event::Thread { id: 1, name: "train".into(), role: ThreadRole::Train });
    agg.push(&Event::Thread { id: 2, name: "loader-0 <b>".into(), role: ThreadRole::loader(0) });
    let span = |stage, thread, start_ns, dur_ns, step| {
        Event::Span(SpanRecord {
            stage,
            thread,
            start_ns,
            dur_ns,
            cpu_ns: dur_ns,
            queue_ns: 0,
            step,
            sample: NONE,
            bytes: NONE,
        })
    };
    for k in 0..60u64 {
        let t0 = MS + k * 40 * MS;
        agg.push(&span(Stage::Decode, 2, t0, 28 * MS, k));
        agg.push(&span(Stage::Wait, 1, t0, 30 * MS, k));
        agg.push(&span(Stage::Compute, 1, t0 + 30 * MS, 10 * MS, k));
        let end_ns = t0 + 40 * MS;
        let (images, loss, correct, queued) = (4, 1.0 / (k + 1) as f32, 2, 0);
        let step =
            StepRecord { step: k, epoch: 0, images, loss, correct, end_ns, queued, validation: false, no_loss: false };
        agg.push(&Event::Step(step));
        let host = HostSample { t_ns: end_ns, process_cpu_pct: 90.0 + (k % 7) as f32, ..Default::default() };
        agg.push(&Event::Host(Box::new(host)));
    }
    let d = pipeprof_core::diagnose::Diagnosed::new(agg.summary());
    let p = dir.join("s.json");
    std::fs::write(&p, serde_json::to_string_pretty(&d).unwrap()).unwrap();
    p
}

#[test]
fn report_writes_the_page_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let s = summary_file(dir.path());
    let html = dir.path().join("report.html");
    let out = pipeprof(&["report", s.to_str().unwrap(), "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("pipeprof: HTML report written to {}", html.display())));
    assert!(text(&out.stdout).contains("── pipeprof report"), "the text report still prints");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>") && page.ends_with("</html>\n"));
    assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;q&quot;.toml"));
    assert!(!page.contains(HOSTILE_MODEL) && !page.to_lowercase().contains("<script"));
    assert_eq!(page.matches("<svg class=\"pp-chart\"").count(), 4);
    // No temporary file left beside it.
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(files.len(), 2, "{files:?}");
}

#[test]
fn a_dash_writes_the_page_or_the_fragment_to_stdout_instead_of_the_text_report() {
    let dir = tempfile::tempdir().unwrap();
    let s = summary_file(dir.path());
    let page = pipeprof(&["report", s.to_str().unwrap(), "--html", "-"]);
    assert!(page.status.success(), "{}", text(&page.stderr));
    let stdout = text(&page.stdout);
    // The page alone: nothing before or after it (the text report is inside it, folded).
    assert!(stdout.starts_with("<!DOCTYPE html>") && stdout.ends_with("</html>\n"), "{stdout}");
    assert!(!text(&page.stderr).contains("written to"), "stdout is not a file to name");
    let fragment = pipeprof(&["report", s.to_str().unwrap(), "--html-fragment", "-"]);
    let fragment = text(&fragment.stdout);
    assert!(fragment.starts_with("<div class=\"pipeprof\"><style>") && fragment.ends_with("</div>"), "{fragment}");
    assert!(stdout.contains(&fragment), "the fragment is the page's body");
    // Both to stdout, two files, or the page on `run`'s stdout: refused, nothing written.
    let both = pipeprof(&["report", s.to_str().unwrap(), "--html", "-", "--html-fragment", "-"]);
    assert!(!both.status.success() && text(&both.stderr).contains("stdout takes one of them"));
    let two = pipeprof(&["report", s.to_str().unwrap(), s.to_str().unwrap(), "--html", "x.html"]);
    assert!(!two.status.success() && text(&two.stderr).contains("report one run"), "{}", text(&two.stderr));
    let run = pipeprof(&["run", "--once", "--html", "-", "--", "true"]);
    assert_eq!(run.status.code(), Some(2), "{}", text(&run.stderr));
    assert!(text(&run.stderr).contains("--html -: the program's output"), "{}", text(&run.stderr));
    let attach = pipeprof(&["attach", "--once", "--html", "-", "1"]);
    assert_eq!(attach.status.code(), Some(2), "{}", text(&attach.stderr));
}

#[test]
fn an_html_file_in_a_missing_folder_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let s = summary_file(dir.path());
    let out = pipeprof(&["report", s.to_str().unwrap(), "--html", "/nonexistent/dir/r.html"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--html /nonexistent/dir/r.html: the folder /nonexistent/dir does not exist"));
    assert!(out.stdout.is_empty(), "no report before the usage error");
}

#[test]
fn a_summary_from_before_the_timeline_still_reports_and_says_why_charts_are_missing() {
    let dir = tempfile::tempdir().unwrap();
    let s = summary_file(dir.path());
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&s).unwrap()).unwrap();
    assert!(json.as_object_mut().unwrap().remove("timeline").is_some(), "the new summary has a timeline");
    std::fs::write(&s, json.to_string()).unwrap();
    let text_report = pipeprof(&["report", s.to_str().unwrap()]);
    assert!(text_report.status.success(), "{}", text(&text_report.stderr));
    let out = pipeprof(&["report", s.to_str().unwrap(), "--html", "-"]);
    let page = text(&out.stdout);
    assert_eq!(page.matches("no timeline in this summary").count(), 2, "{page}");
    assert_eq!(page.matches("<svg class=\"pp-chart\"").count(), 2);
}

/// Headless chromium with `args`, in a process group of its own that is killed when done
/// (its helpers too), holding none of the test's descriptors (a build lock among them).
fn chromium(args: &[String]) -> Output {
    let profile = tempfile::tempdir().unwrap();
    let mut c = Command::new("chromium");
    c.args(["--headless", "--disable-gpu", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: close_range is async-signal-safe; it only marks descriptors close-on-exec.
    unsafe {
        c.pre_exec(|| {
            libc::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32);
            Ok(())
        });
    }
    let child = c
        .spawn()
        .unwrap_or_else(|e| panic!("no `chromium` on PATH ({e}): apt-get install chromium (scripts/test.sh does)"));
    let _group = common::GroupKilledOnDrop(child.id() as i32);
    common::output_within(child, std::time::Duration::from_secs(120), "chromium")
}

/// Pixels of `png` within 3 of `rgb` in each channel.
fn pixels_of(png: &[u8], rgb: [u8; 3]) -> (u32, u32, usize) {
    let mut d = png::Decoder::new(std::io::Cursor::new(png));
    d.set_transformations(png::Transformations::normalize_to_color8());
    let mut r = d.read_info().unwrap();
    let mut buf = vec![0; r.output_buffer_size().unwrap()];
    let info = r.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    let near = |a: u8, b: u8| a.abs_diff(b) <= 3;
    let n = buf[..info.buffer_size()]
        .chunks(step)
        .filter(|p| near(p[0], rgb[0]) && near(p[1], rgb[1]) && near(p[2], rgb[2]))
        .count();
    (info.width, info.height, n)
}

#[test]
fn the_page_renders_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let s = summary_file(dir.path());
    let html = dir.path().join("report.html");
    let out = pipeprof(&["report", s.to_str().unwrap(), "--html", html.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let url = format!("file://{}", html.display());
    let dom = chromium(&["--dump-dom".into(), url.clone()]);
    assert!(dom.status.success(), "{}", text(&dom.stderr));
    let dom = text(&dom.stdout);
    // The browser's own DOM: the verdict's words, four charts, the names as text, no script.
    assert!(dom.contains("What limits this run") && dom.contains("class=\"pp-limiter\""), "{dom}");
    assert_eq!(dom.matches("<svg class=\"pp-chart\"").count(), 4, "{dom}");
    assert!(dom.contains("&lt;script&gt;alert(1)&lt;/script&gt;&amp;\"q\".toml"), "{dom}");
    assert!(!dom.to_lowercase().contains("<script"), "{dom}");
    let shot = dir.path().join("shot.png");
    let out = chromium(&[format!("--screenshot={}", shot.display()), "--window-size=1200,2000".into(), url]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG file");
    // Drawn, not only laid out: the step chart's wait bars (vermillion) and compute bars (blue).
    let (w, h, wait) = pixels_of(&png, [0xD5, 0x5E, 0x00]);
    let (_, _, compute) = pixels_of(&png, [0x00, 0x72, 0xB2]);
    assert_eq!((w, h), (1200, 2000));
    assert!(wait > 1000 && compute > 1000, "wait {wait} px, compute {compute} px");
}

#[test]
fn run_and_profile_write_the_page_when_they_end() {
    let dir = tempfile::tempdir().unwrap();
    // `run` of a program that sends nothing: the page of an empty run, said where it is.
    let html = dir.path().join("run.html");
    let out = pipeprof(&["run", "--once", "--no-gpu", "--html", html.to_str().unwrap(), "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = format!("pipeprof: HTML report written to {}", html.display());
    assert!(text(&out.stderr).contains(&said), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("not enough data") && page.contains("model true · data -"), "{page}");
    assert!(!page.contains("RUN FAILED"), "{page}");
    // A program that fails: the page says so, as the summary file does.
    let (html, summary) = (dir.path().join("failed.html"), dir.path().join("failed.json"));
    let out = pipeprof(&[
        "run",
        "--once",
        "--no-gpu",
        "--summary",
        summary.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--",
        "false",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let failed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    let why = failed["failed"].as_str().expect("the summary says the run failed");
    let page = std::fs::read_to_string(&html).unwrap();
    let said = format!("<strong>RUN FAILED:</strong> {}", pipeprof::html::escape(why));
    assert!(page.contains(&said), "{said} not in {page}");
    // `profile` of a few steps: its stages, its timeline's charts.
    let data = dir.path().join("data");
    common::demo(&data, 2, 8, 3);
    let model = common::write_tiny_model(dir.path());
    let html = dir.path().join("profile.html");
    let out = pipeprof(&[
        "profile",
        "--no-tui",
        "--no-gpu",
        "--model",
        &model,
        "--data",
        data.to_str().unwrap(),
        "--steps",
        "6",
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("pipeprof: HTML report written to {}", html.display())));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<th scope=\"row\">decode</th>") && page.contains("<dd>6</dd><dt>steps</dt>"), "{page}");
    assert!(!page.contains("no timeline in this summary"), "a new run has its timeline");
}
