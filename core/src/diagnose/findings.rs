//! Which numbers decided a verdict: the evidence as an ordered, typed list, at most
//! [`MAX_EVIDENCE`] items, the wait share first. Each item carries the figures that decide
//! whether and how it is said; [`super::evidence`] puts the list into words, last.

use super::classify::{Facts, OverheadWhy};
use super::now::Now;
use super::readings::measured;
use super::thresholds::*;
use super::Limiter;
use crate::aggregate::ComputePart;
use probes::fsinfo::FsInfo;
use probes::stage::Stage;

/// How far the capacity model's estimate of today's rate is off the measured one (a share,
/// past [`MODEL_OFF_SHARE`]), and that measured rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct ModelOff {
    pub off: f64,
    pub now: Now,
}

/// One line of evidence.
#[derive(Debug, Clone)]
pub(super) enum Evidence<'a> {
    /// The loop's wait share against TensorFlow's thresholds.
    Wait,
    /// An input-bound run on a GPU: how idle the GPU was (its mean utilisation, %).
    GpuIdle { util: f64 },
    /// No loader spans: I/O or CPU judged from the machine's iowait (when sampled).
    NoLoaderSpans { iowait: Option<f32> },
    /// I/O-bound: how much of read (or of the dataset's own fetch) is blocked.
    ReadWait,
    /// Where the loader's CPU goes, stage by stage.
    LoaderCpu,
    /// The capacity model's two sides against the measured rate, with how far the model is
    /// off it where it is.
    Capacity { model_off: Option<ModelOff> },
    /// The model off the measured rate, on a line of its own (no capacity line to carry it).
    ModelOff(ModelOff),
    /// Where the data lives and how it was read: any of its figures that were measured.
    Storage { fs: Option<&'a FsInfo>, read: Option<f64>, syscall_read: Option<f64>, iowait: Option<f32> },
    /// The CPU saturated while read waits off-CPU: part of it may be waiting for a core.
    SaturatedRead,
    /// The machine's CPU (busy %), its cores and this run's free cores.
    Cpu { busy: f64 },
    /// This run's threads waiting for a core, and who holds the cores.
    Contention,
    /// Training on the CPU: the loader's and compute's CPU per image on the same cores (beside
    /// tf.data, the map's share of the process's CPU: with the wait inside the step, what
    /// decides whether the map limits the run).
    LoaderCompetes,
    /// Host→device copies per step (and their bytes per batch, when counted).
    Transfer { mb_per_batch: Option<f64> },
    /// The transfer share against its threshold.
    TransferShare,
    /// Compute per batch and per image, and its share of the step.
    Compute,
    /// The largest part of compute.
    Dominant(ComputePart),
    /// What the loader could supply against what the loop takes; `balanced`: under
    /// [`BALANCED_HEADROOM`].
    LoaderSupply { balanced: bool },
    /// The GPU's mean utilisation, %.
    GpuBusy { util: f64 },
    /// Why the step's cost does not follow its work.
    Overhead(OverheadWhy),
    /// Compute per batch and per image.
    ComputePerBatch,
}

