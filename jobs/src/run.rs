//! The `main` of every job: errors and panics become one line on stderr and a non-zero exit;
//! SIGTERM/SIGINT end the run early but still print the final summary.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe only: an atomic swap, and _exit on the second signal (a job stuck in
    // the driver can still be stopped).
    if STOP.swap(true, Ordering::Relaxed) {
        // SAFETY: _exit is async-signal-safe and touches no Rust-owned memory; ending the process
        // without unwinding or running destructors is the intent (second signal).
        unsafe { libc::_exit(128 + sig) };
    }
}

/// Whether SIGTERM or SIGINT asked the job to stop. Job loops check it each iteration and
/// then finish normally (final line, exit 0).
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Sleeps until `deadline`, in slices of at most 50 ms so a stop request is seen promptly.
/// Returns `false` if a stop was requested (possibly before the deadline).
pub fn sleep_until(deadline: Instant) -> bool {
    loop {
        if stop_requested() {
            return false;
        }
        let now = Instant::now();
        if now >= deadline {
            return true;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
    }
}

/// Waits until `parties` jobs given the same `dir` have reached this call (each leaves a file
/// named by its pid there), polling every millisecond so they leave within about one of each
/// other. Returns `Ok(false)` if a stop was requested first; an error if the others have not
/// come within `timeout` (a job that failed to start), naming how many did.
pub fn barrier(dir: &std::path::Path, parties: usize, timeout: Duration) -> anyhow::Result<bool> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("--barrier {}", dir.display()))?;
    std::fs::write(dir.join(std::process::id().to_string()), b"")
        .with_context(|| format!("--barrier {}: cannot write there", dir.display()))?;
    let deadline = Instant::now() + timeout;
    loop {
        let here = std::fs::read_dir(dir)
            .with_context(|| format!("--barrier {}", dir.display()))?
            .count();
        if here >= parties {
            return Ok(true);
        }
        if stop_requested() {
            return Ok(false);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "--barrier {}: {here} of --parties {parties} jobs arrived within {timeout:?}; \
             did the others fail to start?",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn install_stop_handlers() {
    // SAFETY: `sa` is a zeroed (valid) sigaction owned by this frame, filled before being passed
    // by pointer; the installed handler `on_signal` is async-signal-safe (an atomic swap and
    // `_exit`), so it may interrupt any code.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// Runs `body`; on error prints `"<job>: <error>"` on stderr and exits with 1. A panic (e.g. a
/// driver symbol cudarc needs is missing) prints `"<job>: internal error: ..."` and exits with 101.
pub fn main_with(job: &'static str, body: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    std::panic::set_hook(Box::new(move |info| {
        let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = info.payload().downcast_ref::<String>() {
            s.clone()
        } else {
            "panic".to_string()
        };
        let at = info
            .location()
            .map(|l| format!(" (at {}:{})", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("{job}: internal error: {msg}{at}");
    }));
    install_stop_handlers();
    match body() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{job}: {e:#}");
            ExitCode::FAILURE
        }
    }
}
