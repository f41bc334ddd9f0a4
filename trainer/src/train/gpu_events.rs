//! Phase times from events recorded on the device's stream, read when the device has passed
//! them: no device-wide synchronisation per phase.
//!
//! The loop marks where a phase starts and ends ([`PhaseEvents::begin`], [`PhaseEvents::end`]);
//! each mark records an event on the stream and notes the host time. [`PhaseEvents::poll`]
//! hands back, in order, the phases whose end event the device has passed (normally the
//! previous step's), and never waits; [`PhaseEvents::flush`] waits for the rest at the end of
//! a run, so nothing is lost. The events themselves come from an [`EventSource`]: CUDA events
//! in a CUDA build, a fake clock in tests.
//!
//! A phase's start on the host clock is its step's first mark's host time plus the device time
//! from that mark's event to the phase's start event: the phases of a step keep their device
//! order and gaps, placed where the step was launched (the device runs them a little later).

use probes::Stage;
use std::collections::VecDeque;

/// Records points on a device stream and tells the time between them.
pub trait EventSource {
    type Event: Clone;
    /// An event at the stream's current position.
    fn record(&mut self) -> Result<Self::Event, String>;
    /// Whether the device has passed `ev`. Never waits.
    fn is_done(&self, ev: &Self::Event) -> Result<bool, String>;
    /// Device nanoseconds from `a` to `b`, both passed.
    fn elapsed_ns(&self, a: &Self::Event, b: &Self::Event) -> Result<u64, String>;
    /// Waits until the device has passed `ev` (only [`PhaseEvents::flush`] calls it).
    fn wait(&self, ev: &Self::Event) -> Result<(), String>;
}

/// One phase of one step, timed on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseTime {
    pub stage: Stage,
    pub step: u64,
    /// Host monotonic ns (see the module's note).
    pub start_ns: u64,
    pub dur_ns: u64,
    /// Bytes the phase moved, or `probes::event::NONE`.
    pub bytes: u64,
}

struct Open<E> {
    stage: Stage,
    step: u64,
    bytes: u64,
    start: E,
    end: Option<E>,
    /// The step's first mark: (host ns, its event).
    anchor: (u64, E),
}

/// The marks of phases not yet handed back, oldest first, at most `cap`.
pub struct PhaseEvents<S: EventSource> {
    src: S,
    open: VecDeque<Open<S::Event>>,
    anchor: Option<(u64, u64, S::Event)>,
    cap: usize,
    dropped: u64,
}

/// Why a mark was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkError {
    #[error("end of {0:?} at step {1} without its start")]
    Unopened(Stage, u64),
    #[error("device event: {0}")]
    Device(String),
}

impl<S: EventSource> PhaseEvents<S> {
    /// `cap`: phases kept before the oldest are handed back; a step that would go past it is
    /// not timed (and counted in [`PhaseEvents::dropped`]) rather than waited for.
    pub fn new(src: S, cap: usize) -> PhaseEvents<S> {
        PhaseEvents { src, open: VecDeque::new(), anchor: None, cap: cap.max(1), dropped: 0 }
    }

    /// Phase `stage` of `step` starts at the stream's current position. Returns false when
    /// the ring is full (the phase is not timed).
    pub fn begin(&mut self, stage: Stage, step: u64, host_ns: u64, bytes: u64) -> Result<bool, MarkError> {
        if self.open.len() >= self.cap {
            self.dropped += 1;
            return Ok(false);
        }
        let ev = self.src.record().map_err(MarkError::Device)?;
        let anchor = match &self.anchor {
            Some((s, ns, a)) if *s == step => (*ns, a.clone()),
            _ => {
                self.anchor = Some((step, host_ns, ev.clone()));
                (host_ns, ev.clone())
            }
        };
        self.open.push_back(Open { stage, step, bytes, start: ev, end: None, anchor });
        Ok(true)
    }

    /// Phase `stage` of `step` ends at the stream's current position. A phase whose begin
    /// was not taken (ring full) is ignored.
    pub fn end(&mut self, stage: Stage, step: u64) -> Result<(), MarkError> {
        let Some(o) = self.open.iter_mut().rev().find(|o| o.stage == stage && o.step == step && o.end.is_none()) else {
            // Dropped at begin (counted there), or never begun: only the latter is a bug.
            return if self.dropped > 0 { Ok(()) } else { Err(MarkError::Unopened(stage, step)) };
        };
        o.end = Some(self.src.record().map_err(MarkError::Device)?);
        Ok(())
    }

    /// The phases the device has finished, oldest first; stops at the first one it has not
    /// (a stream runs in order). Never waits.
    pub fn poll(&mut self) -> Result<Vec<PhaseTime>, MarkError> {
        let mut out = Vec::new();
        while let Some(o) = self.open.front() {
            let Some(end) = &o.end else { break };
            if !self.src.is_done(end).map_err(MarkError::Device)? {
                break;
            }
            out.push(self.resolve_front()?);
        }
        Ok(out)
    }

