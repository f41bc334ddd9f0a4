//! Host and GPU samples → run totals and a bounded recent series. Pure: no clock, no I/O. The
//! GPU's devices are folded in [`gpu`].

pub mod gpu;

use gpu::{DeviceAcc, DeviceSummary};
use probes::sampler::{GpuStatus, HostSample, OtherCpu, ThreadCpu};
use probes::ThreadRole;
use std::collections::{BTreeMap, VecDeque};

/// How much recent history [`MachineAgg::default`] keeps for live charts: 5 minutes.
pub const DEFAULT_WINDOW_NS: u64 = 300 * 1_000_000_000;

/// Hard cap on points per series, whatever the window: memory stays bounded even at silly
/// sample rates (5 min at 5 Hz is 1,500 points).
pub const MAX_POINTS: usize = 20_000;

/// Threads tracked in the totals; later ones are ignored (a loader that spawns a thread per
/// batch must not grow memory without bound).
pub const MAX_THREADS: usize = 1_024;

/// A GPU at or under this utilisation % counts as idle in [`DeviceSummary::util_idle_share`].
pub const GPU_IDLE_PCT: f32 = 5.0;

/// Running mean and peak of a series that may have gaps.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct MeanMax {
    n: u64,
    sum: f64,
    max: f64,
}

impl MeanMax {
    fn push(&mut self, v: f64) {
        if !v.is_finite() {
            return;
        }
        self.max = if self.n == 0 { v } else { self.max.max(v) };
        self.n += 1;
        self.sum += v;
    }
    fn push_opt(&mut self, v: Option<f64>) {
        if let Some(v) = v {
            self.push(v);
        }
    }
    fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }
    fn peak(&self) -> Option<f64> {
        (self.n > 0).then_some(self.max)
    }
    fn mean32(&self) -> Option<f32> {
        self.mean().map(|v| v as f32)
    }
    fn peak32(&self) -> Option<f32> {
        self.peak().map(|v| v as f32)
    }
}

/// One host sample, reduced for charts.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostPoint {
    /// Monotonic ns.
    pub t_ns: u64,
    /// Process CPU %, 100 = one core.
    pub process_cpu_pct: f32,
    /// Machine CPU %, 0–100.
    pub global_cpu_pct: f32,
    /// Resident memory, bytes.
    pub rss_bytes: u64,
    /// Storage reads, bytes/s (`None` = not measurable).
    pub read_bytes_per_s: Option<f64>,
    /// Storage writes, bytes/s.
    pub write_bytes_per_s: Option<f64>,
    /// iowait %.
    pub iowait_pct: Option<f32>,
}

/// One GPU sample, reduced for charts: per device, in device order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuPoint {
    /// Monotonic ns.
    pub t_ns: u64,
    /// GPU utilisation % per device.
    pub util_pct: Vec<Option<f32>>,
    /// Memory used per device, bytes.
    pub mem_used_bytes: Vec<Option<u64>>,
}

/// Run totals of one named thread.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct ThreadSummary {
    /// OS thread id.
    pub tid: u32,
    /// Name at its last sample.
    pub name: String,
    /// Samples it appeared in.
    pub samples: u64,
    /// Mean CPU %, 100 = one core.
    pub cpu_mean_pct: f32,
    /// Peak CPU %.
    pub cpu_peak_pct: f32,
    /// CPU time at its last sample, ns (since the thread started).
    pub cpu_ns: u64,
    /// Run-queue wait at its last sample, ns (since the thread started): runnable, no core.
    #[serde(default)]
    pub core_wait_ns: Option<u64>,
    /// On-CPU time at its last sample from the scheduler's own count, ns (exact, unlike
    /// `cpu_ns`'s clock ticks).
    #[serde(default)]
    pub sched_cpu_ns: Option<u64>,
    /// What the thread does, when it was given a role (left out for [`ThreadRole::Other`]).
    #[serde(default, skip_serializing_if = "ThreadRole::is_other")]
    pub role: ThreadRole,
}

