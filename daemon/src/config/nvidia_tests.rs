//! Unit tests of `nvidia.rs`.

use super::*;
use serde_json::{json, Value};

const P: &str = "p";

fn parse(v: Value) -> Result<(NvidiaKind, Sharing), ConfigError> {
    parse_nvidia(Obj::new(&v, P, ErrorCode::InvalidConfig)?, P)
}

fn gpu(sharing: Value) -> Value {
    json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": sharing})
}

fn refused(v: Value, code: ErrorCode, needles: &[&str]) {
    let err = parse(v.clone()).expect_err(&format!("{v} must be refused"));
    assert_eq!(err.code, code, "{}", err.message);
    for n in needles {
        assert!(err.message.contains(n), "{:?} lacks {n:?}", err.message);
    }
}

#[test]
fn time_slicing_defaults_and_intervals() {
    for (sharing, interval) in [
        (
            json!({"strategy": "TimeSlicing"}),
            TimeSliceInterval::Default,
        ),
        (
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {}}),
            TimeSliceInterval::Default,
        ),
        (
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": null}),
            TimeSliceInterval::Default,
        ),
        (
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}}),
            TimeSliceInterval::Short,
        ),
        (
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}),
            TimeSliceInterval::Medium,
        ),
        (
            json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
            TimeSliceInterval::Long,
        ),
    ] {
        assert_eq!(
            parse(gpu(sharing)),
            Ok((
                NvidiaKind::GpuConfig,
                Sharing::TimeSlicing {
                    interval,
                    replicas: None
                }
            ))
        );
    }
}

#[test]
fn missing_sharing_means_no_sharing() {
    let v = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig"});
    assert_eq!(parse(v), Ok((NvidiaKind::GpuConfig, Sharing::Exclusive)));
    let v = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "MigDeviceConfig"});
    assert_eq!(
        parse(v),
        Ok((
            NvidiaKind::MigDeviceConfig,
            Sharing::Mig {
                profile: None,
                mps: None
            }
        ))
    );
}

#[test]
fn mps_full_config() {
    let v = gpu(json!({"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 30,
            "defaultPinnedDeviceMemoryLimit": "8Gi",
            "defaultPerDevicePinnedMemoryLimit": {"1": "20Gi", "GPU-5f3c0c52-0000-0000-0000-000000000001": "12Gi"},
            "multiUser": true}}));
    let expected = MpsSettings {
        active_thread_percentage: Some(30),
        default_pinned_limit_mib: Some(8192),
        per_device_pinned_limit_mib: BTreeMap::from([
            (DeviceKey::Index(1), 20480),
            (
                DeviceKey::Uuid("GPU-5f3c0c52-0000-0000-0000-000000000001".into()),
                12288,
            ),
        ]),
        multi_user: true,
    };
    assert_eq!(
        parse(v),
        Ok((
            NvidiaKind::GpuConfig,
            Sharing::Mps {
                settings: expected,
                replicas: None
            }
        ))
    );
    assert_eq!(
        parse(gpu(json!({"strategy": "MPS"}))),
        Ok((
            NvidiaKind::GpuConfig,
            Sharing::Mps {
                settings: MpsSettings::default(),
                replicas: None
            }
        ))
    );
}

#[test]
fn mig_device_config() {
    let v = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi"}}});
    let mps = MpsSettings {
        default_pinned_limit_mib: Some(10240),
        ..MpsSettings::default()
    };
    assert_eq!(
        parse(v),
        Ok((
            NvidiaKind::MigDeviceConfig,
            Sharing::Mig {
                profile: None,
                mps: Some(mps)
            }
        ))
    );
    let v = json!({"apiVersion": NVIDIA_API_VERSION, "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing"}});
    assert_eq!(
        parse(v),
        Ok((
            NvidiaKind::MigDeviceConfig,
            Sharing::Mig {
                profile: None,
                mps: None
            }
        ))
    );
    // MigDeviceSharing has no timeSlicingConfig: an unknown field, as in NVIDIA's types.
    refused(
        json!({"apiVersion": NVIDIA_API_VERSION, "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
        ErrorCode::InvalidConfig,
        &["p.sharing.timeSlicingConfig", "unknown field"],
    );
}

#[test]
fn strict_decoding_names_unknown_fields() {
    refused(
        json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}, "replicas": 3}),
        ErrorCode::InvalidConfig,
        &["p.replicas", "unknown field", "3"],
    );
    refused(
        json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GpuConfig", "metadata": {}}),
        ErrorCode::InvalidConfig,
        &["p.metadata"],
    );
    refused(
        gpu(json!({"strategy": "MPS", "Strategy": "MPS"})),
        ErrorCode::InvalidConfig,
        &["p.sharing.Strategy"],
    );
    refused(
        gpu(json!({"strategy": "MPS", "mpsConfig": {"maxConnections": 4}})),
        ErrorCode::InvalidConfig,
        &["p.sharing.mpsConfig.maxConnections"],
    );
    refused(
        gpu(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long", "x": 1}})),
        ErrorCode::InvalidConfig,
        &["p.sharing.timeSlicingConfig.x"],
    );
}

