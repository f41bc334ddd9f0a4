//! The page of one fixed run: pinned whole (insta), and checked for what must hold whatever
//! its look: no script, nothing fetched, every name escaped, every chart, the order.

use super::*;
use pipeprof_core::aggregate::timeline::TimelineBucket;
use pipeprof_core::aggregate::{EpochSummary, LoaderThread, StageSummary, StepSplit, Summary};
use pipeprof_core::diagnose::{Advice, Change, Flag, Limiter, Severity, Verdict};

const HOSTILE: &str = "<script>alert('x')</script> & \"q\" \u{1b}[2J";

fn stage(name: &str, count: u64, mean_ms: f64, on_cpu: Option<f64>) -> StageSummary {
    StageSummary {
        stage: probes::Stage::from_name(name).unwrap(),
        count,
        total_ms: mean_ms * count as f64,
        mean_ms,
        p50_ms: mean_ms * 0.9,
        p95_ms: mean_ms * 1.6,
        max_ms: mean_ms * 3.0,
        on_cpu,
        core_wait: on_cpu.map(|_| 0.02),
        bytes: 0,
        per_second: 1.0,
        trimmed_mean_ms: None,
    }
}

/// 10 s of a PyTorch run held back by decoding: 40 slices, a start-up wait in the first,
/// the GPU unsampled in two.
fn timeline() -> Vec<TimelineBucket> {
    (0..40)
        .map(|i| {
            let f = f64::from(i);
            TimelineBucket {
                t_s: f * 0.25,
                width_s: 0.25,
                steps: 6,
                wait_ms: if i == 0 { 900.0 } else { 24.0 + (f * 0.7).sin() * 4.0 },
                transfer_ms: 1.5,
                compute_ms: 14.0,
                images_per_s: 760.0,
                cpu_pct: Some(180.0 + (f * 0.3).cos() * 40.0),
                gpu_util_pct: if i == 12 || i == 13 { None } else { Some(35.0 + (f * 0.4).sin() * 10.0) },
            }
        })
        .collect()
}

/// A HIGH preprocessing verdict: a command with its gain, advice in words, a flag, a name.
fn verdict() -> Verdict {
    let workers = Advice {
        action: format!("DataLoader(num_workers=6) in {HOSTILE}"),
        change: Change::Workers(6),
        command: Change::Workers(6).command(),
        predicted_speedup: Some(2.4),
        reason: "decode takes 3.1 ms an image on 2 workers; 8 cores".into(),
        basis: None,
    };
    let resize = Advice {
        action: "resize the images to 224×224 once, offline".into(),
        change: Change::PreResize { width: 224, height: 224 },
        command: None,
        predicted_speedup: None,
        reason: "resize is 1.2 ms of every image's 4.7 ms".into(),
        basis: None,
    };
    Verdict {
        limiter: Limiter::Preprocess,
        severity: Severity::High,
        headline: "input-bound: the GPU waits 61% of every step for decoding".into(),
        evidence: vec![
            "wait for data 24.0ms of a 39.5ms step (61%)".into(),
            format!("loader thread {HOSTILE} busy 91%"),
        ],
        measures: Vec::new(),
        flags: vec![Flag::TooFewWorkers { workers: 2, cores: 8 }],
        advice: vec![workers, resize],
        provisional: false,
        now: None,
    }
}

