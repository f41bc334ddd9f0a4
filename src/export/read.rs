//! Reading runs back: a trace written by pipeprof (complete, or cut short by `kill -9`), or a
//! summary JSON.

use super::schema::{self, cpu, gpu, rss, span, step};
use pipeprof_core::aggregate::{Aggregator, RunSettings, Summary};
use probes::sampler::{GpuDevice, GpuSample, GpuStatus, HostSample};
use probes::{Event, SpanRecord, Stage, StepRecord, NONE};
use serde_json::Value;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} is neither a pipeprof trace nor a summary JSON: {why}")]
    Format { path: String, why: String },
    #[error("{path}: {why}: the file is damaged or not written by pipeprof (re-run `pipeprof profile --summary`)")]
    OutOfRange { path: String, why: String },
    #[error(
        "{path} is a summary of schema version {found}; this pipeprof reads versions {oldest} to {expected}: \
         re-run the profile with this version, or read it with the pipeprof that wrote it"
    )]
    Schema { path: String, found: u64, oldest: u32, expected: u32 },
}

pub use pipeprof_core::aggregate::settings::MAX_CORES;

/// The settings of a run read from a file or a socket, in the ranges `profile` accepts: a
/// damaged or hostile file is refused, not trusted to size loops and tables.
pub fn check_settings(s: &RunSettings) -> Result<(), String> {
    s.check_ranges()
}

/// A summary read back: its settings and machine in range.
fn check_summary(s: &Summary) -> Result<(), String> {
    check_settings(&s.settings)?;
    pipeprof_core::limits::in_range("ranks (lines)", s.ranks.len(), 0, pipeprof_core::aggregate::ranks::MAX_RANKS)?;
    pipeprof_core::limits::in_range("machine.cores", s.machine.cores, 0, MAX_CORES)
}

/// A run read back from disk.
#[derive(Debug)]
pub struct Loaded {
    /// The run's statistics: recomputed from the trace's events, or the summary as written.
    pub summary: Summary,
    /// Trace events read (0 for a summary file).
    pub events: usize,
    /// False for a trace whose closing `]}` is missing (the run was killed).
    pub complete: bool,
    /// Whether the per-sample loader spans were capped in the trace.
    pub capped: bool,
}

fn ns(v: &Value) -> u64 {
    (v.as_f64().unwrap_or(0.0) * 1000.0).round().max(0.0) as u64
}

fn num(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(NONE)
}

/// Parses trace text; a trace cut short is read up to its last complete event line.
/// Returns the events and whether the text was complete.
fn parse_trace_text(text: &str) -> (Vec<Value>, bool) {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        let arr = match v {
            Value::Array(a) => a,
            Value::Object(mut o) => match o.remove("traceEvents") {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        return (arr, true);
    }
    // pipeprof writes one event per line: keep every line that is a whole JSON object.
    let events = text
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<Value>(l.trim().trim_end_matches(',')).ok())
        .filter(Value::is_object)
        .collect();
    (events, false)
}

/// Closes a trace cut short: keeps its complete event lines and appends the closing `]}`.
/// Returns the repaired text and the number of events kept.
pub fn repair_text(text: &str) -> Option<(String, usize)> {
    let mut lines = text.lines();
    let header = lines.next()?;
    if !header.trim_start().starts_with('{') || !header.contains("traceEvents") {
        return None;
    }
    let kept: Vec<&str> = lines
        .map(|l| l.trim().trim_end_matches(','))
        .filter(|l| serde_json::from_str::<Value>(l).map(|v| v.is_object()).unwrap_or(false))
        .collect();
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(header.trim_end());
    out.push('\n');
    out.push_str(&kept.join(",\n"));
    out.push_str("\n]}\n");
    Some((out, kept.len()))
}

/// Rebuilds the run's statistics from trace events.
pub fn summary_from_trace(events: &[Value]) -> (Summary, bool) {
    let mut r = TraceSummary::new();
    for e in events {
        r.push(e);
    }
    r.finish()
}

/// Host samples held back to pair the counters of one timestamp (the CPU and memory counters
/// come one after the other): bounded, so a day-long trace does not keep every sample.
const HOST_WINDOW: usize = 64;

