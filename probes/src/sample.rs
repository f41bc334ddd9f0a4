//! What the samplers measure, as it travels: a host sample (CPU, memory, storage, the named
//! threads) and a GPU sample (every device, or why GPU sampling is off). Types only: the
//! samplers that take them are in [`crate::sampler`], the event that carries them in
//! [`crate::event`].

use crate::role::ThreadRole;

/// One host sample: CPU, memory, storage I/O and the named threads' CPU.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct HostSample {
    /// When it was taken, monotonic ns ([`crate::clock::now_ns`]).
    pub t_ns: u64,
    /// Whole-machine CPU busy %, 0–100 (average over cores).
    #[serde(with = "crate::nonfinite")]
    pub global_cpu_pct: f32,
    /// CPU busy % of each core, 0–100.
    #[serde(with = "crate::nonfinite::vec")]
    pub per_core_pct: Vec<f32>,
    /// The sampled process's CPU % since the previous sample, its descendants' and the
    /// children they reaped included: 100 = one core, never above the machine's cores × 100.
    #[serde(with = "crate::nonfinite")]
    pub process_cpu_pct: f32,
    /// The sampled process's CPU time since it started, ns.
    pub process_cpu_ns: u64,
    /// The program's resident memory, bytes: the sampled process and every process below it
    /// (DataLoader workers, ranks), each one's resident figure added, as `ps` shows it (pages
    /// a forked worker shares with its parent count in each). When the sampled process only
    /// hosts the program (`pipeprof run`), its own memory is not in it but in
    /// `host_rss_bytes`. 0 when every process is gone.
    pub rss_bytes: u64,
    /// Processes whose memory `rss_bytes` adds.
    #[serde(default)]
    pub rss_processes: u32,
    /// The hosting process's own resident memory (pipeprof's, under `pipeprof run`); `None`
    /// when the sampled process is itself the program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_rss_bytes: Option<u64>,
    /// Bytes per second the process caused to be read from storage (page-cache hits are not
    /// counted); `None` = not measurable here (no `/proc/<pid>/io`, or the kernel does not
    /// account storage reads per process).
    #[serde(with = "crate::nonfinite::option", default)]
    pub read_bytes_per_s: Option<f64>,
    /// Bytes per second the process caused to be written to storage; `None` = not measurable.
    #[serde(with = "crate::nonfinite::option", default)]
    pub write_bytes_per_s: Option<f64>,
    /// Bytes per second returned by the process's read system calls, from any source: storage,
    /// page cache, FUSE, network filesystems, pipes. Corroborates `read_bytes_per_s` where
    /// that one cannot see (network and FUSE reads never reach a block device).
    #[serde(with = "crate::nonfinite::option", default)]
    pub syscall_read_bytes_per_s: Option<f64>,
    /// Whole-machine % of CPU time idle while waiting for I/O, from `/proc/stat`; `None`
    /// when unavailable.
    #[serde(with = "crate::nonfinite::option", default)]
    pub iowait_pct: Option<f32>,
    /// CPU of the process's threads that were given a role ([`crate::set_thread_role`]).
    pub threads: Vec<ThreadCpu>,
    /// Whole-machine % of CPU time stolen by the hypervisor for other guests (a noisy
    /// neighbour on a VM), from `/proc/stat`; `None` when unavailable.
    #[serde(with = "crate::nonfinite::option", default)]
    pub steal_pct: Option<f32>,
    /// The busiest other programs (by name, all their processes together), busiest first;
    /// refreshed about once a second (listing every process is dearer than the rest of a
    /// sample), empty in between.
    #[serde(default)]
    pub others: Vec<OtherCpu>,
    /// Physical cores of the machine (`/sys/devices/system/cpu/*/topology`): logical cores
    /// that are a core's second hyper-thread are not counted; `None` when not readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_cores: Option<u32>,
}

/// CPU use of another program on the machine: what competes with the sampled process.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct OtherCpu {
    /// Process name.
    pub name: String,
    /// Processes of that name.
    pub processes: u32,
    /// Their CPU % together: 100 = one core.
    #[schemars(with = "crate::nonfinite::Json")]
    #[serde(with = "crate::nonfinite")]
    pub cpu_pct: f32,
}

/// CPU use of one named thread of the sampled process.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ThreadCpu {
    /// OS thread id.
    pub tid: u32,
    /// Thread name (`comm`, at most 15 bytes on Linux).
    pub name: String,
    /// CPU % since the previous sample: 100 = one core.
    #[serde(with = "crate::nonfinite")]
    pub cpu_pct: f32,
    /// CPU time since the thread started, ns (clock-tick resolution, usually 10 ms).
    pub cpu_ns: u64,
    /// Since the thread started, from its `schedstat`: (on-CPU ns, ns runnable without a
    /// core); `None` where the kernel does not say.
    #[serde(default)]
    pub sched_ns: Option<(u64, u64)>,
    /// Its role, where the sampled process is the sampler's own and the thread was given one
    /// ([`crate::set_thread_role`]); left out when [`ThreadRole::Other`].
    #[serde(default, skip_serializing_if = "ThreadRole::is_other")]
    pub role: ThreadRole,
}

