//! The verdict's words: the headline and the 3–5 numbers that decided it, each item of
//! [`super::findings`]'s list said in turn. Every threshold named in a sentence is formatted
//! from the constant the rule compares against.

use super::classify::{Facts, OverheadWhy};
use super::findings::{Evidence, ModelOff};
use super::thresholds::*;
use super::{Limiter, Severity};
use crate::units::{ms_spaced as ms, pct, rate};
use probes::fsinfo::FsInfo;
use probes::stage::Stage;

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// A verdict given early on slow steps, marked as such.
pub(super) fn provisional(headline: &str, steps: u64, mean_step_ms: f64) -> String {
    format!(
        "Provisional after {steps} step{} of {:.1} s ({:.1} s measured; firm from {MIN_STEPS} steps): {headline}",
        if steps == 1 { "" } else { "s" },
        mean_step_ms / 1000.0,
        steps as f64 * mean_step_ms / 1000.0
    )
}

/// A verdict over the whole run because the workers changed too recently to judge the new
/// pipeline alone.
pub(super) fn provisional_after_change(headline: &str, changed_at: u64, steps: u64, workers: usize) -> String {
    format!(
        "Provisional: the workers changed to {workers} after step {changed_at}, only {} steps before the end (a steady state needs {}): the figures cover the whole run. {headline}",
        steps.saturating_sub(changed_at),
        crate::aggregate::MIN_PHASE_STEPS
    )
}

/// A finished run that measured no training step: no more are coming, so nothing is
/// "collecting".
pub(super) fn ended_before_a_step() -> String {
    "No verdict: the run ended before its first training step finished (a verdict needs at least one)".into()
}

pub(super) fn not_enough_headline(steps_needed: u64) -> String {
    if steps_needed > 0 {
        format!("collecting… {steps_needed} more steps needed for a verdict")
    } else {
        "no wait/transfer/compute spans yet: is the training loop instrumented?".into()
    }
}

