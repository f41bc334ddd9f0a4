//! A candle CNN built from `cnn.toml`, layer by layer, with candle's usual idioms.

use super::shapes::same_padding;
use candle_core::backprop::GradStore;
use candle_core::{Module, Result, Tensor};
use candle_nn::{Conv2d, Conv2dConfig, Dropout, Linear, VarBuilder};
use pipeprof_core::config::{Activation, LayerSpec, ModelConfig, Padding, Units};

enum Layer {
    Conv { conv: Conv2d, pad: Option<(usize, usize, usize, usize)>, act: Activation },
    MaxPool { k: usize, s: usize },
    AvgPool { k: usize, s: usize },
    Flatten,
    Dense { fc: Linear, act: Activation, dw: super::kernels::GradSlot },
    Dropout(Dropout),
}

/// The model: `Cnn::new(cfg, classes, vb)`, then `forward(&xs, train)` returns logits.
pub struct Cnn {
    layers: Vec<Layer>,
    /// Each layer's name in cnn.toml's numbering (`conv2d_1`, `max_pooling2d_1`, …).
    names: Vec<String>,
    /// candle's convolution, dense product and max pool on the CPU too (benches compare).
    candle_conv: std::cell::Cell<bool>,
}

/// The convolution with its bias and activation: on the CPU, pipeprof's own kernel (bias and
/// ReLU folded in; its backward skips the input's gradient when nothing needs it and uses
/// im2col + matrix products throughout: see `train::kernels`); elsewhere candle's.
fn conv2d(conv: &Conv2d, xs: &Tensor, act: Activation) -> Result<Tensor> {
    let c = conv.config();
    let plain = c.padding == 0 && c.dilation == 1 && c.groups == 1;
    let (true, true, Some(bias)) = (xs.device().is_cpu(), plain, conv.bias()) else {
        return activate(conv.forward(xs)?, act);
    };
    let relu = act == Activation::Relu;
    let ys = xs.apply_op3(conv.weight(), bias, super::kernels::Conv2d { stride: c.stride, relu })?;
    if relu {
        Ok(ys)
    } else {
        activate(ys, act)
    }
}

/// The dense layer: on the CPU with a 2-D input, pipeprof's own product (its backward writes
/// the weight's gradient once, in the weight's layout: see `train::kernels`); else candle's.
fn dense(fc: &Linear, xs: &Tensor, dw: &super::kernels::GradSlot) -> Result<Tensor> {
    if !xs.device().is_cpu() || xs.rank() != 2 {
        return fc.forward(xs);
    }
    let xs = if xs.is_contiguous() { xs.clone() } else { xs.contiguous()? };
    let ys = xs.apply_op2(fc.weight(), super::kernels::Dense { dw: dw.clone() })?;
    match fc.bias() {
        Some(b) => ys.broadcast_add(b),
        None => Ok(ys),
    }
}

fn activate(xs: Tensor, act: Activation) -> Result<Tensor> {
    match act {
        Activation::Relu => xs.relu(),
        Activation::Sigmoid => candle_nn::ops::sigmoid(&xs),
        Activation::Tanh => xs.tanh(),
        Activation::Gelu => xs.gelu(),
        Activation::Softmax => candle_nn::ops::softmax_last_dim(&xs),
        Activation::Linear => Ok(xs),
    }
}

impl Cnn {
    /// Builds the layers with parameters named `conv2d_1`, `dense_1`, … under `vb`.
    pub fn new(cfg: &ModelConfig, classes: usize, vb: VarBuilder) -> Result<Cnn> {
        let shapes = cfg.infer_shapes(classes).map_err(candle_core::Error::msg)?;
        let mut layers = Vec::with_capacity(shapes.len());
        let names = shapes.iter().map(|l| l.name.clone()).collect();
        let mut in_shape = vec![cfg.input.channels, cfg.input.height, cfg.input.width];
        let last = shapes.len() - 1;
        for (i, l) in shapes.iter().enumerate() {
            let layer = match &l.spec {
                LayerSpec::Conv2d { filters, kernel_size, strides, padding, activation } => {
                    let pad = match padding {
                        Padding::Valid => None,
                        Padding::Same => {
                            let (t, b) = same_padding(in_shape[1], *kernel_size, *strides);
                            let (lft, r) = same_padding(in_shape[2], *kernel_size, *strides);
                            Some((t, b, lft, r))
                        }
                    };
                    let c = Conv2dConfig { stride: *strides, ..Default::default() };
                    let conv = candle_nn::conv2d(in_shape[0], *filters, *kernel_size, c, vb.pp(&l.name))?;
                    Layer::Conv { conv, pad, act: *activation }
                }
                LayerSpec::MaxPooling2d { pool_size, strides } => {
                    Layer::MaxPool { k: *pool_size, s: strides.unwrap_or(*pool_size) }
                }
                LayerSpec::AveragePooling2d { pool_size, strides } => {
                    Layer::AvgPool { k: *pool_size, s: strides.unwrap_or(*pool_size) }
                }
                LayerSpec::Flatten {} => Layer::Flatten,
                LayerSpec::Dense { units, activation } => {
                    let out = match units {
                        Units::Fixed(u) => *u,
                        Units::Classes => classes,
                    };
                    let fc = candle_nn::linear(in_shape[0], out, vb.pp(&l.name))?;
                    // A final softmax is folded into the cross-entropy loss on the logits.
                    let act =
                        if i == last && *activation == Activation::Softmax { Activation::Linear } else { *activation };
                    Layer::Dense { fc, act, dw: Default::default() }
                }
                LayerSpec::Dropout { rate } => Layer::Dropout(Dropout::new(*rate as f32)),
            };
            layers.push(layer);
            in_shape = l.output.clone();
        }
        Ok(Cnn { layers, names, candle_conv: std::cell::Cell::new(false) })
    }

