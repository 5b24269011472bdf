//! Issue 30, B6c: an opportunistic container's memory that cannot be demoted (VMM, stream-ordered
//! pools, CUDA arrays, graph memory; device memory when it does not oversubscribe) is bounded by
//! what production leaves on the GPU (`libshare_abi::pin`, `libshare-node/src/pins.rs`), so
//! production's allocation within its quota never fails because of it. Driven as the audit did:
//! a real daemon, the classes and quotas set with `sharectl set`, a 4 GiB GPU, production's
//! quota 1 GiB, an opportunistic container allowed 16 GiB (oversubscribing). The program is
//! `tests/cuda/demote.c` (`take KIND MIB`: allocations it never touches, held until stdin's
//! EOF; `alloc MIB`: production's timed `cuMemAlloc`, filled and read back).

use libshare_tests::cgroups::start_daemon;
use libshare_tests::{compile_gcc, json_check, ok, Daemon, Running, SimGpu};
use std::process::{Command, Stdio};

const OOM: i64 = 2; // CUDA_ERROR_OUT_OF_MEMORY

fn program() -> std::path::PathBuf {
    compile_gcc("demote.c", "demote", &["-lcuda"])
}

/// The audit's node: a 4 GiB GPU, a daemon (it names containers by `LIBSHARE_CONTAINER`, as
/// the audit's processes on the host were), `prod` production with 1 GiB, `batch`
/// opportunistic with 16 GiB and oversubscription, `plain` opportunistic with 4 GiB (no
/// oversubscription: its cudaMalloc is device memory).
fn node() -> (SimGpu, Daemon) {
    let gpu = SimGpu::new().memory("4GiB").with_shim();
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--trust-env"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    let daemon = start_daemon(&gpu, cmd);
    ok(&gpu.sharectl(&["set", "prod", "--class", "production", "--memory", "1GiB"]));
    ok(&gpu.sharectl(&[
        "set",
        "batch",
        "--class",
        "opportunistic",
        "--memory",
        "16GiB",
        "--oversubscribe",
    ]));
    ok(&gpu.sharectl(&[
        "set",
        "plain",
        "--class",
        "opportunistic",
        "--memory",
        "4GiB",
    ]));
    (gpu, daemon)
}

/// `demote take KIND MIB` in `container`, once it made its allocation; returns it (holding
/// what it got until dropped or finished) and its `take` line.
fn take(gpu: &SimGpu, container: &str, kind: &str, mib: u64) -> (Running, serde_json::Value) {
    let mut c = gpu.command(program());
    c.args(["take", kind, &mib.to_string()])
        .env("LIBSHARE_CONTAINER", container);
    let mut h = gpu.spawn(c);
    h.wait_for_line(r#"{"check":"ready"}"#);
    h.send("go\n");
    let v = h.wait_for_check("take");
    (h, v)
}

/// Production's 768 MiB `cuMemAlloc` (within its 1 GiB quota): its error code.
fn production_alloc(gpu: &SimGpu) -> i64 {
    let mut c: Command = gpu.command(program());
    c.args(["alloc", "768"]).env("LIBSHARE_CONTAINER", "prod");
    let v = json_check(&gpu.run_cmd(c), "alloc");
    assert_eq!(v["bad_words"], 0, "{v}");
    v["error"].as_i64().unwrap()
}

#[test]
fn an_opportunistic_job_cannot_take_productions_memory_with_memory_that_cannot_be_demoted() {
    let (gpu, _daemon) = node();
    // The audit's repro: 3.5 GiB of VMM on the 4 GiB GPU made production's 768 MiB fail. Now
    // refused, with one line; so are a pool's and, for the container that does not
    // oversubscribe, plain device memory.
    for (container, kind) in [("batch", "vmm"), ("batch", "pool"), ("plain", "alloc")] {
        let (h, v) = take(&gpu, container, kind, 3584);
        assert_eq!(v["error"], OOM, "{container} {kind}: {v}");
        let out = h.finish();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("cannot be demoted") && err.contains("production"),
            "{container} {kind}: {err}"
        );
    }
    // What production leaves (4 GiB less 5 %, less its 1 GiB: 2.8 GiB) is the opportunistic
    // job's: 2 GiB of VMM is made and held, and production still gets its 768 MiB beside it.
    let (h, v) = take(&gpu, "batch", "vmm", 2048);
    assert_eq!(v["error"], 0, "{v}");
    assert_eq!(
        production_alloc(&gpu),
        0,
        "production refused beside 2 GiB of VMM"
    );
    h.finish();
}

#[test]
fn opportunistic_containers_together_stay_within_what_production_leaves() {
    let (gpu, _daemon) = node();
    // batch holds 2 GiB of VMM; plain's 2 GiB of device memory would take production's part,
    // so it is refused, while 512 MiB fits what is left; production gets its 768 MiB.
    let (a, v) = take(&gpu, "batch", "vmm", 2048);
    assert_eq!(v["error"], 0, "{v}");
    let (b, v) = take(&gpu, "plain", "alloc", 2048);
    assert_eq!(v["error"], OOM, "{v}");
    b.finish();
    let (c, v) = take(&gpu, "plain", "alloc", 512);
    assert_eq!(v["error"], 0, "{v}");
    assert_eq!(production_alloc(&gpu), 0);
    // batch lets go: its room is plain's once the daemon looks again.
    a.finish();
    let (d, v) = take(&gpu, "plain", "alloc", 2048);
    assert_eq!(v["error"], 0, "{v}");
    c.finish();
    d.finish();
}