impl Facts<'_> {
    fn wait_line(&self) -> String {
        let w = self.s.split.wait_share;
        let (high, moderate) = (pct(HIGH_WAIT_SHARE), pct(MODERATE_WAIT_SHARE));
        let rule = match self.severity {
            Severity::High => format!("HIGH: ≥ {high} per TensorFlow's rule"),
            Severity::Moderate => format!("moderate: ≥ {moderate} and < {high} per TensorFlow's rule"),
            Severity::Low => format!("low: < {moderate} per TensorFlow's rule"),
        };
        // TensorFlow takes the batch inside the compiled step: its wait is there, in the steps
        // the trace windows sampled, and apportioned to the others by their share.
        let who = if self.s.settings.tf_data {
            "the training step waited for its batch inside it (tf.data's IteratorGetNext)"
        } else {
            "the training loop waited for data"
        };
        format!(
            "{who} {:.1}% of each step ({} of {}) ({rule})",
            w * 100.0,
            ms(self.s.split.wait_ms),
            ms(self.s.split.mean_step_ms)
        )
    }

    /// The loader's two costliest stages per image, as " (decode, resize)": named for what
    /// was measured, never assumed; empty without loader spans.
    fn costliest_stages(&self) -> String {
        let mut v: Vec<_> = self.p.loader.iter().filter(|x| x.wall_ms > 0.0).collect();
        v.sort_by(|a, b| b.wall_ms.total_cmp(&a.wall_ms));
        let names: Vec<&str> = v.iter().take(2).map(|x| x.stage.name()).collect();
        if names.is_empty() {
            String::new()
        } else {
            format!(" ({})", names.join(", "))
        }
    }

    /// The capacity model's line, with how far it is off today's rate where it is (what every
    /// predicted gain rests on).
    fn capacity_line(&self, model_off: Option<ModelOff>) -> String {
        let w = self.s.settings.workers.max(1);
        let shared = if self.cpu_device {
            format!("; sharing {:.1} cores, both together {}", self.p.free_cores, rate(self.cap.shared_cpu))
        } else {
            String::new()
        };
        // With workers the loop also receives each batch, serially: its side of the pipeline
        // then (for a loader in the process, what it would be with workers).
        let main = self.p.main_per_batch_ms;
        let (loop_rate, own) = if main > 0.0 {
            (
                self.p.with_workers(w).capacity().compute,
                format!(
                    " (its step and {} a batch of the training process's own work, receiving the batch and the DataLoader's iteration, which workers do not take over)",
                    ms(main)
                ),
            )
        } else {
            (self.cap.compute, String::new())
        };
        // No workers: the training thread loads each batch, then trains on it; never "1 worker".
        let loader = if self.p.in_process {
            format!(
                "the training thread loads {} when it loads (no workers: loading and training take turns, {} together); with workers",
                rate(self.cap.loader()),
                rate(self.cap.in_process)
            )
        } else if self.s.settings.tf_data {
            format!("tf.data's parallel calls ({:.0}, one a core) supply {},", self.p.workers, rate(self.cap.loader()))
        } else {
            format!(
                "{} {} {},",
                plural(w, "loader worker"),
                if w == 1 { "supplies" } else { "supply" },
                rate(self.cap.loader())
            )
        };
        format!(
            "model: {loader} the training loop could take {}{own}{shared}; measured {:.1} images/s{}{}",
            rate(loop_rate),
            self.now.map_or(self.s.images_per_s, |n| n.rate),
            self.now.map(|n| format!(" (steps {}–{})", n.from_step, n.to_step)).unwrap_or_default(),
            model_off.map(|o| format!("; {}", self.model_off_line(o))).unwrap_or_default()
        )
    }

    /// The machine's CPU (`g`% busy), its cores and this run's free cores.
    fn cpu_line(&self, g: f64) -> String {
        let proc = self.process_cpu.map(|p| format!(" (this process {p:.0}%, 100% = one core)")).unwrap_or_default();
        let physical = if self.p.physical_cores < self.p.cores {
            format!(
                " ({} physical: a second hyper-thread counts as {} of a core)",
                self.p.physical_cores as usize,
                super::model::HYPER_THREAD_SHARE
            )
        } else {
            String::new()
        };
        format!(
            "CPU {g:.0}% busy on {} cores{physical}{proc}: {:.1} cores free for this run",
            self.p.cores as usize, self.p.free_cores
        )
    }

    /// Where the data lives, the bytes read (from storage or not) and iowait: those measured.
    fn storage_line(fs: Option<&FsInfo>, read: Option<f64>, syscall_read: Option<f64>, iowait: Option<f32>) -> String {
        let mut parts = Vec::new();
        if let Some(fs) = fs {
            parts.push(format!("data on {} ({})", fs.fs_type, fs.kind));
        }
        match (read, syscall_read) {
            // Bytes read by system calls that never reached a block device: the page cache, or
            // a network/FUSE filesystem (which the data line above names).
            (Some(r), Some(sys)) if sys > 0.0 => parts.push(format!(
                "{:.1} MB/s read, {:.1} MB/s of it from storage ({} from the page cache or a network mount)",
                sys / 1e6,
                r.min(sys) / 1e6,
                pct(1.0 - (r / sys).min(1.0))
            )),
            (Some(r), _) => parts.push(format!("{:.1} MB/s from storage", r / 1e6)),
            (None, Some(sys)) => parts.push(format!("{:.1} MB/s read (storage share not measurable here)", sys / 1e6)),
            (None, None) => {}
        }
        if let Some(w) = iowait {
            parts.push(format!("iowait {w:.0}%"));
        }
        parts.join(", ")
    }

    fn assumed_note(&self) -> &'static str {
        // TensorFlow's trace has no on-CPU clock: its CPU stages' shares scaled into the
        // process's CPU per image where they added up to more (`estimates::traced_cpu_within_tree`).
        let scaled = |x: &super::model::StageCost| x.stage != Stage::Read && x.on_cpu_ms < x.wall_ms;
        if self.s.settings.tf_data && self.p.loader.iter().any(|x| !x.measured && scaled(x)) {
            " (on-CPU shares: the process's CPU per image shared out by the spans' wall time)"
        } else if self.p.loader.iter().any(|x| !x.measured) {
            " (on-CPU share assumed from names)"
        } else {
            ""
        }
    }

    /// I/O-bound: how much of read is waiting on storage.
    fn read_wait_line(&self) -> String {
        let (r_wall, r_blocked, r_queue) =
            self.p.stage(Stage::Read).map_or((0.0, 0.0, 0.0), |r| (r.wall_ms, r.blocked_ms(), r.core_wait_ms));
        let share = |x: f64| pct(if r_wall > 0.0 { x / r_wall } else { 0.0 });
        let queue = if r_queue > 0.0 { format!(", {} waiting for a core", share(r_queue)) } else { String::new() };
        if self.blocked_in_dataset() {
            // The samples are fetched in code that reads no file the loader sees.
            let stages: Vec<&str> = self
                .p
                .loader
                .iter()
                .filter(|x| x.stage != Stage::Read && x.queue_measured && x.blocked_ms() > 0.0)
                .map(|x| x.stage.name())
                .collect();
            return format!(
                "the loader is blocked off-CPU {} per image in {} (not computing, not waiting for a core: a fetch, a sleep, a lock), {} of its {} per image{}",
                ms(self.other_blocked_ms() + r_blocked),
                stages.join(", "),
                pct(self.loader_blocked_share()),
                ms(self.p.loader_wall_ms()),
                self.assumed_note()
            );
        }
        format!(
            "read is {} blocked off-CPU{queue}: {} per image waiting on storage, {} of the loader's {} per image{}",
            share(r_blocked),
            ms(r_blocked),
            pct(self.read_blocked_share()),
            ms(self.p.loader_wall_ms()),
            self.assumed_note()
        )
    }

    /// Preprocessing-bound: where the loader's CPU goes, stage by stage.
    fn loader_cpu_line(&self) -> String {
        let wall = self.p.loader_wall_ms();
        let cpu_stages = || self.p.loader.iter().filter(|x| x.stage != Stage::Read);
        let parts: Vec<String> = cpu_stages()
            .filter(|x| x.wall_ms > 0.0)
            .map(|x| format!("{} {} ({} on-CPU)", x.stage.name(), ms(x.wall_ms), pct(x.on_cpu_ms / x.wall_ms)))
            .collect();
        // The run-queue wait where the kernel measured it; else the CPU stages' off-CPU time,
        // which is waiting for a core or blocked (a sleep, a lock, the GIL, a remote fetch):
        // said as such, not guessed either way.
        let (off, what) = if cpu_stages().any(|x| x.queue_measured) {
            (self.p.loader_core_wait_ms(), "waiting for a core")
        } else {
            (
                cpu_stages().map(|x| x.off_cpu_ms()).sum::<f64>(),
                "off-CPU (waiting for a core or blocked: the run-queue wait was not measured)",
            )
        };
        let waiting = if off >= CORE_WAIT_SHARE * wall && wall > 0.0 {
            format!("; {} of it {what}", ms(off))
        } else {
            String::new()
        };
        format!(
            "the loader spends {} of CPU per image of {} wall: {}{waiting}; read is blocked only {} of it{}",
            ms(self.p.loader_cpu_ms()),
            ms(wall),
            parts.join(", "),
            pct(self.read_blocked_share()),
            self.assumed_note()
        )
    }

    pub fn headline(&self, limiter: &Limiter) -> String {
        let sp = &self.s.split;
        let sev = self.severity.label();
        let waited = format!("{:.1}%", sp.wait_share * 100.0);
        match limiter {
            Limiter::Preprocess if self.tf_map_cpu_share().is_some_and(|x| x >= TF_MAP_CPU_SHARE) => format!(
                "CPU preprocessing in tf.data's map{} limits training: it takes {} of this process's CPU per image on the {} cores the step trains on{}; the step waited for its batch {waited} of its time",
                self.costliest_stages(),
                pct(self.tf_map_cpu_share().unwrap_or(0.0)),
                self.p.cores as usize,
                if self.tf_map_takes_cores() { ", so its threads take the cores the step needs" } else { "" }
            ),
            Limiter::Io | Limiter::Preprocess if self.loader_keeps_up() => format!(
                "Input-bound ({sev}): the loop waited for data {waited} of each step although the loader keeps up on average ({} vs {}): it stalls, mostly in {}",
                rate(self.cap.loader()),
                rate(self.cap.compute),
                if *limiter == Limiter::Io { "storage reads" } else { "CPU preprocessing" }
            ),
            Limiter::Contention => format!(
                "Input-bound ({sev}): this run's threads wait for cores other programs hold ({} of the time they are ready to run); the training loop waited for data {waited} of each step",
                pct(self.core_wait_share())
            ),
            Limiter::Io if self.blocked_in_dataset() => format!(
                "Input-bound ({sev}): the loader waits off-CPU for its samples (a fetch or read inside the dataset, not computing); the training loop waited for data {waited} of each step"
            ),
            Limiter::Io => format!(
                "Input-bound ({sev}): the loader waits on storage reads; the training loop waited for data {waited} of each step"
            ),
            Limiter::Preprocess => format!(
                "Input-bound ({sev}): CPU preprocessing in the loader{} limits training; the loop waited for data {waited} of each step",
                self.costliest_stages()
            ),
            Limiter::Transfer => format!(
                "Transfer-bound: host→device copies take {} of each step",
                pct(sp.transfer_share)
            ),
            Limiter::Compute => match self.dominant_part() {
                Some(part) if part.label == "optimizer" => format!(
                    "Compute-bound (optimizer): the model's computation takes {} of each step, {} of it in the optimizer step; the input pipeline keeps up",
                    pct(sp.compute_share),
                    pct(part.share)
                ),
                Some(part) => format!(
                    "Compute-bound: the model's computation takes {} of each step, {} of it in {}; the input pipeline keeps up",
                    pct(sp.compute_share),
                    pct(part.share),
                    part.label
                ),
                None => format!(
                    "Compute-bound: the model's computation takes {} of each step; the input pipeline keeps up",
                    pct(sp.compute_share)
                ),
            },
            Limiter::Overhead => self.overhead_headline(),
            Limiter::Balanced => format!(
                "Balanced: the loader and the training loop run at nearly the same pace (wait {waited} of each step)"
            ),
            Limiter::NotEnoughData { steps_needed } => not_enough_headline(*steps_needed),
        }
    }

    fn overhead_headline(&self) -> String {
        match self.overhead {
            Some(OverheadWhy::LowGpu(u)) => format!(
                "Per-step overhead: the GPU is busy only {u:.0}% while the loop does not wait for data; the model gives it too little work per step"
            ),
            Some(OverheadWhy::FixedCost(share)) => format!(
                "Per-step overhead: the optimizer step, whatever the batch size, is {} of compute",
                pct(share)
            ),
            Some(OverheadWhy::InMemoryLoader(_)) => format!(
                "Per-step overhead: the loop waits {} of each step while the DataLoader takes samples already in memory and batches them; the images cost little, every step costs the same",
                pct(self.s.split.wait_share)
            ),
            _ => format!(
                "Per-step overhead: {} of compute per step for a tiny model; fixed per-step costs dominate",
                ms(self.s.split.compute_ms)
            ),
        }
    }

    /// The numbers that decided, the wait share first, at most [`MAX_EVIDENCE`]: the
    /// [`Evidence`] list, in words.
    pub fn evidence(&self, limiter: &Limiter) -> Vec<String> {
        self.evidence_items(limiter).iter().map(|e| self.say(e)).collect()
    }

    /// One item of evidence in words.
    fn say(&self, e: &Evidence) -> String {
        let sp = &self.s.split;
        match e {
            Evidence::Wait => self.wait_line(),
            Evidence::GpuIdle { util } => format!(
                "the GPU was idle {:.0}% of the time while the loop waited for data {} of each step",
                (100.0 - util).clamp(0.0, 100.0),
                pct(sp.wait_share)
            ),
            Evidence::NoLoaderSpans { iowait } => format!(
                "the loader has no read/decode/resize spans: I/O vs CPU judged from {} and the data's filesystem",
                iowait.map(|w| format!("iowait {w:.0}%")).unwrap_or("no iowait".into())
            ),
            Evidence::ReadWait => self.read_wait_line(),
            Evidence::LoaderCpu => self.loader_cpu_line(),
            Evidence::Capacity { model_off } => self.capacity_line(*model_off),
            Evidence::ModelOff(off) => self.model_off_line(*off),
            Evidence::Storage { fs, read, syscall_read, iowait } => {
                Self::storage_line(*fs, *read, *syscall_read, *iowait)
            }
            Evidence::SaturatedRead => {
                "the CPU is saturated: part of read's off-CPU time may be waiting for a core, not storage".into()
            }
            Evidence::Cpu { busy } => self.cpu_line(*busy),
            Evidence::Contention => self.contention_line(),
            Evidence::LoaderCompetes => self.loader_competes_line(),
            Evidence::Transfer { mb_per_batch } => format!(
                "host→device copies take {} per step{}, compute {}",
                ms(sp.transfer_ms),
                mb_per_batch.map(|mb| format!(" ({mb:.1} MB per batch)")).unwrap_or_default(),
                ms(sp.compute_ms)
            ),
            Evidence::TransferShare => format!(
                "transfer {} ≥ {} of the step and ≥ the wait share",
                pct(sp.transfer_share),
                pct(TRANSFER_SHARE)
            ),
            Evidence::Compute => format!(
                "compute takes {} per batch of {} ({} per image), {} of the step",
                ms(sp.compute_ms),
                self.s.settings.batch_size,
                ms(sp.compute_ms / self.p.batch),
                pct(sp.compute_share)
            ),
            Evidence::Dominant(part) => self.dominant_line(part),
            Evidence::LoaderSupply { balanced } => self.loader_supply_line(*balanced),
            Evidence::GpuBusy { util } => format!("GPU busy {util:.0}% on average"),
            Evidence::Overhead(why) => self.overhead_line(*why),
            Evidence::ComputePerBatch => format!(
                "compute {} per batch of {} ({} per image)",
                ms(sp.compute_ms),
                self.s.settings.batch_size,
                ms(sp.compute_ms / self.p.batch)
            ),
        }
    }

    /// Training on the CPU: the loader's CPU per image beside the step's, on the same cores
    /// (tf.data's map share of the process's CPU where TensorFlow's trace measured it).
    fn loader_competes_line(&self) -> String {
        match self.tf_map_cpu_share() {
            Some(share) => format!(
                "training on the CPU: tf.data's map and loading use {} of CPU per image, the step {}: {} of this process's CPU (it used {} an image), on the same {} cores",
                ms(self.p.loader_cpu_ms()),
                ms(self.p.compute_cpu_now_ms()),
                pct(share),
                ms(self.p.loader_cpu_ms() + self.p.compute_cpu_now_ms()),
                self.p.cores as usize
            ),
            None => format!(
                "training on the CPU: the loader uses {} of CPU per image, compute {}, on the same cores",
                ms(self.p.loader_cpu_ms()),
                ms(self.p.compute_cpu_now_ms())
            ),
        }
    }

    /// The model's estimate of today's rate off the measured one by more than
    /// [`MODEL_OFF_SHARE`]: how far, and that the predictions are ranges.
    fn model_off_line(&self, o: ModelOff) -> String {
        format!(
            "the capacity model puts today's rate at {}, {:+.0}% off the measured {:.1} images/s (steps {}–{}; more than ±{}): predicted gains are ranges, from the model's rate after the change over the measured rate to it over the model's own",
            rate(self.cap.throughput()),
            o.off * 100.0,
            o.now.rate,
            o.now.from_step,
            o.now.to_step,
            pct(MODEL_OFF_SHARE)
        )
    }

    /// Contention: how long the loader waited for a core, and who held the cores.
    fn contention_line(&self) -> String {
        let m = &self.s.machine;
        let mut who = Vec::new();
        if let Some(c) = self.other_cores {
            let names: Vec<String> = self
                .holders()
                .map(|o| {
                    let n = if o.processes > 1 { format!(" ×{}", o.processes) } else { String::new() };
                    format!("{}{n} {:.0}%", o.name, o.cpu_pct)
                })
                .collect();
            let names = if names.is_empty() { String::new() } else { format!(" ({})", names.join(", ")) };
            who.push(format!("other programs kept {c:.1} of {} cores busy{names}", self.p.cores as usize));
        }
        if let Some(s) = m.steal_mean_pct.filter(|s| *s > 0.0) {
            who.push(format!("steal {s:.0}%"));
        }
        if !self.competing_load() {
            who.push(format!(
                "this run's own threads ({} and the training loop) outnumber the free cores",
                plural(self.s.settings.workers.max(1), "worker")
            ));
        }
        let per_image = self.p.loader_core_wait_ms();
        let per_image = if per_image > 0.0 {
            format!(", the loader {} per image inside its stages", ms(per_image))
        } else {
            String::new()
        };
        format!(
            "waiting for a core (run queue): this run's threads {} of the time they were ready to run{per_image}; {}",
            pct(self.core_wait_share()),
            who.join("; ")
        )
    }

    /// What the loader could supply against what the training loop takes; `balanced`: said
    /// against [`BALANCED_HEADROOM`].
    fn loader_supply_line(&self, balanced: bool) -> String {
        let headroom = self.cap.loader() / self.cap.compute;
        let near = if balanced {
            format!(": under {BALANCED_HEADROOM}×, both sides are near their limit")
        } else {
            String::new()
        };
        if self.cap.loader().is_finite() {
            format!(
                "the loader could supply {}, {headroom:.1}× what the training loop takes ({}){near}",
                rate(self.cap.loader()),
                rate(self.cap.compute),
            )
        } else {
            // No read, decode or resize was timed (a Keras PyDataset, a Dataset with no hook
            // inside): its rate is unknown, not unlimited.
            format!(
                "the loader's own stages were not timed, so what it could supply is unknown; the training loop takes {}, and the wait above says the loader keeps up",
                rate(self.cap.compute),
            )
        }
    }

    /// The largest part of compute; for the optimizer, its cost per parameter (what a large
    /// model's optimizer step is judged by: it grows with the parameters, not the batch).
    fn dominant_line(&self, part: &crate::aggregate::ComputePart) -> String {
        let params = self.s.settings.params;
        if part.label == "optimizer" && params > 0 {
            return format!(
                "the optimizer step takes {} of compute ({} per step): {:.1} ns per parameter over {:.1} M parameters, whatever the batch size",
                pct(part.share),
                ms(part.ms),
                part.ms * 1e6 / params as f64,
                params as f64 / 1e6
            );
        }
        format!("{} takes {} of compute ({} per step), the largest part", part.label, pct(part.share), ms(part.ms))
    }

    /// Why the step's cost does not follow its work.
    fn overhead_line(&self, why: OverheadWhy) -> String {
        match why {
            OverheadWhy::TinyStep(c) => format!(
                "compute is only {} per step (< {OVERHEAD_STEP_MS} ms): fixed per-step costs dominate, not the images",
                ms(c)
            ),
            OverheadWhy::FixedCost(share) => format!(
                "the optimizer step, whose cost does not depend on the batch size, is {} of compute (≥ {})",
                pct(share),
                pct(FIXED_COST_SHARE)
            ),
            OverheadWhy::LowGpu(u) => format!(
                "the GPU is busy only {u:.0}% on average (< {GPU_LOW_UTIL_PCT}%) while the loop hardly waits for data"
            ),
            OverheadWhy::InMemoryLoader(per_image) => {
                let parts = self.serial_step().map(|st| {
                    format!(
                        ": {} fetching and collating the batch, {} of the DataLoader's own work per step",
                        ms(st.loader_per_batch_ms),
                        ms(st.loader_fixed_ms)
                    )
                });
                format!(
                    "the wait is {} per step{}; its samples cost {} each (< {} per image: already in memory, nothing to decode): more workers or a cache would not help, fewer, larger steps would",
                    ms(self.s.split.wait_ms),
                    parts.unwrap_or_default(),
                    ms(per_image),
                    ms(IN_MEMORY_IMAGE_MS)
                )
            }
        }
    }
}
