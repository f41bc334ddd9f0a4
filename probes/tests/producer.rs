#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Producers over a real socket: a worker's spans reach the parent's viewers under the
//! parent's thread ids, and a producer that stays connected never holds up the run's end.

mod common;
use common::until;

use probes::attach::wire::{self, Frame, Hello, WireEvent};
use probes::attach::{producer, start, Options};
use probes::{Event, Probe, SpanRecord, Stage, ThreadRole, NONE};
use std::os::unix::net::UnixStream;
use std::time::Duration;

fn identity(program: &str) -> Hello {
    let mut h = Hello::this_process(program.into(), serde_json::Value::Null);
    (h.pid, h.rank) = (4242, None);
    h
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
    wp.send(Event::Thread { id: 1, name: "loader-0 (pid 4242)".into(), role: ThreadRole::loader(0) });
    wp.send_spans((0..5).map(|i| span(1, i)).collect());
    worker.finish();
    let (mut names, mut spans) = (Vec::new(), Vec::new());
    viewer.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // One frame into `names` / `spans`; false at the run's end.
    let mut read_into = |names: &mut Vec<(u32, String)>, spans: &mut Vec<SpanRecord>| {
        match wire::read_frame(&mut viewer).unwrap() {
            Frame::Event(WireEvent::Thread { id, name, .. }) => names.push((id, name)),
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

/// Accepts one producer on `listener` (bounded: a producer that never connects fails the test)
/// and checks its handshake.
fn accept_producer(listener: &std::os::unix::net::UnixListener) -> UnixStream {
    listener.set_nonblocking(true).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        match listener.accept() {
            Ok((mut c, _)) => {
                c.set_nonblocking(false).unwrap();
                assert_eq!(wire::check_peer_hello(&mut c), Ok(wire::Peer::Producer));
                return c;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "the producer never connected (again)");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_parent_slow_to_read_loses_no_event_uncounted() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let worker = producer::connect(path.to_str().unwrap(), identity("worker"), 16).unwrap();
    let conn = accept_producer(&listener);
    // The parent reads nothing (stopped, as by SIGSTOP) until the worker's channel is full.
    let wp = worker.probe();
    let mut sent = 0u64;
    while wp.dropped() == 0 {
        wp.send_spans((0..64).map(|i| span(1, sent + i)).collect());
        sent += 64;
    }
    // More, into the full channel: counted as dropped there.
    for _ in 0..100 {
        wp.send_spans((0..64).map(|i| span(1, sent + i)).collect());
        sent += 64;
    }
    // The parent reads again; the worker finishes.
    let (run, _rx) = Probe::new(1 << 22);
    let relay = {
        let run = run.clone();
        std::thread::spawn(move || producer::relay(&mut std::io::BufReader::new(conn), &run))
    };
    worker.finish();
    let r = relay.join().unwrap();
    // Before: the worker's drops never reached the run ("0 dropped"), and a stall past its
    // write timeout made it give up for good.
    assert_eq!(r.error, None, "the worker's last frame arrived");
    assert!(run.dropped() > 0);
    assert_eq!(r.spans + run.dropped(), sent, "every span arrived or is counted as dropped");
}

#[test]
fn a_producer_whose_connection_broke_connects_again_and_says_what_it_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let worker = producer::connect(path.to_str().unwrap(), identity("worker"), 1024).unwrap();
    let wp = worker.probe();
    wp.send(Event::Thread { id: 1, name: "loader-0".into(), role: ThreadRole::loader(0) });
    wp.send_spans(vec![span(1, 0)]);
    let (run, rx) = Probe::new(1 << 16);
    let mut first = accept_producer(&listener);
    assert!(matches!(wire::read_frame(&mut first).unwrap(), Frame::Hello(_)));
    // The first spans arrive; then the parent's side of the connection goes.
    while !matches!(wire::read_frame(&mut first).unwrap(), Frame::Spans(_)) {}
    drop(first);
    // The worker goes on sending; a write finds the connection broken and it connects again.
    let relay = {
        let run = run.clone();
        std::thread::spawn(move || {
            let mut again = accept_producer(&listener);
            producer::relay(&mut again, &run)
        })
    };
    // Until spans arrive on the new connection (bounded: before, none ever did).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut sample = 1;
    while rx.is_empty() {
        assert!(std::time::Instant::now() < deadline, "nothing arrived on a new connection");
        wp.send_spans(vec![span(1, sample)]);
        sample += 1;
        std::thread::yield_now();
    }
    worker.finish();
    let r = relay.join().unwrap();
    // Before: the worker gave up at the first failed write; nothing came again.
    assert_eq!(r.error, None);
    assert_eq!(r.hello.pid, 4242);
    assert!(r.spans > 0, "spans sent after the break arrived on the new connection");
    // Its thread's name came again with it, so its spans are not an unnamed thread.
    let names: Vec<String> = rx
        .try_iter()
        .filter_map(|e| if let Event::Thread { name, .. } = e { Some(name.to_string()) } else { None })
        .collect();
    assert!(names.iter().any(|n| n == "loader-0"), "{names:?}");
}
