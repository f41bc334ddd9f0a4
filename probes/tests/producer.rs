#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Producers over a real socket: a worker's spans reach the parent's viewers under the
//! parent's thread ids, and a producer that stays connected never holds up the run's end.

mod common;
use common::until;

use probes::attach::wire::{self, Frame, Hello, WireEvent};
use probes::attach::{producer, start, Options};
use probes::{Event, Probe, SpanRecord, Stage, NONE};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn identity(program: &str) -> Hello {
    Hello {
        version: wire::VERSION,
        pid: 4242,
        program: program.into(),
        settings: serde_json::Value::Null,
        threads: vec![],
        rank: None,
    }
}

fn span(thread: u32, sample: u64) -> SpanRecord {
    SpanRecord {
        stage: Stage::Decode,
        thread,
        start_ns: 10,
        dur_ns: 5,
        cpu_ns: 4,
        queue_ns: NONE,
        step: NONE,
        sample,
        bytes: NONE,
    }
}

#[test]
fn worker_spans_reach_viewers_and_a_silent_worker_does_not_hold_up_the_end() {
    let tmp = tempfile::tempdir().unwrap();
    std::env::set_var("XDG_RUNTIME_DIR", tmp.path());
    let mut opts = Options::new("producer-test");
    opts.sampler = None;
    let (probe, rx) = Probe::new(1024);
    let session = start(opts, probe.clone(), rx).unwrap();
    let addr = session.address().to_string();

    let mut viewer = UnixStream::connect(&addr).unwrap();
    wire::client_hello(&mut viewer).unwrap();
    assert!(matches!(wire::read_frame(&mut viewer).unwrap(), Frame::Hello(_)));
    until("the viewer", || session.clients() == 1);

    // A worker: announces its thread (its own id 1, like the parent's first thread), sends
    // spans, finishes.
    let worker = producer::connect(&addr, identity("worker"), 64).unwrap();
    let wp = worker.probe();
    wp.send(Event::Thread { id: 1, name: "loader-0 (pid 4242)".into() });
    wp.send_spans((0..5).map(|i| span(1, i)).collect());
    worker.finish();
    let (mut names, mut spans) = (Vec::new(), Vec::new());
    viewer.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // One frame into `names` / `spans`; false at the run's end.
    let mut read_into = |names: &mut Vec<(u32, String)>, spans: &mut Vec<SpanRecord>| {
        match wire::read_frame(&mut viewer).unwrap() {
            Frame::Event(WireEvent::Thread { id, name }) => names.push((id, name)),
            Frame::Spans(v) => spans.extend(v),
            Frame::End(_) => return false,
            _ => {}
        }
        true
    };
    while names.is_empty() || spans.len() < 5 {
        read_into(&mut names, &mut spans);
    }
    // It relayed, so it was counted; it finished, so the count goes back to zero.
    until("the relay to end", || session.producers() == 0);
    // Producers are not viewers.
    assert_eq!(session.clients(), 1);

    // A second worker connects and then says nothing: the run ends anyway.
    let silent = producer::connect(&addr, identity("silent"), 64).unwrap();
    until("the silent worker", || session.producers() == 1);
    session.finish();
    while read_into(&mut names, &mut spans) {}
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!(names[0].1, "loader-0 (pid 4242)");
    assert_eq!(spans.len(), 5);
    assert!(spans.iter().all(|s| s.thread == names[0].0 && s.cpu_ns == 4));
    assert_eq!(spans.iter().map(|s| s.sample).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
    drop(silent);
}

#[test]
fn connecting_to_nothing_is_an_error_not_a_hang() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("gone.sock");
    let err = producer::connect(missing.to_str().unwrap(), identity("w"), 8).err().unwrap();
    assert!(err.to_string().contains("gone.sock"), "{err}");
}
