//! The jobs' named profiles, as data: what the demo, the benchmarks and the tests run.
//!
//! This module has no dependency (it builds without the `driver` feature), so `sharectl`,
//! `benches` and `tests` use it through `jobs = { path, default-features = false }` without
//! pulling in cudarc. A site that differs on purpose says so as an override
//! (`TRAIN.with_mem_mib(512)`), not as a copy.

/// A `simjob-train` profile: per iteration, `kernels` kernels totalling `gpu_ms` of GPU time,
/// then `cpu_ms` on the host; `mem_mib` MiB of device memory allocated up front.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Train {
    pub gpu_ms: f64,
    pub kernels: u32,
    pub cpu_ms: f64,
    pub mem_mib: u64,
}

/// The training-like production job (~60 % of the GPU): 6 ms of GPU in 4 kernels, 4 ms on the
/// host, 256 MiB. It is also `simjob-train`'s defaults (checked by the binary's tests).
pub const TRAIN: Train = Train {
    gpu_ms: 6.0,
    kernels: 4,
    cpu_ms: 4.0,
    mem_mib: 256,
};

impl Train {
    /// The binary that runs a [`Train`] profile.
    pub const BIN: &'static str = "simjob-train";

    /// The same profile with `mib` MiB of device memory.
    pub const fn with_mem_mib(self, mib: u64) -> Train {
        Train {
            mem_mib: mib,
            ..self
        }
    }

    /// The iteration's arguments: `--gpu-ms G --kernels K --cpu-ms C` (no `--mem`: the job's
    /// default, or a `--mem` the caller adds).
    pub fn loop_args(&self) -> Vec<String> {
        vec![
            "--gpu-ms".into(),
            self.gpu_ms.to_string(),
            "--kernels".into(),
            self.kernels.to_string(),
            "--cpu-ms".into(),
            self.cpu_ms.to_string(),
        ]
    }

    /// The whole profile as arguments: [`Train::loop_args`] then `--mem <N>MiB`.
    pub fn args(&self) -> Vec<String> {
        let mut a = self.loop_args();
        a.extend(["--mem".into(), format!("{}MiB", self.mem_mib)]);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The argv each site wrote by hand before this module (bench S1/S2/S8, benches'
    /// `train_colocation`, the demo's production job, S4 and the daemon/gate tests).
    #[test]
    fn rendered_argv_is_what_the_sites_ran() {
        let line = |a: Vec<String>| a.join(" ");
        assert_eq!(
            line(TRAIN.args()),
            "--gpu-ms 6 --kernels 4 --cpu-ms 4 --mem 256MiB"
        );
        assert_eq!(line(TRAIN.loop_args()), "--gpu-ms 6 --kernels 4 --cpu-ms 4");
        assert_eq!(
            line(TRAIN.with_mem_mib(512).args()),
            "--gpu-ms 6 --kernels 4 --cpu-ms 4 --mem 512MiB"
        );
        let light = Train {
            gpu_ms: 0.5,
            kernels: 1,
            cpu_ms: 0.0,
            mem_mib: 64,
        };
        assert_eq!(
            line(light.args()),
            "--gpu-ms 0.5 --kernels 1 --cpu-ms 0 --mem 64MiB"
        );
    }
}
