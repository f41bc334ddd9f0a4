//! The GPU sampler: NVML through nvml-wrapper, which loads the driver library at run time.

use super::{GpuDevice, GpuSample, GpuStatus, ProcessMatch, RunProcess, MAX_RUN_PROCESSES};
use crate::clock;
use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::path::Path;

/// Environment variable naming an NVML library to load instead of `libnvidia-ml.so.1`
/// (for example the fake driver built by `fake_nvml::build` in the pipeprof-fake-nvml test crate).
pub const NVML_LIB_ENV: &str = "PIPEPROF_NVML_LIB";

/// The library nvml-wrapper loads by default on Linux.
const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Why GPU sampling is off. The messages are written for the end-of-run report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuInitError {
    /// The default library is not installed: no NVIDIA driver on this machine.
    #[error("no NVIDIA driver ({DEFAULT_LIB} not found): GPU sampling off")]
    NoDriver {
        /// The loader's message.
        detail: String,
    },
    /// The library exists (or was named) but could not be loaded.
    #[error("NVML library {lib} could not be loaded ({detail}): GPU sampling off; check {NVML_LIB_ENV}")]
    NotLoadable {
        /// Which library.
        lib: String,
        /// The loader's message.
        detail: String,
    },
    /// The library loaded but has no `nvmlInit_v2`: not NVML, or far too old.
    #[error("NVML library {lib} has no nvmlInit_v2 ({detail}): GPU sampling off")]
    NoInit {
        /// Which library.
        lib: String,
        /// The loader's message.
        detail: String,
    },
    /// `nvmlInit_v2` returned an error: a driver problem (not loaded, version mismatch, ...).
    #[error("NVML init failed: nvmlInit_v2 returned {code} ({message}): GPU sampling off")]
    InitFailed {
        /// The NVML return code.
        code: u32,
        /// nvml-wrapper's description of it.
        message: String,
    },
    /// NVML initialised but could not count devices.
    #[error("NVML could not count GPUs ({message}): GPU sampling off")]
    CountFailed {
        /// nvml-wrapper's description.
        message: String,
    },
    /// NVML initialised and lists no device.
    #[error("NVIDIA driver present but it lists no GPU: GPU sampling off")]
    NoDevices,
}

impl GpuInitError {
    /// Classifies an error from `Nvml::init` for library `lib` (`None` = the default one).
    fn from_init(lib: Option<&Path>, err: NvmlError) -> Self {
        let name = lib.map_or_else(|| DEFAULT_LIB.to_string(), |p| p.display().to_string());
        match err {
            NvmlError::LibloadingError(e) => {
                let detail = e.to_string();
                // dlopen's wording for a file that is not there; anything else (wrong
                // architecture, a missing dependency) means the library exists but is broken.
                let missing = detail.contains("No such file") || detail.contains("cannot open shared object");
                if lib.is_none() && missing {
                    GpuInitError::NoDriver { detail }
                } else {
                    GpuInitError::NotLoadable { lib: name, detail }
                }
            }
            NvmlError::FailedToLoadSymbol(detail) => GpuInitError::NoInit { lib: name, detail },
            other => {
                let message = other.to_string();
                GpuInitError::InitFailed { code: other.into(), message }
            }
        }
    }
}

/// One compute process as NVML lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedProcess {
    /// PID as NVML sees it: the host's PID namespace, whatever namespace the caller is in.
    pub pid: u32,
    /// Device memory it uses, bytes, when NVML says.
    pub mem_bytes: Option<u64>,
}

/// Which processes are the run's: the one pipeprof samples, or that one and every process
/// started below it (`pipeprof run`: the program, its DataLoader workers, its ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// This process only (`profile`, and a program that links the probes itself).
    Process(u32),
    /// This process and its descendants.
    Tree(u32),
}

impl Watch {
    /// The process at the top.
    pub fn root(self) -> u32 {
        match self {
            Watch::Process(p) | Watch::Tree(p) => p,
        }
    }
}

/// Device memory in use with no process listed from which the list is taken to hide
/// processes (a container whose PID namespace NVML does not see into): an idle device's
/// own use is a few MiB.
pub const HIDDEN_USE_BYTES: u64 = 256 << 20;

/// What [`match_run`] concluded about the run's processes on one device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessOnDevice {
    /// `Some(true)` on the device, `Some(false)` not, `None` cannot tell.
    pub on_gpu: Option<bool>,
    /// How it was recognised.
    pub how: Option<ProcessMatch>,
    /// Device memory the run's processes use together, bytes (when NVML says for any).
    pub mem_bytes: Option<u64>,
    /// The run's processes NVML lists, as listed.
    pub listed: Vec<ListedProcess>,
}

