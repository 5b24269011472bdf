//! The resolution check: the shim answers `cuGetProcAddress` and `dlsym` as the driver does,
//! with its own hooks where it must hook.

use super::checks::{first, Ctx, Shim};
use super::report::Side;
use super::runner::Finished;
use super::Outcome;
use anyhow::bail;
use serde_json::{json, Value};
use std::collections::HashMap;

/// A `P` line of `gpu_probe procaddr`: (status, query result, symbol, in the shim).
type Query = (i64, i64, String, bool);
/// Every `P` line by (name, version asked, per-thread flag).
type Queries = HashMap<(String, i64, i64), Query>;
/// Every `E` line by symbol: (the driver has it, default lookup in the shim, on the driver's
/// handle in the shim).
type Exports = HashMap<String, (bool, bool, bool)>;

fn parse_procaddr(stdout: &str) -> (Queries, Exports) {
    let mut p = HashMap::new();
    let mut e = HashMap::new();
    for l in stdout.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            ["P", base, ver, pt, rc, st, sym, shim] => {
                let n = |s: &str| s.parse::<i64>().unwrap_or(-99);
                p.insert(
                    (base.to_string(), n(ver), n(pt)),
                    (n(rc), n(st), sym.to_string(), *shim == "1"),
                );
            }
            ["E", sym, found, default, handle] => {
                e.insert(
                    sym.to_string(),
                    (*found == "1", *default == "1", *handle == "1"),
                );
            }
            _ => {}
        }
    }
    (p, e)
}

/// What the shim must hook, whatever else it does: asked at CUDA 12.0 without flags.
const MUST_HOOK: [&str; 10] = [
    "cuGetProcAddress",
    "cuMemAlloc",
    "cuMemFree",
    "cuMemGetInfo",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemCreate",
    "cuArrayCreate",
    "cuDeviceTotalMem",
    "cuLaunchKernel",
];

