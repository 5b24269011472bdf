//! Issue 22, HAMi mode (must-show 3 and the HAMi part of 5): libshare installed where HAMi's
//! device plugin mounts its library. Each container gets exactly what HAMi's `Allocate` gives
//! one (`anchors-hami-gemini.md` §7, `anchors-refresh-2026.md` §3), replayed into podman:
//! - env `CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m`, `CUDA_DEVICE_SM_LIMIT`,
//!   `CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<uuid>.cache`, and the webhook's
//!   `CUDA_TASK_PRIORITY`;
//! - mounts: the library at `/usr/local/vgpu/libvgpu.so` (read-only), the container's own
//!   `<hook>/vgpu/containers/<pod>_<ctr>/` at `/usr/local/vgpu` (read-write), `/tmp/vgpulock`
//!   (read-write), `<hook>/vgpu/ld.so.preload` at `/etc/ld.so.preload` (read-only) unless
//!   `CUDA_DISABLE_CONTROL=true`;
//! - the driver (here simgpu's libraries and state, as NVIDIA's toolkit would mount a driver's).
//!
//! `sharectl daemon --hami` listens in `/tmp/vgpulock` and adopts each container's HAMi
//! settings; `hami_check` (what HAMi-core's tests check) inside sees the memory limit as the
//! device, allocates up to it and gets `CUDA_ERROR_OUT_OF_MEMORY` past it, NVML reports the
//! limit; `sharectl status` shows the quota, class and compute share HAMi-core would give.

use libshare_tests::containers::{rootfs, unique, Held, Node, Podman, MIB};
use libshare_tests::{artifacts, compile_gcc, ok, shim_lib, unmount, Unmounted};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The host side of HAMi's mounts: `$HOOK_PATH/vgpu` (with `ld.so.preload` naming the
/// library as HAMi's `vgpu-init.sh` writes it) and `/tmp/vgpulock`.
/// What HAMi's scheduler granted a container: MiB of device memory, SM percent, and the
/// webhook's priority.
struct Grant {
    limit_mib: u64,
    sm: u32,
    priority: u32,
}

struct Hami {
    hook: tempfile::TempDir,
    vgpulock: tempfile::TempDir,
}

impl Hami {
    fn new() -> Hami {
        let hook = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(hook.path().join("vgpu/containers")).unwrap();
        std::fs::write(
            hook.path().join("vgpu/ld.so.preload"),
            "/usr/local/vgpu/libvgpu.so\n",
        )
        .unwrap();
        let vgpulock = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(vgpulock.path().join("libshare")).unwrap();
        Hami { hook, vgpulock }
    }

    fn socket(&self) -> PathBuf {
        self.vgpulock.path().join("libshare/register.sock")
    }

    /// `--hami --hami-dir <this vgpulock>`: the daemon mounts its socket's directory read-only
    /// in it.
    fn daemon_args(&self) -> Vec<String> {
        vec![
            "--hami".into(),
            "--hami-dir".into(),
            self.vgpulock.path().display().to_string(),
        ]
    }

