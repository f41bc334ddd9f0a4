//! The words of the verdict's types: a limiter's and a severity's labels, what each flag means,
//! a predicted gain as the report and the live view say it, and each piece of advice's action
//! and reason from its typed change and [`Why`] (the framework's own action is
//! [`super::frameworks`]'s).

use super::model::LOCAL_READ_MS;
use super::thresholds::MODEL_OFF_SHARE;
use super::why::{Fed, FedParts, GpuCase, NowRate, SerialRest, Training, Why};
use super::{Advice, Change, Flag, Limiter, Severity};
use crate::aggregate::Summary;
use crate::units::{ms_spaced as ms, pct, rate};

/// What the workers advice says in place of a rate where the reads ran cold
/// ([`COLD_READ_SHARE`](super::COLD_READ_SHARE)).
pub const COLD_NO_NUMBER: &str = "no prediction (the CPU work measured between slow reads ran cold, by a factor this run does not show): measured by `pipeprof run --check-advice`";

/// What the copy and pack advice add where the reads ran cold
/// ([`COLD_READ_SHARE`](super::COLD_READ_SHARE)): their prediction is a floor.
pub const COLD_FLOOR: &str = " (a floor: the CPU work between the slow reads was measured cold, and runs faster fed, by a factor this run does not show; `pipeprof run --check-advice` measures it)";

/// The action for `change` in pipeprof's terms, for its own loop and for what a framework has
/// no word of its own for ([`super::frameworks::in_user_terms`]).
pub fn action(change: &Change, why: &Why, s: &Summary) -> String {
    let st = &s.settings;
    match (change, why) {
        (Change::FreeCores, Why::FreeCores { holders, .. }) => {
            let named = if holders.is_empty() {
                "the programs that hold the cores".to_string()
            } else {
                holders.iter().map(|(name, cpu)| format!("{name} ({cpu:.0}% CPU)")).collect::<Vec<_>>().join(", ")
            };
            format!("stop or lower the priority of {named} (nice -n 19), or train on a quieter machine")
        }
        (Change::Workers(n), Why::WorkersOversubscribed { .. }) => format!("try loader workers {} → {n}", st.workers),
        (Change::Workers(n), _) => format!("raise loader workers {} → {n}", st.workers),
        (Change::Prefetch(depth), _) => format!("deepen the prefetch queue {} → {depth} batches", st.prefetch),
        (Change::CopyLocal, Why::CopyLocal { kind, fs_type, .. }) => {
            format!("copy the data set off the {kind} mount ({fs_type}) to a local disk")
        }
        (Change::Cache { .. }, _) => "pack the decoded, resized images into one local memory-mapped cache".into(),
        (Change::PackFolder { keras: true, .. }, _) => "pack the image folder once into one memory-mapped file and read it with pipeprof.keras.packed_dataset (the same batches, labels and class_names)".into(),
        (Change::PackFolder { .. }, _) => "pack the image folder once into one memory-mapped file and read it with PackedImageFolder (ImageFolder's classes and order; your transforms still apply)".into(),
        (Change::PackOwnLoader, _) => "decode and resize every image once into one local memory-mapped file (e.g. a numpy memmap) and have your loader read from it".into(),
        (Change::PreResize { width, height }, _) => {
            format!("pre-resize the images offline to {width}×{height} (e.g. JPEG quality 90)")
        }
        (Change::CheaperAugment, _) => "make augmentation cheaper (fewer or simpler transforms: flips cost far less than rotation/zoom/shear) or run it on the device on whole batches".into(),
        (Change::U8Batches, _) => "send batches as u8 and convert to f32 on the device".into(),
        (Change::BatchSize(nb), _) => format!("raise the batch size {} → {nb}", st.batch_size.max(1)),
        (Change::UseDevice(d), _) if d == "cpu" => "or stay on the CPU".into(),
        (Change::UseDevice(_), _) => {
            let names: Vec<&str> = s.machine.devices.iter().map(|d| d.name.as_str()).collect();
            let gpus = if names.is_empty() { "a GPU".to_string() } else { names.join(", ") };
            format!("train on the GPU ({gpus})")
        }
        // Said in a framework's terms only (PyTorch's persistent workers), or never advised.
        _ => String::new(),
    }
}

