//! Chrome Trace Event Format, streamed: `{"traceEvents":[ … ]}` with one `X` event per span.
//!
//! Opens in Perfetto (ui.perfetto.dev), chrome://tracing and DevTools. Events are written as
//! they arrive and flushed regularly, so memory stays bounded and a killed run leaves a valid
//! prefix.

use super::Exporter;
use probes::{Event, NONE};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

pub struct ChromeTrace<W: Write + Send> {
    out: W,
    pid: u32,
    first: bool,
    closed: bool,
    since_flush: u32,
}

impl ChromeTrace<BufWriter<File>> {
    /// Creates `path` and writes the header.
    pub fn create(path: &Path, process_name: &str) -> std::io::Result<Self> {
        let f = File::create(path)?;
        ChromeTrace::new(BufWriter::with_capacity(1 << 16, f), process_name)
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl<W: Write + Send> ChromeTrace<W> {
    pub fn new(mut out: W, process_name: &str) -> std::io::Result<Self> {
        let pid = std::process::id();
        out.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n")?;
        let mut t = ChromeTrace { out, pid, first: true, closed: false, since_flush: 0 };
        let meta = serde_json::json!({"ph":"M","name":"process_name","pid":pid,"tid":0,"args":{"name":process_name}});
        t.raw(&meta.to_string())?;
        Ok(t)
    }

    fn raw(&mut self, json: &str) -> std::io::Result<()> {
        if !self.first {
            self.out.write_all(b",\n")?;
        }
        self.first = false;
        self.out.write_all(json.as_bytes())
    }

    /// The underlying writer (for tests).
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write + Send> Exporter for ChromeTrace<W> {
    fn event(&mut self, ev: &Event) -> std::io::Result<()> {
        if let Event::Spans(batch) = ev {
            for s in batch {
                self.event(&Event::Span(*s))?;
            }
            return Ok(());
        }
        let pid = self.pid;
        let line = match ev {
            Event::Span(s) => {
                let mut args = serde_json::Map::new();
                for (k, v) in [("step", s.step), ("sample", s.sample), ("bytes", s.bytes)] {
                    if v != NONE {
                        args.insert(k.into(), v.into());
                    }
                }
                if s.cpu_ns != NONE {
                    args.insert("cpu_us".into(), us(s.cpu_ns).into());
                }
                serde_json::json!({
                    "ph": "X", "name": s.stage.name(), "cat": s.stage.name(),
                    "pid": pid, "tid": s.thread, "ts": us(s.start_ns), "dur": us(s.dur_ns), "args": args
                })
            }
            Event::Thread { id, name } => {
                let sort = if name.starts_with("train") { 0 } else { *id as i64 };
                self.raw(
                    &serde_json::json!({"ph":"M","name":"thread_sort_index","pid":pid,"tid":id,"args":{"sort_index":sort}})
                        .to_string(),
                )?;
                serde_json::json!({"ph":"M","name":"thread_name","pid":pid,"tid":id,"args":{"name":name}})
            }
            Event::Step(st) if !st.validation => serde_json::json!({
                "ph": "C", "name": "training", "pid": pid, "tid": 0, "ts": us(st.end_ns),
                "args": {"loss": st.loss, "batches_ready": st.queued}
            }),
            Event::Skipped { path, reason } => serde_json::json!({
                "ph": "i", "s": "g", "name": "skipped file", "pid": pid, "tid": 0,
                "ts": us(probes::clock::now_ns()), "args": {"path": path, "reason": reason}
            }),
            Event::Step(_) | Event::Host(_) | Event::Gpu(_) | Event::Finish | Event::Spans(_) => return Ok(()),
        };
        self.raw(&line.to_string())?;
        self.since_flush += 1;
        if self.since_flush >= 512 {
            self.since_flush = 0;
            self.out.flush()?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use probes::{SpanRecord, Stage};

    #[test]
    fn trace_is_valid_json_with_spans_threads_and_counters() {
        let mut t = ChromeTrace::new(Vec::new(), "pipeprof test").unwrap();
        t.event(&Event::Thread { id: 2, name: "loader-0".into() }).unwrap();
        t.event(&Event::Span(SpanRecord {
            stage: Stage::Decode,
            thread: 2,
            start_ns: 1_500,
            dur_ns: 2_250,
            cpu_ns: 2_000,
            step: 0,
            sample: 9,
            bytes: NONE,
        }))
        .unwrap();
        t.finish().unwrap();
        t.finish().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&t.into_inner()).unwrap();
        let evs = v["traceEvents"].as_array().unwrap();
        let x = evs.iter().find(|e| e["ph"] == "X").unwrap();
        assert_eq!((x["name"].as_str(), x["tid"].as_u64()), (Some("decode"), Some(2)));
        assert_eq!((x["ts"].as_f64(), x["dur"].as_f64()), (Some(1.5), Some(2.25)));
        assert_eq!(x["args"]["sample"], 9);
        assert!(x["args"].get("bytes").is_none());
        assert!(evs.iter().any(|e| e["name"] == "thread_name" && e["args"]["name"] == "loader-0"));
    }
}
