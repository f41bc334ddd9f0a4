#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The GPU sampler through the real nvml-wrapper, against the fake NVML driver in
//! `fake_nvml.c` (scripted with `FAKE_NVML_*` environment variables).

use probes::sampler::{self, GpuInitError, GpuSample, GpuSampler, GpuStatus, ProcessMatch, SamplerConfig, Watch};
use probes::{Event, Probe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The fake reads its script from the environment at `nvmlInit_v2`, which is process-wide:
/// tests that set it run one at a time.
static ENV_LOCK: Mutex<()> = Mutex::new(());

const VARS: &[&str] = &[
    "FAKE_NVML_INIT_FAIL",
    "FAKE_NVML_DEVICES",
    "FAKE_NVML_UTIL",
    "FAKE_NVML_MEM_UTIL",
    "FAKE_NVML_MEM_TOTAL_MIB",
    "FAKE_NVML_MEM_USED_MIB",
    "FAKE_NVML_PID_FILE",
    "FAKE_NVML_SEEN_FILE",
    "FAKE_NVML_PID",
    "FAKE_NVML_NO_POWER",
    "FAKE_NVML_PCIE_RX_KBS",
    "FAKE_NVML_PCIE_TX_KBS",
    "FAKE_NVML_PID_MEM_MIB",
    "FAKE_NVML_PCIE_GEN_MAX",
    "FAKE_NVML_PCIE_GEN_CUR",
    "FAKE_NVML_PCIE_WIDTH_MAX",
    "FAKE_NVML_PCIE_WIDTH_CUR",
];

fn fake_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpu_sampler");
        fake_nvml::build(&dir).unwrap_or_else(|e| panic!("building the fake NVML driver: {e}"))
    })
}

/// Holds the lock and a clean script; `vars` are set on top.
fn script(vars: &[(&str, String)]) -> MutexGuard<'static, ()> {
    let guard = ENV_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    for v in VARS {
        std::env::remove_var(v);
    }
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    guard
}

fn open() -> GpuSampler {
    GpuSampler::open(Some(fake_lib()), Watch::Process(std::process::id())).expect("fake NVML opens")
}

#[test]
fn two_fake_devices_report_names_memory_and_the_utilisation_sequence() {
    let _g = script(&[("FAKE_NVML_DEVICES", "2".into()), ("FAKE_NVML_UTIL", "0,15,95,100,40".into())]);
    let mut gpu = open();
    assert_eq!(gpu.device_count(), 2);
    let samples: Vec<GpuSample> = (0..6).map(|_| gpu.sample()).collect();
    for s in &samples {
        assert_eq!(s.status, GpuStatus::Ok);
        assert_eq!(s.devices.len(), 2);
    }
    for i in 0..2usize {
        let util: Vec<Option<f32>> = samples.iter().map(|s| s.devices[i].util_pct).collect();
        let want = [0.0, 15.0, 95.0, 100.0, 40.0, 40.0].map(Some);
        assert_eq!(util, want, "device {i}: the sequence advances per call, the last repeats");
    }
    let d1 = &samples[0].devices[1];
    assert_eq!(d1.index, 1);
    assert_eq!(d1.name, "Fake GPU 1");
    assert_eq!(samples[0].devices[0].name, "Fake GPU 0");
    assert_eq!(d1.mem_util_pct, Some(20.0));
    assert_eq!(d1.mem_total_bytes, Some(16384 << 20));
    assert_eq!(d1.mem_used_bytes, Some(2048 << 20));
    assert_eq!(d1.pcie_rx_bytes_per_s, Some(1000.0 * 1024.0));
    assert_eq!(d1.pcie_tx_bytes_per_s, Some(500.0 * 1024.0));
    assert_eq!(d1.power_w, Some(76.0));
    assert_eq!(d1.sm_clock_mhz, Some(1410));
    assert!(samples.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
}

#[test]
fn this_process_is_seen_only_on_the_device_that_lists_its_pid() {
    let _g = script(&[
        ("FAKE_NVML_DEVICES", "2".into()),
        ("FAKE_NVML_PID", std::process::id().to_string()),
        ("FAKE_NVML_MEM_USED_MIB", "3".into()),
    ]);
    let s = open().sample();
    assert_eq!(s.devices[0].this_process_on_gpu, Some(true));
    assert_eq!(s.devices[1].this_process_on_gpu, Some(false));
    // The same device 1, listing no process while 2 GiB are in use: processes hidden from
    // NVML (a container), so whether it is ours cannot be told.
    drop(_g);
    let _g = script(&[("FAKE_NVML_DEVICES", "2".into()), ("FAKE_NVML_PID", std::process::id().to_string())]);
    assert_eq!(open().sample().devices[1].this_process_on_gpu, None);
}

fn old_driver_lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gpu_sampler");
        fake_nvml::build_old_driver(&dir).unwrap_or_else(|e| panic!("building the old fake NVML driver: {e}"))
    })
}