/// Compares the driver's answers (`plain`) with the shim's: returns the problems and counts.
pub fn compare_resolution(plain: &str, shimmed: &str) -> (Vec<String>, Value) {
    let (pp, pe) = parse_procaddr(plain);
    let (sp, se) = parse_procaddr(shimmed);
    let mut problems = Vec::new();
    let (mut resolved, mut hooked, mut through, mut unnamed) = (0, 0, 0, 0);
    let mut mismatches = Vec::new();
    let mut keys: Vec<&(String, i64, i64)> = pp.keys().collect();
    keys.sort();
    for k in keys {
        let (rc, st, sym, _) = &pp[k];
        let Some((src, sst, ssym, sin)) = sp.get(k) else {
            mismatches.push(format!("{} {} {}: not asked under the shim", k.0, k.1, k.2));
            continue;
        };
        if (rc, st) != (src, sst) {
            mismatches.push(format!(
                "{}@{}{}: driver rc {rc} status {st}, shim rc {src} status {sst}",
                k.0,
                k.1,
                if k.2 == 1 { " per-thread" } else { "" }
            ));
            continue;
        }
        if *rc != 0 || sym == "NULL" {
            continue;
        }
        resolved += 1;
        if ssym == sym {
            if *sin {
                hooked += 1;
            } else {
                through += 1;
            }
        } else if *sin && !sym.starts_with(k.0.as_str()) {
            // The driver's pointer lies in no export of that name: nothing to compare with.
            unnamed += 1;
        } else {
            mismatches.push(format!(
                "{}@{}{}: driver {sym}, shim {ssym}{}",
                k.0,
                k.1,
                if k.2 == 1 { " per-thread" } else { "" },
                if *sin { " (hook)" } else { "" }
            ));
        }
    }
    if !mismatches.is_empty() {
        problems.push(format!(
            "{} answers differ from the driver's, e.g. {}",
            mismatches.len(),
            mismatches
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    // Exports: the shim's dlsym answers as the default lookup does; a name hooked by
    // cuGetProcAddress is hooked as an export too.
    let mut inconsistent = Vec::new();
    let mut exports_hooked = 0;
    for (sym, (found, _, _)) in &pe {
        if !found {
            continue;
        }
        let Some((_, d, h)) = se.get(sym) else {
            continue;
        };
        if d != h {
            inconsistent.push(format!(
                "{sym}: default lookup in shim {d}, driver handle in shim {h}"
            ));
        }
        exports_hooked += usize::from(*d);
    }
    for ((base, _, _), (rc, _, ssym, sin)) in &sp {
        if *rc == 0 && *sin && se.get(ssym).is_some_and(|(_, d, _)| !d) {
            inconsistent.push(format!(
                "{base}: hooked by cuGetProcAddress ({ssym}) but not as an export"
            ));
        }
    }
    inconsistent.sort();
    inconsistent.dedup();
    if !inconsistent.is_empty() {
        problems.push(format!(
            "{} exports inconsistent, e.g. {}",
            inconsistent.len(),
            inconsistent
                .iter()
                .take(5)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let missing: Vec<&str> = MUST_HOOK
        .iter()
        .copied()
        .filter(|b| {
            !sp.get(&(b.to_string(), 12000, 0))
                .is_some_and(|(rc, _, _, sin)| *rc == 0 && *sin)
        })
        .collect();
    if !missing.is_empty() {
        problems.push(format!("not hooked at CUDA 12.0: {}", missing.join(", ")));
    }
    let data = json!({
        "queries": pp.len(), "resolved": resolved, "hooked": hooked, "passed_through": through,
        "hook_driver_pointer_unnamed": unnamed, "exports_hooked": exports_hooked,
        "mismatches": mismatches.iter().take(50).collect::<Vec<_>>(),
        "inconsistent_exports": inconsistent.iter().take(50).collect::<Vec<_>>(),
    });
    (problems, data)
}

pub fn resolution(ctx: &mut Ctx) -> anyhow::Result<Outcome> {
    let list = ctx.bundle.api_list().display().to_string();
    let state = ctx.fresh("procaddr")?;
    let plain = ctx.probe(
        "resolution-plain",
        &["procaddr", &list],
        Side::Gpu,
        &state,
        None,
    )?;
    let shim = Shim {
        state: &state,
        container: "resolution",
        quota: "1GiB",
    };
    let shimmed = ctx.probe(
        "resolution-shim",
        &["procaddr", &list],
        Side::Gpu,
        &state,
        Some(&shim),
    )?;
    for (what, f) in [("without the shim", &plain), ("under the shim", &shimmed)] {
        if !f.ok() {
            bail!("gpu_probe procaddr {what}: {}", f.why());
        }
    }
    let self_in = |f: &Finished| first(&f.json(), "procaddr_self").map(|v| v["in_shim"] == 1);
    let (mut problems, mut data) = compare_resolution(&plain.stdout, &shimmed.stdout);
    if self_in(&shimmed) != Some(true) || self_in(&plain) != Some(false) {
        problems
            .push("cuGetProcAddress(\"cuGetProcAddress\") is not the shim's under the shim".into());
    }
    data["driver_version"] =
        first(&plain.json(), "procaddr_self").map_or(Value::Null, |v| v["driver_version"].clone());
    let passed = format!(
        "{} queries: {} resolved, {} to the shim's hook with the driver's symbol, {} passed through, {} hooks where the driver's pointer names no export; {} exports hooked",
        data["queries"], data["resolved"], data["hooked"], data["passed_through"],
        data["hook_driver_pointer_unnamed"], data["exports_hooked"]
    );
    Ok(Outcome::judged(problems, passed, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_compares_the_shim_with_the_driver() {
        let plain = "P cuMemAlloc 12000 0 0 0 cuMemAlloc_v2 0\n\
                     P cuMemAlloc 2000 0 0 0 cuMemAlloc 0\n\
                     P cuCtxGetDevice 12000 0 0 0 cuCtxGetDevice 0\n\
                     P cuNew 12000 0 500 3 NULL 0\n\
                     E cuMemAlloc_v2 1 0 0\nE cuCtxGetDevice 1 0 0\n";
        let good = "P cuMemAlloc 12000 0 0 0 cuMemAlloc_v2 1\n\
                    P cuMemAlloc 2000 0 0 0 cuMemAlloc 1\n\
                    P cuCtxGetDevice 12000 0 0 0 cuCtxGetDevice 0\n\
                    P cuNew 12000 0 500 3 NULL 0\n\
                    E cuMemAlloc_v2 1 1 1\nE cuCtxGetDevice 1 0 0\n";
        let (p, data) = compare_resolution(plain, good);
        // Only the must-hook list is missing from this small table.
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("not hooked at CUDA 12.0: cuGetProcAddress,"),
            "{p:?}"
        );
        assert!(!p[0].contains(" cuMemAlloc,"), "{p:?}");
        assert_eq!(
            (data["hooked"].as_u64(), data["passed_through"].as_u64()),
            (Some(2), Some(1))
        );
        // The shim answering with another version than the driver's, a status differing, and an
        // export hooked on one lookup only.
        let bad = "P cuMemAlloc 12000 0 0 0 cuMemAlloc 1\n\
                   P cuMemAlloc 2000 0 0 0 cuMemAlloc 1\n\
                   P cuCtxGetDevice 12000 0 0 0 cuCtxGetDevice 0\n\
                   P cuNew 12000 0 0 0 cuNew 1\n\
                   E cuMemAlloc_v2 1 1 0\nE cuCtxGetDevice 1 0 0\n";
        let (p, data) = compare_resolution(plain, bad);
        let all = p.join(" ");
        assert!(all.contains("2 answers differ"), "{all}");
        assert!(
            all.contains("cuMemAlloc@12000: driver cuMemAlloc_v2, shim cuMemAlloc (hook)"),
            "{all}"
        );
        assert!(
            all.contains("cuNew@12000: driver rc 500 status 3, shim rc 0 status 0"),
            "{all}"
        );
        assert!(
            all.contains("cuMemAlloc_v2: default lookup in shim true, driver handle in shim false"),
            "{all}"
        );
        assert_eq!(data["mismatches"].as_array().unwrap().len(), 2);
    }
}