/// The run's statistics rebuilt one trace event at a time: what it keeps is bounded whatever
/// the trace's length (the aggregate's own state, a few held-back host samples, the last
/// summary the run wrote).
pub struct TraceSummary {
    agg: Aggregator,
    settings_seen: bool,
    written: Option<Summary>,
    host: std::collections::BTreeMap<u64, HostSample>,
    capped: bool,
}

impl Default for TraceSummary {
    fn default() -> Self {
        Self::new()
    }
}

impl TraceSummary {
    pub fn new() -> TraceSummary {
        TraceSummary {
            agg: Aggregator::new(RunSettings::default()),
            settings_seen: false,
            written: None,
            host: Default::default(),
            capped: false,
        }
    }

    /// One trace event, in file order.
    pub fn push(&mut self, e: &Value) {
        if e["ph"] == "i" {
            // The run's settings: pipeprof's own first (before any span), then what the program
            // said (`pipeprof run`, `attach`: its batch size, workers, framework), key by key
            // and range-checked, as the live run merged them.
            if e["name"] == schema::SETTINGS {
                if !self.settings_seen {
                    *self.agg.settings_mut() = RunSettings::default();
                    self.settings_seen = true;
                }
                self.agg.settings_mut().merge_json(&e["args"]);
            }
            // The summary written at the end of the run: the last one counts.
            if e["name"] == schema::SUMMARY {
                if let Ok(s) = serde_json::from_value(e["args"].clone()) {
                    self.written = Some(s);
                }
            }
        }
        self.capped |= push_trace_event(&mut self.agg, &mut self.host, e);
        while self.host.len() > HOST_WINDOW {
            if let Some((_, h)) = self.host.pop_first() {
                self.agg.push(&Event::Host(Box::new(h)));
            }
        }
    }

    /// The summary, and whether the per-sample loader spans were capped in the trace.
    pub fn finish(mut self) -> (Summary, bool) {
        for h in std::mem::take(&mut self.host).into_values() {
            self.agg.push(&Event::Host(Box::new(h)));
        }
        let capped = self.capped;
        let mut s = self.agg.summary();
        if let Some(w) = self.written {
            // What a trace cannot carry, the summary written at the end of the run has (its
            // settings too: every key the run merged, checked as it merged them).
            if w.settings.check_ranges().is_ok() {
                s.settings = w.settings;
            }
            s.events_received = w.events_received;
            s.events_dropped = w.events_dropped;
            s.machine = w.machine;
            s.data_fs = w.data_fs;
            s.skipped_count = w.skipped_count;
            s.skipped = w.skipped;
            s.rank = w.rank;
            s.ranks = w.ranks;
            // The run's own timeline has every sample (a trace's GPU counters may be thinned).
            if !w.timeline.is_empty() {
                s.timeline = w.timeline;
            }
            if capped {
                s.stages = w.stages;
                s.loader_busy = w.loader_busy;
            }
        } else {
            s.events_received = 0;
        }
        (s, capped)
    }
}

/// Reads a trace as pipeprof writes it, a header line then one event per line, as a
/// stream: memory stays flat in the trace's length. `None` when the text is not laid out
/// that way (a trace from another tool, a summary JSON): read it whole instead.
/// Returns the summary, the events read, whether the trace was closed, and whether capped.
fn stream_trace(mut r: impl std::io::BufRead) -> std::io::Result<Option<(Summary, usize, bool, bool)>> {
    // Lines as bytes: a trace cut inside a multi-byte character is still read (the cut line
    // does not parse and is left out, like any cut line).
    let mut buf = Vec::new();
    let mut lines = std::iter::from_fn(move || match next_line(&mut r, &mut buf, MAX_LINE) {
        Ok(true) => Some(Ok(String::from_utf8_lossy(&buf).into_owned())),
        Ok(false) => None,
        Err(e) => Some(Err(e)),
    });
    let Some(header) = lines.next().transpose()? else { return Ok(None) };
    let header = header.trim();
    if !(header.starts_with('{') && header.contains("\"traceEvents\"") && header.ends_with('[')) {
        return Ok(None);
    }
    // A rank's trace names its rank in the header: kept for a trace cut before its summary.
    let rank = serde_json::from_str::<Value>(&format!("{header}]}}"))
        .ok()
        .and_then(|v| serde_json::from_value::<probes::Rank>(v.get("distributedInfo")?.clone()).ok());
    let mut t = TraceSummary::new();
    let (mut events, mut complete) = (0usize, false);
    for line in lines {
        let line = line?;
        let l = line.trim().trim_end_matches(',');
        if l.starts_with(']') {
            complete = true;
            continue;
        }
        // A line cut by a kill, or not an event: left out, as the whole-file reader does.
        if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(l) {
            t.push(&v);
            events += 1;
        }
    }
    let (mut s, capped) = t.finish();
    s.rank = s.rank.or(rank);
    Ok(Some((s, events, complete, capped)))
}

