//! Validation of a parsed `cnn.toml`: every value in its range, with the accepted range in
//! the message.

use super::{Activation, Augment, ConfigError, LayerSpec, ModelConfig};

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
}
