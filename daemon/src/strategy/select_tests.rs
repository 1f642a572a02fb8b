//! Planning a group from its config on a simulated node: the config as it applies to the
//! group's devices, handed to the strategy whose arm it is, with the config's cap kept.

use std::path::Path;

use gpushare_proto::{ErrorCode, TimeSliceInterval};

use super::{plan, GroupAsk, Planned, Planning};
use crate::claim::{Device, Sharing as Held};
use crate::config::{AllocatedDevice, ClaimSpec, DeviceGroup, MpsSettings, Sharing};
use crate::error::ServiceError;
use crate::gpu::{Gpu, GpuBackend, SimulatedBackend};
use crate::strategy::mig::{Claimed, ClaimsView};

struct NoClaims;

impl ClaimsView for NoClaims {
    fn claimed(&self, _except: Option<&str>) -> Claimed {
        Claimed::default()
    }
}

/// An H100 node (MIG mode changes without a reset).
fn node() -> SimulatedBackend {
    SimulatedBackend::without_device_nodes("p5.48xlarge", "node-a", Path::new("/x")).unwrap()
}

/// Plans one group of `devices` (each `gpu-<minor>` or a MIG device of one) under `config`.
fn plan_of(
    backend: &SimulatedBackend,
    devices: &[&str],
    config: Sharing,
) -> Result<Planned, ServiceError> {
    let spec = ClaimSpec {
        uid: "0f0e0d0c-1111-2222-3333-444455556666".into(),
        namespace: "ns".into(),
        name: "c".into(),
        results: devices
            .iter()
            .map(|d| AllocatedDevice {
                request: "gpu".into(),
                driver: "gpu.nvidia.com".into(),
                pool: "node-a".into(),
                device: (*d).into(),
            })
            .collect(),
        groups: vec![DeviceGroup {
            results: (0..devices.len()).collect(),
            sharing: config,
        }],
    };
    let gpus: Vec<&Gpu> = devices
        .iter()
        .map(|d| {
            let minor = d.trim_start_matches("gpu-").split('-').next().unwrap();
            backend.find(&format!("gpu-{minor}")).unwrap()
        })
        .collect();
    let mut claimed: Vec<Device> = spec
        .results
        .iter()
        .zip(&gpus)
        .map(|(r, g)| Device {
            request: r.request.clone(),
            device: r.device.clone(),
            uuid: g.uuid.clone(),
            minor: g.minor,
        })
        .collect();
    claimed.sort_by(|a, b| a.uuid.cmp(&b.uuid));
    let planning = Planning {
        backend,
        claims: &NoClaims,
        claim_dir: Path::new("/run/gpushare/claims/c"),
        shm_bytes: 1 << 30,
    };
    let ask = GroupAsk {
        spec: &spec,
        results: &spec.groups[0].results,
        gpus: &gpus,
        requests: &["gpu".to_string()],
        devices: &claimed,
    };
    plan(&planning, &ask, &spec.groups[0].sharing)
}

fn mps(replicas: Option<u32>) -> Sharing {
    Sharing::Mps {
        settings: MpsSettings {
            active_thread_percentage: Some(50),
            ..MpsSettings::default()
        },
        replicas,
    }
}

#[test]
fn an_mps_config_on_mig_devices_plans_mig_with_a_daemon_and_keeps_its_replicas() {
    let b = node();
    let p = plan_of(
        &b,
        &["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1"],
        mps(Some(3)),
    )
    .unwrap();
    assert_eq!(p.replicas, Some(3));
    let names: Vec<&str> = p.devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(names, ["gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1"]);
    assert!(
        p.strategy.whole_gpu().is_none(),
        "a MIG group sets nothing on its GPU"
    );
    match p.strategy.planned() {
        Held::Mig(m) => {
            assert!(m.slices.is_empty(), "nothing is made at planning");
            assert!(m.mps.is_some(), "the config's MPS runs on the slices");
        }
        other => panic!("planned {other:?}"),
    }
}

#[test]
fn an_mps_config_on_whole_gpus_plans_one_daemon_over_their_sorted_uuids() {
    let b = node();
    let p = plan_of(&b, &["gpu-3", "gpu-1"], mps(Some(2))).unwrap();
    assert_eq!(p.replicas, Some(2));
    let Held::Mps(m) = p.strategy.planned() else {
        panic!("not an MPS group");
    };
    let mut uuids = vec![
        b.find("gpu-1").unwrap().uuid.clone(),
        b.find("gpu-3").unwrap().uuid.clone(),
    ];
    uuids.sort();
    assert_eq!(m.visible_devices, uuids);
    assert_eq!(m.control_daemon_pid, 0, "planned, not started");
}

#[test]
fn time_slicing_plans_its_interval_and_a_whole_gpu_setting() {
    let b = node();
    let config = Sharing::TimeSlicing {
        interval: TimeSliceInterval::Long,
        replicas: None,
    };
    let p = plan_of(&b, &["gpu-2"], config).unwrap();
    assert_eq!(
        p.strategy.planned(),
        Held::TimeSlicing {
            interval: TimeSliceInterval::Long
        }
    );
    assert!(p.strategy.whole_gpu().unwrap().has_setting());
}

#[test]
fn configs_that_do_not_fit_mig_devices_are_refused_before_any_strategy_plans() {
    let b = node();
    let slicing = Sharing::TimeSlicing {
        interval: TimeSliceInterval::Short,
        replicas: None,
    };
    let e = plan_of(&b, &["gpu-0-mig-1g10gb-19-0"], slicing).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidConfig);
    assert!(
        e.message.contains("time-slicing applies to whole GPUs"),
        "{}",
        e.message
    );
    let e = plan_of(&b, &["gpu-0-mig-1g10gb-19-0", "gpu-1"], Sharing::Exclusive).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidRequest);
    assert!(
        e.message.contains("mix MIG devices and whole GPUs"),
        "{}",
        e.message
    );
}

#[test]
fn a_whole_gpu_strategy_refuses_a_gpu_partitioned_behind_its_back() {
    let b = node();
    let uuid = b.find("gpu-4").unwrap().uuid.clone();
    b.set_mig_mode(&uuid, true).unwrap();
    b.create_gpu_instance(&uuid, crate::mig::GiProfileId(19), 0)
        .unwrap();
    for config in [Sharing::Exclusive, mps(None)] {
        let e = plan_of(&b, &["gpu-4"], config).unwrap_err();
        assert_eq!(e.code, ErrorCode::Conflict, "{}", e.message);
    }
}
