//! One trace per rank of a distributed run (`--trace t.json` → `t.rank0.json`, `t.rank1.json`,
//! … beside the run's own trace), the way Kineto writes them: each file carries
//! `"distributedInfo": {"rank", "local_rank", "world_size"}` (with `"node"` and `"job"` where
//! `pipeprof run` knew them) and the clock its timestamps are
//! on, so Perfetto and HTA load them together, and ends with that rank's own summary, so
//! `pipeprof report t.rank0.json t.rank1.json` reads the ranks back and judges them.
//!
//! Every process of a run on one machine stamps events with `CLOCK_MONOTONIC`, the same clock:
//! the ranks' timestamps line up as they are. `clockOffsetNs` (wall clock minus monotonic, at
//! the file's start) puts them on the wall clock, to line up with another machine's ranks.

use super::chrome::{ChromeTrace, TraceLevel};
use super::Exporter;
use pipeprof_core::aggregate::ranks::MAX_RANKS;
use pipeprof_core::aggregate::{Aggregator, RunSettings};
use pipeprof_core::diagnose::Diagnosed;
use probes::{Event, Rank};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

/// `t.json` → `t.rank3.json` (`t` → `t.rank3`).
pub fn rank_path(base: &Path, rank: u32) -> PathBuf {
    let stem = base.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match base.extension() {
        Some(e) => format!("{stem}.rank{rank}.{}", e.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    base.with_file_name(name)
}

/// Wall clock minus `CLOCK_MONOTONIC` now, ns: what turns a trace timestamp into wall time.
fn clock_offset_ns() -> i128 {
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
    wall - probes::clock::now_ns() as i128
}

/// The header fields of rank `r`'s trace, on `node` (its name and job beside the rank, where
/// known).
pub fn header(
    r: Rank,
    node: Option<&probes::NodeId>,
    clock_offset_ns: i128,
) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    let mut info = serde_json::json!({"rank": r.rank, "local_rank": r.local_rank, "world_size": r.world_size});
    if let Some(n) = node {
        info["node"] = n.name.clone().into();
        if let Some(j) = &n.job {
            info["job"] = j.clone().into();
        }
    }
    m.insert("distributedInfo".into(), info);
    m.insert("clockOffsetNs".into(), serde_json::json!(clock_offset_ns as i64));
    m.insert("clock".into(), serde_json::json!("CLOCK_MONOTONIC"));
    m
}

struct One {
    trace: ChromeTrace<BufWriter<File>>,
    agg: Aggregator,
    rank: Rank,
}

/// The per-rank traces of a run, each opened when its rank's first event comes.
pub struct RankTraces {
    base: PathBuf,
    title: String,
    level: TraceLevel,
    settings: RunSettings,
    files: BTreeMap<u32, One>,
    /// Paths written, by rank (for the command to say).
    pub written: Vec<PathBuf>,
}

impl RankTraces {
    /// Per-rank traces beside `base` (the run's own trace).
    pub fn new(base: &Path, title: &str, level: TraceLevel) -> RankTraces {
        RankTraces {
            base: base.to_path_buf(),
            title: title.to_string(),
            level,
            settings: RunSettings::default(),
            files: BTreeMap::new(),
            written: Vec::new(),
        }
    }

    fn file(&mut self, r: Rank) -> std::io::Result<Option<&mut One>> {
        if !self.files.contains_key(&r.rank) {
            if self.files.len() >= MAX_RANKS {
                return Ok(None);
            }
            let path = rank_path(&self.base, r.rank);
            let f = super::create_beside(&path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))?;
            let on = self.settings.node.as_ref().map(|n| format!(" on node {}", n.name)).unwrap_or_default();
            let title = format!("{} · rank {}{on}", self.title, r.rank);
            let mut trace = ChromeTrace::with_header(
                BufWriter::with_capacity(1 << 16, f),
                &title,
                self.level,
                &header(r, self.settings.node.as_ref(), clock_offset_ns()),
            )?;
            trace.settings(&self.settings)?;
            self.written.push(path);
            self.files.insert(r.rank, One { trace, agg: Aggregator::new(self.settings.clone()), rank: r });
        }
        Ok(self.files.get_mut(&r.rank))
    }
}

impl Exporter for RankTraces {
    fn settings(&mut self, s: &RunSettings) -> std::io::Result<()> {
        self.settings = s.clone();
        Ok(())
    }

    fn event(&mut self, ev: &Event) -> std::io::Result<()> {
        let Event::Ranked(r, inner) = ev else { return Ok(()) };
        if let Some(one) = self.file(*r)? {
            one.trace.event(inner)?;
            one.agg.push(inner);
        }
        Ok(())
    }

    fn summary(&mut self, _run: &Diagnosed) -> std::io::Result<()> {
        for one in self.files.values_mut() {
            let mut s = one.agg.summary();
            s.rank = Some(one.rank);
            one.trace.summary(&Diagnosed::new(s))?;
        }
        Ok(())
    }

    fn finish(&mut self) -> std::io::Result<()> {
        for one in self.files.values_mut() {
            one.trace.finish()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_files_sit_beside_the_runs_trace() {
        assert_eq!(rank_path(Path::new("/tmp/t.json"), 3), PathBuf::from("/tmp/t.rank3.json"));
        assert_eq!(rank_path(Path::new("trace"), 0), PathBuf::from("trace.rank0"));
        assert_eq!(rank_path(Path::new("a/b.c.json"), 12), PathBuf::from("a/b.c.rank12.json"));
    }
}
