//! Stand-ins for exactly the two components that cannot be installed on the build machines,
//! for tests and benchmarks only: kubelet's side of the DRA and registration gRPC APIs
//! ([`kubelet`]) and an in-process kube-apiserver with the Node authorizer's limits
//! ([`apiserver`]), both as kubernetes/kubernetes' sources define them (`pkg/kubelet/cm/dra`,
//! `pkg/kubelet/pluginmanager`, the Node authorizer and NodeRestriction).
#![allow(
    missing_docs,
    missing_debug_implementations,
    clippy::unwrap_used,
    clippy::missing_panics_doc
)]

pub mod apiserver;
pub mod kubelet;
pub mod slice_rules;
