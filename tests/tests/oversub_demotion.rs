//! Issue 20, Build 3: the demotion protocol (`libshare_abi::demote`). An oversubscribing
//! opportunistic job holds a 256 MiB device resident (224 MiB of managed memory, touched every
//! 5 ms); production, beside it through a real daemon, allocates 128 MiB within its quota.
//! The program is `tests/cuda/demote.c`; the words of the protocol are read from the
//! containers' state files.

use libshare_abi::{container_dir, State, STATE_FILE};
use libshare_tests::cgroups::start_daemon;
use libshare_tests::{compile_gcc, json_check, ok, until, Running, SimGpu};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering::Acquire;
use std::time::Duration;

const HOLD_MIB: u64 = 224;
const PIECES: u64 = HOLD_MIB / 8;
/// What a production allocation may take: the protocol's bound (50 ms) plus the driver's
/// eviction of what is left, with room for a loaded 2-core host.
const BOUND_MS: f64 = 500.0;

fn program() -> std::path::PathBuf {
    compile_gcc("demote.c", "demote", &["-lcuda"])
}

/// A 256 MiB device with the shim and a trusting daemon; the production container `prod`
/// (200 MiB quota) is created first, so the test can see the daemon protect it.
fn node() -> (SimGpu, libshare_tests::Daemon) {
    let gpu = SimGpu::new().memory("256MiB").with_shim();
    let prom = gpu.shim_state_dir().with_extension("prom");
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--trust-env", "--metrics-interval", "100ms"]);
    cmd.arg("--metrics-textfile").arg(&prom);
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    let daemon = start_daemon(&gpu, cmd);
    ok(&gpu.sharectl(&["set", "prod", "--class", "production", "--memory", "200MiB"]));
    (gpu, daemon)
}

fn state(gpu: &SimGpu, name: &str) -> State {
    let p = container_dir(&gpu.shim_state_dir(), name).join(STATE_FILE);
    let mut st = None;
    until(Duration::from_secs(10), || {
        st = State::open_view(&p).ok();
        st.is_some()
    })
    .unwrap_or_else(|| panic!("{} never appeared", p.display()));
    st.unwrap()
}

