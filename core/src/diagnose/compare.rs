//! Two runs side by side (`pipeprof compare BASE NEW`, `pipeprof report A B`): the rate each
//! trained at, the step split, each stage's mean, each verdict judged again from its
//! statistics; and the gate a CI job puts on them ([`Gate`]): a slowdown over a share, or the
//! new run input-bound. Pure.

use super::now::measured_now;
use super::{diagnose, Limiter, Severity, Verdict};
use crate::aggregate::Summary;
use probes::Stage;
use serde::Serialize;

/// One number of both runs: the base's and the new one's.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair<T = f64> {
    pub base: T,
    pub new: T,
}

impl Pair {
    /// New over base, when both are positive and finite.
    pub fn ratio(&self) -> Option<f64> {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        (ok(self.base) && ok(self.new)).then(|| self.new / self.base)
    }
}

/// One stage's mean per image (loader stages) or per step (the others), ms, in both runs
/// (0 where a run has no such stage).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StagePair {
    pub stage: Stage,
    #[serde(flatten)]
    pub ms: Pair,
}

/// Two runs compared.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// Images/s at the steady state each run's verdict reads ([`measured_now`]; the whole
    /// run's where it has none): what a re-run's gain is read by too.
    pub images_per_s: Pair,
    pub step_ms: Pair,
    pub wait_ms: Pair,
    pub transfer_ms: Pair,
    pub compute_ms: Pair,
    /// Each run's model: its `cnn.toml`, the built-in, or the program's name.
    pub models: (String, String),
    /// Each run's loader workers and batch size.
    pub workers: Pair<usize>,
    pub batch_size: Pair<usize>,
    /// The base run's stages first, then those only the new run has.
    pub stages: Vec<StagePair>,
    /// Each run judged again from its statistics (the rules may be newer than the runs).
    #[serde(skip)]
    pub verdicts: (Verdict, Verdict),
}

impl Comparison {
    /// `base` and `new` compared.
    pub fn of(base: &Summary, new: &Summary) -> Comparison {
        let rate = |s: &Summary| measured_now(s).map_or(s.images_per_s, |n| n.rate);
        let pair = |f: fn(&Summary) -> f64| Pair { base: f(base), new: f(new) };
        let mut names: Vec<Stage> = base.stages.iter().map(|s| s.stage).collect();
        names.extend(new.stages.iter().map(|s| s.stage).filter(|s| !base.stages.iter().any(|b| b.stage == *s)));
        let mean = |s: &Summary, n: Stage| s.stages.iter().find(|x| x.stage == n).map_or(0.0, |x| x.mean_ms);
        Comparison {
            images_per_s: Pair { base: rate(base), new: rate(new) },
            step_ms: pair(|s| s.split.mean_step_ms),
            wait_ms: pair(|s| s.split.wait_ms),
            transfer_ms: pair(|s| s.split.transfer_ms),
            compute_ms: pair(|s| s.split.compute_ms),
            models: (base.settings.model.to_string(), new.settings.model.to_string()),
            workers: Pair { base: base.settings.workers, new: new.settings.workers },
            batch_size: Pair { base: base.settings.batch_size, new: new.settings.batch_size },
            stages: names
                .into_iter()
                .map(|n| StagePair { stage: n, ms: Pair { base: mean(base, n), new: mean(new, n) } })
                .collect(),
            verdicts: (diagnose(base), diagnose(new)),
        }
    }

    /// How much slower the new run trains than the base, percent (negative: faster); None
    /// where either rate is unknown.
    pub fn slowdown_pct(&self) -> Option<f64> {
        self.images_per_s.ratio().map(|r| (1.0 - r) * 100.0)
    }
}

/// Whether a verdict says the input pipeline limits the run (storage, preprocessing, or the
/// loader's threads waiting for cores), and how much.
pub fn input_bound(v: &Verdict) -> Option<Severity> {
    matches!(v.limiter, Limiter::Io | Limiter::Preprocess | Limiter::Contention).then_some(v.severity)
}

/// What fails a build: a slowdown over `max_slowdown_pct` percent, or the new run input-bound
/// at `fail_if_input_bound` or worse.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gate {
    pub max_slowdown_pct: Option<f64>,
    pub fail_if_input_bound: Option<Severity>,
}

impl Gate {
    /// Why `c` fails this gate, on one line each (empty: it passes). A rate that cannot be
    /// read fails a slowdown gate: a gate that cannot check must not pass.
    pub fn failures(&self, c: &Comparison) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(max) = self.max_slowdown_pct {
            match c.slowdown_pct() {
                Some(s) if s > max => out.push(format!(
                    "images/s fell {s:.1}% ({:.1} → {:.1}), over the {max}% allowed",
                    c.images_per_s.base, c.images_per_s.new
                )),
                Some(_) => {}
                None => {
                    out.push("images/s of one run unknown (no step measured): the slowdown cannot be checked".into())
                }
            }
        }
        if let Some(worst) = self.fail_if_input_bound {
            match (&c.verdicts.1.limiter, input_bound(&c.verdicts.1)) {
                (Limiter::NotEnoughData { .. }, _) => out.push(format!(
                    "the new run has no verdict yet ({}): whether it is input-bound cannot be checked",
                    c.verdicts.1.headline
                )),
                (_, Some(now)) if rank(now) >= rank(worst) => {
                    out.push(format!("the new run is input-bound ({}): {}", severity_word(now), c.verdicts.1.headline))
                }
                _ => {}
            }
        }
        out
    }
}