fn fixture() -> Diagnosed {
    let mut s = Summary {
        schema_version: 1,
        steps: 240,
        images: 7680,
        elapsed_s: 10.0,
        images_per_s: 768.0,
        ..Default::default()
    };
    s.settings.model = format!("train{HOSTILE}.py").into();
    s.settings.framework = "pytorch".into();
    s.settings.device = "cuda:0".into();
    s.settings.data = "/data/cats & dogs/<train>".into();
    (s.settings.workers, s.settings.batch_size, s.settings.cores) = (2, 32, 8);
    s.stages = vec![
        stage("read", 7680, 0.4, Some(0.3)),
        stage("decode", 7680, 3.1, Some(0.97)),
        stage("resize", 7680, 1.2, Some(0.95)),
        stage("collate", 240, 2.0, Some(0.9)),
        stage("wait", 240, 24.0, None),
        stage("transfer", 240, 1.5, Some(0.4)),
        stage("compute", 240, 14.0, None),
        stage("forward", 240, 5.0, None),
        stage("backward", 240, 8.0, None),
        stage("optimizer", 240, 1.0, None),
    ];
    s.split = StepSplit {
        steps: 240,
        mean_step_ms: 39.5,
        wait_ms: 24.0,
        transfer_ms: 1.5,
        compute_ms: 14.0,
        wait_share: 24.0 / 39.5,
        transfer_share: 1.5 / 39.5,
        compute_share: 14.0 / 39.5,
        startup_wait_ms: 900.0,
        ..Default::default()
    };
    let worker = |name: &str, busy_ms, on_cpu| LoaderThread {
        thread: 1,
        name: name.into(),
        spans: 11_520,
        busy_ms,
        on_cpu,
        starts: 1,
    };
    s.loader_threads = vec![worker("pt_data_worker_0", 9400.0, Some(0.93)), worker(HOSTILE, 9100.0, Some(0.88))];
    s.loader_busy = 0.93;
    s.epochs = vec![
        EpochSummary {
            epoch: 1,
            steps: 120,
            images: 3840,
            loss: 2.2913,
            accuracy: 0.11,
            seconds: 5.2,
            ..Default::default()
        },
        EpochSummary {
            epoch: 2,
            steps: 120,
            images: 3840,
            loss: 1.8714,
            accuracy: 0.34,
            seconds: 4.8,
            ..Default::default()
        },
    ];
    s.timeline = timeline();
    s.machine.gpu_status = Some(probes::sampler::GpuStatus::Ok);
    Diagnosed { summary: s, verdict: Some(verdict()), straggler: None }
}

/// Whether every element opened in `html` is closed, in order (void and self-closed ones
/// apart): the page's structure is what a browser will build.
fn balanced(html: &str) -> Result<(), String> {
    const VOID: [&str; 3] = ["meta", "br", "!DOCTYPE"];
    let mut open: Vec<String> = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').ok_or("a tag never ends")?;
        let tag = &rest[..end];
        let name: String =
            tag.trim_start_matches('/').chars().take_while(|c| c.is_alphanumeric() || *c == '!').collect();
        if let Some(closing) = tag.strip_prefix('/') {
            let want = open.pop().ok_or(format!("</{closing}> closes nothing"))?;
            if want != name {
                return Err(format!("<{want}> closed by </{name}>"));
            }
        } else if !tag.ends_with('/') && !VOID.contains(&name.as_str()) {
            open.push(name);
        }
        rest = &rest[end..];
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!("never closed: {open:?}"))
    }
}

#[test]
fn the_page_of_a_fixed_run() {
    insta::assert_snapshot!(page(&fixture()));
}

