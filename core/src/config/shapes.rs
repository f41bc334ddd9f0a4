//! Shape inference: each layer's output shape and parameter count from `cnn.toml`, before any
//! tensor exists (Keras `model.summary()`).

use crate::config::{Input, LayerSpec, ModelConfig, Padding, Units};

/// A layer with its inferred output shape (without the batch dimension).
#[derive(Debug, Clone, PartialEq)]
pub struct ShapedLayer {
    pub spec: LayerSpec,
    pub name: String,
    pub output: Vec<usize>,
    pub params: usize,
}

impl ModelConfig {
    /// Output shape and parameter count of every layer, for `classes` classes.
    /// A layer that collapses the shape, or a model whose output is not one value per class,
    /// is an error naming the layer.
    pub fn infer_shapes(&self, classes: usize) -> Result<Vec<ShapedLayer>, String> {
        let mut shape = vec![self.input.channels, self.input.height, self.input.width];
        let mut out = Vec::with_capacity(self.layers.len());
        let mut counts = std::collections::HashMap::<&str, usize>::new();
        for (i, spec) in self.layers.iter().enumerate() {
            let n = i + 1;
            let k = counts.entry(spec.kind()).or_insert(0);
            *k += 1;
            let name = format!("{}_{}", spec.kind(), k);
            let params;
            (shape, params) = layer_output(spec, n, &shape, classes)?;
            out.push(ShapedLayer { spec: spec.clone(), name, output: shape.clone(), params });
        }
        if shape != [classes] {
            return Err(format!(
                "the last layer outputs {:?} but there are {classes} classes: end with a dense layer with `units = \"classes\"`",
                shape
            ));
        }
        Ok(out)
    }
}

/// The output shape and parameter count of `spec`, layer `n` (from 1), given its input
/// `shape`.
fn layer_output(spec: &LayerSpec, n: usize, shape: &[usize], classes: usize) -> Result<(Vec<usize>, usize), String> {
    let mut params = 0;
    let out = match spec {
        LayerSpec::Conv2d { filters, kernel_size, strides, padding, .. } => {
            let [c, h, w] = spatial(shape, n, spec)?;
            let oh = conv_out(h, *kernel_size, *strides, *padding);
            let ow = conv_out(w, *kernel_size, *strides, *padding);
            if oh == 0 || ow == 0 {
                return Err(collapse(n, spec, shape));
            }
            params = kernel_size
                .checked_mul(*kernel_size)
                .and_then(|x| x.checked_mul(c))
                .and_then(|x| x.checked_mul(*filters))
                .and_then(|x| x.checked_add(*filters))
                .ok_or_else(|| too_big(n, spec))?;
            vec![*filters, oh, ow]
        }
        LayerSpec::MaxPooling2d { pool_size, strides } | LayerSpec::AveragePooling2d { pool_size, strides } => {
            let [c, h, w] = spatial(shape, n, spec)?;
            let s = strides.unwrap_or(*pool_size);
            let oh = conv_out(h, *pool_size, s, Padding::Valid);
            let ow = conv_out(w, *pool_size, s, Padding::Valid);
            if oh == 0 || ow == 0 {
                return Err(collapse(n, spec, shape));
            }
            vec![c, oh, ow]
        }
        LayerSpec::Flatten {} => {
            vec![shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| too_big(n, spec))?]
        }
        LayerSpec::Dense { units, .. } => {
            if shape.len() != 1 {
                return Err(format!(
                    "layer {n} (dense) gets a {}-d input {:?}: add a `type = \"flatten\"` layer before it",
                    shape.len(),
                    shape
                ));
            }
            let u = match units {
                Units::Fixed(u) => *u,
                Units::Classes => classes,
            };
            params = shape[0].checked_mul(u).and_then(|x| x.checked_add(u)).ok_or_else(|| too_big(n, spec))?;
            vec![u]
        }
        LayerSpec::Dropout { .. } => shape.to_vec(),
    };
    Ok((out, params))
}

fn spatial(shape: &[usize], n: usize, spec: &LayerSpec) -> Result<[usize; 3], String> {
    match shape {
        [c, h, w] => Ok([*c, *h, *w]),
        _ => Err(format!("layer {n} ({}) needs an image-shaped input, got {:?} (after flatten?)", spec.kind(), shape)),
    }
}

fn too_big(n: usize, spec: &LayerSpec) -> String {
    format!(
        "layer {n} ({}) has more parameters or outputs than can be counted: use fewer filters/units or a smaller kernel",
        spec.kind()
    )
}

/// Bytes training is expected to need, at least: f32 weights, their gradients and two
/// optimizer moments (AdamW), plus each layer's activations and their gradients for one batch.
/// `None` when the count itself overflows (then the model cannot fit anywhere).
pub fn memory_estimate(layers: &[ShapedLayer], input: &Input, batch: usize) -> Option<u64> {
    let params = layers.iter().try_fold(0u64, |a, l| a.checked_add(l.params as u64))?;
    let input_elems = (input.channels as u64).checked_mul(input.height as u64)?.checked_mul(input.width as u64)?;
    let acts = layers.iter().try_fold(input_elems, |a, l| {
        let n = l.output.iter().try_fold(1u64, |p, &d| p.checked_mul(d as u64))?;
        a.checked_add(n)
    })?;
    let act_bytes = acts.checked_mul(batch as u64)?.checked_mul(4 * 2)?;
    params.checked_mul(4 * 4)?.checked_add(act_bytes)
}

