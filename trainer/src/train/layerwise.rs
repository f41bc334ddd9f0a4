//! Forward and backward one layer at a time, so each layer's share of each pass can be timed.
//!
//! candle's `loss.backward()` is one call over the whole graph. Here the graph is cut between
//! layers: each layer's input is a leaf of its own (a copy of the previous output that tracks
//! a gradient), so the backward pass runs as one `backward()` per layer, top to bottom, each
//! seeded with the gradient the layer above computed for its output. The gradients are the
//! same (`layerwise_gradients_equal_candles_whole_graph_backward`); the cost is one copy of
//! each activation in the forward pass and one add in the backward pass (candle sums every
//! gradient into a fresh tensor anyway).

use super::model::Cnn;
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor, Var};

/// What the forward pass keeps for the backward pass: each layer's input and output.
pub struct Tape {
    cuts: Vec<(Tensor, Tensor)>,
}

/// The root of layer `i`'s backward pass on the CPU: a scalar whose gradient, handed to the
/// layer's output, is the gradient the layer above computed (no multiply, no reduction).
struct Seed(Tensor);

impl CustomOp1 for Seed {
    fn name(&self) -> &'static str {
        "layerwise-seed"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(vec![0.0]), Shape::from(())))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, _grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(self.0.clone()))
    }
}

/// A scalar whose gradient with respect to `out` is `grad`: the [`Seed`] op on the CPU, and
/// `Σ out·grad` elsewhere (no custom kernel needed on CUDA; one multiply more).
fn seeded(out: &Tensor, grad: Tensor) -> Result<Tensor> {
    if out.device().is_cpu() {
        out.apply_op1(Seed(grad))
    } else {
        (out * grad.detach())?.sum_all()
    }
}

/// Runs the layers on `xs`; `timed(i, start_ns, dur_ns)` after each. Returns the logits.
pub fn forward(
    model: &Cnn,
    xs: &Tensor,
    train: bool,
    mut done: impl FnMut() -> Result<()>,
    mut timed: impl FnMut(usize, u64, u64),
) -> Result<(Tensor, Tape)> {
    let mut cuts = Vec::with_capacity(model.len());
    let mut x = xs.clone();
    for i in 0..model.len() {
        let t0 = probes::clock::now_ns();
        // The batch itself needs no gradient; every later input does, as a leaf of its own.
        let input = if i == 0 { x } else { Var::from_tensor(&x.detach())?.into_inner() };
        let out = model.forward_layer(i, &input, train)?;
        done()?;
        timed(i, t0, probes::clock::now_ns().saturating_sub(t0));
        cuts.push((input, out.clone()));
        x = out;
    }
    Ok((x, Tape { cuts }))
}

