//! pipeprof: a data-pipeline profiler and bottleneck diagnoser for candle image training.
//!
//! Data flows one way, and modules only look down (ARCHITECTURE.md):
//! probes (its own crate) → [`aggregate`] → [`diagnose`] → views ([`report`], [`tui`],
//! [`export`], then [`html`]) → commands ([`profile`], [`attach`], [`offline`], [`cache`]) → [`commands`] /
//! [`cli`]. Beside them: [`config`] and [`data`] (the inputs), [`train`] (the model and loop),
//! [`session`] (the one run pipeline), [`progress`], [`signal`], [`flags`] and [`units`].

pub mod aggregate;
pub mod attach;
pub mod cache;
pub mod check_advice;
pub mod check_run;
pub mod cli;
pub mod commands;
pub mod config;
pub mod data;
pub mod diagnose;
pub mod export;
pub mod flags;
pub mod html;
pub mod limits;
pub mod metrics;
pub mod model_source;
pub mod offline;
pub mod profile;
pub mod progress;
pub mod report;
pub mod run;
pub mod session;
pub mod signal;
pub mod train;
pub mod tui;
pub mod units;
