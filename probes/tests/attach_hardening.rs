#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The attach server against what a hostile or unlucky peer does: a viewer whose handshake
//! lands after the run ended, TCP peers without the run's token, more connections than it
//! serves at once; and a diverged loss on the wire.

mod common;
use common::until;

use probes::attach::server::{Server, MAX_CONNECTIONS};
use probes::attach::wire::{self, Frame, Hello, WireError, WireEvent};
use probes::attach::{start, Options};
use probes::{Event, Probe, StepRecord};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

fn hello() -> Hello {
    Hello {
        version: wire::VERSION,
        pid: 1,
        program: "t".into(),
        settings: serde_json::Value::Null,
        threads: vec![],
        roles: vec![],
        rank: None,
        dropped: 0,
    }
}

fn step(k: u64, loss: f32) -> StepRecord {
    StepRecord {
        no_loss: false,
        step: k,
        epoch: 0,
        images: 8,
        loss,
        correct: 1,
        end_ns: k,
        queued: 0,
        validation: false,
    }
}

#[test]
fn a_viewer_whose_handshake_lands_after_the_end_gets_the_end_and_is_closed() {
    let (probe, rx) = Probe::new(64);
    let mut server = Server::start(rx, probe.clone(), hello()).unwrap();
    // A viewer on time sees a diverged loss arrive as data.
    let (mut early, theirs) = UnixStream::pair().unwrap();
    early.write_all(&wire::hello_bytes(wire::MAGIC, "")).unwrap();
    server.serve(theirs);
    assert!(matches!(wire::read_frame(&mut early), Ok(Frame::Hello(_))));
    until("the early viewer to be listed", || server.clients() == 1);
    // The late one: accepted, but its handshake is not sent yet.
    let (mut late, theirs) = UnixStream::pair().unwrap();
    server.serve(theirs);
    probe.send(Event::Step(step(7, f32::NAN)));
    probe.send(Event::Step(step(8, f32::INFINITY)));
    probe.send_blocking(Event::Finish);
    until("the run to end", || server.ended());
    late.write_all(&wire::hello_bytes(wire::MAGIC, "")).unwrap();
    assert!(matches!(wire::read_frame(&mut late), Ok(Frame::Hello(_))));
    assert!(matches!(wire::read_frame(&mut late), Ok(Frame::End(_))), "the late viewer gets the end");
    assert_eq!(wire::read_frame(&mut late), Err(WireError::Closed), "and is closed");
    // Joining does not wait on it (it would forever, were it listed after the end).
    server.join();
    let mut losses = Vec::new();
    loop {
        match wire::read_frame(&mut early) {
            Ok(Frame::Event(WireEvent::Step(s))) => losses.push(s.loss),
            Ok(Frame::End(_)) => break,
            other => panic!("{other:?}"),
        }
    }
    assert!(losses.len() == 2 && losses[0].is_nan() && losses[1] == f32::INFINITY, "{losses:?}");
}

#[test]
fn over_tcp_only_peers_with_the_runs_token_get_in_and_connections_are_capped() {
    let (probe, rx) = Probe::new(1024);
    let mut opts = Options::new("tcp-test");
    opts.sampler = None;
    opts.listen = Some("127.0.0.1:0".into());
    let session = start(opts, probe, rx).unwrap();
    let token = session.token().expect("a TCP run has a token").to_string();
    assert!(token.len() >= 32, "128 random bits: {token}");
    assert_eq!(std::env::var(wire::TOKEN_ENV).unwrap(), token, "worker processes inherit it");
    let addr = session.address().to_string();

    // A viewer without the token, one with a wrong one: closed before the run says anything.
    for t in ["", "0123456789abcdef0123456789abcdef"] {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&wire::hello_bytes(wire::MAGIC, t)).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(got.is_empty(), "nothing about the run is sent without the token ({t:?})");
    }
    until("both refusals to be counted", || session.stats().bad_handshakes == 2);

    // A viewer with it is served; a producer without it cannot inject a step.
    let mut viewer = TcpStream::connect(&addr).unwrap();
    viewer.write_all(&wire::hello_bytes(wire::MAGIC, &token)).unwrap();
    assert!(matches!(wire::read_frame(&mut viewer), Ok(Frame::Hello(_))));
    until("the viewer to be listed", || session.clients() == 1);
    let mut intruder = TcpStream::connect(&addr).unwrap();
    intruder.write_all(&wire::hello_bytes(wire::PRODUCER_MAGIC, "")).unwrap();
    let _ = intruder.write_all(&wire::encode(&Frame::Hello(hello())).unwrap());
    let _ = intruder.write_all(&wire::encode(&Frame::Event(WireEvent::Step(step(666, 0.0)))).unwrap());
    until("the intruder to be refused", || session.stats().bad_handshakes == 3);
    session.step(step(1, 0.5));
    match wire::read_frame(&mut viewer) {
        Ok(Frame::Event(WireEvent::Step(s))) => assert_eq!(s.step, 1, "only the run's own step"),
        other => panic!("{other:?}"),
    }

    // Connections that never finish their handshake hold a thread each, up to the cap.
    let idle: Vec<TcpStream> = (0..MAX_CONNECTIONS + 4).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    until("connections past the cap to be refused", || session.stats().connections_refused >= 4);
    drop(idle);
    session.finish();
}
