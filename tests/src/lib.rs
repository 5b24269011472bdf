//! Harness for the integration tests in `tests/tests/`: real NVIDIA user-space code (cudart from the
//! pip wheels, nvcc-compiled kernels, PyTorch) run unmodified on the simulated GPU.
//!
//! - [`artifacts`] builds simgpu once per test process and lays out `target/simgpu/lib/`
//!   (`libcuda.so.1`, `libcuda.so`, `libnvidia-ml.so.1` → `../../release/libcuda.so`).
//! - [`cuda_cache`], [`Cudart`], [`nvcc`], [`torch_python`] locate the pinned wheels that
//!   `scripts/fetch-cuda.sh` installs.
//! - [`SimGpu`] runs a program on a fresh simulated machine (its own `SIMGPU_STATE_DIR`, so parallel
//!   tests never share a device) with `LD_LIBRARY_PATH` pointing at simgpu first.
//! - [`compile_c`], [`compile_driver_c`], [`compile_cu`] build the programs in `tests/cuda/`,
//!   cached under `target/cuda-tests/` and rebuilt when the source is newer.
//!
//! Environment: `SHARE_TESTS_SKIP_BUILD=1` skips the cargo build (the artifacts must exist),
//! `LIBSHARE_CACHE` overrides `~/.cache/libshare`, `SIMGPU_LOG` is passed through to the programs,
//! `SHARE_TESTS_SHIM=dist` preloads the shipped `target/dist/libshare.so` instead of the host build.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The repository root (the directory holding the workspace `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// Cargo's target directory (`CARGO_TARGET_DIR` or `<root>/target`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => workspace_root().join(dir),
        _ => workspace_root().join("target"),
    }
}

/// What the integration tests run against.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `target/release`
    pub release_dir: PathBuf,
    /// `target/release/libcuda.so`, the simgpu cdylib.
    pub libcuda: PathBuf,
    /// `target/simgpu/lib`: put first on `LD_LIBRARY_PATH`.
    pub lib_dir: PathBuf,
}

impl Artifacts {
    /// A binary built into `target/release` (e.g. one of the `jobs` programs).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.release_dir.join(name)
    }
}

/// Builds simgpu (and the `jobs` programs, when that crate exists) once per process with
/// `cargo build --release`, unless `SHARE_TESTS_SKIP_BUILD=1`, and creates `target/simgpu/lib/`.
pub fn artifacts() -> &'static Artifacts {
    static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
    ARTIFACTS.get_or_init(|| {
        let root = workspace_root();
        if std::env::var("SHARE_TESTS_SKIP_BUILD").as_deref() != Ok("1") {
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.current_dir(&root).args([
                "build",
                "--release",
                "--quiet",
                "-p",
                "simgpu",
                "-p",
                "libshare",
                "-p",
                "jobs",
                "-p",
                "sharectl",
            ]);
            let out = cmd.stdin(Stdio::null()).output().expect("cannot run cargo");
            if !out.status.success() {
                panic!(
                    "cargo build --release -p simgpu failed:\n{}",
                    tail(&String::from_utf8_lossy(&out.stderr), 40)
                );
            }
        }
        let release_dir = target_dir().join("release");
        let libcuda = release_dir.join("libcuda.so");
        assert!(
            libcuda.exists(),
            "{} does not exist: build simgpu (cargo build --release -p simgpu)",
            libcuda.display()
        );
        let lib_dir = target_dir().join("simgpu/lib");
        std::fs::create_dir_all(&lib_dir).expect("create target/simgpu/lib");
        for name in ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"] {
            symlink_atomic(Path::new("../../release/libcuda.so"), &lib_dir.join(name));
        }
        Artifacts {
            release_dir,
            libcuda,
            lib_dir,
        }
    })
}

fn symlink_atomic(target: &Path, link: &Path) {
    if std::fs::read_link(link).ok().as_deref() == Some(target) {
        return;
    }
    let tmp = link.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).expect("create symlink");
    std::fs::rename(&tmp, link).expect("rename symlink");
}

/// Where `scripts/fetch-cuda.sh` installs the NVIDIA wheels: `LIBSHARE_CACHE` or `~/.cache/libshare`.
pub fn cuda_cache() -> PathBuf {
    match std::env::var_os("LIBSHARE_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
            .join(".cache/libshare"),
    }
}

/// Returns `cuda_cache()/rel`, panicking with one line if it is missing.
pub fn cache_path(rel: &str) -> PathBuf {
    let path = cuda_cache().join(rel);
    if !path.exists() {
        panic!("{} is missing: run scripts/fetch-cuda.sh", path.display());
    }
    path
}

/// The CUDA 13.5 nvcc from the wheels.
pub fn nvcc() -> PathBuf {
    cache_path("cu13/nvidia/cu13/bin/nvcc")
}