    /// `podman create` arguments HAMi's Allocate would give container `ctr` of pod `pod`
    /// with `grant`, plus `extra` env.
    fn allocate(
        &self,
        node: &Node,
        pod_ctr: (&str, &str),
        grant: Grant,
        extra: &[&str],
    ) -> Vec<String> {
        let (
            (pod, ctr),
            Grant {
                limit_mib,
                sm,
                priority,
            },
        ) = (pod_ctr, grant);
        let dir = self
            .hook
            .path()
            .join(format!("vgpu/containers/{pod}_{ctr}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut env = vec![
            format!("CUDA_DEVICE_MEMORY_LIMIT_0={limit_mib}m"),
            format!("CUDA_DEVICE_SM_LIMIT={sm}"),
            format!("CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/{pod}-{ctr}.cache"),
            format!("CUDA_TASK_PRIORITY={priority}"),
            "LIBCUDA_LOG_LEVEL=0".into(),
        ];
        env.extend(extra.iter().map(|s| s.to_string()));
        let disable = env.iter().any(|e| e == "CUDA_DISABLE_CONTROL=true");
        let mut a: Vec<String> = Vec::new();
        let mut mount = |host: &Path, ctr: &str, ro: bool| {
            a.push("-v".into());
            a.push(format!(
                "{}:{ctr}:{}",
                host.display(),
                if ro { "ro" } else { "rw" }
            ));
        };
        mount(&dir, "/usr/local/vgpu", false);
        mount(&shim_lib(), "/usr/local/vgpu/libvgpu.so", true);
        mount(self.vgpulock.path(), "/tmp/vgpulock", false);
        if !disable {
            mount(
                &self.hook.path().join("vgpu/ld.so.preload"),
                "/etc/ld.so.preload",
                true,
            );
        }
        // The driver, as NVIDIA's toolkit would mount it: simgpu's libraries and its state.
        for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            let host = std::fs::canonicalize(artifacts().lib_dir.join(lib)).unwrap();
            mount(&host, &format!("/usr/lib/x86_64-linux-gnu/{lib}"), true);
        }
        mount(node.gpu.state_dir(), "/dev/shm/simgpu-0", false);
        for e in env {
            a.push("-e".into());
            a.push(e);
        }
        a
    }
}

impl Drop for Hami {
    fn drop(&mut self) {
        unmount(&self.vgpulock.path().join("libshare"));
    }
}

fn hami_check() -> PathBuf {
    compile_gcc("hami_check.c", "hami_check", &["-lcuda"])
}

/// podman, HAMi's host side, and a node whose daemon runs in HAMi mode.
fn hami_node(dir: &Path) -> Option<(Node, Podman, Hami)> {
    let hami = Hami::new();
    let args = hami.daemon_args();
    let node = Node::start("8GiB", &args.iter().map(|a| a.as_str()).collect::<Vec<_>>());
    rootfs(dir, &[&hami_check()]);
    let podman = Podman::new(dir)?;
    Some((node, podman, hami))
}

/// `podman create -i --name NAME --network none --pid host ARGS IMAGE hami_check MIB`, its id.
fn create(podman: &Podman, name: &str, args: &[String], mib: u64) -> String {
    let out = podman
        .cmd(&[
            "create",
            "-i",
            "--name",
            name,
            "--network",
            "none",
            "--pid",
            "host",
        ])
        .args(args)
        .arg(&podman.image)
        .args(["/usr/bin/hami_check", &mib.to_string()])
        .output()
        .unwrap();
    ok(&out).trim().to_string()
}

fn status(node: &Node) -> serde_json::Value {
    serde_json::from_str(&ok(&node.sharectl(&["status", "--json"]).output().unwrap())).unwrap()
}

