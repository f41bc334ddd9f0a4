//! The rules: which limiter, which flags, which evidence, which advice. See the module docs of
//! [`super`] for the thresholds and why.

use super::model::{is_cpu_device, per_s, Capacity, Pipeline};
use super::*;
use crate::aggregate::StageSummary;

/// Why a run counts as per-step-overhead bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum OverheadWhy {
    /// Compute per step below [`OVERHEAD_STEP_MS`].
    TinyStep(f64),
    /// The optimizer step (batch-independent) is this share of compute.
    FixedCost(f64),
    /// The GPU in use is busy this % on average while the loop does not wait.
    LowGpu(f64),
}

/// Everything the rules read, computed once.
pub(super) struct Facts<'a> {
    pub s: &'a Summary,
    pub p: Pipeline,
    pub cap: Capacity,
    pub severity: Severity,
    pub cpu_device: bool,
    pub gpu_present: bool,
    pub gpu_unused: bool,
    /// Mean utilisation of the GPU this run uses (or the busiest one), %.
    pub gpu_util: Option<f64>,
    pub global_cpu: Option<f64>,
    pub process_cpu: Option<f64>,
    pub wait: Option<&'a StageSummary>,
    pub overhead: Option<OverheadWhy>,
}

pub(super) fn severity(wait_share: f64) -> Severity {
    if wait_share >= HIGH_WAIT_SHARE {
        Severity::High
    } else if wait_share >= MODERATE_WAIT_SHARE {
        Severity::Moderate
    } else {
        Severity::Low
    }
}

impl<'a> Facts<'a> {
    pub fn new(s: &'a Summary) -> Facts<'a> {
        let p = Pipeline::from_summary(s);
        let cap = p.capacity();
        let m = &s.machine;
        let cpu_device = is_cpu_device(&s.settings.device);
        let gpu_present = !m.devices.is_empty();
        let gpu_unused = gpu_present && (cpu_device || m.this_process_on_gpu == Some(false));
        let used: Vec<f64> = m
            .devices
            .iter()
            .filter(|d| d.this_process_on_gpu == Some(true))
            .filter_map(|d| d.util_mean_pct.map(f64::from))
            .collect();
        let all = || m.devices.iter().filter_map(|d| d.util_mean_pct.map(f64::from));
        let gpu_util = if used.is_empty() { all().reduce(f64::max) } else { used.into_iter().reduce(f64::max) };
        let mut f = Facts {
            s,
            cap,
            severity: severity(s.split.wait_share),
            cpu_device,
            gpu_present,
            gpu_unused,
            gpu_util,
            global_cpu: m.global_cpu_mean_pct.map(f64::from),
            process_cpu: m.process_cpu_mean_pct.map(f64::from),
            wait: s.stages.iter().find(|x| x.stage == "wait" && x.count > 0),
            overhead: None,
            p,
        };
        f.overhead = f.overhead_why();
        f
    }

    fn overhead_why(&self) -> Option<OverheadWhy> {
        let compute = self.s.split.compute_ms;
        if compute > 0.0 && compute < OVERHEAD_STEP_MS {
            return Some(OverheadWhy::TinyStep(compute));
        }
        if let Some(fixed) = self.p.fixed_step_ms() {
            if compute > 0.0 && fixed / compute >= FIXED_COST_SHARE {
                return Some(OverheadWhy::FixedCost(fixed / compute));
            }
        }
        let gpu_in_use = self.gpu_present && !self.cpu_device && !self.gpu_unused;
        match self.gpu_util {
            Some(u) if gpu_in_use && u < GPU_LOW_UTIL_PCT && self.severity == Severity::Low => {
                Some(OverheadWhy::LowGpu(u))
            }
            _ => None,
        }
    }

    /// The model says the loader outpaces the training loop on average.
    pub fn loader_keeps_up(&self) -> bool {
        self.cap.loader().min(self.cap.shared_cpu) >= self.cap.compute
    }

    pub fn input_bound(&self) -> bool {
        self.severity != Severity::Low
    }

    /// Share of the loader's wall time spent off-CPU inside `read`: waiting on storage.
    pub fn read_off_share(&self) -> f64 {
        let wall = self.p.loader_wall_ms();
        let off = self.p.stage("read").map_or(0.0, |r| r.off_cpu_ms());
        if wall > 0.0 {
            off / wall
        } else {
            0.0
        }
    }

    pub fn cpu_saturated(&self) -> bool {
        let global = self.global_cpu.is_some_and(|g| g >= CPU_SATURATED_PCT);
        let process = self.process_cpu.is_some_and(|p| p >= CPU_SATURATED_PCT * self.p.cores);
        global || process
    }

    pub fn remote_fs(&self) -> Option<&'a probes::fsinfo::FsInfo> {
        self.s.data_fs.as_ref().filter(|fs| fs.kind.is_remote_or_fuse())
    }

