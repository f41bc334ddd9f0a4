//! The plain end-of-run report (for terminals, pipes and CI logs). Its machine section:
//! [`machine`].

pub mod json;
mod machine;

use pipeprof_core::aggregate::ranks::RankLine;
use pipeprof_core::aggregate::{Framework, Summary};
use pipeprof_core::diagnose::compare::{Comparison, Pair};
use pipeprof_core::diagnose::ranks::RanksVerdict;
use pipeprof_core::diagnose::{Diagnosed, Limiter, Verdict};
use pipeprof_core::units::{ms, pct};
use probes::Stage;
use std::fmt::Write;
use std::path::Path;

/// The report as text, ending with the verdict of the run (and of its ranks, in a distributed
/// run) it is handed: judged once, by whoever finished the run ([`Diagnosed`]).
pub fn render(d: &Diagnosed) -> String {
    let s = &d.summary;
    let verdict = &d.verdict();
    let mut o = String::new();
    render_header(&mut o, s);
    render_stage_table(&mut o, s);
    render_step_split(&mut o, s);
    render_compute_parts(&mut o, s);
    render_epochs(&mut o, s);
    machine::render_machine(&mut o, s);
    render_files(&mut o, s);
    o.push_str(&render_ranks(s, d.straggler().as_ref()));
    o.push_str(&render_verdict(verdict));
    o
}

/// Model, data, settings, simulations and throughput.
fn render_header(o: &mut String, s: &Summary) {
    let st = &s.settings;
    let _ = writeln!(o, "── pipeprof report ──────────────────────────────────────────────");
    if let Some(why) = &s.failed {
        let _ = writeln!(o, "RUN FAILED: {why}");
    }
    if !st.framework.is_own() {
        render_framework_header(o, s);
    } else {
        render_own_header(o, s);
    }
    for line in &st.auto_workers {
        let _ = writeln!(o, "workers auto: {line}");
    }
    for why in &st.unreadable {
        let _ = writeln!(o, "a setting the run sent did not read, left out: {why}");
    }
    render_run_line(o, s);
}

/// pipeprof's own training: the model and the loader's settings.
fn render_own_header(o: &mut String, s: &Summary) {
    let st = &s.settings;
    let _ = writeln!(o, "model {} ({}) · data {}", or_dash(&st.model.name()), model_facts(st), data_facts(st));
    let _ = writeln!(
        o,
        "device {} · {} loader worker{} on {} cores · batch {} · prefetch {}",
        or_dash(st.device.name()),
        st.workers,
        if st.workers == 1 { "" } else { "s" },
        st.cores,
        known(st.batch_size),
        st.prefetch
    );
}

/// A text setting, or `-` when the run never said it.
pub fn or_dash(v: &str) -> &str {
    if v.trim().is_empty() {
        "-"
    } else {
        v
    }
}

/// A count, or `-` for 0 (never measured: no model has 0 parameters, no batch 0 images).
pub fn known(n: usize) -> String {
    if n == 0 {
        "-".into()
    } else {
        n.to_string()
    }
}

/// "42,500 params, input 3×150×150", with `-` for what the run did not say.
fn model_facts(st: &pipeprof_core::aggregate::RunSettings) -> String {
    let input = if st.input.contains(&0) {
        "-".to_string()
    } else {
        format!("{}×{}×{}", st.input[0], st.input[1], st.input[2])
    };
    format!("{} params, input {input}", known(st.params))
}

/// "imgs (1200 images, 4 classes)", or `-` for a data set the run did not describe.
pub fn data_facts(st: &pipeprof_core::aggregate::RunSettings) -> String {
    let mut parts = Vec::new();
    if st.images > 0 {
        parts.push(format!("{} images", st.images));
    }
    if !st.classes.is_empty() {
        parts.push(format!("{} classes", st.classes.len()));
    }
    match (st.data.trim().is_empty(), parts.is_empty()) {
        (true, true) => "-".into(),
        (true, false) => format!("({})", parts.join(", ")),
        (false, true) => st.data.clone(),
        (false, false) => format!("{} ({})", st.data, parts.join(", ")),
    }
}

