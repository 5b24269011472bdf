//! Issue 10, bad input: truncated, corrupt and wrong-version state files under a running
//! `sharectl daemon`, and a file truncated while the daemon has it mapped. The daemon names each
//! bad file once, changes nothing in it, and keeps steering the good containers.

use libshare_abi::{container_dir, Class, State, FILE_SIZE, STATE_FILE};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::*;
use std::time::{Duration, Instant};

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private state file with these bytes, as a shim would have created it (0700 dir, 0600 file).
fn put(dir: &Path, name: &str, bytes: &[u8]) -> Vec<u8> {
    let d = container_dir(dir, name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(d.join(STATE_FILE))
        .and_then(|mut f| std::io::Write::write_all(&mut f, bytes))
        .unwrap();
    bytes.to_vec()
}

fn opportunistic(dir: &Path, name: &str) -> State {
    let st = State::open_or_create(&container_dir(dir, name)).unwrap();
    st.header().set_class(Class::Opportunistic);
    st.device(0).note_launch(); // the device is in use: its gate is written every period
    st
}

/// Whether `st`'s gate heartbeat advances by 50 ms while it launches (as a running job would).
fn steered(st: &State) -> bool {
    let t0 = Instant::now();
    let mut first = 0;
    while t0.elapsed() < Duration::from_secs(5) {
        st.device(0).note_launch();
        let now = st.device(0).refreshed.load(Acquire);
        if first == 0 {
            first = now;
        } else if now > first + 50_000_000 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

#[test]
fn bad_state_files_are_named_once_left_alone_and_the_rest_is_served() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let good = opportunistic(dir, "good");
    let victim = opportunistic(dir, "victim");
    let short = put(dir, "short", &[7u8; 100]);
    let garbage = put(dir, "garbage", &vec![0xA5u8; FILE_SIZE]);
    let old = {
        // A valid file of another layout version.
        let st = State::open_or_create(&container_dir(dir, "oldver")).unwrap();
        st.header()
            .version
            .store(libshare_abi::VERSION + 1, Release);
        drop(st);
        std::fs::read(container_dir(dir, "oldver").join(STATE_FILE)).unwrap()
    };

    let mut daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_sharectl"))
            // The "jobs" above wrote their class as a trusted environment would.
            .args(["daemon", "--trust-env", "--state-dir"])
            .arg(dir)
            .env("LIBSHARE_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(
        steered(&good),
        "the good container is steered beside the bad files"
    );

    // A container's file truncated to nothing while the daemon has it mapped (a tenant may do
    // that to its own file): the daemon survives and keeps serving.
    std::fs::OpenOptions::new()
        .write(true)
        .open(container_dir(dir, "victim").join(STATE_FILE))
        .unwrap()
        .set_len(0)
        .unwrap();
    std::thread::sleep(Duration::from_millis(300)); // several ticks touch the truncated mapping
    assert!(daemon.0.try_wait().unwrap().is_none(), "the daemon died");
    assert!(steered(&good), "still steering after the truncation");
    drop(victim);

    // Nothing was written into the bad files.
    for (name, bytes) in [("short", &short), ("garbage", &garbage), ("oldver", &old)] {
        let now = std::fs::read(container_dir(dir, name).join(STATE_FILE)).unwrap();
        assert!(now == *bytes, "{name}'s file was changed");
    }

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(daemon.0.id() as i32, libc::SIGTERM) };
    let status = daemon.0.wait().unwrap();
    assert!(status.success(), "exit {status:?}");
    let mut log = String::new();
    daemon
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    for name in ["short", "garbage", "oldver"] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("cannot steer") && l.contains(name))
            .collect();
        assert_eq!(lines.len(), 1, "{name}: one line, got {lines:?}\n{log}");
    }
    assert!(
        log.contains("version") || log.contains("layout"),
        "the wrong version is named: {log}"
    );
    drop(good);
}