fn collapse(n: usize, spec: &LayerSpec, shape: &[usize]) -> String {
    format!(
        "layer {n} ({}) collapses its input {:?} below 1 pixel: use a larger [input] size, a smaller kernel/pool, or fewer layers",
        spec.kind(),
        shape
    )
}

/// Keras output size: valid = floor((in - k) / s) + 1, same = ceil(in / s).
fn conv_out(input: usize, kernel: usize, stride: usize, padding: Padding) -> usize {
    match padding {
        Padding::Valid if input < kernel => 0,
        Padding::Valid => (input - kernel) / stride + 1,
        Padding::Same => input.div_ceil(stride),
    }
}

/// TensorFlow's "same" padding: (before, after) zeros so that the output is ceil(in / s).
pub fn same_padding(input: usize, kernel: usize, stride: usize) -> (usize, usize) {
    let out = input.div_ceil(stride);
    let total = ((out - 1) * stride + kernel).saturating_sub(input);
    (total / 2, total - total / 2)
}

/// A Keras-style summary table.
pub fn summary_table(layers: &[ShapedLayer], input: &Input) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "{:<22} {:<18} {:>10}", "Layer (type)", "Output shape", "Params");
    let _ = writeln!(s, "{}", "─".repeat(52));
    let _ = writeln!(s, "{:<22} {:<18} {:>10}", "input", fmt_shape(&[input.channels, input.height, input.width]), 0);
    for l in layers {
        let _ = writeln!(s, "{:<22} {:<18} {:>10}", l.name, fmt_shape(&l.output), l.params);
    }
    let total: usize = layers.iter().map(|l| l.params).sum();
    let _ = writeln!(s, "{}", "─".repeat(52));
    let _ = writeln!(s, "Total params: {total} ({:.2} MB as f32)", total as f64 * 4.0 / 1e6);
    s
}

fn fmt_shape(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("(None, {})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_MODEL;

    #[test]
    fn output_sizes_match_keras() {
        // (input, kernel, stride, padding) → output
        let table = [
            (64, 3, 1, Padding::Valid, 62),
            (64, 3, 2, Padding::Valid, 31),
            (64, 3, 1, Padding::Same, 64),
            (65, 3, 2, Padding::Same, 33),
            (2, 3, 1, Padding::Valid, 0),
        ];
        for (i, k, s, p, want) in table {
            assert_eq!(conv_out(i, k, s, p), want, "{i} {k} {s} {p:?}");
        }
        assert_eq!(same_padding(64, 3, 1), (1, 1));
        assert_eq!(same_padding(64, 4, 1), (1, 2));
        assert_eq!(same_padding(65, 3, 2), (1, 1));
    }

    #[test]
    fn huge_layers_are_an_error_naming_the_layer_not_an_overflow() {
        let t = "[input]\nheight = 4096\nwidth = 4096\n[[layers]]\ntype = \"conv2d\"\nfilters = 1048576\n\
                 kernel_size = 4096\npadding = \"same\"\n[[layers]]\ntype = \"conv2d\"\nfilters = 1048576\n\
                 kernel_size = 4096\npadding = \"same\"\n[[layers]]\ntype = \"flatten\"\n[[layers]]\n\
                 type = \"dense\"\nunits = 1048576\n[[layers]]\ntype = \"dense\"\nunits = \"classes\"\n";
        let cfg = ModelConfig::parse(t, "huge.toml").unwrap();
        let e = cfg.infer_shapes(3).unwrap_err();
        assert!(e.contains("layer 2 (conv2d)") && e.contains("more parameters"), "{e}");
    }

    #[test]
    fn memory_estimate_counts_weights_optimizer_and_activations() {
        let cfg = ModelConfig::parse(DEFAULT_MODEL, "cnn.toml").unwrap();
        let shapes = cfg.infer_shapes(4).unwrap();
        let params: u64 = shapes.iter().map(|l| l.params as u64).sum();
        let one = memory_estimate(&shapes, &cfg.input, 1).unwrap();
        let two = memory_estimate(&shapes, &cfg.input, 2).unwrap();
        assert!(one > params * 16, "weights, grads and two moments at least");
        // One more image adds exactly one image's activations (and their gradients).
        let acts: u64 = (cfg.input.channels * cfg.input.height * cfg.input.width) as u64
            + shapes.iter().map(|l| l.output.iter().product::<usize>() as u64).sum::<u64>();
        assert_eq!(two - one, acts * 8);
        assert_eq!(memory_estimate(&shapes, &cfg.input, usize::MAX), None);
    }

    #[test]
    fn summary_lists_every_layer_and_the_total() {
        let cfg = ModelConfig::parse(DEFAULT_MODEL, "cnn.toml").unwrap();
        let shapes = cfg.infer_shapes(4).unwrap();
        let table = summary_table(&shapes, &cfg.input);
        for l in &shapes {
            assert!(table.contains(&l.name));
        }
        let total: usize = shapes.iter().map(|l| l.params).sum();
        assert!(table.contains(&format!("Total params: {total}")));
    }
}
