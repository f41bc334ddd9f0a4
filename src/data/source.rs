//! Where the loader's samples come from: an ImageFolder (read → decode → resize per image) or
//! a packed cache written by `pipeprof cache` (one copy out of a memory-mapped file).

use super::scan::{scan, Dataset, ScanError};
use crate::cache::{CacheError, Packed};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub enum Source {
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

impl Source {
    /// A folder is scanned; a file is opened as a cache (and verified).
    pub fn open(path: &Path) -> Result<Source, SourceError> {
        if path.is_file() {
            Ok(Source::Packed(Arc::new(Packed::open(path)?)))
        } else {
            Ok(Source::Folder(Arc::new(scan(path)?)))
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Source::Folder(ds) => ds.samples.len(),
            Source::Packed(p) => p.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn classes(&self) -> &[String] {
        match self {
            Source::Folder(ds) => &ds.classes,
            Source::Packed(p) => p.classes(),
        }
    }

    pub fn label(&self, i: usize) -> u32 {
        match self {
            Source::Folder(ds) => ds.samples[i].label,
            Source::Packed(p) => p.label(i),
        }
    }

    /// Sample `i`'s file, for messages.
    pub fn name(&self, i: usize) -> String {
        match self {
            Source::Folder(ds) => ds.samples[i].path.display().to_string(),
            Source::Packed(p) => format!("{}[{}]", p.path().display(), p.name(i)),
        }
    }
}