/// The machine section of a report: what the samplers saw over the run.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct MachineSummary {
    /// Host samples seen.
    pub host_samples: u64,
    /// GPU samples seen (an "off" notice counts).
    pub gpu_samples: u64,
    /// Cores in the last host sample.
    pub cores: usize,
    /// Physical cores, from the last host sample that read them (hyper-threads not counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_cores: Option<usize>,
    /// Mean process CPU %, 100 = one core.
    pub process_cpu_mean_pct: Option<f32>,
    /// Mean process CPU % while it trains: from the first sample after its first training
    /// step to the last sample, so the start-up (imports, workers starting, the first batch)
    /// is left out. `None` before two such samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_cpu_training_pct: Option<f32>,
    /// Peak process CPU %.
    pub process_cpu_peak_pct: Option<f32>,
    /// Process CPU time over the sampled span (last minus first sample), ns.
    pub process_cpu_ns: u64,
    /// Mean machine CPU %, 0–100.
    pub global_cpu_mean_pct: Option<f32>,
    /// Peak machine CPU %.
    pub global_cpu_peak_pct: Option<f32>,
    /// Mean over samples of the busiest core's %: near 100 with a low global mean means one
    /// thread is the limit.
    pub busiest_core_mean_pct: Option<f32>,
    /// Mean over samples of the idlest core's %.
    pub idlest_core_mean_pct: Option<f32>,
    /// Peak resident memory of the program, bytes: its process and every process below it
    /// (workers, ranks), each one's resident figure added.
    pub rss_peak_bytes: Option<u64>,
    /// The program's resident memory at the last sample that saw it running, bytes.
    #[serde(default)]
    pub rss_last_bytes: Option<u64>,
    /// Most processes the program's memory was added over.
    #[serde(default)]
    pub rss_processes_peak: u32,
    /// Peak resident memory of pipeprof itself when it only hosted the program (`pipeprof
    /// run`), bytes; `None` when pipeprof is the program (`profile`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_rss_peak_bytes: Option<u64>,
    /// Mean storage read bytes/s; `None` = not measurable here.
    pub read_bytes_per_s_mean: Option<f64>,
    /// Peak storage read bytes/s.
    pub read_bytes_per_s_peak: Option<f64>,
    /// Mean storage write bytes/s; `None` = not measurable here.
    pub write_bytes_per_s_mean: Option<f64>,
    /// Mean bytes/s returned by read system calls (any source).
    pub syscall_read_bytes_per_s_mean: Option<f64>,
    /// Mean machine iowait %.
    pub iowait_mean_pct: Option<f32>,
    /// Peak machine iowait %.
    pub iowait_peak_pct: Option<f32>,
    /// Mean % of machine CPU time stolen by the hypervisor (other guests).
    #[serde(default)]
    pub steal_mean_pct: Option<f32>,
    /// Median over the recent samples of the cores other programs kept busy (machine CPU
    /// minus this process): the run's typical competing load, which one busy moment or one
    /// idle one does not move.
    #[serde(default)]
    pub other_cores_median: Option<f32>,
    /// The busiest other programs over the run, mean CPU % each (100 = one core), busiest
    /// first.
    #[serde(default)]
    pub others: Vec<OtherCpu>,
    /// Named threads, by tid.
    pub threads: Vec<ThreadSummary>,
    /// The last GPU status; `None` = GPU sampling was not run.
    pub gpu_status: Option<GpuStatus>,
    /// GPUs, by index.
    pub devices: Vec<DeviceSummary>,
    /// Whether this process was seen on any GPU (same rules as per device).
    pub this_process_on_gpu: Option<bool>,
}

#[derive(Debug, Clone, Default)]
struct ThreadAcc {
    name: String,
    role: ThreadRole,
    cpu: MeanMax,
    cpu_ns: u64,
    sched_ns: Option<(u64, u64)>,
}

impl ThreadAcc {
    fn summary(&self, tid: u32) -> ThreadSummary {
        ThreadSummary {
            tid,
            name: self.name.clone(),
            samples: self.cpu.n,
            cpu_mean_pct: self.cpu.mean32().unwrap_or(0.0),
            cpu_peak_pct: self.cpu.peak32().unwrap_or(0.0),
            cpu_ns: self.cpu_ns,
            core_wait_ns: self.sched_ns.map(|s| s.1),
            sched_cpu_ns: self.sched_ns.map(|s| s.0),
            role: self.role,
        }
    }
}

