//! What every container on this node holds, as `sharectl status` prints it: read through
//! `libshare_node::view` (the one reader of the state files), one JSON object per container and
//! the status table; `status` and the demo's live numbers both show it.

use anyhow::Result;
use libshare_abi::names::escape;
use libshare_abi::units::format_size;
use libshare_node::view::{self, ContainerView};
use serde_json::{json, Value};
use std::path::Path;

/// One container's figures, as JSON (the devices `sharectl status` has always listed: with a
/// quota, memory held, or launches by a live process). The name is [`escape`]d: a directory
/// named before names were checked (or by hand) prints as `\x1b`-style escapes, never raw.
fn container(c: &ContainerView) -> Value {
    let devices: Vec<Value> = c
        .devices
        .iter()
        .filter(|d| d.quota > 0 || d.used > 0 || d.launches_live_processes > 0)
        .map(|d| {
            json!({
                "device": d.device, "quota_bytes": d.quota, "used_bytes": d.used,
                "peak_bytes": d.peak, "allocs": d.allocs,
                "frees": d.frees, "refused_over_quota": d.refused,
                "launches_live_processes": d.launches_live_processes,
                "compute_share_percent": d.compute_bp as f64 / 100.0,
                "resident_bytes": d.resident(), "demoted_bytes": d.demoted,
                "demote_target_bytes": d.demote_target, "migrations": d.migrations,
            })
        })
        .collect();
    let processes: Vec<Value> = c
        .processes
        .iter()
        .map(|p| json!({ "pid": p.pid, "used_bytes": p.used, "launches": p.launches }))
        .collect();
    json!({ "container": escape(&c.name), "class": c.class.name(), "devices": devices, "processes": processes })
}

/// Every container's figures under the state directory `dir`, sorted by name (the JSON objects of
/// `sharectl status --json`), and one error line per state file that could not be read
/// ([`escape`]d, as the names are). Used by `status` and by the demo's live numbers.
pub fn read_containers(dir: &Path) -> Result<(Vec<Value>, Vec<String>)> {
    let v = view::read(dir)?;
    Ok((
        v.containers.iter().map(container).collect(),
        v.errors.iter().map(|e| escape(e).into_owned()).collect(),
    ))
}

/// What `sharectl status` prints: stdout (the table, or one JSON document) and the lines for
/// stderr. Every string from the state directory is already [`escape`]d in `containers` and
/// `errors`, so neither holds a control character, and a name cannot add a line.
pub fn render(
    dir: &Path,
    containers: &[Value],
    errors: &[String],
    json: bool,
) -> (String, Vec<String>) {
    if json {
        let doc = json!({
            "state_dir": escape(&dir.display().to_string()),
            "containers": containers,
            "errors": errors,
        });
        let text = serde_json::to_string_pretty(&doc).expect("a JSON value serialises");
        return (text + "\n", Vec::new());
    }
    let mut out = String::new();
    for line in table(dir, containers) {
        out += &line;
        out.push('\n');
    }
    (
        out,
        errors.iter().map(|e| format!("sharectl: {e}")).collect(),
    )
}

