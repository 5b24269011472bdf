//! Checks on the embedded PTX module.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn spin_ptx_declares_the_kernel_simgpu_expects() {
    let ptx = jobs::SPIN_PTX;
    assert!(ptx.contains(".visible .entry simgpu_spin("));
    assert!(ptx.contains(".param .u64"));
    assert!(ptx.contains("%globaltimer"));
    assert!(!ptx.contains('\0'));
}

/// The pinned ptxas (scripts/fetch-cuda.sh) or $PTXAS, if present.
fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    let p = PathBuf::from(home).join(".cache/libshare/cu13/nvidia/cu13/bin/ptxas");
    p.exists().then_some(p)
}

#[test]
fn spin_ptx_assembles_with_ptxas() {
    let Some(ptxas) = ptxas() else {
        eprintln!("skipped: no ptxas (set PTXAS or run scripts/fetch-cuda.sh)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("jobs-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("spin.ptx");
    std::fs::write(&src, jobs::SPIN_PTX).unwrap();
    let out = Command::new(&ptxas)
        .args(["-arch=sm_80", "-o"])
        .arg(dir.join("spin.cubin"))
        .arg(&src)
        .output()
        .expect("run ptxas");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "ptxas rejected spin.ptx: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
