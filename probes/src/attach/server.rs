//! The server inside a profiled program: fans events out to attached clients.
//!
//! One thread drains the probe channel and encodes each event once; each client has its own
//! writer thread and a bounded queue. A client whose queue is full is too slow: it is
//! disconnected (and counted), so the program never waits for a viewer. With no client,
//! events are drained and dropped: a program nobody attaches to pays the Layer cost only.

pub use super::conn::Conn;
use super::wire::{self, Frame, Hello, ServerStats};
use crate::event::Event;
use crate::probe::Probe;
use crossbeam_channel::{Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Frames queued per client before it counts as too slow.
pub const CLIENT_QUEUE: usize = 4096;
/// Connections served at once (viewers, producers, handshakes in progress), each a thread;
/// more are refused and counted.
pub const MAX_CONNECTIONS: u64 = 64;

struct Client {
    tx: Sender<Arc<Vec<u8>>>,
}

#[derive(Default)]
struct Shared {
    clients: Mutex<Vec<Client>>,
    stats: Mutex<ServerStats>,
    connected: AtomicU64,
    /// Producers (worker processes) relaying into this run now, plus connections whose
    /// handshake is not read yet (they may be producers: a worker that connected, sent
    /// everything and exited must still count until its frames are relayed).
    producers: AtomicU64,
    /// Threads relaying a producer: not joined at shutdown (a worker may outlive the run).
    relay_threads: Mutex<Vec<std::thread::ThreadId>>,
    /// When a producer last sent bytes (monotonic ns; 0: never).
    last_relay_ns: AtomicU64,
    stopping: AtomicBool,
    /// Connection threads alive now (see [`MAX_CONNECTIONS`]).
    active: AtomicU64,
    /// The End frame, once the run has ended: a viewer whose handshake lands after it gets
    /// it at once and is closed, instead of joining a list nobody sends to any more.
    end: Mutex<Option<Arc<Vec<u8>>>>,
    /// The token a TCP peer must send; `None` on a Unix socket.
    token: Option<String>,
    /// The last GPU sample: the "GPU sampling off" notice is sent once at start, and a client
    /// that attaches later must still see it.
    last_gpu: Mutex<Option<Arc<Vec<u8>>>>,
}

/// An encoded frame, shared by every client's queue.
type Encoded = Arc<Vec<u8>>;

/// A connection thread, counted out however it ends.
struct Active(Arc<Shared>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One accepted connection: its handshake read, then relayed (a worker process producing into
/// this run) or served (a viewer), or refused.
fn client(
    mut conn: impl Conn,
    shared: &Arc<Shared>,
    hello: Option<Hello>,
    probe: &Probe,
    queue: (Sender<Encoded>, Receiver<Encoded>),
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
    let peer = wire::check_peer_hello_token(&mut conn, shared.token.as_deref());
    if !matches!(peer, Ok(wire::Peer::Producer)) {
        shared.producers.fetch_sub(1, Ordering::SeqCst);
    }
    match peer {
        Ok(wire::Peer::Viewer) => view(conn, shared, hello, queue),
        Ok(wire::Peer::Producer) => relay_producer(conn, shared, probe),
        Err(e) => {
            eprintln!("pipeprof probes: refused a connection: {e}");
            if let Ok(mut st) = shared.stats.lock() {
                st.bad_handshakes += 1;
            }
            conn.shutdown();
        }
    }
}

/// A worker process: it may stay quiet for long (no read timeout), and it is never joined at
/// shutdown, so a live child cannot hold up the run's end.
fn relay_producer(mut conn: impl Conn, shared: &Arc<Shared>, probe: &Probe) {
    let _ = conn.set_read_timeout(None);
    if let Ok(mut t) = shared.relay_threads.lock() {
        t.push(std::thread::current().id());
    }
    // Checked after registering: `join` sets `stopping` before it reads the list, so a producer
    // arriving during shutdown is either skipped or leaves.
    if shared.stopping.load(Ordering::SeqCst) {
        shared.producers.fetch_sub(1, Ordering::SeqCst);
        conn.shutdown();
        return;
    }
    let mut touched = Touch { inner: &mut conn, last: &shared.last_relay_ns };
    let r = super::producer::relay(&mut std::io::BufReader::new(&mut touched), probe);
    shared.producers.fetch_sub(1, Ordering::SeqCst);
    if let Some(e) = r.error.filter(|e| *e != wire::WireError::Closed) {
        eprintln!("pipeprof probes: worker {} (pid {}) stopped sending: {e}", r.hello.program, r.hello.pid);
    }
    conn.shutdown();
}

/// A viewer: the greeting (with the threads named so far) and the last GPU sample, then every
/// frame from its queue until it stops reading or the run ends.
fn view(
    mut conn: impl Conn,
    shared: &Arc<Shared>,
    hello: Option<Hello>,
    (tx, rx): (Sender<Encoded>, Receiver<Encoded>),
) {
    let Some(mut hello) = hello else { return };
    hello.threads = crate::layer::thread_names();
    hello.roles = crate::layer::thread_roles();
    let hello = match wire::encode(&Frame::Hello(hello)) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("pipeprof probes: cannot greet a client: {e}");
            conn.shutdown();
            return;
        }
    };
    if conn.write_all(&hello).is_err() {
        return;
    }
    let last_gpu = shared.last_gpu.lock().ok().and_then(|g| g.clone());
    if let Some(g) = last_gpu {
        if conn.write_all(&g).is_err() {
            return;
        }
    }
    let mut clients = shared.clients.lock().unwrap_or_else(|e| e.into_inner());
    let end = shared.end.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match end {
        // The run ended before this viewer was registered: it gets the end, and goes.
        Some(end) => {
            drop(clients);
            let _ = conn.write_all(&end);
            conn.shutdown();
            return;
        }
        None => clients.push(Client { tx }),
    }
    drop(clients);
    for frame in rx.iter() {
        if conn.write_all(&frame).is_err() {
            break;
        }
    }
    conn.shutdown();
}

/// A reader that notes when bytes last arrived.
struct Touch<'a, R> {
    inner: R,
    last: &'a AtomicU64,
}