impl NowRate {
    /// A measured rate without its "≈"; the model's with it.
    fn words(self) -> String {
        match self {
            NowRate::Measured(r) => rate(r).replacen('≈', "", 1),
            NowRate::Modelled(r) => rate(r),
        }
    }
}

impl Training {
    /// "≈480 images/s", or "≈520 images/s (now ≈480 images/s: …)" where it takes more.
    fn words(self) -> String {
        match self {
            Training::Same(now) => rate(now),
            Training::Faster { then, now } => format!(
                "{} (now {}: its compute threads wait less behind the workers for the cores)",
                rate(then),
                rate(now)
            ),
        }
    }
}

impl Fed {
    /// "; CPU work counted fed, …" where the hook measured it, the floor's note where the
    /// reads ran cold unmeasured, else nothing.
    fn words(self) -> String {
        let Fed::Measured { cpu: c, parts, packed } = self else {
            return if self == Fed::Floor { COLD_FLOOR.to_string() } else { String::new() };
        };
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
            match parts {
                FedParts::LoaderLoopAndStep => ", the loop's and the step's",
                FedParts::LoaderAndLoop => " and the loop's",
                FedParts::Loader => "",
            }
        )
    }
}

/// "; training on the CPU, the workers take cores from compute (…)" with the CPU device.
fn cores_shared(compute_cpu_ms: Option<f64>) -> String {
    compute_cpu_ms.map_or_else(String::new, |c| {
        format!(
            "; training on the CPU, the workers take cores from compute ({} of compute CPU per image counted)",
            ms(c)
        )
    })
}

impl Why {
    /// Why the advice should help, with the numbers behind it: the advice's reason.
    pub fn words(&self) -> String {
        self.loader_words().or_else(|| self.data_words()).unwrap_or_else(|| self.step_words())
    }

    /// [`Why::words`] for the loader's own advice: cores, workers, prefetch.
    fn loader_words(&self) -> Option<String> {
        Some(match self {
            Why::FreeCores { core_wait_share, other_cores, steal_pct, .. } => format!(
                "this run's threads wait for a core {} of the time they are ready to run while other programs keep {other_cores:.1} cores busy{}",
                pct(*core_wait_share),
                steal_pct.map(|s| format!("; the hypervisor steals {s:.0}% (another guest: a larger or dedicated VM)")).unwrap_or_default()
            ),
            Why::WorkersColdReads { n, blocked_ms } => format!(
                "each read is blocked {} off-CPU; {n} workers overlap the waits if the storage serves parallel reads at the same latency; {COLD_NO_NUMBER}",
                ms(*blocked_ms)
            ),
            Why::WorkersOverlapReads { n, blocked_ms, then, now, compute_cpu_ms } => format!(
                "each read is blocked {} off-CPU; {n} workers overlap the waits: {} instead of {} if the storage serves parallel reads at the same latency{}",
                ms(*blocked_ms),
                rate(*then),
                now.words(),
                cores_shared(*compute_cpu_ms)
            ),
            Why::WorkersCpu { loader_cpu_ms, loop_rate, needed_cores, free_cores, then, now, compute_cpu_ms } => format!(
                "the loader needs {} of CPU per image: keeping up with the training loop ({}) needs {needed_cores:.1} cores; {free_cores:.1} cores free: {} instead of {}{}",
                ms(*loader_cpu_ms),
                rate(*loop_rate),
                rate(*then),
                now.words(),
                cores_shared(*compute_cpu_ms)
            ),
            Why::WorkersOversubscribed { n, threads, cores, best } => format!(
                "training on the CPU, the program's {threads} compute threads already hold the {cores} cores: {n} worker{} take{} their CPU from compute ({} threads on {cores} cores). Shared perfectly that would give at most ×{best:.2}, but oversubscribed cores often lose more than they share (runs measured 0.24–0.86×): no prediction, `--check-advice` measures it; fewer compute threads (torch.set_num_threads) beside the workers may do better",
                if *n == 1 { "" } else { "s" },
                if *n == 1 { "s" } else { "" },
                threads + n
            ),
            Why::Prefetch { loader, needed, p50_ms, mean_ms, p95_ms, at_most } => format!(
                "the loader keeps up on average ({} vs {} needed) but stalls: the median wait is {}, the mean {}, p95 {}; a deeper queue hides the stalls (at most {})",
                rate(*loader),
                rate(*needed),
                ms(*p50_ms),
                ms(*mean_ms),
                ms(*p95_ms),
                rate(*at_most)
            ),
            _ => return None,
        })
    }

