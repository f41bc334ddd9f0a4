//! pipeprof: a data-pipeline profiler and bottleneck diagnoser for candle image training.
//!
//! Data flows one way, and modules only look down (ARCHITECTURE.md):
//! probes (its own crate) → [`aggregate`] → [`diagnose`] → views ([`report`], [`tui`],
//! [`export`], then [`html`]) → commands ([`profile`], [`attach`], [`offline`], [`cache`]) → [`commands`] /
//! [`cli`]. Beside them: [`config`] and [`data`] (the inputs), [`train`] (the model and loop),
//! [`session`] (the one run pipeline), [`progress`], [`signal`], [`flags`] and [`units`].
//!
//! Three crates (ARCHITECTURE.md): `pipeprof-core` (the pure profiler: units to diagnose),
//! `pipeprof-trainer` (the candle trainer: data, cache, train, progress) and this one, the
//! views and commands. Their modules are re-exported here, so `crate::aggregate` inside and
//! `pipeprof::aggregate` outside read as when all was one crate.

pub use pipeprof_core::{aggregate, config, diagnose, flags, limits, model_source, signal, units};
pub use pipeprof_trainer::{cache, data, progress, train};

pub mod attach;
pub mod check_advice;
pub mod check_run;
pub mod cli;
pub mod commands;
pub mod export;
pub mod html;
pub mod metrics;
pub mod offline;
pub mod profile;
pub mod report;
pub mod rerun;
pub mod run;
pub mod session;
pub mod tui;
