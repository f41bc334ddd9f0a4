//! The `/metrics` HTTP endpoint: one request per connection, on threads of its own, so a slow
//! scraper never touches the collector. Bound before the run starts (a taken port fails before
//! any side effect), served once the run's snapshot slot exists.
//!
//! Nothing here waits on a stranger. One thread reads every connection's request head at once
//! (non-blocking, `poll`), each connection with a deadline from its accept to the last byte of
//! its reply ([`Limits::deadline`]): a client that trickles its request, or sends nothing, is
//! closed at its deadline and never holds a thread that answers. A head that is not a request
//! (a byte that is not UTF-8, an empty request line) is answered 400 at once. Complete requests
//! wait in a bounded queue for [`WORKERS`] answering threads; past it, or past
//! [`Limits::pending`] connections being read, a connection is closed at once. Each is answered
//! once, then closed (a client that pipelines thousands of requests gets one reply). Stopping
//! joins only the accept thread, which never blocks, never a connection.

use super::{render, Scrape};
use crossbeam_channel::{Receiver, Sender, TryRecvError};
use probes::attach::accept::Acceptor;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The content type of OpenMetrics text, as Prometheus asks for it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Threads answering scrapes.
pub const WORKERS: usize = 2;
/// Requests read and waiting for an answering thread; more are closed unanswered.
pub const QUEUE: usize = 16;
/// How long a connection may take, from its accept to the last byte of its reply.
pub const DEADLINE: Duration = Duration::from_secs(5);
/// Connections whose request is being read at once; more are closed at once.
pub const PENDING: usize = 256;
/// Longest request head read (a scrape's is a few hundred bytes).
pub const MAX_REQUEST: usize = 8 * 1024;

/// Where the latest snapshot comes from.
pub type Source = Arc<dyn Fn() -> Scrape + Send + Sync>;

/// The bounds on strangers: [`DEADLINE`] and [`PENDING`] unless a test sets others.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub deadline: Duration,
    pub pending: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { deadline: DEADLINE, pending: PENDING }
    }
}

/// A bound, not yet serving, metrics endpoint.
pub struct Listener {
    listener: TcpListener,
    addr: SocketAddr,
}

/// A serving endpoint; dropping it stops accepting (connections being read are closed;
/// answers in progress finish on their own, by their deadline).
pub struct Serving {
    _acceptor: Acceptor,
}

/// What a request head says, once read (pure: [`parse_head`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// Not complete yet.
    Incomplete,
    /// A complete head: its request line.
    Request(String),
    /// Not a request: a byte that is not UTF-8, an empty or malformed request line.
    Bad,
    /// Longer than [`MAX_REQUEST`] without an end.
    TooLarge,
}

/// A request read, waiting for an answering thread.
struct Job {
    conn: TcpStream,
    head: Head,
    deadline: Instant,
}

impl Listener {
    /// Binds `addr` (already checked for loopback by the caller).
    pub fn bind(addr: SocketAddr) -> std::io::Result<Listener> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        Ok(Listener { listener, addr })
    }

    /// The address actually bound (the port chosen for `:0`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers scrapes on threads of their own: `source` gives the latest snapshot, copied.
    pub fn serve(self, source: Source) -> std::io::Result<Serving> {
        self.serve_with(source, Limits::default())
    }

    /// [`Listener::serve`] within `limits`.
    fn serve_with(self, source: Source, limits: Limits) -> std::io::Result<Serving> {
        let (work_tx, work_rx): (Sender<Job>, Receiver<Job>) = crossbeam_channel::bounded(QUEUE);
        for i in 0..WORKERS {
            let (rx, source) = (work_rx.clone(), source.clone());
            // Not joined: the workers end when the reader's sender is dropped and the queue is
            // empty, each answer bounded by its connection's deadline.
            std::thread::Builder::new().name(format!("pp-metrics-{i}")).spawn(move || {
                for job in rx {
                    // A scraper that hangs up early, or too slow, is its own business.
                    let _ = answer(job, &*source);
                }
            })?;
        }
        let (new_tx, new_rx) = crossbeam_channel::bounded::<TcpStream>(limits.pending);
        let (wake_rx, wake_tx) = UnixStream::pair()?;
        wake_rx.set_nonblocking(true)?;
        wake_tx.set_nonblocking(true)?;
        // Not joined either: it ends when the acceptor (holding the senders) is dropped.
        std::thread::Builder::new()
            .name("pp-metrics-read".into())
            .spawn(move || read_heads(&new_rx, &wake_rx, &work_tx, limits))?;
        let acceptor = Acceptor::spawn(
            "pp-metrics",
            self.listener,
            move |conn: TcpStream| {
                // Too many being read: closed unanswered (dropping closes it).
                if new_tx.try_send(conn).is_ok() {
                    // Full means a wake-up is already pending.
                    let _ = (&wake_tx).write(&[1]);
                }
            },
            |e, failures| {
                if failures == 1 {
                    pipeprof_trainer::progress::warn(&format!(
                        "/metrics: cannot accept connections ({e}); retrying, with pauses"
                    ));
                }
            },
        )?;
        Ok(Serving { _acceptor: acceptor })
    }
}

