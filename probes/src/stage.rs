//! The names of the pipeline stages. A span whose name is one of these is timed.

/// One measured stage of an input pipeline or training step.
///
/// The span name is the stage name: `tracing::info_span!("decode")` is timed as
/// [`Stage::Decode`]. Spans with other names pass through untouched.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[repr(u8)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// File (or cache slice) to bytes, on a loader worker.
    Read,
    /// A batch's samples taken from a data set whose `__getitem__` does no read, decode or
    /// transform that pipeprof recognises (tensors already in memory, a format of its own),
    /// timed once per batch: microseconds of indexing are never called decoding.
    Fetch,
    /// Bytes to pixels.
    Decode,
    /// Pixels to the model's input size and layout.
    Resize,
    /// Random transforms applied by the loader.
    Augment,
    /// Pixels to the tensor the model takes, at the same size: `ToTensor`, `PILToTensor`,
    /// `ToImage`, `ToDtype`, `ConvertImageDtype`, `Normalize`, Keras' `Rescaling` and
    /// `Normalization`. Never a resize: nothing changes size.
    Convert,
    /// A step of the loader's own code that pipeprof does not classify: a transform class of the
    /// program's own (its class names are the run's `transforms` setting), a tf.data `map`
    /// function's work beyond the ops pipeprof names.
    Transform,
    /// Samples stacked into a batch (a DataLoader's `collate_fn`), once per batch.
    Collate,
    /// The training loop blocked on the next batch: the input-bound signal.
    Wait,
    /// Host batch to a device tensor.
    Transfer,
    /// Forward, loss, backward and optimizer step (parent of the next three).
    Compute,
    /// Forward pass and loss.
    Forward,
    /// Gradient computation.
    Backward,
    /// Parameter update.
    Optimizer,
    /// A validation step (forward only).
    Validate,
}

impl Stage {
    /// Every stage, in pipeline order.
    pub const ALL: [Stage; 15] = [
        Stage::Read,
        Stage::Fetch,
        Stage::Decode,
        Stage::Resize,
        Stage::Augment,
        Stage::Convert,
        Stage::Transform,
        Stage::Collate,
        Stage::Wait,
        Stage::Transfer,
        Stage::Compute,
        Stage::Forward,
        Stage::Backward,
        Stage::Optimizer,
        Stage::Validate,
    ];

    /// The span name that selects this stage.
    pub const fn name(self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Fetch => "fetch",
            Stage::Decode => "decode",
            Stage::Resize => "resize",
            Stage::Augment => "augment",
            Stage::Convert => "convert",
            Stage::Transform => "transform",
            Stage::Collate => "collate",
            Stage::Wait => "wait",
            Stage::Transfer => "transfer",
            Stage::Compute => "compute",
            Stage::Forward => "forward",
            Stage::Backward => "backward",
            Stage::Optimizer => "optimizer",
            Stage::Validate => "validate",
        }
    }

    /// The stage a span name selects, if any.
    pub fn from_name(name: &str) -> Option<Stage> {
        Some(match name {
            "read" => Stage::Read,
            "fetch" => Stage::Fetch,
            "decode" => Stage::Decode,
            "resize" => Stage::Resize,
            "augment" => Stage::Augment,
            "convert" => Stage::Convert,
            "transform" => Stage::Transform,
            "collate" => Stage::Collate,
            "wait" => Stage::Wait,
            "transfer" => Stage::Transfer,
            "compute" => Stage::Compute,
            "forward" => Stage::Forward,
            "backward" => Stage::Backward,
            "optimizer" => Stage::Optimizer,
            "validate" => Stage::Validate,
            _ => return None,
        })
    }

    /// Index into [`Stage::ALL`], for per-stage arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Loader stages: the work of producing a batch, on a worker (or, with no workers, on
    /// the training thread inside its wait).
    pub const fn is_loader(self) -> bool {
        matches!(
            self,
            Stage::Read
                | Stage::Fetch
                | Stage::Decode
                | Stage::Resize
                | Stage::Augment
                | Stage::Convert
                | Stage::Transform
                | Stage::Collate
        )
    }

    /// Whether the Layer reads the thread CPU clock for this stage.
    ///
    /// That read is a system call (≈ 250 ns here), affordable on stages whose work takes
    /// milliseconds and where on-CPU vs off-CPU tells I/O from compute. `wait` is off-CPU
    /// by construction; `compute` runs on the tensor library's own thread pool, so the
    /// calling thread's CPU clock would not describe it.
    pub const fn takes_cpu_time(self) -> bool {
        self.is_loader() || matches!(self, Stage::Transfer)
    }

    /// Whether the Layer also reads the thread's run-queue wait around this stage's spans
    /// (≈ 1 µs a reading, shared with the next span's start when they follow each other): the
    /// loader's stages, so each has its on-CPU / core-wait / blocked split (the capacity model
    /// needs the loader's wait for a core apart from its work), and host→device copies. The
    /// other stages' waits for a core are seen per thread by the host sampler, at no cost to
    /// the spans.
    pub const fn takes_queue_time(self) -> bool {
        self.is_loader() || matches!(self, Stage::Transfer)
    }

    /// Sub-stages are nested inside another stage and are not added to step totals.
    pub const fn parent(self) -> Option<Stage> {
        match self {
            Stage::Forward | Stage::Backward | Stage::Optimizer => Some(Stage::Compute),
            _ => None,
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_round_trips_through_its_name() {
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(Stage::from_name(s.name()), Some(*s));
            assert_eq!(s.index(), i);
        }
        assert_eq!(Stage::from_name("Decode"), None);
    }
}
