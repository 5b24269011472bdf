//! Issue 3, must-show 5: a process that never touches CUDA sees no difference with the shim
//! preloaded — same exit status, stdout and stderr; no files (the shim's state directory is never
//! created, and `strace` sees no file-creating system call the program does not make itself); no
//! threads. Even an invalid configuration says nothing until CUDA is used. Startup time is the
//! benchmark's part (`benches/src/bin/startup.rs`); a test here only bounds it loosely.

use libshare_tests::{describe, shim_lib, SimGpu};
use std::process::Output;

/// Programs that never touch CUDA.
fn programs() -> Vec<Vec<&'static str>> {
    vec![
        vec!["/bin/true"],
        vec!["/bin/sh", "-c", "echo hi | cat; echo err >&2"],
        vec!["/usr/bin/python3", "-c", "pass"],
        // Threads of the process (the shim must start none).
        vec![
            "/usr/bin/python3",
            "-c",
            "import os; print(len(os.listdir('/proc/self/task')))",
        ],
        // Symbol lookups through the shim's dlsym find what they found before, including names
        // that look like the driver's or NVML's but are not exported by the shim (no driver load).
        vec![
            "/usr/bin/python3",
            "-c",
            "import ctypes; c = ctypes.CDLL(None); print(bool(c.getpid), hasattr(c, 'cuNotAFunction'), hasattr(c, 'nvmlInit_v2'), hasattr(c, 'curl_easy_init'))",
        ],
    ]
}