    /// Loader CPU is a visible share of the process's CPU work (CPU device only).
    pub fn loader_competes(&self) -> bool {
        let c = self.p.loader_cpu_ms();
        let total = c + self.p.compute_cpu_ms_per_image;
        self.cpu_device && total > 0.0 && c / total >= COMPETE_SHARE
    }

    pub fn limiter(&self) -> Limiter {
        let sp = &self.s.split;
        if sp.transfer_share >= TRANSFER_SHARE && sp.transfer_share >= sp.wait_share {
            return Limiter::Transfer;
        }
        if self.input_bound() {
            if self.p.loader.is_empty() {
                // The loader is not instrumented: judge from the machine only.
                let iowait = self.s.machine.iowait_mean_pct.is_some_and(|w| f64::from(w) >= IOWAIT_PCT);
                return if iowait || self.remote_fs().is_some() { Limiter::Io } else { Limiter::Preprocess };
            }
            return if self.read_off_share() >= IO_OFF_CPU_SHARE { Limiter::Io } else { Limiter::Preprocess };
        }
        if self.overhead.is_some() {
            return Limiter::Overhead;
        }
        if self.cap.loader() / self.cap.compute < BALANCED_HEADROOM {
            return Limiter::Balanced;
        }
        Limiter::Compute
    }

    pub fn flags(&self, limiter: &Limiter) -> Vec<Flag> {
        let mut flags: Vec<Flag> =
            self.s.settings.simulated.iter().map(|w| Flag::Simulated { what: w.clone() }).collect();
        if self.gpu_unused {
            flags.push(Flag::GpuUnused);
        }
        if let Some(fs) = self.remote_fs() {
            flags.push(Flag::NetworkStorage { fs_type: fs.fs_type.clone() });
        }
        if matches!(limiter, Limiter::NotEnoughData { .. }) {
            return flags;
        }
        if self.cpu_saturated() {
            flags.push(Flag::CpuSaturated);
        }
        let (workers, cores) = (self.s.settings.workers.max(1), self.p.cores as usize);
        let idle = self.global_cpu.is_none_or(|g| g < CPU_IDLE_PCT);
        if *limiter == Limiter::Preprocess && workers < cores && idle {
            flags.push(Flag::TooFewWorkers { workers, cores });
        }
        if self.loader_competes() {
            flags.push(Flag::ComputeCompetesWithLoader);
        }
        if self.overhead.is_some() {
            flags.push(Flag::TinyModel);
        }
        if let Some(share) = self.s.validation_share().filter(|v| *v >= super::VALIDATION_SHARE) {
            flags.push(Flag::ValidationHeavy { share });
        }
        flags
    }
}

// ---- words and numbers ----

pub(super) fn ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.2} s", v / 1000.0)
    } else if v >= 10.0 {
        format!("{v:.1} ms")
    } else if v >= 0.01 {
        format!("{v:.2} ms")
    } else {
        format!("{:.1} µs", v * 1000.0)
    }
}

pub(super) fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