impl<R: std::io::Read> std::io::Read for Touch<'_, R> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(b)?;
        if n > 0 {
            self.last.store(crate::clock::now_ns(), Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// The running server.
pub struct Server {
    shared: Arc<Shared>,
    fanout: Option<JoinHandle<()>>,
    writers: Arc<Mutex<Vec<JoinHandle<()>>>>,
    hello: Arc<Mutex<Hello>>,
    /// Where producers' events go: the run's own channel.
    probe: Probe,
}

/// The fan-out thread's two jobs.
impl Shared {
    /// One event, encoded once, offered to every client; a client whose queue is full is
    /// dropped (and counted).
    fn broadcast(&self, ev: &Event) {
        let Some(frame) = Frame::from_event(ev) else { return };
        let bytes = match wire::encode(&frame) {
            Ok(b) => Arc::new(b),
            Err(_) => {
                // Counted, and reported to every client with the End frame.
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).unencodable_frames += 1;
                return;
            }
        };
        if let Event::Gpu(_) = ev {
            *self.last_gpu.lock().unwrap_or_else(|e| e.into_inner()) = Some(bytes.clone());
        }
        // A lock poisoned by a panicking writer still holds a usable client list.
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if clients.is_empty() {
            return;
        }
        clients.retain(|c| match c.tx.try_send(bytes.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                if let Ok(mut st) = self.stats.lock() {
                    st.slow_clients_dropped += 1;
                }
                false
            }
            Err(TrySendError::Disconnected(_)) => false,
        });
    }

    /// The run is over: tell every client, with the counters (`events_dropped` the run's).
    fn finish(&self, events_dropped: u64) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
        stats.events_dropped = events_dropped;
        // ServerStats is a few numbers: its encoding cannot fail or be too long.
        let end = Arc::new(wire::encode(&Frame::End(stats)).unwrap_or_default());
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        // Under the clients' lock: a viewer registering now sees either the list still
        // served or the end.
        *self.end.lock().unwrap_or_else(|e| e.into_inner()) = Some(end.clone());
        for c in clients.drain(..) {
            let _ = c.tx.try_send(end.clone());
        }
    }
}

