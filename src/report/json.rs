//! The verdict as one JSON document (`--json` on `run`, `profile`, `attach` and `report`):
//! what a CI job or a coding agent reads in place of the report's words. Built from the same
//! typed verdict the words are: the limiter and severity as enums, the evidence as measures
//! ([`pipeprof_core::diagnose::measures`]) beside their sentences, each piece of advice with its
//! typed change, the command to copy and the predicted gain with what it stands on, and, after
//! `--check-advice`, what its re-run measured. Its shape is the JSON Schema
//! `docs/schema/verdict.schema.json`, generated from these types ([`schema`]); [`SCHEMA`] names
//! its version. Pure.

use pipeprof_core::diagnose::measures::Measure;
use pipeprof_core::diagnose::ranks::{Cause, RanksVerdict};
use pipeprof_core::diagnose::{Advice, Change, Diagnosed, Flag, Limiter, LimiterKind, Severity};
use schemars::JsonSchema;
use serde::Serialize;

/// The document's version: raised when a field changes meaning or goes (a test holds the
/// schema of each version released).
pub const SCHEMA: &str = "pipeprof.verdict/2";

/// `--json`'s document.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[schemars(
    title = "pipeprof verdict",
    description = "What limits a training run, why, and what to change (pipeprof --json)."
)]
pub struct VerdictJson {
    /// `pipeprof.verdict/2`.
    pub schema: String,
    /// `verdict`; `insufficient_data` before enough steps were measured to judge; `ranks` for
    /// the ranks of a run read one file each (the straggler verdict alone).
    pub status: Status,
    /// What limits the run; null with `insufficient_data`.
    pub limiter: Option<LimiterKind>,
    /// How input-bound the run is, by the share of each step spent waiting for data
    /// (TensorFlow's rule: high ≥ 20%, moderate ≥ 5%).
    pub severity: SeverityKind,
    /// The input pipeline limits the run (storage, preprocessing, or cores held by others).
    pub input_bound: bool,
    /// Given early, on few steps: may change with more.
    pub provisional: bool,
    /// Steps still needed for a verdict (with `insufficient_data` while the run goes on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps_needed: Option<u64>,
    /// One line, as the report says it.
    pub headline: String,
    /// The steady-state rate the verdict read and every predicted gain is a ratio to.
    pub rate: Option<Rate>,
    /// The run's numbers that the rules read.
    pub numbers: Numbers,
    /// The 3–5 figures that decided it, the wait share first.
    pub evidence: Vec<EvidenceItem>,
    /// The classic traps found, whatever the limiter.
    pub flags: Vec<FlagItem>,
    /// Best first.
    pub advice: Vec<AdviceItem>,
    /// A distributed run's straggler verdict; null for one process.
    pub straggler: Option<Straggler>,
    /// Why the run failed (an exception, an exit status), if it did.
    pub failed: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Verdict,
    InsufficientData,
    /// The ranks of a distributed run read one file each (`pipeprof report` on rank traces):
    /// their straggler verdict alone, in `straggler`; no run-wide limiter.
    Ranks,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SeverityKind {
    High,
    Moderate,
    Low,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, JsonSchema)]
pub struct Rate {
    pub images_per_s: f64,
    pub from_step: u64,
    pub to_step: u64,
}

/// What the rules read of the run.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Numbers {
    pub steps: u64,
    pub images: u64,
    pub elapsed_s: f64,
    /// The whole run's images/s (the one-off first step and validation in it).
    pub images_per_s: f64,
    pub mean_step_ms: f64,
    pub wait_ms: f64,
    pub wait_share: f64,
    pub transfer_ms: f64,
    pub compute_ms: f64,
    pub batch_size: usize,
    /// Loader workers (0: the training thread loads).
    pub workers: usize,
    pub device: String,
    /// The framework the program trains with (`pytorch`, `keras`, …; empty: pipeprof's own).
    pub framework: String,
    /// The busiest GPU's mean utilisation, %, where one was sampled.
    pub gpu_util_pct: Option<f64>,
    /// The machine's CPU busy, % of all cores, where sampled.
    pub cpu_busy_pct: Option<f64>,
}

/// One line of evidence: its figure as data, and the sentence the report prints.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct EvidenceItem {
    #[serde(flatten)]
    pub measure: Option<Measure>,
    pub text: String,
}

/// One trap flagged.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct FlagItem {
    pub flag: FlagKind,
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FlagKind {
    GpuUnused,
    NetworkStorage,
    CpuSaturated,
    TooFewWorkers,
    TinyModel,
    ComputeCompetesWithLoader,
    Simulated,
    ValidationHeavy,
    CoreContention,
    Diverged,
    Stalled,
}

