//! Attach: let `pipeprof attach` watch this program's training from another terminal.
//!
//! ```no_run
//! // once, at start:
//! let session = probes::attach::init(probes::attach::Options::new("my-trainer")).unwrap();
//! // then plain tracing spans named after stages, anywhere, on any thread:
//! let _g = tracing::info_span!("decode", sample = 7u64).entered();
//! // and one record per training step:
//! # let rec = probes::StepRecord { no_loss: false, step: 0, epoch: 0, images: 32, loss: 1.0, correct: 9, end_ns: 0, queued: 1, validation: false };
//! session.step(rec);
//! ```
//!
//! The server listens on a Unix socket, `$XDG_RUNTIME_DIR/pipeprof/<pid>.sock` (else a private
//! `pipeprof-<uid>` folder in the temp dir: [`folder`]), mode 0600; or on TCP with `PIPEPROF_LISTEN` /
//! [`Options::listen`], loopback only unless [`Options::allow_remote`] says otherwise.

pub mod accept;
pub mod conn;
pub mod folder;
pub mod producer;
pub mod server;
pub mod wire;

use crate::probe::Probe;
use crate::sampler::{SamplerConfig, SamplerHandle};
use crate::{Event, ProbeLayer, StepRecord};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing_subscriber::layer::SubscriberExt;

/// Environment variable: listen on this TCP address instead of a Unix socket.
pub const LISTEN_ENV: &str = "PIPEPROF_LISTEN";
/// Environment variable set by `pipeprof run` (and by a serving Python parent): the address
/// of the run this process belongs to. A process started with it sends its spans there as a
/// producer instead of serving its own.
pub const PARENT_ENV: &str = "PIPEPROF_PARENT";
/// The pid of the process serving [`PARENT_ENV`]: the server itself must not connect to itself.
pub const PARENT_PID_ENV: &str = "PIPEPROF_PARENT_PID";

/// The run this process was started in (`pipeprof run`), from the environment, if any.
fn parent_run() -> Option<String> {
    let addr = std::env::var(PARENT_ENV).ok().filter(|a| !a.is_empty())?;
    let pid = std::env::var(PARENT_PID_ENV).ok();
    (pid.as_deref() != Some(std::process::id().to_string().as_str())).then_some(addr)
}

/// Why attach could not start.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// Another global tracing subscriber is installed.
    #[error("a global tracing subscriber is already installed; add probes::ProbeLayer to yours instead")]
    SubscriberSet,
    /// A listen address was refused.
    #[error("refusing to listen on {0}: not a loopback address (anyone on the network could watch); set Options::allow_remote to mean it")]
    NotLoopback(String),
    /// A listen address that does not parse.
    #[error("bad listen address {0:?}: use HOST:PORT, e.g. 127.0.0.1:7070")]
    BadAddress(String),
    /// The socket folder is not private.
    #[error(
        "{0}: not a private folder (must be a folder, not a link, ours, mode 0700): remove it or set XDG_RUNTIME_DIR"
    )]
    UnsafeDir(PathBuf),
    /// A folder above the socket folder lets someone else rename or replace it.
    #[error(
        "{dir}: not private: {above} above it is another user's, or open to others for writing and not sticky; \
         set TMPDIR or XDG_RUNTIME_DIR to a folder of yours"
    )]
    UnsafeParent {
        /// The socket folder.
        dir: PathBuf,
        /// The folder above it found unsafe.
        above: PathBuf,
    },
    /// A socket's path in this folder would not fit in a socket's address.
    #[error("{0}: too long for a socket's path (at most {max} bytes): set TMPDIR to a shorter folder", max = folder::MAX_SOCKET_PATH)]
    TooLong(PathBuf),
    /// I/O.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> AttachError {
    let what = what.into();
    move |source| AttachError::Io { what, source }
}

/// How to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// The program's name, shown by `pipeprof attach`.
    pub program: String,
    /// Run settings to show (free-form JSON: `model`, `data`, `workers`, `batch_size`, …).
    pub settings: serde_json::Value,
    /// TCP address to listen on instead of the Unix socket (default: `$PIPEPROF_LISTEN`).
    pub listen: Option<String>,
    /// Allow a non-loopback TCP address.
    pub allow_remote: bool,
    /// Event channel capacity.
    pub capacity: usize,
    /// Host/GPU sampling (default on, 5 Hz).
    pub sampler: Option<SamplerConfig>,
}

impl Options {
    /// Defaults for a program called `program`.
    pub fn new(program: &str) -> Options {
        Options {
            program: program.to_string(),
            settings: serde_json::Value::Null,
            listen: std::env::var(LISTEN_ENV).ok().filter(|s| !s.is_empty()),
            allow_remote: false,
            capacity: crate::DEFAULT_CAPACITY,
            sampler: Some(SamplerConfig::default()),
        }
    }
}