/// The `sharectl status` table, one string per line.
pub fn table(dir: &Path, containers: &[Value]) -> Vec<String> {
    if containers.is_empty() {
        return vec![format!(
            "no containers under {} (none has used CUDA with libshare yet)",
            escape(&dir.display().to_string())
        )];
    }
    let mut lines = vec![format!(
        "{:<20} {:<14} {:>3} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10} {:>6} {:>6}",
        "CONTAINER",
        "CLASS",
        "GPU",
        "USED",
        "QUOTA",
        "PEAK",
        "REFUSED",
        "RESIDENT",
        "DEMOTED",
        "MIGR",
        "PROCS"
    )];
    for c in containers {
        let procs = c["processes"].as_array().map_or(0, |p| p.len());
        let devices = c["devices"].as_array().cloned().unwrap_or_default();
        if devices.is_empty() {
            lines.push(format!(
                "{:<20} {:<14} {:>3} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10} {:>6} {:>6}",
                c["container"].as_str().unwrap_or("?"),
                c["class"].as_str().unwrap_or("?"),
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                procs
            ));
        }
        for d in devices {
            let size = |k: &str| format_size(d[k].as_u64().unwrap_or(0));
            let quota = match d["quota_bytes"].as_u64() {
                Some(0) | None => "none".to_string(),
                Some(q) => format_size(q),
            };
            lines.push(format!(
                "{:<20} {:<14} {:>3} {:>10} {:>10} {:>10} {:>8} {:>10} {:>10} {:>6} {:>6}",
                c["container"].as_str().unwrap_or("?"),
                c["class"].as_str().unwrap_or("?"),
                d["device"].as_u64().unwrap_or(0),
                size("used_bytes"),
                quota,
                size("peak_bytes"),
                d["refused_over_quota"].as_u64().unwrap_or(0),
                size("resident_bytes"),
                size("demoted_bytes"),
                d["migrations"].as_u64().unwrap_or(0),
                procs
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::{ProcSlot, State, SLOT_LOCK_BASE};
    use std::io::BufRead;
    use std::sync::atomic::Ordering::Release;
    use std::time::Duration;

    /// `read_containers` in a thread, failing the test if it does not return within 10 s.
    fn read_with_timeout(dir: &Path) -> (Vec<Value>, Vec<String>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.to_path_buf();
        std::thread::spawn(move || tx.send(read_containers(&d).unwrap()).unwrap());
        rx.recv_timeout(Duration::from_secs(10))
            .expect("sharectl status blocked")
    }

    #[test]
    fn status_never_blocks_on_a_fifo_nor_follows_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let good = libshare_abi::container_dir(dir.path(), "good");
        drop(State::open_or_create(&good).unwrap());
        let fifo = libshare_abi::container_dir(dir.path(), "fifo");
        std::fs::create_dir_all(&fifo).unwrap();
        let c = std::ffi::CString::new(fifo.join("state.shm").to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let linked = libshare_abi::container_dir(dir.path(), "linked-file");
        std::fs::create_dir_all(&linked).unwrap();
        std::os::unix::fs::symlink(good.join("state.shm"), linked.join("state.shm")).unwrap();
        std::os::unix::fs::symlink(&good, libshare_abi::container_dir(dir.path(), "linked-dir"))
            .unwrap();
        let (containers, errors) = read_with_timeout(dir.path());
        assert_eq!(containers.len(), 1, "{containers:?}");
        assert_eq!(containers[0]["container"], "good");
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].starts_with("container fifo:") && errors[0].contains("FIFO"));
        assert!(
            errors[1].starts_with("container linked-dir:") && errors[1].contains("symbolic link")
        );
        assert!(
            errors[2].starts_with("container linked-file:") && errors[2].contains("symbolic link")
        );
    }

    /// Whether `text` holds a control character other than a newline (ANSI C0, DEL, C1).
    fn raw_control(text: &str) -> Option<char> {
        text.chars().find(|&c| c != '\n' && c.is_control())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

        /// A container directory named anything (made before names were checked, or by hand):
        /// `status` prints it escaped, the table keeps one line per row, the JSON stays valid
        /// and holds the name in the same escaped form.
        #[test]
        fn names_print_escaped_in_the_table_and_the_json(
            name in proptest::strategy::Strategy::prop_filter(
                proptest::string::string_regex("[a-z\\x01-\\x1f\\x7f\\u{80}-\\u{9f}\\u{202e}\\\\ ]{1,12}").unwrap(),
                "a directory name",
                |n| !n.contains('/'),
            )
        ) {
            let dir = tempfile::tempdir().unwrap();
            let st = State::open_or_create(&libshare_abi::container_dir(dir.path(), &name)).unwrap();
            st.set_quota(0, 1 << 30);
            // A second one whose state cannot be read: its error line names it too.
            let fifo = libshare_abi::container_dir(dir.path(), &format!("{name}x"));
            std::fs::create_dir_all(&fifo).unwrap();
            let c = std::ffi::CString::new(fifo.join("state.shm").into_os_string().into_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            proptest::prop_assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let (containers, errors) = read_with_timeout(dir.path());
            let shown = escape(&name).into_owned();

            let (out, err) = render(dir.path(), &containers, &errors, false);
            proptest::prop_assert_eq!(raw_control(&out), None, "{:?}", out);
            let lines: Vec<&str> = out.lines().collect();
            proptest::prop_assert_eq!(lines.len(), 2, "a header and one row: {:?}", lines);
            proptest::prop_assert!(lines[1].starts_with(&shown), "{:?}", lines[1]);
            proptest::prop_assert_eq!(err.len(), 1);
            proptest::prop_assert_eq!(raw_control(&err[0]), None, "{:?}", err);
            proptest::prop_assert!(err[0].contains(&format!("{shown}x")), "{:?}", err);

            let (out, _) = render(dir.path(), &containers, &errors, true);
            proptest::prop_assert_eq!(raw_control(&out), None, "{:?}", out);
            let doc: Value = serde_json::from_str(&out).expect("valid JSON");
            proptest::prop_assert_eq!(doc["containers"].as_array().unwrap().len(), 1);
            proptest::prop_assert_eq!(doc["containers"][0]["container"].as_str(), Some(shown.as_str()));
            proptest::prop_assert_eq!(doc["containers"][0]["devices"].as_array().unwrap().len(), 1);
            proptest::prop_assert_eq!(doc["errors"].as_array().unwrap().len(), 1);
        }
    }

    /// A process is listed while it holds its slot's lock, whatever pids the slots show.
    #[test]
    fn a_process_is_listed_only_while_it_holds_its_slot_lock() {
        let dir = tempfile::tempdir().unwrap();
        let cdir = libshare_abi::container_dir(dir.path(), "c");
        let st = State::open_or_create(&cdir).unwrap();
        let path = cdir.join("state.shm");
        // Another process holds slot 3's lock (Python's fcntl.lockf is a POSIX record lock).
        let mut holder = match std::process::Command::new("python3")
            .args([
                "-c",
                "import fcntl,sys,time\nf=open(sys.argv[1],'r+b')\nfcntl.lockf(f,fcntl.LOCK_EX|fcntl.LOCK_NB,1,int(sys.argv[2]))\nprint('locked',flush=True)\ntime.sleep(60)",
            ])
            .arg(&path)
            .arg((SLOT_LOCK_BASE + 3).to_string())
            .stdout(std::process::Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                eprintln!("SKIP: python3 is needed to hold a lock from another process: {e}");
                return;
            }
        };
        let mut line = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "locked");
        st.header().slots_hwm.store(5, Release); // as the slots' claims did
        let fill = |s: &ProcSlot, pid: u32, bytes: u64| {
            s.pid.store(pid, Release);
            s.charged[0].store(bytes, Release);
        };
        fill(st.slot(3), holder.id(), 300);
        // A live pid without the lock (e.g. the pid of a process that exec'd): not listed.
        fill(st.slot(4), holder.id(), 400);
        let (c, errors) = read_with_timeout(dir.path());
        assert!(errors.is_empty(), "{errors:?}");
        let procs = c[0]["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 1, "{procs:?}");
        assert_eq!(procs[0]["pid"], holder.id());
        assert_eq!(procs[0]["used_bytes"], 300);
        holder.kill().unwrap();
        holder.wait().unwrap();
        let (c, _) = read_with_timeout(dir.path());
        assert_eq!(c[0]["processes"].as_array().unwrap().len(), 0);
    }
}
