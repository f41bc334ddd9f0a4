//! pipeprof-trainer: the candle trainer and its input pipeline: the loader ([`data`]), the
//! packed cache ([`cache`]), the model and training loop ([`train`]) and the progress line
//! ([`progress`]). Built on `pipeprof-core`, named where it is used (`pipeprof_core::config`).

pub use pipeprof_core::{aggregate, config, limits, model_source, signal, units};

pub mod cache;
pub mod data;
pub mod progress;
pub mod train;