/// The Python of the venv with torch and nvidia-ml-py.
pub fn torch_python() -> PathBuf {
    cache_path("torch-venv/bin/python")
}

/// A CUDA runtime from the pinned wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cudart {
    /// nvidia-cuda-runtime-cu12 12.9.79
    V12,
    /// nvidia-cuda-runtime 13.5.37
    V13,
}

impl Cudart {
    pub fn tag(self) -> &'static str {
        match self {
            Cudart::V12 => "cu12",
            Cudart::V13 => "cu13",
        }
    }

    /// Include directories (runtime headers + crt headers).
    pub fn include_dirs(self) -> Vec<PathBuf> {
        match self {
            Cudart::V12 => vec![
                cache_path("cu12/nvidia/cuda_runtime/include"),
                cache_path("cu12/nvidia/cuda_nvcc/include"),
            ],
            Cudart::V13 => vec![cache_path("cu13/nvidia/cu13/include")],
        }
    }

    pub fn lib_dir(self) -> PathBuf {
        match self {
            Cudart::V12 => cache_path("cu12/nvidia/cuda_runtime/lib"),
            Cudart::V13 => cache_path("cu13/nvidia/cu13/lib"),
        }
    }

    /// The file name of the shared runtime (`libcudart.so.12` / `libcudart.so.13`).
    pub fn soname(self) -> &'static str {
        match self {
            Cudart::V12 => "libcudart.so.12",
            Cudart::V13 => "libcudart.so.13",
        }
    }
}

/// How an nvcc-built program links cudart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudartLink {
    /// `-cudart shared`: libcudart.so.13 found through an rpath.
    Shared,
    /// nvcc's default: libcudart_static.a linked in.
    Static,
}

/// `target/cuda-tests`: compiled test programs.
pub fn cuda_tests_dir() -> PathBuf {
    let dir = target_dir().join("cuda-tests");
    std::fs::create_dir_all(&dir).expect("create target/cuda-tests");
    dir
}

