//! The host sampler: CPU (sysinfo), the process's CPU, memory and storage I/O, iowait and
//! the CPU of the threads given a role (procfs). Everything Linux-specific reads `/proc` and
//! degrades to `None` elsewhere. Whether storage bytes are counted here: [`super::io_accounting`].

use super::io_accounting::{read_proc_io, IoAccounting, ProcIo};
use super::{HostSample, OtherCpu, SamplerError, ThreadCpu};
use crate::clock;
use std::collections::{HashMap, HashSet};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System, MINIMUM_CPU_UPDATE_INTERVAL};

/// Whole-machine CPU time from the first line of `/proc/stat`, clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuTimes {
    /// All states (guest time is already inside user time, so not added again).
    pub total: u64,
    /// Idle while waiting for I/O.
    pub iowait: u64,
    /// Stolen by the hypervisor (0 where the kernel does not report it).
    pub steal: u64,
}

/// One thread's name and CPU ticks, from `/proc/<pid>/task/<tid>/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStat {
    /// `comm`: the thread name.
    pub comm: String,
    /// User + system time, clock ticks.
    pub ticks: u64,
}

/// Physical cores from each online logical core's `topology/thread_siblings_list` (the
/// logical cores sharing its physical core, as `0,8` or `0-1`): one core per distinct list.
/// `None` when there is none, or one is not a CPU list. Pure.
pub fn physical_cores(sibling_lists: &[String]) -> Option<u32> {
    let mut cores: HashSet<Vec<u32>> = HashSet::new();
    for text in sibling_lists {
        cores.insert(parse_cpu_list(text)?);
    }
    (!cores.is_empty()).then_some(cores.len() as u32)
}

/// A kernel CPU list (`0-3,8,10-11`), sorted; `None` when empty or malformed. Pure.
fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let a = part.trim().parse::<u32>().ok()?;
                (a, a)
            }
        };
        // A list longer than any machine's CPUs is not a topology file.
        if b < a || b - a > 1 << 16 {
            return None;
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    (!out.is_empty()).then_some(out)
}

/// This machine's physical cores, read from `/sys/devices/system/cpu/cpuN/topology` of every
/// online logical core; `None` where sysfs does not say.
fn read_physical_cores() -> Option<u32> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let lists: Vec<String> = parse_cpu_list(&online)?
        .into_iter()
        .map(|n| std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{n}/topology/thread_siblings_list")))
        .collect::<Result<_, _>>()
        .ok()?;
    physical_cores(&lists)
}

/// CPU % from two readings of a CPU-time counter `dt_ns` apart: 100 = one core busy.
pub fn cpu_pct(prev_cpu_ns: u64, cur_cpu_ns: u64, dt_ns: u64) -> f32 {
    if dt_ns == 0 {
        return 0.0;
    }
    (cur_cpu_ns.saturating_sub(prev_cpu_ns) as f64 * 100.0 / dt_ns as f64) as f32
}

/// Per-second rate of a cumulative counter; `None` when no time passed or the counter went
/// backwards (a reset: no honest rate exists).
pub fn rate_per_s(prev: u64, cur: u64, dt_ns: u64) -> Option<f64> {
    if dt_ns == 0 || cur < prev {
        return None;
    }
    Some((cur - prev) as f64 * 1e9 / dt_ns as f64)
}

/// % of CPU time spent in iowait between two `/proc/stat` readings.
pub fn iowait_pct(prev: CpuTimes, cur: CpuTimes) -> Option<f32> {
    share_of_total(prev, cur, |t| t.iowait)
}

/// % of CPU time stolen by the hypervisor between two `/proc/stat` readings.
pub fn steal_pct(prev: CpuTimes, cur: CpuTimes) -> Option<f32> {
    share_of_total(prev, cur, |t| t.steal)
}