/// A Python program's header: its name, framework and DataLoader arguments as written.
fn render_framework_header(o: &mut String, s: &Summary) {
    let st = &s.settings;
    let data =
        if st.data.is_empty() && st.images == 0 { String::new() } else { format!(" · data {}", data_facts(st)) };
    let _ = writeln!(o, "program {} ({}){data}", st.model, st.framework);
    let mut knobs = vec![format!("batch_size={}", known(st.batch_size)), format!("num_workers={}", st.workers)];
    if let Some(p) = st.pin_memory {
        knobs.push(format!("pin_memory={}", py_bool(p)));
    }
    if let Some(p) = st.persistent_workers {
        knobs.push(format!("persistent_workers={}", py_bool(p)));
    }
    if let Some(f) = st.prefetch_factor {
        knobs.push(format!("prefetch_factor={f}"));
    }
    let device = if st.device.is_unseen() { "not seen" } else { st.device.name() };
    let loader = if st.framework == Framework::Keras { "fit" } else { "DataLoader" };
    let _ = writeln!(o, "device {device} · {loader}({}) on {} cores", knobs.join(", "), st.cores);
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// Simulations and throughput, for every run.
fn render_run_line(o: &mut String, s: &Summary) {
    let st = &s.settings;
    for sim in &st.simulated {
        let _ = writeln!(o, "SIMULATION: {sim}: these timings are not your machine's own");
    }
    match first_step_apart(s) {
        Some((first_ms, rate)) => {
            let _ = writeln!(
                o,
                "trained {} steps, {} images in {:.1} s: {:.1} images/s, plus a {:.1} s first step (a compile or warm-up; on a GPU, CUDA compiling kernels: CUDA_CACHE_PATH keeps them for the next run) left out",
                s.steps,
                s.images,
                s.elapsed_s,
                rate,
                first_ms / 1000.0
            );
        }
        None => {
            let _ = writeln!(
                o,
                "trained {} steps, {} images in {:.1} s: {:.1} images/s",
                s.steps, s.images, s.elapsed_s, s.images_per_s
            );
        }
    }
}

/// A first step long enough to move the run's rate (≥ [`FIRST_STEP_SHARE`] of the run and ≥
/// 100 ms more than a typical one): its length, ms, and the rate without it.
pub fn first_step_apart(s: &Summary) -> Option<(f64, f64)> {
    let first = s.split.startup_compute_ms?;
    let extra = first - s.split.compute_ms;
    let run_ms = s.elapsed_s * 1000.0;
    if !(extra >= 100.0 && run_ms > 0.0 && extra / run_ms >= FIRST_STEP_SHARE) {
        return None;
    }
    let rate = pipeprof_core::diagnose::measured_now(s)?.rate;
    (rate.is_finite() && rate > 0.0).then_some((first, rate))
}

/// Share of the run a one-off first step must take to be said apart in the headline.
const FIRST_STEP_SHARE: f64 = 0.05;

/// The stage table's columns (the text report's and the HTML report's).
pub const STAGE_COLUMNS: [&str; 10] =
    ["stage", "count", "mean", "p50", "p95", "max", "total", "on-CPU", "core-wait", "blocked"];

/// One stage's row of the stage table, cell by cell, in [`STAGE_COLUMNS`] order.
pub fn stage_cells(x: &pipeprof_core::aggregate::StageSummary) -> [String; 10] {
    let share = |v: Option<f64>| v.map(pct).unwrap_or_else(|| "-".into());
    [
        x.stage.to_string(),
        x.count.to_string(),
        ms(x.mean_ms),
        ms(x.p50_ms),
        ms(x.p95_ms),
        ms(x.max_ms),
        ms(x.total_ms),
        share(x.on_cpu),
        share(x.core_wait),
        share(x.blocked()),
    ]
}

/// A part of compute (forward, backward, optimizer): shown under `compute`, indented.
pub fn is_inner_stage(x: &pipeprof_core::aggregate::StageSummary) -> bool {
    [Stage::Forward, Stage::Backward, Stage::Optimizer].iter().any(|k| x.is(*k))
}

/// Per-stage timings with the on-CPU / core-wait / blocked split.
fn render_stage_table(o: &mut String, s: &Summary) {
    let _ = writeln!(o);
    let row = |o: &mut String, c: &[String]| {
        let _ = writeln!(
            o,
            "{:<11} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>7}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
        );
    };
    row(o, &STAGE_COLUMNS.map(String::from));
    for x in &s.stages {
        let mut cells = stage_cells(x);
        if is_inner_stage(x) {
            cells[0] = format!("  {}", cells[0]);
        }
        row(o, &cells);
    }
}

/// Where a step's time goes, and how busy the loader was.
fn render_step_split(o: &mut String, s: &Summary) {
    let st = &s.settings;
    let sp = &s.split;
    let _ = writeln!(o);
    let transfer = if st.transfer_unmeasured {
        "- (not timed apart: inside compute)".to_string()
    } else {
        format!("{} ({})", ms(sp.transfer_ms), pct(sp.transfer_share))
    };
    let _ = writeln!(
        o,
        "step time {} on average: wait for data {} ({}) · transfer {transfer} · compute {} ({})",
        ms(sp.mean_step_ms),
        ms(sp.wait_ms),
        pct(sp.wait_share),
        ms(sp.compute_ms),
        pct(sp.compute_share)
    );
    if let Some(k) = sp.from_step {
        let _ =
            writeln!(o, "  (steps {k} on: the pipeline after the last change of workers; earlier steps ran another)");
    }
    if sp.startup_wait_ms > 0.0 {
        let _ = writeln!(
            o,
            "  (start-up: the first step waited {} while the queue filled; left out above)",
            ms(sp.startup_wait_ms)
        );
    }
    if let Some(c) = sp.startup_compute_ms {
        let _ =
            writeln!(o, "  (start-up: the first step computed for {} (a compile or warm-up); left out above)", ms(c));
    }
    let _ = writeln!(
        o,
        "loader: {} worker{} busy {} of the run · {:.1} batches ready on average when a step asked",
        st.workers,
        if st.workers == 1 { "" } else { "s" },
        pct(s.loader_busy),
        s.mean_queued
    );
    render_loader_threads(o, s);
}

/// Parts of the compute step shown; the rest are summed on one line.
const COMPUTE_PARTS_SHOWN: usize = 6;

/// Where compute goes, layer by layer and pass by pass, largest first.
fn render_compute_parts(o: &mut String, s: &Summary) {
    let parts = s.compute_parts();
    if parts.is_empty() {
        return;
    }
    let _ = writeln!(o);
    let timed = match s.layer_steps {
        0 => String::new(),
        1 => " (1 step timed layer by layer)".to_string(),
        n => format!(" ({n} steps timed layer by layer)"),
    };
    let _ = writeln!(o, "compute per step, by layer and pass, largest first{timed}:");
    for p in parts.iter().take(COMPUTE_PARTS_SHOWN) {
        let _ = writeln!(o, "  {:<28} {:>9}  {:>4} of compute", p.label, ms(p.ms), pct(p.share));
    }
    if parts.len() > COMPUTE_PARTS_SHOWN {
        let rest = &parts[COMPUTE_PARTS_SHOWN..];
        let (ms_sum, share) = rest.iter().fold((0.0, 0.0), |(m, sh), p| (m + p.ms, sh + p.share));
        let _ = writeln!(o, "  {:<28} {:>9}  {:>4} of compute", format!("{} more", rest.len()), ms(ms_sum), pct(share));
    }
}

/// The epoch table's columns: Keras' (val_loss / val_accuracy only when a validation pass ran).
pub fn epoch_columns(s: &Summary) -> Vec<&'static str> {
    let mut c = vec!["epoch", "steps", "images", "loss", "accuracy", "time"];
    if s.epochs.iter().any(|e| e.val_loss.is_some()) {
        c.extend(["val_loss", "val_accuracy"]);
    }
    c
}