    /// [`Why::words`] for the data's advice: where it is stored and what the loader does to it.
    fn data_words(&self) -> Option<String> {
        Some(match self {
            Why::CopyLocal { fs_type, blocked_ms, lazy_ms, then, fed, .. } => format!(
                "each read is blocked {} off-CPU on {fs_type}{}; a local disk answers in about {} or less: {}",
                ms(*blocked_ms),
                lazy_ms.map(|l| format!(" and {} more in decode, reading the rest of each file as it decodes", ms(l))).unwrap_or_default(),
                ms(LOCAL_READ_MS),
                match fed {
                    Fed::Floor => format!("at least {}{COLD_FLOOR}", rate(*then).replacen('≈', "", 1)),
                    _ => format!("{}{}", rate(*then), fed.words()),
                }
            ),
            Why::Pack { keeps_resize, gone_ms, loader, training, fed } => format!(
                "{} ({} per image) for a memory copy{}: the loader could supply {}, training takes {}{}",
                if *keeps_resize { "removes read and decode" } else { "removes read, decode and resize" },
                ms(*gone_ms),
                if *keeps_resize { "; your transforms still resize the images, stored as they are" } else { "" },
                rate(*loader),
                training.words(),
                fed.words()
            ),
            Why::PreResize { resize_ms, decode_ms } => format!(
                "resize costs {} and decode {} per image; at the input size resize nearly vanishes and decode is assumed to halve (it follows the pixel count, unknown here). PNG→JPEG alone decodes about as fast at the same size: the gain is the smaller images",
                ms(*resize_ms),
                ms(*decode_ms)
            ),
            Why::Augment { wall_ms, on_cpu_ms, loader, training } => format!(
                "augment costs {} per image ({} on-CPU) in the loader; without it the loader could supply {}, training takes {}",
                ms(*wall_ms),
                ms(*on_cpu_ms),
                rate(*loader),
                training.words()
            ),
            Why::U8Batches { transfer_ms, after_ms } => format!(
                "f32 pixels are 4× the bytes of u8: transfer {} → about {} per step if copy time follows bytes",
                ms(*transfer_ms),
                ms(*after_ms)
            ),
            _ => return None,
        })
    }

    /// [`Why::words`] for the step's advice: the batch, the device, the workers' start.
    fn step_words(&self) -> String {
        match self {
            Why::SerialBatch { fixed_ms, step_ms, optimizer_ms, per_batch_ms, rest } => format!(
                "{} of each {} step does not grow with the batch (the DataLoader's own work per step{}); fetching and collating ({}) does; {}. Scale the learning rate with the batch",
                ms(*fixed_ms),
                ms(*step_ms),
                optimizer_ms.map(|o| format!(", the optimizer step {}", ms(o))).unwrap_or_default(),
                ms(*per_batch_ms),
                match rest {
                    SerialRest::Cpu { compute_ms, factor } => format!(
                        "forward+backward ({}) grows with the batch on the CPU by up to ×{factor}: the range",
                        ms(*compute_ms)
                    ),
                    SerialRest::Gpu { compute_ms, from, to } => format!(
                        "a tiny model's kernels ({}) take about as long for {to} images as for {from} on a GPU",
                        ms(*compute_ms)
                    ),
                }
            ),
            Why::BatchLaunchBound { kernels_ms, from, to, then, now } => format!(
                "a tiny model's kernels ({} a step) take about as long for {to} images as for {from} on a GPU; the copy grows with the batch: {} instead of {}. Scale the learning rate with the batch",
                ms(*kernels_ms),
                rate(*then),
                rate(*now),
            ),
            Why::BatchFixedStep { fixed_ms, per_image_ms, then, now, on_cpu } => format!(
                "the optimizer step ({}) does not grow with the batch; forward+backward ({} per image) does: {} instead of {}{}. Scale the learning rate with the batch",
                ms(*fixed_ms),
                ms(*per_image_ms),
                rate(*then),
                rate(*now),
                if *on_cpu { "" } else { " (a lower bound on a GPU, where launch overhead does not grow either)" }
            ),
            Why::BatchUnmeasured { low_gpu_pct, compute_ms } => format!(
                "{}: more images per step spread the fixed per-step cost (no prediction: the optimizer step, the batch-independent part, was not measured)",
                match low_gpu_pct {
                    Some(u) => format!("the GPU is busy only {u:.0}%"),
                    None => format!("compute is {} per step", ms(*compute_ms)),
                }
            ),
            Why::CpuDevice { compute_ms } => format!(
                "per-step overhead dominates ({} of compute per step): kernel launches and device syncs cost the same for a tiny model, and a CPU step has none",
                ms(*compute_ms)
            ),
            Why::Gpu { case, own_loop } => gpu_words(*case, *own_loop),
            Why::PersistentWorkers { startup_wait_ms, workers, epochs } => format!(
                "the first batch waited {startup_wait_ms:.0} ms while {workers} workers started; without persistent workers each of the {epochs} epochs starts them again"
            ),
            // Said by `loader_words` and `data_words`.
            _ => String::new(),
        }
    }
}

