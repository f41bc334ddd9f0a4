//! Outputs written while the run goes: one `Exporter` per format.

pub mod chrome;
pub mod guard;
pub mod ranks;
pub mod read;

use crate::aggregate::RunSettings;
use crate::diagnose::{Diagnosed, Verdict};
use probes::Event;

/// Receives every event in arrival order and writes it somewhere; `finish` closes the output
/// so that it is valid on its own.
pub trait Exporter: Send {
    /// Called once, before any event.
    fn settings(&mut self, _s: &RunSettings) -> std::io::Result<()> {
        Ok(())
    }
    fn event(&mut self, ev: &Event) -> std::io::Result<()>;
    /// The live verdict changed (at monotonic `t_ns`).
    fn verdict(&mut self, _t_ns: u64, _v: &Verdict) -> std::io::Result<()> {
        Ok(())
    }
    /// The final summary and verdict, just before `finish`.
    fn summary(&mut self, _s: &Diagnosed) -> std::io::Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> std::io::Result<()>;
}
