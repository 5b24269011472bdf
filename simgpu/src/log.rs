//! simgpu's own diagnostics, to stderr (`SIMGPU_LOG=warn|debug`) and, for unimplemented-stub hits,
//! to `SIMGPU_TRACE_FILE` (one `stub <name>` line per call) so tests can fail on them.

use std::sync::atomic::{AtomicU8, Ordering};

/// 0 off, 1 warn, 2 debug. Set once from the configuration; read without locking.
pub static LEVEL: AtomicU8 = AtomicU8::new(1);

/// This thread's kernel thread id (for log lines).
pub fn tid() -> libc::pid_t {
    // SAFETY: gettid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::gettid() }
}

pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => {
        if $crate::log::level() >= 2 {
            eprintln!("simgpu[{}/{}]: {}", std::process::id(), $crate::log::tid(), format_args!($($arg)*));
        }
    };
}

#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {
        if $crate::log::level() >= 1 {
            eprintln!("simgpu[{}] warning: {}", std::process::id(), format_args!($($arg)*));
        }
    };
}

/// Appends one line to `SIMGPU_TRACE_FILE`, if set.
pub fn trace_line(line: &str) {
    append_line_to("SIMGPU_TRACE_FILE", line);
}

/// Appends `line` and a newline to the file named by the variable `var`, if set, in one
/// write(2): with O_APPEND that keeps lines of concurrent processes whole (`writeln!` on a
/// `File` writes the newline separately, and two exiting processes could run together).
pub fn append_line_to(var: &str, line: &str) {
    use std::io::Write;
    if let Some(path) = std::env::var_os(var) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let mut buf = String::with_capacity(line.len() + 1);
            buf.push_str(line);
            buf.push('\n');
            let _ = f.write_all(buf.as_bytes());
        }
    }
}