#[test]
fn pcie_link_and_this_process_memory_come_from_nvml() {
    let _g = script(&[
        ("FAKE_NVML_DEVICES", "2".into()),
        ("FAKE_NVML_PID", format!("1,{}", std::process::id())),
        ("FAKE_NVML_PID_MEM_MIB", "300".into()),
        ("FAKE_NVML_PCIE_GEN_MAX", "5".into()),
        ("FAKE_NVML_PCIE_GEN_CUR", "4".into()),
        ("FAKE_NVML_PCIE_WIDTH_MAX", "16".into()),
        ("FAKE_NVML_PCIE_WIDTH_CUR", "8".into()),
        ("FAKE_NVML_MEM_USED_MIB", "3".into()),
    ]);
    let s = open().sample();
    let d0 = &s.devices[0];
    assert_eq!((d0.pcie_gen_max, d0.pcie_gen_current), (Some(5), Some(4)));
    assert_eq!((d0.pcie_width_max, d0.pcie_width_current), (Some(16), Some(8)));
    assert_eq!(d0.this_process_on_gpu, Some(true));
    assert_eq!(d0.process_match, Some(ProcessMatch::Pid));
    assert_eq!(d0.process_mem_used_bytes, Some(300 << 20));
    // Device 1 lists no process: not this one, no memory of ours.
    let d1 = &s.devices[1];
    assert_eq!((d1.this_process_on_gpu, d1.process_mem_used_bytes), (Some(false), None));
    assert_eq!(d1.pcie_gen_max, Some(5));
}

#[test]
fn process_memory_not_available_leaves_presence_known() {
    let _g = script(&[("FAKE_NVML_PID", std::process::id().to_string()), ("FAKE_NVML_PID_MEM_MIB", "na".into())]);
    let d = &open().sample().devices[0];
    assert_eq!(d.this_process_on_gpu, Some(true));
    assert_eq!(d.process_mem_used_bytes, None);
}

#[test]
fn an_unknown_host_pid_is_not_this_process_without_cuda_open() {
    // A PID that exists nowhere here, as NVML lists from inside a container: this test process
    // has not opened CUDA, so it is not the one, in a container or not.
    let _g = script(&[("FAKE_NVML_PID", u32::MAX.to_string())]);
    let d = &open().sample().devices[0];
    assert_eq!(d.this_process_on_gpu, Some(false));
    assert_eq!((d.process_match, d.process_mem_used_bytes), (None, None));
}

#[test]
fn older_driver_without_link_or_process_calls_leaves_them_unknown() {
    let _g = script(&[("FAKE_NVML_PID", std::process::id().to_string())]);
    let mut gpu =
        GpuSampler::open(Some(old_driver_lib()), Watch::Process(std::process::id())).expect("old fake NVML opens");
    let d = &gpu.sample().devices[0];
    assert_eq!((d.pcie_gen_max, d.pcie_gen_current, d.pcie_width_max, d.pcie_width_current), (None, None, None, None));
    assert_eq!((d.this_process_on_gpu, d.process_mem_used_bytes), (None, None));
    // Everything the old driver has still arrives.
    assert_eq!(d.util_pct, Some(50.0));
    assert_eq!(d.name, "Fake GPU 0");
    assert_eq!(d.pcie_rx_bytes_per_s, Some(1000.0 * 1024.0));
}

#[test]
fn another_process_on_the_gpu_is_not_this_process() {
    let _g = script(&[("FAKE_NVML_PID", "1".into())]);
    let s = open().sample();
    assert_eq!(s.devices.len(), 1);
    assert_eq!(s.devices[0].this_process_on_gpu, Some(false));
}

