#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Training step time per phase (forward + loss, backward, optimizer) on the CPU for the three
//! example models, against PyTorch CPU on the same model (benches/peer_train.py), in
//! alternating rounds with the ratio; and against itself before issue 22 (whole-graph
//! backward, candle's optimizer) and with the whole-graph backward (what timing each layer
//! costs).
//!
//! Columns: "pipeprof" is a step as `pipeprof profile` runs most steps (whole graph,
//! pipeprof's CPU kernels, fused optimizer); "per-layer" a step timed layer by layer (steps
//! 1–3 and every 10th); "before" as before issue 22 (candle's conv2d, dense, max-pool and
//! Adam; the allocator setting stays, see `PIPEPROF_BENCH_MALLOC`).
//!
//! `cargo bench --bench train [-- large|cnn|mlp ...]`. Threads: `PIPEPROF_BENCH_THREADS`
//! (default 2) for both rayon (`RAYON_NUM_THREADS`) and torch (`OMP_NUM_THREADS`,
//! `torch.set_num_threads`); the large CNN's batch: `PIPEPROF_BENCH_BATCH` (default 8);
//! rounds: `PIPEPROF_BENCH_ROUNDS` (default 3); `PIPEPROF_BENCH_MALLOC=default` skips
//! [`pipeprof_trainer::train::device::keep_freed_memory`]. The peer runs when `python3 -c "import torch"`
//! works; `PIPEPROF_PYTHON` names another interpreter.
//!
//! Each round runs pipeprof's three variants one step each in turn, then the peer's steps;
//! the table shows the median over rounds of each round's median, and each ratio is the median
//! over rounds of the ratio within a round.

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use pipeprof_core::config::ModelConfig;
use pipeprof_trainer::train::layerwise;
use pipeprof_trainer::train::model::Cnn;
use pipeprof_trainer::train::optim::Opt;
use pipeprof_trainer::train::seed_weights;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const PEER: &str = include_str!("peer_train.py");

struct Case {
    name: &'static str,
    toml: &'static str,
    file: &'static str,
    classes: usize,
    batch: usize,
    steps: usize,
}

/// Median ms of forward, backward, optimizer, whole step.
type Phases = [f64; 4];

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn medians(rows: &[Phases]) -> Phases {
    std::array::from_fn(|i| median(rows.iter().map(|r| r[i]).collect()))
}

struct Ours {
    model: Cnn,
    opt: Opt,
    candle_opt: Opt,
    xs: Tensor,
    ys: Tensor,
}

impl Ours {
    fn new(case: &Case) -> Ours {
        let cfg = ModelConfig::parse(case.toml, case.file).unwrap();
        let dev = Device::Cpu;
        let vm = VarMap::new();
        let model = Cnn::new(&cfg, case.classes, VarBuilder::from_varmap(&vm, DType::F32, &dev)).unwrap();
        seed_weights(&vm, 1, &dev).unwrap();
        let (kind, lr) = (cfg.train.optimizer, cfg.train.learning_rate);
        let opt = Opt::new(kind, lr, vm.all_vars(), &dev).unwrap();
        let candle_opt = Opt::candle(kind, lr, vm.all_vars()).unwrap();
        let (c, h, w) = (cfg.input.channels, cfg.input.height, cfg.input.width);
        let n = case.batch * c * h * w;
        let pixels: Vec<f32> = (0..n).map(|i| ((i * 2_654_435_761) % 1000) as f32 / 1000.0).collect();
        let xs = Tensor::from_vec(pixels, (case.batch, c, h, w), &dev).unwrap();
        let labels: Vec<u32> = (0..case.batch as u32).map(|i| i % case.classes as u32).collect();
        let ys = Tensor::from_vec(labels, case.batch, &dev).unwrap();
        Ours { model, opt, candle_opt, xs, ys }
    }

