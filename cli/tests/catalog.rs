//! Every node profile of the catalog loads, renders the `gpushare gpus` table stored in
//! `tests/data/gpus/<profile>.txt`, and yields a ResourceSlice the API server would accept.
//! Regenerate the tables after a deliberate change with `GPUSHARE_BLESS=1`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::{Path, PathBuf};

use gpushare::gpu::{catalog, GpuBackend, SimulatedBackend};
use gpushare_cli::{gpus_table, gpus_table_wide, TABLE_WIDTH};
use gpushare_proto::GpuInfo;
use gpushare_slice as resource_slice;

/// The node name the end-to-end harness uses, so its daemon's table matches these files.
const NODE: &str = "ip-10-0-1-23.us-west-2.compute.internal";

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gpus")
        .join(format!("{name}.txt"))
}

/// What a fresh daemon's `list_gpus` holds for `profile`.
fn fresh_node(profile: &str) -> Vec<GpuInfo> {
    let b = SimulatedBackend::without_device_nodes(profile, NODE, Path::new("/x")).unwrap();
    b.gpus()
        .iter()
        .map(|g| GpuInfo {
            compute_mode: b.compute_mode(&g.uuid).unwrap(),
            time_slice: b.time_slice(&g.uuid).unwrap(),
            ..g.info()
        })
        .collect()
}

#[test]
fn every_catalog_entry_renders_its_stored_table() {
    let bless = std::env::var_os("GPUSHARE_BLESS").is_some();
    let profiles = catalog::catalog().unwrap();
    assert!(profiles.len() >= 11);
    let mut mismatched = Vec::new();
    for p in &profiles {
        let table = gpus_table(&fresh_node(&p.name));
        let path = data(&p.name);
        if bless {
            std::fs::write(&path, &table).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (GPUSHARE_BLESS=1 writes it)", path.display()));
        if table != want {
            mismatched.push(format!("{}:\n{table}\nwanted:\n{want}", p.name));
        }
    }
    assert!(mismatched.is_empty(), "{}", mismatched.join("\n"));
}

#[test]
fn every_catalog_entry_fits_the_table_width_and_wide_shows_what_it_leaves_out() {
    for p in catalog::catalog().unwrap() {
        let gpus = fresh_node(&p.name);
        let narrow = gpus_table(&gpus);
        for line in narrow.lines() {
            assert!(line.chars().count() <= TABLE_WIDTH, "{}:\n{narrow}", p.name);
        }
        let wide = gpus_table_wide(&gpus);
        for g in &gpus {
            assert!(!narrow.contains(&g.uuid), "{}:\n{narrow}", p.name);
            let row = wide
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{} ", g.name)))
                .unwrap_or_else(|| panic!("{}: no {}:\n{wide}", p.name, g.name));
            for cell in [&g.uuid, &g.architecture, &g.cuda_compute_capability] {
                assert!(row.contains(cell.as_str()), "{}: {cell} in {row}", p.name);
            }
            assert!(row.contains(&format!("{:?}", g.compute_mode)), "{row}");
        }
    }
}

#[test]
fn every_catalog_entry_yields_a_valid_resource_slice() {
    for p in catalog::catalog().unwrap() {
        let gpus = fresh_node(&p.name);
        let slice = resource_slice::build(&gpus, NODE, "gpu.nvidia.com");
        resource_slice::validate(&slice).unwrap_or_else(|e| panic!("{}: {e:?}", p.name));
        assert_eq!(slice.spec.devices.len(), gpus.len(), "{}", p.name);
    }
}

#[test]
fn p4d_resource_slice_has_nvidia_s_attributes_and_round_trips() {
    let gpus = fresh_node("p4d.24xlarge");
    let yaml =
        gpushare_cli::resource_slice_yaml(&gpus, NODE, gpushare_slice::ApiVersion::V1).unwrap();
    let slice: resource_slice::ResourceSlice = serde_norway::from_str(&yaml).unwrap();
    resource_slice::validate(&slice).unwrap();
    assert_eq!(slice.api_version, "resource.k8s.io/v1");
    assert_eq!(slice.spec.driver, "gpu.nvidia.com");
    assert_eq!(slice.spec.pool.name, NODE);
    assert_eq!(slice.spec.node_name, NODE);
    assert_eq!(slice.spec.devices.len(), 8);
    let d = &slice.spec.devices[5];
    assert_eq!(d.name, "gpu-5");
    let attr = |k: &str| d.attributes.get(k).unwrap_or_else(|| panic!("{k} missing"));
    assert_eq!(attr("type").string.as_deref(), Some("gpu"));
    assert_eq!(attr("uuid").string.as_deref(), Some(gpus[5].uuid.as_str()));
    assert_eq!(
        attr("productName").string.as_deref(),
        Some("NVIDIA A100-SXM4-40GB")
    );
    assert_eq!(attr("architecture").string.as_deref(), Some("Ampere"));
    assert_eq!(
        attr("cudaComputeCapability").version.as_deref(),
        Some("8.0.0")
    );
    assert_eq!(attr("driverVersion").version.as_deref(), Some("570.172.8"));
    assert_eq!(attr("cudaDriverVersion").version.as_deref(), Some("12.8.0"));
    assert_eq!(
        attr("resource.kubernetes.io/pciBusID").string.as_deref(),
        Some("0000:15:00.0")
    );
    assert_eq!(attr("resource.kubernetes.io/numaNode").int, Some(1));
    assert_eq!(d.capacity["memory"].value, "40Gi");
}

#[test]
fn mig_enabled_gpus_publish_their_mig_devices_instead() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/node-profile-mig.toml"),
    )
    .unwrap();
    let p = catalog::NodeProfile::parse(&text, Path::new("node-profile-mig.toml")).unwrap();
    let gpus: Vec<GpuInfo> = p.gpus(NODE).iter().map(|g| g.info()).collect();
    let slice = resource_slice::build(&gpus, NODE, "gpu.nvidia.com");
    resource_slice::validate(&slice).unwrap();
    let names: Vec<&str> = slice.spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0-mig-3g20gb-9-0",
            "gpu-0-mig-2g10gb-14-4",
            "gpu-0-mig-1g5gb-19-6",
            "gpu-1"
        ]
    );
    let m = &slice.spec.devices[0];
    assert_eq!(m.attributes["type"].string.as_deref(), Some("mig"));
    assert_eq!(
        m.attributes["parentUUID"].string.as_deref(),
        Some(gpus[0].uuid.as_str())
    );
    assert_eq!(m.attributes["profile"].string.as_deref(), Some("3g.20gb"));
    assert_eq!(m.capacity["multiprocessors"].value, "42");
    assert_eq!(m.capacity["memory"].value, "19968Mi");
    let slices: Vec<&str> = m
        .capacity
        .keys()
        .filter(|k| k.starts_with("memorySlice"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        slices,
        [
            "memorySlice0",
            "memorySlice1",
            "memorySlice2",
            "memorySlice3"
        ]
    );
}

