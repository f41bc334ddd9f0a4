//! Producers: worker processes that send their spans into another process's run.
//!
//! A training program's loader often runs in child processes (Python `multiprocessing`,
//! PyTorch `DataLoader` workers). Each child connects to the parent's attach server as a
//! producer ([`wire::PRODUCER_MAGIC`]), says who it is with a [`Frame::Hello`], then sends
//! the same frames a viewer would receive. The parent relays them into its own channel:
//! every viewer sees the workers' spans as threads of the run, under ids the parent assigns.
//!
//! Neither side ever waits for the other: the child's spans go through its own bounded
//! channel to a writer thread, and the parent reads each producer on its own thread and
//! forwards without blocking. A child that dies is a connection that closes.

use super::conn::{Address, Conn, Stream};
use super::wire::{self, Frame, Hello, WireError, WireEvent};
use super::{io, AttachError};
use crate::event::Event;
use crate::probe::{Probe, Spares};
use crate::role::ThreadRole;
use crossbeam_channel::{Receiver, TryRecvError};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Threads one producer may announce; later ones share one id (a bound on hostile input).
pub const MAX_PRODUCER_THREADS: usize = 1024;

/// How long one write may block while the parent is slow to read: the writer then goes back
/// to its channel. What it encoded stays queued, in order, never cut mid-frame: a stall
/// (pipeprof stopped, a loaded machine) costs nothing but the events that did not fit.
const WRITE_SLICE: Duration = Duration::from_millis(100);

/// At the end, how long the writer keeps trying while the parent reads nothing (then what is
/// left is given up: a finish never hangs the program's exit).
const FINISH_WAIT: Duration = Duration::from_secs(2);

/// Most bytes encoded and not yet written: past it the writer takes no more events, the
/// channel fills, and the senders' drops are counted (and told to the run).
const MAX_PENDING: usize = 4 << 20;

/// Bytes that make the writer write at once (it writes at least every [`MAX_FLUSH_DELAY`]).
const WRITE_AT: usize = 1 << 16;

/// Between two tries to connect again after the connection broke.
const RECONNECT_EVERY: Duration = Duration::from_millis(200);

/// How often the writer looks for events when none are waiting (and writes out what it
/// buffered). It polls instead of sleeping on the channel: a thread asleep on a channel is woken
/// by each send, a system call on the training thread once per step (a tenth of a 1 ms step's
/// cost under `pipeprof run`); polling costs the writer 100 wake-ups a second and the program
/// nothing.
const POLL: Duration = Duration::from_millis(10);

/// … and at least this often while events keep coming (a loader that records a span every few
/// milliseconds never leaves the channel idle: its steps would reach the run's live view only
/// when the buffer fills).
const MAX_FLUSH_DELAY: Duration = Duration::from_millis(100);

/// The sending end in a worker process. Dropping it finishes like [`Producer::finish`].
pub struct Producer {
    probe: Probe,
    writer: Option<JoinHandle<()>>,
}

/// Connects to `address`, sends the producer handshake and `hello`; writes then block at
/// most [`WRITE_SLICE`].
fn open(address: &str, hello: &Hello) -> std::io::Result<Stream> {
    let mut s = Stream::connect(&Address::parse(address))?;
    s.set_write_timeout(Some(FINISH_WAIT))?;
    wire::producer_hello(&mut s)?;
    let hello = wire::encode(&Frame::Hello(hello.clone())).map_err(std::io::Error::other)?;
    s.write_all(&hello)?;
    s.set_write_timeout(Some(WRITE_SLICE))?;
    Ok(s)
}