#[test]
fn hami_allocate_env_and_mounts_give_hami_cores_quota_and_share() {
    let dir = tempfile::tempdir().unwrap();
    let Some((node, podman, hami)) = hami_node(dir.path()) else {
        return;
    };
    let (prod_name, opp_name) = (unique("hami-prod"), unique("hami-opp"));
    let _c = podman.removing(&[&prod_name, &opp_name]);
    // Inference at high priority (0): 1 GiB, no SM limit. Training at low priority (1):
    // 512 MiB, 30 % of the SMs.
    let prod = create(
        &podman,
        &prod_name,
        &hami.allocate(
            &node,
            ("pod1", "infer"),
            Grant {
                limit_mib: 1024,
                sm: 0,
                priority: 0,
            },
            &[],
        ),
        1024 - 16,
    );
    let opp = create(
        &podman,
        &opp_name,
        &hami.allocate(
            &node,
            ("pod2", "train"),
            Grant {
                limit_mib: 512,
                sm: 30,
                priority: 1,
            },
            &[],
        ),
        512 - 16,
    );
    let (prod_id, opp_id) = (&prod[..12], &opp[..12]);

    let p = Held::start(podman.cmd(&["start", "-ai", &prod_name]), 1024 * MIB);
    let o = Held::start(podman.cmd(&["start", "-ai", &opp_name]), 512 * MIB);
    for (h, quota) in [(&p, 1024 * MIB), (&o, 512 * MIB)] {
        let nvml = h.check("nvml");
        assert_eq!(nvml["result"], 0, "{:?}", h.lines);
        assert_eq!(
            nvml["total"], quota,
            "NVML reports the limit as the device: {:?}",
            h.lines
        );
        assert_eq!(nvml["used"], quota - 16 * MIB, "{:?}", h.lines);
    }
    // What HAMi-core would give, as the operator sees it.
    node.assert_status(&[
        (prod_id, "production", 1024 * MIB),
        (opp_id, "opportunistic", 512 * MIB),
    ]);
    let s = status(&node);
    let share = |id: &str| {
        s["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["container"] == id)
            .unwrap()["devices"][0]["compute_share_percent"]
            .as_f64()
    };
    assert_eq!(share(prod_id), Some(0.0), "no SM limit: {s}");
    assert_eq!(share(opp_id), Some(30.0), "CUDA_DEVICE_SM_LIMIT=30: {s}");
    let table = ok(&node.sharectl(&["status"]).output().unwrap());
    p.end();
    o.end();
    eprintln!("HAMi Allocate replayed into podman:\n{table}");
}

#[test]
fn hami_bad_input_is_one_line_and_nothing_is_allocated() {
    let dir = tempfile::tempdir().unwrap();
    let Some((node, podman, hami)) = hami_node(dir.path()) else {
        return;
    };
    let (bad, off) = (unique("hami-bad"), unique("hami-off"));
    let _c = podman.removing(&[&bad, &off]);
    // An SM limit out of range (HAMi-core would run the container unlimited).
    let args = hami.allocate(
        &node,
        ("pod3", "bad"),
        Grant {
            limit_mib: 512,
            sm: 150,
            priority: 1,
        },
        &[],
    );
    let id = create(&podman, &bad, &args, 512 - 16);
    let out = podman
        .cmd(&["start", "-ai", &bad])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("libshare:")).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("CUDA_DEVICE_SM_LIMIT=\"150\""),
        "{}",
        lines[0]
    );
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains("\"check\":\"mem\",\"result\":") && !out.contains("\"fill\""),
        "nothing allocated: {out}"
    );
    let s = status(&node);
    assert!(
        !s["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["container"] == id[..12]),
        "no state for the refused container: {s}"
    );

    // CUDA_DISABLE_CONTROL=true: HAMi mounts no /etc/ld.so.preload, so libshare is not loaded
    // and the container sees the whole device (as with HAMi-core).
    let args = hami.allocate(
        &node,
        ("pod4", "off"),
        Grant {
            limit_mib: 512,
            sm: 0,
            priority: 0,
        },
        &["CUDA_DISABLE_CONTROL=true"],
    );
    create(&podman, &off, &args, 16);
    let out = podman
        .cmd(&["start", "-ai", &off])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v = libshare_tests::json_check(&out, "mem");
    assert_eq!(v["total"], 8u64 << 30, "{v}");
}