/// Folds host and GPU samples into run totals ([`MachineAgg::summary`]) and keeps the recent
/// ones ([`MachineAgg::host_series`], [`MachineAgg::gpu_series`]) for live charts.
#[derive(Debug, Clone)]
pub struct MachineAgg {
    window_ns: u64,
    host_n: u64,
    gpu_n: u64,
    cores: usize,
    physical_cores: Option<usize>,
    proc_cpu: MeanMax,
    first_proc_cpu_ns: Option<u64>,
    last_proc_cpu_ns: u64,
    /// A training step was seen: the next host sample marks the start of training.
    training: bool,
    /// Process CPU ns and time at the first host sample after the first training step.
    training_mark: Option<(u64, u64)>,
    /// The same at the last host sample before the last training step was seen.
    training_end: Option<(u64, u64)>,
    last_t_ns: u64,
    global_cpu: MeanMax,
    busiest: MeanMax,
    idlest: MeanMax,
    rss_peak: Option<u64>,
    rss_last: Option<u64>,
    rss_processes_peak: u32,
    host_rss_peak: Option<u64>,
    read: MeanMax,
    write: MeanMax,
    syscall_read: MeanMax,
    iowait: MeanMax,
    steal: MeanMax,
    /// Per other program: CPU % summed over listings, most processes seen at once.
    others: BTreeMap<String, (f64, u32)>,
    others_listings: u64,
    threads: BTreeMap<u32, ThreadAcc>,
    gpu_status: Option<GpuStatus>,
    devices: BTreeMap<u32, DeviceAcc>,
    host_series: VecDeque<HostPoint>,
    gpu_series: VecDeque<GpuPoint>,
}

impl Default for MachineAgg {
    fn default() -> Self {
        MachineAgg::new(DEFAULT_WINDOW_NS)
    }
}

impl MachineAgg {
    /// An empty aggregator keeping the last `window_ns` of samples in its series.
    pub fn new(window_ns: u64) -> Self {
        MachineAgg {
            window_ns,
            host_n: 0,
            gpu_n: 0,
            cores: 0,
            physical_cores: None,
            proc_cpu: MeanMax::default(),
            first_proc_cpu_ns: None,
            last_proc_cpu_ns: 0,
            training: false,
            training_mark: None,
            training_end: None,
            last_t_ns: 0,
            global_cpu: MeanMax::default(),
            busiest: MeanMax::default(),
            idlest: MeanMax::default(),
            rss_peak: None,
            rss_last: None,
            rss_processes_peak: 0,
            host_rss_peak: None,
            read: MeanMax::default(),
            write: MeanMax::default(),
            syscall_read: MeanMax::default(),
            iowait: MeanMax::default(),
            steal: MeanMax::default(),
            others: BTreeMap::new(),
            others_listings: 0,
            threads: BTreeMap::new(),
            gpu_status: None,
            devices: BTreeMap::new(),
            host_series: VecDeque::new(),
            gpu_series: VecDeque::new(),
        }
    }

    /// A training step ended: CPU from the next host sample on counts as training's, up to
    /// the last sample before the last step ([`MachineSummary::process_cpu_training_pct`]:
    /// what comes after, an evaluation, a checkpoint, the exit, is not).
    pub fn training_step(&mut self) {
        self.training = true;
        if self.training_mark.is_some() {
            self.training_end = Some((self.last_proc_cpu_ns, self.last_t_ns));
        }
    }

    /// Process CPU % from the training mark to its end.
    fn training_cpu_pct(&self) -> Option<f32> {
        let ((cpu0, t0), (cpu1, t1)) = (self.training_mark?, self.training_end?);
        let dt = t1.checked_sub(t0).filter(|&d| d > 0)?;
        Some((cpu1.saturating_sub(cpu0) as f64 / dt as f64 * 100.0) as f32)
    }