/// % of all CPU time between two readings that went to the counter `part` picks.
fn share_of_total(prev: CpuTimes, cur: CpuTimes, part: impl Fn(&CpuTimes) -> u64) -> Option<f32> {
    let total = cur.total.checked_sub(prev.total)?;
    let x = part(&cur).checked_sub(part(&prev))?;
    if total == 0 {
        return None;
    }
    Some((x as f64 * 100.0 / total as f64) as f32)
}

/// Every process under `root` (children, grandchildren, …) from (pid, parent pid) pairs: a
/// profiled program's DataLoader workers, a launcher's ranks. `root` itself is not included.
pub fn descendants(root: u32, procs: impl Iterator<Item = (u32, u32)>) -> HashSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, ppid) in procs {
        if pid != ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut out = HashSet::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            // A cycle (pids reused while listing) cannot loop forever: each pid once.
            if c != root && out.insert(c) {
                todo.push(c);
            }
        }
    }
    out
}

/// CPU ticks a process used, its own and those of its children it has reaped
/// (`/proc/<pid>/stat` fields 14–17): a worker that exited stays counted in its parent.
fn parse_tree_ticks(text: &str) -> Option<u64> {
    let close = text.rfind(')')?;
    let mut rest = text.get(close + 1..)?.split_whitespace().skip(11);
    let mut ticks = 0u64;
    for _ in 0..4 {
        // cutime and cstime are signed in the kernel's format (never negative in practice).
        let v: i64 = rest.next()?.parse().ok()?;
        ticks = ticks.saturating_add(v.max(0) as u64);
    }
    Some(ticks)
}

/// Other programs by CPU, busiest first: processes of one name are summed (three `sh` busy
/// loops are one competitor using three cores), `own` (the sampled process and its
/// descendants: they are the run) is left out, at most `n` kept.
///
/// `budget_pct` is what the machine's own counters say all other programs used (100 = one
/// core): per-process figures measured over a different interval can add up to more cores than
/// exist, so they are scaled down to it.
pub fn top_others(
    procs: impl Iterator<Item = (u32, String, f32)>,
    own: &dyn Fn(u32) -> bool,
    n: usize,
    budget_pct: Option<f32>,
) -> Vec<OtherCpu> {
    let mut by_name: HashMap<String, OtherCpu> = HashMap::new();
    for (pid, name, cpu) in procs {
        if own(pid) || !cpu.is_finite() || cpu <= 0.0 {
            continue;
        }
        let e = by_name.entry(name.clone()).or_insert_with(|| OtherCpu { name, ..Default::default() });
        e.processes += 1;
        e.cpu_pct += cpu;
    }
    let mut v: Vec<OtherCpu> = by_name.into_values().collect();
    let total: f32 = v.iter().map(|o| o.cpu_pct).sum();
    if let Some(budget) = budget_pct.filter(|b| b.is_finite() && *b >= 0.0 && total > *b) {
        let k = budget / total;
        for o in &mut v {
            o.cpu_pct *= k;
        }
    }
    v.sort_by(|a, b| b.cpu_pct.total_cmp(&a.cpu_pct).then_with(|| a.name.cmp(&b.name)));
    v.truncate(n);
    v
}

/// Other programs listed per sample.
const TOP_OTHERS: usize = 3;
/// How often every process is listed for [`HostSample::others`], ns.
const OTHERS_EVERY_NS: u64 = 1_000_000_000;
/// The first listing only sets the baseline CPU times (every figure reads 0 then); the second
/// comes this soon (sysinfo needs ≥ 200 ms between refreshes), so a run shorter than
/// [`OTHERS_EVERY_NS`] still names its neighbours.
const OTHERS_FIRST_NS: u64 = 250_000_000;

/// Parses the aggregate `cpu` line of `/proc/stat`.
pub fn parse_proc_stat_total(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map_while(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    if v.len() < 5 {
        return None;
    }
    let total = v.iter().take(8).sum();
    Some(CpuTimes { total, iowait: v[4], steal: v.get(7).copied().unwrap_or(0) })
}

/// Parses `/proc/<pid>/task/<tid>/stat` (or `/proc/<pid>/stat`).
///
/// The name sits in parentheses and may itself contain spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_task_stat(text: &str) -> Option<TaskStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // After ") ": field 3 (state) onwards; utime and stime are fields 14 and 15.
    let mut rest = text.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some(TaskStat { comm, ticks: utime + stime })
}

