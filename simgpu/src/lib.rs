//! simgpu — a simulated GPU. Built as `libcuda.so.1` (and symlinked as `libnvidia-ml.so.1`),
//! it implements enough of the CUDA driver API (and its undocumented export tables) that NVIDIA's
//! own cudart, cuBLAS and PyTorch run on it unmodified. Memory is real host memory (copies move real
//! bytes); kernels do not compute but occupy a device timeline shared by every process that uses the
//! same state directory, so processes contend as on a real GPU. See `simgpu/README.md`.
//!
//! Layout, on floors (ARCHITECTURE.md; `tests/layers.rs` checks them): `driver/` holds the
//! exported driver functions, one module per API group (with `driver/export_tables.rs`, the
//! undocumented interfaces cudart needs), and `nvml/` the NVML subset; `sim` is the process's
//! simulator; `model/` the objects it holds (memory, modules, graphs and capture) and `engine`
//! executes stream work against the modelled clock; `shared` is the cross-process state file and
//! `config/` the settings; `image` (the `cuda-image` crate) parses fatbins/cubins/PTX.

#![allow(non_snake_case)]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod cglimits;
pub mod config;
pub mod driver;
pub mod engine;
/// The image parser is its own crate (the slicer's tools read images too).
pub use cuda_image as image;
pub mod integrity;
pub mod log;
pub mod model;
pub mod nvml;
pub mod sched;
pub mod shared;
pub mod sim;
pub mod stub;
pub mod types;

pub mod table {
    include!(concat!(env!("OUT_DIR"), "/driver_table.rs"));
}
