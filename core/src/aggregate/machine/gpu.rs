//! The GPU half of the machine's totals: each device's run totals ([`DeviceSummary`]) folded
//! from its samples ([`MachineAgg::push_gpu`]), the PCIe link's bandwidth, the processes of the
//! run on each device.

use super::{merge_seen, push_bounded, GpuPoint, MachineAgg, MeanMax, GPU_IDLE_PCT};
use probes::sampler::{GpuSample, GpuStatus, ProcessMatch, RunProcess, MAX_RUN_PROCESSES};

/// Run totals of one GPU.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct DeviceSummary {
    /// NVML index.
    pub index: u32,
    /// Name at its last sample.
    pub name: String,
    /// Samples it appeared in.
    pub samples: u64,
    /// Mean GPU utilisation %.
    pub util_mean_pct: Option<f32>,
    /// Peak GPU utilisation %.
    pub util_peak_pct: Option<f32>,
    /// Share (0–1) of samples at or under [`GPU_IDLE_PCT`]: a mean of 50% may be half idle,
    /// half flat out.
    pub util_idle_share: Option<f32>,
    /// Mean memory utilisation %.
    pub mem_util_mean_pct: Option<f32>,
    /// Peak memory used, bytes.
    pub mem_used_peak_bytes: Option<u64>,
    /// Device memory, bytes.
    pub mem_total_bytes: Option<u64>,
    /// Mean PCIe host-to-device bytes/s.
    pub pcie_rx_mean_bytes_per_s: Option<f64>,
    /// Mean PCIe device-to-host bytes/s.
    pub pcie_tx_mean_bytes_per_s: Option<f64>,
    /// Mean power, watts.
    pub power_mean_w: Option<f32>,
    /// Mean SM clock, MHz.
    pub sm_clock_mean_mhz: Option<f32>,
    /// `Some(true)` if any sample saw this process on the device, `Some(false)` if samples
    /// could tell and never did, `None` if none could tell.
    pub this_process_on_gpu: Option<bool>,
    /// How this process was recognised on the device (the last sample that did).
    pub process_match: Option<ProcessMatch>,
    /// Peak device memory used by this process (under `pipeprof run`: the run's processes
    /// together), bytes.
    pub process_mem_peak_bytes: Option<u64>,
    /// The run's processes NVML listed on this device over the run, each with its peak memory
    /// (at most [`MAX_RUN_PROCESSES`]).
    #[serde(default)]
    pub run_processes: Vec<RunProcess>,
    /// PCIe generation the link can reach.
    pub pcie_gen_max: Option<u32>,
    /// PCIe lanes the link can use.
    pub pcie_width_max: Option<u32>,
    /// Highest PCIe generation seen in use (an idle GPU drops to a low one): under
    /// `pcie_gen_max` all run long means the link never came up to speed.
    pub pcie_gen_current_peak: Option<u32>,
    /// Most PCIe lanes seen in use: under `pcie_width_max`, the card sits in a narrower slot.
    pub pcie_width_current_peak: Option<u32>,
    /// What the link can carry one way at its best, bytes/s ([`pcie_link_bytes_per_s`]), to
    /// set beside the host→device bandwidth the transfer spans achieved.
    pub pcie_link_max_bytes_per_s: Option<f64>,
}

/// One-way PCIe bandwidth of a link, bytes/s, after line encoding (8b/10b for generations
/// 1–2, 128b/130b for 3–5, 242B/256B FLIT for 6): `None` for a generation it does not know.
/// Protocol overhead takes another 10–20% in practice.
fn pcie_link_bytes_per_s(gen: u32, width: u32) -> Option<f64> {
    let giga_transfers = match gen {
        1 => 2.5,
        2 => 5.0,
        3 => 8.0,
        4 => 16.0,
        5 => 32.0,
        6 => 64.0,
        _ => return None,
    };
    let efficiency = match gen {
        1 | 2 => 8.0 / 10.0,
        3..=5 => 128.0 / 130.0,
        _ => 242.0 / 256.0,
    };
    // One bit per transfer per lane.
    Some(giga_transfers * 1e9 * efficiency / 8.0 * f64::from(width))
}