/// Runs `argv` in `<machine>/cwd`, an empty directory.
fn run(gpu: &SimGpu, argv: &[&str], preload: bool, extra: &[(&str, &str)]) -> Output {
    let cwd = gpu.state_dir().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let mut cmd = gpu.command(argv[0]);
    cmd.args(&argv[1..]).current_dir(&cwd);
    if !preload {
        cmd.env_remove("LD_PRELOAD");
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    gpu.run_cmd(cmd)
}

fn assert_no_difference(extra: &[(&str, &str)]) {
    let gpu = SimGpu::new().with_shim();
    let state = gpu.shim_state_dir();
    for argv in programs() {
        let plain = run(&gpu, &argv, false, extra);
        let shimmed = run(&gpu, &argv, true, extra);
        assert!(plain.status.success(), "{argv:?}\n{}", describe(&plain));
        assert_eq!(shimmed.status.code(), plain.status.code(), "{argv:?}");
        let stdout = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
        let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(stdout(&shimmed), stdout(&plain), "{argv:?} stdout");
        assert_eq!(stderr(&shimmed), stderr(&plain), "{argv:?} stderr");
        assert!(
            !state.exists(),
            "{argv:?} created {} (contents: {:?})",
            state.display(),
            std::fs::read_dir(&state).map(|d| d.count())
        );
    }
    let cwd: Vec<_> = std::fs::read_dir(gpu.state_dir().join("cwd"))
        .unwrap()
        .collect();
    assert!(
        cwd.is_empty(),
        "files created in the working directory: {cwd:?}"
    );
    // The shim was really loaded in these processes.
    let out = run(
        &gpu,
        &[
            "/bin/sh",
            "-c",
            "grep -c libshare.so /proc/self/maps >/dev/null && echo loaded",
        ],
        true,
        extra,
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "loaded\n");
    // And nothing else appeared in the machine's directory besides simgpu's (unused) files.
    for entry in std::fs::read_dir(gpu.state_dir()).unwrap() {
        let name = entry.unwrap().file_name();
        assert!(
            name != "libshare",
            "the shim's state directory was created: {name:?}"
        );
    }
}

#[test]
fn shim_non_cuda_processes_see_no_difference() {
    assert_eq!(
        shim_lib().file_name().unwrap(),
        "libshare.so",
        "testing the shipped shim"
    );
    assert_no_difference(&[("LIBSHARE_MEMORY_LIMIT", "1GiB")]);
}

#[test]
fn shim_invalid_configuration_is_silent_until_cuda_is_used() {
    // The job fails at cuInit (shim_config.rs); a process that never calls it is untouched.
    assert_no_difference(&[
        ("LIBSHARE_MEMORY_LIMIT", "banana"),
        ("LIBSHARE_CLASS", "unknown"),
    ]);
}

#[test]
fn shim_starts_no_threads() {
    let gpu = SimGpu::new().with_shim();
    let argv = [
        "/usr/bin/python3",
        "-c",
        "import os; print(len(os.listdir('/proc/self/task')))",
    ];
    let plain = run(&gpu, &argv, false, &[]);
    let shimmed = run(&gpu, &argv, true, &[]);
    assert_eq!(String::from_utf8_lossy(&plain.stdout), "1\n");
    assert_eq!(String::from_utf8_lossy(&shimmed.stdout), "1\n");
}

/// The file-creating system calls (`open*` with O_CREAT, `creat`, `mkdir*`, `rename*`, `link*`,
/// `unlink*`, `mknod*`) a run makes, from `strace -f`; None (after `skip`) without strace.
fn files_created(gpu: &SimGpu, argv: &[&str], preload: bool) -> Option<Vec<String>> {
    if std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_err()
    {
        libshare_tests::skip("strace is not installed: the system-call check cannot run");
        return None;
    }
    let log = gpu.state_dir().join(format!("strace-{preload}.log"));
    let mut traced = vec![
        "strace",
        "-f",
        "-qq",
        "-e",
        "signal=none",
        "-e",
        "trace=open,openat,openat2,creat,mkdir,mkdirat,rename,renameat,renameat2,link,linkat,symlink,symlinkat,unlink,unlinkat,mknod,mknodat",
        "-o",
    ];
    let log_str = log.to_string_lossy().into_owned();
    traced.push(&log_str);
    traced.extend_from_slice(argv);
    let out = run(gpu, &traced, preload, &[]);
    assert!(out.status.success(), "{}", describe(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    Some(
        text.lines()
            // "1234 openat(AT_FDCWD, "/x", O_RDONLY|O_CLOEXEC) = 3": keep the call, drop the pid.
            .filter_map(|l| {
                l.split_once(' ')
                    .map(|(_, call)| call.trim_start().to_string())
            })
            .filter(|call| !call.starts_with("+++") && !call.starts_with("---"))
            .filter(|call| !call.starts_with("open") || call.contains("O_CREAT"))
            .filter(|call| !call.contains("= -1"))
            .collect(),
    )
}

#[test]
fn shim_non_cuda_processes_create_no_files_anywhere() {
    // Not just the state directory and the working directory: no file-creating system call at
    // all beyond what the program itself makes.
    let gpu = SimGpu::new().with_shim();
    for argv in programs() {
        let (Some(plain), Some(shimmed)) = (
            files_created(&gpu, &argv, false),
            files_created(&gpu, &argv, true),
        ) else {
            return;
        };
        assert_eq!(
            shimmed, plain,
            "{argv:?}: file-creating system calls differ"
        );
    }
}

#[test]
fn shim_startup_cost_stays_within_a_sanity_bound() {
    // The benchmark (`benches/src/bin/startup.rs`, BENCHMARKS.md) measures ~0.2 ms per exec of
    // /bin/true; this only guards against the shim starting to do work at load time (a
    // constructor, eager initialisation): median added wall time per exec under 3 ms.
    let gpu = SimGpu::new().with_shim();
    let mut plain = Vec::new();
    let mut shimmed = Vec::new();
    for i in 0..40 {
        for preload in [i % 2 == 0, i % 2 != 0] {
            let t = std::time::Instant::now();
            let out = run(&gpu, &["/bin/true"], preload, &[]);
            let dt = t.elapsed().as_secs_f64() * 1e3;
            assert!(out.status.success());
            if preload { &mut shimmed } else { &mut plain }.push(dt);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (p, s) = (median(&mut plain), median(&mut shimmed));
    eprintln!("/bin/true: {p:.2} ms plain, {s:.2} ms with the shim (medians of 40)");
    assert!(s - p < 3.0, "the shim adds {:.2} ms per exec", s - p);
}