/// Connects to the server at `address` (a socket path, or HOST:PORT) as a producer and
/// starts the writer thread. `identity.pid` and `identity.program` name this process in the
/// parent's views.
pub fn connect(address: &str, identity: Hello, capacity: usize) -> Result<Producer, AttachError> {
    let out = open(address, &identity).map_err(io(format!("connect to {address}")))?;
    let (probe, rx) = Probe::new(capacity.max(1));
    let writer = Writer {
        address: address.to_string(),
        identity,
        out: Some(out),
        queue: Queue::default(),
        channel_dropped: probe.drop_counter(),
        lost: 0,
        told: 0,
        names: HashMap::new(),
        last_try: std::time::Instant::now(),
    };
    let writer = std::thread::Builder::new()
        .name("pp-producer".into())
        .spawn({
            let spares = probe.spares();
            move || writer.run(rx, spares)
        })
        .map_err(io("start the producer thread"))?;
    Ok(Producer { probe, writer: Some(writer) })
}

/// Encoded frames not yet written, in order: their bytes, and where each starts and ends with
/// how many events it carries (what a broken connection loses).
#[derive(Default)]
struct Queue {
    bytes: Vec<u8>,
    /// Written so far.
    off: usize,
    /// (start, end, events) of each frame not yet wholly written.
    frames: VecDeque<(usize, usize, u64)>,
}

impl Queue {
    fn push(&mut self, frame: &[u8], events: u64) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(frame);
        self.frames.push_back((start, self.bytes.len(), events));
    }

    /// Puts `frame` before everything not yet written (a new connection's handshake).
    fn push_front(&mut self, frame: &[u8], events: u64) {
        self.drop_written();
        let n = frame.len();
        self.bytes.splice(0..0, frame.iter().copied());
        self.frames.iter_mut().for_each(|f| (f.0, f.1) = (f.0 + n, f.1 + n));
        self.frames.push_front((0, n, events));
    }

    fn pending(&self) -> usize {
        self.bytes.len() - self.off
    }

    fn unwritten(&self) -> &[u8] {
        &self.bytes[self.off..]
    }

    /// `n` more bytes written: frames wholly written are forgotten.
    fn wrote(&mut self, n: usize) {
        self.off += n;
        while self.frames.front().is_some_and(|f| f.1 <= self.off) {
            self.frames.pop_front();
        }
        if self.off == self.bytes.len() || self.off >= WRITE_AT {
            self.drop_written();
        }
    }

    fn drop_written(&mut self) {
        let off = std::mem::take(&mut self.off);
        self.bytes.drain(..off);
        self.frames.iter_mut().for_each(|f| (f.0, f.1) = (f.0 - off, f.1 - off));
    }

    /// The connection broke: a frame cut mid-way is lost, the rest waits for the next
    /// connection. Returns the events of the cut frame.
    fn cut(&mut self) -> u64 {
        let mut lost = 0;
        if let Some(&(start, end, events)) = self.frames.front() {
            if start < self.off {
                self.frames.pop_front();
                self.off = end;
                lost = events;
            }
        }
        self.drop_written();
        lost
    }
}

/// The writer thread: encodes the channel's events, writes them without ever losing a frame
/// to a slow parent, connects again when the connection breaks, and tells the run what was
/// lost (in the next connection's hello, and in its last frame).
struct Writer {
    address: String,
    identity: Hello,
    /// None while the connection is broken.
    out: Option<Stream>,
    queue: Queue,
    /// The senders' drops: the channel was full.
    channel_dropped: Arc<AtomicU64>,
    /// Events lost to broken connections.
    lost: u64,
    /// Drops and losses told to the run so far.
    told: u64,
    /// The threads' names and roles sent so far (sent again on a new connection).
    names: HashMap<u32, (String, ThreadRole)>,
    /// When the last connection was tried.
    last_try: Instant,
}

impl Writer {
    fn run(mut self, rx: Receiver<Event>, spares: Spares) {
        let mut flushed = Instant::now();
        loop {
            let ev = if self.queue.pending() < MAX_PENDING {
                match rx.try_recv() {
                    Ok(ev) => Some(ev),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => Some(Event::Finish),
                }
            } else {
                None
            };
            match ev {
                Some(Event::Finish) => return self.finish(),
                Some(ev) => {
                    self.encode(ev, &spares);
                    if self.queue.pending() >= WRITE_AT || flushed.elapsed() >= MAX_FLUSH_DELAY {
                        self.write();
                        flushed = Instant::now();
                    }
                }
                None => {
                    // Nothing waiting (or no room): write what is queued, then look again after
                    // POLL. Never blocking on the channel means a sender never wakes this thread.
                    if self.queue.pending() > 0 {
                        self.write();
                        flushed = Instant::now();
                    }
                    std::thread::sleep(POLL);
                }
            }
        }
    }