    /// Adds one host sample.
    pub fn push_host(&mut self, s: &HostSample) {
        self.host_n += 1;
        self.cores = s.per_core_pct.len();
        if let Some(n) = s.physical_cores.filter(|&n| n > 0) {
            self.physical_cores = Some(n as usize);
        }
        self.proc_cpu.push(s.process_cpu_pct as f64);
        self.first_proc_cpu_ns.get_or_insert(s.process_cpu_ns);
        self.last_proc_cpu_ns = s.process_cpu_ns;
        self.last_t_ns = s.t_ns;
        if self.training && self.training_mark.is_none() {
            self.training_mark = Some((s.process_cpu_ns, s.t_ns));
        }
        self.global_cpu.push(s.global_cpu_pct as f64);
        let cores = s.per_core_pct.iter().copied().filter(|v| v.is_finite());
        if let Some(max) = cores.clone().reduce(f32::max) {
            self.busiest.push(max as f64);
        }
        if let Some(min) = cores.reduce(f32::min) {
            self.idlest.push(min as f64);
        }
        self.rss_peak = Some(self.rss_peak.map_or(s.rss_bytes, |p| p.max(s.rss_bytes)));
        // A sample taken after every process ended (the final one) is not the program's last.
        if s.rss_bytes > 0 || self.rss_last.is_none() {
            self.rss_last = Some(s.rss_bytes);
        }
        self.rss_processes_peak = self.rss_processes_peak.max(s.rss_processes);
        if let Some(h) = s.host_rss_bytes {
            self.host_rss_peak = Some(self.host_rss_peak.map_or(h, |p| p.max(h)));
        }
        self.read.push_opt(s.read_bytes_per_s);
        self.write.push_opt(s.write_bytes_per_s);
        self.syscall_read.push_opt(s.syscall_read_bytes_per_s);
        self.iowait.push_opt(s.iowait_pct.map(f64::from));
        self.steal.push_opt(s.steal_pct.map(f64::from));
        self.push_others(&s.others);
        self.push_threads(&s.threads);
        push_bounded(
            &mut self.host_series,
            self.window_ns,
            HostPoint {
                t_ns: s.t_ns,
                process_cpu_pct: s.process_cpu_pct,
                global_cpu_pct: s.global_cpu_pct,
                rss_bytes: s.rss_bytes,
                read_bytes_per_s: s.read_bytes_per_s,
                write_bytes_per_s: s.write_bytes_per_s,
                iowait_pct: s.iowait_pct,
            },
            |p| p.t_ns,
        );
    }

    /// Other programs' CPU, when the sample listed them.
    fn push_others(&mut self, others: &[OtherCpu]) {
        if others.is_empty() {
            return;
        }
        self.others_listings += 1;
        for o in others {
            if !self.others.contains_key(&o.name) && self.others.len() >= MAX_THREADS {
                continue;
            }
            let e = self.others.entry(o.name.clone()).or_default();
            e.0 += f64::from(o.cpu_pct);
            e.1 = e.1.max(o.processes);
        }
    }

    /// The named threads' CPU (bounded: new threads past [`MAX_THREADS`] are left out).
    fn push_threads(&mut self, threads: &[ThreadCpu]) {
        for t in threads {
            if !self.threads.contains_key(&t.tid) && self.threads.len() >= MAX_THREADS {
                continue;
            }
            let acc = self.threads.entry(t.tid).or_default();
            let renamed = acc.name != t.name;
            if renamed {
                acc.name.clone_from(&t.name);
            }
            // A sample that could not read the role (its table was busy) says Other: it never
            // takes back the role an earlier sample read. A reused thread id (a new name) is a
            // new thread and takes its own.
            if renamed || t.role != ThreadRole::Other {
                acc.role = t.role;
            }
            acc.cpu.push(t.cpu_pct as f64);
            acc.cpu_ns = t.cpu_ns;
            if t.sched_ns.is_some() {
                acc.sched_ns = t.sched_ns;
            }
        }
    }

    /// Recent host points, oldest first (at most the window, at most [`MAX_POINTS`]).
    pub fn host_series(&self) -> &VecDeque<HostPoint> {
        &self.host_series
    }

    /// Recent GPU points, oldest first.
    pub fn gpu_series(&self) -> &VecDeque<GpuPoint> {
        &self.gpu_series
    }