/// A source file in `tests/cuda/`.
pub fn cuda_source(name: &str) -> PathBuf {
    let path = workspace_root().join("tests/cuda").join(name);
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

/// A script in `tests/python/`.
pub fn python_source(name: &str) -> PathBuf {
    let path = workspace_root().join("tests/python").join(name);
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

fn mtime(path: &Path) -> Option<std::time::SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Runs `make(tmp_output)` unless `out` is newer than every input; writes atomically so parallel
/// test processes can build the same program.
fn build_cached(inputs: &[&Path], out: &Path, make: impl FnOnce(&Path) -> Command) -> PathBuf {
    let newest = inputs.iter().filter_map(|p| mtime(p)).max();
    if let (Some(out_time), Some(src_time)) = (mtime(out), newest) {
        if out_time >= src_time {
            return out.to_path_buf();
        }
    }
    // Unique per process *and* call: `cargo test` runs tests as threads of one process.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = out.with_extension(format!("tmp{}-{n}", std::process::id()));
    let mut cmd = make(&tmp);
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !output.status.success() {
        let _ = std::fs::remove_file(&tmp);
        panic!(
            "compile failed: {cmd:?}\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::rename(&tmp, out).expect("rename compiled program");
    out.to_path_buf()
}

/// The CUDA 13.5 ptxas from the wheels.
pub fn ptxas() -> PathBuf {
    cache_path("cu13/nvidia/cu13/bin/ptxas")
}

/// The PTX nvcc 13.5 writes for a `.cu` file of `tests/cuda/`, a virtual architecture
/// (`compute_80`) and more flags (`-G`). Output: `target/cuda-tests/<stem>-<arch><flags>.ptx`.
pub fn compile_ptx(source: &str, arch: &str, flags: &[&str]) -> PathBuf {
    let src = cuda_source(source);
    let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
    let out = cuda_tests_dir().join(format!("{stem}-{arch}{}.ptx", flags.concat()));
    let nvcc = nvcc();
    build_cached(&[&src, &cuda_source("check.h")], &out, |tmp| {
        let mut cmd = Command::new(&nvcc);
        cmd.args(["-ptx", "-O3", &format!("-arch={arch}")])
            .args(flags)
            .arg(&src)
            .arg("-o")
            .arg(tmp);
        cmd
    })
}

/// Compiles a C program from `tests/cuda/` with gcc against a cudart wheel (rpath to its lib dir).
/// Output: `target/cuda-tests/<stem>-<cu12|cu13>`.
pub fn compile_c(source: &str, cudart: Cudart) -> PathBuf {
    let src = cuda_source(source);
    let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
    let out = cuda_tests_dir().join(format!("{stem}-{}", cudart.tag()));
    let lib_dir = cudart.lib_dir();
    let includes = cudart.include_dirs();
    build_cached(&[&src, &cuda_source("check.h")], &out, |tmp| {
        let mut cmd = Command::new("gcc");
        cmd.args(["-std=gnu11", "-O1", "-Wall"]);
        for inc in &includes {
            cmd.arg("-I").arg(inc);
        }
        cmd.arg(&src).arg("-o").arg(tmp);
        cmd.arg("-L").arg(&lib_dir);
        cmd.arg(format!("-l:{}", cudart.soname()));
        cmd.arg(format!("-Wl,-rpath,{}", lib_dir.display()));
        cmd
    })
}

/// Compiles a C program from `tests/cuda/` that uses the driver API directly (`cuda.h` from the
/// CUDA 13.5 wheel) and dlopens `libcuda.so.1` itself. Output: `target/cuda-tests/<stem>`.
pub fn compile_driver_c(source: &str) -> PathBuf {
    let src = cuda_source(source);
    let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
    let out = cuda_tests_dir().join(stem);
    let include = cache_path("cu13/nvidia/cu13/include/cuda.h")
        .parent()
        .unwrap()
        .to_path_buf();
    build_cached(&[&src, &cuda_source("check.h")], &out, |tmp| {
        let mut cmd = Command::new("gcc");
        cmd.args(["-std=gnu11", "-O1", "-Wall"])
            .arg("-I")
            .arg(&include)
            .arg(&src)
            .arg("-o")
            .arg(tmp)
            .arg("-ldl");
        cmd
    })
}

/// Compiles a `.cu` program from `tests/cuda/` with the CUDA 13.5 nvcc for sm_80 (nvcc's
/// `-arch=sm_80`: the sm_80 cubin and the compute_80 PTX in its fatbin).
/// Output: `target/cuda-tests/<stem>-<shared|static>`.
pub fn compile_cu(source: &str, link: CudartLink) -> PathBuf {
    compile_cu_for(source, link, "", &["-arch=sm_80"])
}

/// [`compile_cu`] with other code in the fatbin: `targets` are nvcc's flags for it (e.g.
/// `-gencode=arch=compute_80,code=sm_80`: the cubin alone), `tag` names the variant.
/// Output: `target/cuda-tests/<stem>-<shared|static><tag>`.
pub fn compile_cu_for(source: &str, link: CudartLink, tag: &str, targets: &[&str]) -> PathBuf {
    let src = cuda_source(source);
    let stem = src.file_stem().unwrap().to_string_lossy().into_owned();
    let variant = match link {
        CudartLink::Shared => "shared",
        CudartLink::Static => "static",
    };
    let out = cuda_tests_dir().join(format!("{stem}-{variant}{tag}"));
    let nvcc = nvcc();
    let lib_dir = Cudart::V13.lib_dir();
    cache_path("cu13/nvidia/cu13/lib/libcudart.so");
    build_cached(&[&src, &cuda_source("check.h")], &out, |tmp| {
        let mut cmd = Command::new(&nvcc);
        cmd.args(targets).arg("-O2");
        if link == CudartLink::Shared {
            cmd.args(["-cudart", "shared"]);
        }
        cmd.arg(&src).arg("-o").arg(tmp);
        cmd.arg("-Xlinker")
            .arg(format!("-rpath,{}", lib_dir.display()));
        cmd
    })
}

/// One simulated machine for one test: a fresh state directory, its own trace file, and
/// `SIMGPU_*` settings. Inherited `SIMGPU_*` variables are removed from the programs' environment
/// (except `SIMGPU_LOG`), so a test sees only what it configures.
pub struct SimGpu {
    state: tempfile::TempDir,
    env: Vec<(OsString, OsString)>,
    timeout: Duration,
}

impl Default for SimGpu {
    fn default() -> Self {
        Self::new()
    }
}

impl SimGpu {
    /// Builds simgpu if needed and creates a fresh state directory.
    pub fn new() -> SimGpu {
        artifacts();
        let state = tempfile::Builder::new()
            .prefix("simgpu-test-")
            .tempdir()
            .expect("create simgpu state dir");
        SimGpu {
            state,
            env: Vec::new(),
            timeout: Duration::from_secs(120),
        }
    }

    /// `SIMGPU_MEMORY`, e.g. `"8GiB"`.
    pub fn memory(self, value: &str) -> SimGpu {
        self.env("SIMGPU_MEMORY", value)
    }

    /// Sets an environment variable for every program run on this machine.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> SimGpu {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Kill a program that runs longer than this (default 120 s) and fail the test.
    pub fn timeout(mut self, timeout: Duration) -> SimGpu {
        self.timeout = timeout;
        self
    }

    pub fn state_dir(&self) -> &Path {
        self.state.path()
    }

    /// `SIMGPU_TRACE_FILE`: simgpu appends `stub <name>` for every call of an unimplemented function.
    pub fn trace_file(&self) -> PathBuf {
        self.state.path().join("trace.txt")
    }

    /// Applies the simulated machine's environment to `cmd`.
    pub fn configure(&self, cmd: &mut Command) {
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("SIMGPU_") && k != "SIMGPU_LOG" {
                cmd.env_remove(&key);
            }
        }
        let lib_dir = &artifacts().lib_dir;
        let mut ld_path = OsString::from(lib_dir.as_os_str());
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            ld_path.push(":");
            ld_path.push(old);
        }
        cmd.env("LD_LIBRARY_PATH", ld_path)
            .env_remove("LD_PRELOAD")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env("SIMGPU_STATE_DIR", self.state_dir())
            .env("SIMGPU_TRACE_FILE", self.trace_file());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
    }

    /// Runs `cmd` on this machine (stdin closed, output captured). Panics on timeout.
    pub fn run(&self, mut cmd: Command) -> Output {
        self.configure(&mut cmd);
        run_with_timeout(cmd, self.timeout)
    }

    /// Runs `program args…` and panics unless it exits 0. On failure the program is run a second
    /// time with `SIMGPU_LOG=debug`, and the end of that log (the last driver calls) is shown too.
    pub fn run_ok<S: AsRef<OsStr>>(&self, program: impl AsRef<OsStr>, args: &[S]) -> Output {
        let make = || {
            let mut cmd = Command::new(program.as_ref());
            cmd.args(args);
            cmd
        };
        let out = self.run(make());
        if out.status.success() {
            return out;
        }
        let mut debug_cmd = make();
        self.configure(&mut debug_cmd);
        debug_cmd.env("SIMGPU_LOG", "debug");
        let debug = run_with_timeout(debug_cmd, self.timeout);
        let debug_log = String::from_utf8_lossy(&debug.stderr);
        panic!(
            "{} {} failed\n{}\n---- re-run with SIMGPU_LOG=debug: {}\n{}\n{}\n---- stub calls\n{}",
            program.as_ref().to_string_lossy(),
            args.iter()
                .map(|a| a.as_ref().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            describe(&out),
            debug.status,
            tail(&debug_log, 60),
            failed_calls(&debug_log),
            self.stub_calls().join("\n"),
        );
    }

    /// Lines `stub <name>` that simgpu wrote to the trace file: calls of unimplemented functions.
    pub fn stub_calls(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.trace_file()).unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("stub "))
            .map(str::to_owned)
            .collect()
    }

    /// Fails listing every distinct unimplemented function that was called, with counts.
    pub fn assert_no_stub_calls(&self) {
        let calls = self.stub_calls();
        if calls.is_empty() {
            return;
        }
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for c in &calls {
            *counts.entry(c.as_str()).or_default() += 1;
        }
        let list: Vec<String> = counts
            .iter()
            .map(|(k, n)| format!("  {k} ({n}x)"))
            .collect();
        panic!(
            "{} call(s) of unimplemented simgpu functions:\n{}",
            calls.len(),
            list.join("\n")
        );
    }
}

fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out = Output {
                status: std::process::ExitStatus::default(),
                stdout: out_reader.join().unwrap_or_default(),
                stderr: err_reader.join().unwrap_or_default(),
            };
            panic!(
                "{cmd:?} did not finish within {timeout:?} (killed)\n{}",
                describe(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// The distinct driver calls that returned an error in a `SIMGPU_LOG=debug` log
/// (`simgpu[pid/tid]: name -> code`), with counts, in order of first failure.
pub fn failed_calls(debug_log: &str) -> String {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for line in debug_log.lines() {
        let Some((_, call)) = line.split_once("]: ") else {
            continue;
        };
        if !line.starts_with("simgpu[") || !call.contains(" -> ") {
            continue;
        }
        match seen.iter_mut().find(|(c, _)| c == call) {
            Some((_, n)) => *n += 1,
            None => seen.push((call.to_owned(), 1)),
        }
    }
    let mut s = String::from("---- driver calls that returned an error (first seen first)");
    for (call, n) in seen.iter().take(30) {
        s.push_str(&format!("\n  {call} ({n}x)"));
    }
    s
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    let mut s = String::new();
    if start > 0 {
        s.push_str(&format!("[... {start} lines omitted]\n"));
    }
    s.push_str(&lines[start..].join("\n"));
    s
}

/// Exit status, stdout and the end of stderr, for failure messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status: {}\n---- stdout\n{}\n---- stderr\n{}",
        out.status,
        tail(&String::from_utf8_lossy(&out.stdout), 80),
        tail(&String::from_utf8_lossy(&out.stderr), 80)
    )
}

/// The JSON objects a test program printed, one per line (other lines are ignored).
pub fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

/// The single JSON line whose `"check"` field is `check`.
pub fn json_check(out: &Output, check: &str) -> serde_json::Value {
    let found: Vec<_> = json_lines(out)
        .into_iter()
        .filter(|v| v["check"] == check)
        .collect();
    match found.as_slice() {
        [one] => one.clone(),
        _ => panic!(
            "expected one {check:?} line, found {}\n{}",
            found.len(),
            describe(out)
        ),
    }
}

/// Asserts `actual` is within `rel` (e.g. 0.2 for ±20 %) of `expected`.
#[track_caller]
pub fn assert_close(what: &str, actual: f64, expected: f64, rel: f64) {
    let lo = expected * (1.0 - rel);
    let hi = expected * (1.0 + rel);
    assert!(
        actual >= lo && actual <= hi,
        "{what}: {actual:.3} not within ±{:.0} % of {expected:.3} [{lo:.3}, {hi:.3}]",
        rel * 100.0
    );
}

// ---- The shim (`libshare.so`) under test: helpers for `tests/tests/shim_*.rs` ----

/// The shim the tests preload: `target/release/libshare.so` (the host build, built by
/// [`artifacts`]), or with `SHARE_TESTS_SHIM=dist` the shipped glibc-2.17 build
/// `target/dist/libshare.so` (`scripts/build-shim.sh`; `scripts/test.sh` runs the shim tests
/// again with it), or any path given there. (Not `LIBSHARE_*`: the shim would warn about an
/// unknown variable of its own in every job's stderr.)
pub fn shim_lib() -> PathBuf {
    let path = match std::env::var("SHARE_TESTS_SHIM").ok().as_deref() {
        None | Some("") => artifacts().release_dir.join("libshare.so"),
        Some("dist") => target_dir().join("dist/libshare.so"),
        Some(other) => PathBuf::from(other),
    };
    assert!(
        path.exists(),
        "{} does not exist: build the shim (cargo build --release -p libshare; the shipped one: \
         scripts/build-shim.sh)",
        path.display()
    );
    path
}

/// Compiles `tests/cuda/<source>` with gcc into `target/cuda-tests/<out_name>`, with the CUDA 13.5
/// `cuda.h` on the include path and `args` appended (e.g. `-lcuda`, `-shared`).
pub fn compile_gcc(source: &str, out_name: &str, args: &[&str]) -> PathBuf {
    let src = cuda_source(source);
    let out = cuda_tests_dir().join(out_name);
    let include = cache_path("cu13/nvidia/cu13/include/cuda.h")
        .parent()
        .unwrap()
        .to_path_buf();
    let lib_dir = artifacts().lib_dir.clone();
    build_cached(&[&src, &cuda_source("check.h")], &out, |tmp| {
        let mut cmd = Command::new("gcc");
        cmd.args(["-std=gnu11", "-O1", "-Wall", "-Werror", "-pthread"])
            .arg("-I")
            .arg(&include)
            .arg(&src)
            .arg("-o")
            .arg(tmp)
            .arg("-L")
            .arg(&lib_dir)
            .args(args)
            .arg("-ldl");
        cmd
    })
}

/// Per-container shim counters summed over every process slot and device (slots keep their
/// counters after the process exits, until the slot is claimed again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShimCounts {
    pub launches: u64,
    pub allocs: u64,
}

