//! What a thread does in the run, typed: set where the thread is made
//! ([`crate::layer::set_thread_role`], in the thread itself), sent once with its name
//! ([`crate::Event::Thread`]), never recovered from the name.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A thread's part in the run.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ThreadRole {
    /// The training loop.
    Train,
    /// Thread `n` of the compute pool that runs the model's ops.
    Compute(u32),
    /// A loader worker: its place in the pool, and which start of it this is (pipeprof's
    /// `--workers auto` starts the workers again at each change: generation 0, 1, …).
    Loader {
        /// The worker's index in the pool, from 0.
        worker: u32,
        /// Starts of this worker before this one.
        #[serde(default)]
        generation: u32,
    },
    /// Anything else (a thread of the program's own, a library's).
    #[default]
    Other,
}

impl ThreadRole {
    /// A loader worker of the first generation.
    pub const fn loader(worker: u32) -> ThreadRole {
        ThreadRole::Loader { worker, generation: 0 }
    }

    /// Whether no role was given.
    pub fn is_other(&self) -> bool {
        *self == ThreadRole::Other
    }

    /// Whether the thread runs the model's work: the training loop or a compute thread.
    pub fn runs_the_model(&self) -> bool {
        matches!(self, ThreadRole::Train | ThreadRole::Compute(_))
    }

    /// The loader worker this thread is, whatever its generation.
    pub fn worker(&self) -> Option<u32> {
        match self {
            ThreadRole::Loader { worker, .. } => Some(*worker),
            _ => None,
        }
    }

    /// The name pipeprof gives a thread of this role (`train`, `compute-3`, `loader-1`,
    /// `loader-1.2` for a worker's third start; at most 15 bytes for realistic counts, what
    /// Linux keeps of a thread name); `thread` for [`ThreadRole::Other`], whose threads are
    /// named by whoever makes them.
    pub fn thread_name(&self) -> String {
        match *self {
            ThreadRole::Train => "train".into(),
            ThreadRole::Compute(n) => format!("compute-{n}"),
            ThreadRole::Loader { worker, generation: 0 } => format!("loader-{worker}"),
            ThreadRole::Loader { worker, generation } => format!("loader-{worker}.{generation}"),
            ThreadRole::Other => "thread".into(),
        }
    }

    /// The name of the worker a loader thread is, the same for all its generations
    /// (`loader-1`); `None` for other roles.
    pub fn worker_name(&self) -> Option<String> {
        self.worker().map(|w| format!("loader-{w}"))
    }
}

thread_local! {
    /// Takes the thread's entry out of [`OS_ROLES`] when the thread ends (its OS id may be
    /// reused by a later thread).
    static OS_ENTRY: OsEntry = const { OsEntry(Cell::new(None)) };
}

/// Roles by OS thread id, for the host sampler of this process (bounded).
static OS_ROLES: Mutex<BTreeMap<u32, ThreadRole>> = Mutex::new(BTreeMap::new());
/// OS threads whose role is kept for the sampler, at most.
pub const MAX_OS_ROLES: usize = 4096;

struct OsEntry(Cell<Option<u32>>);

impl Drop for OsEntry {
    fn drop(&mut self) {
        if let (Some(tid), Ok(mut roles)) = (self.0.get(), OS_ROLES.lock()) {
            roles.remove(&tid);
        }
    }
}

/// The calling thread's OS id (Linux; the host sampler reads threads there only).
#[cfg(target_os = "linux")]
fn os_tid() -> Option<u32> {
    // SAFETY: gettid has no preconditions.
    Some(unsafe { libc::gettid() } as u32)
}

#[cfg(not(target_os = "linux"))]
fn os_tid() -> Option<u32> {
    None
}

/// Keeps the calling thread's role under its OS id, for this process's host sampler
/// ([`os_thread_roles`]), until the thread ends.
pub(crate) fn remember_os_role(role: ThreadRole) {
    if let (Some(tid), Ok(mut roles)) = (os_tid(), OS_ROLES.lock()) {
        if roles.len() < MAX_OS_ROLES || roles.contains_key(&tid) {
            roles.insert(tid, role);
            let _ = OS_ENTRY.try_with(|e| e.0.set(Some(tid)));
        }
    }
}

/// Every role this process's threads were given, by OS id (a thread not in it has none, or is
/// another process's), as one reading: the host sampler's, once a sample. A lock waited for,
/// not tried: a thread whose role a busy lock hid would drop out of one sample and count all
/// its CPU since birth in the next.
pub fn os_thread_roles() -> BTreeMap<u32, ThreadRole> {
    OS_ROLES.lock().map(|r| r.clone()).unwrap_or_else(|e| e.into_inner().clone())
}

/// In a child process right after `fork`: the parent's roles are its threads', which do not
/// exist here.
pub(crate) fn forget_after_fork() {
    let _ = OS_ENTRY.try_with(|e| e.0.set(None));
    if let Ok(mut roles) = OS_ROLES.try_lock() {
        roles.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roles_thread_name_and_worker() {
        // (role, the name pipeprof gives it, the worker's name)
        let table = [
            (ThreadRole::Train, "train", None),
            (ThreadRole::Compute(3), "compute-3", None),
            (ThreadRole::loader(1), "loader-1", Some("loader-1")),
            (ThreadRole::Loader { worker: 1, generation: 2 }, "loader-1.2", Some("loader-1")),
            (ThreadRole::Other, "thread", None),
        ];
        for (role, name, worker) in table {
            assert_eq!(role.thread_name(), name, "{role:?}");
            assert_eq!(role.worker_name().as_deref(), worker, "{role:?}");
        }
        assert!(ThreadRole::Train.runs_the_model() && ThreadRole::Compute(0).runs_the_model());
        assert!(!ThreadRole::loader(0).runs_the_model() && !ThreadRole::Other.runs_the_model());
    }

    #[test]
    fn roles_serialise_as_typed_json() {
        let table = [
            (ThreadRole::Train, r#""train""#),
            (ThreadRole::Compute(2), r#"{"compute":2}"#),
            (ThreadRole::Loader { worker: 1, generation: 3 }, r#"{"loader":{"worker":1,"generation":3}}"#),
            (ThreadRole::Other, r#""other""#),
        ];
        for (role, json) in table {
            assert_eq!(serde_json::to_string(&role).unwrap(), json);
            assert_eq!(serde_json::from_str::<ThreadRole>(json).unwrap(), role);
        }
        // A generation left out is the first.
        assert_eq!(serde_json::from_str::<ThreadRole>(r#"{"loader":{"worker":4}}"#).unwrap(), ThreadRole::loader(4));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_sampler_finds_a_threads_role_by_os_id_while_the_thread_lives() {
        let (tid, seen) = std::thread::spawn(|| {
            remember_os_role(ThreadRole::Compute(7));
            let tid = os_tid().unwrap();
            (tid, os_thread_roles().get(&tid).copied())
        })
        .join()
        .unwrap();
        assert_eq!(seen, Some(ThreadRole::Compute(7)));
        // The thread ended: its OS id is free again, and so is its role.
        assert_eq!(os_thread_roles().get(&tid), None);
        assert_eq!(os_thread_roles().get(&os_tid().unwrap()), None, "another thread's role is not this one's");
    }
}
