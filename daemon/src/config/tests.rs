//! Tests of whole claims: documents, ranking, grouping, pinned limits, and the shared cases in
//! `shared/cases/claims`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use gpushare_proto::{ErrorCode, TimeSliceInterval};
use serde_json::{json, Value};

use super::*;

const NODE: &str = "ip-10-0-1-23.us-west-2.compute.internal";

fn ctx() -> ParseContext {
    ParseContext {
        node_name: NODE.to_owned(),
        drivers: vec!["gpu.nvidia.com".to_owned()],
    }
}

fn result(request: &str, device: &str) -> Value {
    json!({"request": request, "driver": "gpu.nvidia.com", "pool": NODE, "device": device})
}

/// A v1 claim with these allocation results and (when `Some`) status configs.
fn claim(results: Vec<Value>, config: Option<Vec<Value>>) -> Value {
    let mut devices = json!({ "results": results });
    if let (Some(config), Some(map)) = (config, devices.as_object_mut()) {
        map.insert("config".into(), Value::Array(config));
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "0a1b2c3d-0000-4000-8000-000000000001",
                     "managedFields": [{"manager": "kube-controller-manager"}]},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": devices}, "reservedFor": []}
    })
}

fn cfg(source: &str, requests: Option<&[&str]>, parameters: Value) -> Value {
    let mut entry =
        json!({"source": source, "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters}});
    if let (Some(requests), Some(map)) = (requests, entry.as_object_mut()) {
        map.insert("requests".into(), json!(requests));
    }
    entry
}

fn ts(interval: &str) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}})
}

fn ts_sharing(interval: TimeSliceInterval) -> Sharing {
    Sharing::TimeSlicing {
        interval,
        replicas: None,
    }
}

fn mps_pct(p: u32) -> Sharing {
    Sharing::Mps {
        settings: MpsSettings {
            active_thread_percentage: Some(p),
            ..MpsSettings::default()
        },
        replicas: None,
    }
}

fn groups(spec: &ClaimSpec) -> Vec<(Vec<usize>, Sharing)> {
    spec.groups
        .iter()
        .map(|g| (g.results.clone(), g.sharing.clone()))
        .collect()
}

fn refused(claim: &Value, code: ErrorCode, needles: &[&str]) -> ConfigError {
    let err = parse_claim(claim, &ctx()).expect_err("claim must be refused");
    assert_eq!(err.code, code, "{}", err.message);
    for n in needles {
        assert!(err.message.contains(n), "{:?} lacks {n:?}", err.message);
    }
    err
}

#[test]
fn claim_with_no_config_is_one_exclusive_group() {
    let spec = parse_claim(
        &claim(vec![result("gpu", "gpu-0"), result("gpu", "gpu-1")], None),
        &ctx(),
    )
    .expect("valid claim");
    assert_eq!(spec.uid, "0a1b2c3d-0000-4000-8000-000000000001");
    assert_eq!((spec.name.as_str(), spec.namespace.as_str()), ("c", "ns"));
    assert_eq!(spec.results.len(), 2);
    assert_eq!(spec.results[1].device, "gpu-1");
    assert_eq!(groups(&spec), vec![(vec![0, 1], Sharing::Exclusive)]);
}

