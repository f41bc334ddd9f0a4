//! The channel between instrumented code and the collector.

use crate::event::{Event, SpanRecord};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Default channel capacity: 65,536 events dropped nothing over 1 M spans in a tight loop here.
pub const DEFAULT_CAPACITY: usize = 65_536;
/// Largest channel a run may ask for: 2^24 events × 48 bytes ≈ 800 MB, far past any need.
pub const MAX_CAPACITY: usize = 1 << 24;

/// A cheap, cloneable handle that sends events without ever blocking the sender.
#[derive(Clone, Debug)]
pub struct Probe {
    tx: Sender<Event>,
    dropped: Arc<AtomicU64>,
    spares: Spares,
}

/// Span batches the channel's reader emptied, kept for the senders' next batches. A batch is
/// a few kilobytes: allocated new on a training thread, glibc first merges every small block
/// the step freed (`malloc_consolidate`), thousands of instructions and cache misses per
/// batch; freed on the reader's thread, it never returns to the sender's cache. A reader that
/// hands its batches back ([`Spares::put`]) makes a sender's steady state allocate nothing.
#[derive(Clone, Debug, Default)]
pub struct Spares(Arc<Mutex<Vec<Vec<SpanRecord>>>>);

/// Emptied batches kept at most: the senders' threads, about.
const SPARES: usize = 8;

impl Spares {
    /// Keeps `batch`'s memory (emptied) for a sender's next batch, when fewer than a few are kept.
    pub fn put(&self, mut batch: Vec<SpanRecord>) {
        batch.clear();
        if let Ok(mut kept) = self.0.lock() {
            if kept.len() < SPARES {
                kept.push(batch);
            }
        }
    }

    /// An empty batch: a kept one, else a new one without memory yet. Never waits for the
    /// reader (a sender's thread is the program's).
    pub fn take(&self) -> Vec<SpanRecord> {
        self.0.try_lock().ok().and_then(|mut kept| kept.pop()).unwrap_or_default()
    }
}

impl Probe {
    /// A probe and the receiving end of its bounded channel.
    pub fn new(capacity: usize) -> (Probe, Receiver<Event>) {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        (Probe { tx, dropped: Arc::new(AtomicU64::new(0)), spares: Spares::default() }, rx)
    }

    /// The counter of events this probe dropped, shared (a producer's writer reports it to
    /// the run without holding a sender).
    pub(crate) fn drop_counter(&self) -> Arc<AtomicU64> {
        self.dropped.clone()
    }

    /// Where the channel's reader hands emptied span batches back (see [`Spares`]): holding
    /// it keeps no sender alive.
    pub fn spares(&self) -> Spares {
        self.spares.clone()
    }

    /// An empty span batch for the next [`Probe::send_spans`], its memory reused where the
    /// reader gave one back.
    pub fn spare_batch(&self) -> Vec<SpanRecord> {
        self.spares.take()
    }

    /// Sends without blocking; a full or closed channel drops the event and counts it.
    #[inline]
    pub fn send(&self, ev: Event) {
        match self.tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Sends a batch of span records; if it does not fit, all of them count as dropped.
    #[inline]
    pub fn send_spans(&self, batch: Vec<SpanRecord>) {
        let n = batch.len() as u64;
        if self.tx.try_send(Event::Spans(batch)).is_err() {
            self.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Sends without blocking; returns whether the event went (a full or closed channel drops
    /// it and counts one).
    pub fn try_send(&self, ev: Event) -> bool {
        let sent = self.tx.try_send(ev).is_ok();
        if !sent {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        sent
    }

    /// Counts `n` more events as dropped (the rest of a batch sent as one event).
    pub fn count_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether two probes feed the same channel.
    pub fn same_channel(&self, other: &Probe) -> bool {
        Arc::ptr_eq(&self.dropped, &other.dropped)
    }

    /// Sends, waiting for room: only for rare control events such as [`Event::Finish`].
    /// Returns false when the collector is gone.
    pub fn send_blocking(&self, ev: Event) -> bool {
        self.tx.send(ev).is_ok()
    }

    /// Events dropped so far because the channel was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Events waiting in the channel now.
    pub fn queued(&self) -> usize {
        self.tx.len()
    }
}