#[test]
fn unsupported_field_becomes_none_and_the_rest_survives() {
    let _g = script(&[("FAKE_NVML_NO_POWER", "1".into())]);
    let d = &open().sample().devices[0];
    assert_eq!(d.power_w, None);
    assert_eq!(d.util_pct, Some(50.0));
    assert_eq!(d.sm_clock_mhz, Some(1410));
}

#[test]
fn init_failure_gives_a_reason_with_the_code() {
    let _g = script(&[("FAKE_NVML_INIT_FAIL", "9".into())]);
    let e = GpuSampler::open(Some(fake_lib()), Watch::Process(1)).expect_err("init must fail");
    assert!(matches!(e, GpuInitError::InitFailed { code: 9, .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("nvmlInit_v2 returned 9"), "{msg}");
    assert!(msg.contains("driver is not loaded"), "{msg}");
    assert!(msg.ends_with("GPU sampling off"), "{msg}");
}

#[test]
fn missing_library_gives_a_not_found_reason() {
    let lib = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libnvidia-ml.so.1");
    let e = GpuSampler::open(Some(&lib), Watch::Process(1)).expect_err("no library there");
    assert!(matches!(e, GpuInitError::NotLoadable { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&lib.display().to_string()) && msg.contains("PIPEPROF_NVML_LIB"), "{msg}");
}

#[test]
fn default_library_absent_says_no_driver() {
    // On a machine with a driver this proves only that opening does not panic.
    match GpuSampler::open(None, Watch::Process(1)) {
        Ok(_) => {}
        Err(GpuInitError::NoDriver { .. }) => {}
        Err(e) => assert!(e.to_string().ends_with("GPU sampling off"), "{e}"),
    }
    let msg = GpuInitError::NoDriver { detail: String::new() }.to_string();
    assert_eq!(msg, "no NVIDIA driver (libnvidia-ml.so.1 not found): GPU sampling off");
}

fn gpu_events(rx: &crossbeam_channel::Receiver<Event>) -> Vec<GpuSample> {
    rx.try_iter()
        .filter_map(|e| match e {
            Event::Gpu(s) => Some(*s),
            _ => None,
        })
        .collect()
}

#[test]
fn sampler_thread_sends_fake_gpu_samples_through_the_probe() {
    let _g = script(&[("FAKE_NVML_DEVICES", "2".into()), ("FAKE_NVML_PID", std::process::id().to_string())]);
    let (probe, rx) = Probe::new(1024);
    let cfg = SamplerConfig { nvml_lib: Some(fake_lib().to_path_buf()), ..SamplerConfig::default() };
    let stats = sampler::start(probe, cfg).expect("samplers start").stop();
    let gpu = gpu_events(&rx);
    // One at start and one at stop, whatever happened in between.
    assert!(gpu.len() >= 2, "{gpu:?}");
    assert_eq!(stats.gpu.samples as usize, gpu.len());
    let last = gpu.last().expect("samples");
    assert_eq!(last.status, GpuStatus::Ok);
    assert_eq!(last.devices.len(), 2);
    assert!(last.devices.iter().any(|d| d.this_process_on_gpu == Some(true)), "{last:?}");
}

#[test]
fn missing_driver_is_reported_once_without_retrying() {
    let _g = script(&[]);
    let (probe, rx) = Probe::new(1024);
    let lib = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-dir/libnvidia-ml.so.1");
    let cfg = SamplerConfig { hz: 100.0, nvml_lib: Some(lib), ..SamplerConfig::default() };
    let stats = sampler::start(probe, cfg).expect("samplers start").stop();
    let gpu = gpu_events(&rx);
    assert_eq!(gpu.len(), 1, "{gpu:?}");
    assert_eq!(stats.gpu.samples, 1);
    let reason = gpu[0].status.off_reason().expect("off");
    assert!(reason.contains("could not be loaded"), "{reason}");
    assert!(gpu[0].devices.is_empty());
}

#[test]
fn gpu_off_in_config_sends_no_gpu_event() {
    let (probe, rx) = Probe::new(1024);
    let cfg = SamplerConfig { gpu: false, ..SamplerConfig::default() };
    let stats = sampler::start(probe, cfg).expect("samplers start").stop();
    assert!(gpu_events(&rx).is_empty());
    assert_eq!(stats.gpu.samples, 0);
    assert!(stats.host.samples >= 1);
}
