//! deployments/, which no API server here can apply: every manifest parsed into the
//! k8s-openapi types with nothing dropped (a round trip equals the file), every DeviceClass's
//! CEL selector evaluated with a CEL library against the devices we publish (it selects ours
//! and nothing else), and the image built FROM scratch by podman and run with `--help`.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use gpushare_proto::{GpuInfo, MigDeviceInfo};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::DeviceClass;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn deployments() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deployments")
}

/// Every YAML document of every manifest: (file, document).
pub fn documents() -> Vec<(String, Value)> {
    documents_in(&deployments())
}

/// Every YAML document of every `.yaml` file directly in `dir`: (file, document).
fn documents_in(dir: &Path) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap();
            if !v.is_null() {
                out.push((f.file_name().unwrap().to_string_lossy().into_owned(), v));
            }
        }
    }
    out
}

use serde::Deserialize;

fn round_trip<T: DeserializeOwned + Serialize>(file: &str, doc: &Value) {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{file}: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    assert_eq!(
        &back, doc,
        "{file}: a field was dropped or changed by the round trip"
    );
}

#[test]
fn every_manifest_round_trips_through_the_k8s_openapi_types() {
    let docs = documents();
    let mut kinds = Vec::new();
    for (file, doc) in &docs {
        let kind = doc["kind"].as_str().unwrap().to_string();
        match kind.as_str() {
            "Namespace" => round_trip::<Namespace>(file, doc),
            "ServiceAccount" => round_trip::<ServiceAccount>(file, doc),
            "ClusterRole" => round_trip::<ClusterRole>(file, doc),
            "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(file, doc),
            "DaemonSet" => round_trip::<DaemonSet>(file, doc),
            "ValidatingAdmissionPolicy" => round_trip::<ValidatingAdmissionPolicy>(file, doc),
            "ValidatingAdmissionPolicyBinding" => {
                round_trip::<ValidatingAdmissionPolicyBinding>(file, doc)
            }
            "DeviceClass" => round_trip::<DeviceClass>(file, doc),
            "NetworkPolicy" => round_trip::<NetworkPolicy>(file, doc),
            other => panic!("{file}: no typed check for kind {other}"),
        }
        kinds.push(kind);
    }
    for k in [
        "DaemonSet",
        "ClusterRole",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "DeviceClass",
        "NetworkPolicy",
        "Namespace",
    ] {
        assert!(kinds.iter().any(|x| x == k), "no {k} in deployments/");
    }
    // The DaemonSet mounts kubelet's plugin dirs and gpushared's socket dir, keeps no
    // capability and gets its node name from the downward API.
    let ds = &docs
        .iter()
        .find(|(_, d)| d["kind"] == "DaemonSet")
        .unwrap()
        .1;
    let paths: Vec<&str> = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/var/lib/kubelet/plugins",
            "/var/lib/kubelet/plugins_registry",
            "/run/gpushare"
        ]
    );
    let c = &ds["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(c["securityContext"]["privileged"], false);
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
}

fn gpu(minor: u32) -> GpuInfo {
    serde_json::from_value(json!({
        "name": format!("gpu-{minor}"), "minor": minor,
        "uuid": format!("GPU-3a6c1f0e-5b2d-4e8f-9a7c-0d1e2f3a4b{minor:02}"),
        "product_name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960,
        "compute_mode": "Default", "time_slice": "Default", "sharing": "Free", "claims": [],
        "brand": "Nvidia", "architecture": "Ampere", "cuda_compute_capability": "8.0",
        "driver_version": "570.172.08", "cuda_driver_version": "12.8",
        "pci_bus_id": format!("00000000:1{minor}:00.0"), "numa_node": 0, "mig_capable": true
    }))
    .unwrap()
}