/// The folder holding this user's attach sockets and `pipeprof run`'s start-up hooks: the one
/// private-folder rule of [`folder`] (`$XDG_RUNTIME_DIR/pipeprof`, else `pipeprof-<uid>` in the
/// temp folder, else a private folder of a random name there, kept; each checked without
/// following links, ours, mode 0700, never removed).
pub fn runtime_dir() -> Result<PathBuf, AttachError> {
    let xdg = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from);
    // SAFETY: getuid cannot fail.
    folder::private_dir_in(xdg.as_deref(), &std::env::temp_dir(), Path::new("/tmp"), unsafe { libc::getuid() })
}

/// Parses a TCP listen address, refusing non-loopback ones unless `allow_remote`.
pub fn check_listen(addr: &str, allow_remote: bool) -> Result<SocketAddr, AttachError> {
    let a = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.next())
        .ok_or_else(|| AttachError::BadAddress(addr.to_string()))?;
    if !a.ip().is_loopback() && !allow_remote {
        return Err(AttachError::NotLoopback(addr.to_string()));
    }
    Ok(a)
}

/// A profiled program's attach session: keep it alive while training.
pub struct Session {
    probe: Probe,
    address: String,
    socket: Option<PathBuf>,
    /// None when this process sends into a run it was started in (`pipeprof run`).
    server: Option<Arc<std::sync::Mutex<server::Server>>>,
    samplers: Option<SamplerHandle>,
    acceptor: Option<accept::Acceptor>,
    producer: Option<producer::Producer>,
    /// The token TCP peers must send (`None` on a Unix socket).
    token: Option<String>,
}

/// Installs the Layer as the global subscriber, starts the samplers and the server.
///
/// Started by `pipeprof run` (its address in [`PARENT_ENV`]), the program serves nothing: it
/// sends its spans, steps and settings to that run as a producer, and the run samples the
/// machine. The calls are the same either way.
pub fn init(opts: Options) -> Result<Session, AttachError> {
    if let Some(parent) = parent_run() {
        let hello = wire::Hello::this_process(opts.program.clone(), opts.settings.clone());
        let prod = producer::connect(&parent, hello, opts.capacity)?;
        let probe = prod.probe();
        let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
        tracing::subscriber::set_global_default(sub).map_err(|_| AttachError::SubscriberSet)?;
        return Ok(Session {
            probe,
            address: parent,
            socket: None,
            server: None,
            samplers: None,
            acceptor: None,
            producer: Some(prod),
            token: None,
        });
    }
    let (probe, rx) = Probe::new(opts.capacity.max(1));
    let sub = tracing_subscriber::registry().with(ProbeLayer::new(probe.clone()));
    tracing::subscriber::set_global_default(sub).map_err(|_| AttachError::SubscriberSet)?;
    start(opts, probe, rx)
}

/// Starts the samplers and the server over a channel the caller made, for a program that
/// installs its own subscriber with a [`ProbeLayer`] on `probe` (the Python bindings do:
/// their layer is swapped for a producer's in a forked worker). `opts.capacity` is unused.
pub fn start(opts: Options, probe: Probe, rx: crossbeam_channel::Receiver<Event>) -> Result<Session, AttachError> {
    let hello = wire::Hello::this_process(opts.program.clone(), opts.settings.clone());
    // TCP: anyone on the machine can connect, so every peer must bring the run's token.
    let token = opts.listen.as_ref().map(|_| run_token());
    if let Some(t) = &token {
        // Worker processes started from now on inherit it. Set before the server's threads
        // start; a program that reads the environment from other threads meanwhile is
        // warned against in docs/attach.md.
        std::env::set_var(wire::TOKEN_ENV, t);
    }
    let srv = server::Server::start_with_token(rx, probe.clone(), hello, token.clone())
        .map_err(io("start the server thread"))?;
    let server = Arc::new(std::sync::Mutex::new(srv));
    let (address, socket, acceptor): (String, Option<PathBuf>, accept::Acceptor) = match &opts.listen {
        Some(addr) => {
            let a = check_listen(addr, opts.allow_remote)?;
            let l = TcpListener::bind(a).map_err(io(format!("listen on {a}")))?;
            let local = l.local_addr().map_err(io("local address"))?;
            eprintln!(
                "pipeprof probes: listening on {local} (TCP): viewers and workers need {}={}",
                wire::TOKEN_ENV,
                token.as_deref().unwrap_or_default()
            );
            (local.to_string(), None, spawn_acceptor(l, server.clone())?)
        }
        None => {
            let path = runtime_dir()?.join(format!("{}.sock", std::process::id()));
            let _ = std::fs::remove_file(&path);
            let l = UnixListener::bind(&path).map_err(io(format!("listen on {}", path.display())))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(io(format!("chmod {}", path.display())))?;
            (path.display().to_string(), Some(path.clone()), spawn_acceptor(l, server.clone())?)
        }
    };
    let samplers = match opts.sampler {
        Some(cfg) => crate::sampler::start(probe.clone(), cfg).ok(),
        None => None,
    };
    Ok(Session {
        probe,
        address,
        socket,
        server: Some(server),
        samplers,
        acceptor: Some(acceptor),
        producer: None,
        token,
    })
}