/// A connection whose request head is being read.
struct Reading {
    conn: TcpStream,
    head: Vec<u8>,
    deadline: Instant,
}

/// What one round of reads on a connection gave.
enum Progress {
    /// Nothing more to read now.
    Wait,
    /// Hung up, or failed: closed.
    Gone,
    /// The head is read (or refused): answer it.
    Done(Head),
}

impl Reading {
    /// Reads what has arrived (the socket is non-blocking) and parses the head so far.
    fn read_more(&mut self) -> Progress {
        let mut buf = [0u8; 1024];
        loop {
            match self.conn.read(&mut buf) {
                Ok(0) => return Progress::Gone,
                Ok(n) => {
                    self.head.extend_from_slice(&buf[..n.min(MAX_REQUEST - self.head.len())]);
                    match parse_head(&self.head) {
                        Head::Incomplete => {}
                        done => return Progress::Done(done),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Progress::Wait,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return Progress::Gone,
            }
        }
    }
}

/// The reading thread: admits new connections, waits in `poll` for any of them (or a wake-up)
/// until the nearest deadline, closes those past it, and hands complete heads to the
/// answering threads. Ends when the acceptor is gone.
fn read_heads(new: &Receiver<TcpStream>, mut wake: &UnixStream, work: &Sender<Job>, limits: Limits) {
    let mut open: Vec<Reading> = Vec::new();
    loop {
        loop {
            match new.try_recv() {
                Ok(conn) => {
                    // Past `pending` being read: closed at once (dropped).
                    if open.len() < limits.pending && conn.set_nonblocking(true).is_ok() {
                        open.push(Reading { conn, head: Vec::new(), deadline: Instant::now() + limits.deadline });
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let now = Instant::now();
        // Past its deadline: closed (dropped), whatever it was sending.
        open.retain(|r| r.deadline > now);
        let mut fds: Vec<libc::pollfd> = std::iter::once(wake.as_raw_fd())
            .chain(open.iter().map(|r| r.conn.as_raw_fd()))
            .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
            .collect();
        let wait = open.iter().map(|r| r.deadline.saturating_duration_since(now)).min();
        // Rounded up, so a wake-up is never before the deadline it waits for.
        let timeout = wait.map_or(-1, |w| w.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32);
        // SAFETY: `fds` is a live, correctly sized array of pollfd for the call's duration.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n <= 0 {
            continue;
        }
        if fds[0].revents != 0 {
            // Drained; at its end (the acceptor gone) the channel says so above.
            let _ = std::io::copy(&mut wake, &mut std::io::sink());
        }
        // From the back, so removing one leaves the indices still to visit in place.
        for k in (0..open.len()).rev() {
            if fds[k + 1].revents == 0 {
                continue;
            }
            match open[k].read_more() {
                Progress::Wait => {}
                Progress::Gone => drop(open.swap_remove(k)),
                Progress::Done(head) => {
                    let r = open.swap_remove(k);
                    // Every answering thread busy and the queue full: closed unanswered.
                    let _ = work.try_send(Job { conn: r.conn, head, deadline: r.deadline });
                }
            }
        }
    }
}

/// What the request head read so far says. Pure.
fn parse_head(head: &[u8]) -> Head {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| head.windows(2).position(|w| w == b"\n\n"));
    let text = match std::str::from_utf8(&head[..end.unwrap_or(head.len())]) {
        Ok(t) => t,
        // A byte that can never be UTF-8 (or a character cut by the head's end): no request.
        Err(e) if e.error_len().is_some() || end.is_some() => return Head::Bad,
        // A character still arriving.
        Err(_) => "",
    };
    match end {
        None if head.len() >= MAX_REQUEST => Head::TooLarge,
        None => Head::Incomplete,
        Some(_) => {
            let line = text.lines().next().unwrap_or("");
            if line.split_whitespace().count() == 3 {
                Head::Request(line.to_string())
            } else {
                Head::Bad
            }
        }
    }
}

/// Status, content type and body for one request line.
pub fn respond(line: &str, source: &dyn Fn() -> Scrape) -> (u16, &'static str, String) {
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if path != "/metrics" {
        return (404, "text/plain", "not found; try /metrics\n".into());
    }
    if !matches!(method, "GET" | "HEAD") {
        return (405, "text/plain", "only GET\n".into());
    }
    (200, CONTENT_TYPE, render(&source()))
}

/// Answers one read request, by its connection's deadline, and closes.
fn answer(job: Job, source: &dyn Fn() -> Scrape) -> std::io::Result<()> {
    let Job { mut conn, head, deadline } = job;
    let (status, kind, body) = match &head {
        Head::Request(l) => respond(l, source),
        Head::TooLarge => (431, "text/plain", "request head too large\n".into()),
        Head::Bad | Head::Incomplete => (400, "text/plain", "not an HTTP request\n".into()),
    };
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let head_only = matches!(&head, Head::Request(l) if l.starts_with("HEAD "));
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    conn.set_nonblocking(false)?;
    write_by(&mut conn, &out, deadline)?;
    let _ = conn.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Writes `out` by `deadline`: each write waits at most the time left, so a reader that takes
/// a byte at a time cannot stretch the whole past it.
fn write_by(conn: &mut TcpStream, mut out: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !out.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        conn.set_write_timeout(Some(left))?;
        match conn.write(out) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => out = &out[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_answered_by_path_and_method() {
        let src = || Scrape::default();
        assert_eq!(respond("GET /metrics HTTP/1.1", &src).0, 200);
        assert_eq!(respond("GET /metrics?x=1 HTTP/1.1", &src).0, 200);
        assert_eq!(respond("HEAD /metrics HTTP/1.1", &src).0, 200);
        assert_eq!(respond("POST /metrics HTTP/1.1", &src).0, 405);
        assert_eq!(respond("GET / HTTP/1.1", &src).0, 404);
        assert_eq!(respond("", &src).0, 404);
    }

    #[test]
    fn a_head_is_a_request_incomplete_or_refused_at_once() {
        let req = |l: &str| Head::Request(l.to_string());
        let long = vec![b'a'; MAX_REQUEST];
        let table: &[(&[u8], Head)] = &[
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n", Head::Incomplete),
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", req("GET /metrics HTTP/1.1")),
            (b"GET /metrics HTTP/1.0\n\n", req("GET /metrics HTTP/1.0")),
            (b"", Head::Incomplete),
            (b"G", Head::Incomplete),
            // Refused at once, not held until a timeout: an empty head, a byte that is never
            // UTF-8 (even before the head ends), a request line that is not one.
            (b"\r\n\r\n", Head::Bad),
            (b"\n\n", Head::Bad),
            (b"GET /\xff", Head::Bad),
            (b"GET /metrics\r\n\r\n", Head::Bad),
            // A character whose bytes are still arriving is waited for.
            (b"GET /\xc3", Head::Incomplete),
            (b"GET /\xc3\xa9 HTTP/1.1\r\n\r\n", req("GET /\u{e9} HTTP/1.1")),
            (&long, Head::TooLarge),
        ];
        for (head, want) in table {
            assert_eq!(&parse_head(head), want, "{:?}", String::from_utf8_lossy(head));
        }
    }

    /// `GET /metrics` on a fresh connection: the reply's status line.
    fn scrape(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("reply");
        out.lines().next().unwrap_or_default().to_string()
    }

    /// The first line of what `conn` gets back after sending `bytes`.
    fn reply_to(addr: SocketAddr, bytes: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(bytes).expect("send");
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).lines().next().unwrap_or_default().to_string()
    }

    #[test]
    fn odd_requests_are_answered_400_at_once_not_held() {
        // A deadline of an hour: a 400 can only come from the head being refused as it arrived.
        let l = Listener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = l.addr();
        let limits = Limits { deadline: Duration::from_secs(3600), ..Limits::default() };
        let _serving = l.serve_with(Arc::new(Scrape::default), limits).expect("serve");
        // Before: held until the 5 s read timeout, then closed unanswered.
        assert_eq!(reply_to(addr, b"\r\n\r\n"), "HTTP/1.1 400 Bad Request");
        assert_eq!(reply_to(addr, b"GET /\xff"), "HTTP/1.1 400 Bad Request");
        assert_eq!(scrape(addr), "HTTP/1.1 200 OK");
    }

    /// A client that sends one byte of a request that never ends every `every`, until a write
    /// fails (the server closed it: true) or `done` is set (false).
    fn trickle(addr: SocketAddr, every: Duration, done: Arc<std::sync::atomic::AtomicBool>) -> bool {
        let mut s = TcpStream::connect(addr).expect("connect");
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            if s.write_all(b"X").is_err() {
                return true;
            }
            std::thread::sleep(every);
        }
        false
    }

    #[test]
    fn clients_that_trickle_never_hold_the_answering_threads() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let l = Listener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = l.addr();
        let _serving = l.serve(Arc::new(Scrape::default)).expect("serve");
        let done = Arc::new(AtomicBool::new(false));
        // More tricklers than answering threads and queue together, each connected before the
        // scrape: before, each held a thread (every byte restarted the 5 s read timeout), the
        // queue filled, and the scrape was closed unanswered.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let tricklers: Vec<_> = (0..WORKERS + QUEUE + 2)
            .map(|_| {
                let (done, ready) = (done.clone(), ready_tx.clone());
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).expect("connect");
                    s.write_all(b"G").expect("first byte");
                    ready.send(()).expect("ready");
                    while !done.load(Ordering::Relaxed) {
                        if s.write_all(b"E").is_err() {
                            return true;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    false
                })
            })
            .collect();
        for _ in 0..tricklers.len() {
            ready_rx.recv().expect("trickler connected");
        }
        let answered = scrape(addr);
        done.store(true, Ordering::Relaxed);
        let cut: Vec<bool> = tricklers.into_iter().map(|t| t.join().expect("trickler")).collect();
        assert_eq!(answered, "HTTP/1.1 200 OK");
        assert!(cut.iter().all(|c| !c), "the scrape was answered while every trickler was still sending: {cut:?}");
    }

    #[test]
    fn a_trickling_client_is_closed_at_its_deadline() {
        let l = Listener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = l.addr();
        let limits = Limits { deadline: Duration::from_millis(200), ..Limits::default() };
        let _serving = l.serve_with(Arc::new(Scrape::default), limits).expect("serve");
        // A byte every 20 ms, far inside any per-read timeout: only a deadline for the whole
        // request ends it. `done` is set only if the test is failing, to end the thread.
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let d = done.clone();
        let t = std::thread::spawn(move || trickle(addr, Duration::from_millis(20), d));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(t.join().expect("trickler")));
        // A safety bound on a hang (the bug), not a measurement: the deadline is 200 ms.
        let closed = rx.recv_timeout(Duration::from_secs(60)).unwrap_or(false);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(closed, "a client trickling its request for 60 s was never closed");
    }

    #[test]
    fn a_client_that_pipelines_and_never_reads_neither_blocks_scrapes_nor_the_stop() {
        let l = Listener::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let addr = l.addr();
        let serving = l.serve(Arc::new(Scrape::default)).expect("serve");
        // Thousands of requests in one write, and no reply ever read: before, the one serving
        // thread blocked writing replies to it, every later scrape waited, and dropping the
        // server joined that thread, so the run never exited.
        let mut greedy = TcpStream::connect(addr).expect("connect");
        let many = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(2000);
        greedy.write_all(many.as_bytes()).expect("pipeline");
        // Some silent ones too (connected, sending nothing): they wait in the queue.
        let silent: Vec<TcpStream> = (1..WORKERS).map(|_| TcpStream::connect(addr).expect("connect")).collect();
        assert_eq!(scrape(addr), "HTTP/1.1 200 OK");
        // Stopping returns with every stranger still connected.
        drop(serving);
        assert!(TcpStream::connect(addr).is_err(), "the port is closed once stopped");
        drop((greedy, silent));
    }
}
