//! `cnn.toml`: a Keras-like model and training description.
//!
//! Every section and key has a default except `[[layers]]`. Unknown keys are errors that
//! name the file, line and column. Shapes are inferred here, before any tensor exists.

use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// The model used when no `--model` is given (the same text as `examples/cnn.toml`).
pub const DEFAULT_MODEL: &str = include_str!("../examples/cnn.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: String, line: usize, column: usize, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    #[serde(default)]
    pub input: Input,
    pub layers: Vec<LayerSpec>,
    #[serde(default)]
    pub train: Train,
    #[serde(default)]
    pub data: Data,
    #[serde(default)]
    pub augment: Augment,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Input {
    pub height: usize,
    pub width: usize,
    pub channels: usize,
}

impl Default for Input {
    fn default() -> Self {
        Input { height: 64, width: 64, channels: 3 }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Sigmoid,
    Tanh,
    Gelu,
    Softmax,
    #[default]
    Linear,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Padding {
    #[default]
    Valid,
    Same,
}

/// `units = 64` or `units = "classes"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Units {
    Fixed(usize),
    Classes,
}

impl<'de> Deserialize<'de> for Units {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(i64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) if n > 0 => Ok(Units::Fixed(n as usize)),
            Raw::N(n) => Err(serde::de::Error::custom(format!("units must be at least 1, got {n}"))),
            Raw::S(s) if s == "classes" => Ok(Units::Classes),
            Raw::S(s) => Err(serde::de::Error::custom(format!("units must be a number or \"classes\", got \"{s}\""))),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LayerSpec {
    Conv2d {
        filters: usize,
        kernel_size: usize,
        #[serde(default = "one")]
        strides: usize,
        #[serde(default)]
        padding: Padding,
        #[serde(default)]
        activation: Activation,
    },
    #[serde(rename = "max_pooling2d")]
    MaxPooling2d {
        #[serde(default = "two")]
        pool_size: usize,
        strides: Option<usize>,
    },
    #[serde(rename = "average_pooling2d")]
    AveragePooling2d {
        #[serde(default = "two")]
        pool_size: usize,
        strides: Option<usize>,
    },
    Flatten {},
    Dense {
        units: Units,
        #[serde(default)]
        activation: Activation,
    },
    Dropout {
        rate: f64,
    },
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}

impl LayerSpec {
    pub fn kind(&self) -> &'static str {
        match self {
            LayerSpec::Conv2d { .. } => "conv2d",
            LayerSpec::MaxPooling2d { .. } => "max_pooling2d",
            LayerSpec::AveragePooling2d { .. } => "average_pooling2d",
            LayerSpec::Flatten {} => "flatten",
            LayerSpec::Dense { .. } => "dense",
            LayerSpec::Dropout { .. } => "dropout",
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    #[default]
    Adam,
    Adamw,
    Sgd,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Train {
    pub batch_size: usize,
    pub epochs: usize,
    pub optimizer: OptimizerKind,
    pub learning_rate: f64,
}

impl Default for Train {
    fn default() -> Self {
        Train { batch_size: 32, epochs: 1, optimizer: OptimizerKind::Adam, learning_rate: 0.001 }
    }
}

/// `workers = "auto"` or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Workers {
    #[default]
    Auto,
    Fixed(usize),
}

impl Workers {
    /// The worker count to run with on a machine with `cores` cores.
    pub fn resolve(self, cores: usize) -> usize {
        match self {
            Workers::Auto => cores.max(1),
            Workers::Fixed(n) => n.max(1),
        }
    }
}

impl fmt::Display for Workers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Workers::Auto => f.write_str("auto"),
            Workers::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl std::str::FromStr for Workers {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Workers::Auto);
        }
        match s.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Workers::Fixed(n)),
            _ => Err(format!("workers must be \"auto\" or a number ≥ 1, got \"{s}\"")),
        }
    }
}