pub(super) fn rate(v: f64) -> String {
    if !v.is_finite() {
        "unlimited".into()
    } else if v >= 10_000.0 {
        format!("≈{:.0}k images/s", v / 1000.0)
    } else if v >= 100.0 {
        format!("≈{v:.0} images/s")
    } else {
        format!("≈{v:.1} images/s")
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

impl Severity {
    /// HIGH / moderate / low.
    pub fn label(&self) -> &'static str {
        match self {
            Severity::High => "HIGH",
            Severity::Moderate => "moderate",
            Severity::Low => "low",
        }
    }
}

impl Facts<'_> {
    fn wait_line(&self) -> String {
        let w = self.s.split.wait_share;
        let rule = match self.severity {
            Severity::High => "HIGH: ≥ 20% per TensorFlow's rule",
            Severity::Moderate => "moderate: ≥ 5% and < 20% per TensorFlow's rule",
            Severity::Low => "low: < 5% per TensorFlow's rule",
        };
        format!(
            "the training loop waited for data {:.1}% of each step ({} of {}) ({rule})",
            w * 100.0,
            ms(self.s.split.wait_ms),
            ms(self.s.split.mean_step_ms)
        )
    }

    fn capacity_line(&self) -> String {
        let w = self.s.settings.workers.max(1);
        let shared = if self.cpu_device {
            format!("; sharing {:.1} cores, both together {}", self.p.free_cores, rate(self.cap.shared_cpu))
        } else {
            String::new()
        };
        format!(
            "model: {} {} {}, the training loop could take {}{shared}; measured {:.1} images/s",
            plural(w, "loader worker"),
            if w == 1 { "supplies" } else { "supply" },
            rate(self.cap.loader()),
            rate(self.cap.compute),
            self.s.images_per_s
        )
    }

    fn cpu_line(&self) -> Option<String> {
        let g = self.global_cpu?;
        let proc = self.process_cpu.map(|p| format!(" (this process {p:.0}%, 100% = one core)")).unwrap_or_default();
        Some(format!(
            "CPU {g:.0}% busy on {} cores{proc}: {:.1} cores free for this run",
            self.p.cores as usize, self.p.free_cores
        ))
    }

    fn storage_line(&self) -> Option<String> {
        let m = &self.s.machine;
        let mut parts = Vec::new();
        if let Some(fs) = &self.s.data_fs {
            parts.push(format!("data on {} ({})", fs.fs_type, fs.kind));
        }
        if let Some(r) = m.read_bytes_per_s_mean {
            parts.push(format!("{:.1} MB/s from storage", r / 1e6));
        }
        if let Some(w) = m.iowait_mean_pct {
            parts.push(format!("iowait {w:.0}%"));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    fn loader_split_line(&self, limiter: &Limiter) -> String {
        let wall = self.p.loader_wall_ms();
        let assumed = if self.p.loader.iter().any(|x| !x.measured) { " (on-CPU share assumed from names)" } else { "" };
        if *limiter == Limiter::Io {
            let (r_wall, r_off) = self.p.stage("read").map_or((0.0, 0.0), |r| (r.wall_ms, r.off_cpu_ms()));
            let off_share = if r_wall > 0.0 { r_off / r_wall } else { 0.0 };
            format!(
                "read is {} off-CPU: {} per image waiting on storage, {} of the loader's {} per image{assumed}",
                pct(off_share),
                ms(r_off),
                pct(self.read_off_share()),
                ms(wall)
            )
        } else {
            let parts: Vec<String> = self
                .p
                .loader
                .iter()
                .filter(|x| x.stage != "read" && x.wall_ms > 0.0)
                .map(|x| {
                    let on = if x.wall_ms > 0.0 { x.on_cpu_ms / x.wall_ms } else { 0.0 };
                    format!("{} {} ({} on-CPU)", x.stage, ms(x.wall_ms), pct(on))
                })
                .collect();
            let contention: f64 =
                self.p.loader.iter().filter(|x| x.stage != "read").map(|x| x.off_cpu_ms()).sum::<f64>();
            let waiting = if contention >= 0.2 * wall && wall > 0.0 {
                format!("; {} of it waiting for a core", ms(contention))
            } else {
                String::new()
            };
            format!(
                "the loader spends {} of CPU per image of {} wall: {}{waiting}; read is only {} off-CPU{assumed}",
                ms(self.p.loader_cpu_ms()),
                ms(wall),
                parts.join(", "),
                pct(self.read_off_share())
            )
        }
    }

    pub fn headline(&self, limiter: &Limiter) -> String {
        let sp = &self.s.split;
        let sev = self.severity.label();
        let waited = format!("{:.1}%", sp.wait_share * 100.0);
        match limiter {
            Limiter::Io | Limiter::Preprocess if self.loader_keeps_up() => format!(
                "Input-bound ({sev}): the loop waited for data {waited} of each step although the loader keeps up on average ({} vs {}): it stalls, mostly in {}",
                rate(self.cap.loader()),
                rate(self.cap.compute),
                if *limiter == Limiter::Io { "storage reads" } else { "CPU preprocessing" }
            ),
            Limiter::Io => format!(
                "Input-bound ({sev}): the loader waits on storage reads; the training loop waited for data {waited} of each step"
            ),
            Limiter::Preprocess => format!(
                "Input-bound ({sev}): CPU preprocessing in the loader (decode/resize) limits training; the loop waited for data {waited} of each step"
            ),
            Limiter::Transfer => format!(
                "Transfer-bound: host→device copies take {} of each step",
                pct(sp.transfer_share)
            ),
            Limiter::Compute => format!(
                "Compute-bound: the model's computation takes {} of each step; the input pipeline keeps up",
                pct(sp.compute_share)
            ),
            Limiter::Overhead => match self.overhead {
                Some(OverheadWhy::LowGpu(u)) => format!(
                    "Per-step overhead: the GPU is busy only {u:.0}% while the loop does not wait for data; the model gives it too little work per step"
                ),
                Some(OverheadWhy::FixedCost(share)) => format!(
                    "Per-step overhead: the optimizer step, whatever the batch size, is {} of compute",
                    pct(share)
                ),
                _ => format!(
                    "Per-step overhead: {} of compute per step for a tiny model; fixed per-step costs dominate",
                    ms(sp.compute_ms)
                ),
            },
            Limiter::Balanced => format!(
                "Balanced: the loader and the training loop run at nearly the same pace (wait {waited} of each step)"
            ),
            Limiter::NotEnoughData { steps_needed } => not_enough_headline(*steps_needed),
        }
    }

    pub fn evidence(&self, limiter: &Limiter) -> Vec<String> {
        let sp = &self.s.split;
        let mut ev = vec![self.wait_line()];
        match limiter {
            Limiter::Io | Limiter::Preprocess => {
                if self.p.loader.is_empty() {
                    let iow =
                        self.s.machine.iowait_mean_pct.map(|w| format!("iowait {w:.0}%")).unwrap_or("no iowait".into());
                    ev.push(format!(
                        "the loader has no read/decode/resize spans: I/O vs CPU judged from {iow} and the data's filesystem"
                    ));
                } else {
                    ev.push(self.loader_split_line(limiter));
                    ev.push(self.capacity_line());
                }
                if *limiter == Limiter::Io {
                    ev.extend(self.storage_line());
                    if self.cpu_saturated() {
                        ev.push(
                            "the CPU is saturated: part of read's off-CPU time may be waiting for a core, not storage"
                                .into(),
                        );
                    }
                } else {
                    ev.extend(self.cpu_line());
                }
            }
            Limiter::Transfer => {
                let bytes = self
                    .s
                    .stages
                    .iter()
                    .find(|x| x.stage == "transfer" && x.count > 0)
                    .filter(|x| x.bytes > 0)
                    .map(|x| format!(" ({:.1} MB per batch)", x.bytes as f64 / x.count as f64 / 1e6))
                    .unwrap_or_default();
                ev.push(format!(
                    "host→device copies take {} per step{bytes}, compute {}",
                    ms(sp.transfer_ms),
                    ms(sp.compute_ms)
                ));
                ev.push(format!("transfer {} ≥ 20% of the step and ≥ the wait share", pct(sp.transfer_share)));
            }
            Limiter::Compute | Limiter::Balanced => {
                ev.push(format!(
                    "compute takes {} per batch of {} ({} per image), {} of the step",
                    ms(sp.compute_ms),
                    self.s.settings.batch_size,
                    ms(sp.compute_ms / self.p.batch),
                    pct(sp.compute_share)
                ));
                let headroom = self.cap.loader() / self.cap.compute;
                ev.push(format!(
                    "the loader could supply {}, {:.1}× what the training loop takes ({}){}",
                    rate(self.cap.loader()),
                    headroom,
                    rate(self.cap.compute),
                    if *limiter == Limiter::Balanced { ": under 1.2×, both sides are near their limit" } else { "" }
                ));
                if let Some(u) = self.gpu_util.filter(|_| !self.gpu_unused) {
                    ev.push(format!("GPU busy {u:.0}% on average"));
                }
                ev.extend(self.cpu_line());
            }
            Limiter::Overhead => {
                ev.push(match self.overhead {
                    Some(OverheadWhy::TinyStep(c)) => format!(
                        "compute is only {} per step (< {OVERHEAD_STEP_MS} ms): fixed per-step costs dominate, not the images",
                        ms(c)
                    ),
                    Some(OverheadWhy::FixedCost(share)) => format!(
                        "the optimizer step, whose cost does not depend on the batch size, is {} of compute (≥ 50%)",
                        pct(share)
                    ),
                    Some(OverheadWhy::LowGpu(u)) => format!(
                        "the GPU is busy only {u:.0}% on average (< {GPU_LOW_UTIL_PCT}%) while the loop hardly waits for data"
                    ),
                    None => String::new(),
                });
                ev.push(format!(
                    "compute {} per batch of {} ({} per image)",
                    ms(sp.compute_ms),
                    self.s.settings.batch_size,
                    ms(sp.compute_ms / self.p.batch)
                ));
                ev.extend(self.cpu_line());
            }
            Limiter::NotEnoughData { .. } => {}
        }
        if self.loader_competes() && ev.len() < 5 {
            ev.push(format!(
                "training on the CPU: the loader uses {} of CPU per image, compute {}, on the same cores",
                ms(self.p.loader_cpu_ms()),
                ms(self.p.compute_cpu_ms_per_image)
            ));
        }
        ev.retain(|l| !l.is_empty());
        ev.truncate(5);
        ev
    }

    pub fn advice(&self, limiter: &Limiter, flags: &[Flag]) -> Vec<Advice> {
        let mut out = Vec::new();
        let input = matches!(limiter, Limiter::Io | Limiter::Preprocess);
        if input {
            out.extend(self.workers_advice(limiter));
            out.extend(self.prefetch_advice());
            if flags.iter().any(|f| matches!(f, Flag::NetworkStorage { .. })) {
                out.extend(self.local_advice());
            }
            out.extend(self.cache_advice());
            out.extend(self.pre_resize_advice());
            out.extend(self.augment_advice());
        }
        if *limiter == Limiter::Transfer {
            out.extend(self.u8_advice());
        }
        if *limiter == Limiter::Overhead {
            out.extend(self.batch_advice());
        }
        if self.gpu_unused {
            out.push(self.gpu_advice(limiter));
        }
        // Predicted gains first, largest first; advice without a number keeps its place after.
        out.sort_by(|a, b| match (a.predicted_speedup, b.predicted_speedup) {
            (Some(x), Some(y)) => y.total_cmp(&x),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        });
        out
    }

    fn gain(&self, after: &Pipeline) -> Option<f64> {
        self.p.speedup(after).filter(|g| *g >= MIN_GAIN)
    }

    fn workers_advice(&self, limiter: &Limiter) -> Option<Advice> {
        if self.p.loader.is_empty() {
            return None;
        }
        let w = self.s.settings.workers.max(1);
        let cores = self.p.cores as usize;
        // Threads waiting on storage need no core: for I/O, up to 4 per core.
        let max_n = if *limiter == Limiter::Io { cores * 4 } else { cores };
        let now = self.cap.throughput();
        let candidates: Vec<(usize, f64)> =
            (w + 1..=max_n).map(|n| (n, self.p.with_workers(n).capacity().throughput())).collect();
        let best = candidates.iter().map(|(_, x)| *x).fold(0.0, f64::max);
        let (n, x) = candidates.into_iter().find(|(_, x)| *x >= 0.97 * best)?;
        let gain = self.gain(&self.p.with_workers(n))?;
        let c = self.p.loader_cpu_ms();
        let share = if self.cpu_device {
            format!(
                "; training on the CPU, the workers take cores from compute ({} of compute CPU per image counted)",
                ms(self.p.compute_cpu_ms_per_image)
            )
        } else {
            String::new()
        };
        let reason = if *limiter == Limiter::Io {
            let off = self.p.stage("read").map_or(0.0, |r| r.off_cpu_ms());
            format!(
                "each read waits {} off-CPU; {n} workers overlap the waits: {} instead of {} if the storage serves parallel reads at the same latency{share}",
                ms(off),
                rate(x),
                rate(now)
            )
        } else {
            let needed = c * self.cap.compute / 1000.0;
            format!(
                "the loader needs {} of CPU per image: keeping up with the training loop ({}) needs {needed:.1} cores; {:.1} cores free: {} instead of {}{share}",
                ms(c),
                rate(self.cap.compute),
                self.p.free_cores,
                rate(x),
                rate(now)
            )
        };
        Some(Advice {
            action: format!("raise loader workers {w} → {n}"),
            command: Some(format!("--workers {n}")),
            predicted_speedup: Some(gain),
            reason,
        })
    }

    fn prefetch_advice(&self) -> Option<Advice> {
        let w = self.wait?;
        let spiky = w.p50_ms <= 0.25 * w.mean_ms || w.p95_ms >= 3.0 * w.mean_ms;
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
        let spike = w.p95_ms.max(w.max_ms.min(4.0 * w.p95_ms.max(w.mean_ms)));
        let depth = (self.s.settings.prefetch + (spike / busy_ms).ceil() as usize).clamp(2, 64);
        Some(Advice {
            action: format!("deepen the prefetch queue {} → {depth} batches", self.s.settings.prefetch),
            command: Some(format!("--prefetch {depth}")),
            predicted_speedup: Some(gain),
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
        let r = self.p.stage("read")?;
        let after = self.p.local_storage();
        let gain = self.gain(&after);
        Some(Advice {
            action: format!("copy the data set off the {} mount ({}) to a local disk", fs.kind, fs.fs_type),
            command: None,
            predicted_speedup: gain,
            reason: format!(
                "each read waits {} off-CPU on {}; a local disk answers in about {} or less: {}",
                ms(r.off_cpu_ms()),
                fs.fs_type,
                ms(super::model::LOCAL_READ_MS),
                rate(after.capacity().throughput())
            ),
        })
    }

    fn cache_advice(&self) -> Option<Advice> {
        let after = self.p.cached();
        let gain = self.gain(&after)?;
        let gone: f64 =
            self.p.loader.iter().filter(|x| matches!(x.stage, "read" | "decode" | "resize")).map(|x| x.wall_ms).sum();
        let model = model_path(&self.s.settings.model);
        Some(Advice {
            action: "pack the decoded, resized images into one local memory-mapped cache".into(),
            command: Some(format!("pipeprof cache --model {model} --data {} --out data.ppk", self.s.settings.data)),
            predicted_speedup: Some(gain),
            reason: format!(
                "removes read, decode and resize ({} per image) for a memory copy: the loader could supply {}, training takes {}",
                ms(gone),
                rate(after.capacity().loader()),
                rate(self.cap.compute)
            ),
        })
    }

    fn pre_resize_advice(&self) -> Option<Advice> {
        let resize = self.p.stage("resize")?;
        let after = self.p.pre_resized();
        let gain = self.gain(&after)?;
        let decode = self.p.stage("decode").map_or(0.0, |d| d.wall_ms);
        let [_, h, w] = self.s.settings.input;
        Some(Advice {
            action: format!("pre-resize the images offline to {w}×{h} (e.g. JPEG quality 90)"),
            command: None,
            predicted_speedup: Some(gain),
            reason: format!(
                "resize costs {} and decode {} per image; at the input size resize nearly vanishes and decode is assumed to halve (it follows the pixel count, unknown here). PNG→JPEG alone decodes about as fast at the same size: the gain is the smaller images",
                ms(resize.wall_ms),
                ms(decode)
            ),
        })
    }

    fn augment_advice(&self) -> Option<Advice> {
        let aug = self.p.stage("augment")?;
        let after = self.p.without_augment();
        let gain = self.gain(&after)?;
        Some(Advice {
            action: "make augmentation cheaper (fewer or simpler transforms: flips cost far less than rotation/zoom/shear) or run it on the device on whole batches".into(),
            command: None,
            predicted_speedup: Some(gain),
            reason: format!(
                "augment costs {} per image ({} on-CPU) in the loader; without it the loader could supply {}, training takes {}",
                ms(aug.wall_ms),
                ms(aug.on_cpu_ms),
                rate(after.capacity().loader()),
                rate(self.cap.compute)
            ),
        })
    }

    fn u8_advice(&self) -> Option<Advice> {
        let after = self.p.u8_transfer();
        let gain = self.gain(&after)?;
        Some(Advice {
            action: "send batches as u8 and convert to f32 on the device".into(),
            command: None,
            predicted_speedup: Some(gain),
            reason: format!(
                "f32 pixels are 4× the bytes of u8: transfer {} → about {} per step if copy time follows bytes",
                ms(self.p.transfer_ms),
                ms(after.transfer_ms)
            ),
        })
    }

    fn batch_advice(&self) -> Option<Advice> {
        let b = self.s.settings.batch_size.max(1);
        let nb = b * 4;
        let after = self.p.with_batch(nb);
        let gain = after.as_ref().and_then(|a| self.gain(a));
        let reason = match (&after, self.p.fixed_step_ms()) {
            (Some(a), Some(fixed)) => format!(
                "the optimizer step ({}) does not grow with the batch; forward+backward ({} per image) does: {} instead of {} (a lower bound on a GPU, where launch overhead does not grow either). Scale the learning rate with the batch",
                ms(fixed),
                ms((self.p.compute_ms - fixed) / self.p.batch),
                rate(a.capacity().throughput()),
                rate(self.cap.throughput())
            ),
            _ => format!(
                "{}: more images per step spread the fixed per-step cost (no prediction: the optimizer step, the batch-independent part, was not measured)",
                match self.overhead {
                    Some(OverheadWhy::LowGpu(u)) => format!("the GPU is busy only {u:.0}%"),
                    _ => format!("compute is {} per step", ms(self.p.compute_ms)),
                }
            ),
        };
        if after.is_some() && gain.is_none() {
            return None;
        }
        Some(Advice {
            action: format!("raise the batch size {b} → {nb}"),
            command: Some(format!("--batch-size {nb}")),
            predicted_speedup: gain,
            reason,
        })
    }

    fn gpu_advice(&self, limiter: &Limiter) -> Advice {
        let names: Vec<&str> = self.s.machine.devices.iter().map(|d| d.name.as_str()).collect();
        let gpus = if names.is_empty() { "a GPU".to_string() } else { names.join(", ") };
        if !self.cpu_device {
            return Advice {
                action: "check that training really runs on the GPU".into(),
                command: None,
                predicted_speedup: None,
                reason: format!(
                    "device is {} but NVML never saw this process on {gpus} (containers may hide processes from NVML)",
                    self.s.settings.device
                ),
            };
        }
        let why = match limiter {
            Limiter::Overhead => "the model is tiny: per-step overhead dominates, and a GPU may be no faster".to_string(),
            Limiter::Io | Limiter::Preprocess => {
                "the loader limits now: the GPU frees the CPU cores compute takes from the loader".to_string()
            }
            _ => format!(
                "compute takes {} of each step on the CPU; the gain depends on the model and cannot be predicted from a CPU run",
                pct(self.s.split.compute_share)
            ),
        };
        Advice {
            action: format!("train on the GPU ({gpus})"),
            command: Some("--device cuda".into()),
            predicted_speedup: None,
            reason: format!("{why} (needs a build with --features cuda)"),
        }
    }
}

/// The model file for `pipeprof cache`: settings carry a display name like
/// `built-in examples/cnn.toml`; the last word is the path.
fn model_path(model: &str) -> &str {
    model.split_whitespace().last().unwrap_or("cnn.toml")
}

pub(super) fn not_enough_headline(steps_needed: u64) -> String {
    if steps_needed > 0 {
        format!("collecting… {steps_needed} more steps needed for a verdict")
    } else {
        "no wait/transfer/compute spans yet: is the training loop instrumented?".into()
    }
}