/// One piece of advice.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct AdviceItem {
    /// What to do, in words.
    pub action: String,
    /// The change, typed.
    pub change: ChangeItem,
    /// What to copy: the framework's code (`DataLoader(..., num_workers=6)`) or pipeprof's
    /// command; null where there is nothing to copy.
    pub command: Option<String>,
    /// Why it should help, with the number behind the prediction.
    pub reason: String,
    pub predicted: Prediction,
    /// What `--check-advice`'s re-run with this change measured; null when not checked.
    pub measured: Option<Checked>,
}

/// [`Change`] as a program reads it: its kind, and the number it sets where it sets one.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct ChangeItem {
    pub kind: ChangeKind,
    /// Workers, batch size or prefetch depth to set; the device to use; the size to resize to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Workers,
    BatchSize,
    Prefetch,
    Cache,
    UseDevice,
    PackOwnLoader,
    PackFolder,
    CopyLocal,
    FreeCores,
    PreResize,
    CheaperAugment,
    U8Batches,
    PersistentWorkers,
    /// Read back from a summary file, whose advice keeps its words only.
    Saved,
}

/// A predicted gain and what it stands on.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Prediction {
    pub kind: PredictionKind,
    /// Predicted images/s after ÷ now (the low end of a range, the floor of a floor).
    pub speedup: Option<f64>,
    /// A range's ends, ×.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub low: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub high: Option<f64>,
    /// The measured images/s the gain is a ratio to, where the capacity model made it.
    pub now_images_per_s: Option<f64>,
    /// The sentence the report prints for it.
    pub text: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PredictionKind {
    /// One figure.
    Point,
    /// The model is off today's rate, or the compute's split is unknown: `low`–`high`.
    Range,
    /// At least `speedup`: CPU costs measured cold, which run faster once reads are gone.
    Floor,
    /// No figure for this change.
    NotPredicted,
}

/// What a `--check-advice` re-run gave.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Checked {
    /// `measured`, `skipped` or `failed`.
    pub status: CheckStatus,
    /// Its steady images/s.
    pub images_per_s: Option<f64>,
    /// Over the baseline re-run's rate (the program re-run unchanged), ×; over the main run's
    /// where the baseline re-run gave none.
    pub speedup: Option<f64>,
    /// Other programs held the machine's cores during it or its baseline: the × is not the
    /// change's alone.
    pub shared_machine: bool,
    /// Why it was skipped or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Measured,
    Skipped,
    Failed,
}

/// A distributed run's straggler.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Straggler {
    /// The rank that sets the pace; null when the ranks keep pace.
    pub rank: Option<u32>,
    /// The straggler's node, when the ranks ran on several (`pipeprof report DIR` on a job's
    /// shared folder); null on one machine.
    pub node: Option<String>,
    /// What makes it slow: its input pipeline, its compute, or (ranks apart) slowest.
    pub cause: Option<StragglerCause>,
    pub synchronised: bool,
    pub headline: String,
    pub evidence: Vec<String>,
    pub advice: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StragglerCause {
    Input,
    Compute,
    Slowest,
}