impl<'de> Deserialize<'de> for Workers {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(i64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) if n > 0 => Ok(Workers::Fixed(n as usize)),
            Raw::N(n) => Err(serde::de::Error::custom(format!("workers must be at least 1, got {n}"))),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Data {
    pub workers: Workers,
    pub prefetch: usize,
    pub shuffle: bool,
    pub seed: u64,
    /// Share of each class held out for validation (0 = none).
    pub validation_split: f64,
}

impl Default for Data {
    fn default() -> Self {
        Data { workers: Workers::Auto, prefetch: 2, shuffle: true, seed: 42, validation_split: 0.0 }
    }
}

/// `[augment]`: Keras `ImageDataGenerator` names; everything off by default.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Augment {
    pub horizontal_flip: bool,
    pub vertical_flip: bool,
    /// Degrees: the angle is uniform in [-r, r].
    pub rotation_range: f64,
    /// Zoom factors are uniform in [1 - z, 1 + z], per axis (below 1 zooms in, as in Keras).
    pub zoom_range: f64,
    /// Degrees: the shear angle is uniform in [-s, s].
    pub shear_range: f64,
    /// Pixel values are multiplied by a factor uniform in [lo, hi].
    pub brightness_range: Option<[f64; 2]>,
}

impl Augment {
    /// Whether any augmentation is on.
    pub fn is_on(&self) -> bool {
        self.horizontal_flip
            || self.vertical_flip
            || self.rotation_range != 0.0
            || self.zoom_range != 0.0
            || self.shear_range != 0.0
            || self.brightness_range.is_some_and(|[lo, hi]| lo != 1.0 || hi != 1.0)
    }

    /// The active augmentations in words, e.g. `horizontal_flip, rotation ±20°`.
    pub fn describe(&self) -> String {
        let mut v = Vec::new();
        if self.horizontal_flip {
            v.push("horizontal_flip".to_string());
        }
        if self.vertical_flip {
            v.push("vertical_flip".to_string());
        }
        if self.rotation_range != 0.0 {
            v.push(format!("rotation ±{}°", self.rotation_range));
        }
        if self.zoom_range != 0.0 {
            v.push(format!("zoom {}–{}", 1.0 - self.zoom_range, 1.0 + self.zoom_range));
        }
        if self.shear_range != 0.0 {
            v.push(format!("shear ±{}°", self.shear_range));
        }
        if let Some([lo, hi]) = self.brightness_range {
            v.push(format!("brightness ×{lo}–{hi}"));
        }
        v.join(", ")
    }

    fn validate(&self) -> Result<(), String> {
        let fin = |v: f64| v.is_finite();
        if !(fin(self.rotation_range) && (0.0..=180.0).contains(&self.rotation_range)) {
            return Err(format!(
                "[augment] rotation_range must be between 0 and 180 degrees, got {}",
                self.rotation_range
            ));
        }
        if !(fin(self.zoom_range) && (0.0..1.0).contains(&self.zoom_range)) {
            return Err(format!(
                "[augment] zoom_range must be in [0, 1) (zoom factors 1 ± zoom_range), got {}",
                self.zoom_range
            ));
        }
        if !(fin(self.shear_range) && (0.0..90.0).contains(&self.shear_range)) {
            return Err(format!("[augment] shear_range must be in [0, 90) degrees, got {}", self.shear_range));
        }
        if let Some([lo, hi]) = self.brightness_range {
            if !(fin(lo) && fin(hi) && 0.0 <= lo && lo <= hi) {
                return Err(format!(
                    "[augment] brightness_range must be [lo, hi] with 0 ≤ lo ≤ hi, e.g. [0.8, 1.2], got [{lo}, {hi}]"
                ));
            }
        }
        Ok(())
    }
}

/// A layer with its inferred output shape (without the batch dimension).
#[derive(Debug, Clone, PartialEq)]
pub struct ShapedLayer {
    pub spec: LayerSpec,
    pub name: String,
    pub output: Vec<usize>,
    pub params: usize,
}

