//! MPS only where MPS keeps its promise: compute capability 7.0 (Volta) or newer for MPS at
//! all (pre-Volta MPS servers fail at start in the field: a Tesla P4 at 6.1), a driver of
//! CUDA 11.5 or newer for pinned device memory limits.

use super::*;

/// A service on the node of profile file text `profile` (one GPU, `gpu-0`).
fn on_profile(profile: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("node.toml");
    std::fs::write(&file, profile).unwrap();
    let host = FakeHost::default();
    let cfg = ServiceConfig::for_tests(dir.path(), NODE);
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes(
            &file.display().to_string(),
            NODE,
            &dir.path().join("dev"),
        )
        .unwrap(),
    );
    let mps = MpsControl::new(
        "/usr/bin/nvidia-cuda-mps-control".into(),
        host.ops(),
        Duration::from_millis(200),
    );
    let service = Service::new(cfg.clone(), backend, mps).unwrap();
    Fixture {
        _dir: dir,
        host,
        service,
        cfg,
    }
}

const P4: &str = r#"
name = "p4-node"
driver_version = "535.183.01"
cuda_driver_version = "12.2"
[[gpus]]
product_name = "Tesla P4"
brand = "Tesla"
architecture = "Pascal"
memory_mib = 7680
cuda_compute_capability = "6.1"
count = 1
"#;

const V100_OLD_DRIVER: &str = r#"
name = "v100-old-driver"
driver_version = "470.256.02"
cuda_driver_version = "11.4"
[[gpus]]
product_name = "Tesla V100-SXM2-16GB"
brand = "Tesla"
architecture = "Volta"
memory_mib = 16384
cuda_compute_capability = "7.0"
count = 1
"#;

fn mps_pinned(atp: u32, limit: &str) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": atp,
             "defaultPinnedDeviceMemoryLimit": limit}}})
}

fn no_daemon_started(f: &Fixture) {
    assert!(
        f.host.state().calls.iter().all(|c| !c.contains(" -d")),
        "no MPS control daemon was started: {:?}",
        f.host.state().calls
    );
}

#[test]
fn mps_on_a_pre_volta_gpu_is_unsupported_naming_gpu_capability_and_driver() {
    let f = on_profile(P4);
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-0"], Some(mps(50))))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unsupported, "{err}");
    for part in [
        "gpu-0",
        "Tesla P4",
        "compute capability 6.1",
        "535.183.01",
        "7.0",
    ] {
        assert!(err.message.contains(part), "{part:?} in {err}");
    }
    assert_clean(&f, "u1");
    no_daemon_started(&f);
    // Sharing that needs no MPS server still works on it.
    f.service.prepare(&claim("u2", &["gpu-0"], None)).unwrap();
}

#[test]
fn pinned_limits_on_a_driver_older_than_cuda_11_5_are_unsupported() {
    let f = on_profile(V100_OLD_DRIVER);
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-0"], Some(mps_pinned(50, "4Gi"))))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unsupported, "{err}");
    for part in [
        "gpu-0",
        "Tesla V100-SXM2-16GB",
        "7.0",
        "470.256.02",
        "CUDA 11.4",
        "11.5",
    ] {
        assert!(err.message.contains(part), "{part:?} in {err}");
    }
    assert_clean(&f, "u1");
    no_daemon_started(&f);
    // Without pinned limits, MPS works on that driver (Volta honours the percentage).
    f.service
        .prepare(&claim("u2", &["gpu-0"], Some(mps(50))))
        .unwrap();
}

#[test]
fn volta_and_newer_on_a_current_driver_take_every_limit() {
    for profile in ["p3.2xlarge", "g4dn.xlarge"] {
        let dir = tempfile::tempdir().unwrap();
        let host = FakeHost::default();
        let cfg = ServiceConfig::for_tests(dir.path(), NODE);
        let backend = Arc::new(
            SimulatedBackend::without_device_nodes(profile, NODE, &dir.path().join("dev")).unwrap(),
        );
        let mps_control = MpsControl::new("/x".into(), host.ops(), Duration::from_millis(200));
        let service = Service::new(cfg, backend, mps_control).unwrap();
        service
            .prepare(&claim("u1", &["gpu-0"], Some(mps_pinned(25, "2Gi"))))
            .unwrap_or_else(|e| panic!("{profile}: {e}"));
    }
}