/// Longest trace line read: pipeprof writes one event a line, well under a kilobyte (its
/// settings line kilobytes; the closing summary line, which the reader does not use, at most
/// a few MB). A longer line (a crafted file) is read past, never held, and left out as a cut
/// line is: one line of 300 MB took 885 MB to report.
pub const MAX_LINE: usize = 16 << 20;
/// Largest file read whole (a summary JSON, a trace of another layout): pipeprof's summaries
/// are well under a megabyte.
pub const MAX_WHOLE: u64 = 64 << 20;

/// The next line of `r` (without its `\n`) into `buf`: false at the end. A line longer than
/// `max` bytes comes back empty, its bytes consumed but never kept.
fn next_line(r: &mut impl std::io::BufRead, buf: &mut Vec<u8>, max: usize) -> std::io::Result<bool> {
    buf.clear();
    let (mut any, mut over) = (false, false);
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(any);
        }
        any = true;
        let end = memchr::memchr(b'\n', chunk);
        let take = end.unwrap_or(chunk.len());
        over |= buf.len() + take > max;
        if over {
            buf.clear();
        } else {
            buf.extend_from_slice(&chunk[..take]);
        }
        r.consume(take + usize::from(end.is_some()));
        if end.is_some() {
            return Ok(true);
        }
    }
}

/// Feeds one trace event to the aggregate (host counters are gathered in `host`, one sample
/// per timestamp); true when the event says the trace was capped.
fn push_trace_event(agg: &mut Aggregator, host: &mut std::collections::BTreeMap<u64, HostSample>, e: &Value) -> bool {
    let ph = e["ph"].as_str().unwrap_or("");
    let name = e["name"].as_str().unwrap_or("");
    match (ph, name) {
        ("X", _) => {
            let Some(stage) = Stage::from_name(name) else { return false };
            agg.push(&Event::Span(span_record(stage, e)));
        }
        ("M", schema::THREAD_NAME) => {
            let id = e["tid"].as_u64().unwrap_or(0) as u32;
            if id != 0 {
                let n = e["args"][schema::NAME].as_str().unwrap_or("").into();
                // Written only for a thread that had one; a trace from before roles has none.
                let role = serde_json::from_value(e["args"][schema::ROLE].clone()).unwrap_or_default();
                agg.push(&Event::Thread { id, name: n, role });
            }
        }
        ("C", step::EVENT) => agg.push(&Event::Step(step_record(e))),
        ("C", cpu::EVENT) | ("C", rss::EVENT) => host_counter(host, name, e),
        ("C", n) if gpu::index_of(n).is_some() => agg.push(&Event::Gpu(Box::new(gpu_sample(n, e)))),
        ("i", schema::GPU_OFF) => {
            let reason = e["args"][schema::REASON].as_str().unwrap_or("off").to_string();
            agg.push(&Event::Gpu(Box::new(GpuSample::off(ns(&e["ts"]), reason))));
        }
        ("i", schema::SKIPPED) => agg.push(&Event::Skipped {
            path: e["args"][schema::PATH].as_str().unwrap_or("?").into(),
            reason: e["args"][schema::REASON].as_str().unwrap_or("?").into(),
        }),
        ("i", schema::CAPPED) => return true,
        _ => {}
    }
    false
}

