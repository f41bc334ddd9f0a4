//! The live metrics view: the latest snapshot as OpenMetrics text for Prometheus
//! (`--metrics-listen`). [`render`] is pure (snapshot in, text out); [`serve`] answers
//! `GET /metrics` on a thread of its own, asking its source for the latest snapshot per scrape.
//!
//! Labels are bounded: `program` and `rank` on every series, and under `pipeprof run` `job`
//! and `node` (one value each per run: a job's nodes scraped by one Prometheus stay apart, and
//! `docs/prometheus/rules.yml` judges the job's straggler across them); `stage` (pipeprof's
//! fixed stage names), `gpu` (a device index) and `limiter` (a fixed set). No file or thread
//! names.

pub mod serve;

pub use serve::Listener;

use pipeprof_core::aggregate::machine::GpuPoint;
use pipeprof_core::aggregate::Summary;
use pipeprof_core::diagnose::ranks::RanksVerdict;
use pipeprof_core::diagnose::{Limiter, Verdict};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::sync::atomic::AtomicU64;

/// `--metrics-listen` and its guard, shared by profile, attach and run.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct MetricsArgs {
    /// Serve Prometheus/OpenMetrics text at http://ADDR/metrics while the run goes (loopback
    /// only unless --metrics-allow-remote); 127.0.0.1:0 picks a free port, printed on stderr.
    #[arg(long = pipeprof_core::flags::METRICS_LISTEN, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
    /// Allow --metrics-listen on a non-loopback address (the endpoint has no authentication).
    #[arg(long = pipeprof_core::flags::METRICS_ALLOW_REMOTE, requires = "metrics_listen")]
    pub metrics_allow_remote: bool,
}

/// Parses `--metrics-listen`, refusing a non-loopback address unless `allow_remote` (the
/// endpoint has no authentication), the way `attach`'s listener does.
pub fn check_listen(addr: &str, allow_remote: bool) -> anyhow::Result<std::net::SocketAddr> {
    use probes::attach::AttachError;
    probes::attach::check_listen(addr, allow_remote).map_err(|e| match e {
        AttachError::NotLoopback(_) => anyhow::anyhow!(
            "--metrics-listen {addr}: not a loopback address, and the endpoint has no authentication; \
             add --metrics-allow-remote to serve other machines on purpose"
        ),
        e => anyhow::anyhow!("--metrics-listen {addr}: {e}"),
    })
}

/// Checks and binds `--metrics-listen`, and says where: `pipeprof: metrics on http://ADDR/metrics`.
pub fn bind(addr: &str, allow_remote: bool) -> anyhow::Result<Listener> {
    let a = check_listen(addr, allow_remote)?;
    let l = Listener::bind(a).map_err(|e| {
        anyhow::anyhow!("--metrics-listen {addr}: cannot listen ({e}); pick another port, or :0 for any")
    })?;
    pipeprof_trainer::progress::say(&format!("pipeprof: metrics on http://{}/metrics", l.addr()));
    Ok(l)
}

/// What one scrape shows: copied from the collector's latest publication.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub summary: Summary,
    /// The newest GPU sample, if the GPU is sampled.
    pub gpu: Option<GpuPoint>,
    pub verdict: Option<Verdict>,
    /// A distributed run's straggler verdict, judged by the collector with `verdict`.
    pub straggler: Option<RanksVerdict>,
}

/// The `rank` label of a run of one process.
pub const RANK: &str = "0";

/// The `rank` label of a distributed run's whole-run series (each rank's own series carry its
/// number; a run has at most [`pipeprof_core::aggregate::ranks::MAX_RANKS`] of them).
pub const ALL_RANKS: &str = "all";

/// The `job` label of a run whose job id was not found (no `--job`, Slurm or torchrun id).
pub const NO_JOB: &str = "none";

/// Every value of the `limiter` label, in a fixed order: one of them is 1, the others 0.
pub const LIMITERS: [&str; 8] =
    ["io", "contention", "preprocess", "transfer", "compute", "overhead", "balanced", "not_enough_data"];

/// The `limiter` label of a verdict's limiter (no verdict yet: not enough data).
pub fn limiter_label(l: Option<&Limiter>) -> &'static str {
    match l {
        Some(Limiter::Io) => "io",
        Some(Limiter::Contention) => "contention",
        Some(Limiter::Preprocess) => "preprocess",
        Some(Limiter::Transfer) => "transfer",
        Some(Limiter::Compute) => "compute",
        Some(Limiter::Overhead) => "overhead",
        Some(Limiter::Balanced) => "balanced",
        Some(Limiter::NotEnoughData { .. }) | None => "not_enough_data",
    }
}

