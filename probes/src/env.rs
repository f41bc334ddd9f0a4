//! The environment names a run hands its processes, declared once: `pipeprof run`, the attach
//! server and a worker's producer read and set them here, and the Python package reads them
//! from its extension (`pipeprof._native` exports each as a module constant).

pub use crate::attach::wire::TOKEN_ENV;
pub use crate::attach::{LISTEN_ENV, PARENT_ENV, PARENT_PID_ENV};

/// Under `pipeprof run`: the pid of the run's first Python process, its main program (set by
/// that process; `run` clears one the command inherited). A process that sees another pid is
/// one of its workers.
pub const MAIN_PID_ENV: &str = "PIPEPROF_MAIN_PID";
/// In a distributed run (`torchrun`): `RANK:pid` of this rank's first Python process, the
/// rank's program; its DataLoader workers inherit it and are its workers.
pub const RANK_MAIN_ENV: &str = "PIPEPROF_RANK_MAIN";
/// A `pipeprof run --check-advice` re-run: JSON, the loader arguments to set, `steps`, the
/// training steps after which the program is stopped, and a `redirect` of the image folder
/// (to a local copy or a packed file) with the `why_file` the hook writes when it cannot make
/// it (read by the Python start-up hook).
pub const CHECK_ENV: &str = "PIPEPROF_CHECK";
