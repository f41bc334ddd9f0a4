//! `pipeprof attach`: watch a training run in another process.

use crate::report;
use crate::session::{Running, SecondInterrupt, Session, Stop, TraceSpec};
use anyhow::{bail, Context};
use pipeprof_core::aggregate::RunSettings;
use pipeprof_core::diagnose::Diagnosed;
use probes::attach::conn::{Address, Stream};
use probes::attach::wire::{self, Frame, ServerStats};
use probes::{Event, Probe};
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What `pipeprof attach` was asked for (the command line's `attach` flags).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// A PID, a socket path or HOST:PORT; None = the one instrumented run found.
    pub target: Option<String>,
    /// More targets: with `target`, the ranks of one distributed run, watched as one.
    pub also: Vec<String>,
    /// No live view: collect until the run ends (or `duration` passes), then report.
    pub once: bool,
    /// Detach after this many seconds.
    pub duration: Option<f64>,
    pub summary: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// `--html`: the report as an HTML page, written when the attachment ends.
    pub html: Option<PathBuf>,
    /// List the runs that can be attached to, and exit.
    pub list: bool,
    pub no_tui: bool,
    /// `--metrics-listen`: serve `/metrics` there while attached.
    pub metrics_listen: Option<String>,
    pub metrics_allow_remote: bool,
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
fn discover(dir: &Path) -> Vec<Found> {
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

/// The run to watch: the one found, a PID, a socket path or HOST:PORT (the one rule of
/// [`Address::parse`], shared with producers).
fn connect(target: Option<&str>) -> anyhow::Result<(Stream, Address)> {
    let dir = probes::attach::runtime_dir()?;
    let address = match target {
        None => {
            let found = discover(&dir);
            match found.as_slice() {
                [] => bail!(
                    "no instrumented run to attach to (looked in {}): start one, e.g. \
                     `cargo run --release --example train_cnn -- --data /tmp/pp-imgs`, or pass HOST:PORT",
                    dir.display()
                ),
                [one] => Address::Unix(one.socket.clone()),
                many => {
                    let list: Vec<String> = many.iter().map(|f| format!("  {}  {}", f.pid, f.program)).collect();
                    bail!("several runs can be attached to; pass a PID:\n{}", list.join("\n"))
                }
            }
        }
        Some(t) if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) => {
            Address::Unix(dir.join(format!("{t}.sock")))
        }
        Some(t) => Address::parse(t),
    };
    let s = Stream::connect(&address).with_context(|| match &address {
        Address::Unix(p) => format!(
            "cannot connect to {} (is the run still going? `pipeprof attach --list` shows the live ones)",
            p.display()
        ),
        Address::Tcp(t) => format!("cannot connect to {t}"),
    })?;
    Ok((s, address))
}

/// How a connection ended.
enum Ended {
    /// The run said it ended, with its counters.
    Run(ServerStats),
    /// Something else: a reason to print.
    Other(String),
}

/// Where one connection's events go: marked with its rank (one of several runs watched at
/// once) or not, with or without its machine samples (the processes of one machine sample the
/// same machine: one of them is kept).
struct Source {
    rank: Option<probes::Rank>,
    machine: bool,
    /// Added to this connection's thread ids: each program numbers its threads from 1, and
    /// the runs watched at once must not share ids.
    thread_base: u32,
}

/// Thread ids one connection may use before they wrap into the next one's range.
const THREADS_PER_SOURCE: u32 = 1 << 20;

/// `id` of connection `i`'s program, as the run watched as one knows it.
fn rebased(id: u32, base: u32) -> u32 {
    base.wrapping_add(id % THREADS_PER_SOURCE)
}

/// `ev` with its thread ids moved into its connection's range.
fn rebase(ev: Event, base: u32) -> Event {
    if base == 0 {
        return ev;
    }
    match ev {
        Event::Thread { id, name, role } => Event::Thread { id: rebased(id, base), name, role },
        Event::Span(mut s) => {
            s.thread = rebased(s.thread, base);
            Event::Span(s)
        }
        Event::Spans(mut v) => {
            v.iter_mut().for_each(|s| s.thread = rebased(s.thread, base));
            Event::Spans(v)
        }
        ev => ev,
    }
}

/// Reads one connection's frames into the session's channel until the run ends, the
/// connection drops or the run is detached.
fn pump(mut r: impl Read, probe: &Probe, src: &Source, stop: Stop) -> Ended {
    loop {
        match wire::read_frame(&mut r) {
            Ok(Frame::End(stats)) => {
                probe.count_dropped(stats.events_dropped);
                return Ended::Run(stats);
            }
            Ok(Frame::Hello(_)) => {}
            Ok(f) => {
                let ev = match (f.into_event(), src.rank) {
                    (Some(Event::Host(_) | Event::Gpu(_)), _) if !src.machine => continue,
                    (Some(ev @ (Event::Host(_) | Event::Gpu(_))), _) | (Some(ev), None) => ev,
                    (Some(ev), Some(rank)) => Event::Ranked(rank, Box::new(rebase(ev, src.thread_base))),
                    (None, _) => continue,
                };
                // Waits for room: a slow collector slows the reading, never drops.
                if !probe.send_blocking(ev) {
                    return Ended::Other("detached".into());
                }
            }
            Err(_) if stop.requested() => return Ended::Other("detached".into()),
            Err(wire::WireError::Closed) => {
                return Ended::Other("the connection closed before the run said it ended".into())
            }
            Err(e) => return Ended::Other(format!("bad data from the run, disconnected: {e}")),
        }
    }
}

/// `attach --list`: the runs that can be attached to.
fn list() -> anyhow::Result<()> {
    let dir = probes::attach::runtime_dir()?;
    let found = discover(&dir);
    if found.is_empty() {
        pipeprof_trainer::progress::out(&format!(
            "no instrumented runs in {}\n",
            pipeprof_trainer::progress::clean(&dir.display().to_string())
        ));
    }
    for f in found {
        let line = format!("{}  {}  {}", f.pid, f.program, f.socket.display());
        pipeprof_trainer::progress::out(&format!("{}\n", pipeprof_trainer::progress::clean(&line)));
    }
    Ok(())
}

/// The run's settings from its greeting, checked; the program's name stands in for a model.
fn settings_of(hello: &wire::Hello, addr: &str) -> anyhow::Result<RunSettings> {
    // Key by key: one setting that does not read (`"input": "3x150x150"`) is named and left
    // out; the others are kept.
    let mut settings = RunSettings::default();
    for why in settings.merge_json(&hello.settings) {
        pipeprof_trainer::progress::warn(&format!("{addr}: a setting the run sent does not read, left out: {why}"));
    }
    if let Err(why) = crate::export::read::check_settings(&settings) {
        bail!("{addr}: the run sent settings out of range ({why}): not attaching");
    }
    if settings.model.is_empty() {
        settings.model =
            pipeprof_core::model_source::ModelSource::Program(pipeprof_core::aggregate::settings::clean_name(
                &hello.program,
                pipeprof_core::aggregate::settings::MAX_NAME,
            ));
    }
    Ok(settings)
}

fn say_how_it_ended(ended: Ended, prefix: &str) {
    match ended {
        Ended::Run(stats) => pipeprof_trainer::progress::say(&format!(
            "{prefix}pipeprof: run ended ({} events dropped in the run, {} slow clients cut off, {} events not sendable)",
            stats.events_dropped, stats.slow_clients_dropped, stats.unencodable_frames
        )),
        Ended::Other(why) if why == "detached" => pipeprof_trainer::progress::say(&format!("{prefix}pipeprof: detached; the run goes on")),
        Ended::Other(why) => pipeprof_trainer::progress::say(&format!("{prefix}pipeprof: {why}")),
    }
}

/// A connection to a run, greeted.
struct Opened {
    reader: BufReader<Stream>,
    closer: Box<dyn Fn() + Send>,
    hello: wire::Hello,
    addr: String,
}

fn open(target: Option<&str>) -> anyhow::Result<Opened> {
    let (mut stream, address) = connect(target)?;
    let addr = address.to_string();
    wire::client_hello(&mut stream).with_context(|| format!("{addr}: handshake"))?;
    let closer = stream.try_clone_closer()?;
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let hello = match wire::read_frame(&mut reader) {
        Ok(Frame::Hello(h)) => h,
        Ok(_) => bail!("{addr}: the run did not greet first"),
        Err(e) if matches!(address, Address::Tcp(_)) => bail!(
            "{addr}: {e}: a run listening on TCP closes on viewers without its token \
             (set {}= to the token the run printed)",
            wire::TOKEN_ENV
        ),
        Err(e) => bail!("{addr}: {e}"),
    };
    Ok(Opened { reader, closer, hello, addr })
}

/// The ranks each connection stands for: the rank its process said (its `RANK`), else its
/// place in the list; two connections of one rank are refused.
fn ranks_of(said: &[Option<probes::Rank>]) -> Result<Vec<probes::Rank>, String> {
    let n = said.len() as u32;
    let ranks: Vec<probes::Rank> = said
        .iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or(probes::Rank { rank: i as u32, local_rank: i as u32, world_size: n }))
        .collect();
    for (i, r) in ranks.iter().enumerate() {
        if let Some(j) = ranks[..i].iter().position(|x| x.rank == r.rank) {
            return Err(format!("targets {} and {} are both rank {}: give each rank once", j + 1, i + 1, r.rank));
        }
    }
    Ok(ranks)
}

