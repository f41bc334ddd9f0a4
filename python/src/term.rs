//! SIGTERM in a worker process of a run (a DataLoader worker, a Keras pool worker): what it
//! sent must reach the run, and the process must still end at once, as `SIG_DFL` ends it.
//!
//! A Python-level handler would run only when the main thread next returns to the
//! interpreter: a worker inside one long C call (a decoder, `hashlib`) would ignore
//! `terminate()` until the call returns, and `signal.getsignal` would change. So the handler is
//! native and does one async-signal-safe thing, a byte written to a pipe. A thread of ours
//! reads it; asks the main thread, through Python's pending calls, to send the spans it holds
//! in its own batch (it runs that at its next bytecode, so a thread inside a C call is waited
//! for at most [`MAIN_WAIT`]); finishes the producer (its queued events reach the run, within
//! [`FLUSH_LIMIT`]); puts `SIG_DFL` back and raises SIGTERM again: the process dies of the
//! signal, as before.
//!
//! Installed only where SIGTERM's disposition is `SIG_DFL` (or already ours, inherited over a
//! fork): a program's own handler is never replaced, and one it installs later replaces ours.
//! In a process forked from the one that installed it, the inherited handler acts as `SIG_DFL`
//! until that process installs it again: it never writes to its parent's pipe.
//! Python's `signal.getsignal` reads Python's own table, which this does not touch.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest time the flush may hold the process after SIGTERM.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// Longest wait for the main thread to send its own batch (it may be inside a long C call).
const MAIN_WAIT: Duration = Duration::from_millis(250);

/// Set when the main thread has sent its batch after SIGTERM.
static MAIN_SENT: (Mutex<bool>, Condvar) = (Mutex::new(false), Condvar::new());

/// Run by the main thread at its next bytecode (a Python pending call): its span batch is its
/// own thread-local, which no other thread can send. It then holds the GIL until the process
/// dies, as a Python handler did: the program does no more work (a worker would take its next
/// task) whose spans would go to a producer already finished.
extern "C" fn send_main_batch(_: *mut std::ffi::c_void) -> std::ffi::c_int {
    probes::flush_thread();
    let (sent, cv) = &MAIN_SENT;
    *sent.lock().unwrap_or_else(|e| e.into_inner()) = true;
    cv.notify_all();
    // Bounded: should the process somehow survive its SIGTERM, the program goes on.
    std::thread::sleep(FLUSH_LIMIT + Duration::from_secs(1));
    0
}

/// Asks the main thread to send its batch and waits for it at most [`MAIN_WAIT`].
fn main_thread_sends() {
    // SAFETY: Py_AddPendingCall may be called from any thread without the GIL.
    if unsafe { pyo3::ffi::Py_AddPendingCall(Some(send_main_batch), std::ptr::null_mut()) } != 0 {
        return;
    }
    let (sent, cv) = &MAIN_SENT;
    let guard = sent.lock().unwrap_or_else(|e| e.into_inner());
    let _ = cv.wait_timeout_while(guard, MAIN_WAIT, |sent| !*sent);
}

/// The pipe's writing end for the handler; -1 when none.
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// The process that installed the handler and owns [`WAKE`]'s reader; 0 when none.
static OWNER: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_term(_sig: libc::c_int) {
    // A process forked from the owner inherits this handler and the owner's pipe; unless it
    // installed its own (a worker's connect failed, or it is no worker at all), a byte written
    // there would end its parent, not itself (issue 52 L3). It ends as SIG_DFL ends it.
    // SAFETY: getpid is async-signal-safe.
    if unsafe { libc::getpid() } != OWNER.load(Ordering::SeqCst) {
        die_of_term();
        return;
    }
    let fd = WAKE.load(Ordering::SeqCst);
    let byte = 1u8;
    // SAFETY: write(2) is async-signal-safe; a failed write leaves the fallback below.
    let wrote = fd >= 0 && unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) } == 1;
    if !wrote {
        die_of_term();
    }
}

/// Puts `SIG_DFL` back and raises SIGTERM on the calling thread (unblocked there): the
/// process ends as it would have without pipeprof.
fn die_of_term() {
    // SAFETY: signal, sigemptyset, sigaddset, pthread_sigmask and raise are async-signal-safe
    // and take valid pointers to locals.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGTERM);
    }
}

/// SIGTERM's current handler address (`SIG_DFL` is 0).
fn current_handler() -> Option<libc::sighandler_t> {
    // SAFETY: a query: a null new action and a zeroed out-parameter.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) == 0).then_some(old.sa_sigaction)
    }
}

/// In a worker process (after its producer connected, and again after each fork, where the
/// thread is gone): makes SIGTERM flush with `flush` before it ends the process. Returns
/// whether it did (false where the program has its own handler, or the pipe or thread
/// could not be made).
pub fn flush_on_term(flush: fn()) -> bool {
    let ours = on_term as extern "C" fn(libc::c_int) as libc::sighandler_t;
    match current_handler() {
        Some(h) if h == libc::SIG_DFL || h == ours => {}
        _ => return false,
    }
    let mut fds = [-1; 2];
    // SAFETY: a two-int array for pipe2's out-parameter.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return false;
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    let waiter = std::thread::Builder::new().name("pp-term".into()).spawn(move || {
        let mut byte = 0u8;
        loop {
            // SAFETY: reads one byte into a local from the pipe this thread owns.
            let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
            if n == 1 {
                break;
            }
            if n == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return;
            }
        }
        main_thread_sends();
        flush_within(flush, FLUSH_LIMIT);
        die_of_term();
    });
    if waiter.is_err() {
        // SAFETY: closing the two descriptors just made.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        return false;
    }
    // An inherited pipe (a forked worker's) has no reader here: replaced, never closed while
    // a handler might write to it. The owner last: until it is this process, a SIGTERM here
    // ends it at once rather than write to the inherited pipe.
    WAKE.store(write_end, Ordering::SeqCst);
    // SAFETY: getpid cannot fail.
    OWNER.store(unsafe { libc::getpid() }, Ordering::SeqCst);
    // SAFETY: installs a handler that only calls async-signal-safe functions.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = ours;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut()) == 0
    }
}

/// Runs `flush` on its own thread and waits for it at most `limit`: a stuck socket never
/// keeps a terminated process alive.
fn flush_within(flush: fn(), limit: Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    if std::thread::Builder::new()
        .name("pp-term-flush".into())
        .spawn(move || {
            flush();
            let _ = tx.send(());
        })
        .is_ok()
    {
        let _ = rx.recv_timeout(limit.saturating_sub(started.elapsed()));
    }
}