impl<'a> Facts<'a> {
    /// The evidence for `limiter`, in order, at most [`MAX_EVIDENCE`] items. Pure.
    pub(super) fn evidence_items(&self, limiter: &Limiter) -> Vec<Evidence<'a>> {
        let mut ev = vec![Evidence::Wait];
        match limiter {
            Limiter::Io | Limiter::Preprocess => self.input_items(limiter, &mut ev),
            Limiter::Contention => ev.extend([Evidence::LoaderCpu, Evidence::Capacity { model_off: None }]),
            Limiter::Transfer => {
                ev.extend([Evidence::Transfer { mb_per_batch: self.mb_per_batch() }, Evidence::TransferShare])
            }
            Limiter::Compute | Limiter::Balanced => self.compute_items(limiter, &mut ev),
            Limiter::Overhead => {
                ev.extend(self.overhead.map(Evidence::Overhead));
                ev.push(Evidence::ComputePerBatch);
                ev.extend(self.cpu_item());
            }
            Limiter::NotEnoughData { .. } => {}
        }
        if matches!(limiter, Limiter::Io | Limiter::Preprocess | Limiter::Contention) {
            // Right after the wait share, so truncation keeps it: it is the user's question.
            if let Some(util) = self.gpu_util.filter(|_| self.gpu_present && !self.cpu_device && !self.gpu_unused) {
                ev.insert(1, Evidence::GpuIdle { util });
            }
        }
        if self.contended() {
            // The finding itself, whatever the limiter: kept within the evidence cap.
            ev.truncate(MAX_EVIDENCE - 1);
            ev.push(Evidence::Contention);
        }
        let said = ev.iter().any(|e| matches!(e, Evidence::LoaderCompetes));
        if self.loader_competes() && !said && ev.len() < MAX_EVIDENCE {
            ev.push(Evidence::LoaderCompetes);
        }
        if let Some(off) = self.model_off_figures() {
            place_model_off(&mut ev, off, self.contended());
        }
        ev.truncate(MAX_EVIDENCE);
        ev
    }

    fn input_items(&self, limiter: &Limiter, ev: &mut Vec<Evidence<'a>>) {
        if self.p.loader.is_empty() {
            ev.push(Evidence::NoLoaderSpans { iowait: self.s.machine.iowait_mean_pct });
        } else {
            ev.push(if *limiter == Limiter::Io { Evidence::ReadWait } else { Evidence::LoaderCpu });
            if *limiter == Limiter::Preprocess && self.tf_map_cpu_share().is_some() {
                // tf.data's map against the step, on the same cores: what decides (with the
                // wait inside the step) whether the map limits the run.
                ev.push(Evidence::LoaderCompetes);
            }
            ev.push(Evidence::Capacity { model_off: None });
        }
        if *limiter == Limiter::Io {
            ev.extend(self.storage_item());
            if self.cpu_saturated() && self.p.loader_core_wait_ms() == 0.0 {
                ev.push(Evidence::SaturatedRead);
            }
        } else {
            ev.extend(self.cpu_item());
        }
    }

    fn compute_items(&self, limiter: &Limiter, ev: &mut Vec<Evidence<'a>>) {
        ev.push(Evidence::Compute);
        ev.extend(self.dominant_part().map(Evidence::Dominant));
        ev.push(Evidence::LoaderSupply { balanced: *limiter == Limiter::Balanced });
        ev.extend(self.gpu_util.filter(|_| !self.gpu_unused).map(|util| Evidence::GpuBusy { util }));
        ev.extend(self.cpu_item());
    }

    fn cpu_item(&self) -> Option<Evidence<'a>> {
        self.global_cpu.map(|busy| Evidence::Cpu { busy })
    }

    fn storage_item(&self) -> Option<Evidence<'a>> {
        let m = &self.s.machine;
        let (fs, read, syscall_read, iowait) =
            (self.s.data_fs.as_ref(), m.read_bytes_per_s_mean, m.syscall_read_bytes_per_s_mean, m.iowait_mean_pct);
        let any = fs.is_some() || read.is_some() || syscall_read.is_some() || iowait.is_some();
        any.then_some(Evidence::Storage { fs, read, syscall_read, iowait })
    }

    /// Megabytes per batch copied to the device, when the transfer spans counted bytes.
    fn mb_per_batch(&self) -> Option<f64> {
        measured(self.s, Stage::Transfer).filter(|x| x.bytes > 0).map(|x| x.bytes as f64 / x.count as f64 / 1e6)
    }

    /// The model's estimate of today off the measured rate by more than [`MODEL_OFF_SHARE`].
    fn model_off_figures(&self) -> Option<ModelOff> {
        let off = self.model_off().filter(|o| o.abs() > MODEL_OFF_SHARE)?;
        Some(ModelOff { off, now: self.now? })
    }
}

/// What every predicted gain rests on: said on the capacity line where there is one, else on
/// its own line within the cap, before the contention finding (`contended`: the last item).
fn place_model_off(ev: &mut Vec<Evidence<'_>>, off: ModelOff, contended: bool) {
    if let Some(Evidence::Capacity { model_off }) = ev.iter_mut().find(|e| matches!(e, Evidence::Capacity { .. })) {
        *model_off = Some(off);
        return;
    }
    let keep_last = usize::from(contended);
    if ev.len() >= MAX_EVIDENCE {
        ev.remove(MAX_EVIDENCE - 1 - keep_last);
    }
    ev.insert(ev.len() - keep_last.min(ev.len()), Evidence::ModelOff(off));
}
