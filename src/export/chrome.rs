//! Chrome Trace Event Format, streamed: `{"traceEvents":[ … ]}`, one event per line.
//!
//! Opens in Perfetto (ui.perfetto.dev), chrome://tracing and DevTools. Events are written as
//! they arrive and flushed at every host sample (5 Hz), so memory stays bounded and a run
//! killed with `kill -9` leaves a prefix that `pipeprof report --repair` closes. Every other
//! exit path closes the file, through [`Exporter::finish`] or, on unwinding, `Drop`.
//!
//! Content: `X` events for spans (`cat` = stage; args: step, sample, bytes, cpu_us,
//! core_wait_us = runnable without a core, blocked_us = the rest off-CPU), `M`
//! thread and process names, `C` counters (CPU, RSS, storage, queue, images/s, per GPU), and
//! instant events for the run's settings, verdict changes and the final summary.

use super::schema::{self, cpu, gpu, rss, span, step, storage};
use super::Exporter;
use pipeprof_core::aggregate::RunSettings;
use pipeprof_core::diagnose::{Diagnosed, Verdict};
use probes::sample::{GpuSample, HostSample};
use probes::{Event, SpanRecord, Stage, StepRecord, ThreadRole, NONE};
use serde_json::{json, Value};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// How much of the loader goes into the trace (`profile --trace-level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TraceLevel {
    /// Training-loop stages and counters only: small whatever the data set.
    Stage,
    /// Also one span per sample per loader stage, up to 200,000 (SAMPLE_SPAN_CAP).
    #[default]
    Sample,
}

/// Per-sample loader spans written at most (≈ 150 bytes each: ≈ 30 MB). Past the cap, loader
/// spans are left out of the trace (the statistics still count them) and the trace says so.
pub const SAMPLE_SPAN_CAP: u64 = 200_000;

/// The trace's schema version, in the settings event.
pub const TRACE_VERSION: u32 = 1;

pub struct ChromeTrace<W: Write + Send> {
    out: W,
    pid: u32,
    first: bool,
    closed: bool,
    level: TraceLevel,
    loader_spans: u64,
    capped: bool,
    last_step_end: Option<u64>,
    last_ts: u64,
    /// Whether the per-layer track has been named.
    layer_track: bool,
    /// Set by the command when the run failed (a thread died): written with the summary.
    failure: Arc<OnceLock<String>>,
}

impl ChromeTrace<BufWriter<File>> {
    /// Creates `path` and writes the header.
    pub fn create(path: &Path, process_name: &str, level: TraceLevel) -> std::io::Result<Self> {
        let f = File::create(path)?;
        ChromeTrace::new(BufWriter::with_capacity(1 << 16, f), process_name, level)
    }
}

impl ChromeTrace<BufWriter<super::guard::GuardedFile>> {
    /// Creates `path` and writes the header; the guard can close the file at once from another
    /// thread (the exit on a second interrupt), leaving it loadable.
    pub fn create_guarded(
        path: &Path,
        process_name: &str,
        level: TraceLevel,
    ) -> std::io::Result<(Self, super::guard::TraceGuard)> {
        let (f, guard) = super::guard::create(path)?;
        Ok((ChromeTrace::new(BufWriter::with_capacity(1 << 16, f), process_name, level)?, guard))
    }
}

