//! Host and GPU samplers: what the machine was doing while the pipeline ran.
//!
//! [`start`] spawns one thread per sampler (`pp-sampler` for the host, `pp-gpu` for NVML, so a
//! slow driver call never delays host samples). Each takes a sample per tick and sends it as
//! [`Event::Host`] / [`Event::Gpu`] through the same [`Probe`] as the spans, timestamped with
//! [`clock::now_ns`]. A sampler that falls behind skips the ticks it missed instead of
//! queueing them. [`SamplerHandle::stop`] takes one last sample, so even a run shorter than a
//! tick has data.
//!
//! Turning samples into run totals is the profiler's job (`pipeprof::aggregate::machine`): a
//! program that links this crate only samples and sends.

mod gpu;
mod host;

pub use gpu::{
    is_below, match_run, process_name, GpuInitError, GpuSampler, ListedProcess, ProcessOnDevice, Watch,
    HIDDEN_USE_BYTES, NVML_LIB_ENV,
};
pub use host::{
    cpu_pct, io_accounting_here, iowait_pct, parse_proc_io, parse_proc_stat_total, parse_task_stat,
    probe_io_accounting, rate_per_s, steal_pct, storage_reads_measurable, top_others, CpuTimes, HostSampler,
    IoAccounting, ProcIo, TaskStat,
};

use crate::clock;
use crate::event::Event;
use crate::probe::Probe;
use crate::role::ThreadRole;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

/// Default sampling rate: 5 Hz, the fastest at which sysinfo's CPU figures are meaningful
/// (it needs ≥ 200 ms between CPU refreshes).
pub const DEFAULT_HZ: f64 = 5.0;

