//! The run's processes, relayed: each that links pipeprof connects to the run's socket as a
//! producer, and a thread of its own puts what it sends on this process's channel, noting when
//! bytes last came; at most [`connection_cap`] at once, under the open-file limit raised to its
//! hard limit.

use pipeprof_trainer::progress;
use probes::attach::accept::Acceptor;
use probes::attach::wire;
use probes::Probe;
use std::io::BufReader;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The producers relaying into this run: connections not yet ended, and who they were.
#[derive(Default)]
pub(super) struct Relays {
    pub(super) open: AtomicUsize,
    /// Most connections at once ([`connection_cap`]); said once when reached.
    pub(super) cap: usize,
    pub(super) cap_said: AtomicBool,
    pub(super) processes: Mutex<Vec<String>>,
    /// When bytes last arrived from any process of the run (monotonic ns).
    pub(super) last_ns: AtomicU64,
}

/// A connection that notes when bytes arrive.
pub(super) struct Noting<'a> {
    conn: &'a UnixStream,
    last: &'a AtomicU64,
}

impl std::io::Read for Noting<'_> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let n = (&mut &*self.conn).read(b)?;
        if n > 0 {
            self.last.store(probes::clock::now_ns(), Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// Relays one process of the run on a thread of its own (never blocks the accept thread).
pub(super) fn relay_one(mut conn: UnixStream, probe: &Probe, relays: &Arc<Relays>) {
    let open = relays.open.fetch_add(1, Ordering::SeqCst);
    if open >= relays.cap {
        relays.open.fetch_sub(1, Ordering::SeqCst);
        if !relays.cap_said.swap(true, Ordering::SeqCst) {
            progress::warn(&format!(
                "{} processes of the run are connected at once, the most this run takes (its open-file \
                 limit): later ones are turned away and their spans are missing",
                relays.cap
            ));
        }
        return;
    }
    let (probe, mine) = (probe.clone(), relays.clone());
    let spawned = std::thread::Builder::new().name("pp-relay".into()).spawn(move || {
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        match wire::check_peer_hello(&mut conn) {
            Ok(wire::Peer::Producer) => {
                let _ = conn.set_read_timeout(None);
                let noting = Noting { conn: &conn, last: &mine.last_ns };
                let r = probes::attach::producer::relay(&mut BufReader::new(noting), &probe);
                if let Ok(mut p) = mine.processes.lock() {
                    p.push(format!("{} (pid {})", r.hello.program, r.hello.pid));
                }
                if r.dropped > 0 {
                    progress::warn(&format!(
                        "{} (pid {}) lost {} events (its buffer was full while pipeprof was slow to read, or \
                         its connection broke): counted in the report's dropped events",
                        r.hello.program, r.hello.pid, r.dropped
                    ));
                }
                if let Some(e) = r.error.filter(|e| *e != wire::WireError::Closed) {
                    progress::warn(&format!(
                        "{} (pid {}) connection ended: {e}; what it sent until then is kept (a process still \
                         running connects again and counts what it lost)",
                        r.hello.program, r.hello.pid
                    ));
                }
            }
            Ok(wire::Peer::Viewer) => progress::warn(
                "a viewer tried to attach to `pipeprof run`'s socket: this run is shown here, not served",
            ),
            Err(e) => progress::warn(&format!("refused a connection to the run's socket: {e}")),
        }
        let _ = conn.shutdown(std::net::Shutdown::Both);
        mine.open.fetch_sub(1, Ordering::SeqCst);
    });
    if spawned.is_err() {
        relays.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts the run's processes until stopped. Stopping needs no connection to the socket
/// file (a cleaner may have removed it); a failing accept (out of file descriptors) is said
/// once per streak and retried after a pause, never in a busy loop.
pub(super) fn serve(listener: UnixListener, probe: Probe, relays: Arc<Relays>) -> std::io::Result<Acceptor> {
    Acceptor::spawn(
        "pp-accept",
        listener,
        move |conn| relay_one(conn, &probe, &relays),
        |e, failures| {
            if failures == 1 {
                progress::warn(&format!(
                    "cannot accept a process of the run ({e}): retrying, with pauses; processes connecting \
                     meanwhile are turned away and their spans are missing"
                ));
            }
        },
    )
}

/// Most processes relayed at once under an open-file limit of `nofile`: each costs one
/// descriptor; some are kept for the trace, the log and the run's own files.
pub fn connection_cap(nofile: u64) -> usize {
    const KEPT: u64 = 64;
    nofile.saturating_sub(KEPT).clamp(16, 16_384) as usize
}

/// Raises this process's open-file limit to its hard limit (a run of 64 ranks × 16 workers
/// passes the usual soft limit of 1024) and returns the limit in force.
pub(super) fn raise_open_files() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 1024;
        }
        let want = libc::rlimit { rlim_cur: l.rlim_max.min(1 << 20), rlim_max: l.rlim_max };
        if want.rlim_cur > l.rlim_cur && libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
            return want.rlim_cur;
        }
    }
    l.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_descriptors_for_the_runs_own_files() {
        assert_eq!(connection_cap(1024), 960);
        assert_eq!(connection_cap(1_048_576), 16_384);
        assert_eq!(connection_cap(0), 16);
    }
}