/// The thread-id range of the `i`th of several connections (never 0: that is "no change").
fn base_of(i: usize) -> u32 {
    (i as u32 + 1) * THREADS_PER_SOURCE
}

/// The runs watched, greeted: one, or the ranks of one distributed run.
struct Watched {
    conns: Vec<Conn>,
    settings: RunSettings,
    /// The trace's process name.
    title: String,
    /// Several ranks: a trace per rank too.
    per_rank: bool,
}

/// One connection, with where its events go and how its end is said.
struct Conn {
    opened: Opened,
    src: Source,
    /// Before the line that says how it ended (`rank 1: `).
    prefix: String,
}

/// `attach [TARGET]`: one run, the one found or the one named.
fn watch_one(args: &Options) -> anyhow::Result<Watched> {
    let opened = open(args.target.as_deref())?;
    let settings = settings_of(&opened.hello, &opened.addr)?;
    let hello = &opened.hello;
    // The program name comes from the other process.
    pipeprof_trainer::progress::say(&format!(
        "pipeprof: attached to {} (pid {}) at {}; {} detaches, the run goes on",
        hello.program,
        hello.pid,
        opened.addr,
        if args.once { "Ctrl-C" } else { "q" }
    ));
    let title = format!("{} (pid {})", hello.program, hello.pid);
    let src = Source { rank: None, machine: true, thread_base: 0 };
    Ok(Watched { conns: vec![Conn { opened, src, prefix: String::new() }], settings, title, per_rank: false })
}