impl Server {
    /// Starts the fan-out thread over `rx` (the probe's channel).
    pub fn start(rx: Receiver<Event>, probe: Probe, hello: Hello) -> std::io::Result<Server> {
        Server::start_with_token(rx, probe, hello, None)
    }

    /// [`Server::start`] for a TCP listener: every peer must send `token` in its handshake.
    pub fn start_with_token(
        rx: Receiver<Event>,
        probe: Probe,
        hello: Hello,
        token: Option<String>,
    ) -> std::io::Result<Server> {
        let shared = Arc::new(Shared { token, ..Shared::default() });
        let s = shared.clone();
        let relay_probe = probe.clone();
        let fanout = std::thread::Builder::new().name("pp-server".into()).spawn(move || {
            while let Ok(ev) = rx.recv() {
                if ev == Event::Finish {
                    break;
                }
                s.broadcast(&ev);
            }
            s.finish(probe.dropped());
        })?;
        Ok(Server {
            shared,
            fanout: Some(fanout),
            writers: Arc::new(Mutex::new(Vec::new())),
            hello: Arc::new(Mutex::new(hello)),
            probe: relay_probe,
        })
    }

    /// Serves one accepted connection on its own thread.
    pub fn serve(&self, conn: impl Conn) {
        if self.shared.stopping.load(Ordering::Relaxed) {
            conn.shutdown();
            return;
        }
        if self.shared.active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            self.shared.active.fetch_sub(1, Ordering::SeqCst);
            if let Ok(mut st) = self.shared.stats.lock() {
                st.connections_refused += 1;
            }
            conn.shutdown();
            return;
        }
        let (tx, rx) = crossbeam_channel::bounded::<Arc<Vec<u8>>>(CLIENT_QUEUE);
        let shared = self.shared.clone();
        let hello = self.hello.lock().map(|h| h.clone()).ok();
        let probe = self.probe.clone();
        let n = self.shared.connected.fetch_add(1, Ordering::Relaxed);
        self.shared.producers.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new().name(format!("pp-client-{n}")).spawn(move || {
            let _active = Active(shared.clone());
            client(conn, &shared, hello, &probe, (tx, rx));
        });
        if spawned.is_err() {
            self.shared.producers.fetch_sub(1, Ordering::SeqCst);
            self.shared.active.fetch_sub(1, Ordering::SeqCst);
        }
        if let (Ok(h), Ok(mut w)) = (spawned, self.writers.lock()) {
            w.retain(|h| !h.is_finished());
            w.push(h);
        }
    }

    /// Whether the session is shutting down (new connections are refused).
    pub fn stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Relaxed)
    }

    /// Refuses new connections from now on.
    pub fn mark_stopping(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
    }

    /// Whether the run has ended (the fan-out sent its End frame).
    pub fn ended(&self) -> bool {
        self.shared.end.lock().map(|e| e.is_some()).unwrap_or(true)
    }

    /// Clients currently receiving events.
    pub fn clients(&self) -> usize {
        self.shared.clients.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// Producers (worker processes) relaying into the run now, counting connections whose
    /// handshake is not read yet.
    pub fn producers(&self) -> usize {
        self.shared.producers.load(Ordering::SeqCst) as usize
    }

    /// How long no producer has sent anything (since the server started, if none ever did).
    pub fn producers_quiet_for(&self) -> Duration {
        let last = self.shared.last_relay_ns.load(Ordering::Relaxed);
        Duration::from_nanos(crate::clock::now_ns().saturating_sub(last))
    }

    /// Counters so far.
    pub fn stats(&self) -> ServerStats {
        self.shared.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stops after the fan-out has seen [`Event::Finish`]: clients get the End frame, then
    /// their connections close.
    pub fn join(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(f) = self.fanout.take() {
            let _ = f.join();
        }
        let writers: Vec<JoinHandle<()>> = self.writers.lock().map(|mut w| w.drain(..).collect()).unwrap_or_default();
        let relays = self.shared.relay_threads.lock().map(|t| t.clone()).unwrap_or_default();
        for w in writers {
            if !relays.contains(&w.thread().id()) {
                let _ = w.join();
            }
        }
    }
}
