//! One rule for what an attach address means, and one connected stream: used by the viewer
//! (`pipeprof attach`) and by producers (worker processes), so that both read an address the
//! same way. [`Conn`], what the server needs of a stream, lives here too: the server and the
//! producers both use it, and this file uses neither of them (no import circle).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// A connected stream (Unix or TCP).
pub trait Conn: std::io::Read + Write + Send + 'static {
    /// Sets the read timeout (used for the handshake only).
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    /// Sets the write timeout: a client that stops reading is cut off, not waited for.
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()>;
    /// Shuts both directions down.
    fn shutdown(&self);
}

impl Conn for std::os::unix::net::UnixStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::os::unix::net::UnixStream::set_write_timeout(self, t)
    }
    fn shutdown(&self) {
        let _ = std::os::unix::net::UnixStream::shutdown(self, std::net::Shutdown::Both);
    }
}

impl Conn for std::net::TcpStream {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::net::TcpStream::set_read_timeout(self, t)
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        std::net::TcpStream::set_write_timeout(self, t)
    }
    fn shutdown(&self) {
        let _ = std::net::TcpStream::shutdown(self, std::net::Shutdown::Both);
    }
}

/// Where a run listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A Unix socket: a path.
    Unix(PathBuf),
    /// TCP: `HOST:PORT`.
    Tcp(String),
}

impl Address {
    /// The one rule: a string with a `/` or ending in `.sock` is a socket path; anything
    /// else is `HOST:PORT`.
    pub fn parse(s: &str) -> Address {
        if s.contains('/') || s.ends_with(".sock") {
            Address::Unix(PathBuf::from(s))
        } else {
            Address::Tcp(s.to_string())
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "{}", p.display()),
            Address::Tcp(a) => f.write_str(a),
        }
    }
}

/// A connection to a run, Unix or TCP.
#[derive(Debug)]
pub enum Stream {
    /// Over a Unix socket.
    Unix(UnixStream),
    /// Over TCP.
    Tcp(TcpStream),
}

impl Stream {
    /// Connects to `a` (TCP: each address the name resolves to, in order).
    pub fn connect(a: &Address) -> std::io::Result<Stream> {
        match a {
            Address::Unix(p) => UnixStream::connect(p).map(Stream::Unix),
            Address::Tcp(t) => {
                let mut last = std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{t}: not HOST:PORT"));
                for sa in t.to_socket_addrs()? {
                    match TcpStream::connect(sa) {
                        Ok(s) => return Ok(Stream::Tcp(s)),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            }
        }
    }

    /// A function that shuts the connection down from another thread.
    pub fn try_clone_closer(&self) -> std::io::Result<Box<dyn Fn() + Send>> {
        Ok(match self {
            Stream::Unix(s) => {
                let c = s.try_clone()?;
                Box::new(move || {
                    let _ = c.shutdown(std::net::Shutdown::Both);
                })
            }
            Stream::Tcp(s) => {
                let c = s.try_clone()?;
                Box::new(move || {
                    let _ = c.shutdown(std::net::Shutdown::Both);
                })
            }
        })
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

impl Conn for Stream {
    fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_tells_a_socket_path_from_host_and_port() {
        let table = [
            ("/run/user/1000/pipeprof/42.sock", Address::Unix("/run/user/1000/pipeprof/42.sock".into())),
            ("42.sock", Address::Unix("42.sock".into())),
            ("./here", Address::Unix("./here".into())),
            ("127.0.0.1:7070", Address::Tcp("127.0.0.1:7070".into())),
            ("localhost:7070", Address::Tcp("localhost:7070".into())),
            ("[::1]:7070", Address::Tcp("[::1]:7070".into())),
        ];
        for (text, want) in table {
            assert_eq!(Address::parse(text), want, "{text}");
            assert_eq!(Address::parse(text).to_string(), text);
        }
    }

    #[test]
    fn a_bad_tcp_address_is_an_error_not_a_panic() {
        assert!(Stream::connect(&Address::Tcp("nonsense".into())).is_err());
        assert!(Stream::connect(&Address::Unix("/nonexistent/pp.sock".into())).is_err());
    }
}