/// The trace track of per-layer times (a thread id no real thread gets).
const LAYER_TID: u32 = u32::MAX - 1;

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl<W: Write + Send> ChromeTrace<W> {
    pub fn new(out: W, process_name: &str, level: TraceLevel) -> std::io::Result<Self> {
        ChromeTrace::with_header(out, process_name, level, &serde_json::Map::new())
    }

    /// A trace whose header line also carries `fields` (top-level keys before `traceEvents`:
    /// a rank's `distributedInfo` and clock offset).
    pub fn with_header(
        mut out: W,
        process_name: &str,
        level: TraceLevel,
        fields: &serde_json::Map<String, serde_json::Value>,
    ) -> std::io::Result<Self> {
        let pid = std::process::id();
        out.write_all(b"{\"displayTimeUnit\":\"ms\",")?;
        for (k, v) in fields {
            // One line: the header stays the file's first line, as readers expect.
            out.write_all(format!("{}:{},", serde_json::Value::from(k.as_str()), v).as_bytes())?;
        }
        out.write_all(b"\"traceEvents\":[\n")?;
        let mut t = ChromeTrace {
            out,
            pid,
            first: true,
            closed: false,
            level,
            loader_spans: 0,
            capped: false,
            last_step_end: None,
            last_ts: 0,
            layer_track: false,
            failure: Arc::new(OnceLock::new()),
        };
        t.raw(&json!({"ph":"M","name":schema::PROCESS_NAME,"pid":pid,"tid":0,"args":obj([(schema::NAME, process_name.into())])}))?;
        t.raw(&json!({"ph":"M","name":schema::THREAD_NAME,"pid":pid,"tid":0,"args":obj([(schema::NAME, "pipeprof".into())])}))?;
        Ok(t)
    }

    /// Where the command puts why the run failed, before the collector closes the trace: the
    /// trace then ends with a `run failed` event and the summary event says so.
    pub fn failure_slot(&self) -> Arc<OnceLock<String>> {
        self.failure.clone()
    }

    fn raw(&mut self, v: &serde_json::Value) -> std::io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        serde_json::to_writer(&mut self.out, v).map_err(std::io::Error::other)
    }

    fn counter(&mut self, name: &str, t_ns: u64, mut args: serde_json::Value) -> std::io::Result<()> {
        // Counter series must be numbers: a NaN or inf (a diverged loss) became `null` in
        // `json!`, and is left out of its counter (the summary keeps it, as a word).
        if let Some(o) = args.as_object_mut() {
            o.retain(|_, v| !v.is_null());
        }
        self.raw(&json!({"ph":"C","name":name,"pid":self.pid,"tid":0,"ts":us(t_ns),"args":args}))
    }

    fn instant(&mut self, name: &str, t_ns: u64, args: serde_json::Value) -> std::io::Result<()> {
        self.raw(&json!({"ph":"i","s":"g","name":name,"pid":self.pid,"tid":0,"ts":us(t_ns),"args":args}))
    }

    /// A layer's forward or backward time, on a track of its own under the training thread's
    /// `forward`/`backward` spans (the records carry no thread: they come from the loop).
    fn layer(&mut self, l: &probes::LayerRecord) -> std::io::Result<()> {
        let (pid, tid) = (self.pid, LAYER_TID);
        if !self.layer_track {
            self.layer_track = true;
            self.raw(&json!({"ph":"M","name":schema::THREAD_NAME,"pid":pid,"tid":tid,"args":obj([(schema::NAME, "train: layers".into())])}))?;
            self.raw(&json!({"ph":"M","name":schema::THREAD_SORT,"pid":pid,"tid":tid,"args":{"sort_index":1}}))?;
        }
        self.last_ts = self.last_ts.max(l.start_ns + l.dur_ns);
        let phase = if l.backward { "backward" } else { "forward" };
        self.raw(&json!({"ph":"X","name":format!("{} {phase}", l.layer),"cat":"layer","pid":pid,"tid":tid,
                         "ts":us(l.start_ns),"dur":us(l.dur_ns),"args":{"step":l.step,"layer":&*l.layer,"phase":phase}}))
    }

    fn span(&mut self, s: &SpanRecord) -> std::io::Result<()> {
        if s.stage.is_loader() {
            if self.level == TraceLevel::Stage {
                return Ok(());
            }
            if self.loader_spans >= SAMPLE_SPAN_CAP {
                if !self.capped {
                    self.capped = true;
                    let msg = format!(
                        "per-sample loader spans capped at {SAMPLE_SPAN_CAP}: later ones are left out of the trace \
                         (the report's statistics still count them); use --trace-level stage for long runs"
                    );
                    self.instant(schema::CAPPED, s.start_ns, json!({ "message": msg }))?;
                }
                return Ok(());
            }
            self.loader_spans += 1;
        }
        self.last_ts = self.last_ts.max(s.end_ns());
        // The hot path of a trace (one line per span): formatted directly, no JSON tree.
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        let name = s.stage.name();
        write!(
            self.out,
            "{{\"ph\":\"X\",\"name\":\"{name}\",\"cat\":\"{name}\",\"pid\":{},\"tid\":{},\"ts\":{:.3},\"dur\":{:.3},\"args\":{{",
            self.pid,
            s.thread,
            us(s.start_ns),
            us(s.dur_ns)
        )?;
        let mut sep = "";
        for (k, v) in [(span::STEP, s.step), (span::SAMPLE, s.sample), (span::BYTES, s.bytes)] {
            if v != NONE {
                write!(self.out, "{sep}\"{k}\":{v}")?;
                sep = ",";
            }
        }
        if s.cpu_ns != NONE {
            write!(self.out, "{sep}\"{}\":{:.3}", span::CPU_US, us(s.cpu_ns))?;
            sep = ",";
        }
        if s.queue_ns != NONE {
            // Off-CPU split: waiting for a core, and the rest (blocked: storage, locks).
            let core_wait = s.queue_ns.min(s.dur_ns);
            write!(self.out, "{sep}\"{}\":{:.3}", span::CORE_WAIT_US, us(core_wait))?;
            if s.cpu_ns != NONE {
                let blocked = s.dur_ns.saturating_sub(s.cpu_ns.min(s.dur_ns)).saturating_sub(core_wait);
                write!(self.out, ",\"{}\":{:.3}", span::BLOCKED_US, us(blocked))?;
            }
        }
        self.out.write_all(b"}}")
    }
}

