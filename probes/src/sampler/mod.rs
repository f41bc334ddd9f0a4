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
mod io_accounting;

pub use gpu::{
    is_below, match_run, process_name, GpuInitError, GpuSampler, ListedProcess, ProcessOnDevice, Watch,
    HIDDEN_USE_BYTES, NVML_LIB_ENV,
};
pub use host::{
    capped_cpu_pct, cpu_pct, iowait_pct, parse_proc_stat_total, parse_statm_resident_pages, parse_task_stat,
    rate_per_s, steal_pct, top_others, CpuTimes, HostSampler, TaskStat,
};
pub use io_accounting::{
    io_accounting_here, parse_proc_io, probe_io_accounting, storage_reads_measurable, IoAccounting, ProcIo,
};

pub use crate::sample::{
    GpuDevice, GpuSample, GpuStatus, HostSample, OtherCpu, ProcessMatch, RunProcess, ThreadCpu, MAX_RUN_PROCESSES,
};

use crate::clock;
use crate::event::Event;
use crate::probe::Probe;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

/// Default sampling rate: 5 Hz, the fastest at which sysinfo's CPU figures are meaningful
/// (it needs ≥ 200 ms between CPU refreshes).
pub const DEFAULT_HZ: f64 = 5.0;

/// What [`start`] samples and how often.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Samples per second for both samplers (default 5; clamped to 0.1–100). Above 5 Hz the
    /// global and per-core CPU figures repeat between sysinfo's 200 ms refreshes.
    pub hz: f64,
    /// Whether to start the GPU sampler.
    pub gpu: bool,
    /// Per-thread CPU for the threads given a role where they were made
    /// ([`crate::set_thread_role`]): the sampled process's own, when it is this one (another
    /// process's roles are not known here). Off: none (saves reading every thread's `/proc`
    /// entry). Default on.
    pub thread_roles: bool,
    /// The process to sample (default: this one).
    pub pid: u32,
    /// Whether processes started below `pid` count as the run's on a GPU (`pipeprof run`:
    /// the program, its workers, its ranks); default no.
    pub gpu_tree: bool,
    /// Whether the program is the processes below `pid`, not `pid` itself (`pipeprof run`,
    /// which only hosts it): `pid`'s memory is then reported apart; default no.
    pub program_below: bool,
    /// NVML library to load instead of `libnvidia-ml.so.1` (default: `$PIPEPROF_NVML_LIB`).
    pub nvml_lib: Option<PathBuf>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            hz: DEFAULT_HZ,
            gpu: true,
            thread_roles: true,
            pid: std::process::id(),
            gpu_tree: false,
            program_below: false,
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
    let mut host = HostSampler::new(cfg.pid, cfg.thread_roles, IoAccounting::ASSUMED)?;
    if cfg.program_below {
        host = host.program_below();
    }
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
fn next_tick(start_ns: u64, period_ns: u64, k: u64, now_ns: u64) -> (u64, u64) {
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