    /// Logits `(batch, classes)` for `xs` of shape `(batch, channels, height, width)`.
    pub fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor> {
        let mut xs = xs.clone();
        for i in 0..self.layers.len() {
            xs = self.forward_layer(i, &xs, train)?;
        }
        Ok(xs)
    }

    /// Uses candle's own convolution and dense product on the CPU as well (for benches:
    /// before and after).
    pub fn use_candle_conv(&self, on: bool) {
        self.candle_conv.set(on);
    }

    /// Layers, in order.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Layer `i`'s name (`dense_1`).
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// Layer `i` alone (with its activation) on `xs`.
    pub fn forward_layer(&self, i: usize, xs: &Tensor, train: bool) -> Result<Tensor> {
        match &self.layers[i] {
            Layer::Conv { conv, pad, act } => {
                let padded = match pad {
                    Some((t, b, l, r)) => xs.pad_with_zeros(2, *t, *b)?.pad_with_zeros(3, *l, *r)?,
                    None => xs.clone(),
                };
                if self.candle_conv.get() {
                    activate(conv.forward(&padded)?, *act)
                } else {
                    conv2d(conv, &padded, *act)
                }
            }
            Layer::MaxPool { k, s } if k == s && xs.device().is_cpu() && !self.candle_conv.get() => {
                let xs = if xs.is_contiguous() { xs.clone() } else { xs.contiguous()? };
                xs.apply_op1(super::kernels::MaxPool { k: *k })
            }
            Layer::MaxPool { k, s } => xs.max_pool2d_with_stride(*k, *s),
            Layer::AvgPool { k, s } => xs.avg_pool2d_with_stride(*k, *s),
            Layer::Flatten => xs.flatten_from(1),
            Layer::Dense { fc, act, dw } => {
                let ys = if self.candle_conv.get() { fc.forward(xs)? } else { dense(fc, xs, dw)? };
                activate(ys, *act)
            }
            Layer::Dropout(d) => d.forward(xs, train),
        }
    }

    /// Moves the weight gradients the dense kernels left aside (see `kernels::GradSlot`) into
    /// `grads`: after every backward pass over this model's graph.
    pub fn take_grads(&self, grads: &mut GradStore) -> Result<()> {
        (0..self.layers.len()).try_for_each(|i| self.take_layer_grads(i, grads))
    }

    /// [`Cnn::take_grads`] for layer `i` alone.
    pub fn take_layer_grads(&self, i: usize, grads: &mut GradStore) -> Result<()> {
        if let Layer::Dense { fc, dw, .. } = &self.layers[i] {
            let taken = dw.lock().map_err(|_| candle_core::Error::msg("dense: gradient slot poisoned"))?.take();
            if let Some(g) = taken {
                let sum = match grads.remove(fc.weight()) {
                    Some(prev) => (prev + g)?,
                    None => g,
                };
                grads.insert(fc.weight(), sum);
            }
        }
        Ok(())
    }

    /// Layer `i`'s parameters (weight, then bias), none for pooling, flatten and dropout.
    pub fn params(&self, i: usize) -> Vec<&Tensor> {
        let (w, b) = match &self.layers[i] {
            Layer::Conv { conv, .. } => (conv.weight(), conv.bias()),
            Layer::Dense { fc, .. } => (fc.weight(), fc.bias()),
            _ => return vec![],
        };
        std::iter::once(w).chain(b).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::VarMap;

    #[test]
    fn gpu_check_example_models_have_their_documented_sizes() {
        let params = |toml, classes| {
            let cfg = ModelConfig::parse(toml, "example.toml").unwrap();
            cfg.infer_shapes(classes).unwrap().iter().map(|l| l.params).sum::<usize>()
        };
        // 784·128 + 128 + 128·10 + 10 with 10 classes: 784-128-10.
        let mlp = include_str!("../../../examples/mlp_mnist.toml");
        assert_eq!(params(mlp, 10), 101_770);
        // conv 3→32, conv 32→64, dense 36·36·64→512, dense 512→2.
        let large = include_str!("../../../examples/cnn_large.toml");
        assert_eq!(params(large, 2), 896 + 18_496 + 42_467_840 + 1_026);
    }

    #[test]
    fn forward_shape_matches_inferred_shapes_with_same_padding_and_strides() {
        let t = "[input]\nheight=9\nwidth=7\nchannels=1\n\
                 [[layers]]\ntype=\"conv2d\"\nfilters=3\nkernel_size=4\nstrides=2\npadding=\"same\"\nactivation=\"gelu\"\n\
                 [[layers]]\ntype=\"average_pooling2d\"\npool_size=2\nstrides=1\n\
                 [[layers]]\ntype=\"flatten\"\n[[layers]]\ntype=\"dropout\"\nrate=0.5\n\
                 [[layers]]\ntype=\"dense\"\nunits=5\nactivation=\"tanh\"\n\
                 [[layers]]\ntype=\"dense\"\nunits=\"classes\"\nactivation=\"softmax\"\n";
        let cfg = ModelConfig::parse(t, "m.toml").unwrap();
        let shapes = cfg.infer_shapes(2).unwrap();
        assert_eq!(shapes[0].output, vec![3, 5, 4]);
        let dev = Device::Cpu;
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &dev);
        let model = Cnn::new(&cfg, 2, vb).unwrap();
        let xs = Tensor::zeros((4, 1, 9, 7), DType::F32, &dev).unwrap();
        let ys = model.forward(&xs, true).unwrap();
        assert_eq!(ys.dims(), &[4, 2]);
        let params: usize = vm.all_vars().iter().map(|v| v.elem_count()).sum();
        assert_eq!(params, shapes.iter().map(|l| l.params).sum::<usize>());
    }
}