impl ModelConfig {
    /// Parses `text`; `origin` names the file in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<ModelConfig, ConfigError> {
        let cfg: ModelConfig = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
            ConfigError::Parse { path: origin.to_string(), line, column, message: e.message().to_string() }
        })?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<ModelConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Self::parse(&text, &path.display().to_string())
    }

    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |message: String| Err(ConfigError::Invalid { path: origin.to_string(), message });
        if self.layers.is_empty() {
            return bad("no [[layers]]: add at least a final `type = \"dense\"` with `units = \"classes\"`".into());
        }
        if !matches!(self.input.channels, 1 | 3) {
            return bad(format!("[input] channels must be 1 (grayscale) or 3 (RGB), got {}", self.input.channels));
        }
        if self.input.height == 0 || self.input.width == 0 || self.input.height > 4096 || self.input.width > 4096 {
            return bad(format!(
                "[input] height and width must be between 1 and 4096, got {}×{}",
                self.input.height, self.input.width
            ));
        }
        if self.train.batch_size == 0 {
            return bad("[train] batch_size must be at least 1".into());
        }
        if !(self.train.learning_rate > 0.0 && self.train.learning_rate.is_finite()) {
            return bad(format!("[train] learning_rate must be positive, got {}", self.train.learning_rate));
        }
        if self.data.prefetch == 0 {
            return bad("[data] prefetch must be at least 1".into());
        }
        let split = self.data.validation_split;
        if !(split.is_finite() && (0.0..1.0).contains(&split)) {
            return bad(format!("[data] validation_split must be in [0, 1) (e.g. 0.2 = 20% per class), got {split}"));
        }
        if let Err(m) = self.augment.validate() {
            return bad(m);
        }
        for (i, l) in self.layers.iter().enumerate() {
            let n = i + 1;
            match l {
                LayerSpec::Conv2d { filters, kernel_size, strides, .. } => {
                    if *filters == 0 || *kernel_size == 0 || *strides == 0 {
                        return bad(format!("layer {n} (conv2d): filters, kernel_size and strides must be ≥ 1"));
                    }
                }
                LayerSpec::MaxPooling2d { pool_size, strides } | LayerSpec::AveragePooling2d { pool_size, strides } => {
                    if *pool_size == 0 || *strides == Some(0) {
                        return bad(format!("layer {n} ({}): pool_size and strides must be ≥ 1", l.kind()));
                    }
                }
                LayerSpec::Dropout { rate } => {
                    if !(0.0..1.0).contains(rate) {
                        return bad(format!("layer {n} (dropout): rate must be in [0, 1), got {rate}"));
                    }
                }
                LayerSpec::Dense { activation: Activation::Softmax, .. } if n != self.layers.len() => {
                    return bad(format!(
                        "layer {n} (dense): softmax is only supported on the last layer, where it is folded into the loss"
                    ));
                }
                LayerSpec::Flatten {} | LayerSpec::Dense { .. } => {}
            }
        }
        Ok(())
    }

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
            let mut params = 0;
            shape = match spec {
                LayerSpec::Conv2d { filters, kernel_size, strides, padding, .. } => {
                    let [c, h, w] = spatial(&shape, n, spec)?;
                    let oh = conv_out(h, *kernel_size, *strides, *padding);
                    let ow = conv_out(w, *kernel_size, *strides, *padding);
                    if oh == 0 || ow == 0 {
                        return Err(collapse(n, spec, &shape));
                    }
                    params = kernel_size * kernel_size * c * filters + filters;
                    vec![*filters, oh, ow]
                }
                LayerSpec::MaxPooling2d { pool_size, strides } | LayerSpec::AveragePooling2d { pool_size, strides } => {
                    let [c, h, w] = spatial(&shape, n, spec)?;
                    let s = strides.unwrap_or(*pool_size);
                    let oh = conv_out(h, *pool_size, s, Padding::Valid);
                    let ow = conv_out(w, *pool_size, s, Padding::Valid);
                    if oh == 0 || ow == 0 {
                        return Err(collapse(n, spec, &shape));
                    }
                    vec![c, oh, ow]
                }
                LayerSpec::Flatten {} => vec![shape.iter().product()],
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
                    params = shape[0] * u + u;
                    vec![u]
                }
                LayerSpec::Dropout { .. } => shape.clone(),
            };
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

fn spatial(shape: &[usize], n: usize, spec: &LayerSpec) -> Result<[usize; 3], String> {
    match shape {
        [c, h, w] => Ok([*c, *h, *w]),
        _ => Err(format!("layer {n} ({}) needs an image-shaped input, got {:?} (after flatten?)", spec.kind(), shape)),
    }
}