/// One epoch's row, cell by cell, in [`epoch_columns`] order (`-` for what was not measured).
pub fn epoch_cells(s: &Summary, e: &pipeprof_core::aggregate::EpochSummary) -> Vec<String> {
    let no_acc = s.settings.no_accuracy;
    let acc = |a: f64| if no_acc { "-".to_string() } else { format!("{:.1}%", a * 100.0) };
    let epoch = match e.through {
        Some(t) => format!("{}–{t}", e.epoch),
        None => e.epoch.to_string(),
    };
    let mut c = vec![
        epoch,
        e.steps.to_string(),
        e.images.to_string(),
        if e.no_loss { "-".to_string() } else { format!("{:.4}", e.loss) },
        acc(e.accuracy),
        format!("{:.1}s", e.seconds),
    ];
    if s.epochs.iter().any(|e| e.val_loss.is_some()) {
        match (e.val_loss, e.val_accuracy) {
            (Some(l), Some(a)) => c.extend([format!("{l:.4}"), acc(a)]),
            _ => c.extend(["-".to_string(), "-".to_string()]),
        }
    }
    c
}

/// Keras-style epoch table (with validation columns when a pass ran).
fn render_epochs(o: &mut String, s: &Summary) {
    if !s.epochs.is_empty() {
        let row = |o: &mut String, c: &[String]| {
            let _ = write!(o, "{:<6} {:>6} {:>8} {:>9} {:>9} {:>8}", c[0], c[1], c[2], c[3], c[4], c[5]);
            if c.len() > 6 {
                let _ = write!(o, " {:>9} {:>12}", c[6], c[7]);
            }
            let _ = writeln!(o);
        };
        let _ = writeln!(o);
        row(o, &epoch_columns(s).into_iter().map(String::from).collect::<Vec<_>>());
        for e in &s.epochs {
            row(o, &epoch_cells(s, e));
        }
        let val_images: u64 = s.epochs.iter().map(|e| e.val_images).sum();
        if val_images > 0 {
            let trained: u64 = s.epochs.iter().map(|e| e.images).sum();
            let _ = writeln!(o, "validation evaluated {val_images} images, apart from the {trained} trained");
        }
        if let Some(share) = s.validation_share().filter(|v| *v >= pipeprof_core::diagnose::VALIDATION_SHARE) {
            // No GPU words in a run without one.
            let idle = if s.trains_on_cpu() { "no training step" } else { "the GPU trains nothing" };
            let _ = writeln!(o, "validation passes took {} of the run's wall time ({idle} meanwhile)", pct(share));
        }
    }
}

