//! Validation of a parsed `cnn.toml`: every value in its range, with the accepted range in
//! the message.

use super::{Activation, Augment, ConfigError, LayerSpec, ModelConfig, Units, Workers};
use crate::limits::{in_range, MAX_BATCH_SIZE, MAX_EPOCHS, MAX_PREFETCH, MAX_WORKERS};
/// Largest kernel, pool size or stride (the input is at most 4096 pixels a side).
pub const MAX_KERNEL: usize = 4096;
/// Most filters or units in one layer (2^20).
pub const MAX_UNITS: usize = 1 << 20;

/// The run's worker count in range (`auto` always is).
pub fn workers_in_range(what: &str, w: Workers) -> Result<(), String> {
    match w {
        Workers::Auto => Ok(()),
        Workers::Fixed(n) => in_range(what, n, 1, MAX_WORKERS),
    }
}

impl Augment {
    pub(super) fn validate(&self) -> Result<(), String> {
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

impl ModelConfig {
    pub(super) fn validate(&self, origin: &str) -> Result<(), ConfigError> {
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
        let counts = [
            in_range("[train] batch_size", self.train.batch_size, 1, MAX_BATCH_SIZE),
            in_range("[train] epochs", self.train.epochs, 1, MAX_EPOCHS),
            in_range("[data] prefetch", self.data.prefetch, 1, MAX_PREFETCH),
            workers_in_range("[data] workers", self.data.workers),
        ];
        if let Some(Err(m)) = counts.into_iter().find(Result::is_err) {
            return bad(m);
        }
        if !(self.train.learning_rate > 0.0 && self.train.learning_rate.is_finite()) {
            return bad(format!("[train] learning_rate must be positive, got {}", self.train.learning_rate));
        }
        let split = self.data.validation_split;
        if !(split.is_finite() && (0.0..1.0).contains(&split)) {
            return bad(format!("[data] validation_split must be in [0, 1) (e.g. 0.2 = 20% per class), got {split}"));
        }
        if let Err(m) = self.augment.validate() {
            return bad(m);
        }
        for (i, l) in self.layers.iter().enumerate() {
            if let Err(m) = l.validate(i + 1, i + 1 == self.layers.len()) {
                return bad(m);
            }
        }
        Ok(())
    }
}

impl LayerSpec {
    /// The checks of layer `n` (from 1); `last` when it is the model's last layer.
    fn validate(&self, n: usize, last: bool) -> Result<(), String> {
        match self {
            LayerSpec::Conv2d { filters, kernel_size, strides, .. } => {
                let checks = [
                    in_range(&format!("layer {n} (conv2d): filters"), *filters, 1, MAX_UNITS),
                    in_range(&format!("layer {n} (conv2d): kernel_size"), *kernel_size, 1, MAX_KERNEL),
                    in_range(&format!("layer {n} (conv2d): strides"), *strides, 1, MAX_KERNEL),
                ];
                checks.into_iter().find(Result::is_err).unwrap_or(Ok(()))
            }
            LayerSpec::MaxPooling2d { pool_size, strides } | LayerSpec::AveragePooling2d { pool_size, strides } => {
                let kind = self.kind();
                let checks = [
                    in_range(&format!("layer {n} ({kind}): pool_size"), *pool_size, 1, MAX_KERNEL),
                    in_range(&format!("layer {n} ({kind}): strides"), strides.unwrap_or(1), 1, MAX_KERNEL),
                ];
                checks.into_iter().find(Result::is_err).unwrap_or(Ok(()))
            }
            LayerSpec::Dense { units: Units::Fixed(u), .. } if !(1..=MAX_UNITS).contains(u) => {
                Err(format!("layer {n} (dense): units must be between 1 and {MAX_UNITS}, got {u}"))
            }
            LayerSpec::Dropout { rate } if !(rate.is_finite() && (0.0..1.0).contains(rate)) => {
                Err(format!("layer {n} (dropout): rate must be in [0, 1), got {rate}"))
            }
            LayerSpec::Dense { activation: Activation::Softmax, .. } if !last => Err(format!(
                "layer {n} (dense): softmax is only supported on the last layer, where it is folded into the loss"
            )),
            LayerSpec::Flatten {} | LayerSpec::Dense { .. } | LayerSpec::Dropout { .. } => Ok(()),
        }
    }
}
