//! One spec per cdiVersion, each using the features that version added, loaded from a spec
//! directory through the registry and applied to an OCI config. Each spec is also checked to
//! be refused when it declares the version just below its minimum.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::Path;

use gpushare_cdi::{load_spec, minimum_version, Registry, SpecError, SpecFormat, Version};
use serde_json::{json, Value};

fn base_config() -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 0, "gid": 0}, "env": ["PATH=/usr/bin:/bin"], "args": ["sh"], "cwd": "/"},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}
        ],
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}
    })
}

/// Writes `text` as `name` into a fresh spec dir, loads it, and injects `devices`.
fn inject(name: &str, text: &str, devices: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(name), text).unwrap();
    let registry = Registry::load(&[dir.path()]);
    assert!(registry.errors().is_empty(), "{:?}", registry.errors());
    let mut config = base_config();
    registry.inject(&mut config, devices).unwrap();
    config
}

fn format_of(name: &str) -> SpecFormat {
    SpecFormat::from_path(Path::new(name)).unwrap()
}

/// The spec loads as written, needs exactly `min`, and is refused one version lower.
fn check_versions(name: &str, text: &str, min: Version) {
    let spec = load_spec(text.as_bytes(), format_of(name)).unwrap();
    assert_eq!(minimum_version(&spec), min, "{name}");
    let idx = Version::ALL.iter().position(|v| *v == min).unwrap();
    if min > Version::EARLIEST {
        let lower = Version::ALL[idx - 1];
        let declared = spec.cdi_version.clone();
        let downgraded = text.replacen(&declared, lower.as_str(), 1);
        let err = load_spec(downgraded.as_bytes(), format_of(name)).unwrap_err();
        assert!(
            matches!(err, SpecError::VersionTooLow { required, .. } if required == min)
                || matches!(err, SpecError::VersionedField(_)),
            "{name} at {lower}: {err}"
        );
    }
}

const V030: &str = r#"{
  "cdiVersion": "0.3.0",
  "kind": "gpushare-test.io/v030",
  "containerEdits": {
    "env": ["SPEC_LEVEL=1"],
    "hooks": [{"hookName": "poststop", "path": "/usr/bin/gpushare-cdi-hook", "args": ["gpushare-cdi-hook", "detach"]}]
  },
  "devices": [{
    "name": "null",
    "containerEdits": {
      "env": ["DEV=null"],
      "deviceNodes": [{"path": "/dev/null", "permissions": "rw"}],
      "mounts": [{"hostPath": "/var/lib/x", "containerPath": "/opt/x", "options": ["bind", "ro"]}],
      "hooks": [{"hookName": "createRuntime", "path": "/usr/bin/gpushare-cdi-hook", "args": ["gpushare-cdi-hook", "attach"], "env": ["A=1"], "timeout": 5}]
    }
  }]
}"#;

#[test]
fn v0_3_0_env_nodes_mounts_hooks() {
    check_versions("v.json", V030, Version::V0_3_0);
    let c = inject("v.json", V030, &["gpushare-test.io/v030=null"]);
    assert_eq!(
        c["process"]["env"],
        json!(["PATH=/usr/bin:/bin", "SPEC_LEVEL=1", "DEV=null"])
    );
    let dev = &c["linux"]["devices"][0];
    assert_eq!(
        (
            dev["path"].as_str(),
            dev["type"].as_str(),
            dev["major"].as_i64(),
            dev["minor"].as_i64()
        ),
        (Some("/dev/null"), Some("c"), Some(1), Some(3))
    );
    assert_eq!(dev["fileMode"].as_u64().map(|m| m & 0o777), Some(0o666));
    assert_eq!(
        c["linux"]["resources"]["devices"][1],
        json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rw"})
    );
    assert_eq!(
        c["mounts"][2],
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm"})
    );
    assert_eq!(
        c["mounts"][3],
        json!({"destination": "/opt/x", "source": "/var/lib/x", "options": ["bind", "ro"]})
    );
    assert_eq!(
        c["hooks"]["poststop"],
        json!([{"path": "/usr/bin/gpushare-cdi-hook", "args": ["gpushare-cdi-hook", "detach"]}])
    );
    assert_eq!(c["hooks"]["createRuntime"][0]["timeout"], 5);
}

const V040: &str = "---
cdiVersion: 0.4.0
kind: gpushare-test.io/v040
devices:
- name: shm
  containerEdits:
    mounts:
    - hostPath: /run/gpushare/claims/c1/shm
      containerPath: /dev/shm
      type: bind
      options: [rbind, nosuid, nodev]
";

#[test]
fn v0_4_0_mount_type() {
    check_versions("v.yaml", V040, Version::V0_4_0);
    let c = inject("v.yaml", V040, &["gpushare-test.io/v040=shm"]);
    // The CDI mount replaces the config's /dev/shm and is sorted after /dev by depth.
    assert_eq!(
        c["mounts"],
        json!([
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]},
            {"destination": "/dev/shm", "type": "bind", "source": "/run/gpushare/claims/c1/shm", "options": ["rbind", "nosuid", "nodev"]}
        ])
    );
}

const V050: &str = r#"{
  "cdiVersion": "0.5.0",
  "kind": "gpushare-test.io/v050",
  "devices": [{
    "name": "0",
    "containerEdits": {
      "deviceNodes": [{"path": "/dev/gpushare-zero", "hostPath": "/dev/zero"}]
    }
  }]
}"#;