    /// Every phase still held, waiting for the device: the end of a run. A phase begun but
    /// never ended (the step failed) ends here.
    pub fn flush(&mut self) -> Result<Vec<PhaseTime>, MarkError> {
        for i in 0..self.open.len() {
            if self.open[i].end.is_none() {
                self.open[i].end = Some(self.src.record().map_err(MarkError::Device)?);
            }
        }
        if let Some(end) = self.open.back().and_then(|o| o.end.as_ref()) {
            self.src.wait(end).map_err(MarkError::Device)?;
        }
        let mut out = Vec::with_capacity(self.open.len());
        while !self.open.is_empty() {
            out.push(self.resolve_front()?);
        }
        Ok(out)
    }

    fn resolve_front(&mut self) -> Result<PhaseTime, MarkError> {
        let Some(o) = self.open.pop_front() else {
            return Err(MarkError::Device("nothing to resolve".into()));
        };
        let end = o.end.as_ref().unwrap_or(&o.start);
        let dur_ns = self.src.elapsed_ns(&o.start, end).map_err(MarkError::Device)?;
        let offset = self.src.elapsed_ns(&o.anchor.1, &o.start).map_err(MarkError::Device)?;
        Ok(PhaseTime { stage: o.stage, step: o.step, start_ns: o.anchor.0 + offset, dur_ns, bytes: o.bytes })
    }

    /// Phases not timed because the ring was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Phases held (begun, not handed back).
    pub fn pending(&self) -> usize {
        self.open.len()
    }
}

/// No device events: the source of a build without CUDA, never made.
pub enum NoEvents {}

impl EventSource for NoEvents {
    type Event = ();
    fn record(&mut self) -> Result<(), String> {
        match *self {}
    }
    fn is_done(&self, _: &()) -> Result<bool, String> {
        match *self {}
    }
    fn elapsed_ns(&self, _: &(), _: &()) -> Result<u64, String> {
        match *self {}
    }
    fn wait(&self, _: &()) -> Result<(), String> {
        match *self {}
    }
}

