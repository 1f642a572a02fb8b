//! MIG's code beyond one group, run without a service: the effects the service lends it
//! (`effects.rs`) stood in for by a stub, on a simulated node.

use std::cell::Cell;
use std::path::Path;

use gpushare_proto::ErrorCode;

use super::{
    check_whole_gpu, leave_mig_mode, live_mig, reserve_slice, resolve, Claimed, ClaimsView,
    MigIntents, MigTarget,
};
use crate::claim::Device;
use crate::gpu::{GpuBackend, SimulatedBackend};
use crate::mig::{CiProfileIndex, GiProfileId};

/// No claim records a slice; counts how often the claims are read.
#[derive(Default)]
struct NoClaims(Cell<usize>);

impl ClaimsView for NoClaims {
    fn claimed(&self, _except: Option<&str>) -> Claimed {
        self.0.set(self.0.get() + 1);
        Claimed::default()
    }
}

fn node(profile: &str) -> SimulatedBackend {
    SimulatedBackend::without_device_nodes(profile, "node-a", Path::new("/x")).unwrap()
}

/// A p5.48xlarge (H100s: MIG mode changes without a reset) with a whole 1g.10gb instance at
/// memory slice 0 of gpu-0, made behind gpushare's back; returns the GPU's UUID.
fn h100_with_an_instance() -> (SimulatedBackend, String) {
    let backend = node("p5.48xlarge");
    let uuid = backend.find("gpu-0").unwrap().uuid.clone();
    backend.set_mig_mode(&uuid, true).unwrap();
    let gi = backend
        .create_gpu_instance(&uuid, GiProfileId(19), 0)
        .unwrap();
    backend
        .create_compute_instance(&uuid, gi, CiProfileIndex(0))
        .unwrap();
    (backend, uuid)
}

#[test]
fn an_instance_no_claim_records_is_the_layouts_in_list_gpus_and_to_a_whole_gpu_claim() {
    let (backend, uuid) = h100_with_an_instance();
    let gpu = backend.find(&uuid).unwrap().clone();
    let claims = NoClaims::default();
    let (mode, devices) = live_mig(&backend, &claims, &gpu).unwrap();
    assert!(mode.current);
    assert_eq!(devices.len(), 1);
    assert_eq!(devices[0].owner, None);
    let e = check_whole_gpu(&backend, &claims, &gpu).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("the node's MIG layout"), "{}", e.message);
}

#[test]
fn a_whole_gpu_claim_takes_an_idle_h100_out_of_mig_mode_without_reading_the_claims() {
    let backend = node("p5.48xlarge");
    let gpu = backend.find("gpu-1").unwrap().clone();
    backend.set_mig_mode(&gpu.uuid, true).unwrap();
    let claims = NoClaims::default();
    check_whole_gpu(&backend, &claims, &gpu).unwrap();
    assert_eq!(claims.0.get(), 0);
    let d = Device {
        request: "gpu".into(),
        device: gpu.device_name(),
        uuid: gpu.uuid.clone(),
        minor: gpu.minor,
    };
    leave_mig_mode(&backend, &d).unwrap();
    assert!(!backend.mig_mode(&gpu.uuid).unwrap().current);
}

#[test]
fn two_claims_never_reserve_one_slice_and_each_reserve_reads_the_claims() {
    let dir = tempfile::tempdir().unwrap();
    let backend = node("p4d.24xlarge");
    let intents = MigIntents::new(dir.path());
    let claims = NoClaims::default();
    let target: MigTarget = resolve(
        &backend,
        "gpu",
        "gpu-2-mig-3g20gb-9-4",
        None,
        &Claimed::default(),
        &[],
    )
    .unwrap();
    let first = reserve_slice(&backend, &intents, &claims, "c1", &target).unwrap();
    assert_eq!(first, target);
    let e = reserve_slice(&backend, &intents, &claims, "c2", &target).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("claim c1"), "{}", e.message);
    // Read once per reserve, under the intents' lock: the claims as they are then.
    assert_eq!(claims.0.get(), 2);
    intents.strike("c1");
    reserve_slice(&backend, &intents, &claims, "c2", &target).unwrap();
    assert_eq!(claims.0.get(), 3);
}