/// A stage span from its `X` event.
fn span_record(stage: Stage, e: &Value) -> SpanRecord {
    let a = &e["args"];
    SpanRecord {
        stage,
        thread: e["tid"].as_u64().unwrap_or(0) as u32,
        start_ns: ns(&e["ts"]),
        dur_ns: ns(&e["dur"]),
        cpu_ns: a.get(span::CPU_US).map(ns).unwrap_or(NONE),
        queue_ns: a.get(span::CORE_WAIT_US).map(ns).unwrap_or(NONE),
        step: num(a, span::STEP),
        sample: num(a, span::SAMPLE),
        bytes: num(a, span::BYTES),
    }
}

/// A training step from its `step` counter.
fn step_record(e: &Value) -> StepRecord {
    let a = &e["args"];
    StepRecord {
        no_loss: false,
        step: num(a, step::STEP),
        epoch: a[step::EPOCH].as_u64().unwrap_or(0) as u32,
        images: a[step::IMAGES].as_u64().unwrap_or(0) as u32,
        // A trace leaves a NaN or inf loss out of its counter.
        loss: a[step::LOSS].as_f64().map_or(f32::NAN, |l| l as f32),
        correct: a[step::CORRECT].as_u64().unwrap_or(0) as u32,
        end_ns: ns(&e["ts"]),
        queued: a[step::BATCHES_READY].as_u64().unwrap_or(0) as u32,
        validation: false,
    }
}

/// A `CPU %` or `RSS MB` counter into the host sample of its timestamp.
fn host_counter(host: &mut std::collections::BTreeMap<u64, HostSample>, name: &str, e: &Value) {
    let t = ns(&e["ts"]);
    let h = host.entry(t).or_insert_with(|| HostSample { t_ns: t, ..Default::default() });
    let a = &e["args"];
    if name == cpu::EVENT {
        h.process_cpu_pct = a[cpu::PROCESS].as_f64().unwrap_or(0.0) as f32;
        h.global_cpu_pct = a[cpu::MACHINE].as_f64().unwrap_or(0.0) as f32;
    } else {
        h.rss_bytes = (a[rss::RSS].as_f64().unwrap_or(0.0) * 1e6) as u64;
    }
}

/// One GPU's sample from its `GPU N` counter.
fn gpu_sample(counter: &str, e: &Value) -> GpuSample {
    let a = &e["args"];
    let index = gpu::index_of(counter).unwrap_or(0);
    GpuSample {
        t_ns: ns(&e["ts"]),
        status: GpuStatus::Ok,
        devices: vec![GpuDevice {
            index,
            name: format!("GPU {index}"),
            util_pct: a[gpu::UTIL].as_f64().map(|v| v as f32),
            mem_used_bytes: a[gpu::MEMORY_GB].as_f64().map(|v| (v * 1e9) as u64),
            ..Default::default()
        }],
    }
}

/// Loads a trace or a summary JSON. A trace as pipeprof writes it is read as a stream.
pub fn load(path: &Path) -> Result<Loaded, ReadError> {
    let p = path.display().to_string();
    let io = |source| ReadError::Io { path: p.clone(), source };
    let file = std::fs::File::open(path).map_err(io)?;
    if let Some((summary, events, complete, capped)) = stream_trace(std::io::BufReader::new(file)).map_err(io)? {
        if events == 0 {
            return Err(ReadError::Format { path: p, why: "no trace events found".into() });
        }
        check_summary(&summary).map_err(|why| ReadError::OutOfRange { path: p.clone(), why })?;
        return Ok(Loaded { summary: cleaned(summary), events, complete, capped });
    }
    let size = std::fs::metadata(path).map_err(io)?.len();
    if size > MAX_WHOLE {
        let why = format!("{} MB, larger than any summary pipeprof writes, and not one event a line", size >> 20);
        return Err(ReadError::Format { path: p, why });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        if let (Some(version), Some(_)) = (v.get("schema_version"), v.get("stages")) {
            use pipeprof_core::aggregate::{SUMMARY_SCHEMA_OLDEST, SUMMARY_SCHEMA_VERSION};
            let expected = SUMMARY_SCHEMA_VERSION;
            // Fields of another schema would read as defaults without a word: refuse instead
            // (the versions from the oldest read only added fields).
            let known = u64::from(SUMMARY_SCHEMA_OLDEST)..=u64::from(expected);
            if !version.as_u64().is_some_and(|v| known.contains(&v)) {
                let found = version.as_u64().unwrap_or(u64::MAX);
                return Err(ReadError::Schema { path: p, found, oldest: SUMMARY_SCHEMA_OLDEST, expected });
            }
            let summary: Summary =
                serde_json::from_value(v).map_err(|e| ReadError::Format { path: p.clone(), why: e.to_string() })?;
            check_summary(&summary).map_err(|why| ReadError::OutOfRange { path: p.clone(), why })?;
            return Ok(Loaded { summary: cleaned(summary), events: 0, complete: true, capped: false });
        }
    }
    let (events, complete) = parse_trace_text(&text);
    if events.is_empty() {
        return Err(ReadError::Format { path: p, why: "no trace events found".into() });
    }
    let (summary, capped) = summary_from_trace(&events);
    check_summary(&summary).map_err(|why| ReadError::OutOfRange { path: p, why })?;
    Ok(Loaded { summary: cleaned(summary), events: events.len(), complete, capped })
}

