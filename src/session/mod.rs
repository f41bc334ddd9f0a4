//! The one run pipeline every command goes through (`profile`, `attach`, `run`): the channel
//! and its dropped counter, the exporters (the trace, a trace per rank, the summary file, the
//! HTML page), the
//! one collector thread, `/metrics`, the view, the signals, and the order things end in.
//!
//! A command builds a [`Session`] from the run's settings, starts it, starts its own source of
//! events on [`Running::probe`] (the training thread and its Layer; attach's readers; `run`'s
//! relays), shows the run, stops its source, and finishes: the collector gets the last event,
//! the summary file is written, and [`Finished`] holds the summary with its verdict. How the
//! command ended (why it failed, if it did) is the command's; everything else is here.
//!
//! ```text
//! Session::new(settings) ─ trace ─ summary ─ metrics ─ view ─ start()
//!   → Running: command starts its source (probe, done, stop, out) → show() → close() → finish()
//! ```

mod collect;
mod summary;
mod view;

pub use collect::{collect, latest, Latest};
pub use summary::{failed_field, schema as summary_schema, SummaryFile};
pub use view::{live_view, serve_metrics, show, Out, Stop};

use crate::export::chrome::{ChromeTrace, TraceLevel};
use crate::export::guard::TraceGuard;
use crate::export::Exporter;
use anyhow::Context;
use crossbeam_channel::{Receiver, Sender};
use pipeprof_core::aggregate::{Aggregator, RunSettings};
use pipeprof_core::diagnose::Diagnosed;
use pipeprof_core::signal;
use pipeprof_trainer::progress;
use probes::{Event, Probe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// What a second interrupt (after the grace period) does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecondInterrupt {
    /// `profile`, whose training loop may be stuck in a read: exit at once, the trace closed
    /// through its guard and the summary of the last snapshot written first. The process then
    /// exits with 128 + the signal that stopped it.
    ExitsAtOnce,
    /// `run` and `attach`: counted, for the command to hurry its own end, which writes every
    /// file. The signal is forgotten at the end: the command's own exit code stands.
    EndsTheRun,
}

/// The trace of a run (`--trace`).
pub struct TraceSpec<'a> {
    pub path: &'a Path,
    /// The trace's process name.
    pub title: &'a str,
    pub level: TraceLevel,
    /// A distributed run's ranks also get a trace each, beside this one.
    pub per_rank: bool,
}

/// A run being set up: nothing has started.
pub struct Session {
    agg: Aggregator,
    settings: RunSettings,
    second: SecondInterrupt,
    capacity: usize,
    exporters: Vec<Box<dyn Exporter>>,
    trace: Option<(TraceGuard, Arc<OnceLock<String>>)>,
    summary: Option<SummaryFile>,
    html: Option<PathBuf>,
    metrics: Option<crate::metrics::Listener>,
    no_tui: bool,
    detect_fs: bool,
}

impl Session {
    /// A run of `settings`, ending on a second interrupt as `second` says.
    pub fn new(settings: RunSettings, second: SecondInterrupt) -> Session {
        Session {
            agg: Aggregator::new(settings.clone()),
            settings,
            second,
            capacity: probes::DEFAULT_CAPACITY,
            exporters: Vec::new(),
            trace: None,
            summary: None,
            html: None,
            metrics: None,
            no_tui: false,
            detect_fs: false,
        }
    }

    /// The aggregate, for what the command knows before the first event (the data's
    /// filesystem, the threads a greeting named).
    pub fn aggregate(&mut self) -> &mut Aggregator {
        &mut self.agg
    }

    /// Events the channel holds before it drops (and counts) more.
    pub fn capacity(mut self, capacity: usize) -> Session {
        self.capacity = capacity;
        self
    }

    /// Streams the trace to `spec.path` (and a trace per rank beside it), created now.
    pub fn trace(mut self, spec: Option<TraceSpec>) -> anyhow::Result<Session> {
        let Some(spec) = spec else { return Ok(self) };
        let path = spec.path;
        let (mut t, guard) = ChromeTrace::create_guarded(path, spec.title, spec.level)
            .with_context(|| format!("cannot create the trace file {}", path.display()))?;
        t.settings(&self.settings).with_context(|| format!("cannot write the trace file {}", path.display()))?;
        self.trace = Some((guard, t.failure_slot()));
        self.exporters.push(Box::new(t));
        if spec.per_rank {
            let mut per_rank = crate::export::ranks::RankTraces::new(path, spec.title, spec.level);
            per_rank.settings(&self.settings)?;
            self.exporters.push(Box::new(per_rank));
        }
        Ok(self)
    }