/// CUDA events on candle's stream.
#[cfg(feature = "cuda")]
pub mod cuda {
    use super::EventSource;
    use candle_core::cuda::cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaStream};
    use std::sync::Arc;

    pub struct StreamEvents {
        pub stream: Arc<CudaStream>,
    }

    impl EventSource for StreamEvents {
        type Event = Arc<CudaEvent>;
        fn record(&mut self) -> Result<Arc<CudaEvent>, String> {
            // Timing events (the default flags); CU_EVENT_DISABLE_TIMING would refuse elapsed.
            self.stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map(Arc::new).map_err(|e| e.to_string())
        }
        fn is_done(&self, ev: &Arc<CudaEvent>) -> Result<bool, String> {
            ev.try_is_complete().map_err(|e| e.to_string())
        }
        fn elapsed_ns(&self, a: &Arc<CudaEvent>, b: &Arc<CudaEvent>) -> Result<u64, String> {
            // Both have completed (poll checked the later one; a stream runs in order), so
            // elapsed_ms's own synchronisations return at once.
            let ms = a.elapsed_ms(b).map_err(|e| e.to_string())?;
            Ok((f64::from(ms.max(0.0)) * 1e6) as u64)
        }
        fn wait(&self, ev: &Arc<CudaEvent>) -> Result<(), String> {
            ev.synchronize().map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;

    /// A stream whose work is a list of event times (device ns): recording an event queues
    /// it `cost` ns after the previous one; the device has reached `now`.
    #[derive(Clone, Default)]
    struct FakeStream {
        times: Rc<RefCell<Vec<u64>>>,
        cost: Rc<Cell<u64>>,
        now: Rc<Cell<u64>>,
        waits: Rc<Cell<u32>>,
    }

    impl EventSource for FakeStream {
        type Event = usize;
        fn record(&mut self) -> Result<usize, String> {
            let mut t = self.times.borrow_mut();
            let at = t.last().copied().unwrap_or(0) + self.cost.get();
            t.push(at);
            Ok(t.len() - 1)
        }
        fn is_done(&self, ev: &usize) -> Result<bool, String> {
            Ok(self.times.borrow()[*ev] <= self.now.get())
        }
        fn elapsed_ns(&self, a: &usize, b: &usize) -> Result<u64, String> {
            let t = self.times.borrow();
            assert!(t[*b] <= self.now.get(), "elapsed read before the device passed the event");
            Ok(t[*b] - t[*a])
        }
        fn wait(&self, ev: &usize) -> Result<(), String> {
            self.waits.set(self.waits.get() + 1);
            self.now.set(self.now.get().max(self.times.borrow()[*ev]));
            Ok(())
        }
    }

    const NONE: u64 = probes::event::NONE;

    /// One step: transfer, forward, backward, optimizer, each `cost` of device time apart.
    fn step(ring: &mut PhaseEvents<FakeStream>, s: &FakeStream, k: u64, host_ns: u64) {
        s.cost.set(0);
        for (i, stage) in [Stage::Transfer, Stage::Forward, Stage::Backward, Stage::Optimizer].into_iter().enumerate() {
            ring.begin(stage, k, host_ns + i as u64, NONE).unwrap();
            s.cost.set(10 * (i as u64 + 1));
            ring.end(stage, k).unwrap();
            s.cost.set(1);
        }
    }

    #[test]
    fn the_previous_steps_phases_come_back_when_the_device_has_passed_them() {
        let s = FakeStream::default();
        let mut ring = PhaseEvents::new(s.clone(), 64);
        step(&mut ring, &s, 0, 1_000);
        // The device has done nothing yet: nothing back, nothing waited for.
        assert!(ring.poll().unwrap().is_empty());
        // Events at: T 0..10, F 11..31, B 32..62, O 63..103.
        s.now.set(62);
        let got = ring.poll().unwrap();
        let want = [(Stage::Transfer, 1_000, 10), (Stage::Forward, 1_011, 20), (Stage::Backward, 1_032, 30)];
        let got3: Vec<_> = got.iter().map(|p| (p.stage, p.start_ns, p.dur_ns)).collect();
        assert_eq!(got3, want);
        assert!(got.iter().all(|p| p.step == 0));
        step(&mut ring, &s, 1, 5_000);
        s.now.set(103);
        let got = ring.poll().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].stage, got[0].step, got[0].dur_ns), (Stage::Optimizer, 0, 40));
        assert_eq!(ring.pending(), 4);
        assert_eq!(s.waits.get(), 0, "poll never waits");
    }

    #[test]
    fn each_step_is_placed_at_its_own_first_mark() {
        let s = FakeStream::default();
        let mut ring = PhaseEvents::new(s.clone(), 64);
        step(&mut ring, &s, 0, 1_000);
        step(&mut ring, &s, 1, 9_000);
        s.now.set(u64::MAX);
        let got = ring.poll().unwrap();
        assert_eq!(got.len(), 8);
        assert_eq!((got[4].stage, got[4].step, got[4].start_ns), (Stage::Transfer, 1, 9_000));
        assert_eq!((got[5].stage, got[5].start_ns), (Stage::Forward, 9_011));
    }

    #[test]
    fn flush_waits_once_and_returns_everything_even_an_unended_phase() {
        let s = FakeStream::default();
        let mut ring = PhaseEvents::new(s.clone(), 64);
        step(&mut ring, &s, 0, 0);
        step(&mut ring, &s, 1, 500);
        // Step 2 fails inside forward: begun, never ended.
        ring.begin(Stage::Transfer, 2, 900, 4096).unwrap();
        s.cost.set(7);
        ring.end(Stage::Transfer, 2).unwrap();
        ring.begin(Stage::Forward, 2, 901, NONE).unwrap();
        let all = ring.flush().unwrap();
        assert_eq!(all.len(), 10);
        assert_eq!(s.waits.get(), 1);
        assert_eq!(ring.pending(), 0);
        let t2 = all[8];
        assert_eq!((t2.stage, t2.step, t2.dur_ns, t2.bytes), (Stage::Transfer, 2, 7, 4096));
        assert_eq!((all[9].stage, all[9].step), (Stage::Forward, 2));
        // Sorted by step, then by the order the phases ran.
        assert!(all.windows(2).all(|w| (w[0].step, w[0].start_ns) <= (w[1].step, w[1].start_ns)));
    }

    #[test]
    fn a_full_ring_skips_and_counts_instead_of_waiting() {
        let s = FakeStream::default();
        let mut ring = PhaseEvents::new(s.clone(), 4);
        step(&mut ring, &s, 0, 0);
        // Step 1 finds no room: not timed, counted, and its ends are not errors.
        step(&mut ring, &s, 1, 100);
        assert_eq!(ring.dropped(), 4);
        assert_eq!(s.waits.get(), 0);
        s.now.set(u64::MAX);
        assert_eq!(ring.poll().unwrap().len(), 4);
        step(&mut ring, &s, 2, 200);
        assert_eq!(ring.pending(), 4);
    }

    #[test]
    fn an_end_without_a_begin_is_an_error() {
        let s = FakeStream::default();
        let mut ring = PhaseEvents::new(s, 4);
        assert_eq!(ring.end(Stage::Forward, 3).unwrap_err(), MarkError::Unopened(Stage::Forward, 3));
    }
}
