//! Random augmentations (Keras `ImageDataGenerator` names) on one resized image.
//!
//! They run in the loader worker on the resized 8-bit interleaved (HWC) image, between resize
//! and the f32 CHW conversion: the image is already at the model's input size (usually far
//! smaller than the file), so every per-pixel operation costs the least there, and u8 pixels
//! are a quarter of the f32 bytes. Keras does the same (it augments the loaded, resized array).
//!
//! Rotation, zoom and shear are combined into one inverse affine map around the image centre,
//! sampled bilinearly; points outside the image take the nearest edge pixel (Keras' default
//! `fill_mode="nearest"`). Flips and brightness follow, in Keras' order.
//!
//! The parameters of sample `i` in epoch `e` are drawn from a SplitMix64 seeded from
//! (seed, epoch, sample): a run is reproducible whatever the worker count or timing.

use super::rng::SplitMix;
use pipeprof_core::config::Augment;

/// The sampled parameters of one augmentation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    pub flip_h: bool,
    pub flip_v: bool,
    /// Counter-clockwise, degrees.
    pub angle_deg: f64,
    /// Input pixels per output pixel on each axis: below 1 zooms in (as Keras).
    pub zoom_x: f64,
    pub zoom_y: f64,
    /// Shear angle, degrees.
    pub shear_deg: f64,
    /// Pixel values are multiplied by this (then clamped to 255).
    pub brightness: f64,
}

impl Params {
    /// No change.
    pub const IDENTITY: Params = Params {
        flip_h: false,
        flip_v: false,
        angle_deg: 0.0,
        zoom_x: 1.0,
        zoom_y: 1.0,
        shear_deg: 0.0,
        brightness: 1.0,
    };

    fn has_affine(&self) -> bool {
        self.angle_deg != 0.0 || self.zoom_x != 1.0 || self.zoom_y != 1.0 || self.shear_deg != 0.0
    }
}

