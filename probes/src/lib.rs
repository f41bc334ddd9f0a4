//! pipeprof probes: what a profiled program links.
//!
//! Stage spans (`tracing::info_span!("decode", sample = i)`) are timed by [`ProbeLayer`] and
//! sent as small records through a bounded channel ([`Probe`]) that never blocks the sender:
//! when it is full, events are dropped and counted.

pub mod attach;
pub mod clock;
pub mod env;
pub mod event;
pub mod fsinfo;
pub mod layer;
pub mod node;
pub mod nonfinite;
pub mod probe;
pub mod role;
pub mod sample;
pub mod sampler;
pub mod stage;

pub use event::{Event, LayerRecord, Rank, SpanRecord, StepRecord, NONE};
pub use layer::{flush_thread, set_thread_role, thread_names, ProbeLayer};
pub use node::NodeId;
pub use probe::{Probe, Spares, DEFAULT_CAPACITY, MAX_CAPACITY};
pub use role::ThreadRole;
pub use stage::Stage;
