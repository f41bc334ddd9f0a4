//! pipeprof: a data-pipeline profiler and bottleneck diagnoser for candle image training.
//!
//! Data flows one way: probes (spans, samplers) → channel → [`aggregate`] → report/views.

pub mod aggregate;
pub mod attach;
pub mod cache;
pub mod check_advice;
pub mod cli;
pub mod config;
pub mod data;
pub mod diagnose;
pub mod export;
pub mod offline;
pub mod profile;
pub mod report;
pub mod signal;
pub mod train;
pub mod tui;
pub mod units;
