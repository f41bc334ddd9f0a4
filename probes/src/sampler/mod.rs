//! Host and GPU samplers (placeholder: being written).

/// One host sample.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostSample {
    /// Monotonic ns.
    pub t_ns: u64,
}

/// One GPU sample.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuSample {
    /// Monotonic ns.
    pub t_ns: u64,
}
