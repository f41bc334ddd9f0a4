//! `cnn.toml`: a Keras-like model and training description.
//!
//! Every section and key has a default except `[[layers]]`. Unknown keys are errors that
//! name the file, line and column. Values are range-checked in [`validate`]; each layer's shape
//! and parameter count are inferred in [`shapes`] (pure, no tensor; `train::shapes` re-exports it).

pub mod shapes;
pub mod validate;

use crate::model_source::ModelSource;
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// The model used when no `--model` is given (the same text as `examples/cnn.toml`).
pub const DEFAULT_MODEL: &str = include_str!("../../../examples/cnn.toml");

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

/// A TOML value that may be a number or a word (`units = 10` or `units = "classes"`).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrText {
    N(i64),
    S(String),
    // Past i64 (TOML integers are i64, serde may still hand over a u64).
    U(u64),
    // Anything else (a float, a table): refused with the range.
    Other(toml::Value),
}

impl<'de> Deserialize<'de> for Units {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let range = "units must be a whole number from 1 to 1048576, or \"classes\"";
        match NumOrText::deserialize(d)? {
            NumOrText::N(n) if n > 0 => Ok(Units::Fixed(n as usize)),
            NumOrText::N(n) => Err(serde::de::Error::custom(format!("{range}, got {n}"))),
            NumOrText::S(s) if s == "classes" => Ok(Units::Classes),
            NumOrText::S(s) => Err(serde::de::Error::custom(format!("{range}, got \"{s}\""))),
            NumOrText::U(u) => Err(serde::de::Error::custom(format!("{range}, got {u}"))),
            NumOrText::Other(v) => Err(serde::de::Error::custom(format!("{range}, got {v}"))),
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
        match NumOrText::deserialize(d)? {
            NumOrText::N(n) if n > 0 => Ok(Workers::Fixed(n as usize)),
            NumOrText::N(n) => Err(serde::de::Error::custom(format!("workers must be at least 1, got {n}"))),
            NumOrText::S(s) => s.parse().map_err(serde::de::Error::custom),
            NumOrText::U(u) => {
                Err(serde::de::Error::custom(format!("workers must be \"auto\" or from 1 to 1024, got {u}")))
            }
            NumOrText::Other(v) => {
                Err(serde::de::Error::custom(format!("workers must be \"auto\" or from 1 to 1024, got {v}")))
            }
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
}

impl ModelConfig {
    /// Parses `text`; `origin` names the file in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<ModelConfig, ConfigError> {
        let cfg: ModelConfig = toml::from_str(text).map_err(|e| {
            let (offset, message) = match layer_error(text) {
                Some((offset, message)) => (Some(offset), message),
                None => (e.span().map(|s| s.start), e.message().to_string()),
            };
            let (line, column) = offset.map(|o| line_col(text, o)).unwrap_or((1, 1));
            ConfigError::Parse { path: origin.to_string(), line, column, message }
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
}

/// The first `[[layers]]` entry that does not parse: where (the offending key, else the
/// layer's first key) and "layer N (type): key: why". TOML points every error inside the
/// layer list at the list's first header, which names no layer and no key.
fn layer_error(text: &str) -> Option<(usize, String)> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let layers = table.get("layers")?.as_array()?;
    // The same document with spans: where each layer's keys are written.
    let spanned = toml::de::DeTable::parse(text).ok()?;
    let spanned_layers = spanned.get_ref().get("layers")?.get_ref().as_array()?;
    layers.iter().enumerate().find_map(|(i, l)| {
        let kind = l.get("type").and_then(|t| t.as_str()).unwrap_or("?");
        let why = l.clone().try_into::<LayerSpec>().err()?.message().to_string();
        // The value's error names no key: the key is the one whose removal changes the error
        // (a bad value fails where it is read; a missing key only at the end).
        let key = l.as_table()?.keys().filter(|k| *k != "type").find(|k| {
            let mut t = l.as_table().cloned().unwrap_or_default();
            t.remove(*k);
            toml::Value::Table(t).try_into::<LayerSpec>().map_err(|e| e.message().to_string()).err().as_ref()
                != Some(&why)
        });
        let keys = spanned_layers.get(i)?.get_ref().as_table()?;
        let at = |name: &str| keys.keys().find(|k| k.get_ref() == name).map(|k| k.span().start);
        let offset =
            key.and_then(|k| at(k)).or_else(|| at("type")).or_else(|| keys.keys().map(|k| k.span().start).min())?;
        Some((
            offset,
            match key {
                Some(k) => format!("layer {} ({kind}): {k}: {why}", i + 1),
                None => format!("layer {} ({kind}): {why}", i + 1),
            },
        ))
    })
}

/// The model file, or the built-in default; with where it came from (its `Display` is the
/// name messages and reports use).
pub fn load_model(model: Option<&Path>) -> Result<(ModelConfig, ModelSource), ConfigError> {
    match model {
        Some(p) => Ok((ModelConfig::load(p)?, ModelSource::File(p.to_path_buf()))),
        None => Ok((ModelConfig::parse(DEFAULT_MODEL, &ModelSource::BuiltIn.name())?, ModelSource::BuiltIn)),
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, column)
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
    fn layer_errors_and_top_level_errors_both_give_line_and_column() {
        // (text, where the error must point, what it must say)
        let cases = [
            (
                "[[layers]]\ntype = \"flatten\"\n[[layers]]\ntype = \"conv2d\"\nfilters = 4\n  kernal_size = 3\n",
                "m.toml:6:3:",
                "layer 2 (conv2d): kernal_size: unknown field",
            ),
            ("[[layers]]\ntype = \"dropout\"\nrate = \"x\"\n", "m.toml:3:1:", "layer 1 (dropout): rate:"),
            ("[[layers]]\ntype = \"conv3d\"\n", "m.toml:2:1:", "layer 1 (conv3d)"),
            ("[train]\nbatch_size = 8\nepochz = 3\n[[layers]]\ntype = \"flatten\"\n", "m.toml:3:1:", "epochz"),
        ];
        for (text, at, says) in cases {
            let e = ModelConfig::parse(text, "m.toml").unwrap_err().to_string();
            assert!(e.starts_with(at), "{text:?}: {e}");
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    /// Each `(section, message)`: the section before a minimal model is refused with `message`.
    fn assert_each_refused(cases: &[(&str, &str)]) {
        for (text, want) in cases {
            let full = format!("{text}{MINIMAL}");
            let e = ModelConfig::parse(&full, "m.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{text:?} → {e}");
        }
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
        assert_each_refused(&cases);
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
        assert_each_refused(&cases);
    }
}
