//! Images injection must not break (issue 21, must-show 3): an image's own
//! `/etc/ld.so.preload` (merged: both load), a user's `LD_PRELOAD` (both load), a read-only
//! root, a musl and a static image (not injected, one line in the host's hook log, every
//! program runs) — through podman's CDI path and runc's hook path.

use libshare_tests::containers::{have, hook_entry, rootfs, unique, Node, Podman, Runc};
use libshare_tests::ok;
use std::path::Path;
use std::process::Command;

/// Prints which of the libraries are mapped in this (dynamic, dash) process, one per line.
const WHICH: &str = "for w in libshare.so own.so user.so; do while read -r l; do case \"$l\" in *$w*) echo $w; break;; esac; done < /proc/self/maps; done";

/// `dir/usr/lib/NAME.so`, a library that does nothing.
fn tiny_lib(dir: &Path, name: &str) {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, format!("int {name}_marker = 1;\n")).unwrap();
    let out = dir.join(format!("usr/lib/{name}.so"));
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::remove_file(src).unwrap();
}

/// A glibc image with `own.so` in its own /etc/ld.so.preload and `user.so` beside it.
fn own_preload_image(dir: &Path) {
    rootfs(dir, &[]);
    tiny_lib(dir, "own");
    tiny_lib(dir, "user");
    std::fs::write(
        dir.join("etc/ld.so.preload"),
        "# the image's own\n/usr/lib/own.so\n",
    )
    .unwrap();
}