#[derive(Debug, Clone, Default)]
pub(super) struct DeviceAcc {
    name: String,
    samples: u64,
    util: MeanMax,
    idle: u64,
    mem_util: MeanMax,
    mem_used: MeanMax,
    mem_total: Option<u64>,
    rx: MeanMax,
    tx: MeanMax,
    power: MeanMax,
    clock: MeanMax,
    on_gpu: Option<bool>,
    process_match: Option<ProcessMatch>,
    process_mem_peak: Option<u64>,
    run_processes: Vec<RunProcess>,
    pcie_gen_max: Option<u32>,
    pcie_width_max: Option<u32>,
    pcie_gen_cur_peak: Option<u32>,
    pcie_width_cur_peak: Option<u32>,
}

impl DeviceAcc {
    pub(super) fn summary(&self, index: u32) -> DeviceSummary {
        DeviceSummary {
            index,
            name: self.name.clone(),
            samples: self.samples,
            util_mean_pct: self.util.mean32(),
            util_peak_pct: self.util.peak32(),
            util_idle_share: (self.util.n > 0).then(|| self.idle as f32 / self.util.n as f32),
            mem_util_mean_pct: self.mem_util.mean32(),
            mem_used_peak_bytes: self.mem_used.peak().map(|b| b as u64),
            mem_total_bytes: self.mem_total,
            pcie_rx_mean_bytes_per_s: self.rx.mean(),
            pcie_tx_mean_bytes_per_s: self.tx.mean(),
            power_mean_w: self.power.mean32(),
            sm_clock_mean_mhz: self.clock.mean32(),
            this_process_on_gpu: self.on_gpu,
            process_match: self.process_match,
            process_mem_peak_bytes: self.process_mem_peak,
            run_processes: self.run_processes.clone(),
            pcie_gen_max: self.pcie_gen_max,
            pcie_width_max: self.pcie_width_max,
            pcie_gen_current_peak: self.pcie_gen_cur_peak,
            pcie_width_current_peak: self.pcie_width_cur_peak,
            pcie_link_max_bytes_per_s: self
                .pcie_gen_max
                .zip(self.pcie_width_max)
                .and_then(|(g, w)| pcie_link_bytes_per_s(g, w)),
        }
    }
}

impl MachineAgg {
    /// Adds one GPU sample (or "off" notice).
    pub fn push_gpu(&mut self, s: &GpuSample) {
        self.gpu_n += 1;
        self.gpu_status = Some(s.status.clone());
        for d in &s.devices {
            let acc = self.devices.entry(d.index).or_default();
            if acc.name != d.name {
                acc.name.clone_from(&d.name);
            }
            acc.samples += 1;
            if let Some(u) = d.util_pct {
                acc.util.push(u as f64);
                if u <= GPU_IDLE_PCT {
                    acc.idle += 1;
                }
            }
            acc.mem_util.push_opt(d.mem_util_pct.map(f64::from));
            acc.mem_used.push_opt(d.mem_used_bytes.map(|b| b as f64));
            if d.mem_total_bytes.is_some() {
                acc.mem_total = d.mem_total_bytes;
            }
            acc.rx.push_opt(d.pcie_rx_bytes_per_s);
            acc.tx.push_opt(d.pcie_tx_bytes_per_s);
            acc.power.push_opt(d.power_w.map(f64::from));
            acc.clock.push_opt(d.sm_clock_mhz.map(f64::from));
            acc.on_gpu = merge_seen(acc.on_gpu, d.this_process_on_gpu);
            if d.process_match.is_some() {
                acc.process_match = d.process_match;
            }
            acc.process_mem_peak = acc.process_mem_peak.max(d.process_mem_used_bytes);
            for p in &d.run_processes {
                merge_run_process(&mut acc.run_processes, p);
            }
            acc.pcie_gen_max = d.pcie_gen_max.or(acc.pcie_gen_max);
            acc.pcie_width_max = d.pcie_width_max.or(acc.pcie_width_max);
            acc.pcie_gen_cur_peak = acc.pcie_gen_cur_peak.max(d.pcie_gen_current);
            acc.pcie_width_cur_peak = acc.pcie_width_cur_peak.max(d.pcie_width_current);
        }
        if s.status == GpuStatus::Ok {
            push_bounded(
                &mut self.gpu_series,
                self.window_ns,
                GpuPoint {
                    t_ns: s.t_ns,
                    util_pct: s.devices.iter().map(|d| d.util_pct).collect(),
                    mem_used_bytes: s.devices.iter().map(|d| d.mem_used_bytes).collect(),
                },
                |p| p.t_ns,
            );
        }
    }
}

