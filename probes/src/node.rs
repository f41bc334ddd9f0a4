//! Which machine of a training job a run is on: its node name, the job's id and the node's
//! place in the job, read once when `pipeprof run` starts. Every record of the run carries it
//! (the summary's settings, each rank's line and trace, every `/metrics` series), so a job's
//! files from several machines, or their series in one Prometheus, stay apart and come
//! together as one job.
//!
//! Where each comes from, first found wins (see [`NodeId::detect`]):
//! - name: `--node NAME`; Slurm's `SLURMD_NODENAME`; the host name.
//! - job: `--job ID`; the program's own `--rdzv-id`/`--rdzv_id` (torchrun's flag: several
//!   torchrun jobs in one Slurm allocation each have their own); Slurm's `SLURM_JOB_ID`;
//!   torchelastic's `TORCHELASTIC_RUN_ID`; else none.
//! - node rank: Slurm's `SLURM_NODEID`; `GROUP_RANK` where a launcher set it for pipeprof. Not
//!   torchrun's `--node-rank`: with its c10d rendezvous that flag is ignored, and the nodes are
//!   numbered as they join.

use serde::{Deserialize, Serialize};

/// The machine a run is on, within its job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodeId {
    /// The node's name (host name unless given).
    pub name: String,
    /// The training job's id, when one was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// This node's number in the job (torchrun's node rank, Slurm's node id), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_rank: Option<u32>,
}

/// Longest node name or job id kept (they become label values and file names).
pub const MAX_NAME: usize = 64;

/// `s` trimmed, cut to [`MAX_NAME`] characters, with anything but ASCII letters, digits,
/// `-`, `_` and `.` replaced by `_` (a name goes into file names and label values); `None`
/// when nothing is left.
pub fn clean(s: &str) -> Option<String> {
    let t: String = s
        .trim()
        .chars()
        .take(MAX_NAME)
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    (!t.is_empty() && t.chars().any(|c| c != '.')).then_some(t)
}

/// The value of `--NAME V`, `--NAME=V`, or of its spelling with `_` for `-`, in `args`.
fn flag_value(args: &[String], name: &str) -> Option<String> {
    let under = name.replace('-', "_");
    let spellings = [format!("--{name}"), format!("--{under}")];
    let mut it = args.iter();
    while let Some(a) = it.next() {
        for s in &spellings {
            if a == s {
                return it.next().cloned();
            }
            if let Some(v) = a.strip_prefix(s.as_str()).and_then(|r| r.strip_prefix('=')) {
                return Some(v.to_string());
            }
        }
    }
    None
}

/// What [`NodeId::detect`] reads, gathered by the caller (pure, so it is table-tested).
#[derive(Debug, Clone, Default)]
pub struct Sources<'a> {
    /// `--node NAME`.
    pub node: Option<&'a str>,
    /// `--job ID`.
    pub job: Option<&'a str>,
    /// The program's command line (torchrun's flags are read from it).
    pub program: &'a [String],
    /// This machine's host name.
    pub host: Option<&'a str>,
}

impl NodeId {
    /// The node from the flags, the launcher's environment (`env`), the program's command line
    /// and the host name, first found wins (see the module docs). The name is never empty:
    /// `"localhost"` when nothing names the machine.
    pub fn detect(src: &Sources, env: impl Fn(&str) -> Option<String>) -> NodeId {
        let from_env = |k: &str| env(k).as_deref().and_then(clean);
        let name = src
            .node
            .and_then(clean)
            .or_else(|| from_env("SLURMD_NODENAME"))
            .or_else(|| src.host.and_then(clean))
            .unwrap_or_else(|| "localhost".into());
        let job = src
            .job
            .and_then(clean)
            .or_else(|| flag_value(src.program, "rdzv-id").as_deref().and_then(clean))
            .or_else(|| from_env("SLURM_JOB_ID"))
            .or_else(|| from_env("TORCHELASTIC_RUN_ID"));
        let num = |v: Option<String>| v.and_then(|v| v.trim().parse::<u32>().ok());
        let node_rank = num(env("SLURM_NODEID")).or_else(|| num(env("GROUP_RANK")));
        NodeId { name, job, node_rank }
    }

    /// `path` with each `{node}` replaced by the node's name (one shared folder, a file per
    /// node).
    pub fn fill(&self, path: &std::path::Path) -> std::path::PathBuf {
        let s = path.to_string_lossy();
        if s.contains("{node}") {
            s.replace("{node}", &self.name).into()
        } else {
            path.to_path_buf()
        }
    }

    /// The host name of this machine, if the system gives one.
    pub fn host_name() -> Option<String> {
        sysinfo::System::host_name().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn each_part_comes_from_the_first_source_that_has_it() {
        let torchrun = args("torchrun --nnodes 2 --node_rank=1 --rdzv-id job7 train.py");
        let none = |_: &str| None;
        let slurm = |k: &str| match k {
            "SLURMD_NODENAME" => Some("gpu-12".to_string()),
            "SLURM_JOB_ID" => Some("4242".to_string()),
            "SLURM_NODEID" => Some("3".to_string()),
            _ => None,
        };
        type Env<'a> = &'a dyn Fn(&str) -> Option<String>;
        let cases: [(Sources, Env, NodeId); 5] = [
            (
                Sources { host: Some("box"), program: &torchrun, ..Default::default() },
                &none,
                NodeId { name: "box".into(), job: Some("job7".into()), node_rank: None },
            ),
            (
                Sources { host: Some("box"), program: &torchrun, ..Default::default() },
                &slurm,
                NodeId { name: "gpu-12".into(), job: Some("job7".into()), node_rank: Some(3) },
            ),
            (
                Sources { host: Some("box"), ..Default::default() },
                &slurm,
                NodeId { name: "gpu-12".into(), job: Some("4242".into()), node_rank: Some(3) },
            ),
            (
                Sources { node: Some("b"), job: Some("run 1"), host: Some("box"), program: &torchrun },
                &slurm,
                NodeId { name: "b".into(), job: Some("run_1".into()), node_rank: Some(3) },
            ),
            (Sources::default(), &none, NodeId { name: "localhost".into(), job: None, node_rank: None }),
        ];
        for (src, env, want) in cases {
            assert_eq!(NodeId::detect(&src, env), want, "{src:?}");
        }
    }

    #[test]
    fn names_are_cleaned_for_files_and_labels() {
        assert_eq!(clean(" a/../b "), Some("a_.._b".into()));
        assert_eq!(clean(".."), None);
        assert_eq!(clean(""), None);
        assert_eq!(clean(&"x".repeat(100)).map(|s| s.len()), Some(MAX_NAME));
        let n = NodeId { name: "b".into(), ..Default::default() };
        assert_eq!(n.fill("out/{node}.json".as_ref()), std::path::PathBuf::from("out/b.json"));
        assert_eq!(n.fill("out/s.json".as_ref()), std::path::PathBuf::from("out/s.json"));
    }

    #[test]
    fn a_flag_reads_in_either_spelling_and_form() {
        assert_eq!(flag_value(&args("--rdzv-id 2"), "rdzv-id"), Some("2".into()));
        assert_eq!(flag_value(&args("--rdzv_id=j5"), "rdzv-id"), Some("j5".into()));
        assert_eq!(flag_value(&args("--rdzv_id"), "rdzv-id"), None);
        assert_eq!(flag_value(&args("--rdzv-idle 3"), "rdzv-id"), None);
    }
}
