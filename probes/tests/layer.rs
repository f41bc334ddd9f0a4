#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Layer times stage spans, carries their fields, ignores other spans, and never blocks.

use probes::{Event, Probe, ProbeLayer, Stage, ThreadRole, NONE};
use tracing::info_span;
use tracing_subscriber::layer::SubscriberExt;

fn spans(rx: &crossbeam_channel::Receiver<Event>) -> Vec<probes::SpanRecord> {
    probes::flush_thread();
    rx.try_iter()
        .flat_map(|e| match e {
            Event::Span(s) => vec![s],
            Event::Spans(v) => v,
            _ => vec![],
        })
        .collect()
}

#[test]
fn stage_spans_are_timed_with_fields_and_others_ignored() {
    let (probe, rx) = Probe::new(1024);
    let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    tracing::subscriber::with_default(sub, || {
        let outer = info_span!("compute", step = 3u64);
        let _o = outer.enter();
        {
            let s = info_span!("read", step = 3u64, sample = 17u64, bytes = tracing::field::Empty);
            let _g = s.enter();
            s.record("bytes", 4096u64);
            let mut x = 0u64;
            for i in 0..100_000u64 {
                x = std::hint::black_box(x ^ i);
            }
        }
        let _unrelated = info_span!("my_own_span").entered();
    });
    let got = spans(&rx);
    assert_eq!(got.len(), 2, "{got:?}");
    let read = got[0];
    assert_eq!((read.stage, read.step, read.sample, read.bytes), (Stage::Read, 3, 17, 4096));
    assert!(read.cpu_ns != NONE && read.cpu_ns <= read.dur_ns + 1_000_000);
    let compute = got[1];
    assert_eq!(compute.stage, Stage::Compute);
    assert_eq!(compute.cpu_ns, NONE, "compute's CPU runs on other threads: not measured");
    assert!(compute.start_ns <= read.start_ns && read.end_ns() <= compute.end_ns(), "nesting kept");
    assert_eq!(read.thread, compute.thread);
    assert!(probes::thread_names().iter().any(|(id, _)| *id == read.thread));
}

#[test]
fn a_threads_role_is_announced_once_with_its_name() {
    let (probe, rx) = Probe::new(1024);
    let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    let role = ThreadRole::Loader { worker: 2, generation: 1 };
    let announced = std::thread::spawn(move || {
        tracing::subscriber::with_default(sub, || {
            probes::set_thread_role(role);
            for i in 0..3u64 {
                let _g = info_span!("decode", sample = i).entered();
            }
        });
        probes::flush_thread();
        rx.try_iter().filter(|e| matches!(e, Event::Thread { .. })).collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    assert_eq!(announced.len(), 1, "{announced:?}");
    let Event::Thread { id, role: got, .. } = &announced[0] else { unreachable!() };
    assert_eq!(*got, role);
    assert!(probes::layer::threads().iter().any(|(i, _, r)| i == id && *r == role));
    assert!(probes::layer::thread_roles().contains(&(*id, role)));
}

#[test]
fn a_full_channel_drops_and_counts_instead_of_blocking() {
    let (probe, rx) = Probe::new(1);
    probe.send(Event::Finish); // the collector is stuck: the channel is full
    let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    tracing::subscriber::with_default(sub, || {
        for i in 0..100u64 {
            let _g = info_span!("decode", sample = i).entered();
        }
    });
    probes::flush_thread();
    assert_eq!(rx.try_iter().count(), 1);
    // 100 spans (a full batch, then the rest) + 1 thread-name event: all counted, none waited for.
    assert_eq!(probe.dropped(), 101);
}

#[test]
fn spans_are_batched_and_flushed_when_the_thread_exits() {
    let (probe, rx) = Probe::new(1024);
    let layer_probe = probe.clone();
    std::thread::spawn(move || {
        let sub = tracing_subscriber::registry().with(ProbeLayer::new(layer_probe));
        tracing::subscriber::with_default(sub, || {
            for i in 0..(probes::layer::BATCH as u64 + 3) {
                let _g = info_span!("resize", sample = i).entered();
            }
        });
    })
    .join()
    .unwrap();
    let batches: Vec<usize> = rx
        .try_iter()
        .filter_map(|e| match e {
            Event::Spans(v) => Some(v.len()),
            _ => None,
        })
        .collect();
    assert_eq!(batches.iter().sum::<usize>(), probes::layer::BATCH + 3, "{batches:?}");
    assert!(batches.len() < probes::layer::BATCH, "records travel in batches: {batches:?}");
    assert_eq!(probe.dropped(), 0);
}

#[test]
fn re_entered_span_sends_one_record_per_entry() {
    let (probe, rx) = Probe::new(64);
    let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe));
    tracing::subscriber::with_default(sub, || {
        let s = info_span!("transfer", step = 1u64);
        for _ in 0..3 {
            let _g = s.enter();
        }
    });
    let got = spans(&rx);
    assert_eq!(got.len(), 3);
    assert!(got.windows(2).all(|w| w[0].end_ns() <= w[1].start_ns));
}

