//! The input pipeline: ImageFolder scan (or a packed cache), decode, resize, batches.

pub mod augment;
pub mod demo;
pub mod image;
pub mod loader;
pub mod scan;
pub mod simulate;
pub mod source;
pub mod split;

pub use loader::{Batch, Loader, LoaderConfig};
pub use scan::{scan, Dataset};
pub use source::Source;
