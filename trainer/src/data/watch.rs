//! What each loader worker is doing right now, for the stall watchdog: a read that never
//! returns (a FIFO, a hung network drive) never closes its span, so the spans cannot say.
//!
//! Each worker owns a [`Slot`] of atomics, registered once when the thread starts; a stage
//! change is three relaxed stores (no lock, no allocation). The watchdog copies the slots
//! with [`open_work`] and [`stalled`] decides, purely, which are stuck.

use super::source::SampleSource;
use probes::Stage;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

/// No stage: the worker is between samples (or waiting on its queue).
const IDLE: u8 = u8::MAX;

/// One worker's current work.
pub struct Slot {
    thread: String,
    src: Arc<dyn SampleSource>,
    stage: AtomicU8,
    sample: AtomicU32,
    since_ns: AtomicU64,
}

impl Slot {
    /// Worker `thread` starting `stage` of `sample` at `now_ns`.
    pub fn enter(&self, stage: Stage, sample: u32, now_ns: u64) {
        self.since_ns.store(now_ns, Ordering::Relaxed);
        self.sample.store(sample, Ordering::Relaxed);
        self.stage.store(stage_index(stage), Ordering::Release);
    }

    /// The worker finished its sample.
    pub fn leave(&self) {
        self.stage.store(IDLE, Ordering::Release);
    }
}

fn stage_index(s: Stage) -> u8 {
    Stage::ALL.iter().position(|x| *x == s).map_or(IDLE, |i| i as u8)
}

static SLOTS: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());

/// Registers a worker's slot (once, at thread start); it stays listed until [`retire`].
pub fn register(thread: &str, src: Arc<dyn SampleSource>) -> Arc<Slot> {
    let slot = Arc::new(Slot {
        thread: thread.to_string(),
        src,
        stage: AtomicU8::new(IDLE),
        sample: AtomicU32::new(0),
        since_ns: AtomicU64::new(0),
    });
    SLOTS.lock().unwrap_or_else(|e| e.into_inner()).push(slot.clone());
    slot
}

/// Forgets a slot whose worker has ended.
pub fn retire(slot: &Arc<Slot>) {
    SLOTS.lock().unwrap_or_else(|e| e.into_inner()).retain(|s| !Arc::ptr_eq(s, slot));
}

/// Work in progress: which thread, which stage, which file, since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenWork {
    pub thread: String,
    pub stage: Stage,
    pub file: String,
    pub since_ns: u64,
}

/// Every worker's work in progress now (idle workers left out).
pub fn open_work() -> Vec<OpenWork> {
    let slots: Vec<Arc<Slot>> = SLOTS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    slots
        .iter()
        .filter_map(|s| {
            let stage = *Stage::ALL.get(s.stage.load(Ordering::Acquire) as usize)?;
            let i = s.sample.load(Ordering::Relaxed) as usize;
            let file = if i < s.src.len() { s.src.name(i) } else { format!("sample {i}") };
            Some(OpenWork { thread: s.thread.clone(), stage, file, since_ns: s.since_ns.load(Ordering::Relaxed) })
        })
        .collect()
}

/// The work open at least `threshold_ns` at `now_ns`, with how long (ns). Pure.
pub fn stalled(open: &[OpenWork], now_ns: u64, threshold_ns: u64) -> Vec<(OpenWork, u64)> {
    open.iter()
        .filter_map(|w| {
            let age = now_ns.saturating_sub(w.since_ns);
            (age >= threshold_ns).then(|| (w.clone(), age))
        })
        .collect()
}

/// "reading", "decoding": what a thread is doing in `stage`, for "has been reading x".
pub fn doing(stage: Stage) -> String {
    match stage {
        Stage::Read => "reading".into(),
        Stage::Decode => "decoding".into(),
        Stage::Resize => "resizing".into(),
        Stage::Augment => "augmenting".into(),
        s => format!("in {} on", s.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(thread: &str, stage: Stage, since_ns: u64) -> OpenWork {
        OpenWork { thread: thread.into(), stage, file: "a/zz_pipe.png".into(), since_ns }
    }

    #[test]
    fn only_work_open_past_the_threshold_is_stalled() {
        let s = 1_000_000_000;
        let open = [w("loader-0", Stage::Read, 0), w("loader-1", Stage::Decode, 40 * s)];
        // (now, threshold, threads stalled, their ages)
        let table = [
            (45 * s, 30 * s, vec![("loader-0", 45 * s)]),
            (29 * s, 30 * s, vec![]),
            (70 * s, 30 * s, vec![("loader-0", 70 * s), ("loader-1", 30 * s)]),
            (10, 30 * s, vec![]),
        ];
        for (now, threshold, want) in table {
            let got = stalled(&open, now, threshold);
            let got: Vec<(&str, u64)> = got.iter().map(|(o, a)| (o.thread.as_str(), *a)).collect();
            assert_eq!(got, want, "now {now}");
        }
        assert_eq!(doing(Stage::Read), "reading");
    }
}
