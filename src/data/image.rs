//! Decode (with limits) and resize one image into the model's f32 CHW layout.

use fast_image_resize as fr;
use image::{DynamicImage, ImageReader};
use std::io::Cursor;

/// Images above this many pixels are refused from their header (decompression bombs).
pub const MAX_PIXELS: u64 = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ImageError {
    #[error("empty file (0 bytes)")]
    Empty,
    #[error("not a JPEG or PNG file (unrecognised header)")]
    UnknownFormat,
    #[error("{width}×{height} = {mp:.0} megapixels exceeds the {limit} MP limit (decompression bomb?): refused before decoding")]
    TooLarge { width: u32, height: u32, mp: f64, limit: u64 },
    #[error("zero-sized image ({0}×{1})")]
    ZeroSize(u32, u32),
    #[error("cannot decode: {0}")]
    Decode(String),
    #[error("cannot resize: {0}")]
    Resize(String),
}

/// Decoded 8-bit pixels, interleaved, 1 or 3 channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pixels {
    pub width: u32,
    pub height: u32,
    pub channels: usize,
    pub data: Vec<u8>,
}

/// Decodes JPEG or PNG bytes into 8-bit pixels with `channels` (1 or 3) channels.
///
/// 16-bit samples are scaled (65535 → 255), grayscale is replicated to RGB, alpha is dropped
/// (as PIL's `convert("RGB")`), palette and CMYK are converted to RGB by the decoders.
pub fn decode(bytes: &[u8], channels: usize) -> Result<Pixels, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    let reader =
        ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(|e| ImageError::Decode(e.to_string()))?;
    let Some(format) = reader.format() else {
        return Err(ImageError::UnknownFormat);
    };
    if !matches!(format, image::ImageFormat::Jpeg | image::ImageFormat::Png) {
        return Err(ImageError::UnknownFormat);
    }
    // Header only: the frame is not allocated until the size is known to be sane.
    let (width, height) = ImageReader::with_format(Cursor::new(bytes), format)
        .into_dimensions()
        .map_err(|e| ImageError::Decode(e.to_string()))?;
    check_size(width, height)?;
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(width);
    limits.max_image_height = Some(height);
    limits.max_alloc = Some(MAX_PIXELS * 8);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| ImageError::Decode(e.to_string()))?;
    Ok(to_pixels(img, channels))
}

fn check_size(width: u32, height: u32) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::ZeroSize(width, height));
    }
    let px = width as u64 * height as u64;
    if px > MAX_PIXELS {
        return Err(ImageError::TooLarge { width, height, mp: px as f64 / 1e6, limit: MAX_PIXELS / (1024 * 1024) });
    }
    Ok(())
}

fn to_pixels(img: DynamicImage, channels: usize) -> Pixels {
    let (width, height) = (img.width(), img.height());
    let data = if channels == 1 { img.into_luma8().into_raw() } else { img.into_rgb8().into_raw() };
    Pixels { width, height, channels: if channels == 1 { 1 } else { 3 }, data }
}

/// Resizes with a reusable `fast_image_resize` resizer and writes f32 CHW in [0, 1].
pub struct Resizer {
    inner: fr::Resizer,
    options: fr::ResizeOptions,
    scratch: Vec<u8>,
}

impl Default for Resizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Resizer {
    pub fn new() -> Self {
        Resizer {
            inner: fr::Resizer::new(),
            options: fr::ResizeOptions::new().resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear)),
            scratch: Vec::new(),
        }
    }

    /// Resizes `px` to `width`×`height` (bilinear, no crop: the aspect ratio is not kept, as
    /// Keras' `image_dataset_from_directory` does by default) into 8-bit interleaved pixels.
    pub fn resize_u8(&mut self, px: &Pixels, width: u32, height: u32) -> Result<&[u8], ImageError> {
        let pt = if px.channels == 1 { fr::PixelType::U8 } else { fr::PixelType::U8x3 };
        let n = width as usize * height as usize * px.channels;
        if px.width == width && px.height == height {
            self.scratch.clear();
            self.scratch.extend_from_slice(&px.data[..n]);
            return Ok(&self.scratch);
        }
        let src = fr::images::ImageRef::new(px.width, px.height, &px.data, pt)
            .map_err(|e| ImageError::Resize(e.to_string()))?;
        self.scratch.resize(n, 0);
        let mut dst = fr::images::Image::from_slice_u8(width, height, &mut self.scratch, pt)
            .map_err(|e| ImageError::Resize(e.to_string()))?;
        self.inner.resize(&src, &mut dst, &self.options).map_err(|e| ImageError::Resize(e.to_string()))?;
        Ok(&self.scratch)
    }

    /// Resizes and writes channel-major f32 in [0, 1] into `out` (len = c·h·w).
    pub fn resize_into(&mut self, px: &Pixels, width: u32, height: u32, out: &mut [f32]) -> Result<(), ImageError> {
        let c = px.channels;
        let plane = width as usize * height as usize;
        let hwc = self.resize_u8(px, width, height)?;
        hwc_to_chw(hwc, c, plane, out);
        Ok(())
    }
}

/// Interleaved u8 (HWC) to planar f32 (CHW) scaled to [0, 1].
pub fn hwc_to_chw(hwc: &[u8], channels: usize, plane: usize, out: &mut [f32]) {
    const INV: f32 = 1.0 / 255.0;
    for (i, px) in hwc.chunks_exact(channels).take(plane).enumerate() {
        for (ch, v) in px.iter().enumerate() {
            out[ch * plane + i] = *v as f32 * INV;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hwc_becomes_chw_scaled_to_unit_range() {
        let hwc = [255u8, 0, 51, 0, 255, 102];
        let mut out = [0f32; 6];
        hwc_to_chw(&hwc, 3, 2, &mut out);
        let want = [1.0, 0.0, 0.0, 1.0, 0.2, 0.4];
        assert!(out.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6), "{out:?}");
    }

    #[test]
    fn size_limits_refuse_zero_and_bombs() {
        assert_eq!(check_size(0, 5), Err(ImageError::ZeroSize(0, 5)));
        assert!(matches!(check_size(100_000, 100_000), Err(ImageError::TooLarge { .. })));
        assert!(check_size(4000, 3000).is_ok());
    }
}
