//! Accepting connections on a thread that can always be stopped.
//!
//! The accept thread waits in `poll` on the listener and on a pipe of its own; stopping writes
//! one byte to the pipe. So stopping never depends on reaching the listener from outside (a
//! wake-up connection to our own socket fails once a temp cleaner or a logout removed the
//! socket file, and the thread then waited forever). A failing `accept` (EMFILE: out of file
//! descriptors) is reported and retried after a growing pause, never in a busy loop; the pause
//! itself waits on the pipe, so a stop is still immediate.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread::JoinHandle;
use std::time::Duration;

/// First pause after a failed accept; each further failure in a row doubles it, up to
/// [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Longest pause between two accepts that keep failing.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The pause after the `failures`-th failed accept in a row (1-based): 10 ms, 20 ms, … 1 s.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST_BACKOFF.saturating_mul(1 << doublings).min(MAX_BACKOFF)
}

/// A listening socket the acceptor can poll and accept from.
pub trait Listen: AsRawFd + Send + 'static {
    /// What `accept` returns.
    type Conn: Send + 'static;
    /// Accepts one connection (the listener is non-blocking: `WouldBlock` when none waits).
    fn accept_conn(&self) -> io::Result<Self::Conn>;
    /// Makes the listener non-blocking.
    fn set_nonblocking(&self) -> io::Result<()>;
}

impl Listen for UnixListener {
    type Conn = UnixStream;
    fn accept_conn(&self) -> io::Result<UnixStream> {
        let (c, _) = self.accept()?;
        // Accepted sockets are blocking on Linux; said here so no platform surprises a reader.
        c.set_nonblocking(false)?;
        Ok(c)
    }
    fn set_nonblocking(&self) -> io::Result<()> {
        UnixListener::set_nonblocking(self, true)
    }
}

impl Listen for std::net::TcpListener {
    type Conn = std::net::TcpStream;
    fn accept_conn(&self) -> io::Result<std::net::TcpStream> {
        let (c, _) = self.accept()?;
        c.set_nonblocking(false)?;
        Ok(c)
    }
    fn set_nonblocking(&self) -> io::Result<()> {
        std::net::TcpListener::set_nonblocking(self, true)
    }
}

/// A running accept thread; [`Acceptor::stop`] (or dropping it) ends and joins it.
pub struct Acceptor {
    wake: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

/// A pipe: (read end, write end), both close-on-exec and non-blocking.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two fds into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just opened and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// What one `poll` saw.
enum Woke {
    Stop,
    Ready,
    Timeout,
}

/// Waits for the stop pipe, or the listener when `listener` is given, up to `timeout`
/// (None: no limit).
fn wait(stop: RawFd, listener: Option<RawFd>, timeout: Option<Duration>) -> Woke {
    let mut fds = [
        libc::pollfd { fd: stop, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: listener.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: poll on an array of two pollfds we own; a negative fd is ignored by poll.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if n == 0 {
        return Woke::Timeout;
    }
    if n < 0 {
        // EINTR: look again.
        return Woke::Timeout;
    }
    if fds[0].revents != 0 {
        return Woke::Stop;
    }
    Woke::Ready
}

impl Acceptor {
    /// Starts a thread named `name` accepting on `listener`: each connection goes to `on_conn`
    /// (which must not block: it hands the connection to a thread of its own); each failed
    /// accept to `on_error` with the failures in a row so far, then the thread pauses for
    /// [`backoff`] of them.
    pub fn spawn<L: Listen>(
        name: &str,
        listener: L,
        mut on_conn: impl FnMut(L::Conn) + Send + 'static,
        mut on_error: impl FnMut(&io::Error, u32) + Send + 'static,
    ) -> io::Result<Acceptor> {
        listener.set_nonblocking()?;
        let (stop, wake) = pipe()?;
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            let mut failures = 0u32;
            loop {
                match wait(stop.as_raw_fd(), Some(listener.as_raw_fd()), None) {
                    Woke::Stop => return,
                    Woke::Timeout => continue,
                    Woke::Ready => {}
                }
                match listener.accept_conn() {
                    Ok(c) => {
                        failures = 0;
                        on_conn(c);
                    }
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                    // The peer gave up between poll and accept: nothing to report.
                    Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {}
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        on_error(&e, failures);
                        if let Woke::Stop = wait(stop.as_raw_fd(), None, Some(backoff(failures))) {
                            return;
                        }
                    }
                }
            }
        })?;
        Ok(Acceptor { wake, thread: Some(thread) })
    }

    /// Stops the thread and waits for it (it only ever waits in `poll`, or in `on_conn`).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(t) = self.thread.take() else { return };
        // SAFETY: a one-byte write to the pipe we own; a full pipe already wakes the thread.
        unsafe { libc::write(self.wake.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        let _ = t.join();
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    #[test]
    fn failed_accepts_pause_longer_each_time_up_to_a_second() {
        let ms = |n| backoff(n).as_millis();
        assert_eq!([ms(0), ms(1), ms(2), ms(3), ms(7)], [10, 10, 20, 40, 640]);
        assert_eq!(ms(8), 1000);
        assert_eq!(ms(u32::MAX), 1000);
    }

    #[test]
    fn stopping_needs_no_connection_even_when_the_socket_file_is_gone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.sock");
        let l = UnixListener::bind(&path).expect("bind");
        let got = Arc::new(AtomicU32::new(0));
        let seen = got.clone();
        let a = Acceptor::spawn(
            "t-accept",
            l,
            move |_c| {
                seen.fetch_add(1, Ordering::SeqCst);
            },
            |_, _| {},
        )
        .expect("spawn");
        let c = UnixStream::connect(&path).expect("connect");
        // The connection is accepted (the acceptor drops it: our end reads EOF).
        let mut buf = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &c, &mut buf).expect("read"), 0);
        assert_eq!(got.load(Ordering::SeqCst), 1);
        // A cleaner removes the socket file: nobody can connect any more, and stop returns.
        std::fs::remove_file(&path).expect("remove");
        a.stop();
    }

    /// A listener whose accept always fails like a process out of file descriptors.
    struct Exhausted(UnixListener);
    impl AsRawFd for Exhausted {
        fn as_raw_fd(&self) -> RawFd {
            self.0.as_raw_fd()
        }
    }
    impl Listen for Exhausted {
        type Conn = UnixStream;
        fn accept_conn(&self) -> io::Result<UnixStream> {
            Err(io::Error::from_raw_os_error(libc::EMFILE))
        }
        fn set_nonblocking(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_failing_accept_is_reported_and_paced_not_spun() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("s.sock");
        let l = UnixListener::bind(&path).expect("bind");
        // A connection waits forever: poll always says the listener is ready.
        let _pending = UnixStream::connect(&path).expect("connect");
        let (tx, rx) = crossbeam_channel::unbounded();
        let a = Acceptor::spawn(
            "t-accept",
            Exhausted(l),
            |_c| {},
            move |e, n| {
                let _ = tx.send((e.raw_os_error(), n));
            },
        )
        .expect("spawn");
        // Each failure is reported with its count in a row; the pause between the first few
        // is the backoff, so after the fourth the thread waits 80 ms, not a busy loop.
        let seen: Vec<(Option<i32>, u32)> = rx.iter().take(4).collect();
        assert_eq!(seen, (1..=4).map(|n| (Some(libc::EMFILE), n)).collect::<Vec<_>>());
        // Stopping interrupts the pause.
        a.stop();
    }
}
