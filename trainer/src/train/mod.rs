//! The training loop: wait for a batch, transfer it, compute. Each phase is a span.

pub mod auto;
pub mod device;
pub mod gpu_events;
pub mod kernels;
pub mod layerwise;
pub mod model;
pub mod optim;
/// Shape inference is pure (no tensor), so it lives with the schema in pipeprof-core.
pub use pipeprof_core::config::shapes;
pub mod staging;
pub mod transfer;

use crate::data::{Dataset, Loader, LoaderConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use device::{batch_bytes, host_span, keep_freed_memory, pageable, phase_done, DeviceTimer, GpuSync, Upload};
use model::Cnn;
use optim::Opt;
use pipeprof_core::config::ModelConfig;
use probes::{clock, Event, LayerRecord, Probe, Stage, StepRecord, NONE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tracing::info_span;

/// Testing and simulation hooks of the loop.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    /// Panic at this step (proves the exit paths).
    pub panic_at_step: Option<u64>,
    /// Simulated extra time in transfer or compute (--slow).
    pub slow: Vec<crate::data::simulate::Slow>,
    /// `--workers auto`: the measured choice of loader workers.
    pub auto_workers: Option<auto::AutoWorkers>,
}

/// The held-out set and how to load it (shuffle off, one epoch, no augmentation).
#[derive(Debug, Clone)]
pub struct Validation {
    pub ds: Arc<Dataset>,
    pub loader: LoaderConfig,
}

/// Re-initialises every parameter from `seed` (candle's CPU generator cannot be seeded), so a
/// run is reproducible for a seed: weights ~ N(0, 2/fan_in) (Kaiming), biases ~ U(±1/√fan_in),
/// each variable from its own stream keyed by its name.
pub fn seed_weights(vm: &VarMap, seed: u64, dev: &Device) -> candle_core::Result<()> {
    use crate::data::rng::SplitMix;
    let data = vm.data().lock().map_err(|_| candle_core::Error::msg("the parameter map lock is poisoned"))?;
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    // Fan-in of a layer = its weight's elements per output unit.
    let fan_in = |prefix: &str| {
        data.get(&format!("{prefix}.weight")).map(|w| w.elem_count() / w.dims().first().copied().unwrap_or(1).max(1))
    };
    for name in names {
        let Some(var) = data.get(name) else { continue };
        let prefix = name.rsplit_once('.').map(|(p, _)| p).unwrap_or(name);
        let fan = fan_in(prefix).unwrap_or(1).max(1) as f64;
        let key = name.bytes().fold(seed ^ 0xA076_1D64_78BD_642F, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3));
        let mut rng = SplitMix::new(key);
        let n = var.elem_count();
        let values: Vec<f32> = if name.ends_with(".bias") {
            let bound = 1.0 / fan.sqrt();
            (0..n).map(|_| ((rng.unit() * 2.0 - 1.0) * bound) as f32).collect()
        } else {
            let std = (2.0 / fan).sqrt();
            (0..n)
                .map(|_| {
                    // Box–Muller.
                    let (u1, u2) = (rng.unit().max(1e-12), rng.unit());
                    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * std) as f32
                })
                .collect()
        };
        var.set(&Tensor::from_vec(values, var.shape(), dev)?)?;
    }
    Ok(())
}

/// What the loop did.
#[derive(Debug, Clone, Default)]
pub struct TrainOutcome {
    pub steps: u64,
    pub images: u64,
    pub interrupted: bool,
}

/// The model for `cfg`'s layers and `classes` outputs, its weights seeded from the run's seed,
/// and its optimizer.
fn build(cfg: &ModelConfig, classes: usize, dev: &Device) -> anyhow::Result<(Cnn, Opt)> {
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, dev);
    let model = Cnn::new(cfg, classes, vb)?;
    seed_weights(&vm, cfg.data.seed, dev)?;
    let opt = Opt::new(cfg.train.optimizer, cfg.train.learning_rate, vm.all_vars(), dev)?;
    Ok((model, opt))
}

