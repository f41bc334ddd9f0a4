//! pipeprof-core: the pure profiler, without candle. Events from `probes` → statistics
//! ([`aggregate`]) → verdict and advice ([`diagnose`]), with the layers under them: the model
//! file's schema ([`config`]), the accepted ranges ([`limits`]), where the model came from
//! ([`model_source`]), pipeprof's flag spelling ([`flags`]), number formatting ([`units`]) and
//! Ctrl-C handling ([`signal`]). The trainer (`pipeprof-trainer`) and the binary (`pipeprof`)
//! build on it; nothing here may use them (ARCHITECTURE.md, tests/architecture.rs).

pub mod aggregate;
pub mod config;
pub mod diagnose;
pub mod flags;
pub mod limits;
pub mod model_source;
pub mod signal;
pub mod units;