type Labels = Vec<(&'static str, String)>;
type GaugeF = Gauge<f64, AtomicU64>;

/// A gauge family labelled by rank (and more), registered with a value per label set.
fn gauges(reg: &mut Registry, name: &str, help: &str, values: &[(Labels, f64)]) {
    let f = Family::<Labels, GaugeF>::default();
    for (labels, v) in values {
        f.get_or_create(labels).set(*v);
    }
    reg.register(name, help, f);
}

/// A counter family (exposed as `NAME_total`) labelled by rank.
fn counters(reg: &mut Registry, name: &str, help: &str, values: &[(Labels, u64)]) {
    let f = Family::<Labels, Counter<u64>>::default();
    for (labels, v) in values {
        f.get_or_create(labels).inc_by(*v);
    }
    reg.register(name, help, f);
}

/// One rank's numbers (or the whole run's) for the per-rank series.
struct Row<'a> {
    rank: String,
    step_ms: f64,
    wait_ms: f64,
    backward_ms: Option<f64>,
    wait_share: f64,
    images_per_s: f64,
    steps: u64,
    images: u64,
    loader_busy: f64,
    stages: &'a [pipeprof_core::aggregate::StageSummary],
}

fn rank(r: &str) -> Labels {
    vec![("rank", r.to_string())]
}

/// `program` as a label value: the last path component of the model or program name, so a
/// path does not become a label.
fn program_label(model: &str) -> String {
    let base = model.rsplit('/').next().unwrap_or(model);
    if base.is_empty() {
        "unknown".into()
    } else {
        base.into()
    }
}

/// The scrape as OpenMetrics text (ends with `# EOF`). Every series has `program` and
/// `rank`: `"0"` in a run of one process; in a distributed run each rank's series carry its
/// number and the whole run's carry `"all"`.
pub fn render(s: &Scrape) -> String {
    let sum = &s.summary;
    let mut labels = vec![(Cow::Borrowed("program"), Cow::Owned(program_label(&sum.settings.model.name())))];
    if let Some(n) = &sum.settings.node {
        labels.push((Cow::Borrowed("job"), Cow::Owned(n.job.clone().unwrap_or_else(|| NO_JOB.into()))));
        labels.push((Cow::Borrowed("node"), Cow::Owned(n.name.clone())));
    }
    let mut reg = Registry::with_prefix_and_labels("pipeprof", labels.into_iter());
    let run = if sum.ranks.is_empty() { RANK } else { ALL_RANKS };
    let rows = rows(sum, run);
    step_metrics(&mut reg, &rows);
    gauges(
        &mut reg,
        "queue_batches_ready",
        "Mean batches waiting in the prefetch queue when a step took its batch",
        &[(rank(run), sum.mean_queued)],
    );
    stage_metrics(&mut reg, &rows);
    if let Some(g) = &s.gpu {
        gpu_metrics(&mut reg, g, run);
    }
    if let Some(b) = sum.machine.rss_last_bytes {
        let help = "The program's resident memory at the last sample: its processes added (workers, ranks), pipeprof's own not included";
        gauges(&mut reg, "program_resident_memory_bytes", help, &[(rank(run), b as f64)]);
    }
    counters(&mut reg, "events_dropped", "Events dropped on a full channel", &[(rank(run), sum.events_dropped)]);
    let current = limiter_label(s.verdict.as_ref().map(|v| &v.limiter));
    let limiter: Vec<_> = LIMITERS
        .iter()
        .map(|l| (vec![("rank", run.to_string()), ("limiter", l.to_string())], if *l == current { 1.0 } else { 0.0 }))
        .collect();
    gauges(&mut reg, "limiter", "What limits the run now: 1 for the verdict's limiter, 0 for the others", &limiter);
    if let Some(v) = &s.straggler {
        rank_metrics(&mut reg, sum, v);
    }
    let mut out = String::with_capacity(4096);
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

/// The whole run's row (`rank` = `run`), then one per rank of a distributed run.
fn rows<'a>(sum: &'a Summary, run: &str) -> Vec<Row<'a>> {
    let split = &sum.split;
    let mut rows = vec![Row {
        rank: run.to_string(),
        step_ms: split.mean_step_ms,
        wait_ms: split.wait_ms,
        backward_ms: None,
        wait_share: split.wait_share,
        images_per_s: sum.images_per_s,
        steps: sum.steps,
        images: sum.images,
        loader_busy: sum.loader_busy,
        stages: &sum.stages,
    }];
    rows.extend(sum.ranks.iter().map(|l| Row {
        rank: l.rank.to_string(),
        step_ms: l.step_ms,
        wait_ms: l.wait_ms,
        backward_ms: l.backward_ms,
        wait_share: l.wait_share,
        images_per_s: l.images_per_s,
        steps: l.steps,
        images: l.images,
        loader_busy: l.loader_busy,
        stages: &l.stages,
    }));
    rows
}