/// simgpu's per-process counters (`SIMGPU_STATS_FILE`) summed over every process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimCounts {
    pub launches: u64,
    pub api_allocs: u64,
    pub processes: u64,
}

impl SimGpu {
    /// This machine with the shim preloaded (`LD_PRELOAD=libshare.so`), its state in
    /// [`SimGpu::shim_state_dir`], and simgpu's per-process counters written to
    /// [`SimGpu::stats_file`]. Commands made by [`SimGpu::command`] inherit no `LIBSHARE_*` or
    /// `CUDA_DEVICE_*` variable from the test's environment.
    pub fn with_shim(self) -> SimGpu {
        let dir = self.shim_state_dir();
        self.env("LD_PRELOAD", shim_lib())
            .env("LIBSHARE_STATE_DIR", dir)
            .with_stats()
    }

    /// `SIMGPU_STATS_FILE=<state>/stats.jsonl`.
    pub fn with_stats(self) -> SimGpu {
        let f = self.stats_file();
        self.env("SIMGPU_STATS_FILE", f)
    }

    /// `LIBSHARE_MEMORY_LIMIT`.
    pub fn quota(self, limit: &str) -> SimGpu {
        self.env("LIBSHARE_MEMORY_LIMIT", limit)
    }

    /// The shim's `LIBSHARE_STATE_DIR` for this machine (inside its temporary directory; not
    /// created until a shimmed process initialises CUDA).
    pub fn shim_state_dir(&self) -> PathBuf {
        self.state_dir().join("libshare")
    }

