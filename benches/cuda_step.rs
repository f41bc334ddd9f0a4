#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The large CNN's training step on a CUDA device (batch 32, data on the device, Adam), and
//! what timing it costs and what a batch's copy costs: the figures issue 34 asks to bring to
//! PyTorch's (its step on the same model and card: benches/peer_train.py on `cuda`).
//!
//! `cargo bench --features cuda --bench cuda_step` on the GPU machine (scripts/build-cuda.sh
//! sets up the toolkit; `PIPEPROF_BENCH_STEPS`, default 50). Without the `cuda` feature or
//! without a GPU it prints why it is skipped and exits 0.
//!
//! Printed, medians over the steps, one table:
//! - step with one synchronisation (the loss read back) — the reference;
//! - step synchronised after each phase (`PIPEPROF_GPU_SYNC=phase`; events are the default), and with
//!   device events per phase read after the step (`events`): their ratio to the reference is
//!   what timing costs (goal ≤ 1.02);
//! - forward, backward, optimizer from the events;
//! - one batch to the device: pageable f32, pinned f32, pinned u8 made f32 on the device
//!   (GB/s of the f32 batch's bytes);
//! - PyTorch's step on the same model, batch and card (benches/peer_train.py with `cuda`,
//!   synchronised after each phase), when `python3 -c "import torch"` works
//!   (`PIPEPROF_PYTHON` names another interpreter), and pipeprof's one-sync step over it
//!   (goal ≤ 1.5).

#[cfg(not(feature = "cuda"))]
fn main() {
    println!(
        "cuda_step: skipped: this build has no CUDA (on a GPU machine: cargo bench --features cuda --bench cuda_step)"
    );
}