/// Skipped and ignored files, and the event counts.
fn render_files(o: &mut String, s: &Summary) {
    let st = &s.settings;
    let _ = writeln!(o);
    if s.skipped_count > 0 {
        let _ =
            writeln!(o, "skipped files: {} (unreadable or undecodable; the run went on without them)", s.skipped_count);
        for k in &s.skipped {
            let _ = writeln!(o, "  {}: {}", k.path, k.reason);
        }
        if s.skipped_count as usize > s.skipped.len() {
            let _ = writeln!(o, "  … and {} more", s.skipped_count as usize - s.skipped.len());
        }
    } else {
        let _ = writeln!(o, "skipped files: 0");
    }
    if !st.ignored.is_empty() {
        let _ = writeln!(o, "ignored (not images pipeprof reads): {}", st.ignored);
    }
    let _ = writeln!(
        o,
        "events: {} received, {} dropped{}",
        s.events_received,
        s.events_dropped,
        if s.events_dropped > 0 { " (channel full: statistics undercount; raise --channel-capacity)" } else { "" }
    );
    let _ = writeln!(o);
}

/// The verdict as a plain-text block for the end-of-run report.
pub fn render_verdict(v: &Verdict) -> String {
    let mut o = String::new();
    let severity = severity_words(v).map(|w| format!(" · {w}")).unwrap_or_default();
    let _ = writeln!(o, "verdict: {}{severity}", v.limiter.label());
    let _ = writeln!(o, "  {}", v.headline);
    if !v.evidence.is_empty() {
        let _ = writeln!(o, "evidence");
        for e in &v.evidence {
            let _ = writeln!(o, "  · {e}");
        }
    }
    if !v.flags.is_empty() {
        let _ = writeln!(o, "flags");
        for f in &v.flags {
            let _ = writeln!(o, "  ! {}", f.describe());
        }
    }
    if !v.advice.is_empty() {
        let _ = writeln!(o, "advice");
        for a in &v.advice {
            let t = advice_text(a);
            let gain = t.gain.map(|g| format!(": {g}")).unwrap_or_default();
            let _ = writeln!(o, "  → {}{gain} ({})", t.what, t.reason);
            if let Some(action) = t.action {
                let _ = writeln!(o, "    {action}");
            }
        }
    }
    o
}

/// "input-bound: HIGH": how much the limiter costs, or `None` before there is a verdict.
pub fn severity_words(v: &Verdict) -> Option<String> {
    match v.limiter {
        Limiter::NotEnoughData { .. } => None,
        _ => Some(format!("input-bound: {}", v.severity.label())),
    }
}

/// One piece of advice as every view words it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdviceText {
    /// The command when there is one (it is what the reader copies), else the action.
    pub what: String,
    /// The predicted gain, when the model can say.
    pub gain: Option<String>,
    /// Why it should help.
    pub reason: String,
    /// The action in words, after a command.
    pub action: Option<String>,
}

/// The words of one piece of advice (the text report's and the HTML report's).
pub fn advice_text(a: &pipeprof_core::diagnose::Advice) -> AdviceText {
    let command = a.command.clone();
    AdviceText {
        action: command.as_ref().map(|_| a.action.clone()),
        what: command.unwrap_or_else(|| a.action.clone()),
        gain: a.gain_words(),
        reason: a.reason.clone(),
    }
}

/// Loader threads listed one per line; more are summed in one line.
pub const LOADER_THREADS_LISTED: usize = 12;