/// A JSON object of these keys and values (the keys: [`schema`]'s names).
fn obj<const N: usize>(pairs: [(&str, Value); N]) -> Value {
    Value::Object(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// The events that are more than one line of trace.
impl<W: Write + Send> ChromeTrace<W> {
    /// A thread's name and sort index: the training loop's track first, the others in the
    /// order they came.
    fn thread(&mut self, id: u32, name: &str, role: ThreadRole) -> std::io::Result<()> {
        let sort = if role == ThreadRole::Train { 0 } else { id as i64 };
        let pid = self.pid;
        self.raw(&json!({"ph":"M","name":schema::THREAD_SORT,"pid":pid,"tid":id,"args":{"sort_index":sort}}))?;
        let mut args = obj([(schema::NAME, name.into())]);
        if !role.is_other() {
            // For `pipeprof report` on the trace: viewers show the name.
            args[schema::ROLE] = serde_json::to_value(role).map_err(std::io::Error::other)?;
        }
        self.raw(&json!({"ph":"M","name":schema::THREAD_NAME,"pid":pid,"tid":id,"args":args}))
    }

    /// A training step: its counters, the rate since the last step, and a mark when the loss
    /// is not finite.
    fn step(&mut self, st: &StepRecord) -> std::io::Result<()> {
        let rate = match self.last_step_end {
            Some(prev) if st.end_ns > prev => st.images as f64 * 1e9 / (st.end_ns - prev) as f64,
            _ => 0.0,
        };
        self.last_step_end = Some(st.end_ns);
        self.last_ts = self.last_ts.max(st.end_ns);
        let args = obj([
            (step::STEP, st.step.into()),
            (step::EPOCH, st.epoch.into()),
            (step::IMAGES, st.images.into()),
            (step::LOSS, st.loss.into()),
            (step::CORRECT, st.correct.into()),
            (step::BATCHES_READY, st.queued.into()),
        ]);
        self.counter(step::EVENT, st.end_ns, args)?;
        self.counter(schema::RATE, st.end_ns, obj([(schema::RATE, rate.into())]))?;
        if !st.loss.is_finite() {
            let word = probes::nonfinite::word(f64::from(st.loss)).unwrap_or("NaN");
            self.instant(schema::LOSS_NOT_FINITE, st.end_ns, json!({"step": st.step, "loss": word}))?;
        }
        Ok(())
    }

    /// A host sample's counters, then a flush: host samples come at 5 Hz, a good pace for
    /// making the file durable.
    fn host(&mut self, h: &HostSample) -> std::io::Result<()> {
        self.last_ts = self.last_ts.max(h.t_ns);
        let usage = obj([(cpu::PROCESS, h.process_cpu_pct.into()), (cpu::MACHINE, h.global_cpu_pct.into())]);
        self.counter(cpu::EVENT, h.t_ns, usage)?;
        self.counter(rss::EVENT, h.t_ns, obj([(rss::RSS, (h.rss_bytes as f64 / 1e6).into())]))?;
        if let Some(r) = h.read_bytes_per_s {
            let write = h.write_bytes_per_s.unwrap_or(0.0) / 1e6;
            self.counter(
                storage::EVENT,
                h.t_ns,
                obj([(storage::READ, (r / 1e6).into()), (storage::WRITE, write.into())]),
            )?;
        }
        self.out.flush()
    }

    /// A counter per GPU with what it measured, and a mark when GPU sampling is off.
    fn gpu(&mut self, g: &GpuSample) -> std::io::Result<()> {
        for d in &g.devices {
            let mut args = serde_json::Map::new();
            if let Some(u) = d.util_pct {
                args.insert(gpu::UTIL.into(), u.into());
            }
            if let Some(m) = d.mem_used_bytes {
                args.insert(gpu::MEMORY_GB.into(), (m as f64 / 1e9).into());
            }
            if let Some(r) = d.pcie_rx_bytes_per_s {
                args.insert(gpu::PCIE_TO_GPU.into(), (r / 1e6).into());
            }
            if let Some(t) = d.pcie_tx_bytes_per_s {
                args.insert(gpu::PCIE_FROM_GPU.into(), (t / 1e6).into());
            }
            if !args.is_empty() {
                self.counter(&gpu::counter(d.index), g.t_ns, Value::Object(args))?;
            }
        }
        if let Some(reason) = g.status.off_reason() {
            self.instant(schema::GPU_OFF, g.t_ns, obj([(schema::REASON, reason.into())]))?;
        }
        Ok(())
    }
}

impl<W: Write + Send> Exporter for ChromeTrace<W> {
    fn settings(&mut self, s: &RunSettings) -> std::io::Result<()> {
        let mut args = serde_json::to_value(s).map_err(std::io::Error::other)?;
        if let Some(o) = args.as_object_mut() {
            o.insert(schema::TRACE_VERSION_KEY.into(), TRACE_VERSION.into());
        }
        self.instant(schema::SETTINGS, probes::clock::now_ns(), args)
    }

    fn event(&mut self, ev: &Event) -> std::io::Result<()> {
        match ev {
            Event::Spans(batch) => {
                for s in batch {
                    self.span(s)?;
                }
            }
            Event::Span(s) => self.span(s)?,
            Event::Thread { id, name, role } => self.thread(*id, name, *role)?,
            Event::Step(st) if !st.validation => self.step(st)?,
            Event::Step(_) => {}
            Event::Skipped { path, reason } => {
                let t = self.last_ts;
                self.instant(
                    schema::SKIPPED,
                    t,
                    obj([(schema::PATH, Value::from(&**path)), (schema::REASON, Value::from(&**reason))]),
                )?;
            }
            Event::Host(h) => self.host(h)?,
            Event::Gpu(g) => self.gpu(g)?,
            Event::Stalled { thread, stage, file, open_ns, abandoned } => {
                let t = self.last_ts;
                let args = json!({"thread": thread, "stage": stage.name(), "file": file,
                                  "open_s": *open_ns as f64 / 1e9, "abandoned": abandoned});
                self.instant("stalled", t, args)?;
            }
            Event::Workers { workers, reason, settled } => {
                let t = self.last_ts;
                self.instant("workers", t, json!({"workers": workers, "reason": reason, "settled": settled}))?;
            }
            Event::Settings(v) => {
                let t = self.last_ts;
                self.instant(schema::SETTINGS, t, (**v).clone())?;
            }
            Event::Failed(why) => {
                let t = self.last_ts;
                self.instant("program failed", t, json!({ "error": why }))?;
            }
            Event::Layer(l) => self.layer(l)?,
            Event::Ranked(_, inner) => self.event(inner)?,
            Event::Finish => {}
        }
        Ok(())
    }

    fn verdict(&mut self, t_ns: u64, v: &Verdict) -> std::io::Result<()> {
        let args = serde_json::to_value(v).map_err(std::io::Error::other)?;
        self.instant(&format!("verdict: {}", v.headline), t_ns, args)
    }

    fn summary(&mut self, s: &Diagnosed) -> std::io::Result<()> {
        let mut args = serde_json::to_value(s).map_err(std::io::Error::other)?;
        let t = self.last_ts;
        if let Some(why) = self.failure.get().cloned() {
            self.instant("run failed", t, json!({ "error": why }))?;
            if let Some(o) = args.as_object_mut() {
                o.insert("failed".into(), json!(why));
            }
        }
        self.instant(schema::SUMMARY, t, args)
    }

    fn finish(&mut self) -> std::io::Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()
    }
}

impl<W: Write + Send> Drop for ChromeTrace<W> {
    fn drop(&mut self) {
        // Unwinding (a panic in the collector) still leaves a closed, loadable file.
        let _ = self.finish();
    }
}

/// Whether a stage's spans are per sample (for readers).
pub fn is_sample_stage(name: &str) -> bool {
    Stage::from_name(name).is_some_and(Stage::is_loader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_span(sample: u64) -> Event {
        Event::Span(SpanRecord {
            stage: Stage::Decode,
            thread: 2,
            start_ns: 1_500,
            dur_ns: 2_250,
            cpu_ns: 2_000,
            queue_ns: 100,
            step: 0,
            sample,
            bytes: NONE,
        })
    }

    /// A writer the test keeps a handle to after the trace is gone.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn parse(buf: &Shared) -> Vec<serde_json::Value> {
        let v: serde_json::Value = serde_json::from_slice(&buf.0.lock().unwrap()).unwrap();
        v["traceEvents"].as_array().unwrap().clone()
    }

    #[test]
    fn trace_is_valid_json_with_spans_threads_and_counters() {
        let buf = Shared::default();
        let mut t = ChromeTrace::new(buf.clone(), "pipeprof test", TraceLevel::Sample).unwrap();
        t.settings(&RunSettings { workers: 3, ..Default::default() }).unwrap();
        t.event(&Event::Thread { id: 2, name: "loader-0".into(), role: ThreadRole::loader(0) }).unwrap();
        t.event(&decode_span(9)).unwrap();
        t.event(&Event::Host(Box::new(probes::sampler::HostSample {
            t_ns: 5_000,
            process_cpu_pct: 150.0,
            ..Default::default()
        })))
        .unwrap();
        t.finish().unwrap();
        t.finish().unwrap();
        drop(t);
        let evs = parse(&buf);
        let x = evs.iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!((x["name"].as_str(), x["tid"].as_u64()), (Some("decode"), Some(2)));
        assert_eq!((x["ts"].as_f64(), x["dur"].as_f64()), (Some(1.5), Some(2.25)));
        assert_eq!(x["args"]["sample"], 9);
        assert!(x["args"].get("bytes").is_none());
        assert_eq!((x["args"]["cpu_us"].as_f64(), x["args"]["core_wait_us"].as_f64()), (Some(2.0), Some(0.1)));
        assert_eq!(x["args"]["blocked_us"].as_f64(), Some(0.15), "2.25 µs wall − 2 on-CPU − 0.1 waiting");
        assert!(evs.iter().any(|e| e["name"] == "thread_name" && e["args"]["name"] == "loader-0"));
        let role = evs.iter().find(|e| e["name"] == "thread_name" && e["tid"] == 2).map(|e| e["args"]["role"].clone());
        assert_eq!(role, Some(json!({"loader": {"worker": 0, "generation": 0}})));
        let cpu = evs.iter().find(|e| e["ph"] == "C" && e["name"] == cpu::EVENT).unwrap();
        assert_eq!(cpu["args"]["process"], 150.0);
        let settings = evs.iter().find(|e| e["name"] == "settings").unwrap();
        assert_eq!(
            (settings["args"]["workers"].as_u64(), settings["args"]["trace_version"].as_u64()),
            (Some(3), Some(1))
        );
    }

    #[test]
    fn a_diverged_loss_leaves_counters_numeric_and_reads_back_as_diverged() {
        let buf = Shared::default();
        let mut t = ChromeTrace::new(buf.clone(), "t", TraceLevel::Stage).unwrap();
        let step = |step: u64, loss: f32| {
            Event::Step(probes::StepRecord {
                no_loss: false,
                step,
                epoch: 0,
                images: 4,
                loss,
                correct: 1,
                end_ns: 1_000 * (step + 1),
                queued: 0,
                validation: false,
            })
        };
        for (i, loss) in [1.0, f32::INFINITY, f32::NAN, f32::NAN].into_iter().enumerate() {
            t.event(&step(i as u64, loss)).unwrap();
        }
        t.finish().unwrap();
        drop(t);
        let evs = parse(&buf);
        for c in evs.iter().filter(|e| e["ph"] == "C") {
            let args = c["args"].as_object().unwrap();
            assert!(args.values().all(|v| v.is_number()), "every counter series is a number: {c}");
        }
        let marks: Vec<&str> = evs
            .iter()
            .filter(|e| e["name"] == "loss not finite")
            .map(|e| e["args"]["loss"].as_str().unwrap())
            .collect();
        assert_eq!(marks, ["inf", "NaN", "NaN"]);
        let (s, _) = crate::export::read::summary_from_trace(&evs);
        let d = s.diverged.unwrap();
        assert_eq!((d.first_inf, d.first_nan), (None, Some(1)), "a trace cannot tell inf from NaN: {d:?}");
        assert_eq!(s.steps, 4);
    }

    #[test]
    fn layer_times_go_on_their_own_named_track() {
        let buf = Shared::default();
        let mut t = ChromeTrace::new(buf.clone(), "t", TraceLevel::Stage).unwrap();
        for backward in [false, true] {
            let l = probes::LayerRecord { layer: "dense_1".into(), backward, step: 4, start_ns: 2_000, dur_ns: 3_500 };
            t.event(&Event::Layer(l)).unwrap();
        }
        t.finish().unwrap();
        let evs = parse(&buf);
        let xs: Vec<&serde_json::Value> = evs.iter().filter(|e| e["ph"] == "X").collect();
        let names: Vec<&str> = xs.iter().filter_map(|e| e["name"].as_str()).collect();
        assert_eq!(names, ["dense_1 forward", "dense_1 backward"]);
        assert_eq!(
            (xs[1]["ts"].as_f64(), xs[1]["dur"].as_f64(), xs[1]["args"]["step"].as_u64()),
            (Some(2.0), Some(3.5), Some(4))
        );
        let tid = xs[0]["tid"].clone();
        let named: Vec<_> = evs.iter().filter(|e| e["name"] == "thread_name" && e["tid"] == tid).collect();
        assert_eq!(named.len(), 1, "the track is named once");
        assert_eq!(named[0]["args"]["name"], "train: layers");
    }

    #[test]
    fn stage_level_leaves_out_per_sample_spans() {
        let buf = Shared::default();
        let mut t = ChromeTrace::new(buf.clone(), "t", TraceLevel::Stage).unwrap();
        t.event(&decode_span(1)).unwrap();
        t.finish().unwrap();
        assert!(!parse(&buf).iter().any(|e| e["ph"] == "X"));
    }

    #[test]
    fn dropping_an_unfinished_trace_closes_it() {
        let buf = Shared::default();
        {
            let mut t = ChromeTrace::new(buf.clone(), "t", TraceLevel::Sample).unwrap();
            t.event(&decode_span(1)).unwrap();
        }
        assert_eq!(parse(&buf).iter().filter(|e| e["ph"] == "X").count(), 1);
    }
}
