//! Outputs written while the run goes: one `Exporter` per format.

pub mod chrome;

use probes::Event;

/// Receives every event in arrival order and writes it somewhere; `finish` closes the output
/// so that it is valid on its own.
pub trait Exporter: Send {
    fn event(&mut self, ev: &Event) -> std::io::Result<()>;
    fn finish(&mut self) -> std::io::Result<()>;
}
