#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The frame decoder under random and mutated input: it never panics and never allocates
//! more than the frame limit, whatever the bytes say.

use probes::attach::wire::{self, Frame, WireEvent, MAX_FRAME};
use probes::{SpanRecord, Stage, StepRecord};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Records the largest single allocation.
struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LARGEST.fetch_max(new, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let span = SpanRecord {
        stage: Stage::Read,
        thread: 1,
        start_ns: 5,
        dur_ns: 6,
        cpu_ns: 7,
        step: 8,
        sample: 9,
        bytes: 10,
        queue_ns: 11,
    };
    let step = StepRecord {
        no_loss: false,
        step: 1,
        epoch: 0,
        images: 4,
        loss: 0.5,
        correct: 2,
        end_ns: 3,
        queued: 1,
        validation: false,
    };
    vec![
        wire::encode(&Frame::Spans(vec![span; 5])).unwrap(),
        wire::encode(&Frame::Event(WireEvent::Step(step))).unwrap(),
        wire::encode(&Frame::Event(WireEvent::Thread {
            id: 2,
            name: "loader-0".into(),
            role: probes::ThreadRole::loader(0),
        }))
        .unwrap(),
        wire::encode(&Frame::End(Default::default())).unwrap(),
    ]
}

#[test]
fn random_and_mutated_frames_never_panic_or_overallocate() {
    let mut rng = Rng(0xC0FFEE);
    let corpus = seeds();
    LARGEST.store(0, Ordering::Relaxed);
    let mut accepted = 0;
    for i in 0..200_000u64 {
        let mut buf = if i % 2 == 0 {
            corpus[(rng.next() % corpus.len() as u64) as usize].clone()
        } else {
            (0..rng.next() % 300).map(|_| rng.next() as u8).collect()
        };
        // Mutate: flip bytes, truncate, or forge a huge length.
        for _ in 0..(rng.next() % 4) {
            if buf.is_empty() {
                break;
            }
            let at = (rng.next() % buf.len() as u64) as usize;
            match rng.next() % 3 {
                0 => buf[at] ^= 1 << (rng.next() % 8),
                1 => buf.truncate(at),
                _ => {
                    if buf.len() >= 4 {
                        buf[..4].copy_from_slice(&(rng.next() as u32).to_le_bytes());
                    }
                }
            }
        }
        if wire::read_frame(&mut &buf[..]).is_ok() {
            accepted += 1;
        }
        let _ = wire::decode(&buf);
    }
    assert!(accepted > 1000, "the unmutated seeds decode ({accepted})");
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest <= MAX_FRAME + 4096, "largest allocation {largest} bytes > frame limit {MAX_FRAME}");
}
