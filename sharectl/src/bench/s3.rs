//! S3, latency: production inference beside a saturating opportunistic job of kernels, memsets
//! or device-to-device copies.

use super::exec::JobSpec;
use super::latency::{latency_row, solo_latency, Solo};
use super::{for_policies, production_infer, run_policy, saturate, Ctx, Output, Policy, S3Op};

/// S3's simulated device memory bandwidth (`SIMGPU_HBM_BW`, unless set): 2 GB/s instead of an
/// A100's 1.5 TB/s. simgpu's device memory is host memory, so a memset or device-to-device copy
/// really moves its bytes on the host's CPU while it is priced at this bandwidth; at 1.5 TB/s a
/// 1 ms memset would write 1.5 GB (~0.2 s of one host core). At 2 GB/s the memset part's 2 MiB
/// memset and the copy part's 1 MiB copy (read + write: half the bandwidth) are ~1 ms of GPU
/// time each, as a 1.5 GB memset or a 750 MB copy on an A100, and move their bytes on the host
/// in < 0.1 ms. What is assumed: the gate sees only an operation's duration and its events, never
/// its bytes once timed, so a 1 ms memset of 2 MiB stands for a 1 ms memset of 1.5 GB. (The
/// shim prices a memset or copy it has not timed yet at the device's memory clock × bus width,
/// which simgpu reports for the configured bandwidth.) Production (kernels with explicit durations and host↔device copies) does not depend on it.
const S3_HBM_BW: &str = "2GB/s";
/// S3's memset part: bytes per `cuMemsetD8Async` (~1 ms at [`S3_HBM_BW`]).
const S3_MEMSET_BYTES: &str = "2MiB";
/// S3's copy part: bytes per `cuMemcpyDtoDAsync` (~1 ms at [`S3_HBM_BW`] / 2).
const S3_COPY_BYTES: &str = "1MiB";

/// The environment S3's jobs add: simgpu's device memory bandwidth.
pub(super) fn s3_env() -> Vec<(String, std::ffi::OsString)> {
    let bw = std::env::var_os("SIMGPU_HBM_BW").unwrap_or_else(|| S3_HBM_BW.into());
    vec![("SIMGPU_HBM_BW".into(), bw)]
}

/// S3's opportunistic job, started 1 s late at depth 4: 0.5 ms kernels, or memsets or
/// device-to-device copies of ~1 ms each.
fn s3_opportunistic(op: S3Op, secs: f64) -> JobSpec {
    let mut j = saturate("opp", 4, secs, 1.0);
    let (name, bytes) = match op {
        S3Op::Kernel => return j,
        S3Op::Memset => ("memset", S3_MEMSET_BYTES),
        S3Op::Copy => ("copy", S3_COPY_BYTES),
    };
    j.args
        .extend(["--op", name, "--bytes", bytes].map(String::from));
    j
}

/// S3's production inference: 20 requests/s of 5 ms of GPU time in 2 kernels.
pub(super) const S3_INFER: &[&str] = &["--rate", "20", "--gpu-ms", "5", "--kernels", "2"];

/// S3, latency: production inference at 20 req/s (5 ms of GPU each) for 2 D + a saturating
/// opportunistic job started 1 s later, one part per `--ops` entry: 0.5 ms kernels (no `op`
/// figure), memsets or device-to-device copies (`op`: `memset`, `copy`; see [`S3_HBM_BW`]).
/// Every part is compared with the same solo run; the harvest counts the opportunistic job's
/// `gpu_ms` (its memsets and copies timed by their events).
pub(super) fn s3(ctx: &Ctx<'_>, out: &mut Output, ops: &[S3Op]) -> anyhow::Result<()> {
    // Twice as long as the others: at 20 requests/s a p99 needs a few hundred requests.
    let d = 2.0 * ctx.d;
    let infer = production_infer(S3_INFER, d);
    let Solo {
        rec: solo,
        p99: solo_p99,
        rate: solo_rate,
        ..
    } = solo_latency(ctx, "S3", &infer, 1.0)?;
    for (i, &op) in ops.iter().enumerate() {
        // One solo row for all parts.
        let policies: Vec<Policy> = ctx
            .policies
            .iter()
            .copied()
            .filter(|&p| i == 0 || p != Policy::Exclusive)
            .collect();
        let sub = Ctx {
            policies: &policies,
            ..*ctx
        };
        let jobs = vec![infer.clone(), s3_opportunistic(op, d)];
        let part = match op {
            S3Op::Kernel => "",
            S3Op::Memset => "memset",
            S3Op::Copy => "copy",
        };
        for_policies(&sub, out, "S3", |p| {
            let rec = if p == Policy::Exclusive {
                solo.clone()
            } else {
                run_policy(ctx, p, &jobs, &[], false)?
            };
            let op = (p != Policy::Exclusive && !part.is_empty()).then(|| ("op", part.into()));
            let m = latency_row("S3", p, &rec, (solo_rate, solo_p99), op.into_iter())?;
            let part = if p == Policy::Exclusive { "" } else { part };
            Ok((m, vec![(part.to_string(), rec)]))
        });
    }
    Ok(())
}