/// Low 0, moderate 1, high 2.
fn rank(s: Severity) -> u8 {
    match s {
        Severity::Low => 0,
        Severity::Moderate => 1,
        Severity::High => 2,
    }
}

/// The severity as the command line names it.
pub fn severity_word(s: Severity) -> &'static str {
    match s {
        Severity::Low => "low",
        Severity::Moderate => "moderate",
        Severity::High => "high",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(limiter: Limiter, severity: Severity) -> Verdict {
        Verdict {
            limiter,
            severity,
            headline: "h".into(),
            evidence: Vec::new(),
            measures: Vec::new(),
            flags: Vec::new(),
            advice: Vec::new(),
            provisional: false,
            now: None,
        }
    }

    fn comparison(base: f64, new: f64, after: Verdict) -> Comparison {
        let zero = Pair { base: 0.0, new: 0.0 };
        Comparison {
            images_per_s: Pair { base, new },
            step_ms: zero,
            wait_ms: zero,
            transfer_ms: zero,
            compute_ms: zero,
            models: ("a.py".into(), "a.py".into()),
            workers: Pair { base: 0, new: 2 },
            batch_size: Pair { base: 32, new: 32 },
            stages: Vec::new(),
            verdicts: (verdict(Limiter::Compute, Severity::Low), after),
        }
    }

    #[test]
    fn a_gate_fails_on_a_slowdown_over_its_share_or_an_input_bound_run_at_its_severity() {
        let compute = || verdict(Limiter::Compute, Severity::Low);
        let slow = |s| Gate { max_slowdown_pct: Some(s), fail_if_input_bound: None };
        let bound = |s| Gate { max_slowdown_pct: None, fail_if_input_bound: Some(s) };
        // (gate, base images/s, new images/s, new verdict, failures)
        let table: Vec<(Gate, f64, f64, Verdict, usize)> = vec![
            (slow(10.0), 100.0, 89.0, compute(), 1),
            (slow(10.0), 100.0, 91.0, compute(), 0),
            (slow(10.0), 100.0, 250.0, compute(), 0),
            (slow(10.0), 0.0, 90.0, compute(), 1),
            (bound(Severity::Moderate), 100.0, 100.0, verdict(Limiter::Preprocess, Severity::Moderate), 1),
            (bound(Severity::Moderate), 100.0, 100.0, verdict(Limiter::Io, Severity::High), 1),
            (bound(Severity::High), 100.0, 100.0, verdict(Limiter::Contention, Severity::Moderate), 0),
            (bound(Severity::Moderate), 100.0, 100.0, verdict(Limiter::Compute, Severity::High), 0),
            (bound(Severity::Moderate), 100.0, 100.0, verdict(Limiter::Preprocess, Severity::Low), 0),
            (Gate::default(), 100.0, 1.0, verdict(Limiter::Io, Severity::High), 0),
            // Too few steps for a verdict: the input-bound gate cannot check, so it fails.
            (
                bound(Severity::High),
                100.0,
                100.0,
                verdict(Limiter::NotEnoughData { steps_needed: 3 }, Severity::Low),
                1,
            ),
        ];
        for (gate, base, new, after, n) in table {
            let why = gate.failures(&comparison(base, new, after.clone()));
            assert_eq!(why.len(), n, "{gate:?} {base} → {new} {after:?}: {why:?}");
        }
        let why = slow(10.0).failures(&comparison(100.0, 80.0, compute()));
        assert_eq!(why, ["images/s fell 20.0% (100.0 → 80.0), over the 10% allowed"]);
    }

    #[test]
    fn stages_of_either_run_are_compared_the_base_runs_first() {
        use crate::aggregate::StageSummary;
        let stage = |stage, mean_ms| StageSummary {
            stage,
            count: 10,
            total_ms: mean_ms * 10.0,
            mean_ms,
            p50_ms: mean_ms,
            p95_ms: mean_ms,
            max_ms: mean_ms,
            on_cpu: None,
            core_wait: None,
            bytes: 0,
            per_second: 0.0,
            trimmed_mean_ms: None,
        };
        let base = Summary { stages: vec![stage(Stage::Read, 2.0), stage(Stage::Decode, 4.0)], ..Summary::default() };
        let new = Summary { stages: vec![stage(Stage::Decode, 3.0), stage(Stage::Resize, 1.0)], ..Summary::default() };
        let c = Comparison::of(&base, &new);
        let got: Vec<(Stage, f64, f64)> = c.stages.iter().map(|s| (s.stage, s.ms.base, s.ms.new)).collect();
        assert_eq!(got, [(Stage::Read, 2.0, 0.0), (Stage::Decode, 4.0, 3.0), (Stage::Resize, 0.0, 1.0)]);
        assert_eq!(c.slowdown_pct(), None, "no step in either: no rate");
    }
}