fn collapse(n: usize, spec: &LayerSpec, shape: &[usize]) -> String {
    format!(
        "layer {n} ({}) collapses its input {:?} below 1 pixel: use a larger [input] size, a smaller kernel/pool, or fewer layers",
        spec.kind(),
        shape
    )
}

/// Keras output size: valid = floor((in - k) / s) + 1, same = ceil(in / s).
pub fn conv_out(input: usize, kernel: usize, stride: usize, padding: Padding) -> usize {
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

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, column)
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

    const MINIMAL: &str = "[[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"dense\"\nunits = \"classes\"\n";

    #[test]
    fn example_file_parses_with_the_documented_values() {
        let cfg = ModelConfig::parse(DEFAULT_MODEL, "examples/cnn.toml").unwrap();
        assert_eq!(cfg.input, Input { height: 64, width: 64, channels: 3 });
        assert_eq!(cfg.train.optimizer, OptimizerKind::Adam);
        assert_eq!(cfg.data.workers, Workers::Auto);
        let shapes = cfg.infer_shapes(4).unwrap();
        assert_eq!(shapes.last().unwrap().output, vec![4]);
    }

    #[test]
    fn every_section_but_layers_has_a_default() {
        let cfg = ModelConfig::parse(MINIMAL, "m.toml").unwrap();
        assert_eq!(cfg.input, Input::default());
        assert_eq!(cfg.train, Train::default());
        assert_eq!(cfg.data, Data::default());
        assert_eq!(cfg.train.batch_size, 32);
        assert_eq!(cfg.data.prefetch, 2);
        assert_eq!(cfg.data.seed, 42);
        let shapes = cfg.infer_shapes(3).unwrap();
        assert_eq!(shapes[0].output, vec![3 * 64 * 64]);
        assert_eq!(shapes[1].params, 3 * 64 * 64 * 3 + 3);
    }

    #[test]
    fn layer_defaults_follow_keras() {
        let t = "[[layers]]\ntype=\"conv2d\"\nfilters=4\nkernel_size=3\n[[layers]]\ntype=\"max_pooling2d\"\n";
        let cfg = ModelConfig::parse(t, "m.toml").unwrap();
        assert_eq!(
            cfg.layers[0],
            LayerSpec::Conv2d {
                filters: 4,
                kernel_size: 3,
                strides: 1,
                padding: Padding::Valid,
                activation: Activation::Linear
            }
        );
        assert_eq!(cfg.layers[1], LayerSpec::MaxPooling2d { pool_size: 2, strides: None });
    }

    #[test]
    fn unknown_key_names_file_line_and_column() {
        let t = "[train]\nbatch_size = 8\nepochz = 3\n[[layers]]\ntype = \"flatten\"\n";
        let e = ModelConfig::parse(t, "my.toml").unwrap_err().to_string();
        assert!(e.starts_with("my.toml:3:1:"), "{e}");
        assert!(e.contains("epochz"), "{e}");
    }

    #[test]
    fn unknown_key_inside_a_layer_is_an_error() {
        let t = "[[layers]]\ntype = \"dense\"\nunits = 3\nactivaton = \"relu\"\n";
        let e = ModelConfig::parse(t, "m.toml").unwrap_err().to_string();
        assert!(e.contains("m.toml:") && e.contains("activaton"), "{e}");
    }

    #[test]
    fn bad_values_are_explained() {
        let cases = [
            ("[input]\nchannels = 2\n", "channels must be 1"),
            ("[train]\nbatch_size = 0\n", "batch_size"),
            ("[data]\nworkers = \"many\"\n", "workers must be"),
            ("[data]\nworkers = 0\n", "workers must be at least 1"),
            ("[[layers]]\ntype = \"dropout\"\nrate = 1.5\n", "rate must be in"),
            ("[[layers]]\ntype = \"conv3d\"\n", "conv3d"),
        ];
        for (text, want) in cases {
            let full = format!("{text}{MINIMAL}");
            let e = ModelConfig::parse(&full, "m.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{text:?} → {e}");
        }
        let e = ModelConfig::parse("[train]\nepochs = 1\n", "m.toml").unwrap_err().to_string();
        assert!(e.contains("layers"), "{e}");
    }

    #[test]
    fn shape_collapse_names_the_layer() {
        let t = "[input]\nheight = 8\nwidth = 8\n[[layers]]\ntype=\"conv2d\"\nfilters=2\nkernel_size=5\n\
                 [[layers]]\ntype=\"max_pooling2d\"\npool_size=5\n[[layers]]\ntype=\"flatten\"\n\
                 [[layers]]\ntype=\"dense\"\nunits=\"classes\"\n";
        let cfg = ModelConfig::parse(t, "m.toml").unwrap();
        let e = cfg.infer_shapes(2).unwrap_err();
        assert!(e.contains("layer 2 (max_pooling2d)"), "{e}");
    }

    #[test]
    fn dense_without_flatten_and_wrong_output_are_errors() {
        let t = "[[layers]]\ntype=\"dense\"\nunits=3\n";
        let e = ModelConfig::parse(t, "m.toml").unwrap().infer_shapes(3).unwrap_err();
        assert!(e.contains("flatten"), "{e}");
        let t = "[[layers]]\ntype=\"flatten\"\n[[layers]]\ntype=\"dense\"\nunits=5\n";
        let e = ModelConfig::parse(t, "m.toml").unwrap().infer_shapes(3).unwrap_err();
        assert!(e.contains("3 classes"), "{e}");
    }

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

    #[test]
    fn augment_section_parses_keras_names_and_is_off_by_default() {
        let off = ModelConfig::parse(MINIMAL, "m.toml").unwrap();
        assert!(!off.augment.is_on());
        assert_eq!(off.data.validation_split, 0.0);
        let t = format!(
            "[augment]\nhorizontal_flip = true\nrotation_range = 20\nzoom_range = 0.2\nshear_range = 0.2\n\
             brightness_range = [0.8, 1.2]\n[data]\nvalidation_split = 0.2\n{MINIMAL}"
        );
        let cfg = ModelConfig::parse(&t, "m.toml").unwrap();
        assert!(cfg.augment.is_on() && cfg.augment.horizontal_flip && !cfg.augment.vertical_flip);
        assert_eq!(cfg.augment.rotation_range, 20.0);
        assert_eq!(cfg.augment.brightness_range, Some([0.8, 1.2]));
        assert_eq!(cfg.data.validation_split, 0.2);
    }

    #[test]
    fn unknown_augment_key_names_file_line_and_column() {
        let t = format!("[augment]\nhorizontal_flip = true\nrotation = 20\n{MINIMAL}");
        let e = ModelConfig::parse(&t, "aug.toml").unwrap_err().to_string();
        assert!(e.starts_with("aug.toml:3:1:") && e.contains("rotation"), "{e}");
    }

    #[test]
    fn bad_augment_and_split_values_are_rejected() {
        let cases = [
            ("[augment]\nrotation_range = -5\n", "rotation_range must be between 0 and 180"),
            ("[augment]\nrotation_range = 400\n", "rotation_range must be between 0 and 180"),
            ("[augment]\nzoom_range = 1.0\n", "zoom_range must be in [0, 1)"),
            ("[augment]\nshear_range = 90\n", "shear_range must be in [0, 90)"),
            ("[augment]\nbrightness_range = [1.2, 0.8]\n", "brightness_range must be [lo, hi]"),
            ("[augment]\nbrightness_range = [-1.0, 0.5]\n", "0 ≤ lo ≤ hi"),
            ("[augment]\nbrightness_range = [0.8]\n", "m.toml:2:"),
            ("[augment]\nhorizontal_flip = \"yes\"\n", "m.toml:2:"),
            ("[data]\nvalidation_split = 1.0\n", "validation_split must be in [0, 1)"),
            ("[data]\nvalidation_split = -0.1\n", "validation_split must be in [0, 1)"),
        ];
        for (text, want) in cases {
            let full = format!("{text}{MINIMAL}");
            let e = ModelConfig::parse(&full, "m.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{text:?} → {e}");
        }
    }
}