    /// Queues `ev`'s frame (one that cannot be encoded, over the size cap, is left out).
    fn encode(&mut self, ev: Event, spares: &Spares) {
        let (bytes, events) = match ev {
            Event::Spans(v) => {
                let n = v.len() as u64;
                let frame = Frame::Spans(v);
                let bytes = wire::encode(&frame);
                if let Frame::Spans(v) = frame {
                    spares.put(v);
                }
                (bytes, n)
            }
            ev => {
                if let Event::Thread { id, name, role } = &ev {
                    self.names.insert(*id, (name.to_string(), *role));
                }
                match Frame::from_event(&ev) {
                    Some(f) => (wire::encode(&f), 1),
                    None => return,
                }
            }
        };
        if let Ok(b) = bytes {
            self.queue.push(&b, events);
        }
    }

    /// Drops and losses not yet told, now told.
    fn untold(&mut self) -> u64 {
        let all = self.channel_dropped.load(Ordering::Relaxed) + self.lost;
        let n = all.saturating_sub(self.told);
        self.told = all;
        n
    }

    /// Writes what is queued until done or the parent stops reading for [`WRITE_SLICE`];
    /// connects again first when the connection broke. Returns whether bytes went out.
    fn write(&mut self) -> bool {
        if self.out.is_none() && !self.reconnect() {
            return false;
        }
        let Some(out) = self.out.as_mut() else { return false };
        let mut wrote = false;
        while self.queue.pending() > 0 {
            match out.write(self.queue.unwritten()) {
                Ok(0) => return self.broke(),
                Ok(n) => {
                    self.queue.wrote(n);
                    wrote = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The parent is slow to read: the rest waits, whole.
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
                Err(_) => return self.broke() || wrote,
            }
        }
        wrote
    }

    /// The connection broke (the parent closed it, or is gone): what was cut is lost, the
    /// rest waits for the next connection.
    fn broke(&mut self) -> bool {
        if let Some(out) = self.out.take() {
            out.shutdown();
        }
        self.lost += self.queue.cut();
        false
    }

    /// Connects again (at most every [`RECONNECT_EVERY`]): a hello that tells what was lost,
    /// then the threads' names, before what was queued.
    fn reconnect(&mut self) -> bool {
        if self.last_try.elapsed() < RECONNECT_EVERY {
            return false;
        }
        self.last_try = Instant::now();
        let mut hello = self.identity.clone();
        let told = self.told;
        hello.dropped = self.untold();
        match open(&self.address, &hello) {
            Ok(s) => {
                let names: Vec<Vec<u8>> = self
                    .names
                    .iter()
                    .filter_map(|(&id, (name, role))| {
                        wire::encode(&Frame::Event(WireEvent::Thread { id, name: name.clone(), role: *role })).ok()
                    })
                    .collect();
                for b in names.iter().rev() {
                    self.queue.push_front(b, 0);
                }
                self.out = Some(s);
                true
            }
            Err(_) => {
                // Not told after all.
                self.told = told;
                false
            }
        }
    }

    /// The last frame (what is still untold), written for at most [`FINISH_WAIT`] without
    /// progress; a broken connection is tried again once or twice, and nobody listening (the
    /// run is over) ends it at once: a finish never holds up the program's exit.
    fn finish(mut self) {
        let mut last_progress = Instant::now();
        let mut ended = false;
        for _ in 0..3 {
            if self.out.is_none() {
                self.last_try = self.last_try.checked_sub(RECONNECT_EVERY).unwrap_or(self.last_try);
                if !self.reconnect() {
                    break;
                }
                // A new connection gets a last frame of its own.
                ended = false;
            }
            if !ended {
                // Counted at the last moment; written after what is queued.
                let stats = wire::ServerStats { events_dropped: self.untold(), ..Default::default() };
                if let Ok(b) = wire::encode(&Frame::End(stats)) {
                    self.queue.push(&b, 0);
                }
                ended = true;
            }
            while self.out.is_some() && self.queue.pending() > 0 && last_progress.elapsed() < FINISH_WAIT {
                if self.write() {
                    last_progress = Instant::now();
                }
            }
            if self.out.is_some() {
                break;
            }
        }
        if let Some(mut out) = self.out.take() {
            let _ = out.flush();
        }
    }
}

impl Producer {
    /// The probe whose events go to the parent: give it to a [`crate::ProbeLayer`].
    pub fn probe(&self) -> Probe {
        self.probe.clone()
    }

