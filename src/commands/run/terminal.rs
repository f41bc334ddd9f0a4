//! The terminal and job control of `pipeprof run`'s program: the terminal given to its process
//! group and taken back, Ctrl-Z and `fg` followed (the program stopped from the terminal stops
//! pipeprof's job with it), an orphaned group told apart.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Gives the terminal to the process group `pgid` (0: ours), ignoring the SIGTTOU a background
/// group gets for asking.
pub(super) fn give_terminal(pgid: libc::pid_t) {
    // SAFETY: plain libc calls on fd 0; the previous SIGTTOU disposition is put back.
    unsafe {
        let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        let target = if pgid == 0 { libc::getpgrp() } else { pgid };
        libc::tcsetpgrp(0, target);
        libc::signal(libc::SIGTTOU, old);
    }
}

/// Job control for a program that holds the terminal (`--once` on a terminal): Ctrl-Z stops
/// its group, not pipeprof, whose shell would wait for it forever. So when the program was
/// stopped from the terminal, pipeprof takes the terminal back and stops its own job
/// (SIGTSTP's default action: the shell gets its prompt); once continued, it continues the
/// program's group, with the terminal when `fg` gave it (after `bg`, without: a later `fg`
/// gives it then, since pipeprof's group is found holding it).
pub(super) fn follow_job_control(child_pid: libc::pid_t, continued: &AtomicBool) {
    if stopped_from_terminal(child_pid) {
        give_terminal(0);
        if !orphaned() {
            continued.store(false, Ordering::SeqCst);
            // SAFETY: a signal to our own process group (the shell's job).
            unsafe { libc::kill(0, libc::SIGTSTP) };
            // The stop reaches this thread a moment after kill returns: wait for the SIGCONT
            // that ends it (`fg` or `bg`), not for kill to return.
            while !continued.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if own_terminal() {
            give_terminal(child_pid);
        }
        // SAFETY: the program's process group, which we started.
        unsafe { libc::kill(-child_pid, libc::SIGCONT) };
    } else if own_terminal() {
        // `fg` after `bg`: the terminal is ours, its keys are the program's.
        give_terminal(child_pid);
    }
}

/// Whether our process group is orphaned (no parent outside it in our session: nobody could
/// continue it, and the kernel drops a SIGTSTP sent to it).
pub(super) fn orphaned() -> bool {
    // SAFETY: read-only process queries.
    unsafe {
        let parent = libc::getppid();
        libc::getpgid(parent) == libc::getpgrp() || libc::getsid(parent) != libc::getsid(0)
    }
}

/// Whether the program was stopped by the terminal (Ctrl-Z's SIGTSTP, or a read or write of
/// a background job: SIGTTIN, SIGTTOU) since the last look. Its exit is left for `try_wait`.
pub(super) fn stopped_from_terminal(pid: libc::pid_t) -> bool {
    // SAFETY: waitid on our own child with a zeroed siginfo we own; WNOHANG never blocks and
    // without WEXITED an exit is not reaped here.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        if libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WSTOPPED | libc::WNOHANG) != 0 {
            return false;
        }
        info.si_pid() == pid && matches!(info.si_status(), libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU)
    }
}

/// Whether this process's group owns the terminal on stdin.
pub(super) fn own_terminal() -> bool {
    // SAFETY: read-only libc queries.
    std::io::stdin().is_terminal() && unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}