impl Advice {
    /// "now 1322 images/s (measured over steps 2–30) → predicted 2217 images/s (×1.68)", with
    /// a range where the model is off today's rate; the bare gain for advice with no basis.
    pub fn gain_words(&self) -> Option<String> {
        let Some(b) = &self.basis else {
            return self.predicted_speedup.map(|g| format!("≈{g:.1}× images/s"));
        };
        let g = self.predicted_speedup?;
        if b.floor {
            // A floor's range (the model off today's rate) is no ceiling: its low end is the
            // promise.
            let low = b.range.map_or(g, |(lo, _)| lo);
            return Some(format!(
                "now {} (measured over steps {}–{}) → predicted at least {} (×{low:.1})",
                rate(b.now).replacen('≈', "", 1),
                b.from_step,
                b.to_step,
                rate(low * b.now).replacen('≈', "", 1)
            ));
        }
        let then = match b.range {
            Some((lo, hi)) => format!(
                "predicted {}–{} (×{lo:.1}–{hi:.1}: {})",
                rate(lo * b.now).trim_end_matches(" images/s"),
                rate(hi * b.now).trim_start_matches('≈'),
                match (b.slow_steps, b.model_now / b.now - 1.0) {
                    _ if b.compute_split_unknown => "how much of forward+backward grows with the batch",
                    (true, off) if off.abs() > MODEL_OFF_SHARE => {
                        "the model is off today's rate, and other programs slow some compute steps"
                    }
                    (true, _) => "other programs hold cores: the compute's typical step to its slow ones",
                    (false, _) => "the model is off today's rate",
                }
            ),
            None => format!("predicted {} (×{g:.1})", rate(b.predicted)),
        };
        Some(format!(
            "now {} (measured over steps {}–{}) → {then}",
            rate(b.now).replacen('≈', "", 1),
            b.from_step,
            b.to_step
        ))
    }

    /// The live view's compact form: "now 1322 → ≈2217 images/s (×1.7)", a range as
    /// "now 23.4 → 185–1200 images/s (×7.9–51.3)"; the bare gain for advice with no basis.
    pub fn gain_short(&self) -> Option<String> {
        let g = self.predicted_speedup.filter(|x| x.is_finite() && *x > 0.0)?;
        let Some(b) = &self.basis else {
            return Some(format!("≈{g:.1}× images/s"));
        };
        let bare = |x: f64| rate(x).replacen('≈', "", 1).trim_end_matches(" images/s").to_string();
        if b.floor {
            let low = b.range.map_or(g, |(lo, _)| lo);
            return Some(format!("now {} → ≥{} images/s (×≥{low:.1})", bare(b.now), bare(low * b.now)));
        }
        let then = match b.range {
            Some((lo, hi)) => format!("{}–{} images/s (×{lo:.1}–{hi:.1})", bare(lo * b.now), bare(hi * b.now)),
            None => format!("≈{} images/s (×{g:.1})", bare(b.predicted)),
        };
        Some(format!("now {} → {then}", bare(b.now)))
    }
}

