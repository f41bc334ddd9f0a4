//! Where the loader's samples come from. The loader knows one trait, [`SampleSource`]: an
//! ImageFolder ([`Dataset`](super::Dataset): read → decode → resize per image) and the packed
//! cache (`cache::Packed`: one read per image) both implement it, each emitting its
//! own stage spans.

use super::image::Resizer;
use super::plan::LoaderConfig;
use super::simulate::SlowLink;

/// Per-worker buffers a source may reuse from one sample to the next.
#[derive(Default)]
pub struct Scratch {
    pub resizer: Resizer,
    /// The resized u8 image before augmentation (augmentation on only).
    pub augment: Vec<u8>,
    /// The file's bytes, read into the same buffer each time.
    pub file: Vec<u8>,
    /// The decoded pixels' buffer, handed to the JPEG decoder again for the next image.
    pub pixels: Vec<u8>,
}

/// Which sample a worker is loading, and how: for spans, augmentation seeds and simulations.
pub struct LoadCtx<'a> {
    pub step: u64,
    pub epoch: u32,
    pub cfg: &'a LoaderConfig,
    /// Simulated slow storage shared by the workers (--throttle-read).
    pub link: Option<&'a SlowLink>,
    pub scratch: &'a mut Scratch,
}

/// A numbered set of labelled samples the loader can turn into batches.
pub trait SampleSource: Send + Sync + std::fmt::Debug {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Class names, indexed by label.
    fn classes(&self) -> &[String];
    fn label(&self, i: usize) -> u32;
    /// Sample `i`'s file, for messages.
    fn name(&self, i: usize) -> String;
    /// Whether this source can give `cfg`'s images (a packed cache holds one size only).
    fn check(&self, _cfg: &LoaderConfig) -> Result<(), String> {
        Ok(())
    }
    /// Loads sample `i` as f32 CHW in [0, 1] into `out`, inside its stage spans; the reason
    /// when the sample cannot be used.
    fn load(&self, i: u32, ctx: &mut LoadCtx<'_>, out: &mut [f32]) -> Result<(), String>;
}