/// `attach A B …`: several runs (the ranks of one distributed run) watched as one, each
/// connection's events counted for the run and for its rank.
fn watch_ranks(args: &Options) -> anyhow::Result<Watched> {
    if args.also.len() >= pipeprof_core::aggregate::ranks::MAX_RANKS {
        bail!(
            "{} targets: attach watches at most {} ranks at once",
            args.also.len() + 1,
            pipeprof_core::aggregate::ranks::MAX_RANKS
        );
    }
    let targets: Vec<&str> = args.target.iter().chain(&args.also).map(String::as_str).collect();
    let opened = targets.iter().map(|t| open(Some(t))).collect::<anyhow::Result<Vec<Opened>>>()?;
    let said: Vec<Option<probes::Rank>> = opened.iter().map(|o| o.hello.rank).collect();
    let ranks = ranks_of(&said).map_err(|e| anyhow::anyhow!(e))?;
    if said.iter().any(Option::is_none) {
        pipeprof_trainer::progress::warn(
            "a process named no rank (no RANK/WORLD_SIZE in its environment): ranked by the order given",
        );
    }
    let settings = settings_of(&opened[0].hello, &opened[0].addr)?;
    for (o, r) in opened.iter().zip(&ranks) {
        pipeprof_trainer::progress::say(&format!(
            "pipeprof: attached to {} (pid {}) at {} as rank {}",
            o.hello.program, o.hello.pid, o.addr, r.rank
        ));
    }
    let title = format!("{} ({} ranks)", opened[0].hello.program, ranks.len());
    let conns = opened
        .into_iter()
        .zip(ranks)
        .enumerate()
        .map(|(i, (opened, r))| Conn {
            opened,
            src: Source { rank: Some(r), machine: i == 0, thread_base: base_of(i) },
            prefix: format!("rank {}: ", r.rank),
        })
        .collect();
    Ok(Watched { conns, settings, title, per_rank: true })
}