#[test]
fn v0_5_0_host_path_and_digit_names() {
    check_versions("v.json", V050, Version::V0_5_0);
    let c = inject("v.json", V050, &["gpushare-test.io/v050=0"]);
    let dev = &c["linux"]["devices"][0];
    assert_eq!(
        (
            dev["path"].as_str(),
            dev["major"].as_i64(),
            dev["minor"].as_i64()
        ),
        (Some("/dev/gpushare-zero"), Some(1), Some(5))
    );
    // With a name starting with a letter, the hostPath alone still needs 0.5.0.
    let named = V050.replace("\"name\": \"0\"", "\"name\": \"zero\"");
    check_versions("v.json", &named, Version::V0_5_0);
}

const V060: &str = "cdiVersion: 0.6.0
kind: gpushare-test.io/claim.v1
annotations:
  gpushare.io/owner: daemon
devices:
- name: c1
  annotations:
    gpushare.io/claim-uid: 5d1c
  containerEdits:
    env: [GPUSHARE_CLAIM=5d1c]
";

#[test]
fn v0_6_0_annotations_and_dotted_class() {
    check_versions("v.yaml", V060, Version::V0_6_0);
    let c = inject("v.yaml", V060, &["gpushare-test.io/claim.v1=c1"]);
    assert_eq!(c["process"]["env"][1], "GPUSHARE_CLAIM=5d1c");
    // Each of the three features needs 0.6.0 on its own.
    let no_annotations = "cdiVersion: 0.6.0\nkind: gpushare-test.io/claim.v1\ndevices:\n- name: c1\n  containerEdits:\n    env: [A=1]\n";
    check_versions("v.yaml", no_annotations, Version::V0_6_0);
    let only_device_annotation = "cdiVersion: 0.6.0\nkind: gpushare-test.io/claim\ndevices:\n- name: c1\n  annotations: {a: b}\n  containerEdits:\n    env: [A=1]\n";
    check_versions("v.yaml", only_device_annotation, Version::V0_6_0);
}

const V070: &str = r#"{
  "cdiVersion": "0.7.0",
  "kind": "gpushare-test.io/v070",
  "containerEdits": {"additionalGids": [0, 44]},
  "devices": [{
    "name": "rdt",
    "containerEdits": {
      "intelRdt": {"closID": "gpushare", "l3CacheSchema": "L3:0=ff", "memBwSchema": "MB:0=50", "enableCMT": true},
      "additionalGids": [44, 107]
    }
  }]
}"#;

#[test]
fn v0_7_0_intel_rdt_and_additional_gids() {
    check_versions("v.json", V070, Version::V0_7_0);
    let c = inject("v.json", V070, &["gpushare-test.io/v070=rdt"]);
    assert_eq!(
        c["linux"]["intelRdt"],
        json!({"closID": "gpushare", "l3CacheSchema": "L3:0=ff", "memBwSchema": "MB:0=50", "enableCMT": true})
    );
    assert_eq!(c["process"]["user"]["additionalGids"], json!([44, 107]));
}

#[test]
fn v0_8_0_and_v1_0_0_add_nothing_to_the_format() {
    // Everything 0.7.0 allows loads at 0.8.0 and 1.0.0; the minimum stays 0.7.0.
    for version in ["0.8.0", "1.0.0"] {
        let text = V070.replacen("0.7.0", version, 1);
        let spec = load_spec(text.as_bytes(), SpecFormat::Json).unwrap();
        assert_eq!(minimum_version(&spec), Version::V0_7_0);
        let c = inject("v.json", &text, &["gpushare-test.io/v070=rdt"]);
        assert_eq!(c["process"]["user"]["additionalGids"], json!([44, 107]));
    }
}

const V110: &str = r#"{
  "cdiVersion": "1.1.0",
  "kind": "gpushare-test.io/v110",
  "devices": [{
    "name": "nic",
    "containerEdits": {
      "netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}],
      "intelRdt": {"closID": "/", "schemata": ["L3:0=f"], "enableMonitoring": true}
    }
  }]
}"#;

#[test]
fn v1_1_0_net_devices_schemata_monitoring() {
    check_versions("v.json", V110, Version::V1_1_0);
    let c = inject("v.json", V110, &["gpushare-test.io/v110=nic"]);
    assert_eq!(c["linux"]["netDevices"], json!({"eth1": {"name": "net1"}}));
    assert_eq!(
        c["linux"]["intelRdt"],
        json!({"closID": "/", "schemata": ["L3:0=f"], "enableMonitoring": true})
    );
    // enableCMT is gone from 1.1.0.
    let old_field = V110.replace("\"enableMonitoring\": true", "\"enableCMT\": true");
    assert!(matches!(
        load_spec(old_field.as_bytes(), SpecFormat::Json),
        Err(SpecError::VersionedField(_))
    ));
}

#[test]
fn leading_v_is_tolerated_everywhere() {
    let text = V050.replacen("\"0.5.0\"", "\"v0.5.0\"", 1);
    let c = inject("v.json", &text, &["gpushare-test.io/v050=0"]);
    assert_eq!(c["linux"]["devices"][0]["minor"], 5);
}
