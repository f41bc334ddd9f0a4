//! The `/metrics` HTTP endpoint: one request per connection, on threads of its own, so a slow
//! scraper never touches the collector. Bound before the run starts (a taken port fails before
//! any side effect), served once the run's snapshot slot exists.
//!
//! Nothing here waits on a stranger: each connection has read and write timeouts and is
//! answered once, then closed (a client that pipelines thousands of requests and reads no reply
//! gets one reply, or is cut off when the write times out); connections wait in a bounded
//! queue for [`WORKERS`] threads, and past it are closed at once; stopping joins only the
//! accept thread, which never blocks, never a connection.

use super::{render, Scrape};
use crossbeam_channel::{Receiver, Sender, TrySendError};
use probes::attach::accept::Acceptor;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// The content type of OpenMetrics text, as Prometheus asks for it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Threads answering scrapes.
pub const WORKERS: usize = 2;
/// Connections waiting for a worker; more are closed unanswered.
pub const QUEUE: usize = 16;
/// How long a request may take to arrive, and a reply to be taken.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request head read (a scrape's is a few hundred bytes).
pub const MAX_REQUEST: usize = 8 * 1024;

/// Where the latest snapshot comes from.
pub type Source = Arc<dyn Fn() -> Scrape + Send + Sync>;

/// A bound, not yet serving, metrics endpoint.
pub struct Listener {
    listener: TcpListener,
    addr: SocketAddr,
}

/// A serving endpoint; dropping it stops accepting (answers in progress finish on their own,
/// within [`IO_TIMEOUT`]).
pub struct Serving {
    _acceptor: Acceptor,
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
        let (tx, rx): (Sender<TcpStream>, Receiver<TcpStream>) = crossbeam_channel::bounded(QUEUE);
        for i in 0..WORKERS {
            let (rx, source) = (rx.clone(), source.clone());
            // Not joined: the workers end when the acceptor's sender is dropped and the queue
            // is empty, each connection bounded by its timeouts.
            std::thread::Builder::new().name(format!("pp-metrics-{i}")).spawn(move || {
                for conn in rx {
                    // A scraper that hangs up early, or too slow, is its own business.
                    let _ = answer(conn, &*source);
                }
            })?;
        }
        let acceptor = Acceptor::spawn(
            "pp-metrics",
            self.listener,
            move |conn: TcpStream| match tx.try_send(conn) {
                Ok(()) => {}
                // Every worker busy and the queue full: closed unanswered (dropping closes it).
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {}
            },
            |e, failures| {
                if failures == 1 {
                    crate::progress::warn(&format!("/metrics: cannot accept connections ({e}); retrying, with pauses"));
                }
            },
        )?;
        Ok(Serving { _acceptor: acceptor })
    }
}

/// The request line of a request head, if the head is complete.
fn request_line(head: &[u8]) -> Option<&str> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| head.windows(2).position(|w| w == b"\n\n"))?;
    let head = std::str::from_utf8(&head[..end]).ok()?;
    head.lines().next()
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

/// Reads one request head (bounded in size and time), answers it, closes.
fn answer(mut conn: TcpStream, source: &dyn Fn() -> Scrape) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let line = loop {
        if let Some(l) = request_line(&head) {
            break Some(l.to_string());
        }
        if head.len() >= MAX_REQUEST {
            break None;
        }
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n.min(MAX_REQUEST - head.len())]);
    };
    let (status, kind, body) = match &line {
        Some(l) => respond(l, source),
        None => (431, "text/plain", "request head too large\n".into()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Request Header Fields Too Large",
    };
    let head_only = line.as_deref().is_some_and(|l| l.starts_with("HEAD "));
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    conn.write_all(&out)?;
    let _ = conn.shutdown(std::net::Shutdown::Both);
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
        assert_eq!(request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None, "head not complete");
        assert_eq!(request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Some("GET /metrics HTTP/1.1"));
    }

    /// `GET /metrics` on a fresh connection: the reply's status line.
    fn scrape(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("reply");
        out.lines().next().unwrap_or_default().to_string()
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