/// Step time, waiting share, rate, steps, images and the loader's busy share, one series
/// per row.
fn step_metrics(reg: &mut Registry, rows: &[Row]) {
    let each = |f: &dyn Fn(&Row) -> f64| -> Vec<(Labels, f64)> { rows.iter().map(|r| (rank(&r.rank), f(r))).collect() };
    gauges(reg, "step_seconds", "Mean training step time", &each(&|r| r.step_ms / 1e3));
    gauges(reg, "wait_share", "Share of step time spent waiting for data (0-1)", &each(&|r| r.wait_share));
    gauges(reg, "data_wait_seconds", "Mean wait for the next batch per step", &each(&|r| r.wait_ms / 1e3));
    let backward: Vec<(Labels, f64)> =
        rows.iter().filter_map(|r| r.backward_ms.map(|b| (rank(&r.rank), b / 1e3))).collect();
    gauges(
        reg,
        "backward_seconds",
        "Mean backward pass per step where timed (under DDP it holds the gradients' all-reduce wait)",
        &backward,
    );
    gauges(reg, "images_per_second", "Images trained per second over the run", &each(&|r| r.images_per_s));
    let count =
        |f: &dyn Fn(&Row) -> u64| -> Vec<(Labels, u64)> { rows.iter().map(|r| (rank(&r.rank), f(r))).collect() };
    counters(reg, "steps", "Training steps seen", &count(&|r| r.steps));
    counters(reg, "images", "Images trained", &count(&|r| r.images));
    gauges(reg, "loader_busy_share", "Loader threads' busy share (0-1)", &each(&|r| r.loader_busy));
}

/// Per stage of each row that ran: p50, p95 and the on-CPU share where measured.
fn stage_metrics(reg: &mut Registry, rows: &[Row]) {
    let per_stage = |f: &dyn Fn(&pipeprof_core::aggregate::StageSummary) -> Option<f64>| -> Vec<(Labels, f64)> {
        rows.iter()
            .flat_map(|r| {
                r.stages.iter().filter(|x| x.count > 0).filter_map(|x| {
                    f(x).map(|v| (vec![("rank", r.rank.clone()), ("stage", x.stage.name().to_string())], v))
                })
            })
            .collect()
    };
    gauges(reg, "stage_p50_seconds", "Median span time per stage", &per_stage(&|x| Some(x.p50_ms / 1e3)));
    gauges(reg, "stage_p95_seconds", "95th percentile span time per stage", &per_stage(&|x| Some(x.p95_ms / 1e3)));
    gauges(
        reg,
        "stage_on_cpu_share",
        "On-CPU share of a stage's wall time (0-1), where measured",
        &per_stage(&|x| x.on_cpu),
    );
}

/// Each GPU's utilisation and memory at the last sample.
fn gpu_metrics(reg: &mut Registry, g: &GpuPoint, run: &str) {
    let on = |i: usize| vec![("rank", run.to_string()), ("gpu", i.to_string())];
    let util: Vec<_> =
        g.util_pct.iter().enumerate().filter_map(|(i, u)| u.map(|u| (on(i), f64::from(u) / 100.0))).collect();
    let mem: Vec<_> = g.mem_used_bytes.iter().enumerate().filter_map(|(i, m)| m.map(|m| (on(i), m as f64))).collect();
    gauges(reg, "gpu_utilization_ratio", "GPU utilisation at the last sample (0-1)", &util);
    gauges(reg, "gpu_memory_used_bytes", "GPU memory used at the last sample", &mem);
}

/// A distributed run's straggler mark and all-reduce wait per rank, from its ranks' verdict.
fn rank_metrics(reg: &mut Registry, sum: &Summary, v: &RanksVerdict) {
    let straggler: Vec<_> = sum
        .ranks
        .iter()
        .map(|l| (rank(&l.rank.to_string()), if v.straggler == Some(l.rank) { 1.0 } else { 0.0 }))
        .collect();
    gauges(reg, "straggler", "1 for the rank that sets a distributed run's pace, 0 for the others", &straggler);
    let waits: Vec<_> = v.sync_wait_ms.iter().map(|(r, w)| (rank(&r.to_string()), w / 1e3)).collect();
    gauges(
        reg,
        "allreduce_wait_seconds",
        "Mean wait per step in the gradients' all-reduce, measured or inferred",
        &waits,
    );
}

#[cfg(test)]
mod tests;