    /// `steps` steps as `pipeprof profile` runs them (layer by layer, pipeprof's convolution,
    /// fused optimizer), or as before issue 22 (`loss.backward()` on the whole graph, candle's
    /// convolution and optimizer), or the whole graph with pipeprof's kernels (the cost of
    /// timing each layer). The medians of
    /// each phase, and of each layer's forward and backward when run layer by layer.
    fn round(&mut self, steps: usize, how: How) -> (Phases, Vec<[f64; 2]>) {
        let layers = self.model.len();
        let mut per_layer: Vec<Vec<[f64; 2]>> = vec![vec![]; layers];
        let rows: Vec<Phases> = (0..steps)
            .map(|_| {
                let mut times = vec![[0.0; 2]; layers];
                // Before issue 22: candle's convolution too.
                self.model.use_candle_conv(how == How::Before);
                let t0 = Instant::now();
                let (grads, t1, loss) = if how == How::Layerwise {
                    let (logits, tape) = layerwise::forward(
                        &self.model,
                        &self.xs,
                        true,
                        || Ok(()),
                        |i, _, d| times[i][0] = d as f64 / 1e6,
                    )
                    .unwrap();
                    let loss = candle_nn::loss::cross_entropy(&logits, &self.ys).unwrap();
                    let t1 = Instant::now();
                    let g = layerwise::backward(
                        &self.model,
                        tape,
                        &loss,
                        || Ok(()),
                        |i, _, d| times[i][1] = d as f64 / 1e6,
                    )
                    .unwrap();
                    (g, t1, loss)
                } else {
                    let logits = self.model.forward(&self.xs, true).unwrap();
                    let loss = candle_nn::loss::cross_entropy(&logits, &self.ys).unwrap();
                    let t1 = Instant::now();
                    let mut g = loss.backward().unwrap();
                    self.model.take_grads(&mut g).unwrap();
                    (g, t1, loss)
                };
                let t2 = Instant::now();
                let opt = if how == How::Before { &mut self.candle_opt } else { &mut self.opt };
                opt.step(&grads).unwrap();
                let t3 = Instant::now();
                loss.to_scalar::<f32>().unwrap();
                for (acc, t) in per_layer.iter_mut().zip(times) {
                    acc.push(t);
                }
                let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
                [ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t0, t3)]
            })
            .collect();
        let layer_medians =
            per_layer.iter().map(|v| std::array::from_fn(|k| median(v.iter().map(|t| t[k]).collect()))).collect();
        (medians(&rows), layer_medians)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    Layerwise,
    WholeGraph,
    Before,
}

struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    fn python() -> Option<String> {
        let py = std::env::var("PIPEPROF_PYTHON").unwrap_or_else(|_| "python3".into());
        let ok = Command::new(&py).args(["-c", "import torch"]).stderr(Stdio::null()).status();
        ok.is_ok_and(|s| s.success()).then_some(py)
    }

    fn start(py: &str, script: &std::path::Path, toml: &std::path::Path, case: &Case, threads: usize) -> Peer {
        let mut child = Command::new(py)
            .arg(script)
            .arg(toml)
            .args([case.classes, case.batch, threads].map(|v| v.to_string()))
            .env("OMP_NUM_THREADS", threads.to_string())
            .env("MKL_NUM_THREADS", threads.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the PyTorch peer");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "peer_train.py did not start");
        Peer { child, stdin, stdout }
    }

    fn round(&mut self, steps: usize) -> Phases {
        writeln!(self.stdin, "{steps}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let v: Vec<f64> = line.split_whitespace().map(|x| x.parse().unwrap()).collect();
        assert_eq!(v.len(), 4, "peer answered {line:?}");
        [v[0], v[1], v[2], v[3]]
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn main() {
    let threads = env_usize("PIPEPROF_BENCH_THREADS", 2);
    let rounds = env_usize("PIPEPROF_BENCH_ROUNDS", 3).max(1);
    let large_batch = env_usize("PIPEPROF_BENCH_BATCH", 8);
    // Before the first rayon use: candle's CPU kernels run on the global pool.
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().unwrap();
    // As `pipeprof profile` does on a CPU device (PIPEPROF_BENCH_MALLOC=default leaves glibc's
    // settings, to measure what this is worth in alternating processes).
    if std::env::var("PIPEPROF_BENCH_MALLOC").as_deref() != Ok("default") {
        pipeprof_trainer::train::device::keep_freed_memory(&Device::Cpu);
    }
    let cases = [
        Case {
            name: "large",
            toml: include_str!("../examples/cnn_large.toml"),
            file: "cnn_large.toml",
            classes: 2,
            batch: large_batch,
            steps: 3,
        },
        Case {
            name: "cnn",
            toml: include_str!("../examples/cnn.toml"),
            file: "cnn.toml",
            classes: 4,
            batch: 32,
            steps: 10,
        },
        Case {
            name: "mlp",
            toml: include_str!("../examples/mlp_mnist.toml"),
            file: "mlp_mnist.toml",
            classes: 10,
            batch: 32,
            steps: 50,
        },
    ];
    let wanted: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let py = Peer::python();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("peer_train.py");
    std::fs::write(&script, PEER).unwrap();
    match &py {
        Some(p) => println!("PyTorch peer: {p}, {threads} threads each side, {rounds} alternating rounds"),
        None => println!("PyTorch peer: off (`python3 -c \"import torch\"` failed; set PIPEPROF_PYTHON)"),
    }
    for case in cases.iter().filter(|c| wanted.is_empty() || wanted.iter().any(|w| w == c.name)) {
        let toml = dir.path().join(case.file);
        std::fs::write(&toml, case.toml).unwrap();
        let mut ours = Ours::new(case);
        let mut peer = py.as_ref().map(|p| Peer::start(p, &script, &toml, case, threads));
        // Warm-up: first-touch allocations, the peer's lazy initialisation.
        for how in [How::Layerwise, How::WholeGraph, How::Before] {
            ours.round(1, how);
        }
        if let Some(p) = peer.as_mut() {
            p.round(1);
        }
        let (mut now, mut whole, mut before, mut torch, mut layers) = (vec![], vec![], vec![], vec![], vec![]);
        // Rounds: pipeprof's three ways one step each in turn, `steps` times, then the peer's
        // `steps` steps (its OpenMP threads spin a while after each parallel region, so it
        // runs its steps together, as it would alone). Ratios compare neighbours.
        for _ in 0..rounds {
            let mut rows: [Vec<Phases>; 3] = Default::default();
            for _ in 0..case.steps {
                let (p, l) = ours.round(1, How::Layerwise);
                rows[0].push(p);
                layers.push(l);
                rows[1].push(ours.round(1, How::WholeGraph).0);
                rows[2].push(ours.round(1, How::Before).0);
            }
            now.push(medians(&rows[0]));
            whole.push(medians(&rows[1]));
            before.push(medians(&rows[2]));
            if let Some(p) = peer.as_mut() {
                torch.push(p.round(case.steps));
            }
        }
        println!(
            "\n{} ({}, batch {}, {} steps × {rounds} rounds), median ms",
            case.name, case.file, case.batch, case.steps
        );
        println!(
            "{:<10} {:>9} {:>9} {:>9} {:>9} {:>13} {:>13} {:>13}",
            "phase", "pipeprof", "per-layer", "before", "PyTorch", "pipeprof/PyT", "before/now", "layer/whole"
        );
        let (n, w, b) = (medians(&now), medians(&whole), medians(&before));
        let t = (!torch.is_empty()).then(|| medians(&torch));
        for (i, phase) in ["forward", "backward", "optimizer", "step"].iter().enumerate() {
            // Ratios within a round (the sides ran back to back), then their median.
            let ratio = |a: &[Phases], b: &[Phases]| median(a.iter().zip(b).map(|(x, y)| x[i] / y[i]).collect());
            println!(
                "{:<10} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>13} {:>12.2}× {:>12.2}×",
                phase,
                w[i],
                n[i],
                b[i],
                t.map_or("-".to_string(), |t| format!("{:.1}", t[i])),
                t.map_or("-".to_string(), |_| format!("{:.2}×", ratio(&whole, &torch))),
                ratio(&before, &whole),
                ratio(&now, &whole),
            );
        }
        println!("per layer (the per-layer steps, median ms): forward / backward");
        for (i, name) in (0..ours.model.len()).map(|i| (i, ours.model.name(i).to_string())) {
            let f = median(layers.iter().map(|l: &Vec<[f64; 2]>| l[i][0]).collect());
            let bw = median(layers.iter().map(|l: &Vec<[f64; 2]>| l[i][1]).collect());
            println!("  {name:<18} {f:>9.1} {bw:>9.1}");
        }
    }
}