impl Watched {
    /// What the greetings said, before any event: the threads each program has, and each
    /// rank's own settings (its batch size, workers).
    fn prime(&self, agg: &mut pipeprof_core::aggregate::Aggregator) {
        for c in &self.conns {
            let hello = &c.opened.hello;
            for t in hello.thread_events() {
                let t = rebase(t, c.src.thread_base);
                agg.push(&match c.src.rank {
                    Some(r) => Event::Ranked(r, Box::new(t)),
                    None => t,
                });
            }
            if let (Some(r), true) = (c.src.rank, hello.settings.is_object()) {
                agg.push(&Event::Ranked(r, Box::new(Event::Settings(Box::new(hello.settings.clone())))));
            }
        }
    }
}

/// A reader thread per connection (`pp-attach`, `pp-attach-N`); each fires the session's
/// `done` as it ends. Returns the readers with the prefixes of their ends, and the closers
/// that detach them.
#[allow(clippy::type_complexity)]
fn spawn_pumps(
    conns: Vec<Conn>,
    running: &Running,
) -> anyhow::Result<(Vec<(JoinHandle<Ended>, String)>, Vec<Box<dyn Fn() + Send>>)> {
    let several = conns.len() > 1;
    let (mut pumps, mut closers) = (Vec::new(), Vec::new());
    for (i, c) in conns.into_iter().enumerate() {
        closers.push(c.opened.closer);
        let (probe, done, stop, src, reader) =
            (running.probe().clone(), running.done(), running.stop(), c.src, c.opened.reader);
        let name = if several { format!("pp-attach-{i}") } else { "pp-attach".into() };
        let pump = std::thread::Builder::new().name(name).spawn(move || {
            let ended = pump(reader, &probe, &src, stop);
            drop(done);
            ended
        })?;
        pumps.push((pump, c.prefix));
    }
    Ok((pumps, closers))
}

/// Detaching (q, Ctrl-C, `--duration` passing) closes our end of every socket: the readers
/// stop, the runs are not affected. Ends with the readers.
fn spawn_detacher(
    duration: Option<f64>,
    closers: Vec<Box<dyn Fn() + Send>>,
    running: &Running,
) -> std::io::Result<JoinHandle<()>> {
    // The flag's parser keeps it in range; an out-of-range value from another caller means
    // no deadline rather than a panic.
    let deadline =
        duration.and_then(|d| Duration::try_from_secs_f64(d).ok()).and_then(|d| Instant::now().checked_add(d));
    let (ended, stop) = (running.ended(), running.stop());
    std::thread::Builder::new().name("pp-detach".into()).spawn(move || loop {
        if stop.requested() || deadline.is_some_and(|d| Instant::now() >= d) {
            stop.request();
            closers.iter().for_each(|c| c());
            return;
        }
        match ended.recv_timeout(Duration::from_millis(50)) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    })
}

