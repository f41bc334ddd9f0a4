//! A batch sent to the device as u8 and made f32 there: a quarter of the bytes over the link.
//!
//! Every pixel the loader makes is `v as f32 * INV_255` for a byte `v` (decode, resize and
//! augmentation work on bytes; `hwc_to_chw` scales them). [`pack_u8`] finds the bytes again and
//! checks that each gives back exactly the same f32; [`to_f32`] is the same scaling as a tensor
//! operation on the device, so the model sees bit for bit the values of the f32 path.
//!
//! The packing runs on the training thread, over the f32 batch, writing into the page-locked
//! staging buffer: about the cost of the copy into that buffer that the f32 pinned path makes
//! anyway. (The loader making u8 batches itself would save the f32 pass; not done.)

use crate::data::image::INV_255;
use candle_core::{DType, Tensor};

/// The bytes `b` with `b as f32 * INV_255 == v` for every pixel `v`, written into `out`
/// (same length). False (and `out` partly written) when some value is not such a byte's: then
/// the batch goes as f32.
pub fn pack_u8(pixels: &[f32], out: &mut [u8]) -> bool {
    if pixels.len() != out.len() {
        return false;
    }
    let mut exact = true;
    for (o, &v) in out.iter_mut().zip(pixels) {
        // NaN and values outside [0, 1] fail the check below (the cast saturates).
        let b = (v * 255.0).round() as u8;
        *o = b;
        exact &= (b as f32 * INV_255).to_bits() == v.to_bits();
    }
    exact
}

/// A u8 batch as f32 in [0, 1] on its own device: the loader's scaling, as `v * INV_255 + 0`
/// (candle's affine; on the CPU `T::from_f64` gives back INV_255 exactly, and adding 0 to a
/// non-negative product changes nothing; the CUDA kernel computes the same expression, a
/// contracted multiply-add rounding once).
pub fn to_f32(xs: &Tensor) -> candle_core::Result<Tensor> {
    xs.to_dtype(DType::F32)?.affine(f64::from(INV_255), 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::image::hwc_to_chw;
    use candle_core::Device;

    /// Every byte value, as an RGB image of 16×16 (long enough for the AVX2 path of
    /// `hwc_to_chw`), and a gray one.
    fn images() -> Vec<(usize, Vec<u8>)> {
        let rgb: Vec<u8> = (0..16 * 16 * 3).map(|i| ((i * 7 + i / 3) % 256) as u8).collect();
        let gray: Vec<u8> = (0..=255).collect();
        vec![(3, rgb), (1, gray)]
    }

    #[test]
    fn u8_made_f32_on_the_device_is_bit_identical_to_the_loaders_f32() {
        for (c, hwc) in images() {
            let plane = hwc.len() / c;
            let mut loader_f32 = vec![0f32; hwc.len()];
            hwc_to_chw(&hwc, c, plane, &mut loader_f32);
            let mut bytes = vec![0u8; hwc.len()];
            assert!(pack_u8(&loader_f32, &mut bytes), "{c} channels");
            let xs = Tensor::from_vec(bytes, (1, c, plane), &Device::Cpu).unwrap();
            let ys = to_f32(&xs).unwrap();
            assert_eq!(ys.dtype(), DType::F32);
            assert_eq!(ys.dims(), &[1, c, plane]);
            let got: Vec<u32> =
                ys.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = loader_f32.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "{c} channels");
        }
    }

    /// The loader's own batches, from the demo set's JPEGs and PNGs of mixed sizes, plain and
    /// augmented (rotation, zoom, brightness: the paths that make pixels in other ways): each
    /// packs to bytes, and the bytes made f32 again are the batch bit for bit.
    #[test]
    fn every_batch_the_loader_makes_goes_as_bytes_and_comes_back_bit_identical() {
        use crate::data::{demo::DemoSpec, scan, Loader, LoaderConfig};
        use pipeprof_core::config::Augment;
        let d = tempfile::tempdir().unwrap();
        DemoSpec { classes: 2, per_class: 6, ..DemoSpec::default() }.write(d.path()).unwrap();
        let ds = std::sync::Arc::new(scan(d.path()).unwrap());
        let augmented = Augment {
            horizontal_flip: true,
            rotation_range: 20.0,
            zoom_range: 0.2,
            brightness_range: Some([0.5, 1.5]),
            ..Augment::default()
        };
        for augment in [Augment::default(), augmented] {
            let cfg = LoaderConfig { height: 24, width: 20, batch_size: 5, augment, ..LoaderConfig::default() };
            let (probe, _rx) = probes::Probe::new(1 << 12);
            let mut loader = Loader::start(ds.clone(), cfg, probe).unwrap();
            let mut batches = 0;
            while let Some(b) = loader.next_batch() {
                let mut bytes = vec![0u8; b.pixels.len()];
                assert!(pack_u8(&b.pixels, &mut bytes), "step {}", b.step);
                let xs = Tensor::from_vec(bytes, (b.len(), 3, 24, 20), &Device::Cpu).unwrap();
                let back = to_f32(&xs).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert!(back.iter().zip(&b.pixels).all(|(x, y)| x.to_bits() == y.to_bits()), "step {}", b.step);
                batches += 1;
            }
            assert_eq!(batches, 3);
        }
    }

    #[test]
    fn packing_finds_the_bytes_in_channel_major_order() {
        let hwc = [10u8, 20, 30, 40, 50, 60]; // two RGB pixels
        let mut chw = [0f32; 6];
        hwc_to_chw(&hwc, 3, 2, &mut chw);
        let mut out = [0u8; 6];
        assert!(pack_u8(&chw, &mut out));
        assert_eq!(out, [10, 40, 20, 50, 30, 60]);
    }

    #[test]
    fn values_no_byte_gives_are_refused() {
        for bad in [0.5f32, -INV_255, 1.0 + f32::EPSILON, f32::NAN, 2.0, 100.0 * INV_255 + 1e-6] {
            let mut out = [0u8; 2];
            assert!(!pack_u8(&[INV_255, bad], &mut out), "{bad}");
        }
        assert!(!pack_u8(&[0.0; 3], &mut [0u8; 2]), "lengths differ");
        assert!(pack_u8(&[0.0, 255.0 * INV_255], &mut [9u8; 2]));
    }
}
