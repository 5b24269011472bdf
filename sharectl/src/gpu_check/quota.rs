//! The quota checks: every allocation path and kind charged against a quota and refused over it,
//! the memory views under it, and a killed process's memory returned.

use super::checks::{
    facts, first, Ctx, Shim, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, GIB, MIB,
};
use super::report::Side;
use super::runner::{self, Finished};
use super::Outcome;
use anyhow::{bail, Context};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering::Acquire;
use std::time::Duration;

/// What `shim_driver quota PATH` must print under a 1 GiB quota (as `shim_resolution` asserts).
pub fn judge_quota_path(path: &str, f: &HashMap<String, String>) -> Vec<String> {
    let want = [
        ("path", path.to_string()),
        ("total", GIB.to_string()),
        ("free_start", GIB.to_string()),
        ("alloc_600_rc", "0".into()),
        ("free_after_600", (GIB - 600 * MIB).to_string()),
        ("alloc_600_again_rc", CUDA_ERROR_OUT_OF_MEMORY.to_string()),
        ("alloc_300_rc", "0".into()),
        ("free_after_900", (GIB - 900 * MIB).to_string()),
        ("free_end", GIB.to_string()),
    ];
    let mut problems: Vec<String> = want
        .iter()
        .filter(|(k, v)| f.get(*k) != Some(v))
        .map(|(k, v)| {
            format!(
                "{path}: {k}={} (expected {v})",
                f.get(*k).map_or("missing", |s| s.as_str())
            )
        })
        .collect();
    let in_shim = match path {
        "dlsym" => Some("alloc_in_shim"),
        "gpa" | "gpa_v2" | "gpa_v2_ptds" => Some("gpa_self_in_shim"),
        _ => None,
    };
    if let Some(k) = in_shim {
        if f.get(k).map(String::as_str) != Some("1") {
            problems.push(format!("{path}: {k} is not 1"));
        }
    }
    problems
}

pub fn quota_paths(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let mut problems = Vec::new();
    let mut data = serde_json::Map::new();
    for path in ["export", "dlsym", "gpa", "gpa_v2", "gpa_v2_ptds"] {
        let bin = if path == "export" {
            "shim_driver_linked"
        } else {
            "shim_driver"
        };
        let state = ctx.fresh("quota-path")?;
        let shim = Shim {
            state: &state,
            container: "paths",
            quota: "1GiB",
        };
        let f = ctx.run(
            &format!("quota_paths-{path}"),
            &ctx.bundle.bin(bin),
            &["quota", path],
            Side::Gpu,
            &state,
            Some(&shim),
        )?;
        let facts = facts(&f.stdout);
        if !f.ok() || !f.stdout.lines().any(|l| l == "OK") {
            problems.push(format!("{path}: {}", f.why()));
        } else {
            problems.extend(judge_quota_path(path, &facts));
        }
        data.insert(path.into(), json!(facts));
    }
    Ok(Outcome::judged(
        problems,
        "exports, dlsym, cuGetProcAddress v1, v2 and v2 per-thread: 600 MiB granted, the next 600 MiB refused (CUDA_ERROR_OUT_OF_MEMORY), free memory as the quota says",
        Value::Object(data),
    ))
}

/// One `gpu_probe kinds` line under the shim (with `control`, the same kind without it).
pub fn judge_kind(
    v: &Value,
    control: Option<&Value>,
    quota: u64,
) -> Result<Option<String>, String> {
    let kind = v["kind"].as_str().unwrap_or("?");
    let n = |k: &str| v[k].as_i64().unwrap_or(-1);
    let u = |k: &str| v[k].as_u64().unwrap_or(0);
    if n("first_rc") == CUDA_ERROR_NOT_SUPPORTED {
        return Ok(Some(format!("{kind}: not supported by this driver")));
    }
    let first = u("first_mib") * MIB;
    let mut p = Vec::new();
    if n("first_rc") != 0 {
        p.push(format!(
            "the first {} MiB failed ({})",
            u("first_mib"),
            n("first_rc")
        ));
    }
    if kind == "host" {
        if n("second_rc") != 0 || u("free_after_second") != quota {
            p.push("pinned host memory was charged".into());
        }
    } else {
        let used = quota.saturating_sub(u("free_after_first"));
        // Charged what it asked, give or take the driver's rounding to 2 MiB pages.
        if used < first || used > first + 8 * MIB {
            p.push(format!(
                "{} MiB charged for {} MiB",
                used / MIB,
                first / MIB
            ));
        }
        if n("second_rc") != CUDA_ERROR_OUT_OF_MEMORY {
            p.push(format!(
                "past the quota: {} (expected CUDA_ERROR_OUT_OF_MEMORY)",
                n("second_rc")
            ));
        }
        if let Some(c) = control {
            if c["second_rc"].as_i64() != Some(0) {
                p.push(format!(
                    "without the shim the driver refused it too ({})",
                    c["second_rc"]
                ));
            }
        }
    }
    if n("free_rc") != 0 || u("free_end") != quota {
        p.push(format!(
            "after the frees {} MiB free of {} (rc {})",
            u("free_end") / MIB,
            quota / MIB,
            n("free_rc")
        ));
    }
    if p.is_empty() {
        Ok(None)
    } else {
        Err(format!("{kind}: {}", p.join(", ")))
    }
}

