//! Advice: one typed [`Change`] per action, its predicted gain from the [`super::model`], and
//! the sentence saying why. The command line a change stands for is [`Change::command`]
//! ([`super::command`]).

use super::classify::{Facts, OverheadWhy};
use super::command::pack_size;
use super::model::{per_s, Pipeline, LOCAL_READ_MS};
use super::thresholds::*;
use super::{Advice, Basis, Change, Flag, Limiter, PackSize};
use crate::units::{ms_spaced as ms, pct, rate};
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

/// What the workers advice says in place of a rate where the reads ran cold
/// ([`COLD_READ_SHARE`]).
pub const COLD_NO_NUMBER: &str = "no prediction (the CPU work measured between slow reads ran cold, by a factor this run does not show): measured by `pipeprof run --check-advice`";

/// What the copy and pack advice add where the reads ran cold ([`COLD_READ_SHARE`]): their
/// prediction is a floor.
pub const COLD_FLOOR: &str = " (a floor: the CPU work between the slow reads was measured cold, and runs faster fed, by a factor this run does not show; `pipeprof run --check-advice` measures it)";

impl Facts<'_> {
    /// Every piece of advice for this limiter: predicted gains first, largest first.
    pub fn advice(&self, limiter: &Limiter, flags: &[Flag]) -> Vec<Advice> {
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
    fn free_cores_advice(&self) -> Option<Advice> {
        let others: Vec<_> = self.holders().collect();
        let other_cores = self.other_cores.unwrap_or(0.0);
        let after = self.p.without_contention(other_cores);
        let named = if others.is_empty() {
            "the programs that hold the cores".to_string()
        } else {
            others.iter().map(|o| format!("{} ({:.0}% CPU)", o.name, o.cpu_pct)).collect::<Vec<_>>().join(", ")
        };
        let steal = self
            .s
            .machine
            .steal_mean_pct
            .filter(|s| f64::from(*s) >= STEAL_PCT)
            .map(|s| format!("; the hypervisor steals {s:.0}% (another guest: a larger or dedicated VM)"))
            .unwrap_or_default();
        let gain = self.gain(&after);
        Some(Advice {
            action: format!("stop or lower the priority of {named} (nice -n 19), or train on a quieter machine"),
            change: Change::FreeCores,
            command: None,
            predicted_speedup: gain.map(|g| g.0),
            basis: gain.map(|g| g.1),
            reason: format!(
                "this run's threads wait for a core {} of the time they are ready to run while other programs keep {other_cores:.1} cores busy{steal}",
                pct(self.core_wait_share())
            ),
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

    /// Today's measured rate in words, for reasons.
    fn now_words(&self) -> String {
        self.now.map_or_else(|| rate(self.cap.throughput()), |n| rate(n.rate).replacen('≈', "", 1))
    }

    /// With the CPU device, what more workers take from compute.
    fn cores_shared_note(&self) -> String {
        if !self.cpu_device {
            return String::new();
        }
        format!(
            "; training on the CPU, the workers take cores from compute ({} of compute CPU per image counted)",
            ms(self.p.compute_cpu_now_ms())
        )
    }

    /// A PyTorch DataLoader's or Keras's batches in one epoch: their workers take an epoch's
    /// batches, so a worker beyond that count has nothing to do (an H200's 16 workers on
    /// 15-batch epochs gave ×10.6 where 16 were predicted to give ×18). None for pipeprof's
    /// own loop, or when the data's size is unknown.
    fn batches_per_epoch(&self) -> Option<usize> {
        let st = &self.s.settings;
        super::frameworks::Framework::of(&st.framework)?;
        (st.images > 0).then(|| st.images.div_ceil(st.batch_size.max(1)))
    }

    fn workers_advice(&self, limiter: &Limiter) -> Option<Advice> {
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
        let (n, x) = candidates.into_iter().find(|(_, x)| *x >= NEAR_BEST_SHARE * best)?;
        if *limiter != Limiter::Io && self.oversubscribed(n) {
            return self.oversubscribed_workers_advice(w, n);
        }
        let (gain, basis) = self.gain(&self.p.with_workers(n))?;
        let now = self.now_words();
        let share = self.cores_shared_note();
        // Cold reads (a PyTorch or Keras program on slow storage): the workers' CPU work and the
        // mount's own run at a cost this run does not show (on a FUSE mount: ×6.4 predicted,
        // ×4.0 measured): the advice stands, with no number.
        let cold = *limiter == Limiter::Io && self.reads_cold();
        let reason = if cold {
            let off = self.p.stage(Stage::Read).map_or(0.0, |r| r.blocked_ms());
            format!(
                "each read is blocked {} off-CPU; {n} workers overlap the waits if the storage serves parallel reads at the same latency; {COLD_NO_NUMBER}",
                ms(off)
            )
        } else if *limiter == Limiter::Io {
            let off = self.p.stage(Stage::Read).map_or(0.0, |r| r.blocked_ms());
            format!(
                "each read is blocked {} off-CPU; {n} workers overlap the waits: {} instead of {now} if the storage serves parallel reads at the same latency{share}",
                ms(off),
                rate(x)
            )
        } else {
            let c = self.p.loader_cpu_ms();
            // The loop's side with workers: its step and the batch it receives from them.
            let loop_rate = self.p.with_workers(n).capacity().compute;
            let needed = c * loop_rate / 1000.0;
            format!(
                "the loader needs {} of CPU per image: keeping up with the training loop ({}) needs {needed:.1} cores; {:.1} cores free: {} instead of {now}{share}",
                ms(c),
                rate(loop_rate),
                self.p.free_cores,
                rate(x)
            )
        };
        Some(Advice {
            action: format!("raise loader workers {w} → {n}"),
            change: Change::Workers(n),
            command: None,
            predicted_speedup: (!cold).then_some(gain),
            basis: (!cold).then_some(basis),
            reason,
        })
    }

    /// Workers on a CPU the compute's threads already hold ([`Facts::oversubscribed`]): the
    /// model's gain is an upper bound there, so no number; and not even advice when that
    /// bound is within the model's error ([`OVERSUBSCRIBED_TRY_GAIN`]).
    fn oversubscribed_workers_advice(&self, w: usize, n: usize) -> Option<Advice> {
        let best = self.p.speedup(&self.p.with_workers(n))?;
        if best < OVERSUBSCRIBED_TRY_GAIN {
            return None;
        }
        let (t, cores) = (self.compute_threads(), self.p.cores as usize);
        Some(Advice {
            action: format!("try loader workers {w} → {n}"),
            change: Change::Workers(n),
            command: None,
            predicted_speedup: None,
            basis: None,
            reason: format!(
                "training on the CPU, the program's {t} compute threads already hold the {cores} cores: {n} worker{} take{} their CPU from compute ({} threads on {cores} cores). Shared perfectly that would give at most ×{best:.2}, but oversubscribed cores often lose more than they share (runs measured 0.24–0.86×): no prediction, `--check-advice` measures it; fewer compute threads (torch.set_num_threads) beside the workers may do better",
                if n == 1 { "" } else { "s" },
                if n == 1 { "s" } else { "" },
                t + n
            ),
        })
    }

    fn prefetch_advice(&self) -> Option<Advice> {
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
        Some(Advice {
            action: format!("deepen the prefetch queue {} → {depth} batches", self.s.settings.prefetch),
            change: Change::Prefetch(depth),
            command: None,
            predicted_speedup: Some(gain),
            basis,
            reason: format!(
                "the loader keeps up on average ({} vs {} needed) but stalls: the median wait is {}, the mean {}, p95 {}; a deeper queue hides the stalls (at most {})",
                rate(self.cap.loader()),
                rate(self.cap.compute),
                ms(w.p50_ms),
                ms(w.mean_ms),
                ms(w.p95_ms),
                rate(after.min(now * gain))
            ),
        })
    }

    fn local_advice(&self) -> Option<Advice> {
        let fs = self.remote_fs()?;
        let r = self.p.stage(Stage::Read)?;
        let after = self.p.local_storage();
        let gain = self.gain_without_reads(&after);
        let then = if self.cold_unmeasured() {
            // A floor's range is no ceiling: its low end is the promise.
            let low = gain
                .as_ref()
                .map_or(after.capacity().throughput(), |(_, b)| b.range.map_or(b.predicted, |(lo, _)| lo * b.now));
            format!("at least {}{COLD_FLOOR}", rate(low).replacen('≈', "", 1))
        } else {
            format!("{}{}", rate(after.capacity().throughput()), self.fed_note(false))
        };
        Some(Advice {
            action: format!("copy the data set off the {} mount ({}) to a local disk", fs.kind, fs.fs_type),
            change: Change::CopyLocal,
            command: None,
            predicted_speedup: gain.map(|g| g.0),
            basis: gain.map(|g| g.1),
            reason: format!(
                "each read is blocked {} off-CPU on {}{}; a local disk answers in about {} or less: {then}",
                ms(r.blocked_ms()),
                fs.fs_type,
                self.lazy_reads_note(),
                ms(LOCAL_READ_MS),
            ),
        })
    }

    /// The blocked time of the stages after read, where it is worth a word: on a slow mount,
    /// a decoder that reads the file as it decodes (PIL) waits there too.
    fn lazy_reads_note(&self) -> String {
        let lazy = self.p.stage(Stage::Decode).map_or(0.0, |d| d.storage_wait_ms());
        if lazy < LAZY_READ_MS {
            return String::new();
        }
        format!(" and {} more in decode, reading the rest of each file as it decodes", ms(lazy))
    }

    /// A PyTorch or Keras program whose reads are blocked [`COLD_READ_SHARE`] or more of its
    /// loader's time ([`Pipeline::cold_read_wait_ms`]): the CPU work it measured between them
    /// ran cold.
    fn reads_cold(&self) -> bool {
        !self.s.settings.framework.is_empty() && self.p.cold_read_wait_ms().is_some()
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

    /// Where the hook measured the loader's work fed ([`crate::aggregate::settings::ColdCpu`]):
    /// "; …" saying what it measured (`packed`: the transform on packed images too), else empty.
    fn fed_note(&self, packed: bool) -> String {
        let Some(c) = self.s.settings.cold_cpu else { return String::new() };
        let alone = match c.packed_ms.filter(|_| packed) {
            Some(p) => format!(", the transform alone on packed images {}", ms(p)),
            None => String::new(),
        };
        format!(
            "; CPU work counted fed, as the program's own data measured at its end: decoded and transformed right after a {} read, {} of CPU an image, back to back {} (÷{:.2}: the loader's{} work between the reads){alone}",
            ms(c.after_wait_ms),
            ms(c.cold_ms),
            ms(c.fed_ms),
            c.factor(),
            match (self.p.loop_waits, self.cpu_device) {
                (true, true) => ", the loop's and the step's",
                (true, false) => " and the loop's",
                (false, _) => "",
            }
        )
    }

    fn cache_advice(&self) -> Option<Advice> {
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
        let framework = super::frameworks::Framework::of(&st.framework);
        let (action, change) = match (st.model.cnn_toml(), framework) {
            (Some(model), _) => (
                "pack the decoded, resized images into one local memory-mapped cache",
                Change::Cache { model: model.display().to_string(), data: st.data.clone() },
            ),
            (None, Some(fw)) if fw == super::frameworks::Framework::Keras || st.folder_dataset => {
                let keras = fw == super::frameworks::Framework::Keras;
                (
                    if keras {
                        "pack the image folder once into one memory-mapped file and read it with pipeprof.keras.packed_dataset (the same batches, labels and class_names)"
                    } else {
                        "pack the image folder once into one memory-mapped file and read it with PackedImageFolder (ImageFolder's classes and order; your transforms still apply)"
                    },
                    Change::PackFolder { keras, data: st.data.clone(), size: pack_size(keras, st) },
                )
            }
            _ => (
                "decode and resize every image once into one local memory-mapped file (e.g. a numpy memmap) and have your loader read from it",
                Change::PackOwnLoader,
            ),
        };
        let keeps_resize = matches!(change, Change::PackFolder { size: PackSize::AsStored, .. });
        let after = if keeps_resize { self.p.packed_as_stored() } else { self.p.cached() };
        let (gain, basis) = self.gain_without_reads(&after)?;
        let removed: &[Stage] =
            if keeps_resize { &[Stage::Read, Stage::Decode] } else { &[Stage::Read, Stage::Decode, Stage::Resize] };
        let gone: f64 = self.p.loader.iter().filter(|x| removed.contains(&x.stage)).map(|x| x.wall_ms).sum();
        let (what, still) = if keeps_resize {
            ("removes read and decode", "; your transforms still resize the images, stored as they are")
        } else {
            ("removes read, decode and resize", "")
        };
        let floor = if basis.floor { COLD_FLOOR.to_string() } else { self.fed_note(true) };
        let reason = format!(
            "{what} ({} per image) for a memory copy{still}: the loader could supply {}, training takes {}{floor}",
            ms(gone),
            rate(after.capacity().loader()),
            self.training_takes(&after),
        );
        Some(Advice {
            action: action.into(),
            change,
            command: None,
            predicted_speedup: Some(gain),
            basis: Some(basis),
            reason,
        })
    }

    /// What the training loop takes after a change to the loader: today's, or, where its
    /// compute threads shared the cores with the workers' CPU ([`Pipeline::compute_beside_ms`]),
    /// what it takes beside the lighter loader, and why.
    fn training_takes(&self, after: &Pipeline) -> String {
        let now = self.cap.compute;
        let then = after.capacity().compute;
        if then > now * 1.02 {
            format!(
                "{} (now {}: its compute threads wait less behind the workers for the cores)",
                rate(then),
                rate(now)
            )
        } else {
            rate(now)
        }
    }

    fn pre_resize_advice(&self) -> Option<Advice> {
        let resize = self.p.stage(Stage::Resize)?;
        // Images in memory are not resized offline: they are not stored as files.
        if !self.samples_from_files() {
            return None;
        }
        // A program that never said its input size: there is no size to advise.
        if self.s.settings.input[1] == 0 || self.s.settings.input[2] == 0 {
            return None;
        }
        let after = self.p.pre_resized();
        let (gain, basis) = self.gain(&after)?;
        let decode = self.p.stage(Stage::Decode).map_or(0.0, |d| d.wall_ms);
        let [_, height, width] = self.s.settings.input;
        Some(Advice {
            action: format!("pre-resize the images offline to {width}×{height} (e.g. JPEG quality 90)"),
            change: Change::PreResize { width, height },
            command: None,
            predicted_speedup: Some(gain),
            basis: Some(basis),
            reason: format!(
                "resize costs {} and decode {} per image; at the input size resize nearly vanishes and decode is assumed to halve (it follows the pixel count, unknown here). PNG→JPEG alone decodes about as fast at the same size: the gain is the smaller images",
                ms(resize.wall_ms),
                ms(decode)
            ),
        })
    }

    fn augment_advice(&self) -> Option<Advice> {
        let aug = self.p.stage(Stage::Augment)?;
        let after = self.p.without_augment();
        let (gain, basis) = self.gain(&after)?;
        Some(Advice {
            action: "make augmentation cheaper (fewer or simpler transforms: flips cost far less than rotation/zoom/shear) or run it on the device on whole batches".into(),
            change: Change::CheaperAugment,
            command: None,
            predicted_speedup: Some(gain),
            basis: Some(basis),
            reason: format!(
                "augment costs {} per image ({} on-CPU) in the loader; without it the loader could supply {}, training takes {}",
                ms(aug.wall_ms),
                ms(aug.on_cpu_ms),
                rate(after.capacity().loader()),
                self.training_takes(&after)
            ),
        })
    }

    fn u8_advice(&self) -> Option<Advice> {
        let after = self.p.u8_transfer();
        let (gain, basis) = self.gain(&after)?;
        Some(Advice {
            action: "send batches as u8 and convert to f32 on the device".into(),
            change: Change::U8Batches,
            command: None,
            predicted_speedup: Some(gain),
            basis: Some(basis),
            reason: format!(
                "f32 pixels are 4× the bytes of u8: transfer {} → about {} per step if copy time follows bytes",
                ms(self.p.transfer_ms),
                ms(after.transfer_ms)
            ),
        })
    }

    /// A larger batch for a loop that batches in-memory samples itself: the step's parts that
    /// do not grow with the batch are spread over more images.
    fn serial_batch_advice(&self, b: usize, nb: usize) -> Option<Advice> {
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
        let rest = if self.cpu_device {
            format!(
                "forward+backward ({}) grows with the batch on the CPU by up to ×{}: the range",
                ms(st.compute_rest_ms),
                nb / b
            )
        } else {
            format!(
                "a tiny model's kernels ({}) take about as long for {nb} images as for {b} on a GPU",
                ms(st.compute_rest_ms)
            )
        };
        Some(Advice {
            action: format!("raise the batch size {b} → {nb}"),
            change: Change::BatchSize(nb),
            command: None,
            predicted_speedup: Some(point),
            basis: Some(basis),
            reason: format!(
                "{} of each {} step does not grow with the batch (the DataLoader's own work per step{}); fetching and collating ({}) does; {rest}. Scale the learning rate with the batch",
                ms(st.fixed_ms()),
                ms(self.s.split.mean_step_ms),
                if st.compute_fixed_ms > 0.0 { format!(", the optimizer step {}", ms(st.compute_fixed_ms)) } else { String::new() },
                ms(st.loader_per_batch_ms)
            ),
        })
    }

    fn batch_advice(&self) -> Option<Advice> {
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
        let reason = match (&after, self.p.fixed_step_ms()) {
            (Some(a), _) if launch_bound => format!(
                "a tiny model's kernels ({} a step) take about as long for {nb} images as for {b} on a GPU; the copy grows with the batch: {} instead of {}. Scale the learning rate with the batch",
                ms(self.p.compute_ms),
                rate(a.capacity().throughput()),
                rate(self.cap.throughput()),
            ),
            (Some(a), Some(fixed)) => format!(
                "the optimizer step ({}) does not grow with the batch; forward+backward ({} per image) does: {} instead of {}{}. Scale the learning rate with the batch",
                ms(fixed),
                ms((self.p.compute_ms - fixed) / self.p.batch),
                rate(a.capacity().throughput()),
                rate(self.cap.throughput()),
                if self.cpu_device { "" } else { " (a lower bound on a GPU, where launch overhead does not grow either)" }
            ),
            _ => format!(
                "{}: more images per step spread the fixed per-step cost (no prediction: the optimizer step, the batch-independent part, was not measured)",
                match self.overhead {
                    Some(OverheadWhy::LowGpu(u)) => format!("the GPU is busy only {u:.0}%"),
                    _ => format!("compute is {} per step", ms(self.p.compute_ms)),
                }
            ),
        };
        Some(Advice {
            action: format!("raise the batch size {b} → {nb}"),
            change: Change::BatchSize(nb),
            command: None,
            predicted_speedup: gain,
            basis,
            reason,
        })
    }

    /// A model too small for its GPU: the per-step launch and synchronisation cost does not
    /// shrink on a faster device, and the CPU has none of it. No prediction: the CPU's speed on
    /// this model was not measured (`--check-advice` measures it).
    fn cpu_device_advice(&self) -> Option<Advice> {
        if self.cpu_device {
            return None;
        }
        Some(Advice {
            action: "or stay on the CPU".into(),
            change: Change::UseDevice("cpu".into()),
            command: None,
            predicted_speedup: None,
            basis: None,
            reason: format!(
                "per-step overhead dominates ({} of compute per step): kernel launches and device syncs cost the same for a tiny model, and a CPU step has none",
                ms(self.p.compute_ms)
            ),
        })
    }

    fn gpu_advice(&self, limiter: &Limiter) -> Advice {
        let names: Vec<&str> = self.s.machine.devices.iter().map(|d| d.name.as_str()).collect();
        let gpus = if names.is_empty() { "a GPU".to_string() } else { names.join(", ") };
        let why = match limiter {
            Limiter::Overhead => "the model is tiny: per-step overhead dominates, and a GPU may be no faster".to_string(),
            Limiter::Io | Limiter::Preprocess | Limiter::Contention => {
                "the loader limits now: the GPU frees the CPU cores compute takes from the loader".to_string()
            }
            _ => format!(
                "compute takes {} of each step on the CPU; the gain depends on the model and cannot be predicted from a CPU run",
                pct(self.s.split.compute_share)
            ),
        };
        Advice {
            action: format!("train on the GPU ({gpus})"),
            change: Change::UseDevice("cuda".into()),
            command: None,
            predicted_speedup: None,
            basis: None,
            // pipeprof's own loop trains on a GPU only when built for it; a program's build
            // flags are its own.
            reason: if self.s.settings.framework.is_empty() {
                format!("{why} (needs a build with --features cuda)")
            } else {
                why
            },
        }
    }
}