/// Audit 4, B5b: a HAMi container's settings are adopted from its first process (its init, as
/// the runtime started it with the variables HAMi's device plugin gave the container), not from
/// whichever process registers first: here the init's child, started with a 4 GiB limit at
/// high priority of its own choosing, registers first and the container still gets HAMi's
/// 512 MiB at low priority (before: production, 4 GiB).
#[test]
fn hami_settings_come_from_the_containers_first_process_not_a_later_ones_environment() {
    let dir = tempfile::tempdir().unwrap();
    let Some((node, podman, hami)) = hami_node(dir.path()) else {
        return;
    };
    let name = unique("hami-later");
    let _c = podman.removing(&[&name]);
    let args = hami.allocate(
        &node,
        ("pod5", "later"),
        Grant {
            limit_mib: 512,
            sm: 0,
            priority: 1,
        },
        &[],
    );
    // `; true` keeps sh (the init) from exec'ing the command: the command is a child of it.
    let id = create_sh(
        &podman,
        &name,
        &args,
        "CUDA_DEVICE_MEMORY_LIMIT_0=4g CUDA_TASK_PRIORITY=0 /usr/bin/hami_check 16; true",
    );
    let out = podman
        .cmd(&["start", "-ai", &name])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v = libshare_tests::json_check(&out, "nvml");
    assert_eq!(v["total"], 512 * MIB, "the quota HAMi gave: {v}");
    let s = status(&node);
    let c = s["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["container"] == id[..12])
        .unwrap_or_else(|| panic!("{} not in sharectl status: {s}", &id[..12]));
    assert_eq!(c["class"], "opportunistic", "CUDA_TASK_PRIORITY=1: {s}");
    assert_eq!(c["devices"][0]["quota_bytes"], 512 * MIB, "{s}");
}

/// `podman create -i --name NAME --network none --pid host ARGS IMAGE /bin/sh -c CMD`, its id.
fn create_sh(podman: &Podman, name: &str, args: &[String], cmd: &str) -> String {
    let out = podman
        .cmd(&[
            "create",
            "-i",
            "--name",
            name,
            "--network",
            "none",
            "--pid",
            "host",
        ])
        .args(args)
        .arg(&podman.image)
        .args(["/bin/sh", "-c", cmd])
        .output()
        .unwrap();
    ok(&out).trim().to_string()
}

/// What a root container does to take over registrations: replace the shared socket with a
/// daemon of its own that gives every container it registers 32 MiB (`sharectl daemon` from
/// the image, the audit's `reg.py fake`). It asks for no preload of its own
/// (`CUDA_DISABLE_CONTROL=true`: its own pod, its choice).
const ATTACK: &str = "printf '[defaults.all]\\nmemory = 33554432\\n' > /tmp/evil.toml; \
     rm -f /tmp/vgpulock/libshare/register.sock; \
     exec /usr/bin/sharectl daemon --trust-env --state-dir /tmp/evil --config /tmp/evil.toml \
     --register-socket /tmp/vgpulock/libshare/register.sock";

/// A HAMi image with the attacker's tools: `hami_check`, `sharectl`, `mv`, `mkdir`, `rm`. It
/// has no `/tmp`: the runtime makes one for HAMi's `/tmp/vgpulock` (a directory of the
/// container's own layer, which it can rename; one of the image's could only be copied).
fn attack_image(dir: &Path) -> Option<Podman> {
    rootfs(
        dir,
        &[
            &hami_check(),
            &artifacts().bin("sharectl"),
            Path::new("/bin/mv"),
            Path::new("/bin/mkdir"),
            Path::new("/bin/rm"),
        ],
    );
    std::fs::remove_dir(dir.join("tmp")).unwrap();
    Podman::new(dir)
}

/// Starts the attacker's container and waits until its daemon has replaced the socket at
/// `socket` (its inode changed) or the container has ended (it could not).
fn attack(podman: &Podman, name: &str, hami: &Hami, node: &Node, socket: &Path) {
    use std::os::unix::fs::MetadataExt;
    let before = std::fs::metadata(socket).map(|m| m.ino()).ok();
    let args = hami.allocate(
        node,
        ("evil", "evil"),
        Grant {
            limit_mib: 64,
            sm: 0,
            priority: 0,
        },
        &["CUDA_DISABLE_CONTROL=true"],
    );
    create_sh(podman, name, &args, ATTACK);
    ok(&podman.cmd(&["start", name]).output().unwrap());
    libshare_tests::until(std::time::Duration::from_secs(20), || {
        let replaced = std::fs::metadata(socket).map(|m| m.ino()).ok() != before
            && std::os::unix::net::UnixStream::connect(socket).is_ok();
        let running = podman
            .cmd(&["inspect", "--format", "{{.State.Running}}", name])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "true");
        replaced || !running
    })
    .expect("the attacker's container neither replaced the socket nor ended");
}

