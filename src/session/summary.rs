//! The summary file (`--summary`): the run's summary and verdict as JSON, written once the
//! collector has closed its outputs, with `failed` a field of the summary, never text patched
//! into the JSON.

use anyhow::Context;
use pipeprof_core::diagnose::Diagnosed;
use pipeprof_trainer::progress;
use std::path::{Path, PathBuf};

/// Where the summary goes.
#[derive(Debug, Clone)]
pub struct SummaryFile {
    path: PathBuf,
}

impl SummaryFile {
    pub fn new(path: PathBuf) -> SummaryFile {
        SummaryFile { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `done`, its `failed` field set to [`failed_field`] when `why` says the run
    /// failed.
    pub fn write(&self, done: &Diagnosed, why: Option<&str>) -> anyhow::Result<()> {
        let text = match why {
            None => serde_json::to_string_pretty(done)?,
            Some(_) => {
                let mut marked = done.clone();
                marked.summary.failed = failed_field(done.summary.failed.as_deref(), why);
                serde_json::to_string_pretty(&marked)?
            }
        };
        std::fs::write(&self.path, text).with_context(|| format!("cannot write the summary to {}", self.path.display()))
    }

    /// [`SummaryFile::write`], then says where.
    pub fn write_and_say(&self, done: &Diagnosed, why: Option<&str>) -> anyhow::Result<()> {
        self.write(done, why)?;
        progress::say(&format!("pipeprof: summary written to {}", self.path.display()));
        Ok(())
    }
}

/// The JSON Schema of the summary file (`--summary`, `report --summary`): [`Diagnosed`]'s,
/// generated from its types, as `docs/schema/summary.schema.json` holds it. Its version is the
/// file's `schema_version` ([`pipeprof_core::aggregate::SUMMARY_SCHEMA_VERSION`]).
pub fn schema() -> String {
    crate::report::json::schema_text::<Diagnosed>()
}

/// The summary's `failed`: what the program said of its failure (an exception) first, then
/// why the run failed (an exit status, a thread that died). Pure.
pub fn failed_field(said: Option<&str>, why: Option<&str>) -> Option<String> {
    match (said, why) {
        (Some(s), Some(w)) => Some(format!("{s} ({w})")),
        (s, w) => s.or(w).map(str::to_string),
    }
}

/// The summary and the HTML page an immediate exit (a second interrupt, after the grace period)
/// writes: the last published snapshot's, marked. Never waits on the lock: a busy slot means
/// neither is written, and says so.
pub fn write_on_abort(file: Option<&SummaryFile>, page: Option<&Path>, latest: &super::Latest) {
    if file.is_none() && page.is_none() {
        return;
    }
    let Ok(live) = latest.try_lock() else {
        progress::warn("exiting at once: the summary was being updated, so no summary file or page was written");
        return;
    };
    let done = Diagnosed::new(live.snap.summary.clone());
    drop(live);
    let why = "interrupted twice: exited at once, the summary covers the last snapshot";
    if let Some(file) = file {
        if let Err(e) = file.write(&done, Some(why)) {
            progress::warn(&format!("exiting at once: {e:#}"));
        }
    }
    if let Some(page) = page {
        if let Err(e) = super::write_page(page, &done, Some(why)) {
            progress::warn(&format!("exiting at once: {e:#}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_words_come_first_then_why_the_run_failed() {
        assert_eq!(failed_field(None, None), None);
        assert_eq!(failed_field(Some("ValueError: x"), None).as_deref(), Some("ValueError: x"));
        assert_eq!(failed_field(None, Some("exit code 1")).as_deref(), Some("exit code 1"));
        assert_eq!(
            failed_field(Some("ValueError: x"), Some("exit code 1")).as_deref(),
            Some("ValueError: x (exit code 1)")
        );
    }

    #[test]
    fn failed_is_a_field_of_the_written_summary() {
        let d = tempfile::tempdir().expect("temp dir");
        let file = SummaryFile::new(d.path().join("s.json"));
        let done = Diagnosed::default();
        file.write(&done, Some("the loader died")).expect("written");
        let back: Diagnosed = serde_json::from_slice(&std::fs::read(file.path()).expect("read")).expect("json");
        assert_eq!(back.summary.failed.as_deref(), Some("the loader died"));
        file.write(&done, None).expect("written");
        let back: Diagnosed = serde_json::from_slice(&std::fs::read(file.path()).expect("read")).expect("json");
        assert_eq!(back.summary.failed, None);
    }
}
