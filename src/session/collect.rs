//! The collector: drains events into the aggregate and the exporters, publishes snapshots with
//! their verdict for the views, and pairs the final summary with its verdict.

use crate::export::Exporter;
use crate::tui::Live;
use crossbeam_channel::Receiver;
use pipeprof_core::aggregate::Aggregator;
use pipeprof_core::diagnose::{self, Diagnosed};
use probes::Event;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The shared latest view, written by the collector, read by the live view or progress line.
pub type Latest = Arc<Mutex<Live>>;

/// Least time between two snapshots published on steps: a snapshot copies the recent series,
/// and the live view redraws at 10 Hz anyway.
const PUBLISH_EVERY: Duration = Duration::from_millis(50);

/// Longest time between two publications while events come: a run stuck before its first
/// step (a read that never returns) still shows its samples and stalls.
const PUBLISH_STALE: Duration = Duration::from_secs(1);

/// Events between two publications when no step or skip comes.
const PUBLISH_EVERY_EVENTS: u32 = 4096;

/// A new, empty publication slot for `agg`'s run.
pub fn latest(agg: &Aggregator) -> Latest {
    Arc::new(Mutex::new(Live { snap: agg.snapshot(), verdict: None, straggler: None }))
}

/// Drains events into the aggregate and the exporters until [`Event::Finish`], publishing
/// snapshots for the views; closes the exporters and returns the final summary with its
/// verdict. `dropped` reads the sender side's dropped-events counter. With `detect_fs`, the
/// filesystem under the data folder a program names in its settings is looked up once (a
/// live program's: a replayed trace's folder is another machine's).
pub fn collect(
    rx: Receiver<Event>,
    mut agg: Aggregator,
    mut exporters: Vec<Box<dyn Exporter>>,
    latest: &Latest,
    dropped: &dyn Fn() -> u64,
    detect_fs: bool,
) -> Diagnosed {
    let mut since_publish = 0u32;
    let mut last_publish: Option<Instant> = None;
    while let Ok(ev) = rx.recv() {
        if ev == Event::Finish {
            break;
        }
        // A rank's step (a distributed run) publishes like the run's own.
        let inner = match &ev {
            Event::Ranked(_, e) => e,
            e => e,
        };
        let publish = matches!(inner, Event::Step(_) | Event::Skipped { .. } | Event::Stalled { .. });
        export(&ev, &mut exporters);
        agg.push(&ev);
        if detect_fs && matches!(inner, Event::Settings(_)) {
            if let Some(data) = agg.data_fs_wanted() {
                let fs = probes::fsinfo::detect(std::path::Path::new(data));
                agg.set_data_fs(fs);
            }
        }
        since_publish += 1;
        // Publishing costs a summary and a copy of the recent series: do it on steps, skips
        // and stalls (at most every PUBLISH_EVERY), every so many events, and at least every
        // PUBLISH_STALE while events come.
        let since = last_publish.map(|t| t.elapsed());
        let due = since.is_none_or(|t| t >= PUBLISH_EVERY);
        let stale = since.is_none_or(|t| t >= PUBLISH_STALE);
        if (publish && due) || stale || since_publish >= PUBLISH_EVERY_EVENTS {
            since_publish = 0;
            last_publish = Some(Instant::now());
            publish_snapshot(&mut agg, latest, dropped);
        }
    }
    // The views' last look includes the final steps.
    publish_snapshot(&mut agg, latest, dropped);
    // Thread names whose events were dropped on a full channel are still in the registry.
    for (id, name, role) in probes::layer::threads() {
        if !agg.has_thread(id) {
            let ev = Event::Thread { id, name: name.into_boxed_str(), role };
            export(&ev, &mut exporters);
            agg.push(&ev);
        }
    }
    agg.set_dropped(dropped());
    let done = Diagnosed::new(agg.summary());
    for x in &mut exporters {
        if let Err(e) = x.summary(&done).and_then(|()| x.finish()) {
            pipeprof_trainer::progress::warn(&format!("cannot close an export: {e}"));
        }
    }
    done
}

/// Sends `ev` to every exporter; one that fails is dropped with a warning, the others go on.
fn export(ev: &Event, exporters: &mut Vec<Box<dyn Exporter>>) {
    exporters.retain_mut(|x| match x.event(ev) {
        Ok(()) => true,
        Err(e) => {
            pipeprof_trainer::progress::warn(&format!("cannot write an export ({e}): that output stops here"));
            false
        }
    });
}

/// Publishes the aggregate for the views, with the verdict once there are steps to judge.
fn publish_snapshot(agg: &mut Aggregator, latest: &Latest, dropped: &dyn Fn() -> u64) {
    agg.set_dropped(dropped());
    let snap = agg.snapshot();
    // A stalled run may have no step yet: its verdict names the stall.
    let judge = snap.summary.steps > 0 || !snap.summary.stalls.is_empty();
    let verdict = judge.then(|| diagnose::diagnose(&snap.summary));
    let straggler = diagnose::ranks::judge(&snap.summary.ranks);
    // The lock is held only for the move, not while the snapshot is built.
    // A view that panicked while reading poisons the lock; the slot is still whole.
    *latest.lock().unwrap_or_else(|e| e.into_inner()) = Live { snap, verdict, straggler };
}
