//! A run's summary paired with its verdict: what the summary JSON, the trace's final summary
//! and the report carry. `aggregate` knows nothing of verdicts; whoever finishes a run (the
//! session, `pipeprof report`) pairs the two here.

use super::{diagnose_finished, Verdict};
use crate::aggregate::Summary;
use serde::{Deserialize, Serialize};

/// A summary and the verdict on it. Serialises as the summary's fields followed by
/// `"verdict"`: the summary JSON schema of earlier versions, unchanged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Diagnosed {
    #[serde(flatten)]
    pub summary: Summary,
    #[serde(default)]
    pub verdict: Option<Verdict>,
    /// A distributed run's straggler verdict (from `summary.ranks`; absent for one process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub straggler: Option<super::ranks::RanksVerdict>,
}

impl Diagnosed {
    /// Judges the summary of a finished run (or one read back from a file): see
    /// [`diagnose_finished`].
    pub fn new(summary: Summary) -> Diagnosed {
        let verdict = Some(diagnose_finished(&summary));
        let straggler = super::ranks::judge(&summary.ranks);
        Diagnosed { summary, verdict, straggler }
    }

    /// The straggler verdict, judged from the summary's ranks if the pair was read without one.
    pub fn straggler(&self) -> Option<super::ranks::RanksVerdict> {
        self.straggler.clone().or_else(|| super::ranks::judge(&self.summary.ranks))
    }

    /// The verdict, computed if the pair was read without one.
    pub fn verdict(&self) -> Verdict {
        self.verdict.clone().unwrap_or_else(|| diagnose_finished(&self.summary))
    }
}