#[test]
fn bad_values_are_named() {
    refused(
        gpu(json!({"strategy": "mps"})),
        ErrorCode::InvalidConfig,
        &["p.sharing.strategy", "\"mps\"", "case-sensitive"],
    );
    refused(
        gpu(json!({"strategy": "Exclusive"})),
        ErrorCode::InvalidConfig,
        &["p.sharing.strategy", "\"Exclusive\""],
    );
    refused(
        gpu(json!({})),
        ErrorCode::InvalidConfig,
        &["p.sharing.strategy", "required"],
    );
    refused(
        gpu(json!("MPS")),
        ErrorCode::InvalidConfig,
        &["p.sharing", "expected an object"],
    );
    refused(
        gpu(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "VeryLong"}})),
        ErrorCode::InvalidConfig,
        &["p.sharing.timeSlicingConfig.interval", "\"VeryLong\""],
    );
    refused(
        gpu(json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "long"}})),
        ErrorCode::InvalidConfig,
        &["p.sharing.timeSlicingConfig.interval", "\"long\""],
    );
    refused(
        gpu(json!({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}})),
        ErrorCode::InvalidConfig,
        &["p.sharing.timeSlicingConfig", "\"MPS\""],
    );
    refused(
        gpu(json!({"strategy": "TimeSlicing", "mpsConfig": {}})),
        ErrorCode::InvalidConfig,
        &["p.sharing.mpsConfig", "\"TimeSlicing\""],
    );
    let pct = "p.sharing.mpsConfig.defaultActiveThreadPercentage";
    for (value, needle) in [
        (json!(101), "101"),
        (json!(-1), "-1"),
        (json!(0), "(0, 100]"),
        (json!(50.5), "50.5"),
        (json!("50"), "\"50\""),
    ] {
        refused(
            gpu(json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": value}})),
            ErrorCode::InvalidConfig,
            &[pct, needle],
        );
    }
    for pct_ok in [1, 100] {
        assert!(parse(gpu(
            json!({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": pct_ok}})
        ))
        .is_ok());
    }
    refused(
        gpu(json!({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}})),
        ErrorCode::InvalidConfig,
        &[
            "p.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit",
            "value set too low",
            "512Ki",
        ],
    );
    refused(
        gpu(
            json!({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Ki"}}}),
        ),
        ErrorCode::InvalidConfig,
        &[
            "p.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[\"0\"]",
            "value set too low",
        ],
    );
    refused(
        gpu(
            json!({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"gpu0": "1Gi"}}}),
        ),
        ErrorCode::InvalidConfig,
        &[
            "defaultPerDevicePinnedMemoryLimit[\"gpu0\"]",
            "neither a device index",
        ],
    );
    refused(
        gpu(
            json!({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"1": "1Gi", "01": "2Gi"}}}),
        ),
        ErrorCode::InvalidConfig,
        &["second time"],
    );
    refused(
        gpu(json!({"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}})),
        ErrorCode::InvalidConfig,
        &["p.sharing.mpsConfig.multiUser", "\"yes\""],
    );
}

#[test]
fn envelope() {
    refused(
        json!({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}),
        ErrorCode::InvalidConfig,
        &["p.apiVersion", "resource.nvidia.com/v1"],
    );
    refused(
        json!({"kind": "GpuConfig"}),
        ErrorCode::InvalidConfig,
        &["p.apiVersion"],
    );
    refused(
        json!({"apiVersion": NVIDIA_API_VERSION}),
        ErrorCode::InvalidConfig,
        &["p.kind", "required"],
    );
    refused(
        json!({"apiVersion": NVIDIA_API_VERSION, "kind": "GPUConfig"}),
        ErrorCode::InvalidConfig,
        &["p.kind", "\"GPUConfig\""],
    );
    for kind in ["VfioDeviceConfig", "ComputeDomainChannelConfig"] {
        refused(
            json!({"apiVersion": NVIDIA_API_VERSION, "kind": kind}),
            ErrorCode::Unsupported,
            &["p.kind", kind],
        );
    }
}

#[test]
fn device_keys() {
    assert_eq!(parse_device_key("0"), Some(DeviceKey::Index(0)));
    assert_eq!(parse_device_key("007"), Some(DeviceKey::Index(7)));
    assert_eq!(
        parse_device_key("GPU-5f3c0c52-0000-0000-0000-000000000001"),
        Some(DeviceKey::Uuid(
            "GPU-5f3c0c52-0000-0000-0000-000000000001".into()
        ))
    );
    assert_eq!(
        parse_device_key("MIG-GPU-5f3c0c52/1/0"),
        Some(DeviceKey::Uuid("MIG-GPU-5f3c0c52/1/0".into()))
    );
    for bad in [
        "",
        "-1",
        "+1",
        "GPU-",
        "gpu-0",
        "GPU-a b",
        "99999999999999999999999",
    ] {
        assert_eq!(parse_device_key(bad), None, "{bad:?}");
    }
}
