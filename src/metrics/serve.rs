//! The `/metrics` HTTP endpoint: tiny_http on one thread of its own, so a slow scraper never
//! touches the collector. Bound before the run starts (a taken port fails before any side
//! effect), served once the run's snapshot slot exists.

use super::{render, Scrape};
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The content type of OpenMetrics text, as Prometheus asks for it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A bound, not yet serving, metrics endpoint.
pub struct Listener {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
}

/// A serving endpoint; dropping it stops the thread.
pub struct Serving {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// Binds `addr` (already checked for loopback by the caller).
    pub fn bind(addr: SocketAddr) -> std::io::Result<Listener> {
        let server = tiny_http::Server::http(addr).map_err(std::io::Error::other)?;
        // A TCP listener's address is an IP one; `addr` stands in if it were not.
        let addr = server.server_addr().to_ip().unwrap_or(addr);
        Ok(Listener { server: Arc::new(server), addr })
    }

    /// The address actually bound (the port chosen for `:0`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers scrapes on a thread of its own: `source` gives the latest snapshot, copied.
    pub fn serve(self, source: Box<dyn Fn() -> Scrape + Send>) -> std::io::Result<Serving> {
        let server = self.server.clone();
        let thread = std::thread::Builder::new().name("pp-metrics".into()).spawn(move || {
            for rq in server.incoming_requests() {
                // A scraper that hangs up early is its own business.
                let _ = answer(rq, &*source);
            }
        })?;
        Ok(Serving { server: self.server, thread: Some(thread) })
    }
}

/// `GET /metrics` (any query string) gets the text; anything else 404 or 405.
fn answer(rq: tiny_http::Request, source: &dyn Fn() -> Scrape) -> std::io::Result<()> {
    let path = rq.url().split('?').next().unwrap_or("");
    if path != "/metrics" {
        return rq.respond(tiny_http::Response::from_string("not found; try /metrics\n").with_status_code(404));
    }
    if !matches!(rq.method(), tiny_http::Method::Get | tiny_http::Method::Head) {
        return rq.respond(tiny_http::Response::from_string("only GET\n").with_status_code(405));
    }
    let body = render(&source());
    let mut resp = tiny_http::Response::from_string(body);
    if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], CONTENT_TYPE.as_bytes()) {
        resp = resp.with_header(h);
    }
    rq.respond(resp)
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