/// A summary read from a file, its names capped and free of control characters, its lists
/// bounded.
fn cleaned(mut s: Summary) -> Summary {
    s.clean_names();
    s.bound_lists();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_cut_mid_line_is_read_and_repaired_up_to_its_last_whole_event() {
        let text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"x\"},\n{\"ph\":\"X\",\"name\":\"read\",\"ts\":1,\"dur\":2},\n{\"ph\":\"X\",\"na";
        let (evs, complete) = parse_trace_text(text);
        assert_eq!((evs.len(), complete), (2, false));
        let (fixed, kept) = repair_text(text).unwrap();
        assert_eq!(kept, 2);
        let v: Value = serde_json::from_str(&fixed).unwrap();
        assert_eq!(v["traceEvents"].as_array().unwrap().len(), 2);
        assert!(repair_text("not a trace").is_none());
    }

    #[test]
    fn a_trace_cut_inside_a_character_is_read_and_repaired() {
        let whole = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{\"ph\":\"M\",\"name\":\"x\"},\n{\"ph\":\"M\",\"name\":\"thread_name\",\"tid\":2,\"args\":{\"name\":\"lecteur-é\"}},\n]}\n";
        let bytes = whole.as_bytes();
        // Every cut, including the one between the two bytes of "é" (before: an I/O error,
        // "stream did not contain valid UTF-8", and no report or repair).
        let e_at = whole.find('é').unwrap();
        for cut in [e_at + 1, bytes.len() - 5] {
            let (s, events, complete, _) = stream_trace(&bytes[..cut]).unwrap().unwrap();
            assert!(!complete && events >= 1, "cut at {cut}: {events}");
            assert_eq!(s.threads.contains_key(&2), cut > e_at + 1, "cut at {cut}");
            let (fixed, _) = repair_text(&String::from_utf8_lossy(&bytes[..cut])).unwrap();
            assert!(serde_json::from_str::<Value>(&fixed).is_ok(), "cut at {cut}: {fixed}");
        }
    }

    #[test]
    fn a_run_trace_keeps_the_settings_its_program_said_after_pipeprofs_own() {
        let lines = [
            // pipeprof run's own: the program's name and the machine's cores.
            r#"{"ph":"i","name":"settings","ts":0,"args":{"model":"train.py","cores":16,"trace_version":1}}"#,
            // Then the program's, as the run merged them (before: only the first was read).
            r#"{"ph":"i","name":"settings","ts":5,"args":{"framework":"pytorch","batch_size":64,"workers":4}}"#,
        ];
        let text = format!("{{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{}\n]}}\n", lines.join(",\n"));
        let (s, ..) = stream_trace(text.as_bytes()).unwrap().unwrap();
        let st = &s.settings;
        assert_eq!(
            (&*st.model.name(), st.cores, st.framework.name(), st.batch_size, st.workers),
            ("train.py", 16, "pytorch", 64, 4)
        );
    }

    #[test]
    fn a_line_past_the_limit_is_read_past_never_held() {
        let text = format!("short\n{}\nlast", "x".repeat(1000));
        let mut r = std::io::BufReader::with_capacity(64, text.as_bytes());
        let mut buf = Vec::new();
        let mut got = Vec::new();
        while next_line(&mut r, &mut buf, 100).unwrap() {
            got.push((String::from_utf8_lossy(&buf).into_owned(), buf.capacity()));
        }
        let lines: Vec<&str> = got.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(lines, ["short", "", "last"]);
        assert!(got.iter().all(|(_, cap)| *cap <= 200), "the long line was held: {:?}", got[1].1);
    }

    #[test]
    fn a_trace_with_an_overlong_line_or_300k_thread_names_reports_in_bounded_memory() {
        let n = pipeprof_core::aggregate::MAX_THREAD_NAMES + 5000;
        let mut text = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        text.push_str(&format!(
            "{{\"ph\":\"i\",\"name\":\"skipped file\",\"ts\":1,\"args\":{{\"path\":\"{}\"}}}},\n",
            "p".repeat(MAX_LINE)
        ));
        for id in 1..=n {
            text.push_str(&format!(
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"tid\":{id},\"args\":{{\"name\":\"t{id}\"}}}},\n"
            ));
        }
        text.push_str("]}\n");
        let (s, events, complete, _) = stream_trace(text.as_bytes()).unwrap().unwrap();
        // The overlong line is left out as a cut line is; every thread event is read, and
        // the names kept are bounded.
        assert_eq!((events, complete), (n, true));
        assert_eq!(s.skipped_count, 0);
        assert_eq!(s.threads.len(), pipeprof_core::aggregate::MAX_THREAD_NAMES);
    }

    #[test]
    fn a_summary_of_200k_epochs_reports_the_first_and_last_50_and_sums_the_rest() {
        use pipeprof_core::aggregate::{EpochSummary, EPOCHS_KEPT};
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("s.json");
        let mut v = serde_json::to_value(pipeprof_core::diagnose::Diagnosed::default()).unwrap();
        v["schema_version"] = pipeprof_core::aggregate::SUMMARY_SCHEMA_VERSION.into();
        let epochs: Vec<EpochSummary> = (1..=200_000)
            .map(|e| EpochSummary { epoch: e, steps: 1, images: 2, loss: 1.0, accuracy: 0.5, ..Default::default() })
            .collect();
        v["epochs"] = serde_json::to_value(&epochs).unwrap();
        std::fs::write(&path, v.to_string()).unwrap();
        let s = load(&path).unwrap().summary;
        assert_eq!(s.epochs.len(), 2 * EPOCHS_KEPT + 1);
        let mid = &s.epochs[EPOCHS_KEPT];
        assert_eq!((mid.epoch, mid.through), (EPOCHS_KEPT as u32 + 1, Some(200_000 - EPOCHS_KEPT as u32)));
        assert_eq!(s.epochs.iter().map(|e| e.steps).sum::<u64>(), 200_000);
        assert!((mid.loss - 1.0).abs() < 1e-9 && (mid.accuracy - 0.5).abs() < 1e-9, "{mid:?}");
    }

    #[test]
    fn summaries_of_another_schema_or_with_numbers_out_of_range_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("s.json");
        let mut good = serde_json::to_value(pipeprof_core::diagnose::Diagnosed::default()).unwrap();
        good["schema_version"] = pipeprof_core::aggregate::SUMMARY_SCHEMA_VERSION.into();
        let write = |edit: &dyn Fn(&mut Value)| {
            let mut v = good.clone();
            edit(&mut v);
            std::fs::write(&path, v.to_string()).unwrap();
            load(&path).map(|_| ()).map_err(|e| e.to_string())
        };
        assert!(write(&|_| {}).is_ok());
        let e = write(&|v| v["schema_version"] = 99.into()).unwrap_err();
        assert!(e.contains("schema version 99") && e.contains("reads versions 1 to 2"), "{e}");
        // Version 1 (before the node) still reads: version 2 only added fields.
        assert!(write(&|v| v["schema_version"] = 1.into()).is_ok());
        let e = write(&|v| v["settings"]["cores"] = u64::MAX.into()).unwrap_err();
        assert!(e.contains("settings.cores must be between 0 and 65536"), "{e}");
        let e = write(&|v| v["machine"]["cores"] = (1u64 << 40).into()).unwrap_err();
        assert!(e.contains("machine.cores"), "{e}");
        // A distributed run's ranks: bounded like the run that writes them.
        let lines = |n: usize| Value::Array(vec![serde_json::json!({"rank": 0, "world_size": 1}); n]);
        assert!(write(&|v| v["ranks"] = lines(2)).is_ok());
        let e = write(&|v| v["ranks"] = lines(pipeprof_core::aggregate::ranks::MAX_RANKS + 1)).unwrap_err();
        assert!(e.contains("ranks (lines)"), "{e}");
        // The same numbers in a trace's settings event.
        let trace = format!(
            "{{\"traceEvents\":[\n{}\n]}}",
            r#"{"ph":"i","name":"settings","ts":0,"args":{"workers":4294967296,"batch_size":4}}"#
        );
        std::fs::write(&path, trace).unwrap();
        // Refused key by key, like a value that does not read: listed, the others kept.
        let l = load(&path).unwrap();
        assert_eq!((l.summary.settings.workers, l.summary.settings.batch_size), (0, 4));
        assert!(
            l.summary.settings.unreadable.iter().any(|u| u.contains("settings.workers")),
            "{:?}",
            l.summary.settings
        );
    }

    /// A span of `stage` on thread `tid` from `start_us`, `dur_us` long, with its CPU time.
    fn span(stage: Stage, tid: u32, start_us: u64, dur_us: u64, cpu_us: Option<u64>, step: u64, sample: u64) -> Event {
        Event::Span(SpanRecord {
            stage,
            thread: tid,
            start_ns: start_us * 1000,
            dur_ns: dur_us * 1000,
            cpu_ns: cpu_us.map_or(NONE, |c| c * 1000),
            queue_ns: NONE,
            step,
            sample,
            bytes: NONE,
        })
    }

    /// A step of `images` ending at `end_us`.
    fn step_at(step: u64, end_us: u64, images: u32, loss: f32) -> Event {
        Event::Step(StepRecord {
            no_loss: false,
            step,
            epoch: 0,
            images,
            loss,
            correct: 2,
            end_ns: end_us * 1000,
            queued: 1,
            validation: false,
        })
    }

    /// The trace pipeprof writes of `events` (settings: 2 workers, batches of 4), closed, and
    /// its events.
    fn written(events: &[Event]) -> (String, Vec<Value>) {
        use super::super::chrome::{ChromeTrace, TraceLevel};
        use super::super::Exporter;
        let mut buf = Vec::new();
        let mut t = ChromeTrace::new(&mut buf, "t", TraceLevel::Sample).unwrap();
        t.settings(&RunSettings { workers: 2, batch_size: 4, ..Default::default() }).unwrap();
        for e in events {
            t.event(e).unwrap();
        }
        t.finish().unwrap();
        drop(t);
        let text = String::from_utf8(buf).unwrap();
        let events = parse_trace_text(&text).0;
        (text, events)
    }

    /// A run's events of each kind the reader reads back.
    fn one_step() -> Vec<Event> {
        vec![
            span(Stage::Decode, 2, 10, 1000, Some(900), 0, 1),
            span(Stage::Wait, 1, 0, 900, None, 0, NONE),
            Event::Host(Box::new(HostSample {
                t_ns: 500_000,
                process_cpu_pct: 50.0,
                global_cpu_pct: 60.0,
                rss_bytes: 12_000_000,
                ..Default::default()
            })),
            step_at(0, 1000, 4, 1.5),
        ]
    }

    #[test]
    fn every_kind_of_event_written_reads_back_as_it_was() {
        let gpu =
            GpuDevice { index: 1, util_pct: Some(40.0), mem_used_bytes: Some(2_000_000_000), ..Default::default() };
        let mut events = vec![Event::Thread { id: 2, name: "loader-0".into(), role: probes::ThreadRole::loader(0) }];
        events.extend(one_step());
        events.push(Event::Gpu(Box::new(GpuSample { t_ns: 600_000, status: GpuStatus::Ok, devices: vec![gpu] })));
        events.push(Event::Gpu(Box::new(GpuSample::off(700_000, "no driver"))));
        events.push(Event::Skipped { path: "a/b.png".into(), reason: "not an image".into() });
        let (_, trace) = written(&events);
        let (s, capped) = summary_from_trace(&trace);
        assert!(!capped);
        // Settings, spans (their CPU share), the step's counters.
        assert_eq!((s.settings.workers, s.settings.batch_size, s.steps, s.images), (2, 4, 1, 4));
        let d = s.stages.iter().find(|x| x.stage == Stage::Decode).unwrap();
        assert!((d.mean_ms - 1.0).abs() < 1e-9 && (d.on_cpu.unwrap() - 0.9).abs() < 1e-9, "{d:?}");
        assert!((s.epochs[0].loss - 1.5).abs() < 1e-6);
        // The thread and its role; the host's counters; the GPU's and its notice; the file.
        assert_eq!(s.threads.get(&2).map(String::as_str), Some("loader-0"));
        let named = trace.iter().find(|e| e["name"] == schema::THREAD_NAME && e["tid"] == 2).unwrap();
        let role: probes::ThreadRole = serde_json::from_value(named["args"][schema::ROLE].clone()).unwrap();
        assert_eq!(role, probes::ThreadRole::loader(0));
        assert_eq!(s.machine.process_cpu_mean_pct, Some(50.0));
        assert_eq!(s.machine.global_cpu_mean_pct, Some(60.0));
        assert_eq!(s.machine.rss_peak_bytes, Some(12_000_000));
        let g = s.machine.devices.iter().find(|d| d.index == 1).expect("GPU 1");
        assert_eq!((g.util_mean_pct, g.mem_used_peak_bytes), (Some(40.0), Some(2_000_000_000)), "{g:?}");
        assert_eq!(s.machine.gpu_samples, 2);
        assert_eq!((s.skipped.len(), s.skipped[0].reason.as_str()), (1, "not an image"));
    }

    #[test]
    fn a_trace_read_as_a_stream_gives_what_the_whole_file_gives() {
        let (closed, _) = written(&one_step());
        let (whole, _) = summary_from_trace(&parse_trace_text(&closed).0);
        let (streamed, events, complete, capped) = stream_trace(closed.as_bytes()).unwrap().unwrap();
        let lines = closed.lines().filter(|l| l.starts_with('{') && l.contains("\"ph\"")).count();
        assert_eq!((events, complete, capped), (lines, true, false));
        assert_eq!(streamed, whole);
        assert_eq!((streamed.settings.workers, streamed.steps), (2, 1));
        // Cut by a kill mid-line (in the step's counter, the last): the whole lines count, and
        // it says it was not closed.
        let at = closed.rfind("\"name\":\"images/s\"").unwrap();
        let cut = &closed[..closed[..at].rfind(step::BATCHES_READY).unwrap()];
        let (s, events, complete, _) = stream_trace(cut.as_bytes()).unwrap().unwrap();
        assert_eq!((events, complete, s.steps), (lines - 2, false, 0));
        // Another layout (one line, a bare array, a summary): read whole instead.
        assert!(stream_trace(r#"{"traceEvents":[{"ph":"X"}]}"#.as_bytes()).unwrap().is_none());
        assert!(stream_trace("[\n{}\n]".as_bytes()).unwrap().is_none());
    }

    #[test]
    fn spans_and_steps_are_recomputed_from_trace_events() {
        let mut events = one_step();
        events.push(span(Stage::Wait, 1, 1000, 300, None, 1, NONE));
        events.push(span(Stage::Compute, 1, 1300, 700, None, 1, NONE));
        let (s, capped) = summary_from_trace(&written(&events).1);
        assert!(!capped);
        assert_eq!(s.settings.workers, 2);
        assert_eq!((s.steps, s.images), (1, 4));
        let d = s.stages.iter().find(|x| x.stage == Stage::Decode).unwrap();
        assert!((d.mean_ms - 1.0).abs() < 1e-9 && (d.on_cpu.unwrap() - 0.9).abs() < 1e-9);
        assert!((s.split.wait_share - 0.3).abs() < 1e-9);
        assert!((s.epochs[0].loss - 1.5).abs() < 1e-6);
    }
}