#[test]
fn the_page_has_no_script_fetches_nothing_and_escapes_every_name() {
    let html = page(&fixture());
    let lower = html.to_lowercase();
    for banned in ["<script", "http:", "https:", "http", "url(", "@import", "src=", "href=", "javascript:", "onload"] {
        assert!(!lower.contains(banned), "{banned} in the page");
    }
    assert!(!html.contains(HOSTILE) && !html.contains('\u{1b}'), "a name went in raw");
    assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot; \u{241b}[2J"));
    assert!(html.contains("/data/cats &amp; dogs/&lt;train&gt;"));
    balanced(&html).unwrap();
}

#[test]
fn the_page_shows_the_verdict_first_then_the_run_tables_and_every_chart() {
    let html = page(&fixture());
    let at = |needle: &str| html.find(needle).unwrap_or_else(|| panic!("{needle} missing"));
    // The terminal report's words: the limiter, its severity, the command and its gain.
    let order = [
        "<h2 class=\"pp-limiter\">CPU preprocessing",
        "input-bound: HIGH",
        "input-bound: the GPU waits 61%",
        "too few workers: 2 on 8 cores",
        "<code>--workers 6</code><span class=\"pp-gain\">≈2.4× images/s</span>",
        "<strong>resize the images to 224×224 once, offline</strong>",
        "<dd>768.0</dd><dt>images/s</dt>",
        "<th scope=\"col\">core-wait</th>",
        "aria-label=\"step time over the run",
        "aria-label=\"CPU and GPU utilisation",
        "aria-label=\"each stage&#39;s share",
        "aria-label=\"each loader worker&#39;s busy share",
        "<th scope=\"col\">accuracy</th>",
        "<details><summary>The text report</summary>",
    ];
    let places: Vec<usize> = order.iter().map(|n| at(n)).collect();
    assert!(places.windows(2).all(|w| w[0] < w[1]), "out of order: {places:?}");
    assert_eq!(html.matches("<svg class=\"pp-chart\"").count(), 4);
    // 40 slices of 3 parts; the start-up slice is cut, with its mark.
    let step_chart = &html[at("aria-label=\"step time over the run")..];
    let step_chart = &step_chart[..step_chart.find("</svg>").unwrap()];
    // The cut slice shows its wait up to the cut, nothing above it.
    for (part, n) in [("pp-wait", 40), ("pp-transfer", 39), ("pp-compute", 39)] {
        assert_eq!(step_chart.matches(&format!("<rect class=\"{part}\"")).count(), n, "{part}");
    }
    assert_eq!(step_chart.matches("class=\"pp-cut\"").count(), 1);
    // The GPU line breaks where it was not sampled: two lines, two areas.
    assert_eq!(html.matches("class=\"pp-gpu pp-line\"").count(), 2);
    assert_eq!(html.matches("class=\"pp-cpu pp-line\"").count(), 1);
    // The stage table: the text report's cells.
    assert!(html.contains("<th scope=\"row\">decode</th><td>7680</td><td>3.10ms</td>"));
    assert!(html.contains("<tr class=\"pp-inner-row\"><th scope=\"row\">forward</th>"));
    assert!(html.contains("<td>1.8714</td><td>34.0%</td><td>4.8s</td>"));
}

#[test]
fn a_summary_without_a_timeline_says_so_and_keeps_the_other_charts() {
    let mut d = fixture();
    d.summary.timeline.clear();
    let html = fragment(&d);
    assert_eq!(html.matches(&escape(NO_TIMELINE)).count(), 2, "both charts over time say why they are missing");
    assert_eq!(html.matches("<svg class=\"pp-chart\"").count(), 2);
    balanced(&html).unwrap();
    // A summary of an older pipeprof, read back: no timeline key at all.
    let mut json = serde_json::to_value(&d).unwrap();
    json.as_object_mut().unwrap().remove("timeline");
    let old: Diagnosed = serde_json::from_value(json).unwrap();
    assert!(old.summary.timeline.is_empty());
    assert!(!serde_json::to_string(&old).unwrap().contains("timeline"), "an empty timeline is not written");
}

#[test]
fn the_fragment_is_the_page_body_and_carries_its_own_scoped_style() {
    let d = fixture();
    let (page, fragment) = (page(&d), fragment(&d));
    assert!(fragment.starts_with("<div class=\"pipeprof\"><style>") && fragment.ends_with("</div>"));
    assert!(page.contains(&format!("<body>\n{fragment}\n</body>")));
    // Every rule of the style is under .pipeprof: shown in a notebook, it restyles nothing else.
    let css = STYLE.replace("@media (max-width:600px){", "");
    for rule in css.split('}').map(str::trim).filter(|r| !r.is_empty()) {
        let selectors = rule.split('{').next().unwrap_or_default();
        for sel in selectors.split(',') {
            assert!(sel.trim().starts_with(".pipeprof"), "unscoped rule: {sel}");
        }
    }
}

#[test]
fn an_empty_summary_renders_without_numbers_that_are_not_numbers() {
    let d = Diagnosed::new(Summary::default());
    let html = page(&d);
    balanced(&html).unwrap();
    assert!(html.contains("not enough data"), "the verdict of nothing");
    for bad in ["NaN", "inf\"", "-inf"] {
        assert!(!html.contains(bad), "{bad} in an empty run's page");
    }
}