/// Recognises the run's processes among the compute processes NVML lists for one device.
///
/// NVML always lists host PIDs. Outside a container they are ours to test with `ours` (the
/// sampled process, or anything below it). Inside a PID namespace (`namespaced`) they mean
/// nothing here: a listed PID that does not exist here (`exists_here`) is foreign, and when
/// the run has CUDA open (`uses_cuda`, `None` = cannot tell) and exactly one foreign process
/// is listed, that one is taken to be the run's. Several foreign processes: cannot tell which.
/// An empty list while `mem_used` is at least [`HIDDEN_USE_BYTES`] hides its processes: the
/// answer is "cannot tell", never "not used".
pub fn match_run(
    listed: &[ListedProcess],
    ours: impl Fn(u32) -> bool,
    namespaced: bool,
    mem_used: Option<u64>,
    uses_cuda: impl FnOnce() -> Option<bool>,
    exists_here: impl Fn(u32) -> bool,
) -> ProcessOnDevice {
    let mine: Vec<ListedProcess> = listed.iter().copied().filter(|p| ours(p.pid)).collect();
    if !mine.is_empty() {
        let mem = mine.iter().filter_map(|p| p.mem_bytes).reduce(|a, b| a.saturating_add(b));
        return ProcessOnDevice { on_gpu: Some(true), how: Some(ProcessMatch::Pid), mem_bytes: mem, listed: mine };
    }
    let not_here = ProcessOnDevice { on_gpu: Some(false), ..ProcessOnDevice::default() };
    if listed.is_empty() && mem_used.is_some_and(|m| m >= HIDDEN_USE_BYTES) {
        return ProcessOnDevice::default();
    }
    if !namespaced {
        return not_here;
    }
    let mut foreign = listed.iter().filter(|p| !exists_here(p.pid));
    let (Some(only), None) = (foreign.next(), foreign.next()) else {
        // No foreign process: every listed one lives here and none is ours. Several: unknown.
        let none_foreign = listed.iter().all(|p| exists_here(p.pid));
        return if none_foreign { not_here } else { ProcessOnDevice::default() };
    };
    match uses_cuda() {
        Some(true) => ProcessOnDevice {
            on_gpu: Some(true),
            how: Some(ProcessMatch::SoleForeignProcess),
            mem_bytes: only.mem_bytes,
            listed: vec![*only],
        },
        Some(false) => not_here,
        None => ProcessOnDevice::default(),
    }
}

/// The parent of `pid`, from `/proc/PID/stat` (the field after the command name, which may
/// itself hold spaces and parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Longest parent chain followed: process trees are shallow, and a loop (a PID reused while
/// walking) must end.
const MAX_DEPTH: usize = 64;

/// Whether `pid` is `root` or runs below it, by walking its parents.
pub fn is_below(pid: u32, root: u32, parent: impl Fn(u32) -> Option<u32>) -> bool {
    let mut p = pid;
    for _ in 0..MAX_DEPTH {
        if p == root {
            return true;
        }
        match parent(p) {
            Some(q) if q != 0 && q != p => p = q,
            _ => return false,
        }
    }
    false
}

/// A process's command name (`/proc/PID/comm`), printable, at most 15 characters.
pub fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim_end().chars().filter(|c| !c.is_control()).take(15).collect())
        .unwrap_or_default()
}

/// Whether any process of `watch` has CUDA open (see [`uses_cuda`]); `None` when none could
/// be read and none had it.
fn watch_uses_cuda(watch: Watch) -> Option<bool> {
    let root = watch.root();
    match watch {
        Watch::Process(_) => uses_cuda(root),
        Watch::Tree(_) => {
            let mut seen = uses_cuda(root);
            for pid in all_pids().into_iter().filter(|&p| p != root && is_below(p, root, parent_of)) {
                match uses_cuda(pid) {
                    Some(true) => return Some(true),
                    Some(false) => seen = seen.or(Some(false)),
                    None => {}
                }
            }
            seen
        }
    }
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Whether this process sees PIDs through its own namespace (a container): kernel threads,
/// and with them `kthreadd` at PID 2, are visible only from the host's namespace.
fn pid_namespaced() -> bool {
    std::fs::read_to_string("/proc/2/comm").map_or(true, |c| c.trim_end() != "kthreadd")
}

/// Whether `pid` has CUDA open: CUDA opens `/dev/nvidia-uvm` when it initialises, NVML does
/// not. `None` when its file descriptors cannot be read (another user's process).
fn uses_cuda(pid: u32) -> Option<bool> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == "/dev/nvidia-uvm")))
}

fn exists_here(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Samples every GPU NVML lists. Holds NVML open (shut down on drop).
pub struct GpuSampler {
    nvml: Nvml,
    count: u32,
    watch: Watch,
    namespaced: bool,
}

impl std::fmt::Debug for GpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSampler").field("count", &self.count).field("watch", &self.watch).finish_non_exhaustive()
    }
}