/// Issue 30, B5c: a root container that replaces `/tmp/vgpulock/libshare/register.sock` (HAMi
/// mounts `/tmp/vgpulock` read-write into every container) cannot answer another container's
/// registrations: the daemon mounts its socket's directory read-only there, so the attacker's
/// daemon never binds, and the victim gets HAMi's grant from the real daemon. A victim's
/// process that moves `/tmp` away (and raises its own limit) still finds the daemon.
#[test]
fn hami_a_container_cannot_answer_other_containers_registrations() {
    let dir = tempfile::tempdir().unwrap();
    let hami = Hami::new();
    let socket = hami.socket();
    let args = hami.daemon_args();
    let node = Node::start("8GiB", &args.iter().map(|a| a.as_str()).collect::<Vec<_>>());
    let Some(podman) = attack_image(dir.path()) else {
        return;
    };
    let (evil, victim) = (unique("hami-evil"), unique("hami-victim"));
    let _c = podman.removing(&[&evil, &victim]);
    attack(&podman, &evil, &hami, &node, &socket);
    let args = hami.allocate(
        &node,
        ("pod5", "victim"),
        Grant {
            limit_mib: 1024,
            sm: 0,
            priority: 0,
        },
        &[],
    );
    let id = create_sh(&podman, &victim, &args, "exec /usr/bin/hami_check 1008");
    // The victim's grant (1 GiB), from the real daemon: not the attacker's 32 MiB.
    let held = Held::start(podman.cmd(&["start", "-ai", &victim]), 1024 * MIB);
    node.assert_status(&[(&id[..12], "production", 1024 * MIB)]);
    // A later process of the victim's that moved /tmp away (and raised its own limit):
    // registered all the same, the container's adopted 1 GiB.
    let out = podman
        .cmd(&[
            "exec",
            &victim,
            "/bin/sh",
            "-c",
            "mv /tmp /tmp.moved && mkdir /tmp && export CUDA_DEVICE_MEMORY_LIMIT_0=4g && \
             exec /usr/bin/hami_check 8",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let mem = libshare_tests::json_check(&out, "mem");
    assert_eq!(
        mem["total"],
        1024 * MIB,
        "registered with the daemon: {mem}"
    );
    assert_eq!(mem["free"], 16 * MIB, "the container's usage: {mem}");
    held.end();
}

/// Issue 30, B5c: where the daemon's socket in `/tmp/vgpulock/libshare` is not on a read-only
/// mount (an operator who did not make it, or an attacker's socket on a node without the
/// daemon's mount), a job in HAMi mode refuses it: one line saying what the operator must
/// mount, and nothing allocated.
#[test]
fn hami_a_socket_containers_can_replace_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let hami = Hami::new();
    let socket = hami.socket();
    // The daemon's read-only mount goes to another directory: this vgpulock has none.
    let elsewhere = tempfile::tempdir().unwrap();
    // Dropped after the daemon (which would mount it again).
    let _unmount = Unmounted(elsewhere.path().join("libshare"));
    let node = Node::start(
        "8GiB",
        &["--hami", "--hami-dir", elsewhere.path().to_str().unwrap()],
    );
    let Some(podman) = attack_image(dir.path()) else {
        return;
    };
    let (evil, victim) = (unique("hami-evil2"), unique("hami-victim2"));
    let _c = podman.removing(&[&evil, &victim]);
    attack(&podman, &evil, &hami, &node, &socket);
    let args = hami.allocate(
        &node,
        ("pod6", "victim"),
        Grant {
            limit_mib: 1024,
            sm: 0,
            priority: 0,
        },
        &[],
    );
    create_sh(&podman, &victim, &args, "exec /usr/bin/hami_check 1008");
    let out = podman
        .cmd(&["start", "-ai", &victim])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("libshare:")).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("/tmp/vgpulock/libshare") && lines[0].contains("read-only"),
        "{}",
        lines[0]
    );
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(!out.contains("\"fill\""), "nothing allocated: {out}");
}