/// An image without glibc: static busybox, and a musl program when musl-gcc is installed.
fn no_glibc_image(dir: &Path) -> Vec<Vec<String>> {
    for d in ["bin", "etc", "proc", "sys", "dev", "tmp", "run"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let ldd = Command::new("ldd").arg("/bin/busybox").output().unwrap();
    assert!(
        !ldd.status.success(),
        "/bin/busybox is dynamic: install busybox-static (scripts/test.sh does)"
    );
    std::fs::copy("/bin/busybox", dir.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", dir.join("bin/sh")).unwrap();
    let mut progs = vec![vec![
        "/bin/busybox".into(),
        "echo".into(),
        "static ran".into(),
    ]];
    if have("musl-gcc") {
        let src = dir.join("hello.c");
        std::fs::write(
            &src,
            "#include <stdio.h>\nint main(void) { puts(\"musl ran\"); return 0; }\n",
        )
        .unwrap();
        let st = Command::new("musl-gcc")
            .arg("-o")
            .arg(dir.join("bin/hello"))
            .arg(&src)
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::remove_file(src).unwrap();
        // musl's loader is its libc (Debian's musl package).
        let musl = "/usr/lib/x86_64-linux-musl/libc.so";
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::copy(musl, dir.join("lib/ld-musl-x86_64.so.1")).unwrap();
        progs.push(vec!["/bin/hello".into()]);
    }
    progs
}

fn lines(out: &std::process::Output) -> String {
    ok(out).trim().to_string()
}

fn hook_log(node: &Node) -> String {
    std::fs::read_to_string(node.state_dir().join("inject/hook.log")).unwrap_or_default()
}

#[test]
fn podman_cdi_merges_an_images_preload_keeps_ld_preload_and_works_read_only() {
    let node = Node::start("8GiB", &[]);
    let dir = tempfile::tempdir().unwrap();
    own_preload_image(dir.path());
    let Some(podman) = Podman::new(dir.path()) else {
        return;
    };
    let (_spec, kind) = node.cdi_spec("e");
    let device = format!("{kind}=all");
    let sh = ["/bin/sh", "-c", WHICH];
    assert_eq!(lines(&podman.run(&[], &sh)), "own.so", "control");
    assert_eq!(
        lines(&podman.run(&["--device", &device], &sh)),
        "libshare.so\nown.so",
        "the image's preload is merged, not hidden"
    );
    assert_eq!(
        lines(&podman.run(
            &["--device", &device, "-e", "LD_PRELOAD=/usr/lib/user.so"],
            &sh
        )),
        "libshare.so\nown.so\nuser.so",
        "a user's LD_PRELOAD still loads"
    );
    assert_eq!(
        lines(&podman.run(&["--device", &device, "--read-only"], &sh)),
        "libshare.so\nown.so",
        "a read-only root"
    );
    // The merged lists were host files per container, removed by the poststop hook.
    let left = || -> Vec<_> {
        std::fs::read_dir(node.state_dir().join("inject"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect()
    };
    let t = libshare_tests::until(std::time::Duration::from_secs(10), || left().is_empty());
    assert!(t.is_some(), "left behind: {:?}", left());
    // The image's file is untouched.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("etc/ld.so.preload")).unwrap(),
        "# the image's own\n/usr/lib/own.so\n"
    );
}

#[test]
fn runc_hook_merges_an_images_preload_and_keeps_ld_preload() {
    let Some(runc) = Runc::new() else {
        return;
    };
    let node = Node::start("8GiB", &["--cgroup-prefix", &runc.cgroup_prefix]);
    let dir = tempfile::tempdir().unwrap();
    own_preload_image(dir.path());
    let hook = hook_entry(&node.inject_args());
    let b = runc.bundle("own", dir.path(), |c| {
        c["process"]["args"] = serde_json::json!(["/bin/sh", "-c", WHICH]);
        c["process"]["env"]
            .as_array_mut()
            .unwrap()
            .push("LD_PRELOAD=/usr/lib/user.so".into());
        c["hooks"] = serde_json::json!({ "createRuntime": [hook] });
    });
    let id = format!("own-{}", std::process::id());
    assert_eq!(
        lines(&runc.run(&b, &id).output().unwrap()),
        "libshare.so\nown.so\nuser.so"
    );
    let merged = node.state_dir().join(format!("inject/{id}.preload"));
    assert_eq!(
        std::fs::read_to_string(&merged).unwrap(),
        "/usr/lib/libshare/libshare.so\n# the image's own\n/usr/lib/own.so\n\n"
    );
}

#[test]
fn musl_and_static_images_are_not_injected_and_every_program_runs() {
    let node = Node::start("8GiB", &[]);
    let dir = tempfile::tempdir().unwrap();
    let progs = no_glibc_image(dir.path());
    let Some(podman) = Podman::new(dir.path()) else {
        return;
    };
    let (_spec, kind) = node.cdi_spec("e");
    let device = format!("{kind}=all");
    for p in &progs {
        let p: Vec<&str> = p.iter().map(String::as_str).collect();
        let name = unique(&format!("musl{}", p.len()));
        let id = ok(&podman
            .cmd(&[
                "create",
                "--name",
                &name,
                "--network",
                "none",
                "--device",
                &device,
            ])
            .arg(&podman.image)
            .args(&p)
            .output()
            .unwrap())
        .trim()
        .to_string();
        let out = podman.cmd(&["start", "-a", &name]).output().unwrap();
        let _ = podman.cmd(&["rm", "-f", &name]).output();
        let text = lines(&out);
        assert!(text.ends_with(" ran"), "{p:?}: {text}");
        let log = hook_log(&node);
        let mine: Vec<&str> = log.lines().filter(|l| l.contains(&id)).collect();
        assert_eq!(mine.len(), 1, "one host line per container: {log}");
        assert!(mine[0].contains("not injected"), "{log}");
    }
    // Under runc's hook too (no CDI): nothing mounted, the program runs.
    if let Some(runc) = Runc::new() {
        let hook = hook_entry(&node.inject_args());
        let b = runc.bundle("musl", dir.path(), |c| {
            c["process"]["args"] = serde_json::json!(progs.last().unwrap());
            c["hooks"] = serde_json::json!({ "createRuntime": [hook] });
        });
        let out = runc.run(&b, &unique("musl")).output().unwrap();
        assert!(lines(&out).ends_with(" ran"));
        assert!(
            !b.join("rootfs/etc/ld.so.preload").exists(),
            "nothing created in the image"
        );
    }
}

#[test]
fn a_debian_11_image_runs_with_the_shipped_shim_injected() {
    let Some(runc) = Runc::new() else {
        return;
    };
    if !have("debootstrap") {
        return;
    }
    let node = Node::start("8GiB", &[]);
    let root = libshare_tests::debian::root("bullseye");
    let script = format!(
        "({}); /bin/ls / >/dev/null && echo LS; /usr/bin/env true && echo ENV",
        libshare_tests::containers::PROBE
    );
    let run = |name: &str, shim: &Path| {
        let mut args = node.inject_args();
        args[1] = shim.display().to_string();
        let hook = hook_entry(&args);
        let b = runc.bundle(name, &root, |c| {
            c["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
            c["hooks"] = serde_json::json!({ "createRuntime": [hook] });
        });
        runc.run(&b, &unique(name)).output().unwrap()
    };
    // glibc 2.31: the shipped shim (GLIBC_2.17 at most) loads and every program runs.
    let shipped = libshare_tests::target_dir().join("dist/libshare.so");
    assert_eq!(lines(&run("deb11", &shipped)), "INJECTED\nLS\nENV");
    // Negative control: the host build (GLIBC_2.34) would stop every dynamic program.
    let out = run(
        "deb11-host",
        &libshare_tests::artifacts().release_dir.join("libshare.so"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("LS"), "{text}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("GLIBC_2.3"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
