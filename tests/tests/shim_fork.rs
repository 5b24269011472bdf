//! Issue 3, must-show 6: `fork` after CUDA initialisation (`shim_driver fork`, 1 GiB quota on an
//! 8 GiB device). The parent initialises CUDA and allocates 100 MiB, then forks. In the child the
//! parent's context does not work (the first allocation fails and is not charged); after its own
//! `cuInit` the child allocates 300 MiB, which is charged to the child's own slot of the same
//! container (it sees 400 MiB used), cannot free the parent's allocation, and `_exit`s. The
//! parent's accounting is untouched: its slot still holds exactly its 100 MiB, and once the dead
//! child's memory is reclaimed it sees only its own 100 MiB charged.

use libshare_tests::{compile_gcc, describe, SimGpu};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Acquire;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

#[test]
fn shim_fork_after_cuinit_charges_the_child_and_keeps_the_parent_intact() {
    let bin = compile_gcc("shim_driver.c", "shim_driver", &[]);
    let gpu = SimGpu::new().memory("8GiB").with_shim().quota("1GiB");
    let mut parent = gpu.spawn({
        let mut cmd = gpu.command(&bin);
        cmd.arg("fork");
        cmd
    });
    parent.wait_for_line("child_exited");
    let f: HashMap<String, String> = parent
        .lines
        .iter()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let ctx = parent.lines.join("\n");
    assert_eq!(f["total"], GIB.to_string(), "{ctx}");
    assert_eq!(
        f["parent_free_after_100"],
        (GIB - 100 * MIB).to_string(),
        "{ctx}"
    );
    // The child: the parent's context is not usable, and that failed call charged nothing.
    assert_ne!(f["child_first_alloc_rc"], "0", "{ctx}");
    assert_eq!(f["child_init_rc"], "0", "{ctx}");
    assert_eq!(
        f["child_free_start"],
        (GIB - 100 * MIB).to_string(),
        "child sees only the parent's 100 MiB before allocating\n{ctx}"
    );
    assert_ne!(
        f["child_free_parent_rc"], "0",
        "the child freed the parent's allocation\n{ctx}"
    );
    assert_eq!(f["child_alloc_300_rc"], "0", "{ctx}");
    assert_eq!(
        f["child_free_after_300"],
        (GIB - 400 * MIB).to_string(),
        "child's 300 MiB charged on top of the parent's 100\n{ctx}"
    );
    assert_eq!(f["child_status"], "0", "{ctx}");

    // While the parent waits: each process is charged in its own slot.
    let parent_pid: u32 = f["parent_pid"].parse().unwrap();
    let child_pid: u32 = f["child_pid"].parse().unwrap();
    assert_eq!(parent_pid, parent.pid());
    let st = gpu.container_state("default");
    let slot_of = |pid: u32| {
        (0..libshare_abi::MAX_PROCS)
            .find(|&i| st.slot(i).pid.load(Acquire) == pid)
            .unwrap_or_else(|| panic!("no slot for pid {pid}"))
    };
    let p = st.slot(slot_of(parent_pid));
    assert_eq!(p.net(0), 100 * MIB, "parent's slot");
    assert_eq!(p.allocs[0].load(Acquire), 1, "parent's slot");
    // The child _exit()ed (no atexit): its slot keeps its charge until it is reclaimed.
    let c = st.slot(slot_of(child_pid));
    assert_eq!(c.net(0), 300 * MIB, "child's slot");
    assert_eq!(c.allocs[0].load(Acquire), 1, "child's slot");
    assert_eq!(st.device(0).used.load(Acquire), 400 * MIB);

    // Let the parent go on: 900 MiB fits once the dead child's 300 MiB are reclaimed, and then
    // the parent is charged exactly its own 100 MiB.
    let out = parent.finish();
    assert!(out.status.success(), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let g: HashMap<&str, &str> = stdout.lines().filter_map(|l| l.split_once('=')).collect();
    let ctx = describe(&out);
    assert_eq!(g["parent_alloc_900_rc"], "0", "{ctx}");
    assert_eq!(
        g["parent_free_with_1000"],
        (GIB - 1000 * MIB).to_string(),
        "{ctx}"
    );
    assert_eq!(
        g["parent_free_with_100"],
        (GIB - 100 * MIB).to_string(),
        "{ctx}"
    );
    assert_eq!(g["parent_free_end"], GIB.to_string(), "{ctx}");
    assert!(stdout.lines().any(|l| l == "OK"), "{ctx}");
    assert_eq!(st.device(0).used.load(Acquire), 0);
    assert!(st.device(0).peak.load(Acquire) <= GIB);
}
