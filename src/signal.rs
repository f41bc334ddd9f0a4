//! Ctrl-C and SIGTERM ask the run to stop cleanly; a second one exits at once.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // Second signal: the user means it. Only async-signal-safe calls here.
        unsafe { libc::_exit(128 + sig) };
    }
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Installs the handlers for SIGINT and SIGTERM.
pub fn install() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    // SAFETY: the handler only touches atomics and calls _exit, both async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

/// The flag the training loop polls (also set by the live view's `q`).
pub fn flag() -> &'static AtomicBool {
    &STOP
}

/// The signal that stopped the run, if one did: the process exits with 128 + it, after
/// writing the report and closing its files, as shells expect.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Forgets a received signal (after a clean detach, which is not an interruption).
pub fn clear() {
    SIGNAL.store(0, Ordering::SeqCst);
}