/// `pipeprof attach`: watches one run, or the ranks of one, until they end or are detached
/// (which is not an interruption of anything: exit 0); the summary file, then the report.
pub fn run(args: &Options) -> anyhow::Result<Diagnosed> {
    if args.list {
        list()?;
        return Ok(Diagnosed::default());
    }
    // Bound before anything starts: a taken port fails here, not mid-run.
    let metrics =
        args.metrics_listen.as_deref().map(|a| crate::metrics::bind(a, args.metrics_allow_remote)).transpose()?;
    let watched = if args.also.is_empty() { watch_one(args)? } else { watch_ranks(args)? };
    let trace = args.trace.as_deref().map(|path| TraceSpec {
        path,
        title: &watched.title,
        level: Default::default(),
        per_rank: watched.per_rank,
    });
    // A second interrupt or a hang-up detaches like the first: the files are still written.
    let mut session = Session::new(watched.settings.clone(), SecondInterrupt::EndsTheRun)
        .trace(trace)?
        .summary(args.summary.clone())
        .html(args.html.clone())
        .metrics(metrics)
        .no_tui(args.once || args.no_tui);
    watched.prime(session.aggregate());
    let mut running = session.start()?;
    let (pumps, closers) = spawn_pumps(watched.conns, &running)?;
    let detacher = spawn_detacher(args.duration, closers, &running)?;
    running.show();
    let mut endings = Vec::new();
    for (p, prefix) in pumps {
        endings.push((p.join().map_err(|_| anyhow::anyhow!("an attach reader panicked"))?, prefix));
    }
    let _ = detacher.join();
    for (ended, prefix) in endings {
        say_how_it_ended(ended, &prefix);
    }
    let fin = running.finish(None);
    pipeprof_trainer::progress::out(&report::render(&fin.done));
    fin.written?;
    match fin.collector_died {
        Some(why) => Err(anyhow::anyhow!(why)),
        None => Ok(fin.done),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes::Rank;

    #[test]
    fn each_target_is_the_rank_its_process_said_else_its_place() {
        let r = |rank, world| Some(Rank { rank, local_rank: rank, world_size: world });
        let got = ranks_of(&[r(1, 2), r(0, 2)]).unwrap();
        assert_eq!(got.iter().map(|x| x.rank).collect::<Vec<_>>(), vec![1, 0]);
        let got = ranks_of(&[None, None, None]).unwrap();
        assert_eq!(got.iter().map(|x| (x.rank, x.world_size)).collect::<Vec<_>>(), vec![(0, 3), (1, 3), (2, 3)]);
        assert_eq!(ranks_of(&[r(1, 2), r(1, 2)]).unwrap_err(), "targets 1 and 2 are both rank 1: give each rank once");
        // A process without a rank is ranked by its place, which may clash with one that said.
        assert!(ranks_of(&[r(1, 2), None]).is_err());
    }

    #[test]
    fn the_same_thread_id_in_two_programs_is_two_threads() {
        let t = |id| Event::Thread { id, name: "MainThread".into(), role: Default::default() };
        let ids = |ev: Event| match ev {
            Event::Thread { id, .. } => id,
            _ => unreachable!(),
        };
        assert_eq!(ids(rebase(t(1), 0)), 1, "one connection: ids as sent");
        let (a, b) = (ids(rebase(t(1), base_of(0))), ids(rebase(t(1), base_of(1))));
        assert_ne!(a, b);
        // Spans follow their thread.
        let span = probes::SpanRecord {
            stage: probes::Stage::Decode,
            thread: 1,
            start_ns: 0,
            dur_ns: 1,
            cpu_ns: probes::NONE,
            queue_ns: probes::NONE,
            step: probes::NONE,
            sample: probes::NONE,
            bytes: probes::NONE,
        };
        let Event::Spans(v) = rebase(Event::Spans(vec![span]), base_of(1)) else { unreachable!() };
        assert_eq!(v[0].thread, b);
        // Hostile ids stay in their connection's range.
        assert_eq!(rebased(u32::MAX, base_of(0)) / THREADS_PER_SOURCE, 1);
    }
}