/// A step record made by [`probes::layer::record_step`] at `end_ns`.
fn step_at(step: u64, end_ns: u64) -> probes::StepRecord {
    probes::StepRecord {
        step,
        epoch: 0,
        images: 32,
        loss: 0.5,
        correct: 0,
        end_ns,
        queued: 0,
        validation: false,
        no_loss: false,
    }
}

#[test]
fn step_records_wait_in_the_threads_batch_after_its_spans() {
    let (probe, rx) = Probe::new(1024);
    let got = std::thread::spawn(move || {
        // Steps 1 ms apart, each after its wait and compute spans: well within one batch's
        // age and size, so nothing goes to the channel until the thread flushes.
        for i in 0..3u64 {
            let t = 1_000_000 * (i + 1);
            let span = |stage, start| probes::SpanRecord {
                stage,
                thread: 0,
                start_ns: start,
                dur_ns: 400_000,
                cpu_ns: NONE,
                queue_ns: NONE,
                step: i,
                sample: NONE,
                bytes: NONE,
            };
            probes::layer::record(&probe, span(Stage::Wait, t));
            probes::layer::record(&probe, span(Stage::Compute, t + 400_000));
            probes::layer::record_step(&probe, step_at(i, t + 800_000));
        }
        // (The thread's name is announced at its first span.)
        let before_flush = rx.try_iter().filter(|e| matches!(e, Event::Spans(_) | Event::Step(_))).count();
        probes::flush_thread();
        (before_flush, rx.try_iter().collect::<Vec<_>>())
    })
    .join()
    .unwrap();
    let (before_flush, events) = got;
    assert_eq!(before_flush, 0, "a step of its own would wake the reader every step");
    // The spans first (one batch), then the steps in order: a reader sees each step's spans
    // before its record.
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::Spans(v) => Some(format!("spans {}", v.len())),
            Event::Step(s) => Some(format!("step {}", s.step)),
            // The thread's name, announced with its first span.
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["spans 6", "step 0", "step 1", "step 2"], "{events:?}");
}

#[test]
fn a_full_batch_of_steps_is_sent_without_a_flush() {
    let (probe, rx) = Probe::new(1024);
    let n = probes::layer::BATCH as u64;
    let sent = std::thread::spawn(move || {
        for i in 0..n {
            probes::layer::record_step(&probe, step_at(i, 1_000 * (i + 1)));
        }
        rx.try_iter().filter(|e| matches!(e, Event::Step(_))).count()
    })
    .join()
    .unwrap();
    assert_eq!(sent as u64, n);
}

#[test]
fn a_batch_the_reader_hands_back_carries_a_later_batch_of_the_thread() {
    let (probe, rx) = Probe::new(1024);
    let spares = probe.spares();
    let span = |step| probes::SpanRecord {
        stage: Stage::Compute,
        thread: 0,
        start_ns: 1_000 * step,
        dur_ns: 500,
        cpu_ns: NONE,
        queue_ns: NONE,
        step,
        sample: NONE,
        bytes: NONE,
    };
    let batches = std::thread::spawn(move || {
        let mut sent = Vec::new();
        for step in 0..3 {
            probes::layer::record(&probe, span(step));
            probes::flush_thread();
            let batch = rx.try_iter().find_map(|e| match e {
                Event::Spans(v) => Some(v),
                _ => None,
            });
            let batch = batch.expect("a flush sends the batch");
            sent.push((batch.as_ptr() as usize, batch.iter().map(|r| r.step).collect::<Vec<_>>()));
            // The reader is done with it.
            spares.put(batch);
        }
        sent
    })
    .join()
    .unwrap();
    // Each batch holds its own record only (a batch handed back is emptied).
    let steps: Vec<_> = batches.iter().map(|(_, s)| s.clone()).collect();
    assert_eq!(steps, [vec![0], vec![1], vec![2]]);
    // The first batch's memory came back and carried the third (the second was allocated
    // before the first was handed back): a thread's steady state allocates nothing.
    assert_eq!(batches[2].0, batches[0].0);
}

#[test]
fn spares_give_back_empty_batches_and_a_new_one_when_none_is_kept() {
    let (probe, _rx) = Probe::new(8);
    let spares = probe.spares();
    assert_eq!(probe.spare_batch().capacity(), 0, "nothing kept yet: no memory taken");
    let mut v = Vec::with_capacity(64);
    v.push(probes::SpanRecord {
        stage: Stage::Wait,
        thread: 1,
        start_ns: 0,
        dur_ns: 1,
        cpu_ns: NONE,
        queue_ns: NONE,
        step: 0,
        sample: NONE,
        bytes: NONE,
    });
    spares.put(v);
    let back = probe.spare_batch();
    assert!(back.is_empty() && back.capacity() >= 64, "{}", back.capacity());
}
