//! Advice, decided: each rule gives one typed [`Change`], its predicted gain from the
//! [`super::model`], and a typed [`Why`] with the premises and numbers it decided on. No words
//! here: the action, the command and the reason are made last, once, in the user's terms
//! ([`super::frameworks::in_user_terms`]).

use super::classify::{Facts, OverheadWhy};
use super::command::pack_size;
use super::model::{per_s, Pipeline};
use super::thresholds::*;
use super::why::{Fed, FedParts, GpuCase, NowRate, Proposal, SerialRest, Training, Why};
use super::{Basis, Change, Flag, Limiter, PackSize};
use crate::aggregate::Framework;
use probes::stage::Stage;

/// The gain of a change from the model's rates before (`model_now`) and after (`after`) and
/// the measured rate today (`now`): after over measured, and a range when the model's today is
/// off the measured by more than [`MODEL_OFF_SHARE`]: from after/measured to after/model (the
/// model may be as far off after the change as before). `None` without three finite, positive
/// rates. Pure.
pub fn gain_against_measured(now: f64, model_now: f64, after: f64) -> Option<(f64, Option<(f64, f64)>)> {
    let ok = |x: f64| x.is_finite() && x > 0.0;
    if !(ok(now) && ok(after)) {
        return None;
    }
    let g = after / now;
    if !ok(model_now) || (model_now / now - 1.0).abs() <= MODEL_OFF_SHARE {
        return Some((g, None));
    }
    let other = after / model_now;
    Some((g, Some((g.min(other), g.max(other)))))
}

/// A gain `g` (with its range, if any) widened to take in `slow`, the gain if the compute runs
/// at its slow steps (CPU contention from other programs: which steps the scheduler slows is
/// not this run's to decide). Unchanged where `slow` is not finite and positive or inside the
/// range already. Pure.
pub fn widen_for_slow_steps(g: f64, range: Option<(f64, f64)>, slow: Option<f64>) -> Option<(f64, f64)> {
    let Some(slow) = slow.filter(|x| x.is_finite() && *x > 0.0) else { return range };
    let (lo, hi) = range.unwrap_or((g, g));
    let (lo, hi) = (lo.min(slow), hi.max(slow));
    (lo < hi).then_some((lo, hi))
}