/// The opportunistic job (oversubscribing), once it holds the device resident.
fn spawn_holder(gpu: &SimGpu) -> Running {
    let mut c = gpu.command(program());
    c.args(["hold", &HOLD_MIB.to_string()])
        .env("LIBSHARE_CONTAINER", "batch")
        .env("LIBSHARE_CLASS", "opportunistic")
        .env("CUDA_OVERSUBSCRIBE", "true")
        .env("LIBSHARE_MEMORY_LIMIT", "1GiB");
    let mut h = gpu.spawn(c);
    h.wait_for_line(&format!(r#"{{"check":"hold","pieces":{PIECES}}}"#));
    h
}

/// [`spawn_holder`], returning once production is protected too.
fn holder(gpu: &SimGpu) -> Running {
    let h = spawn_holder(gpu);
    let prod = state(gpu, "prod");
    until(Duration::from_secs(10), || {
        prod.header().protect.load(Acquire) != 0
    })
    .expect("the daemon never protected production beside an oversubscribing container");
    h
}

fn production(gpu: &SimGpu, args: &[&str]) -> Command {
    let mut c = gpu.command(program());
    c.arg("alloc")
        .args(args)
        .env("LIBSHARE_CONTAINER", "prod")
        .env("LIBSHARE_CLASS", "production");
    c
}

fn alloc_ok(v: &serde_json::Value) -> f64 {
    assert_eq!(
        (&v["error"], &v["bad_words"]),
        (&0.into(), &0.into()),
        "{v}"
    );
    let ms = v["ms"].as_f64().unwrap();
    assert!(ms < BOUND_MS, "production's allocation took {ms} ms: {v}");
    ms
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a child process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

#[test]
fn production_gets_its_memory_by_demotion_and_the_memory_comes_back_after() {
    let (gpu, _daemon) = node();
    let h = holder(&gpu);
    let batch = state(&gpu, "batch");
    let prod = state(&gpu, "prod");
    let v = json_check(&gpu.run_cmd(production(&gpu, &["128"])), "alloc");
    let ms = alloc_ok(&v);
    // Production asked; the opportunistic job demoted (not the driver evicting): what was
    // missing, in whole 8 MiB pieces.
    let want = prod.device(0).mem_want.load(Acquire);
    assert!(want >= 64 << 20, "production posted {want} bytes");
    let demoted = batch.device(0).demoted.load(Acquire);
    assert!(
        demoted >= want && demoted <= HOLD_MIB << 20,
        "demoted {demoted} for a want of {want}"
    );
    eprintln!("production waited {ms:.1} ms; want {want}, demoted {demoted}");
    // The operator sees it: what production waited for, what the job demoted.
    let prom = gpu.shim_state_dir().with_extension("prom");
    let seen = |metric: &str, container: &str| {
        std::fs::read_to_string(&prom).is_ok_and(|t| {
            t.lines().any(|l| {
                l.contains(metric)
                    && l.contains(&format!("container=\"{container}\""))
                    && !l.starts_with('#')
                    && !l.ends_with(" 0")
            })
        })
    };
    until(Duration::from_secs(10), || {
        seen("memory_waited_for", "prod") && seen("memory_demoted", "batch")
    })
    .expect("the metrics never showed the wait and the demotion");
    // Production gone, the pressure ends (1 s without a want): everything comes back.
    until(Duration::from_secs(10), || {
        batch.device(0).demoted.load(Acquire) == 0
    })
    .expect("demoted memory never came back");
    let v = json_check(&h.finish(), "held");
    assert_eq!(
        (&v["pieces"], &v["demoted"], &v["bad_words"]),
        (&PIECES.into(), &0.into(), &0.into()),
        "{v}"
    );
}

#[test]
fn kill_9_of_the_opportunistic_job_asked_to_demote_leaves_production_whole_and_nothing_held() {
    let (gpu, _daemon) = node();
    let h = holder(&gpu);
    let batch = state(&gpu, "batch");
    let p = gpu.spawn(production(&gpu, &["128"]));
    until(Duration::from_secs(10), || {
        batch.device(0).demote.load(Acquire) != 0
    })
    .expect("the daemon never asked for a demotion");
    kill(h.pid(), libc::SIGKILL);
    alloc_ok(&json_check(&p.finish(), "alloc"));
    drop(h);
    // The dead job's footprint leaves its quota (the daemon's rescan) and its demoted count.
    until(Duration::from_secs(10), || {
        batch.device(0).used.load(Acquire) == 0 && batch.device(0).demoted.load(Acquire) == 0
    })
    .expect("the killed job's memory stayed charged");
    // And the device: all but the contexts' overhead is there for production again.
    alloc_ok(&json_check(
        &gpu.run_cmd(production(&gpu, &["192"])),
        "alloc",
    ));
}

#[test]
fn kill_9_of_the_daemon_during_a_demotion_bounds_production_once_then_not_at_all() {
    let (gpu, daemon) = node();
    let h = holder(&gpu);
    let batch = state(&gpu, "batch");
    let prod = state(&gpu, "prod");
    // 128 MiB now, 32 MiB more 1.2 s later (the daemon's stamp is stale by then).
    let mut p = gpu.spawn(production(&gpu, &["128", "32"]));
    until(Duration::from_secs(10), || {
        batch.device(0).demote.load(Acquire) != 0
    })
    .expect("the daemon never asked for a demotion");
    daemon.kill9();
    p.wait_for_line(r#"{"check":"first"}"#);
    let want = prod.device(0).mem_want.load(Acquire);
    let v = json_check(&p.finish(), "alloc");
    alloc_ok(&v);
    assert_eq!(v["error2"], 0, "{v}");
    assert_eq!(
        prod.device(0).mem_want.load(Acquire),
        want,
        "without a daemon, production no longer waits: {v}"
    );
    let v = json_check(&h.finish(), "held");
    assert_eq!(v["bad_words"], 0, "{v}");
}

#[test]
fn a_stopped_opportunistic_job_delays_production_by_the_bound_then_the_driver_evicts() {
    let (gpu, _daemon) = node();
    let h = holder(&gpu);
    kill(h.pid(), libc::SIGSTOP);
    let v = json_check(&gpu.run_cmd(production(&gpu, &["128"])), "alloc");
    let ms = alloc_ok(&v);
    assert!(
        ms >= 50.0,
        "production waited the whole bound ({ms} ms): {v}"
    );
    kill(h.pid(), libc::SIGCONT);
    let v = json_check(&h.finish(), "held");
    assert_eq!(v["bad_words"], 0, "{v}");
}

#[test]
fn without_the_protocol_production_still_gets_its_memory_from_the_driver() {
    // The hints-only baseline (`--no-demotion`): nothing is asked, the driver evicts.
    let gpu = SimGpu::new().memory("256MiB").with_shim();
    let mut cmd = gpu.sharectl_cmd(&["daemon", "--trust-env", "--no-demotion"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::inherit());
    let _daemon = start_daemon(&gpu, cmd);
    let mut h = spawn_holder(&gpu);
    alloc_ok(&json_check(
        &gpu.run_cmd(production(&gpu, &["128"])),
        "alloc",
    ));
    let batch = state(&gpu, "batch");
    assert_eq!(batch.device(0).demoted.load(Acquire), 0);
    let prod = state(&gpu, "prod");
    assert_eq!(prod.header().protect.load(Acquire), 0);
    assert_eq!(prod.device(0).mem_want.load(Acquire), 0);
    h.close_stdin();
    let v = json_check(&h.finish(), "held");
    assert_eq!(
        (&v["demoted"], &v["bad_words"]),
        (&0.into(), &0.into()),
        "{v}"
    );
}

#[test]
fn status_top_and_metrics_show_resident_and_demoted_memory_and_migrations() {
    // Issue 20, Build 5: what the shims publish, as the operator sees it while production holds
    // its memory (its second allocation comes 1.2 s after its first).
    let (gpu, _daemon) = node();
    let h = holder(&gpu);
    let mut p = gpu.spawn(production(&gpu, &["128", "8"]));
    p.wait_for_line(r#"{"check":"first"}"#);
    let piece = 8u64 << 20;
    let mut seen = None;
    until(Duration::from_secs(10), || {
        let out = gpu.sharectl(&["status", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
        seen = v["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["container"] == "batch")
            .map(|c| c["devices"][0].clone())
            .filter(|d| d["demoted_bytes"].as_u64() > Some(0));
        seen.is_some()
    })
    .expect("sharectl status never showed demoted memory");
    let d = seen.unwrap();
    let n = |k: &str| d[k].as_u64().unwrap_or_else(|| panic!("no {k}: {d}"));
    // One snapshot: the footprint is what is resident plus what is demoted, in whole pieces,
    // each moved at least once.
    assert_eq!(
        n("resident_bytes") + n("demoted_bytes"),
        n("used_bytes"),
        "{d}"
    );
    assert_eq!(n("used_bytes"), HOLD_MIB << 20, "{d}");
    assert_eq!(n("demoted_bytes") % piece, 0, "{d}");
    assert!(
        n("demoted_bytes") >= 64 << 20,
        "production's want was met: {d}"
    );
    assert!(n("migrations") >= n("demoted_bytes") / piece, "{d}");
    // The table and top's plain print show the same columns for the same container.
    let table = ok(&gpu.sharectl(&["status"]));
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&header[7..10], ["RESIDENT", "DEMOTED", "MIGR"], "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("batch "))
        .unwrap_or_else(|| panic!("no batch row: {table}"));
    assert!(
        !row.contains(" 0 B "),
        "nothing demoted in the table: {row}"
    );
    let top = ok(&gpu.sharectl(&["top", "--once", "--interval", "100ms"]));
    let header = top.lines().find(|l| l.starts_with("CONTAINER")).unwrap();
    let cols: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        &cols[cols.len() - 4..],
        ["RESIDENT", "DEMOTED", "MIGR", "PROCS"]
    );
    let row: Vec<&str> = top
        .lines()
        .find(|l| l.starts_with("batch "))
        .unwrap_or_else(|| panic!("no batch row: {top}"))
        .split_whitespace()
        .collect();
    let migr: u64 = row[row.len() - 2].parse().unwrap();
    assert!(
        migr >= n("migrations"),
        "top's MIGR {migr} below status's: {row:?}"
    );
    // /metrics' textfile has the same three figures.
    let prom = gpu.shim_state_dir().with_extension("prom");
    until(Duration::from_secs(10), || {
        std::fs::read_to_string(&prom).is_ok_and(|t| {
            ["memory_resident", "memory_demoted", "memory_migrations"]
                .iter()
                .all(|m| {
                    t.lines().any(|l| {
                        l.contains(m) && l.contains("container=\"batch\"") && !l.ends_with(" 0")
                    })
                })
        })
    })
    .expect("the metrics never showed resident, demoted and migrations");
    alloc_ok(&json_check(&p.finish(), "alloc"));
    let v = json_check(&h.finish(), "held");
    assert_eq!(v["bad_words"], 0, "{v}");
}
