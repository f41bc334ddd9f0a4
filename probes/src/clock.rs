//! Clocks shared by every event: one monotonic time base, also across processes.

/// Monotonic nanoseconds (`CLOCK_MONOTONIC`): the same base in every process on the host,
/// so events from an attached program line up with the samplers'.
#[inline]
pub fn now_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// CPU time consumed by the calling thread, in nanoseconds (a system call: ≈ 250 ns).
#[inline]
pub fn thread_cpu_ns() -> u64 {
    read(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// CPU time consumed by the whole process, in nanoseconds.
#[inline]
pub fn process_cpu_ns() -> u64 {
    read(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Time the calling thread has spent runnable but without a core (waiting in a run queue:
/// preempted, or woken while every core was busy), ns; `None` where the kernel does not say.
///
/// The second field of `/proc/thread-self/schedstat`. The file is opened once per thread and
/// re-read with `pread` at offset 0 (the kernel regenerates it): one system call, ≈ 1 µs,
/// dearer than [`thread_cpu_ns`], so the Layer takes it only at span boundaries of stages
/// that also read the CPU clock, reusing the reading across back-to-back spans. Its first
/// field (on-CPU time) is not used: for the running thread it can lag by a scheduler tick.
pub fn thread_queue_ns() -> Option<u64> {
    SCHEDSTAT.try_with(SchedStat::read).ok().flatten()
}

/// Parses a `schedstat` line, `on_cpu_ns wait_ns slices`: (on-CPU ns, run-queue wait ns).
pub fn parse_schedstat(text: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(text).ok()?;
    let mut fields = text.split_ascii_whitespace();
    let cpu = fields.next()?.parse().ok()?;
    Some((cpu, fields.next()?.parse().ok()?))
}

/// The run-queue wait (second field) of a `schedstat` line.
fn parse_schedstat_wait(text: &[u8]) -> Option<u64> {
    parse_schedstat(text).map(|(_, wait)| wait)
}

/// The calling thread's `schedstat` file: -1 not opened yet, -2 unavailable.
struct SchedStat {
    fd: std::cell::Cell<i32>,
}

const SCHEDSTAT_UNAVAILABLE: i32 = -2;

impl SchedStat {
    fn read(&self) -> Option<u64> {
        let mut fd = self.fd.get();
        if fd == SCHEDSTAT_UNAVAILABLE {
            return None;
        }
        if fd < 0 {
            // SAFETY: a NUL-terminated constant path; the flags need no further arguments.
            fd = unsafe { libc::open(c"/proc/thread-self/schedstat".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            if fd < 0 {
                self.fd.set(SCHEDSTAT_UNAVAILABLE);
                return None;
            }
            self.fd.set(fd);
        }
        let mut buf = [0u8; 96];
        // SAFETY: `buf` is valid and writable for its length; `fd` is ours and open.
        let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        parse_schedstat_wait(&buf[..n as usize])
    }
}

impl Drop for SchedStat {
    fn drop(&mut self) {
        let fd = self.fd.get();
        if fd >= 0 {
            // SAFETY: the descriptor was opened by this thread's SchedStat and is closed once.
            unsafe { libc::close(fd) };
        }
    }
}

thread_local! {
    static SCHEDSTAT: SchedStat = const { SchedStat { fd: std::cell::Cell::new(-1) } };
}

#[inline]
fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; these clock ids exist on every Linux.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_clock_never_goes_back() {
        let a = now_ns();
        let b = now_ns();
        assert!(a > 0 && b >= a);
    }

    #[test]
    fn thread_cpu_clock_advances_with_work() {
        let a = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(x);
        assert!(thread_cpu_ns() > a);
    }

    #[test]
    fn schedstat_wait_is_the_second_field() {
        assert_eq!(parse_schedstat_wait(b"123456 789 12\n"), Some(789));
        assert_eq!(parse_schedstat_wait(b"123456\n"), None);
        assert_eq!(parse_schedstat_wait(b"x 789 12\n"), None);
        assert_eq!(parse_schedstat_wait(b""), None);
    }

    #[test]
    fn run_queue_wait_is_read_per_thread_and_never_goes_back() {
        // Every Linux kernel with CONFIG_SCHED_INFO (all distributions) has the file.
        let Some(a) = thread_queue_ns() else {
            panic!("/proc/thread-self/schedstat is unreadable here");
        };
        // A fresh open sees at least the first reading, and the cached descriptor's re-read
        // at least that: it is regenerated, not a copy of the first.
        let fresh = std::fs::read("/proc/thread-self/schedstat").ok().and_then(|t| parse_schedstat_wait(&t));
        let fresh = fresh.unwrap_or(0);
        let b = thread_queue_ns().unwrap_or(0);
        assert!(fresh >= a && b >= fresh, "{a} {fresh} {b}");
        let other = std::thread::spawn(thread_queue_ns).join().ok().flatten();
        assert!(other.is_some(), "each thread opens its own file");
    }
}