/// Whether GPU sampling works, and why not when it does not.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub enum GpuStatus {
    /// NVML answered; the devices are in the sample.
    #[default]
    Ok,
    /// GPU sampling is off; the reason is meant for the report as it stands.
    Off(String),
}

impl GpuStatus {
    /// The reason GPU sampling is off, if it is.
    pub fn off_reason(&self) -> Option<&str> {
        match self {
            GpuStatus::Ok => None,
            GpuStatus::Off(r) => Some(r),
        }
    }
}

/// One GPU sample: every device, or the reason GPU sampling is off.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct GpuSample {
    /// When it was taken, monotonic ns ([`crate::clock::now_ns`]).
    pub t_ns: u64,
    /// Ok, or off with the reason.
    pub status: GpuStatus,
    /// One entry per device NVML lists (empty when off).
    pub devices: Vec<GpuDevice>,
}

impl GpuSample {
    /// A sample saying GPU sampling is off, and why.
    pub fn off(t_ns: u64, reason: impl Into<String>) -> Self {
        GpuSample { t_ns, status: GpuStatus::Off(reason.into()), devices: Vec::new() }
    }
}

/// One GPU as NVML reports it. Every field NVML failed to give is `None`.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct GpuDevice {
    /// NVML device index.
    pub index: u32,
    /// Device name (`GPU <index>` when NVML could not tell).
    pub name: String,
    /// % of the last sample period (1/6 s to 1 s) in which at least one kernel ran: a coarse
    /// signal, to be corroborated.
    #[serde(with = "crate::nonfinite::option", default)]
    pub util_pct: Option<f32>,
    /// % of the last sample period in which device memory was read or written.
    #[serde(with = "crate::nonfinite::option", default)]
    pub mem_util_pct: Option<f32>,
    /// Device memory in use by all processes, bytes.
    pub mem_used_bytes: Option<u64>,
    /// Device memory, bytes.
    pub mem_total_bytes: Option<u64>,
    /// PCIe host-to-device bytes per second (NVML averages over 20 ms).
    #[serde(with = "crate::nonfinite::option", default)]
    pub pcie_rx_bytes_per_s: Option<f64>,
    /// PCIe device-to-host bytes per second.
    #[serde(with = "crate::nonfinite::option", default)]
    pub pcie_tx_bytes_per_s: Option<f64>,
    /// Board power draw, watts.
    #[serde(with = "crate::nonfinite::option", default)]
    pub power_w: Option<f32>,
    /// Streaming-multiprocessor clock, MHz.
    pub sm_clock_mhz: Option<u32>,
    /// Whether the sampled process has a compute context on this device; `None` = cannot
    /// tell (see [`ProcessMatch`] for how it is recognised inside a container).
    pub this_process_on_gpu: Option<bool>,
    /// How the sampled process was recognised, when it was.
    pub process_match: Option<ProcessMatch>,
    /// Device memory used by the sampled process, bytes (`None`: not on the device, or NVML
    /// does not say, as under MIG or without the permission).
    pub process_mem_used_bytes: Option<u64>,
    /// PCIe generation the link can reach (device and slot).
    pub pcie_gen_max: Option<u32>,
    /// PCIe generation now: an idle GPU drops to a lower one to save power.
    pub pcie_gen_current: Option<u32>,
    /// PCIe lanes the link can use.
    pub pcie_width_max: Option<u32>,
    /// PCIe lanes in use now.
    pub pcie_width_current: Option<u32>,
    /// The run's processes NVML lists on this device (at most [`MAX_RUN_PROCESSES`]).
    #[serde(default)]
    pub run_processes: Vec<RunProcess>,
}

/// Processes of the run listed per device at most: a distributed run's ranks and workers.
pub const MAX_RUN_PROCESSES: usize = 32;

/// One of the run's processes with a compute context on a device.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct RunProcess {
    /// Its PID (NVML's, which is this namespace's outside a container).
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), empty when unreadable.
    pub name: String,
    /// Device memory it uses, bytes, when NVML says.
    pub mem_bytes: Option<u64>,
}

/// How the sampled process was found among the compute processes NVML lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessMatch {
    /// NVML listed its PID.
    Pid,
    /// Inside a PID namespace (a container) NVML lists host PIDs, which mean nothing here.
    /// The process has CUDA open (`/dev/nvidia-uvm`) and NVML lists exactly one process
    /// that does not exist in this namespace: taken to be this one.
    SoleForeignProcess,
}
