//! The evidence as data: each item of [`super::findings`]'s list gives the one figure its line
//! stands on ([`Measure`]: what, value, unit, and the threshold the rule compared it with),
//! from the same facts its words come from ([`super::evidence`]). What a program reading the
//! verdict (`--json`, a CI job, an agent) gets in place of the sentences. Pure.

use super::classify::{Facts, OverheadWhy};
use super::findings::Evidence;
use super::thresholds::*;
use super::{Limiter, Severity};
use serde::{Deserialize, Serialize};

/// What an evidence line measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Quantity {
    /// The share of each step the training loop waited for data (TensorFlow's input-bound rule).
    WaitShare,
    /// How much of the time the GPU was idle while the loop waited for data.
    GpuIdle,
    /// The machine's iowait (no loader spans to judge from).
    Iowait,
    /// The share of the loader's time per image blocked off-CPU in read (or in the dataset's
    /// own fetch).
    LoaderBlockedShare,
    /// The loader's CPU per image.
    LoaderCpuPerImage,
    /// What the loader could supply, by the capacity model.
    LoaderCapacity,
    /// How far the capacity model's estimate of today's rate is off the measured rate.
    ModelOff,
    /// Bytes read from the data's storage.
    StorageRead,
    /// The machine's CPU busy, % of all cores.
    CpuBusy,
    /// The share of the time this run's threads were ready to run that they waited for a core.
    CoreWaitShare,
    /// Host→device copies per step.
    TransferPerStep,
    /// The share of the step in host→device copies.
    TransferShare,
    /// The share of the step in compute.
    ComputeShare,
    /// The largest part of compute's share of it.
    LargestPartShare,
    /// What the loader could supply over what the training loop takes.
    LoaderHeadroom,
    /// The GPU's mean utilisation.
    GpuUtil,
    /// Compute per step.
    ComputePerStep,
    /// The batch-independent optimizer step's share of compute.
    FixedCostShare,
    /// What a sample already in memory costs the loader, per image.
    SampleCostPerImage,
}

/// The unit of a [`Measure`]'s value and threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// A share, 0–1.
    Share,
    /// Percent, 0–100.
    Percent,
    Ms,
    ImagesPerS,
    MbPerS,
    /// A ratio (×).
    Ratio,
}

/// The figure one evidence line stands on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Measure {
    pub what: Quantity,
    /// Null where the line says the figure was not measured (no iowait sampled, no loader
    /// rate known).
    pub value: Option<f64>,
    pub unit: Unit,
    /// The threshold the rule compared the value with, in the same unit, where one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
}

fn m(what: Quantity, value: f64, unit: Unit, threshold: Option<f64>) -> Measure {
    Measure { what, value: Some(value).filter(|v| v.is_finite()), unit, threshold }
}

impl Facts<'_> {
    /// The figures of the evidence for `limiter`, one per line, in the lines' order.
    pub fn measures(&self, limiter: &Limiter) -> Vec<Measure> {
        self.evidence_items(limiter).iter().map(|e| self.measure(e)).collect()
    }

    fn measure(&self, e: &Evidence) -> Measure {
        use Quantity as Q;
        let sp = &self.s.split;
        match e {
            Evidence::Wait => {
                let at = if self.severity == Severity::High { HIGH_WAIT_SHARE } else { MODERATE_WAIT_SHARE };
                m(Q::WaitShare, sp.wait_share, Unit::Share, Some(at))
            }
            Evidence::GpuIdle { util } => m(Q::GpuIdle, (100.0 - util).clamp(0.0, 100.0), Unit::Percent, None),
            Evidence::NoLoaderSpans { iowait } => Measure {
                what: Q::Iowait,
                value: iowait.map(f64::from),
                unit: Unit::Percent,
                threshold: Some(IOWAIT_PCT),
            },
            Evidence::ReadWait => {
                m(Q::LoaderBlockedShare, self.loader_blocked_share(), Unit::Share, Some(IO_OFF_CPU_SHARE))
            }
            Evidence::LoaderCpu | Evidence::LoaderCompetes => {
                m(Q::LoaderCpuPerImage, self.p.loader_cpu_ms(), Unit::Ms, None)
            }
            Evidence::Capacity { .. } => m(Q::LoaderCapacity, self.cap.loader(), Unit::ImagesPerS, None),
            Evidence::ModelOff(off) => m(Q::ModelOff, off.off, Unit::Share, Some(MODEL_OFF_SHARE)),
            Evidence::Storage { read, syscall_read, .. } => Measure {
                what: Q::StorageRead,
                value: read.or(*syscall_read).map(|b| b / 1e6),
                unit: Unit::MbPerS,
                threshold: None,
            },
            Evidence::SaturatedRead => {
                m(Q::CpuBusy, self.global_cpu.unwrap_or(f64::NAN), Unit::Percent, Some(CPU_SATURATED_PCT))
            }
            Evidence::Cpu { busy } => m(Q::CpuBusy, *busy, Unit::Percent, Some(CPU_SATURATED_PCT)),
            Evidence::Contention => m(Q::CoreWaitShare, self.core_wait_share(), Unit::Share, Some(CONTENTION_SHARE)),
            Evidence::Transfer { .. } => m(Q::TransferPerStep, sp.transfer_ms, Unit::Ms, None),
            Evidence::TransferShare => m(Q::TransferShare, sp.transfer_share, Unit::Share, Some(TRANSFER_SHARE)),
            Evidence::Compute => m(Q::ComputeShare, sp.compute_share, Unit::Share, None),
            Evidence::Dominant(part) => m(Q::LargestPartShare, part.share, Unit::Share, None),
            Evidence::LoaderSupply { .. } => {
                let headroom = self.cap.loader() / self.cap.compute;
                m(Q::LoaderHeadroom, headroom, Unit::Ratio, Some(BALANCED_HEADROOM))
            }
            Evidence::GpuBusy { util } => m(Q::GpuUtil, *util, Unit::Percent, None),
            Evidence::Overhead(why) => match why {
                OverheadWhy::TinyStep(c) => m(Q::ComputePerStep, *c, Unit::Ms, Some(OVERHEAD_STEP_MS)),
                OverheadWhy::FixedCost(s) => m(Q::FixedCostShare, *s, Unit::Share, Some(FIXED_COST_SHARE)),
                OverheadWhy::LowGpu(u) => m(Q::GpuUtil, *u, Unit::Percent, Some(GPU_LOW_UTIL_PCT)),
                OverheadWhy::InMemoryLoader(per) => m(Q::SampleCostPerImage, *per, Unit::Ms, Some(IN_MEMORY_IMAGE_MS)),
            },
            Evidence::ComputePerBatch => m(Q::ComputePerStep, sp.compute_ms, Unit::Ms, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_that_is_not_a_number_is_written_as_not_measured() {
        assert_eq!(m(Quantity::CpuBusy, f64::NAN, Unit::Percent, None).value, None);
        assert_eq!(m(Quantity::CpuBusy, 93.0, Unit::Percent, Some(90.0)).value, Some(93.0));
    }

    #[test]
    fn quantities_and_units_are_written_in_snake_case() {
        let j = serde_json::to_value(m(Quantity::WaitShare, 0.4, Unit::ImagesPerS, Some(0.2))).unwrap_or_default();
        assert_eq!(j["what"], "wait_share");
        assert_eq!(j["unit"], "images_per_s");
        assert_eq!(j["threshold"], 0.2);
    }
}