/// Each loader thread (worker processes' included) with its on/off-CPU split: one slow
/// worker, or workers all off CPU (waiting on storage), show up here.
fn render_loader_threads(o: &mut String, s: &Summary) {
    // One thread is the whole loader: the stage table already says it all.
    if s.loader_threads.len() < 2 {
        return;
    }
    let width = s.loader_threads.iter().take(LOADER_THREADS_LISTED).map(|t| t.name.chars().count()).max().unwrap_or(0);
    for t in s.loader_threads.iter().take(LOADER_THREADS_LISTED) {
        let _ = writeln!(
            o,
            "  {:<width$}  {:>7} spans  busy {:>9}  on-CPU {:>4}{}",
            t.name,
            t.spans,
            ms(t.busy_ms),
            t.on_cpu.map(pct).unwrap_or_else(|| "-".into()),
            if t.starts > 1 { format!("  started {}×", t.starts) } else { String::new() }
        );
    }
    // Workers started again and again: each start is a new process that imports, forks and
    // fills its first batch before the loop gets one.
    if let Some(most) = s.loader_threads.iter().map(|t| t.starts).max().filter(|n| *n > 1) {
        let keep = if s.settings.framework == Framework::PyTorch {
            " (DataLoader(persistent_workers=True) keeps them)"
        } else {
            ""
        };
        let _ = writeln!(o, "  the workers were started up to {most} times: once per pass over a loader{keep}");
    }
    let rest = &s.loader_threads[s.loader_threads.len().min(LOADER_THREADS_LISTED)..];
    if !rest.is_empty() {
        let busy: f64 = rest.iter().map(|t| t.busy_ms).sum();
        let _ = writeln!(o, "  … and {} more threads, busy {} in all", rest.len(), ms(busy));
    }
}

/// Ranks with their own column in the stage table at most (wider runs list their lines only).
const RANK_COLUMNS: usize = 8;

/// A distributed run: one line per rank, each stage's mean by rank, and the straggler verdict
/// it is handed (`verdict`). Empty for a run of one process.
pub fn render_ranks(s: &Summary, verdict: Option<&RanksVerdict>) -> String {
    let mut o = String::new();
    if s.ranks.is_empty() {
        return o;
    }
    let world = s.ranks.iter().map(|l| l.world_size).max().unwrap_or(0);
    let nodes = pipeprof_core::aggregate::ranks::nodes_of(&s.ranks).len();
    let on = if nodes > 1 { format!(" from {nodes} nodes") } else { String::new() };
    let _ = writeln!(o, "ranks: {} of {world} reported{on}", s.ranks.len());
    let sync =
        |rank: u32| verdict.as_ref().and_then(|v| v.sync_wait_ms.iter().find(|(r, _)| *r == rank)).map(|(_, w)| *w);
    for l in &s.ranks {
        let _ = writeln!(
            o,
            "  rank {}{} · {} steps · {:.1} images/s · step {} · wait for data {} ({}) · all-reduce wait {} · loader busy {} · GPU {}{}",
            l.rank,
            l.node.as_ref().filter(|_| nodes > 1).map(|n| format!(" on node {n}")).unwrap_or_default(),
            l.steps,
            l.images_per_s,
            ms(l.step_ms),
            pct(l.wait_share),
            ms(l.wait_ms),
            sync(l.rank).map(ms).unwrap_or_else(|| "-".into()),
            pct(l.loader_busy),
            l.gpu_util_pct.map(|g| format!("{g:.0}%")).unwrap_or_else(|| "-".into()),
            l.failed.as_ref().map(|f| format!(" · FAILED: {f}")).unwrap_or_default()
        );
    }
    if s.ranks.len() <= RANK_COLUMNS {
        render_rank_columns(&mut o, &s.ranks);
    }
    render_straggler(&mut o, verdict);
    o
}

/// One node of a job: its name, job and node rank, then its machine section (CPU, storage,
/// the data's file system, GPUs).
pub fn render_node(s: &Summary) -> String {
    let mut o = String::new();
    let Some(n) = &s.settings.node else { return o };
    let job = n.job.as_ref().map(|j| format!(" · job {j}")).unwrap_or_default();
    let rank = n.node_rank.map(|r| format!(" · node rank {r}")).unwrap_or_default();
    let ranks: Vec<String> = s.ranks.iter().map(|l| l.rank.to_string()).collect();
    let _ = writeln!(o);
    let _ = write!(o, "node {}{job}{rank} · ranks {}", n.name, ranks.join(", "));
    machine::render_machine(&mut o, s);
    o
}

/// Each stage's mean by rank, a column per rank; stages no rank ran left out.
fn render_rank_columns(o: &mut String, ranks: &[RankLine]) {
    let mut head = format!("  {:<12}", "mean by rank");
    for l in ranks {
        let _ = write!(head, " {:>10}", format!("rank {}", l.rank));
    }
    let _ = writeln!(o, "{}", head.trim_end());
    for st in Stage::ALL {
        let cells: Vec<Option<f64>> =
            ranks.iter().map(|l| l.stages.iter().find(|x| x.stage == st && x.count > 0).map(|x| x.mean_ms)).collect();
        if cells.iter().all(Option::is_none) {
            continue;
        }
        let mut row = format!("  {:<12}", st.name());
        for c in cells {
            let _ = write!(row, " {:>10}", c.map(ms).unwrap_or_else(|| "-".into()));
        }
        let _ = writeln!(o, "{row}");
    }
}