    /// Sends what is buffered, tells the parent this producer is done, and waits for the
    /// writer (at most its write timeout when the parent stopped reading).
    pub fn finish(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        crate::layer::flush_thread();
        if let Some(w) = self.writer.take() {
            if !w.is_finished() {
                self.probe.send_blocking(Event::Finish);
            }
            let _ = w.join();
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What the server learned from one producer connection.
#[derive(Debug, PartialEq)]
pub struct Relayed {
    /// The producer's hello.
    pub hello: Hello,
    /// Span records forwarded.
    pub spans: u64,
    /// How the connection ended: `None` = the producer said it was done.
    pub error: Option<WireError>,
    /// Events the producer said it lost (its channel was full, a connection broke), counted
    /// as dropped in the run's probe.
    pub dropped: u64,
}

/// Longest thread name kept from a producer (characters); the rest is cut.
pub const MAX_THREAD_NAME: usize = 64;

/// Maps a producer's thread ids to ids of this process ([`crate::layer::register_thread`]).
struct Threads {
    label: String,
    /// The producer's rank: its thread names are counted for that rank.
    rank: Option<crate::Rank>,
    /// Their id → (ours, whether it was named by a Thread frame).
    map: HashMap<u32, (u32, bool)>,
    overflow: Option<u32>,
}

impl Threads {
    /// Our id for the producer's thread `theirs`, announced with its name and role when it
    /// is `named` (else with a placeholder under the producer's label).
    fn id(&mut self, theirs: u32, named: Option<(&str, ThreadRole)>, probe: &Probe) -> u32 {
        let name = named.map(|(n, _)| n);
        // A thread is registered at most twice: once when first seen, once more when its
        // name comes after its spans. Re-sent Thread frames must not grow the registry.
        if let Some(&(ours, named)) = self.map.get(&theirs) {
            if name.is_none() || named {
                return ours;
            }
        }
        if self.map.len() >= MAX_PRODUCER_THREADS && !self.map.contains_key(&theirs) {
            let label = &self.label;
            let rank = self.rank;
            let other = format!("{label} (other threads)");
            return *self.overflow.get_or_insert_with(|| announce(probe, &other, ThreadRole::Other, rank));
        }
        let full = match name {
            Some(n) => n.chars().take(MAX_THREAD_NAME).collect(),
            None => format!("{} thread-{theirs}", self.label),
        };
        let ours = announce(probe, &full, named.map(|(_, r)| r).unwrap_or_default(), self.rank);
        self.map.insert(theirs, (ours, name.is_some()));
        ours
    }
}

fn announce(probe: &Probe, name: &str, role: ThreadRole, rank: Option<crate::Rank>) -> u32 {
    let id = crate::layer::register_thread(name, role);
    send(probe, rank, Event::Thread { id, name: name.into(), role });
    id
}

/// Sends `ev` into the run, marked with the producer's rank when it has one.
fn send(probe: &Probe, rank: Option<crate::Rank>, ev: Event) {
    match (rank, ev) {
        (None, Event::Spans(v)) => probe.send_spans(v),
        (None, ev) => probe.send(ev),
        (Some(r), Event::Spans(v)) => {
            // The whole batch is dropped (and counted) like an unranked one when it does not fit.
            let n = v.len() as u64;
            if !probe.try_send(Event::Ranked(r, Box::new(Event::Spans(v)))) {
                probe.count_dropped(n.saturating_sub(1));
            }
        }
        (Some(r), ev) => probe.send(Event::Ranked(r, Box::new(ev))),
    }
}

/// The server's side: reads one producer's frames (after its handshake) and forwards them
/// into `probe` without ever blocking on it. Returns when the producer finishes, its
/// connection drops, or it sends something malformed.
pub fn relay(conn: &mut impl Read, probe: &Probe) -> Relayed {
    let hello = match read_hello(conn) {
        Ok(h) => h,
        Err(e) => return Relayed { hello: empty_hello(), spans: 0, error: Some(e), dropped: 0 },
    };
    // A producer that knows its run's settings says them in its hello (a Rust program under
    // `pipeprof run`): they are the run's.
    let rank = hello.rank;
    // What it lost before this connection (it connected again after a broken one).
    let mut dropped = hello.dropped;
    probe.count_dropped(hello.dropped);
    if hello.settings.is_object() {
        send(probe, rank, Event::Settings(Box::new(hello.settings.clone())));
    }
    let label = match rank {
        Some(r) => format!("{} (rank {}, pid {})", hello.program, r.rank, hello.pid),
        None => format!("{} (pid {})", hello.program, hello.pid),
    };
    let mut threads = Threads { label, rank, map: HashMap::new(), overflow: None };
    let mut spans = 0u64;
    let error = loop {
        match wire::read_frame(conn) {
            Ok(Frame::Spans(mut v)) => {
                for s in &mut v {
                    s.thread = threads.id(s.thread, None, probe);
                }
                spans += v.len() as u64;
                send(probe, rank, Event::Spans(v));
            }
            Ok(Frame::Event(WireEvent::Thread { id, name, role })) => {
                threads.id(id, Some((&name, role)), probe);
            }
            Ok(Frame::Event(WireEvent::Step(s))) => send(probe, rank, Event::Step(s)),
            Ok(Frame::Event(WireEvent::Skipped { path, reason })) => {
                send(probe, rank, Event::Skipped { path: path.into(), reason: reason.into() })
            }
            Ok(Frame::Event(WireEvent::Settings(v))) => send(probe, rank, Event::Settings(Box::new(v))),
            Ok(Frame::Event(WireEvent::Failed(why))) => send(probe, rank, Event::Failed(why.into_boxed_str())),
            // The parent samples the machine itself; a worker's samples would be counted twice.
            Ok(Frame::Event(WireEvent::Host(_) | WireEvent::Gpu(_))) => {}
            Ok(Frame::End(stats)) => {
                dropped += stats.events_dropped;
                probe.count_dropped(stats.events_dropped);
                break None;
            }
            Ok(Frame::Hello(_)) => {
                let why = "a second hello".to_string();
                break Some(WireError::Malformed { what: "hello", why });
            }
            Err(e) => break Some(e),
        }
    };
    Relayed { hello, spans, error, dropped }
}

/// A producer's first frame, its hello, its program's name made printable; an error for any
/// other frame.
fn read_hello(conn: &mut impl Read) -> Result<Hello, WireError> {
    match wire::read_frame(conn)? {
        Frame::Hello(mut h) => {
            // The name labels every thread of the producer and is printed: capped, and no
            // control character reaches a terminal.
            h.program = h.program.chars().take(MAX_THREAD_NAME).map(|c| if c.is_control() { '?' } else { c }).collect();
            Ok(h)
        }
        _ => Err(WireError::Malformed { what: "hello", why: "a producer must say hello first".to_string() }),
    }
}

fn empty_hello() -> Hello {
    Hello {
        version: wire::VERSION,
        pid: 0,
        program: String::new(),
        settings: serde_json::Value::Null,
        threads: vec![],
        roles: vec![],
        rank: None,
        dropped: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::SpanRecord;
    use crate::stage::Stage;
    use crate::NONE;

    fn span(thread: u32) -> SpanRecord {
        SpanRecord {
            stage: Stage::Decode,
            thread,
            start_ns: 1,
            dur_ns: 2,
            cpu_ns: 1,
            queue_ns: NONE,
            step: NONE,
            sample: 5,
            bytes: NONE,
        }
    }

    fn hello() -> Frame {
        Frame::Hello(Hello {
            version: wire::VERSION,
            pid: 77,
            program: "worker-0".into(),
            settings: serde_json::Value::Null,
            threads: vec![],
            roles: vec![],
            rank: None,
            dropped: 0,
        })
    }

    fn stream(frames: &[Frame]) -> Vec<u8> {
        frames.iter().flat_map(|f| wire::encode(f).expect("test frames encode")).collect()
    }

    fn received(rx: &Receiver<Event>) -> (Vec<(u32, String)>, Vec<SpanRecord>) {
        let (mut names, mut spans) = (Vec::new(), Vec::new());
        for ev in rx.try_iter() {
            match ev {
                Event::Thread { id, name, .. } => names.push((id, name.to_string())),
                Event::Spans(v) => spans.extend(v),
                _ => {}
            }
        }
        (names, spans)
    }

    #[test]
    fn relayed_threads_get_fresh_ids_and_their_names() {
        let (probe, rx) = Probe::new(64);
        let bytes = stream(&[
            hello(),
            Frame::Event(WireEvent::Thread { id: 1, name: "worker-0".into(), role: ThreadRole::loader(0) }),
            Frame::Spans(vec![span(1), span(1)]),
            // A thread whose name never arrived still gets an id, labelled by its process.
            Frame::Spans(vec![span(9)]),
            Frame::End(Default::default()),
        ]);
        let r = relay(&mut &bytes[..], &probe);
        assert_eq!((r.spans, r.error, r.hello.pid), (3, None, 77));
        let (names, spans) = received(&rx);
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(names[0].1, "worker-0");
        assert_eq!(names[1].1, "worker-0 (pid 77) thread-9");
        assert_eq!(spans.iter().map(|s| s.thread).collect::<Vec<_>>(), vec![names[0].0, names[0].0, names[1].0]);
        // The ids come from this process's counter and registry, so they cannot collide with
        // this process's own threads or another producer's.
        assert_ne!(names[0].0, names[1].0);
        let registry = crate::layer::thread_names();
        assert!(names.iter().all(|n| registry.contains(n)), "{registry:?}");
        // The role travels with the name, into the registry too; a placeholder has none.
        let roles = crate::layer::thread_roles();
        assert!(roles.contains(&(names[0].0, ThreadRole::loader(0))), "{roles:?}");
        assert!(!roles.iter().any(|(id, _)| *id == names[1].0), "{roles:?}");
    }

    #[test]
    fn a_producer_that_dies_or_lies_ends_its_relay_with_a_reason() {
        let (probe, rx) = Probe::new(64);
        // Killed mid-frame: what arrived whole is kept, the relay ends.
        let mut cut = stream(&[hello(), Frame::Spans(vec![span(1)]), Frame::Spans(vec![span(1)])]);
        cut.truncate(cut.len() - 10);
        let r = relay(&mut &cut[..], &probe);
        assert_eq!((r.spans, r.error), (1, Some(WireError::Truncated)));
        assert_eq!(received(&rx).1.len(), 1);
        // No hello first.
        let r = relay(&mut &stream(&[Frame::Spans(vec![span(1)])])[..], &probe);
        assert!(matches!(r.error, Some(WireError::Malformed { what: "hello", .. })), "{r:?}");
        // Closed between frames.
        let r = relay(&mut &stream(&[hello()])[..], &probe);
        assert_eq!(r.error, Some(WireError::Closed));
        // Samples from a worker are not the parent's machine: not forwarded.
        let host = Frame::Event(WireEvent::Host(Default::default()));
        let r = relay(&mut &stream(&[hello(), host, Frame::End(Default::default())])[..], &probe);
        assert_eq!(r.error, None);
        assert_eq!(rx.try_iter().count(), 0);
    }

    #[test]
    fn thread_frames_sent_again_register_nothing_new_and_long_names_are_cut() {
        let (probe, rx) = Probe::new(4096);
        let mut frames = vec![hello(), Frame::Spans(vec![span(1)])];
        // The name after the spans: one rename. Then the same frame a thousand times.
        let long = "w".repeat(10 * MAX_THREAD_NAME);
        let named = || Frame::Event(WireEvent::Thread { id: 1, name: long.clone(), role: ThreadRole::Other });
        frames.extend((0..1000).map(|_| named()));
        frames.push(Frame::Spans(vec![span(1)]));
        frames.push(Frame::End(Default::default()));
        let r = relay(&mut &stream(&frames)[..], &probe);
        assert_eq!(r.error, None);
        let (names, spans) = received(&rx);
        assert_eq!(names.len(), 2, "the placeholder, then the name once");
        assert_eq!(names[1].1.chars().count(), MAX_THREAD_NAME);
        assert_eq!(spans[1].thread, names[1].0, "later spans carry the named id");
    }

    #[test]
    fn a_ranked_producers_events_arrive_marked_with_its_rank() {
        let (probe, rx) = Probe::new(64);
        let r1 = crate::Rank { rank: 1, local_rank: 1, world_size: 2 };
        let Frame::Hello(mut h) = hello() else { unreachable!() };
        h.rank = Some(r1);
        let step = crate::StepRecord {
            no_loss: false,
            step: 0,
            epoch: 0,
            images: 8,
            loss: 1.0,
            correct: 0,
            end_ns: 9,
            queued: 0,
            validation: false,
        };
        let bytes = stream(&[
            Frame::Hello(h),
            Frame::Event(WireEvent::Thread { id: 1, name: "rank 1".into(), role: ThreadRole::Train }),
            Frame::Spans(vec![span(1)]),
            Frame::Event(WireEvent::Step(step)),
            Frame::End(Default::default()),
        ]);
        let r = relay(&mut &bytes[..], &probe);
        assert_eq!((r.spans, r.error), (1, None));
        let got: Vec<Event> = rx.try_iter().collect();
        assert_eq!(got.len(), 3, "{got:?}");
        for ev in &got {
            let Event::Ranked(rank, inner) = ev else { panic!("unmarked: {ev:?}") };
            assert_eq!(*rank, r1);
            assert!(!matches!(**inner, Event::Ranked(..)));
        }
        assert!(matches!(&got[2], Event::Ranked(_, e) if **e == Event::Step(step)));
        // Without a rank in the hello, nothing is marked.
        let (probe, rx) = Probe::new(64);
        let bytes = stream(&[hello(), Frame::Spans(vec![span(1)]), Frame::End(Default::default())]);
        relay(&mut &bytes[..], &probe);
        assert!(rx.try_iter().all(|e| !matches!(e, Event::Ranked(..))));
    }

    #[test]
    fn thread_ids_per_producer_are_bounded() {
        let (probe, rx) = Probe::new(4 * MAX_PRODUCER_THREADS);
        let mut frames = vec![hello()];
        frames.extend((0..MAX_PRODUCER_THREADS as u32 + 50).map(|t| Frame::Spans(vec![span(t)])));
        frames.push(Frame::End(Default::default()));
        let r = relay(&mut &stream(&frames)[..], &probe);
        assert_eq!(r.error, None);
        let (names, spans) = received(&rx);
        assert_eq!(names.len(), MAX_PRODUCER_THREADS + 1, "the rest share one id");
        assert_eq!(spans.len(), MAX_PRODUCER_THREADS + 50);
    }
}
