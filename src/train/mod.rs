//! The training loop: wait for a batch, transfer it, compute. Each phase is a span.

pub mod auto;
pub mod model;
pub mod shapes;

use crate::config::{ModelConfig, OptimizerKind};
use crate::data::{Dataset, Loader, LoaderConfig};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap, SGD};
use model::Cnn;
use probes::{clock, Event, Probe, StepRecord};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tracing::info_span;

/// `--device cpu | cuda | cuda:N`.
pub fn parse_device(s: &str) -> anyhow::Result<Device> {
    let s = s.trim();
    if s == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match s.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| anyhow::anyhow!("bad --device {s:?}: use cpu, cuda or cuda:N"))?,
        None => anyhow::bail!("bad --device {s:?}: use cpu, cuda or cuda:N"),
    };
    cuda_device(ordinal)
}

#[cfg(feature = "cuda")]
fn cuda_device(ordinal: usize) -> anyhow::Result<Device> {
    Device::new_cuda(ordinal).map_err(|e| anyhow::anyhow!("cannot open cuda:{ordinal}: {e}"))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(ordinal: usize) -> anyhow::Result<Device> {
    anyhow::bail!(
        "--device cuda:{ordinal}: this pipeprof was built without CUDA support; \
         rebuild with `cargo build --release --features cuda` on a machine with the CUDA toolkit"
    )
}

enum Opt {
    AdamW(AdamW),
    Sgd(SGD),
}

impl Opt {
    fn new(kind: OptimizerKind, lr: f64, vm: &VarMap) -> candle_core::Result<Opt> {
        let vars = vm.all_vars();
        Ok(match kind {
            OptimizerKind::Adam => {
                Opt::AdamW(AdamW::new(vars, ParamsAdamW { lr, weight_decay: 0.0, ..Default::default() })?)
            }
            OptimizerKind::Adamw => Opt::AdamW(AdamW::new(vars, ParamsAdamW { lr, ..Default::default() })?),
            OptimizerKind::Sgd => Opt::Sgd(SGD::new(vars, lr)?),
        })
    }
    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> candle_core::Result<()> {
        match self {
            Opt::AdamW(o) => o.step(grads),
            Opt::Sgd(o) => o.step(grads),
        }
    }
}

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
    use crate::data::simulate::extra_for;
    let slow_transfer = extra_for(&hooks.slow, probes::Stage::Transfer);
    let slow_compute = extra_for(&hooks.slow, probes::Stage::Compute);
    let vm = VarMap::new();
    let vb = VarBuilder::from_varmap(&vm, DType::F32, dev);
    let model = Cnn::new(cfg, classes, vb)?;
    seed_weights(&vm, cfg.data.seed, dev)?;
    let mut opt = Opt::new(cfg.train.optimizer, cfg.train.learning_rate, &vm)?;
    let (c, h, w) = (cfg.input.channels, cfg.input.height, cfg.input.width);
    let mut out = TrainOutcome::default();
    let mut k = 0u64;
    let mut auto = hooks.auto_workers.clone();
    // The loader's (blocked, busy) batch-making time at the previous step, for auto workers.
    let mut produced = loader.production();
    loop {
        let step_start = std::time::Instant::now();
        if stop.load(Ordering::Relaxed) {
            out.interrupted = true;
            break;
        }
        let queued = loader.queued() as u32;
        let batch = {
            let _g = info_span!("wait", step = k).entered();
            loader.next_batch()
        };
        let waited = step_start.elapsed();
        let Some(batch) = batch else { break };
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
        let (xs, ys) = {
            let _g = info_span!("transfer", step = batch.step, bytes = (batch.pixels.len() * 4) as u64).entered();
            let xs = Tensor::from_vec(batch.pixels, (n, c, h, w), dev)?;
            let ys = Tensor::from_vec(batch.labels, n, dev)?;
            dev.synchronize()?;
            if let Some(s) = &slow_transfer {
                s.apply();
            }
            (xs, ys)
        };
        let (loss, correct) = {
            let _g = info_span!("compute", step = batch.step).entered();
            if let Some(s) = &slow_compute {
                s.apply();
            }
            let (logits, loss) = {
                let _g = info_span!("forward", step = batch.step).entered();
                let logits = model.forward(&xs, true)?;
                let loss = candle_nn::loss::cross_entropy(&logits, &ys)?;
                (logits, loss)
            };
            let grads = {
                let _g = info_span!("backward", step = batch.step).entered();
                loss.backward()?
            };
            {
                let _g = info_span!("optimizer", step = batch.step).entered();
                opt.step(&grads)?;
            }
            // Reading the values back waits for the device: the span covers the real work.
            let correct = logits.argmax(1)?.eq(&ys)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
            (loss.to_scalar::<f32>()?, correct)
        };
        out.steps += 1;
        out.images += n as u64;
        probe.send(Event::Step(StepRecord {
            step: batch.step,
            epoch: batch.epoch,
            images: n as u32,
            loss,
            correct: correct as u32,
            end_ns: clock::now_ns(),
            queued,
            validation: false,
        }));
        if let Some(a) = auto.as_mut() {
            let now = loader.production();
            a.observe_loader(now.0.saturating_sub(produced.0), now.1.saturating_sub(produced.1));
            produced = now;
            let (workers, reason, settled) =
                match a.observe(waited.as_nanos() as u64, step_start.elapsed().as_nanos() as u64) {
                    auto::Decision::Keep => (0, String::new(), false),
                    auto::Decision::Set { workers, reason } => (workers, reason, false),
                    auto::Decision::Settle { workers, reason } => (workers, reason, true),
                };
            if workers > 0 {
                loader.set_workers(workers)?;
                probe.send_blocking(Event::Workers {
                    workers: workers as u32,
                    reason: reason.into_boxed_str(),
                    settled,
                });
            }
        }
        if let (Some(v), true) = (val, epoch_end) {
            validate(&model, v, batch.epoch, dev, probe, stop)?;
        }
    }
    Ok(out)
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
        let Some(batch) = loader.next_batch() else { break };
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let xs = Tensor::from_vec(batch.pixels, (n, c, h, w), dev)?;
        let ys = Tensor::from_vec(batch.labels, n, dev)?;
        let logits = model.forward(&xs, false)?.detach();
        let loss = candle_nn::loss::cross_entropy(&logits, &ys)?.to_scalar::<f32>()?;
        let correct = logits.argmax(1)?.eq(&ys)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
        probe.send(Event::Step(StepRecord {
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_reproducible_for_a_seed() {
        let cfg = ModelConfig::parse(crate::config::DEFAULT_MODEL, "cnn.toml").unwrap();
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

    #[test]
    fn device_names_parse_and_cuda_needs_the_feature() {
        assert!(matches!(parse_device("cpu"), Ok(Device::Cpu)));
        assert!(parse_device("gpu").unwrap_err().to_string().contains("cpu, cuda or cuda:N"));
        assert!(parse_device("cuda:x").is_err());
        if !cfg!(feature = "cuda") {
            let e = parse_device("cuda:1").unwrap_err().to_string();
            assert!(e.contains("without CUDA") && e.contains("--features cuda"), "{e}");
        }
    }
}