/// Trains until the loader's plan is done or `stop` is set. Steps are reported on `probe`.
/// With `val`, a validation pass follows every epoch (and a run cut short by `--steps`).
#[allow(clippy::too_many_arguments)]
pub fn train(
    cfg: &ModelConfig,
    classes: usize,
    dev: &Device,
    loader: &mut Loader,
    val: Option<&Validation>,
    probe: &Probe,
    stop: &AtomicBool,
    hooks: &Hooks,
) -> anyhow::Result<TrainOutcome> {
    let slow = |stage| crate::data::simulate::extra_for(&hooks.slow, stage);
    let (slow_transfer, slow_compute) = (slow(Stage::Transfer), slow(Stage::Compute));
    keep_freed_memory(dev);
    let (model, mut opt) = build(cfg, classes, dev)?;
    let (c, h, w) = (cfg.input.channels, cfg.input.height, cfg.input.width);
    let mut out = TrainOutcome::default();
    let mut k = 0u64;
    let mut auto = hooks.auto_workers.clone();
    let sync = GpuSync::from_env()?;
    let mut upload = Upload::new(dev)?;
    let mut timer = DeviceTimer::new(dev, sync);
    // The loader's (blocked, busy) batch-making time at the previous step, for auto workers.
    let mut produced = loader.production();
    loop {
        let step_start = std::time::Instant::now();
        if stop.load(Ordering::Relaxed) {
            out.interrupted = true;
            break;
        }
        let queued = loader.queued() as u32;
        let batch = info_span!("wait", step = k).in_scope(|| loader.next_batch_until(stop));
        let waited = step_start.elapsed();
        let Some(mut batch) = batch else {
            out.interrupted |= stop.load(Ordering::Relaxed);
            break;
        };
        k = batch.step + 1;
        let epoch_end = k % loader.steps_per_epoch().max(1) == 0 || k == loader.total_steps();
        if batch.is_empty() {
            if let (Some(v), true) = (val, epoch_end) {
                validate(&model, v, batch.epoch, dev, probe, stop)?;
            }
            continue;
        }
        #[allow(clippy::panic)]
        if hooks.panic_at_step == Some(batch.step) {
            panic!("--panic-at-step {}: injected panic (testing hook)", batch.step);
        }
        let n = batch.len();
        let (xs, ys) = transfer(&mut batch, (c, h, w), dev, &mut upload, &mut timer, slow_transfer.as_ref())?;
        let (loss, correct) = compute_step(
            &model,
            &mut opt,
            probe,
            (&xs, &ys),
            dev,
            (sync, &mut timer),
            slow_compute.as_ref(),
            batch.step,
        )?;
        // The step's loss is back, so the device has passed its events: never a wait here.
        timer.send(probe, false)?;
        out.steps += 1;
        out.images += n as u64;
        probe.send(step_event(&batch, n, (loss, correct), queued));
        if let Some(a) = auto.as_mut() {
            let now = loader.production();
            a.observe_loader(now.0.saturating_sub(produced.0), now.1.saturating_sub(produced.1));
            produced = now;
            auto_step(a, loader, probe, waited, step_start.elapsed())?;
        }
        if let (Some(v), true) = (val, epoch_end) {
            validate(&model, v, batch.epoch, dev, probe, stop)?;
        }
    }
    timer.send(probe, true)?;
    // No more batches: the plan is done, or a worker died (then the run failed).
    loader.check()?;
    Ok(out)
}

/// The batch to the device (`transfer`): its pixels and labels as tensors, timed on the
/// device when the timer is on, else on the host after a wait for the copy; then `slow`'s
/// simulated extra time.
fn transfer(
    batch: &mut crate::data::Batch,
    (c, h, w): (usize, usize, usize),
    dev: &Device,
    upload: &mut Upload,
    timer: &mut DeviceTimer,
    slow: Option<&crate::data::simulate::Slow>,
) -> anyhow::Result<(Tensor, Tensor)> {
    let n = batch.len();
    // `bytes` over the span's duration is the achieved host→device bandwidth.
    let bytes = batch_bytes(batch.pixels.len(), batch.labels.len());
    // A step timed layer by layer is timed on the host throughout (see compute_step).
    let timed = timer.on() && !times_layers(batch.step);
    let _g = host_span(timed, || info_span!("transfer", step = batch.step, bytes));
    if timed {
        timer.begin(Stage::Transfer, batch.step, bytes)?;
    }
    let xs = upload.pixels(&mut batch.pixels, (n, c, h, w), dev)?;
    let ys = Tensor::from_vec(std::mem::take(&mut batch.labels), n, dev)?;
    if timed {
        timer.end(Stage::Transfer, batch.step)?;
    } else {
        // From pageable memory the copy may still be in flight when from_vec returns: always
        // wait here (not only with GpuSync::Phase) so transfer is the whole copy.
        dev.synchronize()?;
    }
    if let Some(s) = slow {
        s.apply();
    }
    Ok((xs, ys))
}

