//! The packed cache as a loader source, and the choice between a folder and a cache for
//! `--data`.

use super::{CacheError, Packed};
use crate::data::image::hwc_to_chw;
use crate::data::scan::{scan, Dataset, ScanError};
use crate::data::simulate::extra_for;
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
        if self.shape() != want {
            return Err(format!(
                "{} holds {:?} (H, W, C) images, the loader wants {want:?}",
                self.path().display(),
                self.shape()
            ));
        }
        Ok(())
    }
    /// One cached image: a slice of the mapped file converted straight into the batch (the
    /// `read` span covers the copy, which is also the u8 HWC → f32 CHW conversion; there is
    /// nothing to decode or resize). Cannot fail: every checksum was verified at open.
    fn load(&self, i: u32, ctx: &mut LoadCtx<'_>, out: &mut [f32]) -> Result<(), String> {
        let px = self.pixels(i as usize);
        let span = info_span!("read", step = ctx.step, sample = i, bytes = tracing::field::Empty);
        let _g = span.enter();
        span.record("bytes", px.len() as u64);
        if let Some(link) = ctx.link {
            link.read(px.len());
        }
        if let Some(s) = extra_for(&ctx.cfg.slow, Stage::Read) {
            s.apply();
        }
        let cfg = ctx.cfg;
        hwc_to_chw(px, cfg.channels, cfg.height as usize * cfg.width as usize, out);
        Ok(())
    }
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
