//! The image folder as a [`SampleSource`]: each sample read from its file (capped in size),
//! decoded, resized and, when on, augmented into the batch, a span per stage; the loader
//! knows only the trait, as it knows the packed cache's (`cache/source.rs`).

use super::augment;
use super::image::{decode_for_keeping_gray, decode_for_reusing, hwc_to_chw};
use super::loader::{at, panic_injected_at};
use super::plan::LoaderConfig;
use super::scan::Dataset;
use super::simulate::{extra_for, SlowLink};
use super::source::{LoadCtx, SampleSource, Scratch};
use probes::Stage;
use tracing::info_span;

/// Largest image file read: its size is checked before anything is read, so a 4 GB file
/// named `.jpg` costs a message, not the memory.
pub const MAX_IMAGE_BYTES: u64 = 256 << 20;

/// Reads `path` whole if it is a regular file of at most `max` bytes; the error says which
/// limit and the size.
pub fn read_capped(path: &std::path::Path, max: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    read_capped_into(path, max, &mut bytes)?;
    Ok(bytes)
}

/// As [`read_capped`], into `bytes` (cleared first; its capacity is reused from one file to
/// the next, so a worker does not allocate and fault in a new buffer per image).
fn read_capped_into(path: &std::path::Path, max: u64, bytes: &mut Vec<u8>) -> Result<(), String> {
    use std::io::Read;
    bytes.clear();
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let m = f.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !m.is_file() {
        return Err("not a regular file: skipped".into());
    }
    if m.len() > max {
        return Err(format!(
            "{:.1} MB, over the {} MB limit for one image file: skipped",
            m.len() as f64 / 1e6,
            max >> 20
        ));
    }
    // One spare byte: a file read whole ends on the read that returns 0, without the probe
    // read and the regrowth `read_to_end` does for an exactly-sized buffer.
    bytes.reserve(m.len() as usize + 1);
    // `take`: a file that grows while being read still stops at the limit.
    f.take(max + 1).read_to_end(bytes).map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("grew past the {} MB limit for one image file while read: skipped", max >> 20));
    }
    Ok(())
}

/// Which sample a worker is loading, for spans and augmentation seeds.
#[derive(Clone, Copy)]
struct Where {
    step: u64,
    epoch: u32,
    sample: u32,
}

fn load_one(
    link: Option<&SlowLink>,
    path: &std::path::Path,
    at: Where,
    cfg: &LoaderConfig,
    scratch: &mut Scratch,
    out: &mut [f32],
) -> Result<(), String> {
    let px = load_pixels(link, path, at, cfg, scratch, out);
    // The decoded buffer goes back to the worker's scratch for the next image; a worker keeps
    // no more than KEEP_BYTES of either buffer after one huge image.
    if scratch.file.capacity() > KEEP_BYTES {
        scratch.file = Vec::new();
    }
    if let Some(px) = px? {
        if px.capacity() <= KEEP_BYTES {
            scratch.pixels = px;
        }
    }
    Ok(())
}

/// Largest read or decode buffer a worker keeps for the next image.
const KEEP_BYTES: usize = 16 << 20;

/// The delay `--simulate` adds to `stage`, if any.
fn slow_down(cfg: &LoaderConfig, stage: Stage) {
    if let Some(s) = extra_for(&cfg.slow, stage) {
        s.apply();
    }
}

/// The `read` span of [`load_pixels`]: `path`'s bytes into `bytes`, through the simulated link
/// and slowdown where the run has them.
fn read_file(
    link: Option<&SlowLink>,
    path: &std::path::Path,
    (step, sample): (u64, u32),
    cfg: &LoaderConfig,
    bytes: &mut Vec<u8>,
) -> Result<(), String> {
    at(Stage::Read);
    let span = info_span!("read", step, sample, bytes = tracing::field::Empty);
    let _g = span.enter();
    read_capped_into(path, MAX_IMAGE_BYTES, bytes)?;
    span.record("bytes", bytes.len() as u64);
    if let Some(link) = link {
        link.read(bytes.len());
    }
    slow_down(cfg, Stage::Read);
    Ok(())
}