#[test]
fn claim_configs_beat_class_configs_whatever_their_order() {
    // The class config comes later in the list but still ranks below the claim config.
    let c = claim(
        vec![result("gpu", "gpu-0")],
        Some(vec![
            cfg("FromClaim", None, ts("Short")),
            cfg("FromClass", None, ts("Long")),
        ]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![(vec![0], ts_sharing(TimeSliceInterval::Short))]
    );
}

#[test]
fn class_config_applies_when_the_claim_has_none() {
    let c = claim(
        vec![result("gpu", "gpu-0")],
        Some(vec![cfg("FromClass", None, ts("Medium"))]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![(vec![0], ts_sharing(TimeSliceInterval::Medium))]
    );
}

#[test]
fn later_entries_beat_earlier_ones_within_a_source() {
    let c = claim(
        vec![result("gpu", "gpu-0")],
        Some(vec![
            cfg("FromClass", None, ts("Short")),
            cfg("FromClass", None, ts("Long")),
            cfg("FromClaim", None, ts("Short")),
            cfg("FromClaim", None, ts("Medium")),
        ]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![(vec![0], ts_sharing(TimeSliceInterval::Medium))]
    );
}

#[test]
fn request_specific_and_generic_configs() {
    // A generic config ranked above a request-specific one wins (NVIDIA walks by rank only);
    // a request-specific config ranked above the generic one wins for its request.
    let c = claim(
        vec![
            result("a", "gpu-0"),
            result("b", "gpu-1"),
            result("c", "gpu-2"),
        ],
        Some(vec![
            cfg("FromClaim", Some(&["a"]), ts("Short")),
            cfg("FromClaim", None, ts("Long")),
            cfg(
                "FromClaim",
                Some(&["b"]),
                json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 20}),
            ),
        ]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![
            (vec![0, 2], ts_sharing(TimeSliceInterval::Long)),
            (vec![1], mps_pct(20)),
        ]
    );
}

#[test]
fn subrequests_match_their_parent_request() {
    let c = claim(
        vec![result("gpus/h100", "gpu-0"), result("other", "gpu-1")],
        Some(vec![cfg("FromClaim", Some(&["gpus"]), ts("Long"))]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![
            (vec![0], ts_sharing(TimeSliceInterval::Long)),
            (vec![1], Sharing::Exclusive),
        ]
    );
    assert_eq!(spec.results[0].request, "gpus/h100");
}

#[test]
fn generic_configs_apply_only_to_fitting_device_types() {
    let mig = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
                     "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    let c = claim(
        vec![
            result("gpu", "gpu-0"),
            result("mig", "gpu-1-mig-3g20gb-9-4"),
            result("mig", "MIG-4f5e6d7c-0000-0000-0000-000000000000"),
        ],
        Some(vec![
            cfg("FromClaim", None, ts("Short")),
            cfg("FromClaim", None, mig),
        ]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    let mig_mps = MpsSettings {
        active_thread_percentage: Some(40),
        ..MpsSettings::default()
    };
    assert_eq!(
        groups(&spec),
        vec![
            (vec![0], ts_sharing(TimeSliceInterval::Short)),
            (
                vec![1, 2],
                Sharing::Mig {
                    profile: None,
                    mps: Some(mig_mps)
                }
            ),
        ]
    );
    assert!(spec.results[1].is_mig() && !spec.results[0].is_mig());
}

#[test]
fn request_specific_config_of_the_wrong_kind_is_refused() {
    let c = claim(
        vec![result("gpu", "gpu-2-mig-3g20gb-9-4")],
        Some(vec![cfg("FromClaim", Some(&["gpu"]), ts("Short"))]),
    );
    refused(
        &c,
        ErrorCode::InvalidConfig,
        &[
            "status.allocation.devices.config[0]",
            "cannot apply GpuConfig to device gpu-2-mig-3g20gb-9-4 of type mig",
        ],
    );
    let mig = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"});
    let c = claim(
        vec![result("gpu", "gpu-2")],
        Some(vec![cfg("FromClaim", Some(&["gpu"]), mig)]),
    );
    refused(
        &c,
        ErrorCode::InvalidConfig,
        &["cannot apply MigDeviceConfig to device gpu-2 of type gpu"],
    );
}

#[test]
fn short_form_fits_both_device_types() {
    let c = claim(
        vec![
            result("gpu", "gpu-2-mig-3g20gb-9-4"),
            result("gpu", "gpu-3"),
        ],
        Some(vec![cfg(
            "FromClaim",
            Some(&["gpu"]),
            json!({"sharingMode": "time-slicing", "replicas": 2}),
        )]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![(
            vec![0, 1],
            Sharing::TimeSlicing {
                interval: TimeSliceInterval::Default,
                replicas: Some(2)
            }
        )]
    );
}

#[test]
fn grouping_follows_first_result_order() {
    let c = claim(
        vec![
            result("plain", "gpu-0"),
            result("mps", "gpu-1"),
            result("ts", "gpu-2"),
            result("mps", "gpu-3"),
            result("plain", "gpu-4"),
        ],
        Some(vec![
            cfg("FromClaim", Some(&["ts"]), ts("Long")),
            cfg(
                "FromClaim",
                Some(&["mps"]),
                json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 25}),
            ),
        ]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![
            (vec![0, 4], Sharing::Exclusive),
            (vec![1, 3], mps_pct(25)),
            (vec![2], ts_sharing(TimeSliceInterval::Long)),
        ]
    );
}

#[test]
fn two_identical_configs_make_two_groups() {
    let c = claim(
        vec![result("a", "gpu-0"), result("b", "gpu-1")],
        Some(vec![
            cfg("FromClaim", Some(&["a"]), ts("Short")),
            cfg("FromClaim", Some(&["b"]), ts("Short")),
        ]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(spec.groups.len(), 2);
}

#[test]
fn other_drivers_are_ignored() {
    let mut c = claim(
        vec![
            json!({"request": "nic", "driver": "dra.net", "pool": "elsewhere", "device": "eth1"}),
            result("gpu", "gpu-0"),
        ],
        Some(vec![
            json!({"source": "FromClaim", "opaque": {"driver": "dra.net", "parameters": {"anything": true}}}),
            json!({"source": "FromClass", "requests": ["gpu"]}),
            cfg("FromClaim", None, ts("Long")),
        ]),
    );
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(spec.results.len(), 1);
    assert_eq!(spec.results[0].device, "gpu-0");
    assert_eq!(
        groups(&spec),
        vec![(vec![0], ts_sharing(TimeSliceInterval::Long))]
    );

    // Only other drivers' results: nothing for us.
    c["status"]["allocation"]["devices"]["results"] = json!([
        {"request": "nic", "driver": "dra.net", "pool": "x", "device": "eth1"}
    ]);
    refused(
        &c,
        ErrorCode::InvalidRequest,
        &["no device allocated by driver gpu.nvidia.com"],
    );
}

#[test]
fn unused_configs_of_ours_are_still_validated() {
    let c = claim(
        vec![result("gpu", "gpu-0")],
        Some(vec![
            cfg(
                "FromClaim",
                Some(&["unused"]),
                json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 0}),
            ),
            cfg("FromClaim", Some(&["gpu"]), ts("Long")),
        ]),
    );
    refused(
        &c,
        ErrorCode::InvalidConfig,
        &["status.allocation.devices.config[0].opaque.parameters.mpsActiveThreadPercentage"],
    );
}

#[test]
fn spec_configs_are_used_when_status_has_none() {
    let mut c = claim(vec![result("gpu", "gpu-0")], None);
    c["spec"]["devices"]["config"] = json!([
        {"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": ts("Short")}}
    ]);
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(
        groups(&spec),
        vec![(vec![0], ts_sharing(TimeSliceInterval::Short))]
    );

    // A present but empty status list wins over the spec.
    c["status"]["allocation"]["devices"]["config"] = json!([]);
    let spec = parse_claim(&c, &ctx()).expect("valid");
    assert_eq!(groups(&spec), vec![(vec![0], Sharing::Exclusive)]);

    // Errors in spec configs name the spec path.
    c["status"]["allocation"]["devices"]
        .as_object_mut()
        .map(|m| m.remove("config"));
    c["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["strategy"] =
        json!("Timeslicing");
    refused(
        &c,
        ErrorCode::InvalidConfig,
        &[
            "spec.devices.config[0].opaque.parameters.sharing.strategy",
            "\"Timeslicing\"",
        ],
    );
}

#[test]
fn claim_envelope_refusals() {
    let good = claim(vec![result("gpu", "gpu-0")], None);
    for (field, value, needle) in [
        (
            "apiVersion",
            json!("resource.k8s.io/v1alpha3"),
            "resource.k8s.io/v1alpha3",
        ),
        ("apiVersion", Value::Null, "apiVersion"),
        (
            "kind",
            json!("ResourceClaimTemplate"),
            "ResourceClaimTemplate",
        ),
        ("kind", json!(7), "kind"),
    ] {
        let mut c = good.clone();
        c[field] = value;
        refused(&c, ErrorCode::InvalidRequest, &[field, needle]);
    }
    for version in ["resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"] {
        let mut c = good.clone();
        c["apiVersion"] = json!(version);
        assert!(parse_claim(&c, &ctx()).is_ok(), "{version}");
    }
    refused(
        &json!([1]),
        ErrorCode::InvalidRequest,
        &["must be an object"],
    );

    let mut c = good.clone();
    c["metadata"].as_object_mut().map(|m| m.remove("uid"));
    refused(&c, ErrorCode::InvalidRequest, &["metadata.uid", "required"]);
    let mut c = good.clone();
    c["metadata"]["uid"] = json!("../../../etc/cron.d/x");
    refused(
        &c,
        ErrorCode::InvalidRequest,
        &["metadata.uid", "../../../etc/cron.d/x"],
    );
}

#[test]
fn allocation_refusals() {
    let mut c = claim(vec![result("gpu", "gpu-0")], None);
    c["status"]["allocation"]["devices"]["results"] = json!([]);
    refused(
        &c,
        ErrorCode::InvalidRequest,
        &["no device allocated by driver"],
    );
    c["status"] = json!({});
    refused(&c, ErrorCode::InvalidRequest, &["is not allocated"]);
    c.as_object_mut().map(|m| m.remove("status"));
    refused(&c, ErrorCode::InvalidRequest, &["is not allocated"]);

    let mut c = claim(vec![result("gpu", "gpu-0")], None);
    c["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("ip-10-9-9-9");
    refused(
        &c,
        ErrorCode::WrongNode,
        &[
            "status.allocation.devices.results[0].pool",
            "ip-10-9-9-9",
            NODE,
        ],
    );
    let mut c = claim(vec![result("gpu", "gpu-0")], None);
    c["status"]["allocation"]["devices"]["results"][0]["device"] = json!(3);
    refused(
        &c,
        ErrorCode::InvalidRequest,
        &["status.allocation.devices.results[0].device"],
    );

    let c = claim(
        vec![result("gpu", "gpu-0")],
        Some(vec![
            json!({"source": "FromSomewhere", "opaque": {"driver": "gpu.nvidia.com", "parameters": ts("Long")}}),
        ]),
    );
    refused(
        &c,
        ErrorCode::InvalidRequest,
        &[
            "status.allocation.devices.config[0].source",
            "FromSomewhere",
        ],
    );
    let c = claim(
        vec![result("gpu", "gpu-0")],
        Some(vec![
            json!({"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com"}}),
        ]),
    );
    refused(
        &c,
        ErrorCode::InvalidConfig,
        &["status.allocation.devices.config[0].opaque.parameters"],
    );
    let c = claim(
        vec![result("gpu", "gpu-0")],
        Some(vec![cfg(
            "FromClaim",
            None,
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"}),
        )]),
    );
    refused(&c, ErrorCode::Unsupported, &["VfioDeviceConfig"]);
}

#[test]
fn claim_uids() {
    for ok in [
        "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01",
        "a",
        "A.b_c-9",
        &"x".repeat(MAX_CLAIM_UID_BYTES),
    ] {
        assert_eq!(validate_claim_uid(ok), Ok(()), "{ok}");
    }
    for bad in [
        "",
        "../../../etc/cron.d/x",
        "a/b",
        "-abc",
        "abc.",
        "_a",
        "a b",
        "a\nb",
        "uid€",
        "..",
        &"x".repeat(MAX_CLAIM_UID_BYTES + 1),
    ] {
        let err = validate_claim_uid(bad).expect_err(bad);
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert!(err.message.contains("metadata.uid"), "{}", err.message);
    }
    let err = validate_claim_uid("../../../etc/cron.d/x").expect_err("traversal");
    assert!(
        err.message.contains("../../../etc/cron.d/x"),
        "{}",
        err.message
    );
}

#[test]
fn documents_in_json_and_yaml() {
    let json_text = r#"{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}"#;
    assert_eq!(
        parse_claim_document(json_text),
        Ok(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"}))
    );
    let yaml = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nspec:\n  x: {1: 20Gi, \"2\": 1e9}\n  n: 30\n";
    let v = parse_claim_document(yaml).expect("yaml");
    assert_eq!(v["kind"], json!("ResourceClaim"));
    assert_eq!(v["spec"]["x"]["1"], json!("20Gi"));
    assert_eq!(v["spec"]["n"], json!(30));
    assert!(v["spec"]["x"]["2"].is_number());

    for (bad, needle) in [
        ("", "empty"),
        ("  \n", "empty"),
        ("{\"a\": [1, 2}", "not valid JSON"),
        ("a: [1\nb: 2", "not valid YAML"),
        ("a: 1\n---\nb: 2\n", "not valid YAML"),
        ("spec:\n  p: .nan\n", "spec.p: not a finite number"),
        ("spec:\n  l: [1, -.inf]\n", "spec.l[1]: not a finite number"),
    ] {
        let err = parse_claim_document(bad).expect_err(bad);
        assert_eq!(err.code, ErrorCode::InvalidRequest);
        assert!(err.message.contains(needle), "{}", err.message);
    }
}

#[test]
fn yaml_integer_keys_become_device_indices() {
    let yaml = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {uid: u-1}
status:
  allocation:
    devices:
      results:
      - {request: g, driver: gpu.nvidia.com, pool: ip-10-0-1-23.us-west-2.compute.internal, device: gpu-4}
      - {request: g, driver: gpu.nvidia.com, pool: ip-10-0-1-23.us-west-2.compute.internal, device: gpu-5}
      config:
      - source: FromClaim
        opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing:
              strategy: MPS
              mpsConfig:
                defaultPinnedDeviceMemoryLimit: 1e9
                defaultPerDevicePinnedMemoryLimit: {1: 1.5Gi}
"#;
    let spec = parse_claim(&parse_claim_document(yaml).expect("yaml"), &ctx()).expect("valid");
    let Sharing::Mps { settings, .. } = &spec.groups[0].sharing else {
        panic!("expected MPS, got {:?}", spec.groups[0].sharing);
    };
    assert_eq!(settings.default_pinned_limit_mib, Some(953));
    assert_eq!(
        settings.per_device_pinned_limit_mib,
        BTreeMap::from([(DeviceKey::Index(1), 1536)])
    );
}

fn uuids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn pinned_limits_resolve_per_ordinal() {
    let a = "GPU-1111aaaa-0000-0000-0000-000000000000";
    let b = "GPU-2222bbbb-0000-0000-0000-000000000000";
    let c = "GPU-3333cccc-0000-0000-0000-000000000000";
    let settings = MpsSettings {
        default_pinned_limit_mib: Some(8192),
        per_device_pinned_limit_mib: BTreeMap::from([
            (DeviceKey::Index(1), 20480),
            (DeviceKey::Uuid(c.to_owned()), 12288),
        ]),
        ..MpsSettings::default()
    };
    assert_eq!(
        settings.resolve_pinned_limits(&uuids(&[a, b, c])),
        Ok(vec![Some(8192), Some(20480), Some(12288)])
    );
    // No default: unnamed devices have no limit.
    let only_per_device = MpsSettings {
        per_device_pinned_limit_mib: BTreeMap::from([(DeviceKey::Index(0), 100)]),
        ..MpsSettings::default()
    };
    assert_eq!(
        only_per_device.resolve_pinned_limits(&uuids(&[a, b])),
        Ok(vec![Some(100), None])
    );
    assert_eq!(
        MpsSettings::default().resolve_pinned_limits(&uuids(&[a])),
        Ok(vec![None])
    );
    assert_eq!(
        MpsSettings::default().resolve_pinned_limits(&[]),
        Ok(vec![])
    );

    // Out of range index, unknown UUID, two keys for one device.
    let err = settings
        .resolve_pinned_limits(&uuids(&[a]))
        .expect_err("index 1 of a 1-GPU group");
    assert_eq!(err.code, ErrorCode::InvalidConfig);
    assert!(
        err.message.contains("defaultPerDevicePinnedMemoryLimit"),
        "{}",
        err.message
    );
    assert!(err.message.contains("\"1\""), "{}", err.message);
    let err = settings
        .resolve_pinned_limits(&uuids(&[a, b]))
        .expect_err("UUID c is not in the group");
    assert_eq!(err.code, ErrorCode::InvalidConfig);
    assert!(err.message.contains(c), "{}", err.message);
    let twice = MpsSettings {
        per_device_pinned_limit_mib: BTreeMap::from([
            (DeviceKey::Index(0), 1),
            (DeviceKey::Uuid(a.to_owned()), 2),
        ]),
        ..MpsSettings::default()
    };
    let err = twice
        .resolve_pinned_limits(&uuids(&[a, b]))
        .expect_err("two keys for device 0");
    assert!(
        err.message.contains("both name device 0"),
        "{}",
        err.message
    );
}

/// `shared/cases` beside the repository, if present.
fn cases_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/cases/claims");
    if dir.is_dir() {
        Some(dir)
    } else {
        println!(
            "note: {} not found; shared claim cases skipped",
            dir.display()
        );
        None
    }
}

fn load(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).expect("readable case file");
    parse_claim_document(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn devices(spec: &ClaimSpec, group: usize) -> Vec<&str> {
    spec.groups[group]
        .results
        .iter()
        .map(|&i| spec.results[i].device.as_str())
        .collect()
}

#[test]
fn shared_valid_cases() {
    let Some(dir) = cases_dir() else { return };
    let mut seen = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("cases dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "json"))
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 name")
            .to_owned();
        let spec = parse_claim(&load(&path), &ctx())
            .unwrap_or_else(|e| panic!("{name}: {} {}", e.code, e.message));
        assert!(spec.results.iter().all(|r| r.pool == NODE), "{name}");
        match name.as_str() {
            "seed-mps" => {
                assert_eq!(spec.groups.len(), 1);
                assert_eq!(devices(&spec, 0), ["gpu-0"]);
                assert_eq!(spec.groups[0].sharing, mps_pct(50));
            }
            "nvidia-mps-2gpu" => {
                assert_eq!(spec.groups.len(), 1);
                assert_eq!(devices(&spec, 0), ["gpu-4", "gpu-5"]);
                let settings = MpsSettings {
                    active_thread_percentage: Some(30),
                    default_pinned_limit_mib: Some(8192),
                    per_device_pinned_limit_mib: BTreeMap::from([(DeviceKey::Index(1), 20480)]),
                    multi_user: false,
                };
                let Sharing::Mps {
                    settings: got,
                    replicas: None,
                } = &spec.groups[0].sharing
                else {
                    panic!("{name}: {:?}", spec.groups[0].sharing);
                };
                assert_eq!(got, &settings);
                assert_eq!(
                    got.resolve_pinned_limits(&uuids(&["GPU-a", "GPU-b"])),
                    Ok(vec![Some(8192), Some(20480)])
                );
            }
            "nvidia-two-requests" => {
                assert_eq!(spec.groups.len(), 2);
                assert_eq!(devices(&spec, 0), ["gpu-6"]);
                assert_eq!(spec.groups[0].sharing, ts_sharing(TimeSliceInterval::Short));
                assert_eq!(devices(&spec, 1), ["gpu-7"]);
                assert_eq!(spec.groups[1].sharing, mps_pct(50));
                assert_eq!(spec.results[1].request, "mps-gpu");
            }
            "seed-timeslicing" => {
                assert_eq!(devices(&spec, 0), ["gpu-1"]);
                assert_eq!(
                    groups(&spec),
                    vec![(
                        vec![0],
                        Sharing::TimeSlicing {
                            interval: TimeSliceInterval::Default,
                            replicas: Some(4)
                        }
                    )]
                );
            }
            "seed-basic-v1beta1" => {
                assert_eq!(devices(&spec, 0), ["gpu-3"]);
                assert_eq!(groups(&spec), vec![(vec![0], Sharing::Exclusive)]);
                assert_eq!(spec.namespace, "gpu-test1");
            }
            "seed-mig-3g20gb" => {
                assert_eq!(devices(&spec, 0), ["gpu-2-mig-3g20gb-9-4"]);
                assert_eq!(
                    groups(&spec),
                    vec![(
                        vec![0],
                        Sharing::Mig {
                            profile: Some("3g.20gb".into()),
                            mps: None
                        }
                    )]
                );
            }
            other => panic!("new valid case {other}: add its expected outcome here"),
        }
        seen.push(name);
    }
    assert_eq!(seen.len(), 6, "cases seen: {seen:?}");
}

#[test]
fn shared_invalid_cases() {
    let Some(dir) = cases_dir() else { return };
    let dir = dir.join("invalid");
    let expected: BTreeMap<String, String> = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).expect("expected.json"),
    )
    .expect("expected.json is a map");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("invalid dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "expected.json")
        .collect();
    files.sort();
    assert_eq!(
        files,
        expected.keys().cloned().collect::<Vec<_>>(),
        "every invalid case has an expected code"
    );
    for (file, code) in &expected {
        let claim = load(&dir.join(file));
        let outcome = parse_claim(&claim, &ctx());
        match file.as_str() {
            // Decided by the daemon's device list: the claim itself parses.
            "unknown-device.json" => {
                assert_eq!(code, "UnknownDevice");
                let spec = outcome.expect("parses; the daemon refuses gpu-99");
                assert_eq!(spec.results[0].device, "gpu-99");
            }
            // Only refused once the group's UUIDs are known (one GPU, key "7").
            "mps-device-index-out-of-range.json" => {
                let spec = outcome.expect("parses; refused when limits are resolved");
                let Sharing::Mps { settings, .. } = &spec.groups[0].sharing else {
                    panic!("{file}: {:?}", spec.groups[0].sharing);
                };
                assert_eq!(
                    settings.per_device_pinned_limit_mib,
                    BTreeMap::from([(DeviceKey::Index(7), 4096)])
                );
                let err = settings
                    .resolve_pinned_limits(&uuids(&["GPU-5f3c0c52-0000-0000-0000-000000000000"]))
                    .expect_err("index 7 of a 1-GPU group");
                assert_eq!(err.code.as_str(), code);
                assert!(err.message.contains("\"7\""), "{}", err.message);
            }
            _ => {
                let err = outcome.expect_err(file);
                assert_eq!(err.code.as_str(), code, "{file}: {}", err.message);
                let needle = match file.as_str() {
                    "claim-uid-path-traversal.json" => "../../../etc/cron.d/x",
                    "gpuconfig-unknown-field.json" => "opaque.parameters.replicas",
                    "mps-limit-too-low.json" => "value set too low",
                    "mps-percentage-101.json" => "defaultActiveThreadPercentage: value 101",
                    "mps-with-timeslicing-config.json" => "sharing.timeSlicingConfig",
                    "other-node-pool.json" => "ip-10-9-9-9.us-west-2.compute.internal",
                    "strategy-lowercase.json" => "\"mps\"",
                    "ts-unknown-interval.json" => "\"VeryLong\"",
                    other => panic!("new invalid case {other}: add the message it must carry"),
                };
                assert!(err.message.contains(needle), "{file}: {}", err.message);
            }
        }
    }
}

#[test]
fn request_names_must_be_dns_labels() {
    let ctx = ParseContext::new("node-a");
    let claim = |request: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"uid": "u"},
               "status": {"allocation": {"devices": {"results": [
                   {"request": request, "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"}]}}}})
    };
    for good in ["gpu", "gpus-2", "req/sub"] {
        assert!(parse_claim(&claim(good), &ctx).is_ok(), "{good}");
    }
    for bad in ["a b", "c:d", "a_b", "A", "-a", "a/b/c", "a/", ""] {
        let err = parse_claim(&claim(bad), &ctx).expect_err(bad);
        assert_eq!(err.code, ErrorCode::InvalidRequest, "{bad}");
        assert!(
            err.message.contains("results[0].request"),
            "{}",
            err.message
        );
    }
}