/// One host sample: CPU, memory, storage I/O and the named threads' CPU.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct HostSample {
    /// When it was taken, monotonic ns ([`clock::now_ns`]).
    pub t_ns: u64,
    /// Whole-machine CPU busy %, 0–100 (average over cores).
    #[serde(with = "crate::nonfinite")]
    pub global_cpu_pct: f32,
    /// CPU busy % of each core, 0–100.
    #[serde(with = "crate::nonfinite::vec")]
    pub per_core_pct: Vec<f32>,
    /// The sampled process's CPU % since the previous sample: 100 = one core.
    #[serde(with = "crate::nonfinite")]
    pub process_cpu_pct: f32,
    /// The sampled process's CPU time since it started, ns.
    pub process_cpu_ns: u64,
    /// The sampled process's resident memory, bytes (0 when the process is gone).
    pub rss_bytes: u64,
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
    /// CPU of the process's threads whose names start with one of the configured prefixes.
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
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct OtherCpu {
    /// Process name.
    pub name: String,
    /// Processes of that name.
    pub processes: u32,
    /// Their CPU % together: 100 = one core.
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
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
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
    /// When it was taken, monotonic ns ([`clock::now_ns`]).
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
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RunProcess {
    /// Its PID (NVML's, which is this namespace's outside a container).
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`), empty when unreadable.
    pub name: String,
    /// Device memory it uses, bytes, when NVML says.
    pub mem_bytes: Option<u64>,
}

/// How the sampled process was found among the compute processes NVML lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessMatch {
    /// NVML listed its PID.
    Pid,
    /// Inside a PID namespace (a container) NVML lists host PIDs, which mean nothing here.
    /// The process has CUDA open (`/dev/nvidia-uvm`) and NVML lists exactly one process
    /// that does not exist in this namespace: taken to be this one.
    SoleForeignProcess,
}

/// What [`start`] samples and how often.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Samples per second for both samplers (default 5; clamped to 0.1–100). Above 5 Hz the
    /// global and per-core CPU figures repeat between sysinfo's 200 ms refreshes.
    pub hz: f64,
    /// Whether to start the GPU sampler.
    pub gpu: bool,
    /// Threads of the sampled process whose names start with one of these get per-thread CPU;
    /// empty = none (saves reading every thread's `/proc` entry).
    pub thread_prefixes: Vec<String>,
    /// The process to sample (default: this one).
    pub pid: u32,
    /// Whether processes started below `pid` count as the run's on a GPU (`pipeprof run`:
    /// the program, its workers, its ranks); default no.
    pub gpu_tree: bool,
    /// NVML library to load instead of `libnvidia-ml.so.1` (default: `$PIPEPROF_NVML_LIB`).
    pub nvml_lib: Option<PathBuf>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            hz: DEFAULT_HZ,
            gpu: true,
            thread_prefixes: vec!["loader".to_string(), "train".to_string()],
            pid: std::process::id(),
            gpu_tree: false,
            nvml_lib: std::env::var_os(NVML_LIB_ENV).filter(|v| !v.is_empty()).map(PathBuf::from),
        }
    }
}

impl SamplerConfig {
    /// The tick period, from `hz` clamped to 0.1–100 Hz (NaN gives the default).
    pub fn period(&self) -> Duration {
        let hz = if self.hz.is_finite() { self.hz.clamp(0.1, 100.0) } else { DEFAULT_HZ };
        Duration::from_secs_f64(1.0 / hz)
    }
}

/// Errors starting the samplers.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// sysinfo could not initialise on this platform.
    #[error("host sampler unavailable: {0}")]
    Host(String),
    /// The OS refused a thread.
    #[error("could not spawn sampler thread {name}: {source}")]
    Spawn {
        /// Thread name.
        name: &'static str,
        /// Why.
        source: std::io::Error,
    },
}

/// What one sampler thread did, returned by [`SamplerHandle::stop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SamplerStats {
    /// Samples sent (including the final one).
    pub samples: u64,
    /// Ticks skipped because a sample took longer than the period.
    pub skipped_ticks: u64,
    /// CPU time the sampler thread used, ns: its overhead.
    pub cpu_ns: u64,
}

/// Running samplers; stop them with [`SamplerHandle::stop`] (dropping also stops them).
#[derive(Debug)]
pub struct SamplerHandle {
    // Dropping the sender disconnects the channel: that is the stop signal for every thread.
    stop: Option<Sender<()>>,
    host: Option<JoinHandle<SamplerStats>>,
    gpu: Option<JoinHandle<SamplerStats>>,
}

/// Stats of both sampler threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StopStats {
    /// The host sampler.
    pub host: SamplerStats,
    /// The GPU sampler (zero when not started).
    pub gpu: SamplerStats,
    /// The sampler thread that panicked, if one did (its message went to stderr): the run's
    /// machine figures stop where it died.
    pub died: Option<&'static str>,
}

impl SamplerHandle {
    /// Stops the samplers after one final sample each and waits for them.
    pub fn stop(mut self) -> StopStats {
        self.shutdown()
    }

    fn shutdown(&mut self) -> StopStats {
        self.stop.take();
        // A panicked sampler thread has no stats; it is named so that the run can fail.
        let mut died = None;
        let mut join = |h: Option<JoinHandle<SamplerStats>>, name: &'static str| match h.map(|h| h.join()) {
            Some(Ok(s)) => s,
            Some(Err(_)) => {
                died = died.or(Some(name));
                SamplerStats::default()
            }
            None => SamplerStats::default(),
        };
        let host = join(self.host.take(), "pp-sampler (host sampler)");
        let gpu = join(self.gpu.take(), "pp-gpu (GPU sampler)");
        StopStats { host, gpu, died }
    }
}