impl VerdictJson {
    /// The document of a finished (or saved) run; `checked[i]` what advice `i`'s re-run
    /// measured, where one ran.
    pub fn of(d: &Diagnosed, checked: &[Option<Checked>]) -> VerdictJson {
        let mut v = d.verdict();
        let s = &d.summary;
        let straggler = d.straggler();
        let ranks_only = straggler.is_some() && s.steps == 0;
        if let (Some(r), true) = (&straggler, ranks_only) {
            // The ranks of a run read one file each (`pipeprof report` on rank traces): their
            // verdict is the straggler's.
            v.headline.clone_from(&r.headline);
        }
        let (limiter, steps_needed) = match v.limiter {
            Limiter::NotEnoughData { .. } if ranks_only => (None, None),
            Limiter::NotEnoughData { steps_needed } => (None, Some(steps_needed).filter(|n| *n > 0)),
            ref l => (Some(l.kind().unwrap_or(LimiterKind::Balanced)), None),
        };
        let status = match (limiter, ranks_only) {
            (Some(_), _) => Status::Verdict,
            (None, true) => Status::Ranks,
            (None, false) => Status::InsufficientData,
        };
        // Old summaries kept no measures: the sentences alone.
        let measure = |i: usize| v.measures.get(i).copied().filter(|_| v.measures.len() == v.evidence.len());
        VerdictJson {
            schema: SCHEMA.into(),
            status,
            limiter,
            severity: match v.severity {
                Severity::High => SeverityKind::High,
                Severity::Moderate => SeverityKind::Moderate,
                Severity::Low => SeverityKind::Low,
            },
            input_bound: pipeprof_core::diagnose::compare::input_bound(&v).is_some(),
            provisional: v.provisional,
            steps_needed,
            headline: v.headline.clone(),
            rate: v.now.map(|n| Rate { images_per_s: n.rate, from_step: n.from_step, to_step: n.to_step }),
            numbers: numbers(s),
            evidence: v
                .evidence
                .iter()
                .enumerate()
                .map(|(i, text)| EvidenceItem { measure: measure(i), text: text.clone() })
                .collect(),
            flags: v.flags.iter().map(|f| FlagItem { flag: flag_kind(f), text: f.describe() }).collect(),
            advice: v
                .advice
                .iter()
                .enumerate()
                .map(|(i, a)| advice_item(a, checked.get(i).cloned().flatten()))
                .collect(),
            straggler: straggler.map(|r| straggler_item(&r)),
            failed: s.failed.clone(),
        }
    }
}

fn finite(x: f64) -> Option<f64> {
    Some(x).filter(|x| x.is_finite())
}

fn numbers(s: &pipeprof_core::aggregate::Summary) -> Numbers {
    let sp = &s.split;
    let st = &s.settings;
    Numbers {
        steps: s.steps,
        images: s.images,
        elapsed_s: s.elapsed_s,
        images_per_s: s.images_per_s,
        mean_step_ms: sp.mean_step_ms,
        wait_ms: sp.wait_ms,
        wait_share: sp.wait_share,
        transfer_ms: sp.transfer_ms,
        compute_ms: sp.compute_ms,
        batch_size: st.batch_size,
        workers: st.workers,
        device: st.device.to_string(),
        framework: st.framework.to_string(),
        gpu_util_pct: s.machine.devices.iter().filter_map(|d| d.util_mean_pct.map(f64::from)).reduce(f64::max),
        cpu_busy_pct: s.machine.global_cpu_mean_pct.map(f64::from).and_then(finite),
    }
}

fn flag_kind(f: &Flag) -> FlagKind {
    match f {
        Flag::GpuUnused => FlagKind::GpuUnused,
        Flag::NetworkStorage { .. } => FlagKind::NetworkStorage,
        Flag::CpuSaturated => FlagKind::CpuSaturated,
        Flag::TooFewWorkers { .. } => FlagKind::TooFewWorkers,
        Flag::TinyModel => FlagKind::TinyModel,
        Flag::ComputeCompetesWithLoader => FlagKind::ComputeCompetesWithLoader,
        Flag::Simulated { .. } => FlagKind::Simulated,
        Flag::ValidationHeavy { .. } => FlagKind::ValidationHeavy,
        Flag::CoreContention { .. } => FlagKind::CoreContention,
        Flag::Diverged { .. } => FlagKind::Diverged,
        Flag::Stalled(_) => FlagKind::Stalled,
    }
}

fn change_item(c: &Change) -> ChangeItem {
    use serde_json::json;
    let (kind, to) = match c {
        Change::Workers(n) => (ChangeKind::Workers, Some(json!(n))),
        Change::BatchSize(n) => (ChangeKind::BatchSize, Some(json!(n))),
        Change::Prefetch(n) => (ChangeKind::Prefetch, Some(json!(n))),
        Change::Cache { .. } => (ChangeKind::Cache, None),
        Change::UseDevice(d) => (ChangeKind::UseDevice, Some(json!(d))),
        Change::PackOwnLoader => (ChangeKind::PackOwnLoader, None),
        Change::PackFolder { .. } => (ChangeKind::PackFolder, None),
        Change::CopyLocal => (ChangeKind::CopyLocal, None),
        Change::FreeCores => (ChangeKind::FreeCores, None),
        Change::PreResize { width, height } => (ChangeKind::PreResize, Some(json!([width, height]))),
        Change::CheaperAugment => (ChangeKind::CheaperAugment, None),
        Change::U8Batches => (ChangeKind::U8Batches, None),
        Change::PersistentWorkers => (ChangeKind::PersistentWorkers, None),
        Change::Saved => (ChangeKind::Saved, None),
    };
    ChangeItem { kind, to }
}