/// The parameters of `sample` in `epoch`: deterministic for (seed, epoch, sample). Every draw
/// is made whether its augmentation is on or not, so turning one on does not change the others.
pub fn sample(cfg: &Augment, seed: u64, epoch: u32, sample: u32) -> Params {
    let key = ((epoch as u64) << 32) | sample as u64;
    let mut rng = SplitMix::new(seed.wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    // Warm up: nearby keys give unrelated first draws.
    rng.next_u64();
    let mut sym = |r: f64| (rng.unit() * 2.0 - 1.0) * r;
    let flip_h = sym(1.0) < 0.0;
    let flip_v = sym(1.0) < 0.0;
    let angle = sym(cfg.rotation_range);
    let zx = 1.0 + sym(cfg.zoom_range);
    let zy = 1.0 + sym(cfg.zoom_range);
    let shear = sym(cfg.shear_range);
    let unit = (sym(1.0) + 1.0) / 2.0;
    let brightness = cfg.brightness_range.map_or(1.0, |[lo, hi]| lo + (hi - lo) * unit);
    Params {
        flip_h: cfg.horizontal_flip && flip_h,
        flip_v: cfg.vertical_flip && flip_v,
        angle_deg: angle,
        zoom_x: zx,
        zoom_y: zy,
        shear_deg: shear,
        brightness,
    }
}

/// Applies `p` to `src` (`width`×`height`, `channels` interleaved u8) into `out` (same size).
pub fn apply(src: &[u8], width: usize, height: usize, channels: usize, p: &Params, out: &mut [u8]) {
    let n = width * height * channels;
    if n == 0 || src.len() < n || out.len() < n {
        return;
    }
    let (src, out) = (&src[..n], &mut out[..n]);
    if p.has_affine() {
        affine(src, width, height, channels, p, out);
    } else {
        flips(src, width, height, channels, p, out);
    }
    if p.brightness != 1.0 {
        let k = p.brightness as f32;
        for v in out.iter_mut() {
            *v = (*v as f32 * k).round().clamp(0.0, 255.0) as u8;
        }
    }
}

/// Output (x, y) before the flips: flipping the output is reading the mirrored position.
#[inline]
fn unflip(x: usize, y: usize, width: usize, height: usize, p: &Params) -> (usize, usize) {
    (if p.flip_h { width - 1 - x } else { x }, if p.flip_v { height - 1 - y } else { y })
}

fn flips(src: &[u8], width: usize, height: usize, c: usize, p: &Params, out: &mut [u8]) {
    if !p.flip_h && !p.flip_v {
        out.copy_from_slice(src);
        return;
    }
    for y in 0..height {
        for x in 0..width {
            let (sx, sy) = unflip(x, y, width, height, p);
            let (o, s) = ((y * width + x) * c, (sy * width + sx) * c);
            out[o..o + c].copy_from_slice(&src[s..s + c]);
        }
    }
}

/// Output pixel (x, y) reads the input at centre + M·((x, y) − centre), with
/// M = rotation⁻¹ · shear · zoom in image coordinates (y down). A counter-clockwise rotation
/// (as displayed) by θ reads the input at (dx·cosθ − dy·sinθ, dx·sinθ + dy·cosθ).
fn affine(src: &[u8], width: usize, height: usize, c: usize, p: &Params, out: &mut [u8]) {
    let (sin, cos) = p.angle_deg.to_radians().sin_cos();
    let (ssin, scos) = p.shear_deg.to_radians().sin_cos();
    // zoom, then shear [[1, -sin s], [0, cos s]], then the inverse rotation.
    let (a, b) = (p.zoom_x, -ssin * p.zoom_y);
    let (cc, d) = (0.0, scos * p.zoom_y);
    let m00 = cos * a - sin * cc;
    let m01 = cos * b - sin * d;
    let m10 = sin * a + cos * cc;
    let m11 = sin * b + cos * d;
    let (cx, cy) = ((width as f64 - 1.0) / 2.0, (height as f64 - 1.0) / 2.0);
    let (maxx, maxy) = ((width - 1) as f64, (height - 1) as f64);
    for y in 0..height {
        for x in 0..width {
            let (ux, uy) = unflip(x, y, width, height, p);
            let (dx, dy) = (ux as f64 - cx, uy as f64 - cy);
            // Nearest-edge fill: clamp the source position into the image.
            let sx = (cx + m00 * dx + m01 * dy).clamp(0.0, maxx);
            let sy = (cy + m10 * dx + m11 * dy).clamp(0.0, maxy);
            let (x0, y0) = (sx.floor() as usize, sy.floor() as usize);
            let (x1, y1) = ((x0 + 1).min(width - 1), (y0 + 1).min(height - 1));
            let (fx, fy) = ((sx - x0 as f64) as f32, (sy - y0 as f64) as f32);
            let o = (y * width + x) * c;
            for ch in 0..c {
                let at = |xx: usize, yy: usize| src[(yy * width + xx) * c + ch] as f32;
                let top = at(x0, y0) + (at(x1, y0) - at(x0, y0)) * fx;
                let bottom = at(x0, y1) + (at(x1, y1) - at(x0, y1)) * fx;
                out[o + ch] = (top + (bottom - top) * fy).round().clamp(0.0, 255.0) as u8;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `w`×`h` grayscale ramp: pixel (x, y) = y·w + x.
    fn ramp(w: usize, h: usize) -> Vec<u8> {
        (0..w * h).map(|i| i as u8).collect()
    }

    fn run(src: &[u8], w: usize, h: usize, c: usize, p: Params) -> Vec<u8> {
        let mut out = vec![0u8; src.len()];
        apply(src, w, h, c, &p, &mut out);
        out
    }

    #[test]
    fn horizontal_flip_reverses_columns() {
        let (w, h) = (4, 3);
        let out = run(&ramp(w, h), w, h, 1, Params { flip_h: true, ..Params::IDENTITY });
        for y in 0..h {
            let row: Vec<u8> = (0..w).rev().map(|x| (y * w + x) as u8).collect();
            assert_eq!(&out[y * w..(y + 1) * w], &row[..], "row {y}");
        }
    }

    #[test]
    fn vertical_flip_reverses_rows_and_keeps_channels_together() {
        let (w, h) = (2, 3);
        // RGB: each pixel's channels are (i, i + 100, i + 200).
        let src: Vec<u8> = (0..w * h).flat_map(|i| [i as u8, i as u8 + 100, i as u8 + 200]).collect();
        let out = run(&src, w, h, 3, Params { flip_v: true, ..Params::IDENTITY });
        for y in 0..h {
            for x in 0..w {
                let i = ((h - 1 - y) * w + x) as u8;
                assert_eq!(&out[(y * w + x) * 3..(y * w + x) * 3 + 3], &[i, i + 100, i + 200]);
            }
        }
    }

    #[test]
    fn rotation_by_90_degrees_moves_the_top_left_marker_to_the_bottom_left() {
        let n = 5;
        let mut src = vec![0u8; n * n];
        src[0] = 255; // top-left marker
        let out = run(&src, n, n, 1, Params { angle_deg: 90.0, ..Params::IDENTITY });
        // Counter-clockwise: top-left → bottom-left; everything else stays black.
        assert_eq!(out[(n - 1) * n], 255, "{out:?}");
        assert_eq!(out.iter().filter(|v| **v != 0).count(), 1, "{out:?}");
        // And the whole ramp is rotated: output (x, y) = input (n-1-y, x).
        let r = ramp(n, n);
        let out = run(&r, n, n, 1, Params { angle_deg: 90.0, ..Params::IDENTITY });
        for y in 0..n {
            for x in 0..n {
                assert_eq!(out[y * n + x], r[x * n + (n - 1 - y)], "({x}, {y})");
            }
        }
    }

    #[test]
    fn sampled_parameters_stay_in_range_and_off_augmentations_stay_off() {
        // The angle is uniform in [-r, r]; flips, zoom and brightness are off.
        let cfg = Augment { rotation_range: 90.0, ..Default::default() };
        for i in 0..200 {
            let p = sample(&cfg, 1, 0, i);
            assert!(p.angle_deg.abs() <= 90.0 && !p.flip_h && p.zoom_x == 1.0 && p.brightness == 1.0, "{p:?}");
        }
    }

    #[test]
    fn zoom_and_shear_keep_the_centre_pixel() {
        let n = 7;
        let r = ramp(n, n);
        let centre = (n / 2) * n + n / 2;
        for p in [
            Params { zoom_x: 0.7, zoom_y: 1.3, ..Params::IDENTITY },
            Params { shear_deg: 20.0, ..Params::IDENTITY },
            Params { angle_deg: 33.0, zoom_x: 0.8, zoom_y: 0.8, shear_deg: -10.0, ..Params::IDENTITY },
        ] {
            let out = run(&r, n, n, 1, p);
            assert_eq!(out[centre], r[centre], "{p:?}");
        }
        // Zooming in (factor < 1) magnifies: the pixel next to the centre moves towards it.
        let out = run(&r, n, n, 1, Params { zoom_x: 0.5, zoom_y: 1.0, ..Params::IDENTITY });
        let right = r[centre] as f32 + 0.5;
        assert_eq!(out[centre + 1] as f32, right.round(), "{out:?}");
    }

    #[test]
    fn brightness_scales_and_clamps() {
        let src = [0u8, 10, 100, 200, 255];
        assert_eq!(run(&src, 5, 1, 1, Params { brightness: 1.5, ..Params::IDENTITY }), [0, 15, 150, 255, 255]);
        assert_eq!(run(&src, 5, 1, 1, Params { brightness: 0.5, ..Params::IDENTITY }), [0, 5, 50, 100, 128]);
    }

    #[test]
    fn identity_copies_the_image() {
        let r = ramp(6, 4);
        assert_eq!(run(&r, 6, 4, 1, Params::IDENTITY), r);
    }

    #[test]
    fn same_seed_same_output_other_seed_other_params() {
        let cfg = Augment {
            horizontal_flip: true,
            vertical_flip: true,
            rotation_range: 20.0,
            zoom_range: 0.2,
            shear_range: 10.0,
            brightness_range: Some([0.8, 1.2]),
        };
        let a = sample(&cfg, 42, 3, 17);
        assert_eq!(a, sample(&cfg, 42, 3, 17));
        assert_ne!(a, sample(&cfg, 43, 3, 17), "another seed");
        assert_ne!(a, sample(&cfg, 42, 4, 17), "another epoch");
        assert_ne!(a, sample(&cfg, 42, 3, 18), "another sample");
        assert!(a.angle_deg.abs() <= 20.0 && (0.8..=1.2).contains(&a.zoom_x) && (0.8..=1.2).contains(&a.brightness));
        let src: Vec<u8> = (0..16 * 16 * 3).map(|i| (i * 7 % 256) as u8).collect();
        assert_eq!(run(&src, 16, 16, 3, a), run(&src, 16, 16, 3, sample(&cfg, 42, 3, 17)));
        // Flips happen about half the time.
        let flips = (0..1000).filter(|i| sample(&cfg, 42, 0, *i).flip_h).count();
        assert!((400..600).contains(&flips), "{flips}");
    }
}
