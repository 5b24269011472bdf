//! libshare on Kubernetes: the device plugin (the kubelet's device-plugin API `v1beta1` over gRPC on
//! unix sockets): GPUs advertised as memory shares (`shares.rs`), allocations recorded on the
//! host for the runtime's hook to bind to the container (`allocation.rs`), the plugin's server
//! and its life with the kubelet (`plugin.rs`), run by `sharectl device-plugin`; and the DRA kubelet
//! plugin, driver `gpu.libshare.dev` (`dra/`), run by `sharectl dra-plugin`.

/// The API, generated at build time from the vendored `proto/api.proto` (protox, no protoc).
#[allow(clippy::all, missing_docs)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

pub mod allocation;
pub mod dra;
pub mod plugin;
pub mod shares;