/// Every document of a YAML stream.
fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

#[test]
fn a_partitionable_pool_for_1_33_is_written_in_a_version_1_33_serves() {
    use gpushare_slice::{ApiVersion, Layout};
    // gpu-2 in MIG mode: its slices consume its counter set.
    let profile = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../daemon/examples/profiles/p4d.24xlarge-mig2.toml");
    // As a running gpushared lists them: with what each GPU can be cut into.
    let gpus: Vec<GpuInfo> = fresh_node(profile.to_str().unwrap())
        .into_iter()
        .map(|mut g| {
            g.mig_partitions = gpushare::mig::partitions::for_gpu(
                &g.product_name,
                g.mig_enabled,
                g.mig_enabled,
                &g.mig_devices,
            );
            g
        })
        .collect();
    let version = gpushare_cli::slice_api_version(None, Some(33)).unwrap();
    assert_eq!(version, ApiVersion::V1beta2);
    let pool = |version| {
        documents(
            &gpushare_cli::resource_pool_yaml(&gpus, NODE, Layout::partitionable(33), version)
                .unwrap(),
        )
    };
    // How many devices consume counters, where `under_basic` says they are.
    let consuming = |docs: &[serde_json::Value], under_basic: bool| -> usize {
        docs.iter()
            .flat_map(|d| d["spec"]["devices"].as_array().cloned().unwrap_or_default())
            .filter(|d| {
                let at = if under_basic { &d["basic"] } else { d };
                at["consumesCounters"].is_array()
            })
            .count()
    };
    let v1beta2 = pool(version);
    assert!(v1beta2
        .iter()
        .all(|d| d["apiVersion"] == "resource.k8s.io/v1beta2"));
    assert!(consuming(&v1beta2, false) > 0, "{v1beta2:?}");
    // v1beta1 (1.33 serves it too): counters consumed under `basic`, as the attributes.
    let v1beta1 = pool(ApiVersion::V1beta1);
    assert!(v1beta1
        .iter()
        .all(|d| d["apiVersion"] == "resource.k8s.io/v1beta1"));
    assert_eq!(consuming(&v1beta1, false), 0, "{v1beta1:?}");
    assert_eq!(consuming(&v1beta1, true), consuming(&v1beta2, false));
}