/// A CEL `device` as the scheduler builds it from a published device: `driver`, attributes
/// and capacity by domain (unqualified names belong to the driver's domain).
fn cel_device(driver: &str, d: &gpushare_slice::Device) -> Value {
    let mut attributes = serde_json::Map::new();
    for (k, a) in &d.attributes {
        let (domain, name) = k.split_once('/').unwrap_or((driver, k));
        let v = serde_json::to_value(a).unwrap();
        let value = v.as_object().unwrap().values().next().unwrap().clone();
        attributes
            .entry(domain.to_string())
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .unwrap()
            .insert(name.to_string(), value);
    }
    json!({"driver": driver, "attributes": attributes, "allowMultipleAllocations": false})
}

fn selects(expression: &str, device: &Value) -> bool {
    let program =
        cel::Program::compile(expression).unwrap_or_else(|e| panic!("{expression}: {e:?}"));
    let mut ctx = cel::Context::default();
    ctx.add_variable("device", device.clone()).unwrap();
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => b,
        // The scheduler treats a runtime error (e.g. a missing attribute domain) as no match.
        Ok(other) => panic!("{expression} gave {other:?}"),
        Err(_) => false,
    }
}

#[test]
fn every_device_class_selects_our_devices_and_no_others() {
    // A node with whole GPUs and one GPU in MIG mode with a 3g.20gb device.
    let mut mig = gpu(2);
    mig.mig_enabled = true;
    mig.mig_devices = vec![MigDeviceInfo {
        uuid: "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
        profile: "3g.20gb".into(),
        gi_profile_id: 9,
        placement_start: 4,
        memory_slices: 4,
        memory_mib: 19968,
        multiprocessors: 42,
        copy_engines: 3,
        decoders: 2,
        encoders: 0,
        jpeg_engines: 0,
        ofa_engines: 0,
        gi_id: Some(2),
        owner: None,
    }];
    let gpus = [gpu(0), gpu(1), mig];
    let published = gpushare_slice::build_pool(&gpus, "node-a", "gpu.nvidia.com", 1);
    let devices: Vec<_> = published
        .iter()
        .flat_map(|s| s.spec.devices.clone())
        .collect();
    // Devices that are not ours: NVIDIA's compute-domain driver, another vendor's GPU.
    let others = [
        json!({"driver": "compute-domain.nvidia.com", "attributes": {"compute-domain.nvidia.com": {"type": "channel"}}}),
        json!({"driver": "gpu.example.com", "attributes": {"gpu.example.com": {"type": "gpu"}}}),
    ];
    let classes: Vec<(String, String)> = documents()
        .into_iter()
        .filter(|(_, d)| d["kind"] == "DeviceClass")
        .map(|(_, d)| {
            (
                d["metadata"]["name"].as_str().unwrap().to_string(),
                d["spec"]["selectors"][0]["cel"]["expression"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    for (name, expr) in &classes {
        let want_type = match name.as_str() {
            "gpu.nvidia.com" => "gpu",
            "mig.nvidia.com" => "mig",
            other => panic!("unknown class {other}"),
        };
        let mut picked = Vec::new();
        for d in &devices {
            let is_type = d.attributes["type"].string.as_deref() == Some(want_type);
            assert_eq!(
                selects(expr, &cel_device("gpu.nvidia.com", d)),
                is_type,
                "{name} on {}",
                d.name
            );
            if is_type {
                picked.push(d.name.clone());
            }
        }
        assert!(!picked.is_empty(), "{name} selects none of our devices");
        for o in &others {
            assert!(
                !selects(expr, o),
                "{name} selects a device that is not ours: {o}"
            );
        }
    }
}

#[test]
fn the_image_builds_from_the_debug_binary_and_runs() {
    use gpushare_e2e::{bin, is_root, need, which};
    if !need(is_root(), "root")
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let tag = format!("localhost/gpushare-dra:test-{}", std::process::id());
    let out = std::process::Command::new(deployments().join("build-image.sh"))
        .arg(bin("gpushare-dra"))
        .arg(&tag)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = std::process::Command::new("podman")
        .args([
            "run",
            "--rm",
            "--runtime",
            "runc",
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
            "--network",
            "none",
        ])
        .arg(&tag)
        .arg("--help")
        .output()
        .unwrap();
    let _ = std::process::Command::new("podman")
        .args(["rmi", "-f", &tag])
        .output();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        stdout.contains("Usage: gpushare-dra") && stdout.contains("--remove-slices"),
        "{stdout}"
    );
}

/// The example workloads (`deployments/examples/`): they round-trip through the k8s-openapi
/// types, every pod names a claim or template of its file, and every claim, allocated as the
/// scheduler would allocate it, is accepted by gpushared's claim parser with the sharing the
/// file's comment promises.
#[test]
fn the_examples_round_trip_and_gpushared_accepts_their_claims() {
    use gpushare::config::{parse_claim, ParseContext};
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
    let docs = documents_in(&deployments().join("examples"));
    assert!(docs.len() >= 4, "{docs:?}");
    let ctx = ParseContext {
        node_name: "ip-10-0-1-23.us-west-2.compute.internal".into(),
        drivers: vec!["gpu.nvidia.com".into()],
    };
    let mut strategies = Vec::new();
    for (file, doc) in &docs {
        let claim_spec = match doc["kind"].as_str().unwrap() {
            "Namespace" => {
                round_trip::<Namespace>(file, doc);
                continue;
            }
            "Pod" => {
                round_trip::<Pod>(file, doc);
                pod_claims_exist(file, &docs, &doc["spec"]);
                continue;
            }
            "Deployment" => {
                round_trip::<Deployment>(file, doc);
                pod_claims_exist(file, &docs, &doc["spec"]["template"]["spec"]);
                continue;
            }
            "ResourceClaim" => {
                round_trip::<ResourceClaim>(file, doc);
                doc["spec"].clone()
            }
            "ResourceClaimTemplate" => {
                round_trip::<ResourceClaimTemplate>(file, doc);
                doc["spec"]["spec"].clone()
            }
            other => panic!("{file}: no typed check for kind {other}"),
        };
        // As the API server returns it after the scheduler allocated gpu-0.
        let results: Vec<Value> = claim_spec["devices"]["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                json!({"request": r["name"], "driver": "gpu.nvidia.com",
                "pool": ctx.node_name, "device": "gpu-0"})
            })
            .collect();
        let config: Vec<Value> = claim_spec["devices"]["config"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|mut c| {
                c["source"] = json!("FromClaim");
                c
            })
            .collect();
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": doc["metadata"]["name"], "namespace": doc["metadata"]["namespace"],
                "uid": "0e6f7a7c-1d2b-4c3a-9f8e-7d6c5b4a3921"},
            "spec": claim_spec,
            "status": {"allocation": {"devices": {"results": results, "config": config}}},
        });
        let parsed = parse_claim(&claim, &ctx).unwrap_or_else(|e| panic!("{file}: {e:?}"));
        strategies.push(format!("{file}: {parsed:?}"));
    }
    let all = strategies.join("\n");
    assert!(
        all.contains("mps-shared-claim.yaml") && all.contains("50"),
        "{all}"
    );
    assert!(
        all.contains("gpu-per-pod-template.yaml") && all.contains("Long"),
        "{all}"
    );
}

/// Each claim a pod spec names exists in the same file, as a claim or a template.
fn pod_claims_exist(file: &str, docs: &[(String, Value)], pod: &Value) {
    for rc in pod["resourceClaims"].as_array().unwrap() {
        let (kind, name) = match (
            rc["resourceClaimName"].as_str(),
            rc["resourceClaimTemplateName"].as_str(),
        ) {
            (Some(n), None) => ("ResourceClaim", n),
            (None, Some(n)) => ("ResourceClaimTemplate", n),
            _ => panic!("{file}: {rc}"),
        };
        assert!(
            docs.iter()
                .any(|(f, d)| f == file && d["kind"] == kind && d["metadata"]["name"] == name),
            "{file}: {kind} {name} is not in the file"
        );
        let used = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["resources"]["claims"][0]["name"] == rc["name"]);
        assert!(used, "{file}: no container uses claim {}", rc["name"]);
    }
}