impl Limiter {
    /// A short name for reports and views.
    pub fn label(&self) -> &'static str {
        match self {
            Limiter::Io => "I/O (storage)",
            Limiter::Contention => "CPU contention (other programs)",
            Limiter::Preprocess => "CPU preprocessing",
            Limiter::Transfer => "host→device transfer",
            Limiter::Compute => "compute",
            Limiter::Overhead => "per-step overhead",
            Limiter::Balanced => "balanced",
            Limiter::NotEnoughData { .. } => "not enough data",
        }
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

/// "loss is NaN from step 412 (inf at 410)": where the loss stopped being a number.
pub fn loss_words(first_nan: Option<u64>, first_inf: Option<u64>) -> String {
    match (first_nan, first_inf) {
        (Some(n), Some(i)) => format!("loss is NaN from step {n} (inf at {i})"),
        (Some(n), None) => format!("loss is NaN from step {n}"),
        (None, Some(i)) => format!("loss is inf from step {i}"),
        (None, None) => "loss is not a number".into(),
    }
}

/// "loader-0 has been reading a/zz_pipe.png for 45 s", or for a thread the run left behind
/// "… was still reading … after 19 s when the run ended".
pub fn stall_words(s: &crate::aggregate::Stall) -> String {
    let doing = match s.stage.as_str() {
        "read" => "reading".to_string(),
        "decode" => "decoding".to_string(),
        "resize" => "resizing".to_string(),
        "augment" => "augmenting".to_string(),
        other => format!("in {other} on"),
    };
    if s.abandoned {
        format!(
            "{} was still {doing} {} after {:.0} s when the run ended: left behind (a file that never answers: a FIFO, a hung network drive?)",
            s.thread, s.file, s.open_s
        )
    } else {
        format!("{} has been {doing} {} for {:.0} s", s.thread, s.file, s.open_s)
    }
}

impl Flag {
    /// One line saying what the trap is and what it means.
    pub fn describe(&self) -> String {
        match self {
            Flag::GpuUnused => "GPU present but unused: this run trains on the CPU".into(),
            Flag::NetworkStorage { fs_type } => {
                format!("data on a network/FUSE filesystem ({fs_type}): every image read may be a round trip")
            }
            Flag::CpuSaturated => "CPU saturated: more loader workers will not help".into(),
            Flag::TooFewWorkers { workers: 0, cores } => {
                format!("no loader workers: the training thread loads every batch while {cores} cores sit idle")
            }
            Flag::TooFewWorkers { workers, cores } => {
                format!("too few workers: {workers} on {cores} cores, cores idle while preprocessing limits")
            }
            Flag::TinyModel => "tiny model: the step costs about the same whatever its work".into(),
            Flag::ComputeCompetesWithLoader => {
                "training on the CPU: compute and the loader compete for the same cores".into()
            }
            Flag::Simulated { what } => format!("simulated slowdown active: {what} (not the real hardware)"),
            Flag::CoreContention { share, others, external } => {
                let who = if !external {
                    "this run's own threads outnumber the cores".to_string()
                } else if others.is_empty() {
                    "other programs or guests hold the cores".to_string()
                } else {
                    format!("other programs hold the cores: {}", others.join(", "))
                };
                format!("CPU contention: this run's threads wait for a core {:.0}% of the time they are ready to run; {who}", share * 100.0)
            }
            Flag::Diverged { first_nan, first_inf } => {
                format!("{}: training diverged — lower the learning rate; the timings stay valid", loss_words(*first_nan, *first_inf))
            }
            Flag::Stalled(s) => stall_words(s),
            Flag::ValidationHeavy { share } => format!(
                "validation passes take {:.0}% of the run's wall time: validate less often, on a smaller held-out set, or with a larger batch (no gradients to store)",
                share * 100.0
            ),
        }
    }
}

/// Why the GPU: its case, with the build it needs for pipeprof's own loop.
fn gpu_words(case: GpuCase, own_loop: bool) -> String {
    let why = match case {
        GpuCase::Tiny => "the model is tiny: per-step overhead dominates, and a GPU may be no faster".to_string(),
        GpuCase::LoaderLimits => "the loader limits now: the GPU frees the CPU cores compute takes from the loader".to_string(),
        GpuCase::Compute { share } => format!(
            "compute takes {} of each step on the CPU; the gain depends on the model and cannot be predicted from a CPU run",
            pct(share)
        ),
    };
    // pipeprof's own loop trains on a GPU only when built for it; a program's build flags are
    // its own.
    if own_loop {
        format!("{why} (needs a build with --features cuda)")
    } else {
        why
    }
}
