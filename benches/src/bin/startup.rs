//! Startup of programs that never touch CUDA, with and without `LD_PRELOAD=libshare.so`
//! (issue 3, "must show" 5; design §3.2: a process that never touches CUDA must see no
//! difference). The shim does nothing until the first CUDA call, so the only cost expected is the
//! loader mapping and relocating one more shared object: a ratio of ~1.0.
//!
//! Each program is run N times in each configuration, the two alternating (and which goes first
//! alternating too) so that drift on the machine affects both alike, after a few discarded warm-up
//! runs. The time is from spawn to exit as the parent sees it. The programs' output is captured:
//! with the shim they must print exactly what they print without it (nothing).
//!
//!     cargo run --release -p libshare-benches --bin startup [-- --runs-scale 0.5] [--only true]
//!         [--shim PATH]   (another preloaded object instead of target/release/libshare.so)
//!
//! Builds `libshare.so` first (`cargo build --release -p libshare`) unless `--shim` is given or
//! `SHARE_TESTS_SKIP_BUILD=1`. Prints one line per program on stderr and one JSON line on stdout.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

/// (name, program and arguments, runs per configuration). `python3` is replaced by the
/// interpreter itself (`sys.executable`), not a wrapper script such as pyenv's shim.
const PROGRAMS: &[(&str, &[&str], usize)] = &[
    ("/bin/true", &["/bin/true"], 300),
    ("python3 -c pass", &["python3", "-c", "pass"], 50),
    (
        "sh -c 'echo x | cat | wc -l'",
        &["sh", "-c", "echo x | cat | wc -l >/dev/null"],
        100,
    ),
];

/// The Python interpreter that `python3` runs (pyenv and similar put a shell script first).
fn python3() -> String {
    Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

const WARMUP: usize = 3;

fn shim_path(args: &[String]) -> PathBuf {
    if let Some(i) = args.iter().position(|a| a == "--shim") {
        return PathBuf::from(args.get(i + 1).expect("--shim PATH"));
    }
    if std::env::var("SHARE_TESTS_SKIP_BUILD").as_deref() != Ok("1") {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(libshare_tests::workspace_root())
            .args(["build", "--release", "--quiet", "-p", "libshare"])
            .stdin(Stdio::null())
            .output()
            .expect("cannot run cargo");
        assert!(
            out.status.success(),
            "cargo build --release -p libshare failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    libshare_tests::target_dir().join("release/libshare.so")
}

/// `struct rusage` (Linux, 64-bit): the two times, then 14 longs.
#[repr(C)]
struct Rusage {
    utime: [i64; 2],
    stime: [i64; 2],
    _rest: [i64; 14],
}

extern "C" {
    fn wait4(pid: i32, status: *mut i32, options: i32, usage: *mut Rusage) -> i32;
}

/// One run: wall time from spawn to exit as the parent sees it, and the CPU time (user + system)
/// of the process itself, both in microseconds.
struct Run {
    wall_us: f64,
    cpu_us: f64,
}

/// Runs `argv` once; returns its times and everything it printed.
fn run_once(argv: &[&str], preload: Option<&str>) -> (Run, Vec<u8>) {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("LD_PRELOAD");
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    let t = Instant::now();
    // Reaped below by wait4 (which also gives its CPU time), not by Child::wait.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", argv[0]));
    // The programs print (almost) nothing: the pipes never fill, so reap first, then read.
    let mut status = 0;
    let mut ru = Rusage {
        utime: [0; 2],
        stime: [0; 2],
        _rest: [0; 14],
    };
    // SAFETY: our own child, not waited for by anyone else; valid out-pointers.
    let r = unsafe { wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let wall_us = t.elapsed().as_secs_f64() * 1e6;
    assert_eq!(r, child.id() as i32, "wait4 {argv:?}");
    assert!(status == 0, "{argv:?} failed: wait status {status:#x}");
    let mut printed = Vec::new();
    for pipe in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut pipe = pipe;
        pipe.read_to_end(&mut printed)
            .expect("read the program's output");
    }
    let tv = |t: [i64; 2]| t[0] as f64 * 1e6 + t[1] as f64;
    let cpu_us = tv(ru.utime) + tv(ru.stime);
    (Run { wall_us, cpu_us }, printed)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn measure(name: &str, argv: &[&str], runs: usize, shim: &str) -> Value {
    let (mut without, mut with) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    let (_, base_output) = run_once(argv, None);
    for _ in 0..WARMUP {
        run_once(argv, None);
        run_once(argv, Some(shim));
    }
    for i in 0..runs {
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for preload in order {
            let (run, out) = run_once(argv, preload.then_some(shim));
            if preload {
                assert_eq!(
                    out,
                    base_output,
                    "{name} printed something else with the shim: {:?}",
                    String::from_utf8_lossy(&out)
                );
                with.push(run);
            } else {
                without.push(run);
            }
        }
    }
    let med = |v: &[Run], f: fn(&Run) -> f64| median(&mut v.iter().map(f).collect::<Vec<_>>());
    let (w0, w1) = (med(&without, |r| r.wall_us), med(&with, |r| r.wall_us));
    let (c0, c1) = (med(&without, |r| r.cpu_us), med(&with, |r| r.cpu_us));
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    eprintln!(
        "{name:30} {runs:4} runs each | wall: {w0:8.0} -> {w1:8.0} µs, ratio {:.3} ({:+.0} µs) | cpu: {c0:8.0} -> {c1:8.0} µs, ratio {:.3} ({:+.0} µs)",
        w1 / w0,
        w1 - w0,
        c1 / c0,
        c1 - c0
    );
    json!({
        "program": name,
        "runs": runs,
        "wall_us": {"without": r1(w0), "with": r1(w1), "added": r1(w1 - w0), "ratio": r3(w1 / w0)},
        "cpu_us": {"without": r1(c0), "with": r1(c1), "added": r1(c1 - c0), "ratio": r3(c1 / c0)},
        "silent": true,
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("usage: startup [--runs-scale F] [--only SUBSTRING] [--shim PATH/libshare.so]");
        return;
    }
    let scale: f64 = args
        .iter()
        .position(|a| a == "--runs-scale")
        .map(|i| args[i + 1].parse().expect("--runs-scale F"))
        .unwrap_or(1.0);
    let shim = shim_path(&args);
    let shim = std::fs::canonicalize(&shim)
        .unwrap_or_else(|e| panic!("{}: {e}", shim.display()))
        .to_string_lossy()
        .into_owned();
    let python = python3();
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args[i + 1].clone());
    let results: Vec<Value> = PROGRAMS
        .iter()
        .filter(|(name, _, _)| only.as_ref().is_none_or(|o| name.contains(o.as_str())))
        .map(|(name, argv, runs)| {
            let runs = ((*runs as f64 * scale).round() as usize).max(1);
            let argv: Vec<&str> = argv
                .iter()
                .map(|a| if *a == "python3" { python.as_str() } else { a })
                .collect();
            measure(name, &argv, runs, &shim)
        })
        .collect();
    println!(
        "{}",
        json!({"scenario": "startup", "shim": shim, "results": results})
    );
}