/// The gradients of `loss` (computed from the logits `forward` returned) for every parameter,
/// one layer at a time from the top; `timed(i, start_ns, dur_ns)` after each layer. The last
/// layer's time includes the loss's own backward.
pub fn backward(
    model: &Cnn,
    tape: Tape,
    loss: &Tensor,
    mut done: impl FnMut() -> Result<()>,
    mut timed: impl FnMut(usize, u64, u64),
) -> Result<GradStore> {
    let mut cuts = tape.cuts;
    let mut all: Option<GradStore> = None;
    let mut upstream: Option<Tensor> = None;
    while let Some((input, output)) = cuts.pop() {
        let i = cuts.len();
        let t0 = probes::clock::now_ns();
        let mut grads = match upstream.take() {
            None => loss.backward()?,
            Some(g) => seeded(&output, g)?.backward()?,
        };
        model.take_layer_grads(i, &mut grads)?;
        if i > 0 {
            // No gradient reaches this layer's input: the layers below get none either.
            match grads.remove(&input) {
                Some(g) => upstream = Some(g),
                None => candle_core::bail!("layer {} passes no gradient to its input", model.name(i)),
            }
        }
        done()?;
        timed(i, t0, probes::clock::now_ns().saturating_sub(t0));
        // Keep the parameters' gradients only: the rest of this layer's store (its
        // intermediate tensors' gradients) is freed now rather than at the end of the step.
        match all.as_mut() {
            None => all = Some(grads),
            Some(a) => {
                for p in model.params(i) {
                    if let Some(g) = grads.remove(p) {
                        a.insert(p, g);
                    }
                }
            }
        }
        drop(output);
    }
    match all {
        Some(a) => Ok(a),
        None => {
            let mut grads = loss.backward()?;
            model.take_grads(&mut grads)?;
            Ok(grads)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::{VarBuilder, VarMap};
    use pipeprof_core::config::ModelConfig;

    const MODEL: &str = "[input]\nheight=10\nwidth=9\nchannels=3\n\
        [[layers]]\ntype=\"conv2d\"\nfilters=3\nkernel_size=3\npadding=\"same\"\nactivation=\"tanh\"\n\
        [[layers]]\ntype=\"max_pooling2d\"\npool_size=2\n\
        [[layers]]\ntype=\"conv2d\"\nfilters=4\nkernel_size=2\nactivation=\"relu\"\n\
        [[layers]]\ntype=\"average_pooling2d\"\npool_size=2\n\
        [[layers]]\ntype=\"flatten\"\n\
        [[layers]]\ntype=\"dense\"\nunits=6\nactivation=\"gelu\"\n\
        [[layers]]\ntype=\"dense\"\nunits=\"classes\"\nactivation=\"softmax\"\n";

    fn setup() -> (Cnn, VarMap, Tensor, Tensor) {
        let cfg = ModelConfig::parse(MODEL, "m.toml").unwrap();
        let dev = Device::Cpu;
        let vm = VarMap::new();
        let model = Cnn::new(&cfg, 3, VarBuilder::from_varmap(&vm, DType::F32, &dev)).unwrap();
        crate::train::seed_weights(&vm, 3, &dev).unwrap();
        let px: Vec<f32> = (0..(4 * 3 * 10 * 9)).map(|i| ((i * 37 % 101) as f32 / 101.0) - 0.4).collect();
        let xs = Tensor::from_vec(px, (4, 3, 10, 9), &dev).unwrap();
        let ys = Tensor::new(&[0u32, 2, 1, 2], &dev).unwrap();
        (model, vm, xs, ys)
    }

    #[test]
    fn layerwise_gradients_equal_candles_whole_graph_backward() {
        let (model, vm, xs, ys) = setup();
        let whole = candle_nn::loss::cross_entropy(&model.forward(&xs, false).unwrap(), &ys).unwrap();
        let mut reference = whole.backward().unwrap();
        model.take_grads(&mut reference).unwrap();
        let (mut fwd, mut bwd) = (vec![], vec![]);
        let (logits, tape) = forward(&model, &xs, false, || Ok(()), |i, _, _| fwd.push(i)).unwrap();
        let loss = candle_nn::loss::cross_entropy(&logits, &ys).unwrap();
        assert_eq!(loss.to_scalar::<f32>().unwrap(), whole.to_scalar::<f32>().unwrap());
        let grads = backward(&model, tape, &loss, || Ok(()), |i, _, _| bwd.push(i)).unwrap();
        // Every layer timed once per pass, the backward pass from the top.
        assert_eq!(fwd, (0..7).collect::<Vec<_>>());
        assert_eq!(bwd, (0..7).rev().collect::<Vec<_>>());
        let vars = vm.all_vars();
        assert_eq!(vars.len(), 8);
        for v in &vars {
            let want = reference.get(v.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let got = grads.get(v.as_tensor()).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert!(want.iter().any(|g| *g != 0.0));
            for (a, b) in want.iter().zip(&got) {
                assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn the_multiply_seed_gives_the_same_gradient_as_the_cpu_seed() {
        // The seed CUDA uses (Σ out·g) checked on the CPU against the custom op.
        let dev = Device::Cpu;
        let w = Var::from_tensor(&Tensor::new(&[[1.0f32, -2.0], [0.5, 3.0]], &dev).unwrap()).unwrap();
        let out = w.as_tensor().sqr().unwrap();
        let g = Tensor::new(&[[0.1f32, 0.2], [-0.3, 0.4]], &dev).unwrap();
        let a = out.apply_op1(Seed(g.clone())).unwrap().backward().unwrap();
        let b = (&out * &g).unwrap().sum_all().unwrap().backward().unwrap();
        let (a, b) = (a.get(w.as_tensor()).unwrap(), b.get(w.as_tensor()).unwrap());
        // d/dw Σ g·w² = 2·g·w.
        assert_eq!(a.to_vec2::<f32>().unwrap(), vec![vec![0.2f32, -0.8], vec![-0.3, 2.4]]);
        assert_eq!(a.to_vec2::<f32>().unwrap(), b.to_vec2::<f32>().unwrap());
    }
}