#[cfg(feature = "cuda")]
fn main() {
    use candle_core::{DType, Device, Tensor};
    use candle_nn::{VarBuilder, VarMap};
    use pipeprof_core::config::ModelConfig;
    use pipeprof_trainer::train::gpu_events::{cuda::StreamEvents, PhaseEvents};
    use pipeprof_trainer::train::{device::pinned::Staging, model::Cnn, optim::Opt, seed_weights};
    use probes::Stage;
    use std::time::Instant;

    let dev = match Device::new_cuda(0) {
        Ok(d) => d,
        Err(e) => {
            println!("cuda_step: skipped: no GPU ({e})");
            return;
        }
    };
    let Device::Cuda(cuda) = &dev else { unreachable!() };
    let steps = std::env::var("PIPEPROF_BENCH_STEPS").ok().and_then(|v| v.parse().ok()).unwrap_or(50usize).max(1);
    let cfg = ModelConfig::parse(include_str!("../examples/cnn_large.toml"), "cnn_large.toml").unwrap();
    let (b, c, h, w) = (32, cfg.input.channels, cfg.input.height, cfg.input.width);
    let vm = VarMap::new();
    let model = Cnn::new(&cfg, 2, VarBuilder::from_varmap(&vm, DType::F32, &dev)).unwrap();
    seed_weights(&vm, 1, &dev).unwrap();
    let mut opt = Opt::new(cfg.train.optimizer, cfg.train.learning_rate, vm.all_vars(), &dev).unwrap();
    // Bytes' values, as the loader makes them.
    let pixels: Vec<f32> = (0..b * c * h * w).map(|i| ((i * 2_654_435_761) % 256) as f32 * (1.0 / 255.0)).collect();
    let xs = Tensor::from_slice(&pixels, (b, c, h, w), &dev).unwrap();
    let ys = Tensor::from_vec((0..b as u32).map(|i| i % 2).collect::<Vec<u32>>(), b, &dev).unwrap();
    let mut ring = PhaseEvents::new(StreamEvents { stream: cuda.cuda_stream() }, 64);
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // How: 0 one sync per step, 1 sync per phase, 2 events per phase.
    let mut step = |how: u8, k: u64, ring: &mut PhaseEvents<StreamEvents>| -> f64 {
        let t0 = Instant::now();
        let sync = || {
            if how == 1 {
                dev.synchronize().unwrap();
            }
        };
        let mark = |ring: &mut PhaseEvents<StreamEvents>, stage, begin: bool| {
            if how == 2 {
                if begin {
                    ring.begin(stage, k, probes::clock::now_ns(), probes::NONE).unwrap();
                } else {
                    ring.end(stage, k).unwrap();
                }
            }
        };
        mark(ring, Stage::Forward, true);
        let loss = candle_nn::loss::cross_entropy(&model.forward(&xs, true).unwrap(), &ys).unwrap();
        mark(ring, Stage::Forward, false);
        sync();
        mark(ring, Stage::Backward, true);
        let mut grads = loss.backward().unwrap();
        model.take_grads(&mut grads).unwrap();
        mark(ring, Stage::Backward, false);
        sync();
        mark(ring, Stage::Optimizer, true);
        opt.step(&grads).unwrap();
        mark(ring, Stage::Optimizer, false);
        sync();
        loss.to_scalar::<f32>().unwrap();
        t0.elapsed().as_secs_f64() * 1e3
    };
    // Warm-up: the driver compiles the kernels' PTX on first use.
    let t = Instant::now();
    step(0, 0, &mut ring);
    println!("cuda_step: first step {:.1} s (kernel compilation; CUDA_CACHE_PATH keeps it)", t.elapsed().as_secs_f64());
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut phases: [Vec<f64>; 3] = Default::default();
    for k in 0..steps as u64 {
        // Alternating, so drift hits the three alike.
        for how in 0..3u8 {
            times[how as usize].push(step(how, k, &mut ring));
        }
        for p in ring.poll().unwrap() {
            let i = [Stage::Forward, Stage::Backward, Stage::Optimizer].iter().position(|s| *s == p.stage).unwrap();
            phases[i].push(p.dur_ns as f64 / 1e6);
        }
    }
    assert_eq!(ring.flush().unwrap().len(), 0, "every phase was read after its step");
    let [one, per_phase, events] = times.map(median);
    let torch = torch_step(b, steps);
    println!("large CNN, batch {b}, {steps} steps, median ms (device: {:?})", dev.location());
    println!("  step, one sync            {one:>8.2}");
    println!("  step, sync per phase      {per_phase:>8.2}  ({:.3}× one sync)", per_phase / one);
    println!("  step, events per phase    {events:>8.2}  ({:.3}× one sync)", events / one);
    for (name, v) in ["forward", "backward", "optimizer"].iter().zip(phases) {
        println!("  {name:<25} {:>8.2}  (events)", median(v));
    }
    match torch {
        Ok(t) => println!("  PyTorch step, sync/phase  {t:>8.2}  (pipeprof one sync / PyTorch = {:.2}×)", one / t),
        Err(why) => println!("  PyTorch step: off ({why})"),
    }
    // One batch to the device, three ways.
    let mut staging = Staging::new(cuda);
    let bytes = (pixels.len() * 4) as f64;
    let mut copy = |how: u8| -> f64 {
        dev.synchronize().unwrap();
        let t0 = Instant::now();
        let xs = match how {
            0 => Tensor::from_slice(&pixels, (b, c, h, w), &dev).unwrap(),
            1 => staging.upload_f32(cuda, &pixels, (b, c, h, w)).unwrap().unwrap(),
            _ => staging.upload_u8(cuda, &pixels, (b, c, h, w)).unwrap().unwrap(),
        };
        dev.synchronize().unwrap();
        let s = t0.elapsed().as_secs_f64();
        assert_eq!(xs.dims(), &[b, c, h, w]);
        s
    };
    let mut copies: [Vec<f64>; 3] = Default::default();
    for _ in 0..steps {
        for how in 0..3u8 {
            copies[how as usize].push(copy(how));
        }
    }
    println!("one batch to the device ({:.1} MB of f32), median", bytes / 1e6);
    for (name, v) in ["pageable f32", "pinned f32", "pinned u8 → f32 on device"].iter().zip(copies) {
        let s = median(v);
        println!("  {name:<25} {:>8.3} ms  {:>6.1} GB/s", s * 1e3, bytes / s / 1e9);
    }
}

/// PyTorch's median step (ms) on the large CNN on `cuda`, from benches/peer_train.py.
#[cfg(feature = "cuda")]
fn torch_step(batch: usize, steps: usize) -> Result<f64, String> {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let py = std::env::var("PIPEPROF_PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (script, toml) = (dir.path().join("peer_train.py"), dir.path().join("cnn_large.toml"));
    std::fs::write(&script, include_str!("peer_train.py")).map_err(|e| e.to_string())?;
    std::fs::write(&toml, include_str!("../examples/cnn_large.toml")).map_err(|e| e.to_string())?;
    let mut child = Command::new(&py)
        .arg(&script)
        .arg(&toml)
        .args(["2".to_string(), batch.to_string(), "16".to_string(), "cuda".to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{py}: {e}"))?;
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("no pipes to the peer".into());
    };
    let mut stdout = BufReader::new(stdout);
    let mut line = String::new();
    let answer = (|| {
        stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err(format!("{py} peer_train.py did not start (is torch with CUDA installed?)"));
        }
        // Warm-up round, then the measured one.
        for n in [3, steps] {
            line.clear();
            writeln!(stdin, "{n}").and_then(|_| stdin.flush()).map_err(|e| e.to_string())?;
            stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        }
        let v: Vec<f64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        v.get(3).copied().ok_or_else(|| format!("the peer answered {line:?}"))
    })();
    let _ = child.kill();
    let _ = child.wait();
    answer
}