/// Keeps one row per process: its latest name and its peak memory; new ones while there is room.
fn merge_run_process(acc: &mut Vec<RunProcess>, p: &RunProcess) {
    if let Some(have) = acc.iter_mut().find(|h| h.pid == p.pid) {
        have.mem_bytes = have.mem_bytes.max(p.mem_bytes);
        if !p.name.is_empty() {
            have.name.clone_from(&p.name);
        }
    } else if acc.len() < MAX_RUN_PROCESSES {
        acc.push(p.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::SEC;
    use super::*;
    use probes::sampler::GpuDevice;

    fn dev(index: u32, util: Option<f32>, used: u64, on: Option<bool>) -> GpuDevice {
        GpuDevice {
            index,
            name: format!("Fake GPU {index}"),
            util_pct: util,
            mem_util_pct: util.map(|u| u / 2.0),
            mem_used_bytes: Some(used),
            mem_total_bytes: Some(16 << 30),
            pcie_rx_bytes_per_s: Some(1024.0),
            pcie_tx_bytes_per_s: None,
            power_w: Some(70.0),
            sm_clock_mhz: Some(1410),
            this_process_on_gpu: on,
            ..GpuDevice::default()
        }
    }

    #[test]
    fn pcie_link_bandwidth_per_generation_and_width() {
        let gbs = |g, w| pcie_link_bytes_per_s(g, w).map(|b| (b / 1e7).round() / 100.0);
        assert_eq!(gbs(1, 16), Some(4.0));
        assert_eq!(gbs(3, 16), Some(15.75));
        assert_eq!(gbs(4, 16), Some(31.51));
        assert_eq!(gbs(5, 16), Some(63.02));
        assert_eq!(gbs(5, 8), Some(31.51));
        assert_eq!(gbs(6, 16), Some(121.0));
        assert_eq!(pcie_link_bytes_per_s(0, 16), None);
        assert_eq!(pcie_link_bytes_per_s(7, 16), None);
    }

    #[test]
    fn pcie_link_and_process_memory_keep_maxima_and_survive_unknown_samples() {
        let mut a = MachineAgg::default();
        let link = |gen_cur, width_cur, mem: Option<u64>| GpuDevice {
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
            pcie_gen_current: gen_cur,
            pcie_width_current: width_cur,
            process_match: mem.map(|_| ProcessMatch::Pid),
            process_mem_used_bytes: mem,
            ..dev(0, Some(50.0), 1, mem.map(|_| true))
        };
        // Idle at gen 1, then busy at gen 5 x8, then a sample where NVML could not say.
        let samples = [link(Some(1), Some(8), None), link(Some(5), Some(8), Some(300)), link(None, None, Some(200))];
        for (i, d) in samples.into_iter().enumerate() {
            a.push_gpu(&GpuSample { t_ns: i as u64, status: GpuStatus::Ok, devices: vec![d] });
        }
        a.push_gpu(&GpuSample { t_ns: 9, status: GpuStatus::Ok, devices: vec![dev(0, Some(1.0), 1, Some(false))] });
        let d = &a.summary().devices[0];
        assert_eq!((d.pcie_gen_max, d.pcie_width_max), (Some(5), Some(16)));
        assert_eq!((d.pcie_gen_current_peak, d.pcie_width_current_peak), (Some(5), Some(8)));
        assert_eq!(d.pcie_link_max_bytes_per_s, pcie_link_bytes_per_s(5, 16));
        assert_eq!(d.process_mem_peak_bytes, Some(300));
        assert_eq!(d.process_match, Some(ProcessMatch::Pid));
        assert_eq!(d.this_process_on_gpu, Some(true));
    }

    #[test]
    fn gpu_off_reports_reason_and_no_devices() {
        let mut a = MachineAgg::default();
        a.push_gpu(&GpuSample::off(1, "no NVIDIA driver"));
        let s = a.summary();
        assert_eq!(s.gpu_samples, 1);
        assert_eq!(s.gpu_status, Some(GpuStatus::Off("no NVIDIA driver".into())));
        assert!(s.devices.is_empty());
        assert_eq!(s.this_process_on_gpu, None);
        assert!(a.gpu_series().is_empty());
    }

    #[test]
    fn gpu_per_device_means_peaks_idle_share_and_presence() {
        let mut a = MachineAgg::default();
        let utils = [0.0, 15.0, 95.0, 100.0, 40.0];
        for (i, u) in utils.iter().enumerate() {
            let on0 = Some(i == 2); // seen once on device 0
            let sample = GpuSample {
                t_ns: i as u64 * SEC,
                status: GpuStatus::Ok,
                devices: vec![dev(0, Some(*u), 100 * (i as u64 + 1), on0), dev(1, None, 5, None)],
            };
            a.push_gpu(&sample);
        }
        let s = a.summary();
        assert_eq!(s.gpu_status, Some(GpuStatus::Ok));
        assert_eq!(s.devices.len(), 2);
        let d0 = &s.devices[0];
        assert_eq!(d0.samples, 5);
        assert_eq!(d0.util_mean_pct, Some(50.0));
        assert_eq!(d0.util_peak_pct, Some(100.0));
        assert_eq!(d0.util_idle_share, Some(0.2));
        assert_eq!(d0.mem_util_mean_pct, Some(25.0));
        assert_eq!(d0.mem_used_peak_bytes, Some(500));
        assert_eq!(d0.mem_total_bytes, Some(16 << 30));
        assert_eq!(d0.pcie_rx_mean_bytes_per_s, Some(1024.0));
        assert_eq!(d0.pcie_tx_mean_bytes_per_s, None);
        assert_eq!(d0.power_mean_w, Some(70.0));
        assert_eq!(d0.sm_clock_mean_mhz, Some(1410.0));
        assert_eq!(d0.this_process_on_gpu, Some(true));
        let d1 = &s.devices[1];
        assert_eq!(d1.name, "Fake GPU 1");
        assert_eq!(d1.util_mean_pct, None);
        assert_eq!(d1.util_idle_share, None);
        assert_eq!(d1.this_process_on_gpu, None);
        assert_eq!(s.this_process_on_gpu, Some(true));
        assert_eq!(a.gpu_series().len(), 5);
        assert_eq!(a.gpu_series()[2].util_pct, vec![Some(95.0), None]);
    }

    #[test]
    fn presence_merges_true_over_false_over_unknown() {
        assert_eq!(merge_seen(None, None), None);
        assert_eq!(merge_seen(None, Some(false)), Some(false));
        assert_eq!(merge_seen(Some(false), None), Some(false));
        assert_eq!(merge_seen(Some(false), Some(true)), Some(true));
        assert_eq!(merge_seen(Some(true), Some(false)), Some(true));
    }
}