impl Facts<'_> {
    /// Every piece of advice for this limiter: predicted gains first, largest first.
    pub fn advice(&self, limiter: &Limiter, flags: &[Flag]) -> Vec<Proposal> {
        let mut out = Vec::new();
        // Contention slows the loader: what makes the loader cheaper helps there too.
        if matches!(limiter, Limiter::Io | Limiter::Preprocess | Limiter::Contention) {
            out.extend(self.workers_advice(limiter));
            out.extend(self.prefetch_advice());
            if flags.iter().any(|f| matches!(f, Flag::NetworkStorage { .. })) {
                out.extend(self.local_advice());
            }
            out.extend(self.cache_advice());
            out.extend(self.pre_resize_advice());
            out.extend(self.augment_advice());
        }
        if self.contended() && self.competing_load() {
            out.extend(self.free_cores_advice());
        }
        if *limiter == Limiter::Transfer {
            out.extend(self.u8_advice());
        }
        if *limiter == Limiter::Overhead {
            out.extend(self.batch_advice());
            out.extend(self.cpu_device_advice());
        }
        if self.gpu_unused {
            out.push(self.gpu_advice(limiter));
        }
        // Advice without a number keeps its place after those with one.
        out.sort_by(|a, b| match (a.predicted_speedup, b.predicted_speedup) {
            (Some(x), Some(y)) => y.total_cmp(&x),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
        out
    }

    /// Contention from other programs: free the cores they hold.
    fn free_cores_advice(&self) -> Option<Proposal> {
        let holders = self.holders().map(|o| (o.name.clone(), o.cpu_pct)).collect();
        let other_cores = self.other_cores.unwrap_or(0.0);
        let steal_pct = self.s.machine.steal_mean_pct.filter(|s| f64::from(*s) >= STEAL_PCT);
        let gain = self.gain(&self.p.without_contention(other_cores));
        Some(Proposal {
            change: Change::FreeCores,
            predicted_speedup: gain.map(|g| g.0),
            basis: gain.map(|g| g.1),
            why: Why::FreeCores { holders, core_wait_share: self.core_wait_share(), other_cores, steal_pct },
        })
    }

    /// The gain of `after` against today's measured rate (see [`gain_against_measured`]),
    /// when it is worth advising.
    fn gain(&self, after: &Pipeline) -> Option<(f64, Basis)> {
        let now = self.now?;
        let predicted = after.capacity().throughput();
        let model_now = self.cap.throughput();
        let (g, range) = gain_against_measured(now.rate, model_now, predicted)?;
        // Under contention, a change that leaves compute the limit gets its slow steps too.
        let slow = after.slow_compute().map(|p| p.capacity().throughput() / now.rate);
        let widened = widen_for_slow_steps(g, range, slow);
        let basis = Basis {
            now: now.rate,
            from_step: now.from_step,
            to_step: now.to_step,
            predicted,
            model_now,
            range: widened,
            slow_steps: widened != range,
            compute_split_unknown: false,
            floor: false,
        };
        (g >= MIN_GAIN).then_some((g, basis))
    }

    /// Today's rate as a reason quotes it: measured, else the model's.
    fn now_quoted(&self) -> NowRate {
        self.now.map_or_else(|| NowRate::Modelled(self.cap.throughput()), |n| NowRate::Measured(n.rate))
    }

    /// With the CPU device, the compute CPU per image more workers take their cores from.
    fn cores_shared(&self) -> Option<f64> {
        self.cpu_device.then(|| self.p.compute_cpu_now_ms())
    }

    /// A PyTorch DataLoader's or Keras's batches in one epoch: their workers take an epoch's
    /// batches, so a worker beyond that count has nothing to do (an H200's 16 workers on
    /// 15-batch epochs gave ×10.6 where 16 were predicted to give ×18). None for pipeprof's
    /// own loop, or when the data's size is unknown.
    fn batches_per_epoch(&self) -> Option<usize> {
        let st = &self.s.settings;
        if !st.framework.has_knobs() {
            return None;
        }
        (st.images > 0).then(|| st.images.div_ceil(st.batch_size.max(1)))
    }

    fn workers_advice(&self, limiter: &Limiter) -> Option<Proposal> {
        if self.p.loader.is_empty() {
            return None;
        }
        let w = self.s.settings.workers;
        let cores = self.p.cores as usize;
        let max_n = if *limiter == Limiter::Io { cores * IO_WORKERS_PER_CORE } else { cores };
        let max_n = max_n.min(self.batches_per_epoch().unwrap_or(usize::MAX));
        let candidates: Vec<(usize, f64)> =
            (w + 1..=max_n).map(|n| (n, self.p.with_workers(n).capacity().throughput())).collect();
        let best = candidates.iter().map(|(_, x)| *x).fold(0.0, f64::max);
        let (n, then) = candidates.into_iter().find(|(_, x)| *x >= NEAR_BEST_SHARE * best)?;
        if *limiter != Limiter::Io && self.oversubscribed(n) {
            return self.oversubscribed_workers_advice(n);
        }
        let (gain, basis) = self.gain(&self.p.with_workers(n))?;
        let (now, compute_cpu_ms) = (self.now_quoted(), self.cores_shared());
        let blocked_ms = self.p.stage(Stage::Read).map_or(0.0, |r| r.blocked_ms());
        // Cold reads (a PyTorch or Keras program on slow storage): the workers' CPU work and the
        // mount's own run at a cost this run does not show (on a FUSE mount: ×6.4 predicted,
        // ×4.0 measured): the advice stands, with no number.
        let cold = *limiter == Limiter::Io && self.reads_cold();
        let why = if cold {
            Why::WorkersColdReads { n, blocked_ms }
        } else if *limiter == Limiter::Io {
            Why::WorkersOverlapReads { n, blocked_ms, then, now, compute_cpu_ms }
        } else {
            let loader_cpu_ms = self.p.loader_cpu_ms();
            // The loop's side with workers: its step and the batch it receives from them.
            let loop_rate = self.p.with_workers(n).capacity().compute;
            Why::WorkersCpu {
                loader_cpu_ms,
                loop_rate,
                needed_cores: loader_cpu_ms * loop_rate / 1000.0,
                free_cores: self.p.free_cores,
                then,
                now,
                compute_cpu_ms,
            }
        };
        Some(Proposal {
            change: Change::Workers(n),
            predicted_speedup: (!cold).then_some(gain),
            basis: (!cold).then_some(basis),
            why,
        })
    }

    /// Workers on a CPU the compute's threads already hold ([`Facts::oversubscribed`]): the
    /// model's gain is an upper bound there, so no number; and not even advice when that
    /// bound is within the model's error ([`OVERSUBSCRIBED_TRY_GAIN`]).
    fn oversubscribed_workers_advice(&self, n: usize) -> Option<Proposal> {
        let best = self.p.speedup(&self.p.with_workers(n))?;
        if best < OVERSUBSCRIBED_TRY_GAIN {
            return None;
        }
        Some(Proposal {
            change: Change::Workers(n),
            predicted_speedup: None,
            basis: None,
            why: Why::WorkersOversubscribed { n, threads: self.compute_threads(), cores: self.p.cores as usize, best },
        })
    }

    fn prefetch_advice(&self) -> Option<Proposal> {
        let w = self.wait?;
        let spiky = w.p50_ms <= SPIKY_MEDIAN_SHARE * w.mean_ms || w.p95_ms >= SPIKY_P95_RATIO * w.mean_ms;
        let busy_ms = self.s.split.transfer_ms + self.s.split.compute_ms;
        if !spiky || busy_ms <= 0.0 || !self.loader_keeps_up() {
            return None;
        }
        // The loader keeps up on average: a deeper queue absorbs its stalls.
        let now = per_s(self.p.batch, self.s.split.mean_step_ms);
        let after = self.cap.throughput();
        let gain = (after / now).min(self.s.split.mean_step_ms / busy_ms);
        if !(gain.is_finite() && gain >= MIN_GAIN) {
            return None;
        }
        let spike = w.p95_ms.max(w.max_ms.min(MAX_SPIKE_RATIO * w.p95_ms.max(w.mean_ms)));
        let depth = (self.s.settings.prefetch + (spike / busy_ms).ceil() as usize)
            .clamp(*PREFETCH_DEPTH.start(), *PREFETCH_DEPTH.end());
        let basis = self.now.map(|n| Basis {
            now: n.rate,
            from_step: n.from_step,
            to_step: n.to_step,
            predicted: n.rate * gain,
            model_now: self.cap.throughput(),
            range: None,
            slow_steps: false,
            compute_split_unknown: false,
            floor: false,
        });
        Some(Proposal {
            change: Change::Prefetch(depth),
            predicted_speedup: Some(gain),
            basis,
            why: Why::Prefetch {
                loader: self.cap.loader(),
                needed: self.cap.compute,
                p50_ms: w.p50_ms,
                mean_ms: w.mean_ms,
                p95_ms: w.p95_ms,
                at_most: after.min(now * gain),
            },
        })
    }

    fn local_advice(&self) -> Option<Proposal> {
        let fs = self.remote_fs()?;
        let r = self.p.stage(Stage::Read)?;
        let after = self.p.local_storage();
        let gain = self.gain_without_reads(&after);
        let then = if self.cold_unmeasured() {
            // A floor's range is no ceiling: its low end is the promise.
            gain.as_ref()
                .map_or(after.capacity().throughput(), |(_, b)| b.range.map_or(b.predicted, |(lo, _)| lo * b.now))
        } else {
            after.capacity().throughput()
        };
        // Blocked time after read, where it is worth a word: on a slow mount, a decoder that
        // reads the file as it decodes (PIL) waits there too.
        let lazy_ms = self.p.stage(Stage::Decode).map(|d| d.storage_wait_ms()).filter(|l| *l >= LAZY_READ_MS);
        Some(Proposal {
            change: Change::CopyLocal,
            predicted_speedup: gain.map(|g| g.0),
            basis: gain.map(|g| g.1),
            why: Why::CopyLocal {
                kind: fs.kind.to_string(),
                fs_type: fs.fs_type.clone(),
                blocked_ms: r.blocked_ms(),
                lazy_ms,
                then,
                fed: self.fed(false),
            },
        })
    }

    /// A PyTorch or Keras program whose reads are blocked [`COLD_READ_SHARE`] or more of its
    /// loader's time ([`Pipeline::cold_read_wait_ms`]): the CPU work it measured between them
    /// ran cold.
    fn reads_cold(&self) -> bool {
        !self.s.settings.framework.is_own() && self.p.cold_read_wait_ms().is_some()
    }

    /// The gain of taking the reads away (a local copy, a pack): where they ran cold
    /// ([`Facts::reads_cold`]), from the CPU costs as measured, cold, a floor
    /// ([`Basis::floor`]).
    fn gain_without_reads(&self, after: &Pipeline) -> Option<(f64, Basis)> {
        let (g, mut basis) = self.gain(after)?;
        basis.floor = self.cold_unmeasured();
        Some((g, basis))
    }

    /// Reads cold ([`Facts::reads_cold`]) and the hook did not time the work fed: what is
    /// predicted without the reads is a floor.
    fn cold_unmeasured(&self) -> bool {
        self.reads_cold() && self.s.settings.cold_cpu.is_none()
    }

    /// What is known of the loader's CPU work fed where the reads ran cold: a floor where the
    /// hook did not measure it ([`Facts::cold_unmeasured`]), its measurement where it did
    /// ([`crate::aggregate::settings::ColdCpu`]; `packed`: the transform on packed images too).
    fn fed(&self, packed: bool) -> Fed {
        if self.cold_unmeasured() {
            return Fed::Floor;
        }
        let Some(cpu) = self.s.settings.cold_cpu else { return Fed::Warm };
        let parts = match (self.p.loop_waits, self.cpu_device) {
            (true, true) => FedParts::LoaderLoopAndStep,
            (true, false) => FedParts::LoaderAndLoop,
            (false, _) => FedParts::Loader,
        };
        Fed::Measured { cpu, parts, packed }
    }

    fn cache_advice(&self) -> Option<Proposal> {
        // Nothing to pack when the samples are already in memory.
        if !self.samples_from_files() {
            return None;
        }
        let st = &self.s.settings;
        // `pipeprof cache` packs for a cnn.toml run; a PyTorch or Keras program gets `pipeprof
        // pack` and the reader to use in place of its own (a PyTorch one only when its dataset
        // is torchvision's folder reader: PackedImageFolder replaces nothing else); another
        // program (its own Dataset, a Rust or Python loop of its own) the same idea for its own
        // loader, with no command to copy.
        let change = match (st.model.cnn_toml(), &st.framework) {
            (Some(model), _) => Change::Cache { model: model.display().to_string(), data: st.data.clone() },
            (None, Framework::Keras) => {
                Change::PackFolder { keras: true, data: st.data.clone(), size: pack_size(true, st) }
            }
            (None, Framework::PyTorch) if st.folder_dataset => {
                Change::PackFolder { keras: false, data: st.data.clone(), size: pack_size(false, st) }
            }
            _ => Change::PackOwnLoader,
        };
        let keeps_resize = matches!(change, Change::PackFolder { size: PackSize::AsStored, .. });
        let after = if keeps_resize { self.p.packed_as_stored() } else { self.p.cached() };
        let (gain, basis) = self.gain_without_reads(&after)?;
        let removed: &[Stage] =
            if keeps_resize { &[Stage::Read, Stage::Decode] } else { &[Stage::Read, Stage::Decode, Stage::Resize] };
        let gone_ms: f64 = self.p.loader.iter().filter(|x| removed.contains(&x.stage)).map(|x| x.wall_ms).sum();
        Some(Proposal {
            change,
            predicted_speedup: Some(gain),
            basis: Some(basis),
            why: Why::Pack {
                keeps_resize,
                gone_ms,
                loader: after.capacity().loader(),
                training: self.training(&after),
                fed: self.fed(true),
            },
        })
    }

    /// What the training loop takes after a change to the loader: today's, or, where its
    /// compute threads shared the cores with the workers' CPU ([`Pipeline::compute_beside_ms`]),
    /// what it takes beside the lighter loader.
    fn training(&self, after: &Pipeline) -> Training {
        let now = self.cap.compute;
        let then = after.capacity().compute;
        if then > now * 1.02 {
            Training::Faster { then, now }
        } else {
            Training::Same(now)
        }
    }

    fn pre_resize_advice(&self) -> Option<Proposal> {
        let resize = self.p.stage(Stage::Resize)?;
        // Images in memory are not resized offline: they are not stored as files.
        if !self.samples_from_files() {
            return None;
        }
        // A program that never said its input size: there is no size to advise.
        if self.s.settings.input[1] == 0 || self.s.settings.input[2] == 0 {
            return None;
        }
        let (gain, basis) = self.gain(&self.p.pre_resized())?;
        let decode_ms = self.p.stage(Stage::Decode).map_or(0.0, |d| d.wall_ms);
        let [_, height, width] = self.s.settings.input;
        Some(Proposal {
            change: Change::PreResize { width, height },
            predicted_speedup: Some(gain),
            basis: Some(basis),
            why: Why::PreResize { resize_ms: resize.wall_ms, decode_ms },
        })
    }

    fn augment_advice(&self) -> Option<Proposal> {
        let aug = self.p.stage(Stage::Augment)?;
        let after = self.p.without_augment();
        let (gain, basis) = self.gain(&after)?;
        Some(Proposal {
            change: Change::CheaperAugment,
            predicted_speedup: Some(gain),
            basis: Some(basis),
            why: Why::Augment {
                wall_ms: aug.wall_ms,
                on_cpu_ms: aug.on_cpu_ms,
                loader: after.capacity().loader(),
                training: self.training(&after),
            },
        })
    }

    fn u8_advice(&self) -> Option<Proposal> {
        let after = self.p.u8_transfer();
        let (gain, basis) = self.gain(&after)?;
        Some(Proposal {
            change: Change::U8Batches,
            predicted_speedup: Some(gain),
            basis: Some(basis),
            why: Why::U8Batches { transfer_ms: self.p.transfer_ms, after_ms: after.transfer_ms },
        })
    }

    /// A larger batch for a loop that batches in-memory samples itself: the step's parts that
    /// do not grow with the batch are spread over more images.
    fn serial_batch_advice(&self, b: usize, nb: usize) -> Option<Proposal> {
        let st = self.serial_step()?;
        let (low, high) = st.batch_gain(nb as f64 / b as f64)?;
        let now = self.now?;
        let point = (low * high).sqrt();
        if high < MIN_GAIN {
            return None;
        }
        let basis = Basis {
            now: now.rate,
            from_step: now.from_step,
            to_step: now.to_step,
            predicted: now.rate * point,
            model_now: now.rate,
            range: (high / low > 1.0 + 1e-9).then_some((low, high)),
            slow_steps: false,
            compute_split_unknown: self.cpu_device,
            floor: false,
        };
        let compute_ms = st.compute_rest_ms;
        let rest = if self.cpu_device {
            SerialRest::Cpu { compute_ms, factor: nb / b }
        } else {
            SerialRest::Gpu { compute_ms, from: b, to: nb }
        };
        Some(Proposal {
            change: Change::BatchSize(nb),
            predicted_speedup: Some(point),
            basis: Some(basis),
            why: Why::SerialBatch {
                fixed_ms: st.fixed_ms(),
                step_ms: self.s.split.mean_step_ms,
                optimizer_ms: (st.compute_fixed_ms > 0.0).then_some(st.compute_fixed_ms),
                per_batch_ms: st.loader_per_batch_ms,
                rest,
            },
        })
    }

    fn batch_advice(&self) -> Option<Proposal> {
        let b = self.s.settings.batch_size.max(1);
        let nb = b * BATCH_GROWTH;
        if matches!(self.overhead, Some(OverheadWhy::InMemoryLoader(_))) {
            return self.serial_batch_advice(b, nb);
        }
        // A tiny model's step on a GPU is launches: its kernels take as long for more images.
        let launch_bound = !self.cpu_device && matches!(self.overhead, Some(OverheadWhy::TinyStep(_)));
        let after = if launch_bound { Some(self.p.with_batch_launch_bound(nb)) } else { self.p.with_batch(nb) };
        let gain = after.as_ref().and_then(|a| self.gain(a));
        let (gain, basis) = (gain.map(|g| g.0), gain.map(|g| g.1));
        if after.is_some() && gain.is_none() {
            return None;
        }
        let now = self.cap.throughput();
        let why = match (&after, self.p.fixed_step_ms()) {
            (Some(a), _) if launch_bound => Why::BatchLaunchBound {
                kernels_ms: self.p.compute_ms,
                from: b,
                to: nb,
                then: a.capacity().throughput(),
                now,
            },
            (Some(a), Some(fixed_ms)) => Why::BatchFixedStep {
                fixed_ms,
                per_image_ms: (self.p.compute_ms - fixed_ms) / self.p.batch,
                then: a.capacity().throughput(),
                now,
                on_cpu: self.cpu_device,
            },
            _ => Why::BatchUnmeasured {
                low_gpu_pct: match self.overhead {
                    Some(OverheadWhy::LowGpu(u)) => Some(u),
                    _ => None,
                },
                compute_ms: self.p.compute_ms,
            },
        };
        Some(Proposal { change: Change::BatchSize(nb), predicted_speedup: gain, basis, why })
    }

    /// A model too small for its GPU: the per-step launch and synchronisation cost does not
    /// shrink on a faster device, and the CPU has none of it. No prediction: the CPU's speed on
    /// this model was not measured (`--check-advice` measures it).
    fn cpu_device_advice(&self) -> Option<Proposal> {
        if self.cpu_device {
            return None;
        }
        Some(Proposal {
            change: Change::UseDevice("cpu".into()),
            predicted_speedup: None,
            basis: None,
            why: Why::CpuDevice { compute_ms: self.p.compute_ms },
        })
    }

    fn gpu_advice(&self, limiter: &Limiter) -> Proposal {
        let case = match limiter {
            Limiter::Overhead => GpuCase::Tiny,
            Limiter::Io | Limiter::Preprocess | Limiter::Contention => GpuCase::LoaderLimits,
            _ => GpuCase::Compute { share: self.s.split.compute_share },
        };
        Proposal {
            change: Change::UseDevice("cuda".into()),
            predicted_speedup: None,
            basis: None,
            why: Why::Gpu { case, own_loop: self.s.settings.framework.is_own() },
        }
    }
}