/// The straggler verdict: which rank, its headline, evidence and advice; or why none.
fn render_straggler(o: &mut String, verdict: Option<&RanksVerdict>) {
    match verdict {
        None => {
            let _ = writeln!(
                o,
                "straggler: not judged (needs two ranks with {} steps or more)",
                pipeprof_core::diagnose::ranks::RANK_MIN_STEPS
            );
        }
        Some(v) => {
            match v.straggler {
                Some(r) => {
                    let on = v.node.as_ref().map(|n| format!(" on node {n}")).unwrap_or_default();
                    let _ = writeln!(o, "straggler: rank {r}{on}");
                }
                None => {
                    let _ = writeln!(o, "straggler: none");
                }
            }
            let _ = writeln!(o, "  {}", v.headline);
            for e in &v.evidence {
                let _ = writeln!(o, "  · {e}");
            }
            for a in &v.advice {
                let _ = writeln!(o, "  → {a}");
            }
        }
    }
}

/// `new / base` as `1.25×`, or `-` where either is not positive.
fn ratio(p: Pair) -> String {
    p.ratio().map_or_else(|| "-".into(), |r| format!("{r:.2}×"))
}

/// Two runs side by side (`pipeprof report A B`, `pipeprof compare BASE NEW`): images/s (each
/// run's rate as its verdict reads it, `verdict.now`), the step split and each stage's mean, the
/// verdict before → after. `pa`, `pb`: the files read.
pub fn render_comparison(c: &Comparison, pa: &Path, pb: &Path) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "── pipeprof compare ─────────────────────────────────────────────");
    let _ = writeln!(o, "A = {}  ({})", pa.display(), c.models.0);
    let _ = writeln!(o, "B = {}  ({})", pb.display(), c.models.1);
    let _ = writeln!(o);
    let _ = writeln!(o, "{:<22} {:>12} {:>12} {:>9}", "", "A", "B", "B / A");
    let row = |o: &mut String, name: &str, p: Pair, unit: &str| {
        let (x, y) = (format!("{:.2}{unit}", p.base), format!("{:.2}{unit}", p.new));
        let _ = writeln!(o, "{name:<22} {x:>12} {y:>12} {:>9}", ratio(p));
    };
    row(&mut o, "images/s", c.images_per_s, "");
    row(&mut o, "step time", c.step_ms, " ms");
    row(&mut o, "  wait for data", c.wait_ms, " ms");
    row(&mut o, "  transfer", c.transfer_ms, " ms");
    row(&mut o, "  compute", c.compute_ms, " ms");
    let (a, b) =
        (format!("{} · {}", c.workers.base, c.batch_size.base), format!("{} · {}", c.workers.new, c.batch_size.new));
    let _ = writeln!(o, "{:<22} {a:>12} {b:>12}", "workers · batch");
    let _ = writeln!(o);
    let _ = writeln!(o, "mean per stage");
    for s in &c.stages {
        row(&mut o, &format!("  {}", s.stage), s.ms, " ms");
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "verdict: {}  →  {}", c.verdicts.0.headline, c.verdicts.1.headline);
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report of `s` with its verdict (and its ranks', where it has them), as a run ends.
    fn text(s: &Summary) -> String {
        let straggler = pipeprof_core::diagnose::ranks::judge(&s.ranks);
        render(&Diagnosed { summary: s.clone(), verdict: Some(pipeprof_core::diagnose::diagnose(s)), straggler })
    }
    use pipeprof_core::aggregate::{EpochSummary, Skipped, StageSummary};

    #[test]
    fn report_shows_stages_epochs_skips_and_drops() {
        let mut s = Summary { steps: 3, images: 12, events_dropped: 7, skipped_count: 1, ..Default::default() };
        s.stages.push(StageSummary {
            stage: Stage::Decode,
            count: 12,
            total_ms: 24.0,
            mean_ms: 2.0,
            p50_ms: 2.0,
            p95_ms: 3.0,
            max_ms: 4.0,
            on_cpu: Some(0.97),
            core_wait: None,
            bytes: 0,
            per_second: 1.0,
            trimmed_mean_ms: None,
        });
        s.epochs.push(EpochSummary {
            no_loss: false,
            epoch: 1,
            steps: 3,
            images: 12,
            loss: 1.25,
            accuracy: 0.5,
            seconds: 1.0,
            val_loss: None,
            val_accuracy: None,
            val_images: 0,
            through: None,
        });
        s.skipped.push(Skipped { path: "a/b.png".into(), reason: "truncated".into() });
        let r = text(&s);
        assert!(r.contains("decode") && r.contains("2.00ms") && r.contains("97%"), "{r}");
        assert!(r.contains("1.2500") && r.contains("50.0%"), "{r}");
        assert!(r.contains("a/b.png: truncated"), "{r}");
        assert!(r.contains("7 dropped"), "{r}");
        assert!(!r.contains("val_loss"), "no validation, no columns: {r}");
    }

    #[test]
    fn what_the_run_never_said_is_a_dash_not_a_zero() {
        // A program under `pipeprof run` that sent no settings of its own (a shell script).
        let mut s = Summary { steps: 3, images: 0, ..Default::default() };
        s.settings.model = "sh".into();
        s.epochs.push(EpochSummary { no_loss: true, epoch: 1, steps: 3, ..Default::default() });
        let r = text(&s);
        assert!(r.contains("model sh (- params, input -) · data -"), "{r}");
        assert!(r.contains("device - ·") && r.contains("batch - ·"), "{r}");
        assert!(!r.contains("0×0×0") && !r.contains("0 classes") && !r.contains("0.0000"), "{r}");
        // A PyTorch program whose copies to the device are inside compute.
        s.settings.framework = "pytorch".into();
        s.settings.transfer_unmeasured = true;
        s.split = pipeprof_core::aggregate::StepSplit {
            steps: 3,
            mean_step_ms: 2.0,
            compute_ms: 2.0,
            compute_share: 1.0,
            ..Default::default()
        };
        let r = text(&s);
        assert!(r.contains("transfer - (not timed apart: inside compute)"), "{r}");
        assert!(r.contains("batch_size=-"), "{r}");
    }

    #[test]
    fn a_long_first_step_is_said_apart_from_the_rate() {
        // 1500 steps of 1.57 ms after an 18.5 s first step (CUDA compiling PTX).
        let mut s = Summary { steps: 1500, images: 48_000, elapsed_s: 21.3, ..Default::default() };
        s.images_per_s = 48_000.0 / 21.3;
        s.split = pipeprof_core::aggregate::StepSplit {
            steps: 1500,
            mean_step_ms: 1.57,
            compute_ms: 1.57,
            compute_share: 1.0,
            startup_compute_ms: Some(18_500.0),
            ..Default::default()
        };
        let r = text(&s);
        let line = r.lines().find(|l| l.starts_with("trained")).unwrap();
        assert!(line.contains("plus a 18.5 s first step"), "{line}");
        let rate: f64 = line.split(": ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(rate > 15_000.0 && rate < 25_000.0, "the rate without the first step: {line}");
    }

    #[test]
    fn report_lists_the_largest_layer_passes_as_shares_of_compute() {
        let mut s = Summary { steps: 5, ..Default::default() };
        let stage = |name: &str, mean_ms: f64| StageSummary {
            stage: Stage::from_name(name).unwrap(),
            count: 5,
            total_ms: mean_ms * 5.0,
            mean_ms,
            p50_ms: mean_ms,
            p95_ms: mean_ms,
            max_ms: mean_ms,
            on_cpu: None,
            core_wait: None,
            bytes: 0,
            per_second: 1.0,
            trimmed_mean_ms: None,
        };
        s.stages.push(stage("compute", 200.0));
        s.stages.push(stage("optimizer", 20.0));
        for (i, name) in ["conv2d_1", "max_pooling2d_1", "conv2d_2", "flatten_1", "dense_1"].iter().enumerate() {
            let backward_ms = if *name == "dense_1" { 122.0 } else { i as f64 };
            s.layers.push(pipeprof_core::aggregate::LayerSummary {
                name: name.to_string(),
                forward_ms: 1.0,
                backward_ms,
            });
        }
        let r = text(&s);
        let lines: Vec<&str> = r.lines().skip_while(|l| !l.starts_with("compute per step")).collect();
        assert!(lines[1].contains("dense_1 backward") && lines[1].contains("61% of compute"), "{r}");
        assert!(lines[2].contains("optimizer") && lines[2].contains("10% of compute"), "{r}");
        // 11 parts: 6 shown, the other 5 on one line.
        assert!(lines[7].contains("5 more"), "{r}");
    }

    fn line_of(r: &str, name: &str) -> String {
        r.lines().find(|l| l.contains(name)).unwrap_or_default().to_string()
    }

    #[test]
    fn report_lists_loader_threads_with_their_on_cpu_share() {
        use pipeprof_core::aggregate::LoaderThread;
        let t = |name: &str, busy_ms, on_cpu| LoaderThread {
            thread: 1,
            name: name.into(),
            spans: 40,
            busy_ms,
            on_cpu,
            starts: 1,
        };
        let mut s = Summary {
            loader_threads: vec![t("loader-1", 300.0, Some(0.12)), t("loader-0", 120.0, Some(0.95))],
            ..Default::default()
        };
        let r = text(&s);
        let line = |name: &str| r.lines().find(|l| l.contains(name)).unwrap_or_default().to_string();
        assert!(line("loader-1").contains("12%"), "{r}");
        assert!(line("loader-0").contains("95%") && line("loader-0").contains("40 spans"), "{r}");
        assert!(!r.contains("started"), "workers started once say nothing of starts: {r}");
        s.loader_threads[0].starts = 6;
        s.settings.framework = "pytorch".into();
        let r = text(&s);
        assert!(line_of(&r, "loader-1").contains("started 6×"), "{r}");
        assert!(
            r.contains("started up to 6 times: once per pass over a loader (DataLoader(persistent_workers=True)"),
            "{r}"
        );
        for i in 0..20 {
            s.loader_threads.push(t(&format!("w{i}"), 1.0, None));
        }
        assert!(text(&s).contains("… and 10 more threads"), "{}", text(&s));
    }

    #[test]
    fn report_shows_keras_val_columns_and_a_large_validation_share() {
        let mut s = Summary { steps: 3, images: 12, elapsed_s: 10.0, ..Default::default() };
        s.stages.push(StageSummary {
            stage: Stage::Validate,
            count: 2,
            total_ms: 3000.0,
            mean_ms: 1500.0,
            p50_ms: 1500.0,
            p95_ms: 1500.0,
            max_ms: 1500.0,
            on_cpu: None,
            core_wait: None,
            bytes: 0,
            per_second: 0.2,
            trimmed_mean_ms: None,
        });
        s.epochs.push(EpochSummary {
            no_loss: false,
            epoch: 1,
            steps: 3,
            images: 12,
            loss: 1.25,
            accuracy: 0.5,
            seconds: 1.0,
            val_loss: Some(0.875),
            val_accuracy: Some(0.75),
            val_images: 8,
            through: None,
        });
        let r = text(&s);
        assert!(r.contains("val_loss") && r.contains("val_accuracy"), "{r}");
        assert!(r.contains("0.8750") && r.contains("75.0%"), "{r}");
        assert!(r.contains("validation passes took 30% of the run's wall time"), "{r}");
        assert!(r.contains("validation evaluated 8 images, apart from the 12 trained"), "{r}");
    }

    fn verdict(advice: Vec<pipeprof_core::diagnose::Advice>) -> Verdict {
        Verdict {
            limiter: Limiter::Preprocess,
            severity: pipeprof_core::diagnose::Severity::High,
            headline: "the headline".into(),
            evidence: vec!["first number".into(), "second number".into()],
            measures: Vec::new(),
            flags: vec![pipeprof_core::diagnose::Flag::Simulated { what: "--slow resize=+4ms".into() }],
            advice,
            provisional: false,
            now: None,
        }
    }

    #[test]
    fn verdict_block_shows_evidence_flags_and_the_command_before_its_words() {
        use pipeprof_core::diagnose::{Advice, Change};
        let workers = Advice {
            action: "raise loader workers 1 → 2".into(),
            change: Change::Workers(2),
            command: Some("--workers 2".into()),
            predicted_speedup: Some(1.96),
            reason: "why".into(),
            basis: None,
        };
        let local = Advice {
            change: Change::CopyLocal,
            command: None,
            predicted_speedup: None,
            action: "copy".into(),
            ..workers.clone()
        };
        let text = render_verdict(&verdict(vec![workers, local]));
        assert_eq!(
            text,
            "verdict: CPU preprocessing · input-bound: HIGH\n  the headline\nevidence\n  · first number\n  · second number\n\
             flags\n  ! simulated slowdown active: --slow resize=+4ms (not the real hardware)\n\
             advice\n  → --workers 2: ≈2.0× images/s (why)\n    raise loader workers 1 → 2\n  → copy (why)\n"
        );
    }

    #[test]
    fn verdict_block_without_enough_data_has_no_severity() {
        let mut v = verdict(Vec::new());
        v.limiter = Limiter::NotEnoughData { steps_needed: 3 };
        v.evidence.clear();
        v.flags.clear();
        assert_eq!(render_verdict(&v), "verdict: not enough data\n  the headline\n");
    }

    #[test]
    fn ignored_files_are_counted_by_extension_only_when_there_are_some() {
        let mut s = Summary::default();
        let none = text(&s);
        assert!(!none.contains("ignored"), "{none}");
        s.settings.ignored = "3 .txt, 1 .heic".into();
        let some = text(&s);
        assert!(some.contains("ignored (not images pipeprof reads): 3 .txt, 1 .heic"), "{some}");
    }
}