fn prediction(a: &Advice) -> Prediction {
    let g = a.predicted_speedup.and_then(finite);
    let b = a.basis;
    let range = b.and_then(|b| b.range);
    let kind = match (g, b) {
        (None, _) => PredictionKind::NotPredicted,
        (Some(_), Some(b)) if b.floor => PredictionKind::Floor,
        (Some(_), Some(b)) if b.range.is_some() => PredictionKind::Range,
        _ => PredictionKind::Point,
    };
    // A floor's range is no ceiling: its low end is the promise.
    let speedup = match kind {
        PredictionKind::Floor | PredictionKind::Range => range.map(|(lo, _)| lo).or(g),
        _ => g,
    };
    let (low, high) = match (kind, range) {
        (PredictionKind::Range, Some((lo, hi))) => (Some(lo), Some(hi)),
        _ => (None, None),
    };
    Prediction { kind, speedup, low, high, now_images_per_s: b.map(|b| b.now), text: a.gain_words() }
}

fn advice_item(a: &Advice, measured: Option<Checked>) -> AdviceItem {
    AdviceItem {
        action: a.action.clone(),
        change: change_item(&a.change),
        command: a.command.clone(),
        reason: a.reason.clone(),
        predicted: prediction(a),
        measured,
    }
}

fn straggler_item(r: &RanksVerdict) -> Straggler {
    Straggler {
        rank: r.straggler,
        node: r.node.clone(),
        cause: r.cause.map(|c| match c {
            Cause::Input => StragglerCause::Input,
            Cause::Compute => StragglerCause::Compute,
            Cause::Slowest => StragglerCause::Slowest,
        }),
        synchronised: r.synchronised,
        headline: r.headline.clone(),
        evidence: r.evidence.clone(),
        advice: r.advice.clone(),
    }
}

/// The JSON Schema of [`VerdictJson`], as `docs/schema/verdict.schema.json` holds it.
pub fn schema() -> String {
    schema_text::<VerdictJson>()
}

/// The JSON Schema of `T` as the files in `docs/schema/` hold it: pretty, a newline last.
pub fn schema_text<T: JsonSchema>() -> String {
    let mut text = serde_json::to_string_pretty(&schemars::schema_for!(T)).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeprof_core::diagnose::Basis;

    fn advice(gain: Option<f64>, range: Option<(f64, f64)>, floor: bool) -> Advice {
        Advice {
            action: "a".into(),
            change: Change::Workers(4),
            command: Some("DataLoader(..., num_workers=4)".into()),
            predicted_speedup: gain,
            reason: "r".into(),
            basis: gain.map(|g| Basis {
                now: 100.0,
                from_step: 2,
                to_step: 30,
                predicted: 100.0 * g,
                model_now: 100.0,
                range,
                slow_steps: false,
                compute_split_unknown: false,
                floor,
            }),
        }
    }

    #[test]
    fn a_prediction_says_what_it_stands_on() {
        let cases = [
            (advice(Some(2.0), None, false), PredictionKind::Point, Some(2.0), None),
            (advice(Some(2.0), Some((1.5, 3.0)), false), PredictionKind::Range, Some(1.5), Some(3.0)),
            (advice(Some(2.0), Some((1.8, 3.0)), true), PredictionKind::Floor, Some(1.8), None),
            (advice(None, None, false), PredictionKind::NotPredicted, None, None),
        ];
        for (a, kind, speedup, high) in cases {
            let p = prediction(&a);
            assert_eq!((p.kind, p.speedup, p.high), (kind, speedup, high), "{a:?}");
            assert_eq!(p.now_images_per_s, a.basis.map(|b| b.now));
        }
    }

    #[test]
    fn a_change_is_its_kind_and_what_it_sets() {
        let j = serde_json::to_value(change_item(&Change::Workers(6))).unwrap_or_default();
        assert_eq!(j, serde_json::json!({"kind": "workers", "to": 6}));
        let j = serde_json::to_value(change_item(&Change::CopyLocal)).unwrap_or_default();
        assert_eq!(j, serde_json::json!({"kind": "copy_local"}));
    }

    #[test]
    fn no_steps_is_insufficient_data_with_no_limiter() {
        let d = Diagnosed::new(pipeprof_core::aggregate::Summary::default());
        let j = VerdictJson::of(&d, &[]);
        assert_eq!((j.status, j.limiter, j.input_bound), (Status::InsufficientData, None, false));
        assert!(j.headline.contains("No verdict"), "{}", j.headline);
        assert_eq!(j.schema, SCHEMA);
    }
}