/// The record of the step of `batch` (its `n` images, gone to the device), sent once its loss
/// is back.
fn step_event(batch: &crate::data::Batch, n: usize, (loss, correct): (f32, f32), queued: u32) -> Event {
    Event::Step(StepRecord {
        no_loss: false,
        step: batch.step,
        epoch: batch.epoch,
        images: n as u32,
        loss,
        correct: correct as u32,
        end_ns: clock::now_ns(),
        queued,
        validation: false,
    })
}

/// Steps between two steps timed layer by layer. Cutting the graph between layers copies each
/// activation and runs one backward call per layer: 1.0–1.1× the step on the large CNN but up
/// to ≈ 1.5× on the small ones in `cargo bench --bench train`, so only some steps pay it.
pub const LAYER_EVERY: u64 = 10;

/// Whether step `step` is timed layer by layer: steps 1–3 (step 0 also pays for first-touch
/// allocations) and every [`LAYER_EVERY`]th after.
pub fn times_layers(step: u64) -> bool {
    (1..=3).contains(&step) || (step > 0 && step % LAYER_EVERY == 0)
}

/// Forward, backward and optimizer for one batch, each a span inside `compute` (or, with
/// device events, a phase of `timer`); the loss and the number of correct predictions. Some
/// steps ([`times_layers`]) run layer by layer and send each layer's forward and backward time.
#[allow(clippy::too_many_arguments)]
fn compute_step(
    model: &Cnn,
    opt: &mut Opt,
    probe: &Probe,
    (xs, ys): (&Tensor, &Tensor),
    dev: &Device,
    (sync, timer): (GpuSync, &mut DeviceTimer),
    slow: Option<&crate::data::simulate::Slow>,
    step: u64,
) -> anyhow::Result<(f32, f32)> {
    let _g = info_span!("compute", step).entered();
    // Layer by layer, each layer waits for the device (its time is device time): those steps
    // synchronise as GpuSync::Phase does, with host spans.
    let timed = timer.on() && !times_layers(step);
    let sync = if timer.on() && !timed { GpuSync::Phase } else { sync };
    if let Some(s) = slow {
        s.apply();
    }
    // Each layer's part of each pass goes to the probe as it ends (one record per layer and
    // pass: a step's handful, not a hot path).
    let layer_time = |backward: bool| {
        move |i: usize, start_ns: u64, dur_ns: u64| {
            probe.send(Event::Layer(LayerRecord { layer: model.name(i).into(), backward, step, start_ns, dur_ns }));
        }
    };
    let done = || phase_done(dev, sync);
    let (logits, loss, grads) = if times_layers(step) {
        let (logits, loss, tape) = {
            let _g = info_span!("forward", step).entered();
            let (logits, tape) = layerwise::forward(model, xs, true, done, layer_time(false))?;
            let loss = candle_nn::loss::cross_entropy(&logits, ys)?;
            phase_done(dev, sync)?;
            (logits, loss, tape)
        };
        let _g = info_span!("backward", step).entered();
        let grads = layerwise::backward(model, tape, &loss, done, layer_time(true))?;
        phase_done(dev, sync)?;
        (logits, loss, grads)
    } else {
        let (logits, loss) = {
            let _g = host_span(timed, || info_span!("forward", step));
            timer_begin(timer, timed, Stage::Forward, step)?;
            let logits = model.forward(xs, true)?;
            let loss = candle_nn::loss::cross_entropy(&logits, ys)?;
            timer_end(timer, timed, Stage::Forward, step)?;
            phase_done(dev, sync)?;
            (logits, loss)
        };
        let _g = host_span(timed, || info_span!("backward", step));
        timer_begin(timer, timed, Stage::Backward, step)?;
        let mut grads = loss.backward()?;
        model.take_grads(&mut grads)?;
        timer_end(timer, timed, Stage::Backward, step)?;
        phase_done(dev, sync)?;
        (logits, loss, grads)
    };
    {
        let _g = host_span(timed, || info_span!("optimizer", step));
        timer_begin(timer, timed, Stage::Optimizer, step)?;
        opt.step(&grads)?;
        timer_end(timer, timed, Stage::Optimizer, step)?;
        phase_done(dev, sync)?;
    }
    // Reading the values back waits for the device: the span covers the real work.
    let correct = logits.argmax(1)?.eq(ys)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
    Ok((loss.to_scalar::<f32>()?, correct))
}

