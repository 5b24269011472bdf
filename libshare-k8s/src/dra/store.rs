//! Prepared claims on the host: `<state dir>/k8s/dra/<claim uid>.json`, written before
//! `NodePrepareResources` answers and removed when `NodeUnprepareResources` is done, with the
//! state files' checks (`libshare_abi::fsafe`: a directory only root may write, no link followed,
//! replaced atomically). So a plugin restarted between the two still knows what it prepared, and
//! the runtime's hook (`sharectl hook --cdi --claim UID`) reads the quota and class from here,
//! never from the container.

use super::claim::Prepared;
use libshare_abi::fsafe;
use std::path::{Path, PathBuf};

/// Where prepared claims are kept.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("k8s").join("dra")
}

/// A claim uid as the API server makes them (a UUID); anything else is refused before it
/// becomes a path.
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 64
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn path(state_dir: &Path, uid: &str) -> Result<PathBuf, String> {
    if !valid_uid(uid) {
        return Err(format!(
            "{uid:?} is not a ResourceClaim uid (letters, digits and '-', at most 64)"
        ));
    }
    Ok(dir(state_dir).join(format!("{uid}.json")))
}

/// Records `p` (root's, 0600).
pub fn write(state_dir: &Path, p: &Prepared) -> Result<(), String> {
    let path = path(state_dir, &p.uid)?;
    let bytes = serde_json::to_vec_pretty(p).expect("a prepared claim serialises");
    fsafe::write_atomic(&path, &bytes, 0o600).map_err(|e| e.to_string())
}

/// The prepared claim `uid`, `None` if this node has not prepared it.
pub fn read(state_dir: &Path, uid: &str) -> Result<Option<Prepared>, String> {
    let path = path(state_dir, uid)?;
    let Some(bytes) = fsafe::read_checked(&path, 1 << 20).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let p: Prepared = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is malformed ({e})", path.display()))?;
    if p.uid != uid {
        return Err(format!("{} names claim {}", path.display(), p.uid));
    }
    Ok(Some(p))
}

/// Forgets claim `uid` (already gone: fine).
pub fn remove(state_dir: &Path, uid: &str) -> Result<(), String> {
    let path = path(state_dir, uid)?;
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("cannot remove {}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libshare_abi::admin::Class;

    #[test]
    fn records_round_trip_and_bad_uids_never_become_paths() {
        let d = tempfile::tempdir().unwrap();
        let p = Prepared {
            uid: "6b0d6a70-3c9e".into(),
            namespace: "ns".into(),
            name: "c".into(),
            devices: Vec::new(),
            quota: [(0, 1 << 30)].into(),
            class: Class::Opportunistic,
            compute: Some(3000),
            oversubscribe: false,
            cdi_device: "k/claim=6b0d6a70-3c9e".into(),
        };
        assert_eq!(read(d.path(), &p.uid).unwrap(), None);
        write(d.path(), &p).unwrap();
        assert_eq!(read(d.path(), &p.uid).unwrap(), Some(p.clone()));
        remove(d.path(), &p.uid).unwrap();
        remove(d.path(), &p.uid).unwrap();
        assert_eq!(read(d.path(), &p.uid).unwrap(), None);
        for bad in ["", "../x", "a/b", "a.json", &"a".repeat(65)] {
            assert!(read(d.path(), bad)
                .unwrap_err()
                .contains("not a ResourceClaim uid"));
        }
    }
}
