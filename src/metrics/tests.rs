#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use pipeprof_core::aggregate::StageSummary;
use pipeprof_core::diagnose::{Limiter, Severity, Verdict};

fn stage(name: &str, p50_ms: f64, p95_ms: f64, on_cpu: Option<f64>) -> StageSummary {
    StageSummary {
        stage: probes::Stage::from_name(name).unwrap(),
        count: 10,
        total_ms: 0.0,
        mean_ms: p50_ms,
        p50_ms,
        p95_ms,
        max_ms: p95_ms,
        on_cpu,
        core_wait: None,
        bytes: 0,
        per_second: 0.0,
        trimmed_mean_ms: None,
    }
}

fn scrape(limiter: Option<Limiter>) -> Scrape {
    let mut summary = Summary::default();
    summary.settings.model = "examples/tiny.toml".into();
    summary.steps = 42;
    summary.images = 42 * 8;
    summary.images_per_s = 123.5;
    summary.split.mean_step_ms = 250.0;
    summary.split.wait_share = 0.4;
    summary.mean_queued = 1.5;
    summary.events_dropped = 7;
    summary.stages = vec![stage("read", 2.0, 8.0, Some(0.25)), stage("compute", 100.0, 120.0, None)];
    let gpu = GpuPoint { t_ns: 1, util_pct: vec![Some(75.0), None], mem_used_bytes: vec![Some(1024), Some(2048)] };
    let verdict = limiter.map(|limiter| Verdict {
        limiter,
        severity: Severity::High,
        headline: String::new(),
        evidence: vec![],
        measures: Vec::new(),
        flags: vec![],
        advice: vec![],
        provisional: false,
        now: None,
    });
    Scrape { summary, gpu: Some(gpu), verdict, straggler: None }
}

/// The value of the sample line that starts with `series` (name and labels exactly).
fn value(text: &str, series: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"));
    line[series.len()..].trim().parse().unwrap()
}

const L: &str = "program=\"tiny.toml\",rank=\"0\"";

#[test]
fn render_names_series_with_program_and_rank_labels_in_seconds() {
    let text = render(&scrape(Some(Limiter::Io)));
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert_eq!(value(&text, &format!("pipeprof_step_seconds{{{L}}}")), 0.25);
    assert_eq!(value(&text, &format!("pipeprof_wait_share{{{L}}}")), 0.4);
    assert_eq!(value(&text, &format!("pipeprof_images_per_second{{{L}}}")), 123.5);
    assert_eq!(value(&text, &format!("pipeprof_steps_total{{{L}}}")), 42.0);
    assert_eq!(value(&text, &format!("pipeprof_queue_batches_ready{{{L}}}")), 1.5);
    assert_eq!(value(&text, &format!("pipeprof_events_dropped_total{{{L}}}")), 7.0);
    assert!(text.contains("# TYPE pipeprof_steps counter"), "{text}");
}

#[test]
fn render_gives_stage_and_gpu_series_their_label_only_where_measured() {
    let text = render(&scrape(None));
    assert_eq!(value(&text, &format!("pipeprof_stage_p50_seconds{{{L},stage=\"read\"}}")), 0.002);
    assert_eq!(value(&text, &format!("pipeprof_stage_p95_seconds{{{L},stage=\"compute\"}}")), 0.12);
    assert_eq!(value(&text, &format!("pipeprof_stage_on_cpu_share{{{L},stage=\"read\"}}")), 0.25);
    assert!(!text.contains(&format!("pipeprof_stage_on_cpu_share{{{L},stage=\"compute\"}}")), "{text}");
    assert_eq!(value(&text, &format!("pipeprof_gpu_utilization_ratio{{{L},gpu=\"0\"}}")), 0.75);
    assert!(!text.contains(&format!("pipeprof_gpu_utilization_ratio{{{L},gpu=\"1\"}}")), "{text}");
    assert_eq!(value(&text, &format!("pipeprof_gpu_memory_used_bytes{{{L},gpu=\"1\"}}")), 2048.0);
}

#[test]
fn limiter_gauge_is_one_for_the_verdict_and_zero_for_the_fixed_others() {
    let text = render(&scrape(Some(Limiter::Io)));
    for l in LIMITERS {
        let want = if l == "io" { 1.0 } else { 0.0 };
        assert_eq!(value(&text, &format!("pipeprof_limiter{{{L},limiter=\"{l}\"}}")), want, "{l}");
    }
    let none = render(&scrape(None));
    assert_eq!(value(&none, &format!("pipeprof_limiter{{{L},limiter=\"not_enough_data\"}}")), 1.0);
    assert_eq!(value(&none, &format!("pipeprof_limiter{{{L},limiter=\"io\"}}")), 0.0);
}

#[test]
fn every_limiter_has_a_label_in_the_fixed_set() {
    let all = [
        Limiter::Io,
        Limiter::Contention,
        Limiter::Preprocess,
        Limiter::Transfer,
        Limiter::Compute,
        Limiter::Overhead,
        Limiter::Balanced,
        Limiter::NotEnoughData { steps_needed: 3 },
    ];
    for l in &all {
        assert!(LIMITERS.contains(&limiter_label(Some(l))), "{l:?}");
    }
}

#[test]
fn a_distributed_run_has_a_series_per_rank_and_the_straggler_gauge() {
    use pipeprof_core::aggregate::ranks::RankLine;
    let mut sc = scrape(Some(Limiter::Io));
    let line = |rank: u32, wait_ms: f64| RankLine {
        rank,
        local_rank: rank,
        world_size: 2,
        steps: 20,
        images: 160,
        images_per_s: 50.0,
        step_ms: 100.0,
        wait_ms,
        wait_share: wait_ms / 100.0,
        compute_ms: 100.0 - wait_ms,
        stages: vec![stage("wait", wait_ms, wait_ms, None)],
        ..Default::default()
    };
    sc.summary.ranks = vec![line(0, 6.0), line(1, 41.0)];
    // The collector judges the ranks with the verdict; the scrape shows its judgement.
    sc.straggler = pipeprof_core::diagnose::ranks::judge(&sc.summary.ranks);
    let text = render(&sc);
    let p = "program=\"tiny.toml\"";
    // The whole run is "all"; each rank its number.
    assert_eq!(value(&text, &format!("pipeprof_wait_share{{{p},rank=\"all\"}}")), 0.4);
    assert_eq!(value(&text, &format!("pipeprof_wait_share{{{p},rank=\"1\"}}")), 0.41);
    assert_eq!(value(&text, &format!("pipeprof_steps_total{{{p},rank=\"0\"}}")), 20.0);
    assert_eq!(value(&text, &format!("pipeprof_stage_p50_seconds{{{p},rank=\"1\",stage=\"wait\"}}")), 0.041);
    assert_eq!(value(&text, &format!("pipeprof_limiter{{{p},rank=\"all\",limiter=\"io\"}}")), 1.0);
    assert_eq!(value(&text, &format!("pipeprof_straggler{{{p},rank=\"1\"}}")), 1.0);
    assert_eq!(value(&text, &format!("pipeprof_straggler{{{p},rank=\"0\"}}")), 0.0);
    assert_eq!(value(&text, &format!("pipeprof_allreduce_wait_seconds{{{p},rank=\"0\"}}")), 0.035);
    // One process: no straggler series at all.
    assert!(!render(&scrape(None)).contains("pipeprof_straggler"));
}
