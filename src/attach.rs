//! `pipeprof attach`: watch a training run in another process.

use crate::aggregate::{Aggregator, RunSettings, Summary};
use crate::export::chrome::ChromeTrace;
use crate::export::Exporter;
use crate::{diagnose, report, signal};
use anyhow::{bail, Context};
use probes::attach::wire::{self, Frame, ServerStats};
use probes::Event;
use std::io::{BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct AttachArgs {
    /// A PID, a socket path or HOST:PORT. Default: the one instrumented run found.
    pub target: Option<String>,
    /// No live view: collect until the run ends (or --duration passes), then print the report.
    #[arg(long)]
    pub once: bool,
    /// Detach after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Write the summary JSON of what was seen.
    #[arg(long, value_name = "FILE")]
    pub summary: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace of what was seen.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// List the instrumented runs that can be attached to, and exit.
    #[arg(long)]
    pub list: bool,
}

/// An attachable run found on this machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub pid: u32,
    pub socket: PathBuf,
    pub program: String,
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// Runs with a live socket in `dir`.
pub fn discover(dir: &Path) -> Vec<Found> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut found: Vec<Found> = entries
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let pid: u32 = p.file_name()?.to_str()?.strip_suffix(".sock")?.parse().ok()?;
            if !alive(pid) {
                return None;
            }
            let program = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string();
            Some(Found { pid, socket: p, program })
        })
        .collect();
    found.sort_by_key(|f| f.pid);
    found
}

enum Stream {
    Unix(std::os::unix::net::UnixStream),
    Tcp(std::net::TcpStream),
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
        Ok(())
    }
}

fn connect(target: Option<&str>) -> anyhow::Result<(Stream, String)> {
    let dir = probes::attach::runtime_dir()?;
    let socket = match target {
        None => {
            let found = discover(&dir);
            match found.as_slice() {
                [] => bail!(
                    "no instrumented run to attach to (looked in {}): start one, e.g. \
                     `cargo run --release --example train_cnn -- --data /tmp/pp-imgs`, or pass HOST:PORT",
                    dir.display()
                ),
                [one] => one.socket.clone(),
                many => {
                    let list: Vec<String> = many.iter().map(|f| format!("  {}  {}", f.pid, f.program)).collect();
                    bail!("several runs can be attached to; pass a PID:\n{}", list.join("\n"))
                }
            }
        }
        Some(t) if t.chars().all(|c| c.is_ascii_digit()) => dir.join(format!("{t}.sock")),
        Some(t) if t.contains('/') || t.ends_with(".sock") => PathBuf::from(t),
        Some(t) => {
            let s = std::net::TcpStream::connect(t).with_context(|| format!("cannot connect to {t}"))?;
            return Ok((Stream::Tcp(s), t.to_string()));
        }
    };
    let s = std::os::unix::net::UnixStream::connect(&socket).with_context(|| {
        format!(
            "cannot connect to {} (is the run still going? `pipeprof attach --list` shows the live ones)",
            socket.display()
        )
    })?;
    Ok((Stream::Unix(s), socket.display().to_string()))
}

/// Reads frames into events until the run ends or the connection drops.
fn pump(mut r: impl Read, tx: crossbeam_channel::Sender<Event>) -> Result<ServerStats, String> {
    loop {
        match wire::read_frame(&mut r) {
            Ok(Frame::End(stats)) => return Ok(stats),
            Ok(Frame::Hello(_)) => {}
            Ok(f) => {
                if let Some(ev) = f.into_event() {
                    if tx.send(ev).is_err() {
                        return Err("detached".into());
                    }
                }
            }
            Err(wire::WireError::Closed) => return Err("connection closed before the run said it ended".into()),
            Err(e) => return Err(format!("bad data from the run, disconnected: {e}")),
        }
    }
}

pub fn run(args: &AttachArgs) -> anyhow::Result<Summary> {
    if args.list {
        let dir = probes::attach::runtime_dir()?;
        let found = discover(&dir);
        if found.is_empty() {
            println!("no instrumented runs in {}", dir.display());
        }
        for f in found {
            println!("{}  {}  {}", f.pid, f.program, f.socket.display());
        }
        return Ok(Summary::default());
    }
    let (mut stream, addr) = connect(args.target.as_deref())?;
    wire::client_hello(&mut stream).context("handshake")?;
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let hello = match wire::read_frame(&mut reader) {
        Ok(Frame::Hello(h)) => h,
        Ok(_) => bail!("{addr}: the run did not greet first"),
        Err(e) => bail!("{addr}: {e}"),
    };
    let mut settings: RunSettings = serde_json::from_value(hello.settings.clone()).unwrap_or_default();
    if settings.model.is_empty() {
        settings.model = hello.program.clone();
    }
    eprintln!(
        "pipeprof: attached to {} (pid {}) at {addr}; Ctrl-C detaches, the run goes on",
        hello.program, hello.pid
    );
    let mut agg = Aggregator::new(settings.clone());
    for (id, name) in &hello.threads {
        agg.push(&Event::Thread { id: *id, name: name.clone().into_boxed_str() });
    }
    let mut exporters: Vec<Box<dyn Exporter>> = Vec::new();
    if let Some(p) = &args.trace {
        let mut t = ChromeTrace::create(p, &format!("{} (pid {})", hello.program, hello.pid), Default::default())
            .with_context(|| format!("cannot create {}", p.display()))?;
        t.settings(&settings)?;
        exporters.push(Box::new(t));
    }
    signal::install();
    let (tx, rx) = crossbeam_channel::bounded::<Event>(65_536);
    let pump = std::thread::Builder::new().name("pp-attach".into()).spawn(move || pump(reader, tx))?;
    let deadline = args.duration.map(|d| std::time::Instant::now() + Duration::from_secs_f64(d.max(0.0)));
    let tty = std::io::stderr().is_terminal() && !args.once;
    let mut last_draw = std::time::Instant::now();
    loop {
        if signal::flag().load(std::sync::atomic::Ordering::Relaxed)
            || deadline.is_some_and(|d| std::time::Instant::now() >= d)
        {
            break;
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(ev) => {
                for x in &mut exporters {
                    let _ = x.event(&ev);
                }
                agg.push(&ev);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
        }
        if tty && last_draw.elapsed() >= Duration::from_millis(250) {
            last_draw = std::time::Instant::now();
            let s = agg.summary();
            eprint!(
                "\r\x1b[K{} · step {} · {:.1} images/s · {}",
                hello.program,
                s.steps,
                s.images_per_s,
                diagnose::diagnose(&s).headline
            );
        }
    }
    if tty {
        eprint!("\r\x1b[K");
    }
    drop(rx);
    let ended = if pump.is_finished() {
        match pump.join() {
            Ok(Ok(stats)) => {
                agg.set_dropped(stats.events_dropped);
                Some(format!(
                    "run ended ({} events dropped in the run, {} slow clients cut off)",
                    stats.events_dropped, stats.slow_clients_dropped
                ))
            }
            Ok(Err(why)) => Some(why),
            Err(_) => None,
        }
    } else {
        None
    };
    let summary = agg.summary();
    for x in &mut exporters {
        let _ = x.summary(&summary).and_then(|()| x.finish());
    }
    match ended {
        Some(why) => eprintln!("pipeprof: {why}"),
        None => eprintln!("pipeprof: detached; the run goes on"),
    }
    print!("{}", report::render(&summary));
    if let Some(p) = &args.summary {
        std::fs::write(p, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(summary)
}