impl GpuSampler {
    /// Loads NVML (`lib`, or `libnvidia-ml.so.1` when `None`) and counts the devices; `watch`
    /// names the processes whose compute contexts are looked for.
    pub fn open(lib: Option<&Path>, watch: Watch) -> Result<Self, GpuInitError> {
        let nvml = match lib {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|e| GpuInitError::from_init(lib, e))?;
        let count = nvml.device_count().map_err(|e| GpuInitError::CountFailed { message: e.to_string() })?;
        if count == 0 {
            return Err(GpuInitError::NoDevices);
        }
        Ok(GpuSampler { nvml, count, watch, namespaced: pid_namespaced() })
    }

    /// Devices found at open.
    pub fn device_count(&self) -> u32 {
        self.count
    }

    /// One sample of every device. Each field NVML fails to give is `None`; never panics.
    pub fn sample(&mut self) -> GpuSample {
        let t_ns = clock::now_ns();
        let devices = (0..self.count).map(|i| self.device(i)).collect();
        GpuSample { t_ns, status: GpuStatus::Ok, devices }
    }

    fn device(&self, index: u32) -> GpuDevice {
        let mut d = GpuDevice { index, name: format!("GPU {index}"), ..GpuDevice::default() };
        // A device that vanished (fell off the bus) keeps its row, with nothing known.
        let Ok(dev) = self.nvml.device_by_index(index) else {
            return d;
        };
        if let Ok(name) = dev.name() {
            d.name = name;
        }
        if let Ok(u) = dev.utilization_rates() {
            d.util_pct = Some(u.gpu as f32);
            d.mem_util_pct = Some(u.memory as f32);
        }
        if let Ok(m) = dev.memory_info() {
            d.mem_used_bytes = Some(m.used);
            d.mem_total_bytes = Some(m.total);
        }
        // NVML reports KB/s (1024 bytes).
        d.pcie_rx_bytes_per_s = dev.pcie_throughput(PcieUtilCounter::Receive).ok().map(|k| k as f64 * 1024.0);
        d.pcie_tx_bytes_per_s = dev.pcie_throughput(PcieUtilCounter::Send).ok().map(|k| k as f64 * 1024.0);
        d.power_w = dev.power_usage().ok().map(|mw| mw as f32 / 1000.0);
        d.sm_clock_mhz = dev.clock_info(Clock::SM).ok();
        // Each call may be missing from an older driver (nvml-wrapper then returns an error):
        // the field stays unknown and the rest of the sample survives.
        d.pcie_gen_max = dev.max_pcie_link_gen().ok();
        d.pcie_gen_current = dev.current_pcie_link_gen().ok();
        d.pcie_width_max = dev.max_pcie_link_width().ok();
        d.pcie_width_current = dev.current_pcie_link_width().ok();
        if let Ok(ps) = dev.running_compute_processes() {
            let listed: Vec<ListedProcess> = ps
                .iter()
                .map(|p| ListedProcess {
                    pid: p.pid,
                    mem_bytes: match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => Some(b),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect();
            let watch = self.watch;
            let ours = |pid: u32| match watch {
                Watch::Process(p) => pid == p,
                Watch::Tree(root) => is_below(pid, root, parent_of),
            };
            let m = match_run(&listed, ours, self.namespaced, d.mem_used_bytes, || watch_uses_cuda(watch), exists_here);
            d.this_process_on_gpu = m.on_gpu;
            d.process_match = m.how;
            d.process_mem_used_bytes = m.mem_bytes;
            d.run_processes = m
                .listed
                .iter()
                .take(MAX_RUN_PROCESSES)
                .map(|p| RunProcess { pid: p.pid, name: process_name(p.pid), mem_bytes: p.mem_bytes })
                .collect();
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_default_library_says_no_driver() {
        let e = GpuSampler::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")), Watch::Process(1)).unwrap_err();
        assert!(matches!(e, GpuInitError::NotLoadable { .. }), "{e:?}");
        let msg = GpuInitError::NoDriver { detail: String::new() }.to_string();
        assert_eq!(msg, "no NVIDIA driver (libnvidia-ml.so.1 not found): GPU sampling off");
    }

    fn listed(pids: &[u32]) -> Vec<ListedProcess> {
        pids.iter().map(|&pid| ListedProcess { pid, mem_bytes: Some(u64::from(pid) << 20) }).collect()
    }

    /// name, listed PIDs, namespaced, uses CUDA → on GPU, how, memory.
    type Case = (&'static str, &'static [u32], bool, Option<bool>, Option<bool>, Option<ProcessMatch>, Option<u64>);

    #[test]
    fn process_recognition_by_pid_and_inside_a_container() {
        use ProcessMatch::*;
        // PIDs 1–100 exist here; larger ones are host PIDs seen from inside a container.
        let here = |p: u32| p <= 100;
        #[rustfmt::skip]
        let table: &[Case] = &[
            // name,                                 listed,        ns,    cuda,        on_gpu,      how,                      mem
            ("own pid listed",                       &[7, 5000],    false, None,        Some(true),  Some(Pid),                Some(7 << 20)),
            ("own pid listed in a container",        &[7],          true,  Some(false), Some(true),  Some(Pid),                Some(7 << 20)),
            ("no container: not listed = not here",  &[5000],       false, Some(true),  Some(false), None,                     None),
            ("nothing listed",                       &[],           true,  Some(true),  Some(false), None,                     None),
            ("container, CUDA open, one foreign",    &[5000],       true,  Some(true),  Some(true),  Some(SoleForeignProcess), Some(5000 << 20)),
            ("container, one foreign + local ones",  &[3, 5000],    true,  Some(true),  Some(true),  Some(SoleForeignProcess), Some(5000 << 20)),
            ("container, CUDA not open",             &[5000],       true,  Some(false), Some(false), None,                     None),
            ("container, fds unreadable",            &[5000],       true,  None,        None,        None,                     None),
            ("container, two foreign: which one?",   &[5000, 6000], true,  Some(true),  None,        None,                     None),
            ("container, only local others",         &[3, 4],       true,  Some(true),  Some(false), None,                     None),
        ];
        for &(name, pids, ns, cuda, on_gpu, how, mem) in table {
            let m = match_run(&listed(pids), |p| p == 7, ns, Some(0), || cuda, here);
            assert_eq!((m.on_gpu, m.how, m.mem_bytes), (on_gpu, how, mem), "{name}");
        }
    }

    #[test]
    fn the_runs_child_and_workers_are_the_run_and_hidden_processes_are_unknown() {
        // pipeprof 840 started python 845, whose DataLoader workers are 850 and 851; 900 is
        // another user's job. Outside a container.
        let parent = |p: u32| match p {
            845 => Some(840),
            850 | 851 => Some(845),
            840 | 900 => Some(1),
            _ => None,
        };
        let ours = |p: u32| is_below(p, 840, parent);
        let m = match_run(&listed(&[845, 850, 900]), ours, false, Some(2 << 30), || None, |_| true);
        assert_eq!(m.on_gpu, Some(true));
        assert_eq!(m.how, Some(ProcessMatch::Pid));
        assert_eq!(m.listed.iter().map(|p| p.pid).collect::<Vec<_>>(), [845, 850]);
        assert_eq!(m.mem_bytes, Some((845 << 20) + (850 << 20)));
        // Only a stranger listed: not ours.
        let m = match_run(&listed(&[900]), ours, false, Some(2 << 30), || None, |_| true);
        assert_eq!(m.on_gpu, Some(false));
        // Nothing listed and the device idle: not ours. Nothing listed while 2 GiB are in
        // use: someone's processes are hidden (a container), so it cannot be told.
        assert_eq!(match_run(&[], ours, false, Some(3 << 20), || None, |_| true).on_gpu, Some(false));
        assert_eq!(match_run(&[], ours, false, Some(2 << 30), || None, |_| true).on_gpu, None);
        assert_eq!(match_run(&[], ours, false, None, || None, |_| true).on_gpu, Some(false));
        // The root alone, and a chain that loops, end.
        assert!(is_below(840, 840, parent));
        assert!(!is_below(900, 840, parent));
        assert!(!is_below(5, 840, |p| Some(p + 1 - 1)));
    }

    #[test]
    fn this_process_is_below_its_parent_by_proc() {
        let me = std::process::id();
        let parent = parent_of(me).expect("own stat readable");
        assert!(is_below(me, parent, parent_of));
        assert!(!is_below(parent, me, parent_of));
        assert!(!process_name(me).is_empty());
    }

    #[test]
    fn this_process_without_cuda_has_no_nvidia_uvm_open() {
        assert_eq!(uses_cuda(std::process::id()), Some(false));
        assert!(exists_here(std::process::id()));
        assert!(!exists_here(u32::MAX));
    }

    #[test]
    fn init_error_codes_are_named() {
        let e = GpuInitError::from_init(None, NvmlError::DriverNotLoaded);
        assert_eq!(e, GpuInitError::InitFailed { code: 9, message: "NVIDIA driver is not loaded".into() });
        assert!(e.to_string().contains("returned 9"));
        let e = GpuInitError::from_init(Some(Path::new("/x.so")), NvmlError::FailedToLoadSymbol("nope".into()));
        assert!(matches!(e, GpuInitError::NoInit { ref lib, .. } if lib == "/x.so"));
    }
}
