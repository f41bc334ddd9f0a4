//! `pipeprof compare BASE NEW`: two saved runs side by side (the table `report A B` prints, or
//! one JSON document), and the gate a CI job puts on the new one: `--max-slowdown PCT`,
//! `--fail-if-input-bound [moderate|high]`. Exit 0 when it passes, 1 when it fails (each reason
//! a line on stderr), 2 when a file does not read.

use super::report::load;
use crate::report::render_comparison;
use pipeprof_core::diagnose::compare::{input_bound, severity_word, Comparison, Gate, Pair, StagePair};
use pipeprof_core::diagnose::Verdict;
use serde::Serialize;
use std::path::PathBuf;

/// What `pipeprof compare` was asked for.
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub base: PathBuf,
    pub new: PathBuf,
    pub gate: Gate,
    /// One JSON document on stdout instead of the table.
    pub json: bool,
}

/// The version of [`Json`]'s shape: raised when a field changes meaning or goes.
pub const COMPARE_SCHEMA: &str = "pipeprof.compare/1";

/// `pipeprof compare --json`.
#[derive(Debug, Serialize)]
struct Json<'a> {
    schema: &'static str,
    base: &'a std::path::Path,
    new: &'a std::path::Path,
    images_per_s: Pair,
    /// How much slower NEW trains than BASE, percent (negative: faster); null when unknown.
    slowdown_pct: Option<f64>,
    step_ms: Pair,
    wait_ms: Pair,
    transfer_ms: Pair,
    compute_ms: Pair,
    workers: Pair<usize>,
    batch_size: Pair<usize>,
    stages: &'a [StagePair],
    verdict: Verdicts<'a>,
    /// Whether the limiter or the severity differs.
    verdict_changed: bool,
    /// Why the gate fails, a line each; empty when it passes.
    failures: &'a [String],
    passed: bool,
}

#[derive(Debug, Serialize)]
struct Verdicts<'a> {
    base: VerdictJson<'a>,
    new: VerdictJson<'a>,
}

#[derive(Debug, Serialize)]
struct VerdictJson<'a> {
    limiter: &'a pipeprof_core::diagnose::Limiter,
    severity: &'static str,
    /// The input pipeline limits the run (storage, preprocessing, cores held by others).
    input_bound: bool,
    headline: &'a str,
}

impl<'a> VerdictJson<'a> {
    fn of(v: &'a Verdict) -> VerdictJson<'a> {
        VerdictJson {
            limiter: &v.limiter,
            severity: severity_word(v.severity),
            input_bound: input_bound(v).is_some(),
            headline: &v.headline,
        }
    }
}

/// Compares, prints, and returns the exit status: 0 passed, 1 the gate failed, 2 a file did
/// not read.
pub fn run(opts: &Options) -> anyhow::Result<i32> {
    // A file that does not read is no failed gate: 2, as a usage error, so a CI job tells them apart.
    let (base, new) = match load(&opts.base, false).and_then(|b| Ok((b, load(&opts.new, false)?))) {
        Ok(both) => both,
        Err(e) => {
            pipeprof_trainer::progress::say(&format!("error: {e:#}"));
            return Ok(2);
        }
    };
    let c = Comparison::of(&base.summary, &new.summary);
    let failures = opts.gate.failures(&c);
    if opts.json {
        let (vb, vn) = &c.verdicts;
        let json = Json {
            schema: COMPARE_SCHEMA,
            base: &opts.base,
            new: &opts.new,
            images_per_s: c.images_per_s,
            slowdown_pct: c.slowdown_pct(),
            step_ms: c.step_ms,
            wait_ms: c.wait_ms,
            transfer_ms: c.transfer_ms,
            compute_ms: c.compute_ms,
            workers: c.workers,
            batch_size: c.batch_size,
            stages: &c.stages,
            verdict: Verdicts { base: VerdictJson::of(vb), new: VerdictJson::of(vn) },
            verdict_changed: vb.limiter != vn.limiter || vb.severity != vn.severity,
            failures: &failures,
            passed: failures.is_empty(),
        };
        pipeprof_trainer::progress::out(&format!("{}\n", serde_json::to_string_pretty(&json)?));
    } else {
        pipeprof_trainer::progress::out(&render_comparison(&c, &opts.base, &opts.new));
    }
    for why in &failures {
        pipeprof_trainer::progress::say(&format!("pipeprof compare: FAILED: {why}"));
    }
    Ok(i32::from(!failures.is_empty()))
}
