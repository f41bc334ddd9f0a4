//! A deterministic, learnable demo data set: one class per shape, JPEG and PNG, mixed sizes.

use super::rng::SplitMix;
use image::{ImageFormat, Rgb, RgbImage};
use std::path::{Path, PathBuf};

/// The classes, in label order (sorted, like the scan).
pub const SHAPES: [&str; 6] = ["circle", "cross", "square", "stripes", "triangle", "ring"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoFormat {
    Jpeg,
    Png,
    /// Alternate JPEG and PNG.
    Mixed,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DemoSpec {
    pub classes: usize,
    pub per_class: usize,
    /// Fixed size, or mixed sizes between 48 and 160 pixels when `None`.
    pub size: Option<(u32, u32)>,
    pub format: DemoFormat,
    pub seed: u64,
}

impl Default for DemoSpec {
    fn default() -> Self {
        DemoSpec { classes: 4, per_class: 96, size: None, format: DemoFormat::Mixed, seed: 1 }
    }
}

const MARKER: &str = ".pipeprof-demo";

impl DemoSpec {
    fn fingerprint(&self) -> String {
        format!("{self:?}")
    }

    /// The folder the built-in default data set lives in.
    pub fn default_dir() -> PathBuf {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("pipeprof").join("demo-v2")
    }

    /// Whether `dir` already holds exactly this data set (complete: the marker is written last).
    pub fn is_present(&self, dir: &Path) -> bool {
        std::fs::read_to_string(dir.join(MARKER)).map(|s| s == self.fingerprint()).unwrap_or(false)
    }

    /// Writes the data set into `dir`; returns the number of files written.
    pub fn write(&self, dir: &Path) -> std::io::Result<usize> {
        if self.classes == 0 || self.classes > SHAPES.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("--classes must be between 1 and {}", SHAPES.len()),
            ));
        }
        let mut names: Vec<&str> = SHAPES[..self.classes].to_vec();
        names.sort();
        let mut rng = SplitMix::new(self.seed);
        let mut n = 0;
        for (c, name) in names.iter().enumerate() {
            let sub = dir.join(name);
            std::fs::create_dir_all(&sub)?;
            for i in 0..self.per_class {
                let (w, h) = self.size.unwrap_or_else(|| (48 + rng.below(113) as u32, 48 + rng.below(113) as u32));
                let img = draw(name, w, h, &mut rng);
                let jpeg = match self.format {
                    DemoFormat::Jpeg => true,
                    DemoFormat::Png => false,
                    DemoFormat::Mixed => (i + c) % 2 == 0,
                };
                let (ext, fmt) = if jpeg { ("jpg", ImageFormat::Jpeg) } else { ("png", ImageFormat::Png) };
                let path = sub.join(format!("{name}_{i:04}.{ext}"));
                img.save_with_format(&path, fmt).map_err(std::io::Error::other)?;
                n += 1;
            }
        }
        std::fs::write(dir.join(MARKER), self.fingerprint())?;
        Ok(n)
    }
}

/// A shape on a noisy gradient background; colours random, so only the shape tells the class.
fn draw(shape: &str, w: u32, h: u32, rng: &mut SplitMix) -> RgbImage {
    // Dark backgrounds, bright shapes: colours vary, the contrast does not.
    let bg0 = [rng.below(90) as f32, rng.below(90) as f32, rng.below(90) as f32];
    let bg1 = [rng.below(90) as f32, rng.below(90) as f32, rng.below(90) as f32];
    let fg = [160 + rng.below(96) as u8, 160 + rng.below(96) as u8, 160 + rng.below(96) as u8];
    let m = w.min(h) as f64;
    let r = m * (0.28 + 0.12 * rng.unit());
    let cx = w as f64 * (0.4 + 0.2 * rng.unit());
    let cy = h as f64 * (0.4 + 0.2 * rng.unit());
    let thick = (m * 0.08).max(2.0);
    let mut img = RgbImage::new(w, h);
    for y in 0..h {
        for x in 0..w {
            let t = (x + y) as f32 / (w + h) as f32;
            let noise = rng.below(16) as f32;
            let mut px = [0u8; 3];
            for c in 0..3 {
                px[c] = (bg0[c] * (1.0 - t) + bg1[c] * t + noise).min(255.0) as u8;
            }
            let (dx, dy) = (x as f64 - cx, y as f64 - cy);
            let d = (dx * dx + dy * dy).sqrt();
            let inside = match shape {
                "circle" => d <= r,
                "ring" => (d - r).abs() <= thick,
                "square" => dx.abs() <= r * 0.8 && dy.abs() <= r * 0.8,
                "cross" => (dx.abs() <= thick && dy.abs() <= r) || (dy.abs() <= thick && dx.abs() <= r),
                "stripes" => dx.abs() <= r && dy.abs() <= r && ((x as f64 / thick) as i64) % 2 == 0,
                _ => dy <= r * 0.7 && dy >= -r * 0.8 && dx.abs() <= (dy + r * 0.8) * 0.6,
            };
            if inside {
                px = fg;
            }
            img.put_pixel(x, y, Rgb(px));
        }
    }
    img
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_writes_identical_files_and_marks_completion() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let spec = DemoSpec { classes: 2, per_class: 3, size: Some((32, 24)), format: DemoFormat::Mixed, seed: 5 };
        assert!(!spec.is_present(a.path()));
        assert_eq!(spec.write(a.path()).unwrap(), 6);
        spec.write(b.path()).unwrap();
        assert!(spec.is_present(a.path()));
        let f = "circle/circle_0001.png";
        assert_eq!(std::fs::read(a.path().join(f)).unwrap(), std::fs::read(b.path().join(f)).unwrap());
        let other = DemoSpec { seed: 6, ..spec };
        assert!(!other.is_present(a.path()));
    }
}