pub fn quota_kinds(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let state = ctx.fresh("kinds")?;
    let shim = Shim {
        state: &state,
        container: "kinds",
        quota: "256MiB",
    };
    let f = ctx.probe(
        "quota_kinds-shim",
        &["kinds", "256"],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    let control_state = ctx.fresh("kinds-control")?;
    let c = ctx.probe(
        "quota_kinds-plain",
        &["kinds", "256"],
        Side::Gpu,
        &control_state,
        None,
    )?;
    if !f.ok() {
        bail!("gpu_probe kinds under the shim: {}", f.why());
    }
    let (lines, control) = (f.json(), c.json());
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    for v in lines.iter().filter(|v| v["check"] == "kind") {
        let ctl = control
            .iter()
            .find(|c| c["check"] == "kind" && c["kind"] == v["kind"]);
        match judge_kind(v, ctl, 256 * MIB) {
            Ok(Some(note)) => notes.push(note),
            Ok(None) => {}
            Err(e) => problems.push(e),
        }
    }
    if lines.iter().filter(|v| v["check"] == "kind").count() < 7 {
        problems.push(format!("{} kinds reported of 7", lines.len()));
    }
    let passed = if notes.is_empty() {
        "all 7 kinds: charged, refused past 256 MiB, returned; pinned host memory not charged"
            .to_string()
    } else {
        format!(
            "the others charged, refused past 256 MiB, returned; {}",
            notes.join("; ")
        )
    };
    Ok(Outcome::judged(
        problems,
        passed,
        json!({"shim": lines, "control": control}),
    ))
}

pub fn views(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let state = ctx.fresh("views")?;
    let shim = Shim {
        state: &state,
        container: "views",
        quota: "1GiB",
    };
    let f = ctx.probe(
        "views-shim",
        &["views", "100"],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    let plain = ctx.probe("views-plain", &["views", "100"], Side::Gpu, &state, None)?;
    let lines = f.json();
    let Some(v) = first(&lines, "views").filter(|_| f.ok()) else {
        bail!("gpu_probe views: {}", f.why());
    };
    let u = |k: &str| v[k].as_u64();
    let mut p = Vec::new();
    if v["nvml_rc"] != 0 {
        p.push(format!("NVML's memory query failed ({})", v["nvml_rc"]));
    }
    if u("cuda_total") != Some(GIB) || u("nvml_total") != Some(GIB) {
        p.push(format!(
            "totals: CUDA {:?}, NVML {:?}, quota {GIB}",
            u("cuda_total"),
            u("nvml_total")
        ));
    }
    if u("cuda_free") != u("nvml_free") {
        p.push(format!(
            "free: CUDA {:?}, NVML {:?}",
            u("cuda_free"),
            u("nvml_free")
        ));
    }
    if u("nvml_used") != Some(100 * MIB) {
        p.push(format!("NVML used {:?} for 100 MiB held", u("nvml_used")));
    }
    Ok(Outcome::judged(
        p,
        "CUDA and NVML both report the 1 GiB quota, the same free memory, and the 100 MiB held as used",
        json!({"shim": v, "plain": first(&plain.json(), "views")}),
    ))
}

pub fn kill9(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let state = ctx.fresh("kill9")?;
    let shim = Shim {
        state: &state,
        container: "victim",
        quota: "1GiB",
    };
    let before = ctx.probe(
        "kill9-nvml-before",
        &["views", "1"],
        Side::Gpu,
        &state,
        None,
    )?;
    let mut cmd = ctx.command(&ctx.bundle.bin("hold_memory"), Side::Gpu, &state);
    cmd.args(["hold", "300"]);
    ctx.shim(&mut cmd, &shim);
    let mut job = runner::spawn(cmd)?;
    job.wait_line(ctx.limit(30), |l| l.contains("\"held\""))
        .context("hold_memory hold 300 under the shim")?;
    let file = state
        .join("libshare/containers/victim")
        .join(libshare_abi::STATE_FILE);
    let held = libshare_abi::State::open_existing(&file)
        .map(|s| s.device(0).used.load(Acquire))
        .with_context(|| format!("the container's state {}", file.display()))?;
    let holding = ctx.probe(
        "kill9-nvml-holding",
        &["views", "1"],
        Side::Gpu,
        &state,
        None,
    )?;
    job.kill_group();
    let done = job.finish(Duration::from_secs(10));
    ctx.log("kill9-job", &done);
    let plain_after = ctx.probe("kill9-nvml-after", &["views", "1"], Side::Gpu, &state, None)?;
    let next = ctx.probe(
        "kill9-next",
        &["views", "100"],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    let nvml_used = |f: &Finished| first(&f.json(), "views").and_then(|v| v["nvml_used"].as_u64());
    let next_v = first(&next.json(), "views").cloned().unwrap_or(Value::Null);
    let mut p = Vec::new();
    if held != 300 * MIB {
        p.push(format!("the container held {} MiB, not 300", held / MIB));
    }
    if next_v["cuda_free"].as_u64() != Some(GIB - 100 * MIB) {
        p.push(format!(
            "the container's next process saw {:?} free, not 924 MiB: the killed job's 300 MiB did not come back",
            next_v["cuda_free"].as_u64().map(|b| b / MIB)
        ));
    }
    let mib = |v: Option<u64>| v.map_or("?".to_string(), |b| (b / MIB).to_string());
    let detail = format!(
        "300 MiB charged while held, back in the quota for the container's next process; the device's used memory (NVML, no shim): {} MiB before, {} holding, {} after the kill",
        mib(nvml_used(&before)),
        mib(nvml_used(&holding)),
        mib(nvml_used(&plain_after)),
    );
    Ok(Outcome::judged(
        p,
        detail,
        json!({"held_bytes": held, "next": next_v,
               "nvml_used": [nvml_used(&before), nvml_used(&holding), nvml_used(&plain_after)]}),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_path_facts_are_judged_as_shim_resolution_does() {
        let good: HashMap<String, String> = [
            ("path", "gpa".to_string()),
            ("total", GIB.to_string()),
            ("free_start", GIB.to_string()),
            ("alloc_600_rc", "0".into()),
            ("free_after_600", (GIB - 600 * MIB).to_string()),
            ("alloc_600_again_rc", "2".into()),
            ("alloc_300_rc", "0".into()),
            ("free_after_900", (GIB - 900 * MIB).to_string()),
            ("free_end", GIB.to_string()),
            ("gpa_self_in_shim", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert!(judge_quota_path("gpa", &good).is_empty());
        let mut bad = good.clone();
        bad.insert("alloc_600_again_rc".into(), "0".into());
        bad.insert("gpa_self_in_shim".into(), "0".into());
        let p = judge_quota_path("gpa", &bad);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("alloc_600_again_rc=0 (expected 2)"));
    }

    #[test]
    fn kinds_are_charged_refused_and_returned() {
        let q = 256 * MIB;
        let line = |kind: &str, first_rc: i64, after_first: u64, second_rc: i64, end: u64| {
            json!({"kind": kind, "first_mib": 192, "second_mib": 128, "first_rc": first_rc,
                   "free_after_first": after_first, "second_rc": second_rc,
                   "free_after_second": after_first, "free_rc": 0, "free_end": end})
        };
        let control = json!({"second_rc": 0});
        assert_eq!(
            judge_kind(&line("vmm", 0, q - 192 * MIB, 2, q), Some(&control), q),
            Ok(None)
        );
        assert!(judge_kind(&line("vmm", 801, 0, 0, q), None, q)
            .unwrap()
            .unwrap()
            .contains("not supported"));
        // Not charged, or not refused, or not returned: each named.
        let e = judge_kind(&line("array", 0, q, 0, q - MIB), Some(&control), q).unwrap_err();
        assert!(
            e.contains("0 MiB charged for 192 MiB")
                && e.contains("past the quota: 0")
                && e.contains("255 MiB free"),
            "{e}"
        );
        // Pinned host memory is not device memory.
        assert_eq!(judge_kind(&line("host", 0, q, 0, q), None, q), Ok(None));
        assert!(judge_kind(&line("host", 0, q - 192 * MIB, 2, q), None, q).is_err());
    }
}
