//! The run's threads: their names and roles (bounded), the rank each belongs to in a
//! distributed run, and each loader thread's share of the loader work, one row per worker
//! however often it was restarted. Pure.
//!
//! The bounds never split one worker's work: a thread past the names kept that is called and
//! does what a kept thread is called and does is that thread's row, and a thread past the
//! loader threads kept is counted with the kept thread of its row (a `PyDataset` on
//! TensorFlow runs its batches in threads that come and go, hundreds an epoch). Only a thread
//! of a row not kept is counted with the other threads.

use super::settings::clean_name;
use super::stages::share;
use super::MAX_TEXT;
use probes::{SpanRecord, ThreadRole, NONE};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Threads with their own loader statistics; later ones are counted together (a run whose
/// worker processes restart every epoch brings new threads each time).
pub const MAX_LOADER_THREADS: usize = 256;
/// The id under which threads past [`MAX_LOADER_THREADS`] are counted.
pub const OTHER_THREADS: u32 = u32::MAX;
/// Threads whose rank is kept, at most; and threads past the bounds that are known to be an
/// earlier thread's row.
pub const MAX_RANKED_THREADS: usize = 1 << 16;
/// Thread names kept (a run whose worker processes restart every epoch names new threads
/// each time); later threads are shown by id.
pub const MAX_THREAD_NAMES: usize = 4 * MAX_LOADER_THREADS;

/// One thread's loader stages (read, decode, resize, augment): a loader worker, in this
/// process or in a worker process of the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct LoaderThread {
    pub thread: u32,
    pub name: String,
    /// Loader-stage spans it closed.
    pub spans: u64,
    /// Wall time inside them, ms.
    pub busy_ms: f64,
    /// On-CPU share of that time where measured (0–1): low = waiting on I/O or the scheduler.
    pub on_cpu: Option<f64>,
    /// Times this worker was started: a DataLoader without `persistent_workers` starts its
    /// workers again each epoch (a new process, a new pid), pipeprof's `--workers auto` each
    /// change. All of them are one row, named for the worker, not the process.
    #[serde(default = "one")]
    pub starts: u32,
}

fn one() -> u32 {
    1
}