    /// `container`'s state file under [`SimGpu::shim_state_dir`].
    pub fn container_state_path(&self, container: &str) -> PathBuf {
        self.shim_state_dir()
            .join("containers")
            .join(container)
            .join(libshare_abi::STATE_FILE)
    }

    /// `sharectl ARGS --state-dir <this machine's>`, with simgpu's NVML; not yet run.
    pub fn sharectl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(artifacts().bin("sharectl"));
        self.configure(&mut cmd);
        cmd.args(args)
            .arg("--state-dir")
            .arg(self.shim_state_dir())
            .stdin(Stdio::null());
        cmd
    }

    /// [`SimGpu::sharectl_cmd`], run.
    pub fn sharectl(&self, args: &[&str]) -> Output {
        self.sharectl_cmd(args).output().expect("run sharectl")
    }

    /// `<state>/stats.jsonl`: simgpu appends one JSON line per process at exit.
    pub fn stats_file(&self) -> PathBuf {
        self.state_dir().join("stats.jsonl")
    }

    /// The JSON lines simgpu wrote to the stats file so far.
    pub fn stats(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.stats_file())
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad stats line {l:?}: {e}"))
            })
            .collect()
    }

    /// simgpu's counters summed over every process that wrote a stats line.
    pub fn sim_counts(&self) -> SimCounts {
        self.stats()
            .iter()
            .fold(SimCounts::default(), |c, v| SimCounts {
                launches: c.launches + v["launches"].as_u64().expect("launches"),
                api_allocs: c.api_allocs + v["api_allocs"].as_u64().expect("api_allocs"),
                processes: c.processes + 1,
            })
    }

    /// Maps the shim's state file of `container` (panics if it does not exist).
    pub fn container_state(&self, container: &str) -> libshare_abi::State {
        let path = self
            .shim_state_dir()
            .join("containers")
            .join(container)
            .join(libshare_abi::STATE_FILE);
        libshare_abi::State::open_existing(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The shim's launch and allocation counters of `container`, summed over all slots.
    pub fn shim_counts(&self, container: &str) -> ShimCounts {
        use std::sync::atomic::Ordering::Acquire;
        let st = self.container_state(container);
        let mut c = ShimCounts::default();
        for i in 0..libshare_abi::MAX_PROCS {
            let s = st.slot(i);
            for d in 0..libshare_abi::MAX_DEVICES {
                c.launches += s.launches[d].load(Acquire);
                c.allocs += s.allocs[d].load(Acquire);
            }
        }
        c
    }

    /// simgpu's own highest device-memory use on `dev` (`DevState::mem_peak` in
    /// `<state>/simgpu.state`, see simgpu/src/shared.rs). Read by offset — linking simgpu's rlib
    /// into the tests would unify its features differently and rebuild libcuda.so on every run —
    /// and checked against the magic and the device's `mem_total` (`expected_total`), so a layout
    /// change fails here instead of reading the wrong field.
    pub fn sim_mem_peak(&self, dev: usize, expected_total: u64) -> u64 {
        self.sim_dev_word(dev, expected_total, 8)
    }

    /// simgpu's own device memory in use on `dev` now (`DevState::mem_used`: allocations of
    /// every process plus resident managed chunks), read as [`SimGpu::sim_mem_peak`].
    pub fn sim_mem_used(&self, dev: usize, expected_total: u64) -> u64 {
        self.sim_dev_word(dev, expected_total, 7)
    }

    /// Word `index` of `DevState` of `dev` in simgpu's state file (simgpu's
    /// `shared::tests::dev_state_layout` checks these numbers).
    fn sim_dev_word(&self, dev: usize, expected_total: u64, index: usize) -> u64 {
        const MAGIC: u64 = 0x5349_4d47_5055_0007; // simgpu::shared::MAGIC
        const DEV_OFF: usize = 64; // align64(size_of::<Header>() = 32)
        const DEV_SIZE: usize = 3264; // align64(SchedShared 32 + 13 × u64 + 3 BusyWindows of 2 × 64 × u64)
        const MEM_TOTAL: usize = 6 * 8;
        let path = self.state_dir().join("simgpu.state");
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let u64_at = |off: usize| u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap());
        assert_eq!(u64_at(0), MAGIC, "{}: unknown layout", path.display());
        let ndev = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
        assert!(dev < ndev, "device {dev} of {ndev}");
        let base = DEV_OFF + dev * DEV_SIZE;
        assert_eq!(
            u64_at(base + MEM_TOTAL),
            expected_total,
            "{}: device {dev}'s mem_total is not where expected (layout changed?)",
            path.display()
        );
        u64_at(base + index * 8)
    }

    /// A command for `program` configured for this machine, inheriting no `LIBSHARE_*` or
    /// `CUDA_DEVICE_*` variable from the test's environment (the harness's own `LIBSHARE_CACHE`
    /// would otherwise reach the shim, which refuses unknown `LIBSHARE_` names).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        for (key, _) in std::env::vars_os() {
            let k = key.to_string_lossy();
            if k.starts_with("LIBSHARE_") || k.starts_with("CUDA_DEVICE_") {
                cmd.env_remove(&key);
            }
        }
        self.configure(&mut cmd);
        cmd
    }

    /// Runs a command made by [`SimGpu::command`] (stdin closed, output captured).
    pub fn run_cmd(&self, cmd: Command) -> Output {
        run_with_timeout(cmd, self.timeout)
    }

    /// Runs `make()` and panics unless it exits 0; on failure runs it again with
    /// `SIMGPU_LOG=debug` and `LIBSHARE_LOG=debug` and shows the end of that log.
    pub fn run_cmd_ok(&self, make: impl Fn() -> Command) -> Output {
        let out = self.run_cmd(make());
        if out.status.success() {
            return out;
        }
        let mut debug_cmd = make();
        debug_cmd
            .env("SIMGPU_LOG", "debug")
            .env("LIBSHARE_LOG", "debug");
        let debug = self.run_cmd(debug_cmd);
        let debug_log = String::from_utf8_lossy(&debug.stderr);
        panic!(
            "{:?} failed\n{}\n---- re-run with SIMGPU_LOG=debug LIBSHARE_LOG=debug: {}\n{}\n{}",
            make(),
            describe(&out),
            debug.status,
            tail(&debug_log, 60),
            failed_calls(&debug_log),
        );
    }

    /// Starts a command made by [`SimGpu::command`] with stdin, stdout and stderr piped, for
    /// tests that talk to the program while it runs. Killed when dropped.
    pub fn spawn(&self, mut cmd: Command) -> Running {
        use std::io::BufRead;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().unwrap();
        let err_reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.read_to_end(&mut buf);
            buf
        });
        Running {
            stdin: child.stdin.take(),
            rx,
            lines: Vec::new(),
            err_reader: Some(err_reader),
            child,
            timeout: self.timeout,
        }
    }
}