impl Drop for SamplerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts the host sampler and, if `cfg.gpu`, the GPU sampler, sending through `probe`.
///
/// GPU trouble never fails this: a missing driver becomes one [`GpuSample`] whose status says
/// why GPU sampling is off.
pub fn start(probe: Probe, cfg: SamplerConfig) -> Result<SamplerHandle, SamplerError> {
    let period = cfg.period();
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
    let mut host = HostSampler::new(cfg.pid, cfg.thread_prefixes.clone(), IoAccounting::ASSUMED)?;
    let host_probe = probe.clone();
    let host_stop = stop_rx.clone();
    let host_thread = std::thread::Builder::new()
        .name("pp-sampler".into())
        .spawn(move || {
            // Probing I/O accounting writes and reads a small file: done here, off the
            // caller's thread, and before the baseline so its bytes are not in any rate.
            host.set_io_accounting(io_accounting_here());
            run_ticks(period, &host_stop, || {
                host_probe.send(Event::Host(Box::new(host.sample())));
            })
        })
        .map_err(|source| SamplerError::Spawn { name: "pp-sampler", source })?;
    let mut handle = SamplerHandle { stop: Some(stop_tx), host: Some(host_thread), gpu: None };
    if cfg.gpu {
        let gpu_thread = std::thread::Builder::new()
            .name("pp-gpu".into())
            .spawn(move || {
                let watch = if cfg.gpu_tree { gpu::Watch::Tree(cfg.pid) } else { gpu::Watch::Process(cfg.pid) };
                let mut gpu = match GpuSampler::open(cfg.nvml_lib.as_deref(), watch) {
                    Ok(g) => g,
                    Err(e) => {
                        // Once, then stop: a missing driver will not appear mid-run, and
                        // retrying would only repeat the same failure every tick.
                        probe.send(Event::Gpu(Box::new(GpuSample::off(clock::now_ns(), e.to_string()))));
                        return SamplerStats { samples: 1, skipped_ticks: 0, cpu_ns: clock::thread_cpu_ns() };
                    }
                };
                // A first sample at once: NVML's figures need no baseline.
                probe.send(Event::Gpu(Box::new(gpu.sample())));
                let mut stats = run_ticks(period, &stop_rx, || {
                    probe.send(Event::Gpu(Box::new(gpu.sample())));
                });
                stats.samples += 1;
                stats
            })
            .map_err(|source| SamplerError::Spawn { name: "pp-gpu", source })?;
        handle.gpu = Some(gpu_thread);
    }
    Ok(handle)
}

/// Calls `tick` every `period` until `stop` disconnects, then once more. Returns its stats.
fn run_ticks(period: Duration, stop: &Receiver<()>, mut tick: impl FnMut()) -> SamplerStats {
    let period_ns = period.as_nanos().max(1) as u64;
    let start = clock::now_ns();
    let mut stats = SamplerStats::default();
    let mut k = 1u64;
    loop {
        let deadline = start.saturating_add(k.saturating_mul(period_ns));
        let wait = Duration::from_nanos(deadline.saturating_sub(clock::now_ns()));
        match stop.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {}
            // Disconnected (or a stray message): stop after a final sample.
            _ => break,
        }
        tick();
        stats.samples += 1;
        let (next, skipped) = next_tick(start, period_ns, k, clock::now_ns());
        stats.skipped_ticks += skipped;
        k = next;
    }
    tick();
    stats.samples += 1;
    stats.cpu_ns = clock::thread_cpu_ns();
    stats
}

/// After tick `k` (due at `start + k·period`) finished at `now`: the next tick to wait for
/// (the first one still in the future) and how many were skipped on the way.
pub fn next_tick(start_ns: u64, period_ns: u64, k: u64, now_ns: u64) -> (u64, u64) {
    let period_ns = period_ns.max(1);
    let elapsed = now_ns.saturating_sub(start_ns) / period_ns;
    let next = (elapsed + 1).max(k + 1);
    (next, next - k - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_time_tick_skips_nothing() {
        assert_eq!(next_tick(1_000, 100, 1, 1_150), (2, 0));
        // Woken slightly early (timer slack): still the next tick, never the same one again.
        assert_eq!(next_tick(1_000, 100, 3, 1_290), (4, 0));
    }

    #[test]
    fn late_tick_skips_missed_ticks_instead_of_queueing() {
        // Tick 1 due at 1100 finished at 1_420: ticks 2, 3 and 4 (1200..1400) are gone.
        assert_eq!(next_tick(1_000, 100, 1, 1_420), (5, 3));
    }

    #[test]
    fn period_clamps_silly_rates() {
        let cfg = |hz| SamplerConfig { hz, ..SamplerConfig::default() };
        assert_eq!(cfg(5.0).period(), Duration::from_millis(200));
        assert_eq!(cfg(0.0).period(), Duration::from_secs(10));
        assert_eq!(cfg(1e9).period(), Duration::from_millis(10));
        assert_eq!(cfg(f64::NAN).period(), Duration::from_millis(200));
    }

    #[test]
    fn off_sample_carries_reason() {
        let s = GpuSample::off(7, "no driver");
        assert_eq!(s.status.off_reason(), Some("no driver"));
        assert!(s.devices.is_empty());
        assert_eq!(GpuStatus::Ok.off_reason(), None);
    }
}
