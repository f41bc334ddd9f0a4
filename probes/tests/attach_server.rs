#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The attach server in a real process: private socket, hostile handshakes refused, clients
//! come and go, a client that never reads is cut off without slowing the program.
//!
//! One test function: `init` installs the process-wide tracing subscriber once.

mod common;
use common::until;

use probes::attach::wire::{self, Frame, WireEvent};
use probes::attach::{init, Options};
use probes::{StepRecord, NONE};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn connect(addr: &str) -> UnixStream {
    let mut s = UnixStream::connect(addr).unwrap();
    wire::client_hello(&mut s).unwrap();
    match wire::read_frame(&mut s).unwrap() {
        Frame::Hello(h) => assert_eq!(h.pid, std::process::id()),
        other => panic!("expected hello, got {other:?}"),
    }
    s
}

fn step(k: u64) -> StepRecord {
    StepRecord {
        no_loss: false,
        step: k,
        epoch: 0,
        images: 8,
        loss: 1.0,
        correct: 1,
        end_ns: k,
        queued: 0,
        validation: false,
    }
}

#[test]
fn server_serves_clients_refuses_garbage_and_cuts_off_a_slow_reader() {
    let tmp = tempfile::tempdir().unwrap();
    std::env::set_var("XDG_RUNTIME_DIR", tmp.path());
    let mut opts = Options::new("server-test");
    opts.sampler = None;
    let session = init(opts).unwrap();
    let addr = session.address().to_string();
    assert!(addr.starts_with(tmp.path().to_str().unwrap()));
    assert_eq!(std::fs::metadata(&addr).unwrap().permissions().mode() & 0o777, 0o600);

    // Garbage instead of a handshake: refused, counted, the server goes on.
    let mut bad = UnixStream::connect(&addr).unwrap();
    bad.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = Vec::new();
    let _ = bad.read_to_end(&mut buf);
    assert!(buf.is_empty(), "nothing is sent to a peer that did not say hello");
    until("the bad handshake to be counted", || session.stats().bad_handshakes == 1);

    // A reader that keeps up, counting steps.
    let a = connect(&addr);
    let seen = Arc::new(AtomicU64::new(0));
    let reader = {
        let seen = seen.clone();
        let mut a = a.try_clone().unwrap();
        std::thread::spawn(move || {
            while let Ok(f) = wire::read_frame(&mut a) {
                if let Frame::Event(WireEvent::Step(_)) = f {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    until("client a", || session.clients() == 1);
    // A client that says hello and then never reads.
    let _slow = connect(&addr);
    until("the slow client", || session.clients() == 2);

    // Paced so the good reader keeps up; the slow one's queue and socket buffer overflow.
    let mut sent = 0u64;
    for _ in 0..12 {
        for _ in 0..1000 {
            session.step(step(sent));
            sent += 1;
        }
        until("client a to read its steps", || seen.load(Ordering::Relaxed) == sent);
    }
    assert_eq!(session.stats().slow_clients_dropped, 1, "the slow client was cut off");
    assert_eq!(session.clients(), 1, "the good client is still attached");
    assert_eq!(session.probe().dropped(), 0, "the program never had to drop an event");

    // Client a leaves; client b arrives later and gets spans.
    a.shutdown(std::net::Shutdown::Both).unwrap();
    reader.join().unwrap();
    let mut b = connect(&addr);
    until("client b", || session.clients() >= 1);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..10u64 {
                let _g = tracing::info_span!("decode", sample = i).entered();
            }
            probes::flush_thread();
        });
    });
    let mut spans = 0;
    while spans < 10 {
        match wire::read_frame(&mut b).unwrap() {
            Frame::Spans(v) => {
                assert!(v.iter().all(|s| s.stage == probes::Stage::Decode && s.step == NONE));
                spans += v.len();
            }
            Frame::Event(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    // The end: b hears that the run ended, with the counters.
    let ender = std::thread::spawn(move || session.finish());
    let end = loop {
        match wire::read_frame(&mut b).unwrap() {
            Frame::End(stats) => break stats,
            _ => continue,
        }
    };
    ender.join().unwrap();
    assert_eq!((end.slow_clients_dropped, end.bad_handshakes), (1, 1));
    assert!(!std::path::Path::new(&addr).exists(), "socket removed at the end");
}
