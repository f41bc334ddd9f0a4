//! pipeprof: a data-pipeline profiler and bottleneck diagnoser for candle image training.
//!
//! Data flows one way, and modules only look down (ARCHITECTURE.md):
//! probes (its own crate) → `pipeprof_core::aggregate` → `pipeprof_core::diagnose` → views
//! ([`report`], [`tui`], [`export`], [`metrics`], then [`html`]) → [`session`] (the one run
//! pipeline) → [`commands`], one file or folder per subcommand as the user types it
//! (`commands::profile` with its `--check-advice`, `run` with its own, `attach`, `report`) → [`cli`]
//! → `commands`' dispatch.
//!
//! Three crates (ARCHITECTURE.md): `pipeprof-core` (the pure profiler: units to diagnose),
//! `pipeprof-trainer` (the candle trainer: data, cache, train, progress) and this one, the
//! views and commands. Each is named where it is used (`pipeprof_core::diagnose`,
//! `pipeprof_trainer::data`): a path says which crate holds the module.

pub mod cli;
pub mod commands;
pub mod export;
pub mod html;
pub mod metrics;
pub mod report;
pub mod session;
pub mod tui;
