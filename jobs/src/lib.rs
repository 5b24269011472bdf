//! Ordinary CUDA driver-API programs used as "unmodified jobs" by `sharectl demo` and the benchmarks.
//!
//! Nothing here knows about libshare: the binaries (`simjob-train`, `simjob-infer`,
//! `simjob-saturate`) load `libcuda.so.1` like any CUDA program, so they run on a real GPU, on
//! simgpu, and later under the libshare shim without changes.
//!
//! Every binary prints one JSON object per line on stdout: a `"event": "start"` line, periodic
//! `"event": "progress"` lines, and a final summary with `"event": "final", "final": true`.
//! Every line carries `"job"` and `"t"` (seconds since the job's start, after CUDA setup).
//! Errors go to stderr as one line, with a non-zero exit code.
//!
//! [`profiles`] (the named argument sets the demo, benchmarks and tests run) builds without the
//! default `driver` feature; everything else is the programs' and needs it.

#[cfg(feature = "driver")]
pub mod cli;
#[cfg(feature = "driver")]
pub mod gpu;
pub mod profiles;
#[cfg(feature = "driver")]
pub mod report;
#[cfg(feature = "driver")]
pub mod run;
#[cfg(feature = "driver")]
pub mod stats;

/// The PTX module with the `simgpu_spin(.param .u64 ns)` kernel (see `spin.ptx`).
#[cfg(feature = "driver")]
pub const SPIN_PTX: &str = include_str!("spin.ptx");

/// Name of the kernel entry in [`SPIN_PTX`].
#[cfg(feature = "driver")]
pub const SPIN_KERNEL: &str = "simgpu_spin";

/// Name of the kernel entry that also touches a buffer (its working set).
#[cfg(feature = "driver")]
pub const SPIN_TOUCH_KERNEL: &str = "simgpu_spin_touch";

/// Name of the kernel entry whose every block spins (its time is its waves of blocks).
#[cfg(feature = "driver")]
pub const BLOCK_SPIN_KERNEL: &str = "block_spin";

/// Threads per block of [`BLOCK_SPIN_KERNEL`], and the blocks of that size one SM keeps resident
/// (2048 threads per SM on A100 and H100; simgpu's `blocks_per_sm`).
#[cfg(feature = "driver")]
pub const BLOCK_SPIN_THREADS: u32 = 256;
#[cfg(feature = "driver")]
pub const BLOCK_SPIN_PER_SM: u32 = 8;