/// The run's token: `$PIPEPROF_TOKEN` when the user set one, else 128 random bits in hex.
fn run_token() -> String {
    let given = wire::env_token();
    if !given.is_empty() {
        return given;
    }
    let mut b = [0u8; 16];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
    if random.is_err() {
        // No /dev/urandom (a bare container): std's per-process random hash keys.
        use std::hash::{BuildHasher, Hasher};
        for (i, chunk) in b.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_usize(i);
            h.write_u128(Instant::now().elapsed().as_nanos());
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Accepts on `l` into the server until the session stops. Stopping needs no connection to
/// ourselves ([`accept`]): the socket file may be gone by then.
fn spawn_acceptor<L>(l: L, srv: Arc<std::sync::Mutex<server::Server>>) -> Result<accept::Acceptor, AttachError>
where
    L: accept::Listen,
    L::Conn: server::Conn,
{
    accept::Acceptor::spawn(
        "pp-accept",
        l,
        move |c| {
            if let Ok(s) = srv.lock() {
                s.serve(c)
            }
        },
        |e, failures| {
            // Once per streak of failures: the thread pauses between tries, never spins.
            if failures == 1 {
                eprintln!(
                    "pipeprof probes: cannot accept connections ({e}); retrying, with pauses: \
                     workers and viewers connecting meanwhile are turned away"
                );
            }
        },
    )
    .map_err(io("start the accept thread"))
}

impl Session {
    /// A probe handle, for sending [`Event`]s directly.
    pub fn probe(&self) -> Probe {
        self.probe.clone()
    }

    /// Where clients connect: a socket path or HOST:PORT.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The token viewers and workers must send over TCP (`$PIPEPROF_TOKEN` for them);
    /// `None` on a Unix socket, where the socket file's permissions decide who connects.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Reports one finished training step.
    pub fn step(&self, rec: StepRecord) {
        self.probe.send(Event::Step(rec));
    }

    /// The server's counters so far (slow clients cut off, bad handshakes).
    pub fn stats(&self) -> wire::ServerStats {
        self.server.as_ref().and_then(|s| s.lock().ok()).map(|s| s.stats()).unwrap_or_default()
    }

    /// Worker processes sending their spans into this run now (see [`producer`]), counting
    /// connections whose handshake is not read yet: zero means every worker that connected
    /// has had all it sent relayed.
    pub fn producers(&self) -> usize {
        self.server.as_ref().and_then(|s| s.lock().ok()).map_or(0, |s| s.producers())
    }

    /// How long no producer has sent anything: connected workers that are alive but idle (a
    /// DataLoader's persistent workers) have nothing in flight once this passes a few
    /// milliseconds, so a program's end need not wait for them to disconnect.
    pub fn producers_quiet_for(&self) -> Duration {
        self.server.as_ref().and_then(|s| s.lock().ok()).map_or(Duration::MAX, |s| s.producers_quiet_for())
    }

    /// Clients attached now.
    pub fn clients(&self) -> usize {
        self.server.as_ref().and_then(|s| s.lock().ok()).map_or(0, |s| s.clients())
    }

    /// Waits until at least one client is attached, up to `timeout`. Returns whether one is.
    pub fn wait_for_client(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.clients() > 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.clients() > 0
    }

    /// Ends the session: final samples, "run ended" to every client, socket removed.
    pub fn finish(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(p) = self.producer.take() {
            // Part of a `pipeprof run`: what is buffered goes to it; the run ends there.
            p.finish();
            return;
        }
        if let Some(s) = self.samplers.take() {
            s.stop();
        }
        crate::layer::flush_thread();
        self.probe.send_blocking(Event::Finish);
        let server = self.server.clone();
        if let Some(mut s) = server.as_ref().and_then(|s| s.lock().ok()) {
            s.mark_stopping();
        }
        if let Some(a) = self.acceptor.take() {
            a.stop();
        }
        if let Some(mut s) = server.as_ref().and_then(|s| s.lock().ok()) {
            s.join();
        }
        if let Some(p) = self.socket.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_unless_asked() {
        assert!(check_listen("127.0.0.1:0", false).is_ok());
        assert!(check_listen("[::1]:0", false).is_ok());
        assert!(matches!(check_listen("0.0.0.0:7070", false), Err(AttachError::NotLoopback(_))));
        assert!(check_listen("0.0.0.0:7070", true).is_ok());
        assert!(matches!(check_listen("nonsense", false), Err(AttachError::BadAddress(_))));
    }

    #[test]
    fn a_session_whose_socket_file_was_removed_still_finishes() {
        let (probe, rx) = Probe::new(64);
        let mut o = Options::new("t");
        (o.listen, o.sampler) = (None, None);
        let s = start(o, probe, rx).expect("session");
        // A temp cleaner, or logout emptying /run/user/UID.
        std::fs::remove_file(s.address()).expect("the socket file");
        let (tx, done) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            s.finish();
            let _ = tx.send(());
        });
        // Before, finish() woke the accept thread by connecting to the removed file: it hung.
        assert!(done.recv_timeout(Duration::from_secs(60)).is_ok(), "finish() hung");
    }
}
