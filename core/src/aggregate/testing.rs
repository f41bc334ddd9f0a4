//! Event builders for the aggregate's tests.

use probes::{Event, LayerRecord, SpanRecord, Stage, StepRecord, NONE};

/// A span of `stage` on thread 1, step 0, without bytes or run-queue wait.
pub fn span(stage: Stage, start: u64, dur: u64, cpu: u64) -> Event {
    Event::Span(SpanRecord { cpu_ns: cpu, ..span_record(stage, start, dur) })
}

/// A span of `stage` at 0 with its CPU time and run-queue wait.
pub fn timed(stage: Stage, dur: u64, cpu: u64, queue: u64) -> Event {
    Event::Span(SpanRecord { cpu_ns: cpu, queue_ns: queue, ..span_record(stage, 0, dur) })
}

/// A span of `stage` at 1 on `thread`.
pub fn on_thread(thread: u32, stage: Stage, dur: u64, cpu: u64) -> Event {
    Event::Span(SpanRecord { thread, cpu_ns: cpu, step: NONE, ..span_record(stage, 1, dur) })
}

/// A span of `stage` on thread 1, step 0, nothing else measured.
pub fn span_record(stage: Stage, start: u64, dur: u64) -> SpanRecord {
    SpanRecord {
        stage,
        thread: 1,
        start_ns: start,
        dur_ns: dur,
        cpu_ns: NONE,
        queue_ns: NONE,
        step: 0,
        sample: NONE,
        bytes: NONE,
    }
}

/// A compute span of `dur_ms`.
pub fn compute_span(start_ns: u64, dur_ms: u64) -> SpanRecord {
    span_record(Stage::Compute, start_ns, dur_ms * 1_000_000)
}

/// A training step of 4 images.
pub fn step(step: u64, epoch: u32, loss: f32, correct: u32, end: u64) -> Event {
    Event::Step(StepRecord {
        no_loss: false,
        step,
        epoch,
        images: 4,
        loss,
        correct,
        end_ns: end,
        queued: 1,
        validation: false,
    })
}

/// One layer's pass of `dur_ms` in step `step`.
pub fn layer(name: &str, backward: bool, step: u64, dur_ms: u64) -> Event {
    Event::Layer(LayerRecord {
        layer: name.into(),
        backward,
        step,
        start_ns: step * 1_000_000_000,
        dur_ns: dur_ms * 1_000_000,
    })
}
