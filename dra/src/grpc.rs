//! Code generated at build time from `dra/proto/` (kubelet's APIs, written from the
//! published protos): messages, servers and clients. The package paths are kubelet's, so the
//! gRPC method paths are exactly the ones kubelet calls.
#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used
)]

/// `k8s.io.kubelet.pkg.apis.dra.v1`: `DRAPlugin` (kubelet 1.34+).
pub mod v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1`: `DRAPlugin` (kubelet 1.32, 1.33).
pub mod v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// `pluginregistration`: `Registration`.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// `v1alpha1`: `DRAResourceHealth`.
pub mod health {
    tonic::include_proto!("v1alpha1");
}

/// `DRAPlugin` version strings a plugin advertises in `supported_versions` (kubelet's
/// `DRAPluginService` constants: deliberately not the gRPC service names).
pub const V1_SERVICE: &str = "v1.DRAPlugin";
/// See [`V1_SERVICE`].
pub const V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
/// The health service's registration string.
pub const HEALTH_SERVICE: &str = "v1alpha1.DRAResourceHealth";
/// `PluginInfo.type` of a DRA plugin.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
