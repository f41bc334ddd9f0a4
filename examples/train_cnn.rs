//! Your own candle training loop, instrumented for `pipeprof attach`.
//!
//! ```sh
//! cargo run --release -- demo-data /tmp/pp-imgs
//! cargo run --release --example train_cnn -- --data /tmp/pp-imgs     # terminal 1
//! cargo run --release -- attach                                      # terminal 2
//! ```
//!
//! Everything pipeprof needs is three things: `probes::attach::init(..)` once, spans named
//! after the stages (`read`, `decode`, `resize`, `wait`, `transfer`, `compute`, …) wherever
//! your code does that work, and `session.step(..)` after each step. A thread given its role
//! (`probes::set_thread_role`, as the loader threads here) also gets a row of per-thread CPU.
//! The rest of this file is an ordinary image classifier with its own loader threads.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Conv2d, Linear, Optimizer, VarBuilder, VarMap};
use probes::attach::{init, Options};
use probes::{clock, StepRecord};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tracing::info_span;

/// An ordinary image classifier on an ImageFolder, instrumented for `pipeprof attach`.
#[derive(Debug, clap::Parser)]
#[command(name = "train_cnn")]
struct Args {
    /// ImageFolder: DIR/<class>/<image>.jpg|png.
    #[arg(long, value_name = "DIR")]
    data: PathBuf,
    /// Training steps.
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// Loader threads.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    workers: u16,
    /// Images per batch.
    #[arg(long = "batch-size", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    batch: u32,
    /// Input side in pixels (images are resized to SIZE×SIZE).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(4..=1024))]
    size: u32,
    /// Wait until this many `pipeprof attach` clients are connected before training.
    #[arg(long, default_value_t = 0)]
    wait_for_clients: usize,
}