/// Resident pages of a process from `/proc/<pid>/statm` (its second field). Pure.
pub fn parse_statm_resident_pages(text: &str) -> Option<u64> {
    text.split_whitespace().nth(1)?.parse().ok()
}

/// A CPU % no higher than `cores` × 100: a sample interval cannot hold more CPU time than the
/// machine has. CPU a process tree used earlier can land in one interval (a worker first
/// listed a second after it started, a child's life counted when it is reaped): the
/// cumulative figure keeps it, a per-interval figure cannot show it. `cores` 0 = not known.
pub fn capped_cpu_pct(pct: f32, cores: usize) -> f32 {
    if cores == 0 {
        return pct;
    }
    pct.min(cores as f32 * 100.0)
}

/// Ticks of the children a process has reaped (`/proc/<pid>/stat` fields 16–17).
fn reaped_children_ticks(text: &str) -> Option<u64> {
    let close = text.rfind(')')?;
    let mut rest = text.get(close + 1..)?.split_whitespace().skip(13);
    let cutime: i64 = rest.next()?.parse().ok()?;
    let cstime: i64 = rest.next()?.parse().ok()?;
    Some((cutime.max(0) + cstime.max(0)) as u64)
}

fn read_proc_stat() -> Option<CpuTimes> {
    parse_proc_stat_total(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// Takes host samples of one process. Each [`HostSampler::sample`] reports rates since the
/// previous one (or since [`HostSampler::new`]).
pub struct HostSampler {
    sys: System,
    pid: u32,
    // Our own process: its CPU clock is exact (ns), sysinfo's is in 10 ms ticks.
    own: bool,
    thread_roles: bool,
    io: IoAccounting,
    tick_ns: u64,
    last_cpu_refresh_ns: u64,
    cpu_ready: bool,
    global_cpu_pct: f32,
    per_core_pct: Vec<f32>,
    prev_t_ns: u64,
    prev_proc_cpu_ns: u64,
    prev_io: Option<ProcIo>,
    prev_stat: Option<CpuTimes>,
    prev_threads: HashMap<u32, u64>,
    last_others_ns: u64,
    /// Listings made so far (the first is only a baseline).
    others_listed: u32,
    /// The sampled process's descendants at the last listing: their CPU is the run's.
    descendants: HashSet<u32>,
    /// Read once: the topology does not change during a run.
    physical_cores: Option<u32>,
    /// The program is the processes below `pid`, not `pid` itself (`pipeprof run`).
    program_below: bool,
    page_size: u64,
}

/// The program's processes at one sample: memory and CPU time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Tree {
    /// The program's resident bytes, every process's added.
    rss: u64,
    /// Processes in `rss`.
    processes: u32,
    /// The sampled process's own resident bytes when it only hosts the program.
    host_rss: Option<u64>,
    /// CPU ns the run used since it started: the host, the program, the children they reaped.
    cpu_ns: u64,
}

impl std::fmt::Debug for HostSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSampler").field("pid", &self.pid).field("io", &self.io).finish_non_exhaustive()
    }
}

