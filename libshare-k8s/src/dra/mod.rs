//! libshare's DRA kubelet plugin, driver `gpu.libshare.dev` (`sharectl dra-plugin`): the GPUs as
//! shareable devices with consumable memory and compute (`slice.rs`, published as a
//! ResourceSlice), a claim's allocation turned into a quota and a class (`claim.rs`, pure),
//! prepared claims kept on the host (`store.rs`), and the plugin's life with the kubelet and the
//! API server (`plugin.rs`). What is enforced: the memory the scheduler allocated to a claim on a
//! GPU becomes the quota of every container using the claim (the shim and the driver caps hold
//! it), and the class is the DeviceClass's, which the cluster admin governs.

/// The driver's name (ResourceSlices, claims' results, the kubelet registration).
pub const DRIVER: &str = "gpu.libshare.dev";
/// The DeviceClass whose claims are production (the default of `--production-class`).
pub const PRODUCTION_CLASS: &str = "production.gpu.libshare.dev";
/// The DeviceClass for opportunistic claims (any class not named production is opportunistic).
pub const OPPORTUNISTIC_CLASS: &str = "opportunistic.gpu.libshare.dev";

/// The kubelet's APIs the plugin speaks, generated at build time from the vendored protos.
#[allow(clippy::all, missing_docs)]
pub mod api {
    /// `k8s.io/kubelet/pkg/apis/dra/v1`.
    pub mod v1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// `k8s.io/kubelet/pkg/apis/dra/v1beta1` (same messages; kubelets 1.32–1.33).
    pub mod v1beta1 {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
    }
    /// `k8s.io/kubelet/pkg/apis/pluginregistration/v1`.
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

pub mod claim;
pub mod plugin;
pub mod quantity;
pub mod slice;
pub mod store;