    /// Run totals so far.
    pub fn summary(&self) -> MachineSummary {
        let devices: Vec<DeviceSummary> = self.devices.iter().map(|(&index, a)| a.summary(index)).collect();
        let this_process_on_gpu = devices.iter().fold(None, |acc, d| merge_seen(acc, d.this_process_on_gpu));
        MachineSummary {
            host_samples: self.host_n,
            gpu_samples: self.gpu_n,
            cores: self.cores,
            physical_cores: self.physical_cores,
            process_cpu_mean_pct: self.proc_cpu.mean32(),
            process_cpu_peak_pct: self.proc_cpu.peak32(),
            process_cpu_training_pct: self.training_cpu_pct(),
            process_cpu_ns: self.first_proc_cpu_ns.map_or(0, |f| self.last_proc_cpu_ns.saturating_sub(f)),
            global_cpu_mean_pct: self.global_cpu.mean32(),
            global_cpu_peak_pct: self.global_cpu.peak32(),
            busiest_core_mean_pct: self.busiest.mean32(),
            idlest_core_mean_pct: self.idlest.mean32(),
            rss_peak_bytes: self.rss_peak,
            rss_last_bytes: self.rss_last,
            rss_processes_peak: self.rss_processes_peak,
            host_rss_peak_bytes: self.host_rss_peak,
            read_bytes_per_s_mean: self.read.mean(),
            read_bytes_per_s_peak: self.read.peak(),
            write_bytes_per_s_mean: self.write.mean(),
            syscall_read_bytes_per_s_mean: self.syscall_read.mean(),
            iowait_mean_pct: self.iowait.mean32(),
            iowait_peak_pct: self.iowait.peak32(),
            steal_mean_pct: self.steal.mean32(),
            other_cores_median: self.other_cores_median(),
            others: self.others_summary(),
            threads: self.threads.iter().map(|(&tid, a)| a.summary(tid)).collect(),
            gpu_status: self.gpu_status.clone(),
            devices,
            this_process_on_gpu,
        }
    }
}

impl MachineAgg {
    fn other_cores_median(&self) -> Option<f32> {
        if self.cores == 0 {
            return None;
        }
        let mut v: Vec<f32> = self
            .host_series
            .iter()
            .map(|p| (p.global_cpu_pct / 100.0 * self.cores as f32 - p.process_cpu_pct / 100.0).max(0.0))
            .filter(|v| v.is_finite())
            .collect();
        median(&mut v)
    }

    fn others_summary(&self) -> Vec<OtherCpu> {
        if self.others_listings == 0 {
            return Vec::new();
        }
        let n = self.others_listings as f64;
        let mut v: Vec<OtherCpu> = self
            .others
            .iter()
            .map(|(name, (sum, procs))| OtherCpu { name: name.clone(), processes: *procs, cpu_pct: (sum / n) as f32 })
            .collect();
        v.sort_by(|a, b| b.cpu_pct.total_cmp(&a.cpu_pct).then_with(|| a.name.cmp(&b.name)));
        v.truncate(OTHERS_LISTED);
        v
    }
}

/// Named threads with the generations of one loader worker summed (its threads re-created by
/// `--workers auto`, [`ThreadRole::Loader`] of one worker, are one row named for the worker):
/// (name, mean CPU % over the sampled run, 100 = one core), in first-seen order. Other threads
/// are kept as they are.
pub fn threads_by_worker(m: &MachineSummary) -> Vec<(String, f32)> {
    let run_samples = m.host_samples.max(1) as f32;
    let mut out: Vec<(String, f32, Option<u32>)> = Vec::new();
    for t in m.threads.iter().filter(|t| t.samples > 0) {
        let worker = t.role.worker();
        // A worker's CPU over the run: each generation's mean weighted by its samples.
        let pct = if worker.is_some() { t.cpu_mean_pct * t.samples as f32 / run_samples } else { t.cpu_mean_pct };
        match out.iter_mut().find(|(_, _, w)| worker.is_some() && *w == worker) {
            Some(e) => e.1 += pct,
            None => out.push((t.role.worker_name().unwrap_or_else(|| t.name.clone()), pct, worker)),
        }
    }
    out.into_iter().map(|(n, p, _)| (n, p)).collect()
}

impl MachineSummary {
    /// Share of the time the named threads (loader, training loop, compute pool) wanted to
    /// run that they spent waiting for a core: run-queue wait / (on-CPU + run-queue wait),
    /// over their lives. Counts the waits between spans too (a woken worker queued behind
    /// busy programs), which the spans cannot see. `None` without scheduler figures.
    pub fn threads_core_wait_share(&self) -> Option<f64> {
        let (mut wait, mut cpu) = (0u64, 0u64);
        for t in &self.threads {
            if let (Some(w), Some(c)) = (t.core_wait_ns, t.sched_cpu_ns) {
                wait = wait.saturating_add(w);
                cpu = cpu.saturating_add(c);
            }
        }
        let all = wait.saturating_add(cpu);
        (all > 0).then(|| wait as f64 / all as f64)
    }
}

