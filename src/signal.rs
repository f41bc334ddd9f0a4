//! Ctrl-C and SIGTERM ask the run to stop cleanly; a second one exits at once.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    if STOP.swap(true, Ordering::SeqCst) {
        // Second signal: the user means it. Only async-signal-safe calls here.
        unsafe { libc::_exit(128 + sig) };
    }
}

/// Installs the handlers for SIGINT and SIGTERM.
pub fn install() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    // SAFETY: the handler only touches an atomic and calls _exit, both async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

/// The flag the training loop polls.
pub fn flag() -> &'static AtomicBool {
    &STOP
}
