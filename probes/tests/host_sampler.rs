#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The host sampler on this machine: CPU from a busy thread, storage reads from a file read
//! after dropping it from the page cache, and the sampler thread.

use probes::clock;
use probes::fsinfo::{self, FsKind};
use probes::sampler::{
    self, cpu_pct, io_accounting_here, storage_reads_measurable, HostSampler, IoAccounting, SamplerConfig,
};
use probes::{Event, Probe, ThreadRole};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

const BUSY_NS: u64 = 100_000_000;

#[test]
fn busy_thread_raises_process_cpu_and_shows_in_its_thread_row() {
    let mut host = HostSampler::new(std::process::id(), true, IoAccounting::ASSUMED).expect("sampler");
    let before = host.sample();
    let (done_tx, done_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let busy = std::thread::Builder::new()
        .name("busy-0".into())
        .spawn(move || {
            probes::set_thread_role(ThreadRole::loader(7));
            // A fixed amount of CPU work, measured on the thread's own CPU clock.
            let start = clock::thread_cpu_ns();
            let mut x = 0u64;
            while clock::thread_cpu_ns() - start < BUSY_NS {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            done_tx.send(()).ok();
            // Stay alive until the sample is taken, so the thread is listed.
            release_rx.recv().ok();
            x
        })
        .expect("spawn");
    done_rx.recv().expect("busy thread finished its work");
    let after = host.sample();
    release_tx.send(()).ok();
    busy.join().ok();

    assert!(after.process_cpu_ns - before.process_cpu_ns >= BUSY_NS);
    let dt = after.t_ns - before.t_ns;
    assert_eq!(after.process_cpu_pct, cpu_pct(before.process_cpu_ns, after.process_cpu_ns, dt));
    assert!(after.process_cpu_pct > 0.0);
    let row = after.threads.iter().find(|t| t.name == "busy-0").expect("busy thread listed");
    // /proc counts in clock ticks (10 ms): allow one tick of rounding.
    assert!(row.cpu_ns + 10_000_000 >= BUSY_NS, "{row:?}");
    assert!(row.cpu_pct > 0.0);
    assert_eq!(row.role, ThreadRole::loader(7));
}

#[test]
fn this_processs_threads_carry_the_role_they_were_given() {
    let mut host = HostSampler::new(std::process::id(), true, IoAccounting::ASSUMED).expect("sampler");
    let (ready_tx, ready_rx) = mpsc::channel();
    let spawn = |name: &str, role: Option<ThreadRole>| {
        let ready_tx = ready_tx.clone();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Some(r) = role {
                    probes::set_thread_role(r);
                }
                ready_tx.send(()).ok();
                // Stay alive until the sample is taken, so the thread is listed.
                release_rx.recv().ok();
            })
            .expect("spawn");
        (t, release_tx)
    };
    let threads = [spawn("role-a", Some(ThreadRole::Compute(3))), spawn("role-b", None)];
    ready_rx.recv().expect("first thread ready");
    ready_rx.recv().expect("second thread ready");
    let s = host.sample();
    for (t, release) in threads {
        release.send(()).ok();
        t.join().expect("thread");
    }
    let role = |name: &str| s.threads.iter().find(|t| t.name == name).map(|t| t.role);
    assert_eq!(role("role-a"), Some(ThreadRole::Compute(3)), "{:?}", s.threads);
    assert_eq!(role("role-b"), None, "no role given: not listed, none made up from the name");
    // Off: no thread is read.
    let mut off = HostSampler::new(std::process::id(), false, IoAccounting::ASSUMED).expect("sampler");
    assert!(off.sample().threads.is_empty());
}

#[test]
fn sample_has_cores_memory_and_iowait() {
    let mut host = HostSampler::new(std::process::id(), false, IoAccounting::ASSUMED).expect("sampler");
    let s = host.sample();
    assert!(!s.per_core_pct.is_empty());
    assert!(s.per_core_pct.iter().all(|c| (0.0..=100.0).contains(c)), "{:?}", s.per_core_pct);
    assert!((0.0..=100.0).contains(&s.global_cpu_pct));
    assert!(s.rss_bytes > 0);
    assert!(s.threads.is_empty(), "thread rows off, none");
    if Path::new("/proc/stat").exists() {
        assert!(s.iowait_pct.is_some());
    }
    assert!(s.t_ns <= clock::now_ns());
}

/// A directory on a block device, where a read after `DONTNEED` must go to storage.
fn local_scratch_dir() -> Option<tempfile::TempDir> {
    [PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from(env!("CARGO_MANIFEST_DIR"))]
        .into_iter()
        .find(|d| fsinfo::detect(d).kind == FsKind::Local)
        .and_then(|d| tempfile::tempdir_in(d).ok())
}