/// Other programs kept in the summary.
pub const OTHERS_LISTED: usize = 3;

/// The median (mean of the middle two for an even count); sorts `v`.
pub fn median(v: &mut [f32]) -> Option<f32> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f32::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

/// "Seen at least once" over samples that may not know: true wins, then false, then unknown.
fn merge_seen(acc: Option<bool>, v: Option<bool>) -> Option<bool> {
    match (acc, v) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), _) | (_, Some(false)) => Some(false),
        (None, None) => None,
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, window_ns: u64, p: T, t: impl Fn(&T) -> u64) {
    let now = t(&p);
    q.push_back(p);
    while let Some(front) = q.front() {
        if q.len() > MAX_POINTS || t(front).saturating_add(window_ns) < now {
            q.pop_front();
        } else {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes::sampler::ThreadCpu;

    pub(super) const SEC: u64 = 1_000_000_000;

    fn host(t_s: u64, proc_pct: f32, cores: &[f32], rss: u64, read: Option<f64>) -> HostSample {
        HostSample {
            t_ns: t_s * SEC,
            global_cpu_pct: cores.iter().sum::<f32>() / cores.len().max(1) as f32,
            per_core_pct: cores.to_vec(),
            process_cpu_pct: proc_pct,
            process_cpu_ns: t_s * SEC / 2,
            rss_bytes: rss,
            read_bytes_per_s: read,
            write_bytes_per_s: read.map(|r| r / 2.0),
            syscall_read_bytes_per_s: Some(1e6),
            iowait_pct: Some(10.0),
            threads: vec![ThreadCpu {
                tid: 7,
                name: "loader-0".into(),
                cpu_pct: proc_pct / 2.0,
                cpu_ns: t_s,
                sched_ns: None,
                role: ThreadRole::loader(0),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn empty_aggregate_knows_nothing() {
        let s = MachineAgg::default().summary();
        assert_eq!(s.host_samples, 0);
        assert_eq!(s.process_cpu_mean_pct, None);
        assert_eq!(s.rss_peak_bytes, None);
        assert_eq!(s.gpu_status, None);
        assert_eq!(s.this_process_on_gpu, None);
    }

    #[test]
    fn program_memory_peak_last_and_the_hosts_apart() {
        let mut a = MachineAgg::default();
        let hosted = |t, rss, n, pp| HostSample {
            rss_processes: n,
            host_rss_bytes: Some(pp),
            ..host(t, 50.0, &[50.0], rss, None)
        };
        a.push_host(&hosted(1, 900, 3, 14));
        a.push_host(&hosted(2, 700, 5, 15));
        // The final sample, after every process of the program ended: not its last figure.
        a.push_host(&hosted(3, 0, 0, 13));
        let s = a.summary();
        assert_eq!((s.rss_peak_bytes, s.rss_last_bytes, s.rss_processes_peak), (Some(900), Some(700), 5));
        assert_eq!(s.host_rss_peak_bytes, Some(15));
        // pipeprof's own loop is the program: no host figure.
        let mut own = MachineAgg::default();
        own.push_host(&host(1, 50.0, &[50.0], 40, None));
        assert_eq!((own.summary().rss_last_bytes, own.summary().host_rss_peak_bytes), (Some(40), None));
    }

    #[test]
    fn host_means_peaks_and_core_spread() {
        let mut a = MachineAgg::default();
        a.push_host(&host(1, 100.0, &[100.0, 0.0], 10, Some(1e6)));
        a.push_host(&host(2, 50.0, &[80.0, 20.0], 30, Some(3e6)));
        a.push_host(&host(3, 150.0, &[90.0, 10.0], 20, Some(2e6)));
        let s = a.summary();
        assert_eq!(s.host_samples, 3);
        assert_eq!(s.cores, 2);
        assert_eq!(s.process_cpu_mean_pct, Some(100.0));
        assert_eq!(s.process_cpu_peak_pct, Some(150.0));
        assert_eq!(s.process_cpu_ns, SEC);
        assert_eq!(s.global_cpu_mean_pct, Some(50.0));
        assert_eq!(s.busiest_core_mean_pct, Some(90.0));
        assert_eq!(s.idlest_core_mean_pct, Some(10.0));
        assert_eq!(s.rss_peak_bytes, Some(30));
        assert_eq!(s.read_bytes_per_s_mean, Some(2e6));
        assert_eq!(s.read_bytes_per_s_peak, Some(3e6));
        assert_eq!(s.write_bytes_per_s_mean, Some(1e6));
        assert_eq!(s.iowait_mean_pct, Some(10.0));
        assert_eq!(s.threads.len(), 1);
        assert_eq!((s.threads[0].name.as_str(), s.threads[0].role), ("loader-0", ThreadRole::loader(0)));
        assert_eq!(s.threads[0].cpu_mean_pct, 50.0);
        assert_eq!(s.threads[0].cpu_peak_pct, 75.0);
        assert_eq!(s.threads[0].cpu_ns, 3);
        assert_eq!(s.gpu_status, None);
    }

    #[test]
    fn unmeasurable_storage_stays_none_not_zero() {
        let mut a = MachineAgg::default();
        a.push_host(&host(1, 10.0, &[10.0], 1, None));
        a.push_host(&host(2, 10.0, &[10.0], 1, None));
        let s = a.summary();
        assert_eq!(s.read_bytes_per_s_mean, None);
        assert_eq!(s.write_bytes_per_s_mean, None);
    }

    #[test]
    fn competing_load_is_the_median_and_others_are_averaged_over_listings() {
        use probes::sampler::OtherCpu;
        let mut a = MachineAgg::default();
        // 2 cores; this process uses 0.5 core; others 1.5, 1.5, then one idle moment (0.0).
        for (t, global) in [(1, 100.0), (2, 100.0), (3, 25.0)] {
            let mut h = host(t, 50.0, &[global, global], 0, None);
            h.steal_pct = Some(4.0);
            if t < 3 {
                h.others = vec![OtherCpu { name: "sh".into(), processes: 3, cpu_pct: 150.0 }];
            }
            a.push_host(&h);
        }
        let s = a.summary();
        assert_eq!(s.other_cores_median, Some(1.5), "one idle sample does not move the typical load");
        assert_eq!(s.steal_mean_pct, Some(4.0));
        assert_eq!(s.others, vec![OtherCpu { name: "sh".into(), processes: 3, cpu_pct: 150.0 }]);
        assert_eq!(median(&mut [3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn threads_core_wait_share_is_over_the_time_they_wanted_a_core() {
        let t =
            |w: Option<u64>, c: Option<u64>| ThreadSummary { core_wait_ns: w, sched_cpu_ns: c, ..Default::default() };
        let m = MachineSummary {
            threads: vec![t(Some(300), Some(100)), t(Some(100), Some(500)), t(None, None)],
            ..Default::default()
        };
        assert_eq!(m.threads_core_wait_share(), Some(0.4));
        assert_eq!(MachineSummary::default().threads_core_wait_share(), None);
        let mut a = MachineAgg::default();
        let mut h = host(1, 100.0, &[50.0], 0, None);
        h.threads[0].sched_ns = Some((900, 100));
        a.push_host(&h);
        assert_eq!(a.summary().threads[0].core_wait_ns, Some(100));
        assert_eq!(a.summary().threads_core_wait_share(), Some(0.1));
    }

    #[test]
    fn a_workers_generations_are_summed_under_one_name() {
        let t = |tid: u32, name: &str, role: ThreadRole, samples: u64, pct: f32| ThreadSummary {
            tid,
            name: name.into(),
            samples,
            cpu_mean_pct: pct,
            role,
            ..Default::default()
        };
        let m = MachineSummary {
            host_samples: 10,
            threads: vec![
                t(1, "loader-0", ThreadRole::loader(0), 4, 50.0),
                t(2, "loader-1", ThreadRole::loader(1), 4, 50.0),
                t(3, "loader-0.1", ThreadRole::Loader { worker: 0, generation: 1 }, 6, 100.0),
                t(4, "train", ThreadRole::Train, 10, 30.0),
                // Named like a worker, without the role: a thread of its own.
                t(5, "loader-0.2", ThreadRole::Other, 10, 10.0),
                t(6, "compute-0", ThreadRole::Compute(0), 10, 90.0),
            ],
            ..Default::default()
        };
        let got = threads_by_worker(&m);
        assert_eq!(
            got,
            vec![
                ("loader-0".into(), 80.0),
                ("loader-1".into(), 20.0),
                ("train".into(), 30.0),
                ("loader-0.2".into(), 10.0),
                ("compute-0".into(), 90.0)
            ]
        );
    }

    #[test]
    fn series_keeps_only_the_window() {
        let mut a = MachineAgg::new(10 * SEC);
        for t in 0..100 {
            a.push_host(&host(t, 1.0, &[1.0], 1, None));
        }
        let series = a.host_series();
        assert_eq!(series.front().map(|p| p.t_ns), Some(89 * SEC));
        assert_eq!(series.back().map(|p| p.t_ns), Some(99 * SEC));
        assert_eq!(series.len(), 11);
        assert_eq!(a.summary().host_samples, 100);
    }

    #[test]
    fn series_is_capped_even_with_a_huge_window() {
        let mut a = MachineAgg::new(u64::MAX);
        for t in 0..(MAX_POINTS as u64 + 10) {
            a.push_host(&HostSample { t_ns: t, ..HostSample::default() });
        }
        assert_eq!(a.host_series().len(), MAX_POINTS);
        assert_eq!(a.host_series().front().map(|p| p.t_ns), Some(10));
    }

    #[test]
    fn thread_table_is_bounded() {
        let mut a = MachineAgg::default();
        for tid in 0..(MAX_THREADS as u32 + 5) {
            a.push_host(&HostSample {
                threads: vec![ThreadCpu { tid, name: "loader".into(), cpu_pct: 1.0, cpu_ns: 1, ..Default::default() }],
                ..HostSample::default()
            });
        }
        assert_eq!(a.summary().threads.len(), MAX_THREADS);
    }

    #[test]
    fn a_sample_without_the_role_keeps_the_role_read_before_and_a_reused_id_takes_its_own() {
        let sample = |name: &str, role| HostSample {
            threads: vec![ThreadCpu { tid: 9, name: name.into(), cpu_pct: 1.0, cpu_ns: 1, role, ..Default::default() }],
            ..HostSample::default()
        };
        let role_now = |a: &MachineAgg| a.summary().threads[0].role;
        let mut a = MachineAgg::default();
        // (thread name, the sample's role, the summary's role after it)
        let table = [
            ("loader-2", ThreadRole::loader(2), ThreadRole::loader(2)),
            ("loader-2", ThreadRole::Other, ThreadRole::loader(2)),
            ("pt_main_thread", ThreadRole::Other, ThreadRole::Other),
            ("pt_main_thread", ThreadRole::Train, ThreadRole::Train),
        ];
        for (name, role, want) in table {
            a.push_host(&sample(name, role));
            assert_eq!(role_now(&a), want, "{name} {role:?}");
        }
    }

    #[test]
    fn the_cpu_while_training_leaves_the_start_up_out() {
        // Start-up at a whole core for 4 s, then training at a quarter of one: the whole run's
        // mean says more than training took; from the first sample after the first step on,
        // the quarter.
        let mut a = MachineAgg::default();
        let mut cpu_ns = 0u64;
        let mut at = |a: &mut MachineAgg, t_s: u64, pct: f64| {
            cpu_ns += (pct / 100.0 * SEC as f64) as u64;
            a.push_host(&HostSample {
                t_ns: t_s * SEC,
                process_cpu_ns: cpu_ns,
                process_cpu_pct: pct as f32,
                ..Default::default()
            });
        };
        for t in 1..=4 {
            at(&mut a, t, 100.0);
        }
        assert_eq!(a.summary().process_cpu_training_pct, None, "no step yet");
        a.training_step();
        at(&mut a, 5, 25.0);
        a.training_step();
        assert_eq!(a.summary().process_cpu_training_pct, None, "one sample is no span");
        for t in 6..=12 {
            at(&mut a, t, 25.0);
            a.training_step();
        }
        // After the last step: an evaluation at a whole core, not training's.
        for t in 13..=16 {
            at(&mut a, t, 100.0);
        }
        let s = a.summary();
        assert!((s.process_cpu_training_pct.unwrap() - 25.0).abs() < 0.01, "{:?}", s.process_cpu_training_pct);
        assert!(s.process_cpu_mean_pct.unwrap() > 45.0, "{:?}", s.process_cpu_mean_pct);
    }
}
