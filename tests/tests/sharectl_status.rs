//! `sharectl status` reports what the shim recorded for each container: class, quota, used and
//! peak memory per GPU, and the live processes — with no daemon running.

use libshare_tests::{artifacts, compile_gcc, SimGpu};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn status_shows_each_containers_quota_usage_and_processes() {
    let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
    let gpu = SimGpu::new().with_shim();
    let mut holders = Vec::new();
    for (container, class, quota, mib) in [
        ("web", "production", "1GiB", "300"),
        ("batch", "opportunistic", "", "100"),
    ] {
        let mut cmd = Command::new(&prog);
        cmd.args(["hold", mib])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        gpu.configure(&mut cmd);
        cmd.env("LIBSHARE_CONTAINER", container)
            .env("LIBSHARE_CLASS", class);
        if !quota.is_empty() {
            cmd.env("LIBSHARE_MEMORY_LIMIT", quota);
        }
        let mut child = cmd.spawn().expect("spawn holder");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("\"result\":0"), "{container}: {line}");
        holders.push(child);
    }

    let out = Command::new(artifacts().bin("sharectl"))
        .args(["status", "--json", "--state-dir"])
        .arg(gpu.shim_state_dir())
        .output()
        .expect("run sharectl");
    let unprivileged = status_as_nobody(&gpu.shim_state_dir());
    for mut h in holders {
        h.kill().ok();
        h.wait().ok();
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let c = v["containers"].as_array().unwrap();
    assert_eq!(c.len(), 2, "{v}");
    let (batch, web) = (&c[0], &c[1]);
    assert_eq!(web["container"], "web");
    assert_eq!(web["class"], "production");
    assert_eq!(
        web["devices"].as_array().unwrap().len(),
        1,
        "one simulated GPU: {v}"
    );
    assert_eq!(web["devices"][0]["quota_bytes"], 1u64 << 30);
    assert_eq!(web["devices"][0]["used_bytes"], 300u64 << 20);
    assert_eq!(web["processes"].as_array().unwrap().len(), 1);
    assert_eq!(batch["class"], "opportunistic");
    assert_eq!(batch["devices"][0]["quota_bytes"], 0, "no limit set");
    assert_eq!(batch["devices"][0]["used_bytes"], 100u64 << 20);

    // A monitoring agent with read permission only sees the same figures.
    if let Some(out) = unprivileged {
        assert!(
            out.status.success(),
            "as nobody: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let u: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(u["containers"], v["containers"], "as nobody: {u}");
    }
}

/// Runs `sharectl status --json` as the user `nobody` after making the state files readable (not
/// writable) by others; None (after `skip`) when this test does not run as root or setpriv is missing.
fn status_as_nobody(state_dir: &std::path::Path) -> Option<std::process::Output> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let root = std::fs::metadata(state_dir).is_ok_and(|m| m.uid() == 0);
    if !root || Command::new("setpriv").arg("--help").output().is_err() {
        libshare_tests::skip("the unprivileged status check needs root and setpriv");
        return None;
    }
    let chmod = |p: &std::path::Path, mode| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    // Every directory down to the state files must be traversable by others.
    let mut dir = Some(state_dir);
    while let Some(d) =
        dir.filter(|d| d.starts_with(std::env::temp_dir()) && *d != std::env::temp_dir())
    {
        chmod(d, 0o755);
        dir = d.parent();
    }
    for entry in walk(state_dir) {
        chmod(&entry, if entry.is_dir() { 0o755 } else { 0o644 });
    }
    Some(
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(artifacts().bin("sharectl"))
            .args(["status", "--json", "--state-dir"])
            .arg(state_dir)
            .output()
            .expect("run sharectl as nobody"),
    )
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn status_of_an_empty_node_says_so_and_a_corrupt_state_file_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        Command::new(artifacts().bin("sharectl"))
            .args(["status", "--state-dir"])
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no containers"));

    let bad = dir.path().join("containers/broken");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(bad.join("state.shm"), b"not a state file").unwrap();
    let out = run();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("container broken") && err.contains("truncated"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