/// (path, label) for every image, classes in sorted folder order.
fn scan(root: &PathBuf) -> Result<(Vec<(PathBuf, u32)>, usize), String> {
    let mut classes: Vec<PathBuf> = std::fs::read_dir(root)
        .map_err(|e| format!("{}: {e}", root.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    classes.sort();
    let mut files = Vec::new();
    for (label, dir) in classes.iter().enumerate() {
        for e in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?.flatten() {
            let p = e.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
            if matches!(ext.as_str(), "jpg" | "jpeg" | "png") {
                files.push((p, label as u32));
            }
        }
    }
    files.sort();
    Ok((files, classes.len()))
}

struct Model {
    conv1: Conv2d,
    fc1: Linear,
}

impl Model {
    fn new(vb: VarBuilder, size: usize, classes: usize) -> candle_core::Result<Model> {
        let conv1 = candle_nn::conv2d(3, 8, 3, Default::default(), vb.pp("conv1"))?;
        let side = (size - 2) / 2;
        let fc1 = candle_nn::linear(8 * side * side, classes, vb.pp("fc1"))?;
        Ok(Model { conv1, fc1 })
    }

    fn forward(&self, xs: &Tensor) -> candle_core::Result<Tensor> {
        let xs = self.conv1.forward(xs)?.relu()?.max_pool2d(2)?;
        self.fc1.forward(&xs.flatten_from(1)?)
    }
}

type Batch = (Vec<f32>, Vec<u32>);

fn load(path: &PathBuf, size: u32, index: u64, out: &mut Vec<f32>) -> Result<(), String> {
    let bytes = {
        let _g = info_span!("read", sample = index).entered();
        std::fs::read(path).map_err(|e| e.to_string())?
    };
    let img = {
        let _g = info_span!("decode", sample = index).entered();
        image::load_from_memory(&bytes).map_err(|e| e.to_string())?.to_rgb8()
    };
    let _g = info_span!("resize", sample = index).entered();
    let small = image::imageops::resize(&img, size, size, image::imageops::FilterType::Triangle);
    let plane = (size * size) as usize;
    let start = out.len();
    out.resize(start + 3 * plane, 0.0);
    for (i, px) in small.pixels().enumerate() {
        for c in 0..3 {
            out[start + c * plane + i] = px[c] as f32 / 255.0;
        }
    }
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = <Args as clap::Parser>::parse();
    let (files, classes) = scan(&args.data)?;
    if files.is_empty() {
        return Err(format!("no images under {}", args.data.display()).into());
    }
    let mut opts = Options::new("train_cnn");
    opts.settings = serde_json::json!({
        "model": "examples/train_cnn.rs", "data": args.data.display().to_string(), "images": files.len(),
        "workers": args.workers, "batch_size": args.batch, "device": "cpu", "input": [3, args.size, args.size],
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
    });
    let session = init(opts)?;
    // The address goes to stdout first thing, so scripts (and tests) can attach to it.
    println!("attach: {}", session.address());
    if args.wait_for_clients > 0 {
        while session.clients() < args.wait_for_clients {
            session.wait_for_client(std::time::Duration::from_millis(50));
        }
    }

    let files = Arc::new(files);
    let (rx, workers) = start_loader(&args, files.clone())?;

    train(&args, &session, &rx, files.len(), classes)?;
    drop(rx);
    for w in workers {
        let _ = w.join();
    }
    session.finish();
    Ok(())
}

type Workers = Vec<std::thread::JoinHandle<()>>;

/// Loader threads: each takes batch numbers from a shared counter and sends whole batches.
fn start_loader(
    args: &Args,
    files: Arc<Vec<(PathBuf, u32)>>,
) -> std::io::Result<(crossbeam_channel::Receiver<Batch>, Workers)> {
    let next = Arc::new(AtomicU64::new(0));
    let (tx, rx) = crossbeam_channel::bounded::<Batch>(2);
    let mut workers = Vec::new();
    for w in 0..args.workers {
        let (files, next, tx) = (files.clone(), next.clone(), tx.clone());
        let (batch, size, steps) = (args.batch as usize, args.size, args.steps);
        workers.push(std::thread::Builder::new().name(format!("loader-{w}")).spawn(move || {
            // What the thread is, for its row of per-thread CPU.
            probes::set_thread_role(probes::ThreadRole::loader(u32::from(w)));
            loop {
                let b = next.fetch_add(1, Ordering::Relaxed);
                if b >= steps {
                    return;
                }
                let mut xs = Vec::with_capacity(batch * 3 * (size * size) as usize);
                let mut ys = Vec::with_capacity(batch);
                for k in 0..batch as u64 {
                    let i = (b * batch as u64 + k) % files.len() as u64;
                    let (path, label) = &files[i as usize];
                    if load(path, size, i, &mut xs).is_ok() {
                        ys.push(*label);
                    }
                }
                if tx.send((xs, ys)).is_err() {
                    return;
                }
            }
        })?);
    }
    Ok((rx, workers))
}

/// The training loop: every stage a span, every step a record.
fn train(
    args: &Args,
    session: &probes::attach::Session,
    rx: &crossbeam_channel::Receiver<Batch>,
    images: usize,
    classes: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::Cpu;
    let vm = VarMap::new();
    let model = Model::new(VarBuilder::from_varmap(&vm, DType::F32, &dev), args.size as usize, classes)?;
    let mut opt = candle_nn::AdamW::new_lr(vm.all_vars(), 1e-3)?;
    let s = args.size as usize;
    for step in 0..args.steps {
        let queued = rx.len() as u32;
        let batch = {
            let _g = info_span!("wait", step).entered();
            rx.recv()
        };
        let Ok((xs, ys)) = batch else { break };
        let n = ys.len();
        if n == 0 {
            continue;
        }
        let (xs, ys) = {
            let _g = info_span!("transfer", step).entered();
            (Tensor::from_vec(xs, (n, 3, s, s), &dev)?, Tensor::from_vec(ys, n, &dev)?)
        };
        let (loss, correct) = {
            let _g = info_span!("compute", step).entered();
            let (logits, loss) = {
                let _g = info_span!("forward", step).entered();
                let logits = model.forward(&xs)?;
                let loss = candle_nn::loss::cross_entropy(&logits, &ys)?;
                (logits, loss)
            };
            let grads = {
                let _g = info_span!("backward", step).entered();
                loss.backward()?
            };
            {
                let _g = info_span!("optimizer", step).entered();
                opt.step(&grads)?;
            }
            let correct = logits.argmax(1)?.eq(&ys)?.to_dtype(DType::F32)?.sum_all()?.to_scalar::<f32>()?;
            (loss.to_scalar::<f32>()?, correct as u32)
        };
        session.step(StepRecord {
            no_loss: false,
            step,
            epoch: (step * args.batch as u64 / images as u64) as u32,
            images: n as u32,
            loss,
            correct,
            end_ns: clock::now_ns(),
            queued,
            validation: false,
        });
        if step % 50 == 0 {
            eprintln!("step {step}: loss {loss:.4}");
        }
    }
    Ok(())
}