    /// Writes the summary file (`--summary`) at the end.
    pub fn summary(mut self, path: Option<PathBuf>) -> Session {
        self.summary = path.map(SummaryFile::new);
        self
    }

    /// Writes the report as an HTML page (`--html`) at the end, after the summary file.
    pub fn html(mut self, path: Option<PathBuf>) -> Session {
        self.html = path;
        self
    }

    /// Serves `/metrics` on `listener` (bound by the command before anything started).
    pub fn metrics(mut self, listener: Option<crate::metrics::Listener>) -> Session {
        self.metrics = listener;
        self
    }

    /// The progress line, never the live view.
    pub fn no_tui(mut self, no_tui: bool) -> Session {
        self.no_tui = no_tui;
        self
    }

    /// Look up the filesystem under the data folder the program names once it runs
    /// (`pipeprof run`: the storage flag and the copy-to-local advice need it).
    pub fn detect_data_fs(mut self, on: bool) -> Session {
        self.detect_fs = on;
        self
    }

    /// Installs the signals, opens the channel, starts the collector and `/metrics`.
    pub fn start(self) -> anyhow::Result<Running> {
        if self.second == SecondInterrupt::EndsTheRun {
            signal::end_through_the_run();
        }
        signal::install();
        let (probe, rx) = Probe::new(self.capacity);
        let latest = latest(&self.agg);
        let collector = spawn_collector(rx, self.agg, self.exporters, &latest, &probe, self.detect_fs)?;
        let (guard, failure) = self.trace.unzip();
        if self.second == SecondInterrupt::ExitsAtOnce {
            on_abort(guard, self.summary.clone(), self.html.clone(), latest.clone());
        }
        let metrics = serve_metrics(self.metrics, &latest);
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
        Ok(Running {
            probe,
            latest,
            collector: Some(collector),
            failure,
            summary: self.summary,
            html: self.html,
            second: self.second,
            no_tui: self.no_tui,
            done_tx: Some(done_tx),
            done_rx,
            out: Out::default(),
            stop: Stop::of_signals(),
            closed: Arc::new(AtomicBool::new(false)),
            _metrics: metrics,
        })
    }
}

/// The collector thread: the one place events become the aggregate and the exports.
fn spawn_collector(
    rx: Receiver<Event>,
    agg: Aggregator,
    exporters: Vec<Box<dyn Exporter>>,
    latest: &Latest,
    probe: &Probe,
    detect_fs: bool,
) -> std::io::Result<JoinHandle<Diagnosed>> {
    let (latest, probe) = (latest.clone(), probe.clone());
    std::thread::Builder::new()
        .name("pp-collector".into())
        .spawn(move || collect(rx, agg, exporters, &latest, &move || probe.dropped(), detect_fs))
}

/// What an immediate exit writes first: the trace's closing bytes (through the guard, whatever
/// the collector is doing), then the summary and the HTML page of the last published snapshot.
fn on_abort(trace: Option<TraceGuard>, summary: Option<SummaryFile>, page: Option<PathBuf>, latest: Latest) {
    signal::on_abort(Box::new(move || {
        if let Some(g) = &trace {
            if let Err(e) = g.close_now() {
                progress::warn(&format!(
                    "exiting at once: cannot close the trace ({e}): `pipeprof report --repair` closes it"
                ));
            }
        }
        summary::write_on_abort(summary.as_ref(), page.as_deref(), &latest);
    }));
}

/// A run going: the collector is waiting for the source's events.
pub struct Running {
    probe: Probe,
    latest: Latest,
    collector: Option<JoinHandle<Diagnosed>>,
    failure: Option<Arc<OnceLock<String>>>,
    summary: Option<SummaryFile>,
    html: Option<PathBuf>,
    second: SecondInterrupt,
    no_tui: bool,
    done_tx: Option<Sender<()>>,
    done_rx: Receiver<()>,
    out: Out,
    stop: Stop,
    closed: Arc<AtomicBool>,
    _metrics: Option<crate::metrics::serve::Serving>,
}

/// A finished run.
pub struct Finished {
    /// The final summary with its verdict (the last published one if the collector died).
    pub done: Diagnosed,
    /// The summary file's `failed`: the program's own words, then why the run failed.
    pub failed: Option<String>,
    /// The collector thread panicked, and why: the run failed.
    pub collector_died: Option<String>,
    /// Writing the summary file and the HTML page: the first error is the command's, raised
    /// after the report.
    pub written: anyhow::Result<()>,
}