fn timer_begin(timer: &mut DeviceTimer, timed: bool, stage: Stage, step: u64) -> anyhow::Result<()> {
    if timed {
        timer.begin(stage, step, NONE)?;
    }
    Ok(())
}

fn timer_end(timer: &mut DeviceTimer, timed: bool, stage: Stage, step: u64) -> anyhow::Result<()> {
    if timed {
        timer.end(stage, step)?;
    }
    Ok(())
}

/// `--workers auto`: the step's wait and length go to the controller; a change of workers is
/// applied at this step boundary and announced.
fn auto_step(
    a: &mut auto::AutoWorkers,
    loader: &mut Loader,
    probe: &Probe,
    waited: std::time::Duration,
    step: std::time::Duration,
) -> anyhow::Result<()> {
    let (workers, reason, settled) = match a.observe(waited.as_nanos() as u64, step.as_nanos() as u64) {
        auto::Decision::Keep => return Ok(()),
        auto::Decision::Set { workers, reason } => (workers, reason, false),
        auto::Decision::Settle { workers, reason } => (workers, reason, true),
    };
    if workers > 0 {
        loader.set_workers(workers)?;
        probe.send_blocking(Event::Workers { workers: workers as u32, reason: reason.into_boxed_str(), settled });
    }
    Ok(())
}

/// One pass over the validation set: forward only, never augmented. Each batch is one
/// `validate` span, from asking the loader for it to its metrics, so the spans add up to the
/// pass's wall time and stay out of the training stages.
fn validate(
    model: &Cnn,
    val: &Validation,
    epoch: u32,
    dev: &Device,
    probe: &Probe,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut loader = Loader::start(val.ds.clone(), val.loader.clone(), probe.clone())?;
    let (c, h, w) = (val.loader.channels, val.loader.height as usize, val.loader.width as usize);
    for step in 0..loader.total_steps() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let _g = info_span!("validate", step, epoch).entered();
        let Some(mut batch) = loader.next_batch_until(stop) else { break };
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let xs = pageable(&mut batch.pixels, (n, c, h, w), dev)?;
        let ys = Tensor::from_vec(std::mem::take(&mut batch.labels), n, dev)?;
        let logits = model.forward(&xs, false)?.detach();
        let loss = candle_nn::loss::cross_entropy(&logits, &ys)?.to_scalar::<f32>()?;
        let correct = logits.argmax(1)?.eq(&ys)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
        probe.send(Event::Step(StepRecord {
            no_loss: false,
            step,
            epoch,
            images: n as u32,
            loss,
            correct: correct as u32,
            end_ns: clock::now_ns(),
            queued: 0,
            validation: true,
        }));
    }
    loader.check()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_reproducible_for_a_seed() {
        let cfg = ModelConfig::parse(pipeprof_core::config::DEFAULT_MODEL, "cnn.toml").unwrap();
        let dev = Device::Cpu;
        let values = |seed| {
            let vm = VarMap::new();
            let _m = Cnn::new(&cfg, 4, VarBuilder::from_varmap(&vm, DType::F32, &dev)).unwrap();
            seed_weights(&vm, seed, &dev).unwrap();
            let data = vm.data().lock().unwrap();
            let w = data.get("conv2d_1.weight").unwrap().as_tensor().flatten_all().unwrap();
            w.to_vec1::<f32>().unwrap()
        };
        let (a, b, c) = (values(7), values(7), values(8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Kaiming: std ≈ sqrt(2 / (3·3·3)) ≈ 0.27 for the first conv.
        let std = (a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32).sqrt();
        assert!((0.2..0.35).contains(&std), "{std}");
    }
}
