//! The live metrics view: the latest snapshot as OpenMetrics text for Prometheus
//! (`--metrics-listen`). [`render`] is pure (snapshot in, text out); [`serve`] answers
//! `GET /metrics` on a thread of its own, asking its source for the latest snapshot per scrape.
//!
//! Labels are bounded: `program` and `rank` on every series, `stage` (pipeprof's fixed stage
//! names), `gpu` (a device index) and `limiter` (a fixed set). No file or thread names.

pub mod serve;

pub use serve::Listener;

use crate::aggregate::machine::GpuPoint;
use crate::aggregate::Summary;
use crate::diagnose::{Limiter, Verdict};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::borrow::Cow;
use std::sync::atomic::AtomicU64;

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
    crate::progress::say(&format!("pipeprof: metrics on http://{}/metrics", l.addr()));
    Ok(l)
}

/// What one scrape shows: copied from the collector's latest publication.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    pub summary: Summary,
    /// The newest GPU sample, if the GPU is sampled.
    pub gpu: Option<GpuPoint>,
    pub verdict: Option<Verdict>,
}

/// The rank label until runs have ranks (issue 24, item 1).
pub const RANK: &str = "0";

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

/// A gauge with no labels of its own, registered and set.
fn gauge(reg: &mut Registry, name: &str, help: &str, v: f64) {
    let g = GaugeF::default();
    g.set(v);
    reg.register(name, help, g);
}

/// A counter (exposed as `NAME_total`), registered and set.
fn counter(reg: &mut Registry, name: &str, help: &str, v: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(v);
    reg.register(name, help, c);
}

/// A gauge family with one label, registered with a value per label value.
fn family(reg: &mut Registry, name: &str, help: &str, key: &'static str, values: &[(String, f64)]) {
    let f = Family::<Labels, GaugeF>::default();
    for (label, v) in values {
        f.get_or_create(&vec![(key, label.clone())]).set(*v);
    }
    reg.register(name, help, f);
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

/// The scrape as OpenMetrics text (ends with `# EOF`).
pub fn render(s: &Scrape) -> String {
    let sum = &s.summary;
    let labels = [
        (Cow::Borrowed("program"), Cow::Owned(program_label(&sum.settings.model))),
        (Cow::Borrowed("rank"), Cow::Borrowed(RANK)),
    ];
    let mut reg = Registry::with_prefix_and_labels("pipeprof", labels.into_iter());
    let split = &sum.split;
    gauge(&mut reg, "step_seconds", "Mean training step time", split.mean_step_ms / 1e3);
    gauge(&mut reg, "wait_share", "Share of step time spent waiting for data (0-1)", split.wait_share);
    gauge(&mut reg, "images_per_second", "Images trained per second over the run", sum.images_per_s);
    counter(&mut reg, "steps", "Training steps seen", sum.steps);
    counter(&mut reg, "images", "Images trained", sum.images);
    gauge(&mut reg, "loader_busy_share", "Loader threads' busy share (0-1)", sum.loader_busy);
    gauge(
        &mut reg,
        "queue_batches_ready",
        "Mean batches waiting in the prefetch queue when a step took its batch",
        sum.mean_queued,
    );
    let stages: Vec<_> = sum.stages.iter().filter(|x| x.count > 0).collect();
    let per_stage = |f: &dyn Fn(&crate::aggregate::StageSummary) -> Option<f64>| -> Vec<(String, f64)> {
        stages.iter().filter_map(|x| f(x).map(|v| (x.stage.clone(), v))).collect()
    };
    family(&mut reg, "stage_p50_seconds", "Median span time per stage", "stage", &per_stage(&|x| Some(x.p50_ms / 1e3)));
    family(
        &mut reg,
        "stage_p95_seconds",
        "95th percentile span time per stage",
        "stage",
        &per_stage(&|x| Some(x.p95_ms / 1e3)),
    );
    family(
        &mut reg,
        "stage_on_cpu_share",
        "On-CPU share of a stage's wall time (0-1), where measured",
        "stage",
        &per_stage(&|x| x.on_cpu),
    );
    if let Some(g) = &s.gpu {
        let util: Vec<_> = g
            .util_pct
            .iter()
            .enumerate()
            .filter_map(|(i, u)| u.map(|u| (i.to_string(), f64::from(u) / 100.0)))
            .collect();
        let mem: Vec<_> =
            g.mem_used_bytes.iter().enumerate().filter_map(|(i, m)| m.map(|m| (i.to_string(), m as f64))).collect();
        family(&mut reg, "gpu_utilization_ratio", "GPU utilisation at the last sample (0-1)", "gpu", &util);
        family(&mut reg, "gpu_memory_used_bytes", "GPU memory used at the last sample", "gpu", &mem);
    }
    counter(&mut reg, "events_dropped", "Events dropped on a full channel", sum.events_dropped);
    let current = limiter_label(s.verdict.as_ref().map(|v| &v.limiter));
    let limiter: Vec<_> = LIMITERS.iter().map(|l| (l.to_string(), if *l == current { 1.0 } else { 0.0 })).collect();
    family(
        &mut reg,
        "limiter",
        "What limits the run now: 1 for the verdict's limiter, 0 for the others",
        "limiter",
        &limiter,
    );
    let mut out = String::with_capacity(4096);
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &reg);
    out
}

#[cfg(test)]
mod tests;