/// A thread's name without the process id its label carries (`loader-1 (pid 42)` →
/// `loader-1`, `loader-0 (rank 1, pid 7)` → `loader-0 (rank 1)`): the threads of one worker
/// process started again (a new pid each epoch) share it.
pub fn without_pid(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(open) = rest.find(" (") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let Some(close) = after.find(')') else {
            out.push_str(&rest[open..]);
            rest = "";
            break;
        };
        let kept: Vec<&str> = after[..close]
            .split(", ")
            .filter(|part| !part.strip_prefix("pid ").is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())))
            .collect();
        if !kept.is_empty() {
            out.push_str(" (");
            out.push_str(&kept.join(", "));
            out.push(')');
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

#[derive(Debug, Clone, Copy, Default)]
struct ThreadLoad {
    spans: u64,
    wall_ns: u64,
    cpu_ns: u64,
    cpu_wall_ns: u64,
    /// Threads past [`MAX_LOADER_THREADS`] of this thread's row counted here: starts of it.
    later: u32,
}

impl ThreadLoad {
    fn add(&mut self, o: &ThreadLoad) {
        self.later = self.later.saturating_add(o.later);
        self.spans += o.spans;
        self.wall_ns += o.wall_ns;
        self.cpu_ns += o.cpu_ns;
        self.cpu_wall_ns += o.cpu_wall_ns;
    }
}

/// Thread names, roles, ranks and loader loads, each bounded.
#[derive(Default)]
pub(super) struct Threads {
    names: BTreeMap<u32, String>,
    /// The roles of the named threads that have one.
    roles: BTreeMap<u32, ThreadRole>,
    loads: BTreeMap<u32, ThreadLoad>,
    /// The rank of each thread a distributed run's rank announced (bounded): its loader
    /// workers are that rank's, however they are named.
    ranks: BTreeMap<u32, u32>,
    /// Threads past [`MAX_THREAD_NAMES`] called (less their process id) and doing what a kept
    /// thread is (bounded): that thread, whose row they are.
    same_as: BTreeMap<u32, u32>,
    /// Threads past [`MAX_LOADER_THREADS`] (bounded): the kept thread whose load they add to,
    /// [`OTHER_THREADS`] for a row not kept.
    counted_in: BTreeMap<u32, u32>,
}

impl Threads {
    /// Thread `id` is called `name` and does `role` (bounded: 300 000 distinct names, a
    /// crafted trace, were 650 MB; a thread past the names kept is shown by id).
    pub(super) fn push_name(&mut self, id: u32, name: &str, role: ThreadRole) {
        if self.names.len() < MAX_THREAD_NAMES || self.names.contains_key(&id) {
            self.names.insert(id, clean_name(name, MAX_TEXT));
            match role {
                ThreadRole::Other => self.roles.remove(&id),
                role => self.roles.insert(id, role),
            };
            return;
        }
        // Its process id aside: a worker process started again each epoch is a new pid.
        let name = without_pid(&clean_name(name, MAX_TEXT));
        let role_of = |k: &u32| self.roles.get(k).copied().unwrap_or_default();
        let kept = self.names.iter().find(|(k, n)| role_of(k) == role && without_pid(n) == name).map(|(k, _)| *k);
        match kept {
            Some(k) if self.same_as.len() < MAX_RANKED_THREADS || self.same_as.contains_key(&id) => {
                self.same_as.insert(id, k);
            }
            _ => {
                self.same_as.remove(&id);
            }
        }
    }

    /// Thread `id` belongs to rank `rank`.
    pub(super) fn push_rank(&mut self, id: u32, rank: u32) {
        if self.ranks.len() < MAX_RANKED_THREADS || self.ranks.contains_key(&id) {
            self.ranks.insert(id, rank);
        }
    }

    /// A loader-stage span: its thread's load.
    pub(super) fn push_loader_span(&mut self, s: &SpanRecord) {
        let known = self.loads.contains_key(&s.thread);
        let id = if known || self.loads.len() < MAX_LOADER_THREADS { s.thread } else { self.counted_in(s.thread) };
        let t = self.loads.entry(id).or_default();
        t.spans += 1;
        t.wall_ns += s.dur_ns;
        if s.cpu_ns != NONE {
            t.cpu_ns += s.cpu_ns.min(s.dur_ns);
            t.cpu_wall_ns += s.dur_ns;
        }
    }

    /// Where thread `id`, past the loader threads kept, is counted: the kept thread of its row
    /// (a start of it), else the other threads. Found once per thread.
    fn counted_in(&mut self, id: u32) -> u32 {
        if let Some(&k) = self.counted_in.get(&id) {
            return k;
        }
        let row = self.row_of(id);
        let kept = self.loads.keys().copied().filter(|k| *k != OTHER_THREADS).find(|k| self.row_of(*k) == row);
        let k = kept.unwrap_or(OTHER_THREADS);
        if self.counted_in.len() < MAX_RANKED_THREADS {
            self.counted_in.insert(id, k);
            if let Some(t) = kept.and_then(|k| self.loads.get_mut(&k)) {
                t.later = t.later.saturating_add(1);
            }
        }
        k
    }

    pub(super) fn has(&self, id: u32) -> bool {
        self.names.contains_key(&id)
    }

    pub(super) fn names(&self) -> &BTreeMap<u32, String> {
        &self.names
    }

    /// The row thread `id` counts in: a loader worker pipeprof named for its role
    /// (`loader-0.2`) the worker's ([`ThreadRole::worker_name`], the same for all its
    /// generations), any other thread its name [`without_pid`] (a process's label says whose it
    /// is: `loader-0 (rank 1, pid 7)`); its rank's when it has one (workers of different ranks
    /// are different workers, whatever their names).
    fn row_of(&self, id: u32) -> (Option<u32>, String) {
        let rank = self.ranks.get(&id).copied();
        let named = self.same_as.get(&id).copied().unwrap_or(id);
        let role = self.roles.get(&named).copied().unwrap_or_default();
        let mut name = match (role.worker_name(), self.names.get(&named)) {
            (Some(worker), Some(n)) if *n == role.thread_name() => worker,
            (_, Some(n)) => without_pid(n),
            (_, None) if id == OTHER_THREADS => "other threads".to_string(),
            (_, None) => format!("thread-{id}"),
        };
        if let Some(r) = rank.filter(|r| !name.contains(&format!("rank {r}"))) {
            name = format!("{name} (rank {r})");
        }
        (rank, name)
    }

    /// One row per worker: a worker's restarts (new processes, new generations) add to its row
    /// and its `starts`; busiest first.
    pub(super) fn loader_rows(&self) -> Vec<LoaderThread> {
        let mut rows: BTreeMap<(Option<u32>, String), (u32, u32, ThreadLoad)> = BTreeMap::new();
        for (&id, t) in &self.loads {
            let row = rows.entry(self.row_of(id)).or_insert((id, 0, ThreadLoad::default()));
            row.1 = row.1.saturating_add(1 + t.later);
            row.2.add(t);
        }
        let mut v: Vec<LoaderThread> = rows
            .into_iter()
            .map(|((_, name), (thread, starts, t))| LoaderThread {
                thread,
                name,
                spans: t.spans,
                busy_ms: t.wall_ns as f64 / 1e6,
                on_cpu: share(t.cpu_ns, t.cpu_wall_ns),
                starts,
            })
            .collect();
        v.sort_by(|a, b| b.busy_ms.total_cmp(&a.busy_ms).then(a.name.cmp(&b.name)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::testing::on_thread;
    use crate::aggregate::{Aggregator, RunSettings};
    use probes::{Event, Stage};

    fn thread(id: u32, name: &str, role: ThreadRole) -> Event {
        Event::Thread { id, name: name.into(), role }
    }

    #[test]
    fn loader_work_is_split_per_thread_with_its_on_cpu_share() {
        let mut a = Aggregator::new(RunSettings { workers: 2, ..Default::default() });
        a.push(&thread(7, "loader-0 (pid 41)", ThreadRole::loader(0)));
        a.push(&thread(9, "loader-1 (pid 42)", ThreadRole::loader(1)));
        for _ in 0..4 {
            a.push(&on_thread(7, Stage::Decode, 1_000_000, 900_000));
            a.push(&on_thread(9, Stage::Read, 3_000_000, 300_000));
        }
        // The training thread's stages are not loader work.
        a.push(&on_thread(1, Stage::Wait, 5_000_000, NONE));
        let t = a.summary().loader_threads;
        assert_eq!(t.len(), 2, "{t:?}");
        assert_eq!((t[0].name.as_str(), t[0].spans, t[0].busy_ms), ("loader-1", 4, 12.0));
        assert_eq!(t[0].on_cpu, Some(0.1), "busiest first: the one waiting on reads");
        assert_eq!((t[1].name.as_str(), t[1].on_cpu, t[1].starts), ("loader-0", Some(0.9), 1));
    }

    #[test]
    fn workers_restarted_each_epoch_are_one_row_each_with_their_starts() {
        // 3 epochs, 2 workers each for a train and a validation loader, never persistent: 12
        // processes, 2 workers.
        let mut a = Aggregator::new(RunSettings { workers: 2, ..Default::default() });
        for start in 0..6u32 {
            for w in 0..2u32 {
                let id = 10 + start * 2 + w;
                a.push(&thread(id, &format!("loader-{w} (pid {})", 100 + id), ThreadRole::Other));
                a.push(&on_thread(id, Stage::Decode, 1_000_000, 500_000));
            }
        }
        let t = a.summary().loader_threads;
        let rows: Vec<(&str, u32, u64)> = t.iter().map(|x| (x.name.as_str(), x.starts, x.spans)).collect();
        assert_eq!(rows, [("loader-0", 6, 6), ("loader-1", 6, 6)]);
    }

    #[test]
    fn a_thread_name_loses_its_process_id_and_nothing_else() {
        let table = [
            ("loader-1 (pid 42)", "loader-1"),
            ("loader-0 (rank 1, pid 7)", "loader-0 (rank 1)"),
            ("worker-0 (pid 77) thread-9", "worker-0 thread-9"),
            ("loader-0.2", "loader-0.2"),
            ("loader-3", "loader-3"),
            ("tf.data (trace)", "tf.data (trace)"),
            ("train (pid 1a)", "train (pid 1a)"),
            ("odd (pid 5", "odd (pid 5"),
        ];
        for (name, row) in table {
            assert_eq!(without_pid(name), row, "{name}");
        }
    }

    #[test]
    fn a_loader_workers_generations_are_one_row_by_its_role_not_its_name() {
        // `--workers auto`: worker 0 started three times, worker 1 twice; a thread named like
        // a generation without the role is a row of its own, and so is a worker whose process
        // label says it is another's (a rank's, read back from a trace without ranks).
        let mut a = Aggregator::new(RunSettings { workers: 2, ..Default::default() });
        let threads = [
            (1, "loader-0", ThreadRole::loader(0)),
            (2, "loader-1", ThreadRole::loader(1)),
            (3, "loader-0.1", ThreadRole::Loader { worker: 0, generation: 1 }),
            (4, "loader-1.1", ThreadRole::Loader { worker: 1, generation: 1 }),
            (5, "loader-0.2", ThreadRole::Loader { worker: 0, generation: 2 }),
            (6, "loader-0.9", ThreadRole::Other),
            (7, "loader-0 (rank 1, pid 7)", ThreadRole::loader(0)),
        ];
        for (id, name, role) in threads {
            a.push(&thread(id, name, role));
            a.push(&on_thread(id, Stage::Decode, 1_000_000, 500_000));
        }
        let t = a.summary().loader_threads;
        let rows: Vec<(&str, u32, u64)> = t.iter().map(|x| (x.name.as_str(), x.starts, x.spans)).collect();
        assert_eq!(rows, [("loader-0", 3, 3), ("loader-1", 2, 2), ("loader-0 (rank 1)", 1, 1), ("loader-0.9", 1, 1)]);
        // The names stay as the threads gave them.
        assert_eq!(a.summary().threads[&5], "loader-0.2");
    }

    #[test]
    fn loader_threads_are_bounded() {
        let mut a = Aggregator::new(RunSettings::default());
        for id in 0..(MAX_LOADER_THREADS as u32 + 10) {
            a.push(&on_thread(id, Stage::Decode, 1_000, NONE));
        }
        let t = a.summary().loader_threads;
        assert_eq!(t.len(), MAX_LOADER_THREADS + 1);
        let other = t.iter().find(|x| x.thread == OTHER_THREADS).unwrap();
        assert_eq!((other.name.as_str(), other.spans, other.on_cpu), ("other threads", 10, None));
    }

    #[test]
    fn threads_of_one_role_are_one_row_however_many_come_and_go() {
        // A PyDataset on TensorFlow: each batch in a thread of its own, 600 of them, past the
        // loader threads kept and the names kept; a worker process started again 1100 times.
        // No work goes to "other threads".
        let mut a = Aggregator::new(RunSettings::default());
        let mut id = 1;
        for k in 0..1100u32 {
            a.push(&thread(id, &format!("loader-0 (pid {})", 10_000 + k), ThreadRole::loader(0)));
            a.push(&on_thread(id, Stage::Decode, 1_000_000, NONE));
            id += 1;
            if k < 600 {
                a.push(&thread(id, "tf.data (PyDataset)", ThreadRole::Other));
                a.push(&on_thread(id, Stage::Read, 2_000_000, NONE));
                a.push(&on_thread(id, Stage::Resize, 1_000_000, NONE));
                id += 1;
            }
        }
        let t = a.summary().loader_threads;
        let rows: Vec<(&str, u32, u64)> = t.iter().map(|x| (x.name.as_str(), x.starts, x.spans)).collect();
        assert_eq!(rows, [("tf.data (PyDataset)", 600, 1200), ("loader-0", 1100, 1100)]);
        assert!((t[0].busy_ms - 1800.0).abs() < 1e-9, "{t:?}");
        // Threads of rows not kept still go to "other threads".
        for k in 0..(MAX_LOADER_THREADS as u32) {
            a.push(&on_thread(100_000 + k, Stage::Decode, 1_000, NONE));
        }
        let t = a.summary().loader_threads;
        assert!(t.iter().any(|x| x.name == "other threads"), "{t:?}");
        assert_eq!(t.iter().find(|x| x.name == "tf.data (PyDataset)").map(|x| x.spans), Some(1200));
    }

    #[test]
    fn names_from_other_processes_are_capped_and_lose_their_control_characters() {
        let mut a = Aggregator::new(RunSettings::default());
        a.push(&thread(3, &format!("w\u{1b}[2J{}", "x".repeat(900_000)), ThreadRole::Other));
        a.push(&Event::Skipped { path: "a\rb.png".into(), reason: "bad\u{7}".into() });
        a.push(&Event::Failed("Error: x\u{1b}]0;t\u{7}\nline 2".into()));
        let s = a.summary();
        assert_eq!(s.threads[&3].chars().count(), MAX_TEXT);
        assert!(s.threads[&3].starts_with("w?[2J"));
        assert_eq!((s.skipped[0].path.as_str(), s.skipped[0].reason.as_str()), ("a?b.png", "bad?"));
        // Escape sequences are formatting: removed whole, not shown as `?]0;t?`.
        assert_eq!(s.failed.as_deref(), Some("Error: x\nline 2"));
    }
}
