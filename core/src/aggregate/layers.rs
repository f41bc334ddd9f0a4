//! Per-layer times of the model pipeprof trains (its training loop times some steps layer by
//! layer). Pure.

use super::split::per;
use probes::{LayerRecord, SpanRecord, Stage};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Layers with their own timings (a model's layers; more are left out).
pub const MAX_LAYERS: usize = 256;

/// One layer's mean forward and backward time per step (pipeprof's own model).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct LayerSummary {
    pub name: String,
    pub forward_ms: f64,
    pub backward_ms: f64,
}

/// One part of the compute step: a layer's forward or backward pass, or the optimizer.
#[derive(Debug, Clone, PartialEq)]
pub struct ComputePart {
    /// `dense_1 backward`, `optimizer`.
    pub label: String,
    /// Mean per step, ms.
    pub ms: f64,
    /// Share of the mean compute step.
    pub share: f64,
}

#[derive(Default)]
struct LayerAgg {
    name: String,
    forward_ns: u64,
    forwards: u64,
    backward_ns: u64,
    backwards: u64,
}

/// The layers in model order (as first seen), and the compute spans of the steps they timed.
#[derive(Default)]
pub(super) struct Layers {
    layers: Vec<LayerAgg>,
    /// Steps with layer times whose compute span has not arrived (the Layer batches spans, so
    /// a step's compute span can come after later steps' layer records), and the compute spans
    /// of such steps.
    pending: BTreeSet<u64>,
    compute_ns: u64,
    computes: u64,
}

impl Layers {
    pub(super) fn push(&mut self, l: &LayerRecord) {
        if self.pending.insert(l.step) && self.pending.len() > MAX_LAYERS {
            // Bounded: a compute span that never comes (a run cut short) leaves its step here.
            self.pending.pop_first();
        }
        let i = match self.layers.iter().position(|a| *a.name == *l.layer) {
            Some(i) => i,
            None if self.layers.len() < MAX_LAYERS => {
                self.layers.push(LayerAgg { name: l.layer.to_string(), ..Default::default() });
                self.layers.len() - 1
            }
            None => return,
        };
        let a = &mut self.layers[i];
        if l.backward {
            (a.backward_ns, a.backwards) = (a.backward_ns + l.dur_ns, a.backwards + 1);
        } else {
            (a.forward_ns, a.forwards) = (a.forward_ns + l.dur_ns, a.forwards + 1);
        }
    }

    /// A compute span: counted when its step was timed layer by layer (layer records are sent
    /// before their step's compute span closes).
    pub(super) fn push_span(&mut self, s: &SpanRecord) {
        if s.stage == Stage::Compute && self.pending.remove(&s.step) {
            self.compute_ns += s.dur_ns;
            self.computes += 1;
        }
    }

    /// Each layer's means per step.
    pub(super) fn summary(&self) -> Vec<LayerSummary> {
        self.layers
            .iter()
            .map(|a| LayerSummary {
                name: a.name.clone(),
                forward_ms: per(a.forward_ns, a.forwards),
                backward_ms: per(a.backward_ns, a.backwards),
            })
            .collect()
    }

    /// Mean compute span of the steps timed layer by layer, ms.
    pub(super) fn compute_ms(&self) -> f64 {
        per(self.compute_ns, self.computes)
    }

    /// Steps timed layer by layer.
    pub(super) fn steps(&self) -> u64 {
        self.computes
    }
}

#[cfg(test)]
mod tests {
    use crate::aggregate::testing::{compute_span, layer};
    use crate::aggregate::{Aggregator, RunSettings};
    use probes::{Event, SpanRecord, Stage};

    #[test]
    fn layer_times_become_per_step_means_and_shares_of_compute() {
        let mut a = Aggregator::new(RunSettings::default());
        for step in 0..2 {
            a.push(&layer("conv2d_1", false, step, 5));
            a.push(&layer("dense_1", false, step, 10 + step * 10));
            a.push(&layer("dense_1", true, step, 50));
            a.push(&layer("conv2d_1", true, step, 20));
        }
        // The Layer batches spans: both steps' compute spans come after all layer records.
        for step in 0..2 {
            let t0 = step * 1_000_000_000;
            a.push(&Event::Span(SpanRecord { step, ..compute_span(t0, 100) }));
            a.push(&Event::Span(SpanRecord { stage: Stage::Optimizer, step, ..compute_span(t0, 10 + step * 10) }));
        }
        // A step not timed layer by layer (slower or faster) leaves the shares alone.
        a.push(&Event::Span(SpanRecord { step: 2, ..compute_span(2_000_000_000, 400) }));
        let s = a.summary();
        let names: Vec<&str> = s.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["conv2d_1", "dense_1"], "model order, as first seen");
        assert_eq!((s.layers[1].forward_ms, s.layers[1].backward_ms), (15.0, 50.0));
        let parts = s.compute_parts();
        let labels: Vec<&str> = parts.iter().map(|p| p.label.as_str()).collect();
        assert_eq!(
            labels,
            ["dense_1 backward", "conv2d_1 backward", "dense_1 forward", "optimizer", "conv2d_1 forward"]
        );
        assert!((parts[0].share - 0.5).abs() < 1e-9, "50 ms of a 100 ms compute step");
        assert_eq!((s.layer_steps, s.layer_compute_ms), (2, 100.0));
        assert_eq!(parts[3].ms, 15.0);
    }

    #[test]
    fn no_layer_times_no_compute_parts() {
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&Event::Span(compute_span(0, 100)));
        assert!(a.summary().compute_parts().is_empty());
    }
}