impl Running {
    /// Where the source sends its events.
    pub fn probe(&self) -> &Probe {
        &self.probe
    }

    /// Fired (sent, or dropped by every holder) when the source has ended: the view stops.
    pub fn done(&self) -> Sender<()> {
        self.done_tx.clone().unwrap_or_else(|| crossbeam_channel::bounded(1).0)
    }

    /// Fires when the source has ended.
    pub fn ended(&self) -> Receiver<()> {
        self.done_rx.clone()
    }

    /// The run's stop.
    pub fn stop(&self) -> Stop {
        self.stop
    }

    /// Where the source's threads say things.
    pub fn out(&self) -> Out {
        self.out.clone()
    }

    /// Shows the run (the live view, else the progress line) until the source has ended, then
    /// says what was held while the view had the terminal.
    pub fn show(&mut self) {
        drop(self.done_tx.take());
        show(self.no_tui, &self.latest, &self.done_rx, self.stop);
        self.out.flush();
    }

    /// Closes the run's events from the source's own thread (the program's end seen there).
    pub fn closer(&self) -> Closer {
        Closer { probe: self.probe.clone(), closed: self.closed.clone() }
    }

    /// No more events: the collector closes its outputs, the trace marked failed with
    /// `trace_failure` when given (unless the source closed first). Later events are not
    /// counted.
    pub fn close(&mut self, trace_failure: Option<&str>) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        if let (Some(slot), Some(why)) = (&self.failure, trace_failure) {
            let _ = slot.set(why.to_string());
        }
        self.closer().close();
    }

    /// Closes (if not yet), waits for the collector, writes the summary file and the HTML page
    /// with `why` the run failed, if it did. A collector that panicked leaves its last published summary,
    /// and fails the run.
    pub fn finish(mut self, why: Option<String>) -> Finished {
        self.close(None);
        let joined = self.collector.take().map(JoinHandle::join);
        let (done, collector_died) = match joined {
            Some(Ok(done)) => (done, None),
            Some(Err(p)) => {
                let last = self.latest.lock().unwrap_or_else(|e| e.into_inner()).snap.summary.clone();
                let why = format!(
                    "the collector thread (pp-collector) panicked: {}",
                    pipeprof_trainer::data::loader::panic_message(&*p)
                );
                (Diagnosed::new(last), Some(why))
            }
            None => (Diagnosed::default(), None),
        };
        let why = match (&collector_died, why) {
            (Some(died), Some(w)) => Some(format!("{died}: {w}")),
            (died, w) => died.clone().or(w),
        };
        if self.second == SecondInterrupt::EndsTheRun {
            // The command's own exit code says how the run ended.
            signal::clear();
        }
        let failed = failed_field(done.summary.failed.as_deref(), why.as_deref());
        // The file first: a closed stdout or terminal must not cost it. An immediate exit
        // meanwhile waits for it, then finds its hooks disarmed: nothing is written twice.
        let written = if self.summary.is_some() || self.html.is_some() {
            signal::disarm_after(|| {
                let summary = self.summary.as_ref().map_or(Ok(()), |f| f.write_and_say(&done, why.as_deref()));
                let page = self.html.as_deref().map_or(Ok(()), |p| write_page(p, &done, failed.as_deref()));
                summary.and(page)
            })
        } else {
            Ok(())
        };
        Finished { done, failed, collector_died, written }
    }
}

/// The HTML page (`--html`): the summary file's run as a page, failed as the file says.
fn write_page(path: &std::path::Path, done: &Diagnosed, failed: Option<&str>) -> anyhow::Result<()> {
    let mut d = done.clone();
    d.summary.failed = failed.map(str::to_string);
    crate::html::save(path, &d, crate::html::Form::Page)
}

/// Ends a run's events, once, from any thread.
#[derive(Clone)]
pub struct Closer {
    probe: Probe,
    closed: Arc<AtomicBool>,
}

impl Closer {
    /// Sends the collector its last event (the first call only).
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.probe.send_blocking(Event::Finish);
        }
    }
}

impl Drop for Running {
    /// A command that gave up after starting (its program would not start): the collector
    /// still closes the trace.
    fn drop(&mut self) {
        if let Some(c) = self.collector.take() {
            self.close(None);
            let _ = c.join();
        }
    }
}