/// A program started by [`SimGpu::spawn`].
pub struct Running {
    pub child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    rx: std::sync::mpsc::Receiver<String>,
    /// Every stdout line read so far.
    pub lines: Vec<String>,
    err_reader: Option<std::thread::JoinHandle<Vec<u8>>>,
    timeout: Duration,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads stdout lines until one equals `line` (a handshake: the program prints it and then
    /// waits for stdin). Panics if the program ends first or the machine's timeout passes.
    pub fn wait_for_line(&mut self, line: &str) {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(l) => {
                    let found = l == line;
                    self.lines.push(l);
                    if found {
                        return;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let out = self.finish_inner();
                    panic!(
                        "no line {line:?} from the program ({e})\n{}",
                        describe(&out)
                    );
                }
            }
        }
    }

    /// Reads stdout lines until a JSON line with `"check":"<check>"` (the programs' result
    /// lines) and returns it. Panics if the program ends first or the machine's timeout passes.
    pub fn wait_for_check(&mut self, check: &str) -> serde_json::Value {
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(l) => {
                    let v = serde_json::from_str::<serde_json::Value>(&l).ok();
                    self.lines.push(l);
                    if let Some(v) = v.filter(|v| v["check"] == check) {
                        return v;
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    let out = self.finish_inner();
                    panic!(
                        "no {check:?} line from the program ({e})\n{}",
                        describe(&out)
                    );
                }
            }
        }
    }

    /// The stdout lines printed so far, without waiting (read into [`Running::lines`]).
    pub fn poll_lines(&mut self) -> &[String] {
        while let Ok(l) = self.rx.try_recv() {
            self.lines.push(l);
        }
        &self.lines
    }

    /// Writes `text` to the program's stdin.
    pub fn send(&mut self, text: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        stdin.write_all(text.as_bytes()).expect("write stdin");
        stdin.flush().expect("flush stdin");
    }

    /// Closes the program's stdin (for programs that wait for EOF to go on).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Closes stdin and waits for the program to exit (killed after the machine's timeout).
    /// Returns everything it printed (stdout including the lines already read).
    pub fn finish(mut self) -> Output {
        let out = self.finish_inner();
        assert!(
            out.status.code().is_some(),
            "program was killed by a signal (or the timeout)\n{}",
            describe(&out)
        );
        out
    }

    fn finish_inner(&mut self) -> Output {
        drop(self.stdin.take());
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait for child") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                break self.child.wait().expect("wait for child");
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // The reader thread ends at EOF (every writer of the pipe has exited).
        let rest: Vec<String> = self.rx.iter().collect();
        self.lines.extend(rest);
        let mut stdout = self.lines.join("\n").into_bytes();
        if !self.lines.is_empty() {
            stdout.push(b'\n');
        }
        let stderr = self
            .err_reader
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        Output {
            status,
            stdout,
            stderr,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub mod apiserver;
pub mod cgroups;
pub mod containers;
pub mod debian;
pub mod dra_kubelet;
pub mod house;
pub mod kubelet;

/// A `sharectl daemon` the test started (`target/release/sharectl`), killed with SIGKILL when
/// dropped (what a crash does; [`Daemon::kill9`] to do it on purpose).
pub struct Daemon(pub std::process::Child);

impl Daemon {
    /// `sharectl daemon --state-dir DIR ARGS...`, its log on the test's stderr.
    pub fn start(state_dir: &Path, args: &[&str]) -> Daemon {
        std::fs::create_dir_all(state_dir).unwrap();
        let child = Command::new(artifacts().bin("sharectl"))
            // The tests' jobs run on this host, named by LIBSHARE_CONTAINER.
            .args(["daemon", "--trust-env", "--state-dir"])
            .arg(state_dir)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sharectl daemon");
        Daemon(child)
    }

    pub fn kill9(mut self) {
        self.0.kill().expect("SIGKILL the daemon");
        self.0.wait().expect("reap the daemon");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A check that cannot run here: prints `SKIP: why`, or fails the test under `CI=true` (CI
/// machines have everything the tests need: a missing piece is a broken install step).
pub fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "cannot run under CI=true: {why}"
    );
    eprintln!("SKIP: {why}");
}

/// `promtool check metrics` (Prometheus's own linter of its text format) on `text`, the metrics
/// of `what`: panics with promtool's complaint, or [`skip`]s when promtool is not installed.
pub fn promtool_check(text: &str, what: &str) {
    use std::io::Write;
    let mut p = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(p) => p,
        Err(e) => {
            return skip(&format!(
                "promtool check of {what}: promtool not available ({e}); scripts/test.sh \
                 installs Debian's prometheus package"
            ))
        }
    };
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics of {what} failed:\n{}{}\n---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A command's standard output, once it succeeded (panics with its stderr otherwise).
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names of the entries of `dir`, sorted (none if it does not exist).
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A simgpu configuration file with one GPU per entry of `mem` (its memory), in `dir`; rewritten
/// to "restart" simgpu with other GPUs (NVML reads it again in a new process).
pub fn gpus_file(dir: &Path, mem: &[&str]) -> PathBuf {
    let path = dir.join("simgpu.toml");
    let text: String = mem
        .iter()
        .map(|m| format!("[[device]]\nmemory = \"{m}\"\n"))
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// CPU time (user + system) of process `pid` so far, seconds (at 100 clock ticks a second).
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // Fields 14 and 15 (utime, stime), counted from the state letter (field 3).
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// Polls `cond` every 200 µs; how long it took to hold, or None after `limit`.
pub fn until(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cond() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    None
}

impl SimGpu {
    /// Maps `container`'s state once its shim (or the daemon) created and initialised it
    /// (panics after 30 s).
    pub fn wait_container_state(&self, container: &str) -> libshare_abi::State {
        let path = self
            .shim_state_dir()
            .join("containers")
            .join(container)
            .join(libshare_abi::STATE_FILE);
        let mut st = None;
        until(Duration::from_secs(30), || {
            st = libshare_abi::State::open_existing(&path).ok();
            st.is_some()
        })
        .unwrap_or_else(|| panic!("{container} never started ({})", path.display()));
        st.unwrap()
    }
}

impl SimGpu {
    /// `hold_memory hold MIB` (tests/cuda/hold_memory.c) in `container`, once it holds the
    /// memory (panics if the allocation failed); it runs until killed.
    pub fn hold_memory(&self, container: &str, mib: u32) -> std::process::Child {
        use std::io::BufRead;
        let prog = compile_gcc("hold_memory.c", "hold_memory", &["-lcuda"]);
        let mut cmd = Command::new(&prog);
        cmd.args(["hold", &mib.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        self.configure(&mut cmd);
        cmd.env("LIBSHARE_CONTAINER", container);
        let mut child = cmd.spawn().expect("spawn hold_memory");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(
            line.contains("\"result\":0"),
            "hold_memory could not allocate {mib} MiB: {line}"
        );
        child
    }
}

/// [`unmount`] when dropped.
pub struct Unmounted(pub PathBuf);

impl Drop for Unmounted {
    fn drop(&mut self) {
        unmount(&self.0);
    }
}

/// Takes a mount off the host (lazily): `sharectl daemon --hami`'s read-only mount of its
/// socket's directory outlives the daemon, as it must on a node, but not a test — left at
/// `/tmp/vgpulock/libshare`, every shim on the host would ask the daemon that is gone.
pub fn unmount(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path alive for the call; a failure (nothing mounted) is fine.
    unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
}

/// Runs `cmd` with `input` on its standard input (then closed) and its stdout and stderr
/// captured, as a runtime runs an OCI hook with the container's state.
pub fn output_with_stdin(cmd: &mut Command, input: &[u8]) -> Output {
    use std::io::Write;
    let mut c = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input).unwrap();
    c.wait_with_output().unwrap()
}
