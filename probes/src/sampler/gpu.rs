//! The GPU sampler: NVML through nvml-wrapper, which loads the driver library at run time.

use super::{GpuDevice, GpuSample, GpuStatus};
use crate::clock;
use nvml_wrapper::enum_wrappers::device::{Clock, PcieUtilCounter};
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
    pub fn from_init(lib: Option<&Path>, err: NvmlError) -> Self {
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

/// Samples every GPU NVML lists. Holds NVML open (shut down on drop).
pub struct GpuSampler {
    nvml: Nvml,
    count: u32,
    pid: u32,
}

impl std::fmt::Debug for GpuSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSampler").field("count", &self.count).field("pid", &self.pid).finish_non_exhaustive()
    }
}

impl GpuSampler {
    /// Loads NVML (`lib`, or `libnvidia-ml.so.1` when `None`) and counts the devices; `pid`
    /// is the process whose compute contexts are looked for.
    pub fn open(lib: Option<&Path>, pid: u32) -> Result<Self, GpuInitError> {
        let nvml = match lib {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|e| GpuInitError::from_init(lib, e))?;
        let count = nvml.device_count().map_err(|e| GpuInitError::CountFailed { message: e.to_string() })?;
        if count == 0 {
            return Err(GpuInitError::NoDevices);
        }
        Ok(GpuSampler { nvml, count, pid })
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
        d.this_process_on_gpu = dev.running_compute_processes().ok().map(|ps| ps.iter().any(|p| p.pid == self.pid));
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_default_library_says_no_driver() {
        let e = GpuSampler::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")), 1).unwrap_err();
        assert!(matches!(e, GpuInitError::NotLoadable { .. }), "{e:?}");
        let msg = GpuInitError::NoDriver { detail: String::new() }.to_string();
        assert_eq!(msg, "no NVIDIA driver (libnvidia-ml.so.1 not found): GPU sampling off");
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