/// read → decode → resize (→ augment) into `out`; the decoded pixels' buffer, when there is
/// one, is returned for reuse.
fn load_pixels(
    link: Option<&SlowLink>,
    path: &std::path::Path,
    Where { step, epoch, sample }: Where,
    cfg: &LoaderConfig,
    scratch: &mut Scratch,
    out: &mut [f32],
) -> Result<Option<Vec<u8>>, String> {
    let aug = cfg.augment.is_on().then_some(&mut scratch.augment);
    let resizer = &mut scratch.resizer;
    read_file(link, path, (step, sample), cfg, &mut scratch.file)?;
    let bytes = &scratch.file;
    let px = {
        at(Stage::Decode);
        let _g = info_span!("decode", step, sample).entered();
        #[allow(clippy::panic)]
        if panic_injected_at(step) {
            panic!("--panic-in-loader-at-step {step}: injected panic (testing hook)");
        }
        slow_down(cfg, Stage::Decode);
        let reuse = std::mem::take(&mut scratch.pixels);
        // A grayscale JPEG stays one channel through the resize (no augmentation: that
        // works on the channels the model gets).
        if cfg.channels == 3 && aug.is_none() {
            decode_for_keeping_gray(bytes, cfg.width, cfg.height, reuse)
        } else {
            decode_for_reusing(bytes, cfg.channels, cfg.width, cfg.height, reuse)
        }
        .map_err(|e| e.to_string())?
    };
    let Some(buf) = aug else {
        at(Stage::Resize);
        let _g = info_span!("resize", step, sample).entered();
        slow_down(cfg, Stage::Resize);
        resizer.resize_into_rgb(&px, cfg.width, cfg.height, out).map_err(|e| e.to_string())?;
        return Ok(Some(px.data));
    };
    let hwc = {
        at(Stage::Resize);
        let _g = info_span!("resize", step, sample).entered();
        slow_down(cfg, Stage::Resize);
        resizer.resize_u8(&px, cfg.width, cfg.height).map_err(|e| e.to_string())?
    };
    // The f32 conversion resize does otherwise happens here, on the augmented pixels.
    at(Stage::Augment);
    let _g = info_span!("augment", step, sample).entered();
    slow_down(cfg, Stage::Augment);
    let (w, h, c) = (cfg.width as usize, cfg.height as usize, px.channels);
    buf.resize(hwc.len(), 0);
    let p = augment::sample(&cfg.augment, cfg.seed, epoch, sample);
    augment::apply(hwc, w, h, c, &p, buf);
    hwc_to_chw(buf, c, w * h, out);
    Ok(Some(px.data))
}

impl SampleSource for Dataset {
    fn len(&self) -> usize {
        self.samples.len()
    }
    fn classes(&self) -> &[String] {
        &self.classes
    }
    fn label(&self, i: usize) -> u32 {
        self.samples[i].label
    }
    fn name(&self, i: usize) -> String {
        self.samples[i].path.display().to_string()
    }
    fn load(&self, i: u32, ctx: &mut LoadCtx<'_>, out: &mut [f32]) -> Result<(), String> {
        let at = Where { step: ctx.step, epoch: ctx.epoch, sample: i };
        load_one(ctx.link, &self.samples[i as usize].path, at, ctx.cfg, ctx.scratch, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_over_the_cap_is_refused_before_it_is_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("big.jpg");
        std::fs::write(&p, vec![7u8; 3000]).unwrap();
        assert_eq!(read_capped(&p, 3000).unwrap().len(), 3000);
        let e = read_capped(&p, 2999).unwrap_err();
        assert!(e.contains("over the") && e.contains("skipped"), "{e}");
        let e = read_capped(&d.path().join("missing.jpg"), 10).unwrap_err();
        assert!(e.starts_with("cannot read:"), "{e}");
        assert!(read_capped(d.path(), 10).unwrap_err().contains("not a regular file"));
    }
}
