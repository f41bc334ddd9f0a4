//! The input pipeline: ImageFolder scan, decode, resize, batches. The loader reads through
//! [`SampleSource`], which the folder [`Dataset`] implements here and the packed cache
//! implements in `cache`; nothing in `data` knows the cache.

pub mod augment;
pub mod demo;
pub mod folder;
pub mod image;
pub mod loader;
pub mod plan;
pub mod rng;
pub mod scan;
pub mod simulate;
pub mod source;
pub mod split;
pub mod watch;

pub use loader::{Batch, Loader};
pub use plan::{LoaderConfig, Plan};
pub use scan::{scan, Dataset};
pub use source::SampleSource;
