//! Closing a streamed trace from another thread, at once: for the exit on a second interrupt.
//!
//! The trace's writer belongs to the collector thread, which may be busy or stuck; the abort
//! must not wait on it or on any lock it could hold. So the file is written through a
//! [`GuardedFile`] that refuses every write once the guard is raised, and the guard closes
//! the file through its own handle: it cuts the file after its last complete event line and
//! appends the closing bytes. What the collector had buffered but not yet written is lost
//! (at most one buffer); everything on disk stays loadable.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the abort waits for a write already in progress to return.
const WRITE_WAIT: Duration = Duration::from_millis(200);

#[derive(Debug, Default)]
struct Flags {
    /// Set by the abort: no write may start after it.
    aborting: AtomicBool,
    /// Writes in progress.
    writing: AtomicUsize,
}

/// A trace file whose writes stop when its [`TraceGuard`] closes it.
#[derive(Debug)]
pub struct GuardedFile {
    file: File,
    flags: Arc<Flags>,
}

/// The other end of a [`GuardedFile`]: closes its file at once, from any thread.
#[derive(Debug, Clone)]
pub struct TraceGuard {
    path: PathBuf,
    flags: Arc<Flags>,
}

/// Creates `path` for writing, with the guard that can close it.
pub fn create(path: &Path) -> std::io::Result<(GuardedFile, TraceGuard)> {
    let file = File::create(path)?;
    let flags = Arc::new(Flags::default());
    Ok((GuardedFile { file, flags: flags.clone() }, TraceGuard { path: path.to_path_buf(), flags }))
}

impl Write for GuardedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Announce the write, then look at the flag: the abort raises the flag, then waits for
        // announced writes, so no write can slip in after it has cut the file (SeqCst on both).
        self.flags.writing.fetch_add(1, Ordering::SeqCst);
        let r = if self.flags.aborting.load(Ordering::SeqCst) {
            Err(std::io::Error::other("the trace was closed by an immediate exit"))
        } else {
            self.file.write(buf)
        };
        self.flags.writing.fetch_sub(1, Ordering::SeqCst);
        r
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl TraceGuard {
    /// Stops every further write and leaves the file a complete trace: cut after its last
    /// whole event, closing bytes appended. Bounded: waits at most [`WRITE_WAIT`] for a write
    /// in progress, reads the file's tail only as far back as its last line break.
    pub fn close_now(&self) -> std::io::Result<()> {
        self.flags.aborting.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + WRITE_WAIT;
        while self.flags.writing.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let f = OpenOptions::new().read(true).write(true).open(&self.path)?;
        close_file(&f)
    }
}

/// Cuts `f` after its last line break (event lines hold no raw line break: JSON escapes
/// them) and appends `]}`; a trace that already ends closed is left alone.
fn close_file(f: &File) -> std::io::Result<()> {
    let len = f.metadata()?.len();
    let mut tail = [0u8; 8];
    let n = (len as usize).min(tail.len());
    f.read_exact_at(&mut tail[..n], len - n as u64)?;
    if tail[..n].ends_with(b"]}\n") {
        return Ok(());
    }
    let Some(cut) = last_newline(f, len)? else {
        return Err(std::io::Error::other("the trace has no complete header line"));
    };
    // The byte before the line break is the separator after the last whole event.
    let mut before = [0u8; 1];
    let keep = if cut > 0 {
        f.read_exact_at(&mut before, cut - 1)?;
        if before[0] == b',' {
            cut - 1
        } else {
            cut
        }
    } else {
        cut
    };
    f.set_len(keep)?;
    f.write_all_at(b"\n]}\n", keep)?;
    f.sync_data()
}

/// Offset of the last `\n` in the first `len` bytes of `f`, read backwards in chunks.
fn last_newline(f: &File, len: u64) -> std::io::Result<Option<u64>> {
    let mut buf = vec![0u8; 1 << 16];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        f.read_exact_at(chunk, start)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        end = start;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::export::chrome::{ChromeTrace, TraceLevel};
    use crate::export::Exporter;
    use probes::{Event, SpanRecord, Stage, NONE};

    fn span(sample: u64) -> Event {
        Event::Span(SpanRecord {
            stage: Stage::Decode,
            thread: 1,
            start_ns: 1000 * sample,
            dur_ns: 500,
            cpu_ns: 100,
            queue_ns: NONE,
            step: 0,
            sample,
            bytes: NONE,
        })
    }

    fn events(path: &Path) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(path).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).expect("a strictly valid JSON trace");
        v["traceEvents"].as_array().unwrap().clone()
    }

    #[test]
    fn closing_mid_event_keeps_every_whole_event_and_stops_later_writes() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("t.json");
        let (file, guard) = create(&path).unwrap();
        // A tiny buffer: events reach the file in pieces, as a big trace's do.
        let mut t = ChromeTrace::new(std::io::BufWriter::with_capacity(7, file), "p", TraceLevel::Sample).unwrap();
        for i in 0..20 {
            t.event(&span(i)).unwrap();
        }
        guard.close_now().unwrap();
        let kept = events(&path).iter().filter(|e| e["name"] == "decode").count();
        assert!(kept >= 18, "all but the pieces still buffered: {kept}");
        assert!(t.event(&span(99)).is_err(), "no write after the abort");
        drop(t);
        assert_eq!(events(&path).iter().filter(|e| e["name"] == "decode").count(), kept);
    }

    #[test]
    fn a_trace_with_only_its_header_or_already_closed_is_loadable_after_the_abort() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("t.json");
        let (file, guard) = create(&path).unwrap();
        let mut t = ChromeTrace::new(std::io::BufWriter::new(file), "p", TraceLevel::Sample).unwrap();
        t.event(&span(1)).unwrap();
        t.finish().unwrap();
        let before = std::fs::read(&path).unwrap();
        guard.close_now().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), before, "a closed trace is left alone");

        std::fs::write(&path, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n{\"ph\":\"M\"").unwrap();
        guard.close_now().unwrap();
        assert!(events(&path).is_empty());
    }
}
