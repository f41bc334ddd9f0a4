//! The packed cache as a loader source, and the choice between a folder and a cache for
//! `--data`.

use super::{CacheError, Packed};
use crate::data::image::hwc_to_chw;
use crate::data::scan::{scan, Dataset, ScanError};
use crate::data::simulate::{Slow, Throttle};
use crate::data::source::{LoadCtx, SampleSource};
use crate::data::LoaderConfig;
use probes::Stage;
use std::path::Path;
use std::sync::Arc;
use tracing::info_span;

impl SampleSource for Packed {
    fn len(&self) -> usize {
        Packed::len(self)
    }
    fn classes(&self) -> &[String] {
        Packed::classes(self)
    }
    fn label(&self, i: usize) -> u32 {
        Packed::label(self, i)
    }
    fn name(&self, i: usize) -> String {
        format!("{}[{}]", self.path().display(), Packed::name(self, i))
    }
    fn check(&self, cfg: &LoaderConfig) -> Result<(), String> {
        let want = (cfg.height, cfg.width, cfg.channels as u32);
        if self.shape().0 == 0 {
            return Err(format!(
                "{} holds images of different sizes, the loader wants {want:?} (H, W, C) for all",
                self.path().display()
            ));
        }
        if self.shape() != want {
            return Err(format!(
                "{} holds {:?} (H, W, C) images, the loader wants {want:?}",
                self.path().display(),
                self.shape()
            ));
        }
        Ok(())
    }
    /// One cached image: read from the file (into the worker's reused buffer) and converted
    /// straight into the batch (the `read` span covers the read and the u8 HWC → f32 CHW
    /// conversion; there is nothing to decode or resize). Fails only when the file changed on
    /// disk since it was opened ([`Packed::read_pixels`]).
    ///
    /// `--throttle-read` and `--slow read=…` simulate the storage the image folder is on; the
    /// packed cache is one local file (that is the advice), so they do not slow it
    /// ([`read_simulation_ignored`]). `--slow decode/resize` have no stage here.
    fn load(&self, i: u32, ctx: &mut LoadCtx<'_>, out: &mut [f32]) -> Result<(), String> {
        let span = info_span!("read", step = ctx.step, sample = i, bytes = tracing::field::Empty);
        let _g = span.enter();
        let px = &mut ctx.scratch.file;
        self.read_pixels(i as usize, px)?;
        span.record("bytes", px.len() as u64);
        let cfg = ctx.cfg;
        hwc_to_chw(px, cfg.channels, cfg.height as usize * cfg.width as usize, out);
        Ok(())
    }
}

/// What a packed cache says about read simulations given with it: `None` when there are
/// none. They model slow storage under an image folder; the cache is a local file, so they are
/// left out (the prediction for the cache, and `--check-advice`'s cache run, assume the same).
pub fn read_simulation_ignored(throttle: Option<&Throttle>, slow: &[Slow]) -> Option<String> {
    let mut what: Vec<String> = throttle.iter().map(|_| "--throttle-read".to_string()).collect();
    what.extend(
        slow.iter()
            .filter(|s| s.stage == Stage::Read)
            .map(|s| format!("--slow read=+{}ms", s.extra.as_secs_f64() * 1e3)),
    );
    (!what.is_empty()).then(|| {
        format!(
            "{} not applied: they simulate the storage of an image folder, and a packed cache is one local file",
            what.join(", ")
        )
    })
}

/// What `--data` named: an image folder, or a packed cache.
#[derive(Debug, Clone)]
pub enum DataSource {
    Folder(Arc<Dataset>),
    Packed(Arc<Packed>),
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

impl DataSource {
    /// A folder is scanned; a file is opened as a cache (and verified).
    pub fn open(path: &Path) -> Result<DataSource, SourceError> {
        if path.is_file() {
            Ok(DataSource::Packed(Arc::new(Packed::open(path)?)))
        } else {
            Ok(DataSource::Folder(Arc::new(scan(path)?)))
        }
    }

    /// The samples, for the loader.
    pub fn samples(&self) -> Arc<dyn SampleSource> {
        match self {
            DataSource::Folder(d) => d.clone(),
            DataSource::Packed(p) => p.clone(),
        }
    }
}
