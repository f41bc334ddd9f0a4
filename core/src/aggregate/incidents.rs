//! What went wrong along the way: files skipped, stages stalled past the threshold, and the
//! program's failure. Every text from another process is capped and cleaned. Pure.

use super::settings::{clean_name, strip_escapes};
use super::MAX_TEXT;
use probes::Stage;
use serde::{Deserialize, Serialize};

/// Skipped files listed by path; more are only counted.
pub const MAX_SKIPPED_LISTED: usize = 200;
/// Stalls listed at most (one per thread and file).
pub const MAX_STALLS: usize = 32;

/// A message from another process (a failure, with its traceback's last line): line breaks
/// kept, other control characters replaced, at most 16 × [`MAX_TEXT`] characters.
pub fn clean_text(text: &str) -> String {
    strip_escapes(text)
        .split('\n')
        .map(|l| clean_name(l, 16 * MAX_TEXT))
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .take(16 * MAX_TEXT)
        .collect()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Skipped {
    pub path: String,
    pub reason: String,
}

/// A stage open past the stall threshold (see [`probes::Event::Stalled`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct Stall {
    pub thread: String,
    pub stage: String,
    pub file: String,
    pub open_s: f64,
    /// The run ended without the thread: it was still stuck.
    pub abandoned: bool,
}

/// Skipped files (counted, the first listed), stalls (one per thread and file, bounded) and
/// the first failure the program reported.
#[derive(Default)]
pub(super) struct Incidents {
    pub(super) skipped: Vec<Skipped>,
    pub(super) skipped_count: u64,
    pub(super) stalls: Vec<Stall>,
    pub(super) failed: Option<String>,
}

impl Incidents {
    pub(super) fn push_skipped(&mut self, path: &str, reason: &str) {
        self.skipped_count += 1;
        if self.skipped.len() < MAX_SKIPPED_LISTED {
            let (path, reason) = (clean_name(path, MAX_TEXT), clean_name(reason, MAX_TEXT));
            self.skipped.push(Skipped { path, reason });
        }
    }

    /// A stage open for `open_ns` on `thread` with `file`: the longest seen per thread and file.
    pub(super) fn push_stall(&mut self, thread: &str, stage: Stage, file: &str, open_ns: u64, abandoned: bool) {
        let open_s = open_ns as f64 / 1e9;
        let full = self.stalls.len() >= MAX_STALLS;
        match self.stalls.iter_mut().find(|s| s.thread == thread && s.file == file) {
            Some(s) => {
                s.open_s = s.open_s.max(open_s);
                s.abandoned |= abandoned;
                s.stage = stage.name().to_string();
            }
            // Bounded: a run with thousands of stuck files names the first few.
            None if !full => self.stalls.push(Stall {
                thread: thread.to_string(),
                stage: stage.name().to_string(),
                file: file.to_string(),
                open_s,
                abandoned,
            }),
            None => {}
        }
    }

    /// The program failed: the first failure is the one kept.
    pub(super) fn push_failed(&mut self, why: &str) {
        self.failed.get_or_insert_with(|| clean_text(why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{Aggregator, RunSettings};
    use probes::Event;

    #[test]
    fn settings_and_failure_events_reach_the_summary() {
        let mut a = Aggregator::new(RunSettings { model: "train.py".into(), ..RunSettings::default() });
        a.push(&Event::Settings(Box::new(serde_json::json!({"framework": "keras", "batch_size": 16}))));
        a.push(&Event::Failed("ValueError: bad label (in train.py, line 3)".into()));
        a.push(&Event::Failed("a later failure".into()));
        let s = a.summary();
        assert_eq!(
            (&*s.settings.model.name(), s.settings.framework.name(), s.settings.batch_size),
            ("train.py", "keras", 16)
        );
        assert_eq!(
            s.failed.as_deref(),
            Some("ValueError: bad label (in train.py, line 3)"),
            "the first failure is the one"
        );
        let json = serde_json::to_value(&s).expect("summary serialises");
        assert_eq!(json["failed"], "ValueError: bad label (in train.py, line 3)");
        assert!(Aggregator::new(RunSettings::default()).summary().failed.is_none());
    }

    #[test]
    fn skipped_files_are_counted_and_listed_up_to_a_cap() {
        let mut a = Aggregator::new(RunSettings::default());
        for i in 0..(MAX_SKIPPED_LISTED + 5) {
            a.push(&Event::Skipped { path: format!("f{i}").into(), reason: "bad".into() });
        }
        let s = a.summary();
        assert_eq!(s.skipped_count as usize, MAX_SKIPPED_LISTED + 5);
        assert_eq!(s.skipped.len(), MAX_SKIPPED_LISTED);
    }
}