#[test]
fn uncached_file_read_is_seen_as_storage_bytes_or_reported_unmeasurable() {
    let acc = io_accounting_here();
    assert_eq!(storage_reads_measurable(), acc.reads);
    let Some(dir) = local_scratch_dir() else {
        eprintln!("no local-disk scratch directory: nothing to read from storage");
        return;
    };
    let path = dir.path().join("data.bin");
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(&vec![7u8; 4 << 20]).expect("write");
    f.sync_all().expect("fsync");
    // SAFETY: a valid descriptor; the advice drops this file's clean pages from the cache.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    drop(f);

    let mut host = HostSampler::new(std::process::id(), false, acc).expect("sampler");
    let before = host.sample();
    let mut buf = Vec::new();
    std::fs::File::open(&path).and_then(|mut f| f.read_to_end(&mut buf)).expect("read");
    let after = host.sample();
    assert_eq!(buf.len(), 4 << 20);
    eprintln!("io accounting here: {acc:?}; storage reads: {:?} B/s", after.read_bytes_per_s);
    if acc.reads {
        let rate = after.read_bytes_per_s.expect("measurable, so reported");
        let bytes = rate * (after.t_ns - before.t_ns) as f64 / 1e9;
        assert!(bytes > 0.0, "read {bytes} bytes from storage");
    } else {
        assert_eq!(after.read_bytes_per_s, None, "not measurable here: None, never 0");
    }
    // Read system calls see the bytes wherever they came from.
    if let Some(rchar) = after.syscall_read_bytes_per_s {
        assert!(rchar > 0.0);
    }
}

#[test]
fn hidden_io_accounting_reports_none_not_zero() {
    let none = IoAccounting { reads: false, writes: false };
    let mut host = HostSampler::new(std::process::id(), false, none).expect("sampler");
    let s = host.sample();
    assert_eq!(s.read_bytes_per_s, None);
    assert_eq!(s.write_bytes_per_s, None);
}

#[test]
fn sampler_thread_sends_host_samples_and_a_final_one() {
    let (probe, rx) = Probe::new(1024);
    let cfg = SamplerConfig { gpu: false, hz: 100.0, ..SamplerConfig::default() };
    let stats = sampler::start(probe, cfg).expect("start").stop();
    let hosts: Vec<_> = rx
        .try_iter()
        .filter_map(|e| match e {
            Event::Host(s) => Some(s),
            _ => None,
        })
        .collect();
    assert!(!hosts.is_empty(), "stop takes a final sample");
    assert_eq!(hosts.len() as u64, stats.host.samples);
    assert!(hosts.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
    assert!(stats.host.cpu_ns > 0);
}

/// A child that holds `mb` MB of written pages until its stdin closes.
fn child_holding(mb: usize) -> (std::process::Child, std::process::ChildStdin) {
    use std::io::BufRead;
    let code = format!("import sys\nb = b'\\x01' * ({mb} << 20)\nprint('ready', flush=True)\nsys.stdin.read()\n");
    let mut child = std::process::Command::new("python3")
        .args(["-c", &code])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (the test's child process) must be installed");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read");
    assert_eq!(line.trim(), "ready");
    let stdin = child.stdin.take().expect("stdin");
    (child, stdin)
}

#[test]
fn program_memory_is_the_process_tree_and_a_host_is_apart() {
    let (mut child, stdin) = child_holding(200);
    let own = HostSampler::new(std::process::id(), false, IoAccounting::ASSUMED).expect("sampler").sample();
    let hosted =
        HostSampler::new(std::process::id(), false, IoAccounting::ASSUMED).expect("sampler").program_below().sample();
    drop(stdin);
    child.wait().expect("child ends when its stdin closes");

    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    // The tree: this test process and its child, both counted.
    assert!(mb(own.rss_bytes) >= 200.0, "tree RSS {:.0} MB holds the child's 200 MB", mb(own.rss_bytes));
    assert_eq!(own.rss_processes, 2, "this process and its child");
    assert_eq!(own.host_rss_bytes, None, "the sampled process is the program");
    // Hosted (pipeprof run): the program is the child alone; the host's own memory apart.
    assert_eq!(hosted.rss_processes, 1, "the child only");
    assert!(mb(hosted.rss_bytes) >= 200.0, "the program's RSS {:.0} MB is the child's", mb(hosted.rss_bytes));
    let host = hosted.host_rss_bytes.expect("the host's own memory is reported apart");
    assert!(host > 0);
    assert!(hosted.rss_bytes < own.rss_bytes, "the host's {host} bytes are not in the program's");
}
