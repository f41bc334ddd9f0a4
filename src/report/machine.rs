//! The report's machine section: CPU, memory, storage, the data's file system, threads and
//! each GPU with who uses it.

use pipeprof_core::aggregate::machine::MachineSummary;
use pipeprof_core::aggregate::Summary;
use std::fmt::Write;

fn mb(bytes: f64) -> String {
    format!("{:.1} MB", bytes / 1e6)
}

fn opt_pct(v: Option<f32>) -> String {
    v.map(|v| format!("{v:.0}%")).unwrap_or_else(|| "-".into())
}

pub(super) fn render_machine(o: &mut String, s: &Summary) {
    let m = &s.machine;
    let _ = writeln!(o);
    let _ = writeln!(o, "machine");
    if m.host_samples == 0 {
        let _ = writeln!(o, "  host     not sampled (run too short or sampling off)");
    } else {
        render_host(o, m);
    }
    if let Some(fs) = &s.data_fs {
        let _ = writeln!(
            o,
            "  data     {} on {} ({}{})",
            s.settings.data,
            fs.fs_type,
            fs.kind,
            if fs.kind.is_remote_or_fuse() { ": every read may be a network round trip" } else { "" }
        );
    }
    render_gpus(o, m);
}

/// The program's resident memory (its processes added), and pipeprof's own apart when it only
/// hosted the program.
fn memory_line(m: &MachineSummary) -> String {
    let Some(peak) = m.rss_peak_bytes else {
        return "RSS -".into();
    };
    let mut line = format!("RSS peak {}", mb(peak as f64));
    if let Some(last) = m.rss_last_bytes {
        let _ = write!(line, ", last {}", mb(last as f64));
    }
    if m.rss_processes_peak > 1 {
        let _ = write!(line, " (the program's {} processes added)", m.rss_processes_peak);
    }
    if let Some(host) = m.host_rss_peak_bytes {
        let _ = write!(line, " · pipeprof itself {}", mb(host as f64));
    }
    line
}

/// The host's lines: CPU, memory, storage, and the loader's threads' CPU.
fn render_host(o: &mut String, m: &MachineSummary) {
    let _ = writeln!(
        o,
        "  CPU      this process {} (peak {}; 100% = one core) · machine {} of {} cores · busiest core {}, idlest {}",
        opt_pct(m.process_cpu_mean_pct),
        opt_pct(m.process_cpu_peak_pct),
        opt_pct(m.global_cpu_mean_pct),
        m.cores,
        opt_pct(m.busiest_core_mean_pct),
        opt_pct(m.idlest_core_mean_pct)
    );
    let _ = writeln!(o, "  memory   {}", memory_line(m));
    let reads = match m.read_bytes_per_s_mean {
        Some(r) => format!("{}/s from storage", mb(r)),
        None => "storage reads not measurable here".into(),
    };
    let calls =
        m.syscall_read_bytes_per_s_mean.map(|r| format!(" · {}/s through read calls", mb(r))).unwrap_or_default();
    let iowait = m.iowait_mean_pct.map(|w| format!(" · iowait {w:.1}%")).unwrap_or_default();
    let _ = writeln!(o, "  storage  {reads}{calls}{iowait}");
    let threads: Vec<String> = pipeprof_core::aggregate::machine::threads_by_worker(m)
        .into_iter()
        .map(|(name, pct)| format!("{name} {pct:.0}%"))
        .collect();
    if !threads.is_empty() {
        let _ = writeln!(o, "  threads  {}", threads.join(", "));
    }
}

/// A line per GPU (utilisation, memory, PCIe, who uses it), or why there is none.
fn render_gpus(o: &mut String, m: &MachineSummary) {
    match &m.gpu_status {
        None => {
            let _ = writeln!(o, "  GPU      not sampled (--no-gpu)");
        }
        Some(probes::sampler::GpuStatus::Off(reason)) => {
            let _ = writeln!(o, "  GPU      off: {reason}");
        }
        Some(probes::sampler::GpuStatus::Ok) if m.devices.is_empty() => {
            let _ = writeln!(o, "  GPU      none found");
        }
        Some(probes::sampler::GpuStatus::Ok) => {
            for d in &m.devices {
                let mem = match (d.mem_used_peak_bytes, d.mem_total_bytes) {
                    (Some(u), Some(t)) => format!("memory peak {:.1} / {:.1} GB", u as f64 / 1e9, t as f64 / 1e9),
                    _ => "memory -".into(),
                };
                let idle =
                    d.util_idle_share.map(|i| format!(", idle in {:.0}% of samples", i * 100.0)).unwrap_or_default();
                let pcie = match (d.pcie_rx_mean_bytes_per_s, d.pcie_tx_mean_bytes_per_s) {
                    (Some(rx), Some(tx)) => format!(" · PCIe to GPU {}/s, from GPU {}/s", mb(rx), mb(tx)),
                    _ => String::new(),
                };
                let ours = gpu_users(d);
                let _ = writeln!(
                    o,
                    "  GPU {}    {}: utilisation {} (peak {}{idle}) · {mem}{pcie} · {ours}",
                    d.index,
                    d.name,
                    opt_pct(d.util_mean_pct),
                    opt_pct(d.util_peak_pct)
                );
            }
        }
    }
}

/// Who uses a GPU, as NVML listed it: the run's processes with their memory, or why not.
fn gpu_users(d: &pipeprof_core::aggregate::machine::gpu::DeviceSummary) -> String {
    match d.this_process_on_gpu {
        Some(true) if d.run_processes.is_empty() => "the run uses it".into(),
        Some(true) => {
            let each: Vec<String> = d
                .run_processes
                .iter()
                .map(|p| {
                    let name = if p.name.is_empty() { "pid".to_string() } else { format!("{} pid", p.name) };
                    let mem = p.mem_bytes.map(|b| format!(" {:.0} MiB", b as f64 / f64::from(1u32 << 20)));
                    format!("{name} {}{}", p.pid, mem.unwrap_or_default())
                })
                .collect();
            format!("the run uses it: {}", each.join(", "))
        }
        Some(false) => "NVML lists none of the run's processes on it".into(),
        None => "whether the run uses it is unknown (NVML lists no process while memory is in use: a container may hide them)"
            .into(),
    }
}