impl HostSampler {
    /// A sampler for process `pid`, with per-thread CPU for the threads given a role
    /// (`thread_roles`; this process's only: see [`super::SamplerConfig::thread_roles`]). Takes
    /// the baseline readings.
    pub fn new(pid: u32, thread_roles: bool, io: IoAccounting) -> Result<Self, SamplerError> {
        let sys = System::new().map_err(|e| SamplerError::Host(e.to_string()))?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let mut s = HostSampler {
            sys,
            pid,
            own: pid == std::process::id(),
            thread_roles,
            io,
            // 100 Hz is the Linux default; only a failing sysconf falls back to it.
            tick_ns: if hz > 0 { 1_000_000_000 / hz as u64 } else { 10_000_000 },
            last_cpu_refresh_ns: 0,
            cpu_ready: false,
            global_cpu_pct: 0.0,
            per_core_pct: Vec::new(),
            prev_t_ns: 0,
            prev_proc_cpu_ns: 0,
            prev_io: None,
            prev_stat: None,
            prev_threads: HashMap::new(),
            last_others_ns: 0,
            others_listed: 0,
            descendants: HashSet::new(),
            physical_cores: read_physical_cores(),
            program_below: false,
            // SAFETY: sysconf has no preconditions.
            page_size: match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
                n if n > 0 => n as u64,
                _ => 4096,
            },
        };
        s.sys.refresh_cpu_usage();
        // The baseline of every process's CPU time: the first sample can then name the busy
        // ones (sysinfo's per-process CPU % needs two refreshes).
        let kind = ProcessRefreshKind::nothing().without_tasks().with_cpu();
        s.sys.refresh_processes_specifics(ProcessesToUpdate::All, true, kind);
        s.refresh_descendants();
        s.last_cpu_refresh_ns = clock::now_ns();
        s.prev_t_ns = s.last_cpu_refresh_ns;
        s.prev_proc_cpu_ns = s.tree().cpu_ns;
        s.prev_io = read_proc_io(pid);
        s.prev_stat = read_proc_stat();
        s.threads(0);
        Ok(s)
    }

    /// The program is the processes below the sampled one, not the sampled process itself
    /// (`pipeprof run`, which only hosts it): its own memory is left out of the program's and
    /// reported apart ([`HostSample::host_rss_bytes`]).
    pub fn program_below(mut self) -> Self {
        self.program_below = true;
        self.refresh_descendants();
        self.prev_proc_cpu_ns = self.tree().cpu_ns;
        self
    }

    /// Sets what the kernel accounts (from [`io_accounting_here`]) and restarts the I/O
    /// baseline, so bytes moved before this call are in no rate.
    pub fn set_io_accounting(&mut self, io: IoAccounting) {
        self.io = io;
        self.prev_io = read_proc_io(self.pid);
    }

    /// What the I/O rates trust.
    pub fn io_accounting(&self) -> IoAccounting {
        self.io
    }

    /// Takes one sample. The first one after [`HostSampler::new`] waits until sysinfo's
    /// minimum CPU interval (200 ms) has passed since then; later ones never wait, reusing
    /// the global and per-core CPU figures when called faster than that.
    pub fn sample(&mut self) -> HostSample {
        self.refresh_cpu();
        let tree = self.tree();
        let proc_cpu_ns = tree.cpu_ns;
        let t_ns = clock::now_ns();
        let dt = t_ns.saturating_sub(self.prev_t_ns);

        let io = read_proc_io(self.pid);
        let rate = |f: fn(&ProcIo) -> u64, ok: bool| match (self.prev_io, io) {
            (Some(p), Some(c)) if ok => rate_per_s(f(&p), f(&c), dt),
            _ => None,
        };
        let read_bytes_per_s = rate(|i| i.read_bytes, self.io.reads);
        let write_bytes_per_s = rate(|i| i.write_bytes, self.io.writes);
        let syscall_read_bytes_per_s = rate(|i| i.rchar, true);

        let stat = read_proc_stat();
        let (iowait, steal) = match (self.prev_stat, stat) {
            (Some(p), Some(c)) => (iowait_pct(p, c), steal_pct(p, c)),
            _ => (None, None),
        };
        let own_pct = capped_cpu_pct(cpu_pct(self.prev_proc_cpu_ns, proc_cpu_ns, dt), self.per_core_pct.len());
        let budget = self.global_cpu_pct / 100.0 * self.per_core_pct.len() as f32 * 100.0 - own_pct;
        let others = self.others(t_ns, (!self.per_core_pct.is_empty()).then_some(budget.max(0.0)));

        let threads = self.threads(dt);
        let sample = HostSample {
            t_ns,
            global_cpu_pct: self.global_cpu_pct,
            per_core_pct: self.per_core_pct.clone(),
            process_cpu_pct: own_pct,
            process_cpu_ns: proc_cpu_ns,
            rss_bytes: tree.rss,
            rss_processes: tree.processes,
            host_rss_bytes: tree.host_rss,
            read_bytes_per_s,
            write_bytes_per_s,
            syscall_read_bytes_per_s,
            iowait_pct: iowait,
            threads,
            steal_pct: steal,
            others,
            physical_cores: self.physical_cores,
        };
        self.prev_t_ns = t_ns;
        self.prev_proc_cpu_ns = proc_cpu_ns;
        // A failed read keeps the older baseline: the next rate then spans both intervals.
        if io.is_some() {
            self.prev_io = io;
        }
        if stat.is_some() {
            self.prev_stat = stat;
        }
        sample
    }

    /// The global and per-core CPU figures, refreshed when sysinfo's minimum interval has
    /// passed since the last refresh (waited for on the first sample).
    fn refresh_cpu(&mut self) {
        let since = clock::now_ns().saturating_sub(self.last_cpu_refresh_ns);
        let min_ns = MINIMUM_CPU_UPDATE_INTERVAL.as_nanos() as u64;
        if !self.cpu_ready && since < min_ns {
            // Without a second refresh ≥ 200 ms after the first, sysinfo has no CPU figures.
            std::thread::sleep(std::time::Duration::from_nanos(min_ns - since));
        }
        if !self.cpu_ready || clock::now_ns().saturating_sub(self.last_cpu_refresh_ns) >= min_ns {
            self.sys.refresh_cpu_usage();
            self.last_cpu_refresh_ns = clock::now_ns();
            self.cpu_ready = true;
            self.global_cpu_pct = self.sys.global_cpu_usage();
            self.per_core_pct.clear();
            self.per_core_pct.extend(self.sys.cpus().iter().map(|c| c.usage()));
        }
    }

    /// The busiest other programs, at most once per [`OTHERS_EVERY_NS`] (the first sample
    /// lists them: [`HostSampler::new`] took the baseline).
    fn others(&mut self, t_ns: u64, budget_pct: Option<f32>) -> Vec<OtherCpu> {
        let every = if self.others_listed < 2 { OTHERS_FIRST_NS } else { OTHERS_EVERY_NS };
        if self.others_listed > 0 && t_ns.saturating_sub(self.last_others_ns) < every {
            return Vec::new();
        }
        self.last_others_ns = t_ns;
        self.others_listed = self.others_listed.saturating_add(1);
        let kind = ProcessRefreshKind::nothing().without_tasks().with_cpu();
        self.sys.refresh_processes_specifics(ProcessesToUpdate::All, true, kind);
        self.refresh_descendants();
        let procs = self
            .sys
            .processes()
            .iter()
            .map(|(pid, p)| (pid.as_u32(), p.name().to_string_lossy().into_owned(), p.cpu_usage()));
        let (root, tree) = (self.pid, &self.descendants);
        top_others(procs, &|p| p == root || tree.contains(&p), TOP_OTHERS, budget_pct)
    }

    /// The sampled process's descendants, from the process list sysinfo last refreshed.
    fn refresh_descendants(&mut self) {
        let pairs = self.sys.processes().iter().filter_map(|(pid, p)| Some((pid.as_u32(), p.parent()?.as_u32())));
        self.descendants = descendants(self.pid, pairs);
    }

    /// CPU ns of the sampled process's descendants, live ones and those they reaped.
    fn descendants_cpu_ns(&self) -> u64 {
        let ticks: u64 = self
            .descendants
            .iter()
            .filter_map(|p| parse_tree_ticks(&std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?))
            .sum();
        ticks.saturating_mul(self.tick_ns)
    }

    /// The program's memory (the sampled process and every process below it: a Python
    /// script's DataLoader workers, the ranks a launcher started; or only those below it when
    /// it merely hosts the program) and the run's CPU (all of them, and the children they
    /// already reaped).
    fn tree(&mut self) -> Tree {
        let pid = Pid::from_u32(self.pid);
        let mut kind = ProcessRefreshKind::nothing().without_tasks().with_memory();
        if !self.own {
            kind = kind.with_cpu();
        }
        self.sys.refresh_processes_specifics(ProcessesToUpdate::Some(&[pid]), true, kind);
        let proc = self.sys.process(pid);
        let own_rss = proc.map_or(0, |p| p.memory());
        let own_cpu = if self.own {
            clock::process_cpu_ns()
        } else {
            proc.map_or(0, |p| p.accumulated_cpu_time().saturating_mul(1_000_000))
        };
        let reaped = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|t| reaped_children_ticks(&t))
            .unwrap_or(0)
            .saturating_mul(self.tick_ns);
        let (below_rss, below_n) = self.descendants_rss();
        let below_cpu = reaped.saturating_add(self.descendants_cpu_ns());
        let (rss, processes, host_rss) = if self.program_below {
            (below_rss, below_n, Some(own_rss))
        } else {
            (own_rss.saturating_add(below_rss), below_n + u32::from(proc.is_some()), None)
        };
        // The CPU stays the whole tree's, the host's too: what the run took from the machine
        // (the rules weigh it against the machine's total; a host's CPU is not a neighbour's).
        let cpu = below_cpu.saturating_add(own_cpu);
        // A process tree that shrank (a child's figures gone before its parent reaped it) must
        // not make the cumulative figure go back.
        Tree { rss, processes, host_rss, cpu_ns: cpu.max(self.prev_proc_cpu_ns) }
    }

    /// Resident bytes of the sampled process's descendants, added, and how many were read.
    /// Pages a forked worker still shares with its parent count in each: the kernel's
    /// resident figure, as `ps` and `top` show it, not a proportional share.
    fn descendants_rss(&self) -> (u64, u32) {
        let mut n = 0;
        let pages: u64 = self
            .descendants
            .iter()
            .filter_map(|p| parse_statm_resident_pages(&std::fs::read_to_string(format!("/proc/{p}/statm")).ok()?))
            .inspect(|_| n += 1)
            .sum();
        (pages.saturating_mul(self.page_size), n)
    }

    /// CPU of the threads given a role over the last `dt_ns`, and the new per-thread baseline.
    fn threads(&mut self, dt_ns: u64) -> Vec<ThreadCpu> {
        if !(self.thread_roles && self.own) {
            return Vec::new();
        }
        let dir = format!("/proc/{}/task", self.pid);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let roles = crate::role::os_thread_roles();
        let mut out = Vec::new();
        let mut seen = HashMap::with_capacity(self.prev_threads.len());
        for entry in entries.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            // The role given where the thread was made.
            let Some(&role) = roles.get(&tid).filter(|r| !r.is_other()) else {
                continue;
            };
            // A thread may exit between listing and reading: skip it.
            let Ok(text) = std::fs::read_to_string(format!("{dir}/{tid}/stat")) else {
                continue;
            };
            let Some(st) = parse_task_stat(&text) else {
                continue;
            };
            let cpu_ns = st.ticks.saturating_mul(self.tick_ns);
            // A thread not seen before was born (or renamed) since the last sample: all its
            // CPU time is from this interval.
            let prev = self.prev_threads.get(&tid).copied().unwrap_or(0);
            // The run-queue wait of the run's own threads, whatever their spans cover.
            let sched_ns =
                std::fs::read(format!("{dir}/{tid}/schedstat")).ok().and_then(|t| clock::parse_schedstat(&t));
            let cpu_pct = cpu_pct(prev, cpu_ns, dt_ns);
            out.push(ThreadCpu { tid, name: st.comm, cpu_pct, cpu_ns, sched_ns, role });
            seen.insert(tid, cpu_ns);
        }
        self.prev_threads = seen;
        out.sort_by_key(|t| t.tid);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_thread_siblings_count_as_one_physical_core() {
        let l = |xs: &[&str]| xs.iter().map(|x| format!("{x}\n")).collect::<Vec<String>>();
        let table: [(Vec<String>, Option<u32>); 7] = [
            // This development machine: 2 cores, one thread each.
            (l(&["0", "1"]), Some(2)),
            // 16 logical = 8 cores × 2 threads, siblings listed as "0,8" (Intel) …
            (
                l(&[
                    "0,8", "1,9", "2,10", "3,11", "4,12", "5,13", "6,14", "7,15", "0,8", "1,9", "2,10", "3,11", "4,12",
                    "5,13", "6,14", "7,15",
                ]),
                Some(8),
            ),
            // … or as ranges "0-1" (AMD).
            (l(&["0-1", "0-1", "2-3", "2-3"]), Some(2)),
            (l(&["0", "1-x"]), None),
            (l(&[""]), None),
            (l(&["3-1"]), None),
            (Vec::new(), None),
        ];
        for (lists, want) in table {
            assert_eq!(physical_cores(&lists), want, "{lists:?}");
        }
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list("0-4294967295"), None, "no list longer than any machine");
    }

    #[test]
    fn cpu_pct_is_share_of_one_core() {
        assert_eq!(cpu_pct(0, 100, 100), 100.0);
        assert_eq!(cpu_pct(1_000, 1_500, 1_000), 50.0);
        assert_eq!(cpu_pct(0, 300, 100), 300.0);
        assert_eq!(cpu_pct(500, 400, 100), 0.0);
        assert_eq!(cpu_pct(0, 100, 0), 0.0);
    }

    #[test]
    fn cpu_pct_is_capped_at_the_machines_cores() {
        let table = [(363.0, 2, 200.0), (150.0, 2, 150.0), (800.0, 16, 800.0), (1700.0, 16, 1600.0), (363.0, 0, 363.0)];
        for (pct, cores, want) in table {
            assert_eq!(capped_cpu_pct(pct, cores), want, "{pct}% on {cores} cores");
        }
    }

    #[test]
    fn statm_gives_resident_pages() {
        assert_eq!(parse_statm_resident_pages("764390 190210 9513 1 0 193702 0\n"), Some(190_210));
        assert_eq!(parse_statm_resident_pages("764390\n"), None);
        assert_eq!(parse_statm_resident_pages("a b"), None);
        assert_eq!(parse_statm_resident_pages(""), None);
    }

    #[test]
    fn rate_is_per_second_and_none_without_time_or_on_reset() {
        assert_eq!(rate_per_s(0, 1_000, 500_000_000), Some(2_000.0));
        assert_eq!(rate_per_s(7, 7, 1), Some(0.0));
        assert_eq!(rate_per_s(0, 1, 0), None);
        assert_eq!(rate_per_s(10, 5, 1_000), None);
    }

    #[test]
    fn proc_stat_total_excludes_guest_time() {
        let text = "cpu  100 0 50 800 40 5 5 0 30 0\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1 2\n";
        assert_eq!(parse_proc_stat_total(text), Some(CpuTimes { total: 1000, iowait: 40, steal: 0 }));
        // Old kernels: only 7 fields.
        assert_eq!(parse_proc_stat_total("cpu 1 2 3 4 5 6 7\n"), Some(CpuTimes { total: 28, iowait: 5, steal: 0 }));
        assert_eq!(parse_proc_stat_total("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_proc_stat_total("cpu 1 2\n"), None);
    }

    #[test]
    fn a_process_tree_is_the_run_and_not_other_programs() {
        // 10 → 11 (a DataLoader worker) → 12 (its helper); 20 is a stranger; 13 names itself
        // as its own parent (pid reuse while listing) and 30 is under the stranger.
        let pairs = [(11, 10), (12, 11), (20, 1), (13, 13), (30, 20), (14, 10)];
        let tree = descendants(10, pairs.into_iter());
        let mut got: Vec<u32> = tree.iter().copied().collect();
        got.sort();
        assert_eq!(got, vec![11, 12, 14]);
        assert!(descendants(99, pairs.into_iter()).is_empty());
        // A cycle through the root ends.
        assert_eq!(descendants(1, [(2, 1), (1, 2)].into_iter()).into_iter().collect::<Vec<_>>(), vec![2]);
        let procs = || {
            vec![
                (10, "python".to_string(), 90.0),
                (11, "pt_data_worker".to_string(), 80.0),
                (20, "sh".to_string(), 50.0),
            ]
            .into_iter()
        };
        let own = |p: u32| p == 10 || tree.contains(&p);
        let top = top_others(procs(), &own, 3, None);
        assert_eq!(top.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), vec!["sh"]);
    }

    #[test]
    fn tree_ticks_count_reaped_children() {
        // Fields after the name: state ppid … utime=7 stime=3 cutime=20 cstime=5.
        let stat = "42 (py (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 20 5 20 0 4 0 1 1 1";
        assert_eq!(parse_tree_ticks(stat), Some(35));
        assert_eq!(reaped_children_ticks(stat), Some(25));
        assert_eq!(parse_tree_ticks("42 (cut) S 1"), None);
    }

    #[test]
    fn steal_and_top_others() {
        let a = CpuTimes { total: 1_000, iowait: 0, steal: 100 };
        let b = CpuTimes { total: 1_200, iowait: 0, steal: 150 };
        assert_eq!(steal_pct(a, b), Some(25.0));
        assert_eq!(parse_proc_stat_total("cpu 1 2 3 4 5 6 7 8 9 10\n").map(|c| c.steal), Some(8));
        let procs = [(1, "sh", 90.0), (2, "sh", 80.0), (3, "me", 400.0), (4, "cc1", 95.0), (5, "idle", 0.0)];
        let all = || procs.iter().map(|(p, n, c)| (*p, n.to_string(), *c));
        let top = top_others(all(), &|p| p == 3, 2, None);
        let got: Vec<(&str, u32, f32)> = top.iter().map(|o| (o.name.as_str(), o.processes, o.cpu_pct)).collect();
        assert_eq!(got, [("sh", 2, 170.0), ("cc1", 1, 95.0)], "own process left out, same names summed");
        // The machine says the others used 1.3 cores in all: 2.65 cores of figures scale down.
        let top = top_others(all(), &|p| p == 3, 2, Some(132.5));
        let got: Vec<f32> = top.iter().map(|o| o.cpu_pct).collect();
        assert_eq!(got, [85.0, 47.5]);
    }

    #[test]
    fn iowait_pct_from_two_readings() {
        let a = CpuTimes { total: 1_000, iowait: 100, steal: 0 };
        let b = CpuTimes { total: 1_200, iowait: 150, steal: 0 };
        assert_eq!(iowait_pct(a, b), Some(25.0));
        assert_eq!(iowait_pct(a, a), None);
        assert_eq!(iowait_pct(b, a), None);
    }

    #[test]
    fn task_stat_survives_spaces_and_parens_in_names() {
        let text = "4242 (loader 1) S 1 1 1 0 -1 4194368 100 0 0 0 123 45 0 0 20 0 9 0 5 0 0";
        assert_eq!(parse_task_stat(text), Some(TaskStat { comm: "loader 1".into(), ticks: 168 }));
        let text = "7 (a) b)) R 1 1 1 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 5";
        assert_eq!(parse_task_stat(text), Some(TaskStat { comm: "a) b)".into(), ticks: 7 }));
        assert_eq!(parse_task_stat("7 (x) R 1 2"), None);
        assert_eq!(parse_task_stat("garbage"), None);
    }

    #[test]
    fn own_task_stat_parses() {
        let text = std::fs::read_to_string("/proc/self/stat");
        if let Ok(text) = text {
            assert!(parse_task_stat(&text).is_some(), "{text}");
        }
    }
}
