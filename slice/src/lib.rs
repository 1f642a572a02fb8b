//! The ResourceSlices gpushare publishes for a node, with NVIDIA's attribute names and
//! capacities (NVIDIA/k8s-dra-driver-gpu, `cmd/gpu-kubelet-plugin/deviceinfo.go`), built
//! purely from `gpushared`'s `list_gpus`.
//! One builder for both users: `gpushare gpus -o resourceslice` prints [`build`]'s slice so
//! operators see what the scheduler matches their CEL selectors against, and the DRA kubelet
//! plugin `gpushare-dra` publishes [`build_pool`]'s slices, in the `resource.k8s.io` version
//! the API server serves ([`ApiVersion`], [`ResourceSlice::to_api_object`]).
//!
//! Full GPUs are `gpu-<minor>` devices; a GPU in MIG mode publishes its MIG devices instead
//! (static MIG), named `gpu-<minor>-mig-<profile>-<GI profile id>-<placement start>`.
//! Where the API server keeps partitionable devices, [`build_pool_in`] publishes every MIG
//! slice a GPU can still be cut into, with one counter set per GPU ([`Layout`], the
//! `partitionable` module). [`validate`] checks the API server's rules for names, attribute
//! keys and value types; [`validate_layout`] and [`validate_pool`] its counter rules of each
//! version.

use std::collections::BTreeMap;

use gpushare_proto::{GpuInfo, MigDeviceInfo};
use serde::{Deserialize, Serialize};

mod limits;
mod partitionable;
mod version;

pub use limits::{validate_layout, validate_pool};
pub use partitionable::{
    build_pool_in, counter_set_name, Layout, MAX_COUNTER_DEVICES, MAX_COUNTER_SETS,
};
pub use version::{counters_of_object, devices_of_object, ApiVersion};

/// `apiVersion` of the slice.
pub const API_VERSION: &str = "resource.k8s.io/v1";
/// Most devices one ResourceSlice may hold (`ResourceSliceMaxDevices`).
pub const MAX_DEVICES: usize = 128;
/// Most attributes plus capacities one device may have.
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// Longest string or version attribute value.
pub const MAX_VALUE_LENGTH: usize = 64;

/// A ResourceSlice object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSlice {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// Always `ResourceSlice`.
    pub kind: String,
    /// Name only.
    pub metadata: Metadata,
    /// Driver, pool, node and devices.
    pub spec: ResourceSliceSpec,
}

/// `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// `<node>-<driver>`.
    pub name: String,
}

/// `spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    /// DRA driver name, e.g. `gpu.nvidia.com`.
    pub driver: String,
    /// The pool: one per node, named after it.
    pub pool: Pool,
    /// The node whose devices these are.
    pub node_name: String,
    /// The devices (none in a slice of counter sets only, [`Layout::Split`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
    /// Counter sets the pool's devices draw from (partitionable devices, KEP-4815): one per
    /// GPU that can be cut into MIG slices, `gpu-<minor>-counter-set`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

/// `spec.pool`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// Pool name (the node name).
    pub name: String,
    /// Generation; 1 for a freshly printed slice.
    pub generation: i64,
    /// Slices in the pool.
    pub resource_slice_count: i64,
}

/// One device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Device name, a DNS label.
    pub name: String,
    /// Attributes by qualified name.
    pub attributes: BTreeMap<String, Attribute>,
    /// Capacities by qualified name.
    pub capacity: BTreeMap<String, Capacity>,
    /// What allocating the device takes from the pool's counter sets (partitionable
    /// devices): a MIG slice its capacities and the memory slices of its placement, a whole
    /// GPU all of its GPU's counters.
    #[serde(
        rename = "consumesCounters",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub consumes_counters: Vec<DeviceCounterConsumption>,
}

/// A named set of counters devices draw from (`spec.sharedCounters[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSet {
    /// A DNS label, unique in the pool: `gpu-<minor>-counter-set`.
    pub name: String,
    /// Counters by name (DNS labels): `multiprocessors`, `copy-engines`, `decoders`,
    /// `encoders`, `jpeg-engines`, `ofa-engines`, `memory`, `memory-slice-<i>`.
    pub counters: BTreeMap<String, Counter>,
}

/// A counter's value, a Kubernetes quantity (`98`, `40192Mi`, `1`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// The quantity.
    pub value: String,
}

/// What a device takes from one counter set (`devices[].consumesCounters[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCounterConsumption {
    /// The counter set's name.
    #[serde(rename = "counterSet")]
    pub counter_set: String,
    /// Counters taken, by name, each at most the set's.
    pub counters: BTreeMap<String, Counter>,
}

/// A device attribute: exactly one field set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attribute {
    /// Integer value.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub int: Option<i64>,
    /// Boolean value.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bool: Option<bool>,
    /// String value (at most 64 characters).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub string: Option<String>,
    /// Semantic version 2.0.0 (at most 64 characters).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub version: Option<String>,
}

/// A device capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    /// A Kubernetes quantity, e.g. `40Gi`.
    pub value: String,
}

fn string(s: &str) -> Attribute {
    Attribute {
        string: Some(s.to_string()),
        ..Attribute::default()
    }
}

fn int(i: i64) -> Attribute {
    Attribute {
        int: Some(i),
        ..Attribute::default()
    }
}

fn version(v: &str) -> Attribute {
    Attribute {
        version: Some(semver_of(v)),
        ..Attribute::default()
    }
}

/// NVML's dotted versions as semantic versions the way NVIDIA's driver publishes them:
/// leading zeros dropped and missing parts zero (`570.172.08` → `570.172.8`, `8.0` → `8.0.0`).
/// Anything that is not dot-separated numbers is returned unchanged (and [`validate`] refuses it).
pub fn semver_of(v: &str) -> String {
    let parts: Option<Vec<u64>> = v.split('.').map(|p| p.parse().ok()).collect();
    match parts {
        Some(mut p) if !p.is_empty() && p.len() <= 3 => {
            p.resize(3, 0);
            format!("{}.{}.{}", p[0], p[1], p[2])
        }
        _ => v.to_string(),
    }
}

/// Bytes as a canonical Kubernetes binary-SI quantity: the largest suffix that divides
/// exactly (`42949672960` → `40Gi`, `85520809984` → `81559Mi`).
pub fn quantity(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ei", "Pi", "Ti", "Gi", "Mi", "Ki"];
    for (i, s) in SUFFIXES.iter().enumerate() {
        let unit = 1u64 << (10 * (6 - i));
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{s}", bytes / unit);
        }
    }
    bytes.to_string()
}

/// `00000000:10:1C.0` → `0000:10:1c.0`, the form of the standard attribute
/// `resource.kubernetes.io/pciBusID`.
pub fn pci_bus_id(nvml: &str) -> String {
    let lower = nvml.to_ascii_lowercase();
    match lower.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 => {
            format!("{}:{rest}", &domain[domain.len() - 4..])
        }
        _ => lower,
    }
}

fn common_attributes(g: &GpuInfo) -> BTreeMap<String, Attribute> {
    let mut a = BTreeMap::new();
    a.insert("productName".into(), string(&g.product_name));
    if !g.brand.is_empty() {
        a.insert("brand".into(), string(&g.brand));
    }
    if !g.architecture.is_empty() {
        a.insert("architecture".into(), string(&g.architecture));
    }
    if !g.cuda_compute_capability.is_empty() {
        a.insert(
            "cudaComputeCapability".into(),
            version(&g.cuda_compute_capability),
        );
    }
    if !g.driver_version.is_empty() {
        a.insert("driverVersion".into(), version(&g.driver_version));
    }
    if !g.cuda_driver_version.is_empty() {
        a.insert("cudaDriverVersion".into(), version(&g.cuda_driver_version));
    }
    if !g.pci_bus_id.is_empty() {
        a.insert(
            "resource.kubernetes.io/pciBusID".into(),
            string(&pci_bus_id(&g.pci_bus_id)),
        );
    }
    if let Some(n) = g.numa_node {
        a.insert("resource.kubernetes.io/numaNode".into(), int(i64::from(n)));
    }
    a
}

fn mig_device(g: &GpuInfo, m: &MigDeviceInfo) -> Device {
    let mut attributes = common_attributes(g);
    attributes.insert("type".into(), string("mig"));
    attributes.insert("uuid".into(), string(&m.uuid));
    attributes.insert("parentUUID".into(), string(&g.uuid));
    attributes.insert("profile".into(), string(&m.profile));
    let mut capacity: BTreeMap<String, Capacity> = [
        ("multiprocessors", u64::from(m.multiprocessors)),
        ("copyEngines", u64::from(m.copy_engines)),
        ("decoders", u64::from(m.decoders)),
        ("encoders", u64::from(m.encoders)),
        ("jpegEngines", u64::from(m.jpeg_engines)),
        ("ofaEngines", u64::from(m.ofa_engines)),
    ]
    .into_iter()
    .map(|(k, v)| {
        (
            k.to_string(),
            Capacity {
                value: v.to_string(),
            },
        )
    })
    .collect();
    capacity.insert(
        "memory".into(),
        Capacity {
            value: quantity(m.memory_mib << 20),
        },
    );
    for s in m.placement_start..m.placement_start + m.memory_slices {
        capacity.insert(format!("memorySlice{s}"), Capacity { value: "1".into() });
    }
    Device {
        name: m.device_name(g.minor),
        attributes,
        capacity,
        consumes_counters: Vec::new(),
    }
}

/// The slice for `gpus` on node `node_name`, published by `driver`: every device in one
/// slice named `<node>-<driver>`, generation 1 (what `gpushare gpus -o resourceslice`
/// prints; [`build_pool`] splits a pool at the API's per-slice device limit).
pub fn build(gpus: &[GpuInfo], node_name: &str, driver: &str) -> ResourceSlice {
    slice(
        format!("{node_name}-{driver}"),
        node_name,
        driver,
        1,
        1,
        devices(gpus),
    )
}

/// The pool `driver` publishes for `gpus` on node `node_name` at pool `generation`: the
/// devices of [`devices`] cut into slices of at most [`MAX_DEVICES`] (the API server refuses
/// a larger slice), each slice's `resourceSliceCount` the number of slices. A node without
/// devices gets one empty slice, so the pool still says the driver runs there. Slice names
/// are `<node>-<driver>-<index>`; a publisher that creates slices uses `generateName`
/// instead.
pub fn build_pool(
    gpus: &[GpuInfo],
    node_name: &str,
    driver: &str,
    generation: i64,
) -> Vec<ResourceSlice> {
    let all = devices(gpus);
    let chunks: Vec<Vec<Device>> = if all.is_empty() {
        vec![Vec::new()]
    } else {
        all.chunks(MAX_DEVICES).map(<[Device]>::to_vec).collect()
    };
    let count = i64::try_from(chunks.len()).unwrap_or(i64::MAX);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            slice(
                format!("{node_name}-{driver}-{i}"),
                node_name,
                driver,
                generation,
                count,
                d,
            )
        })
        .collect()
}

fn slice(
    name: String,
    node_name: &str,
    driver: &str,
    generation: i64,
    resource_slice_count: i64,
    devices: Vec<Device>,
) -> ResourceSlice {
    ResourceSlice {
        api_version: API_VERSION.into(),
        kind: "ResourceSlice".into(),
        metadata: Metadata { name },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            pool: Pool {
                name: node_name.into(),
                generation,
                resource_slice_count,
            },
            node_name: node_name.into(),
            devices,
            shared_counters: Vec::new(),
        },
    }
}

/// The devices of a node, in `gpus` order: `gpu-<minor>` for a whole GPU, its MIG devices
/// instead for a GPU in MIG mode. A GPU instance without a compute instance (an empty MIG
/// UUID: what a crash half-way through making or destroying one leaves, or a prepare making
/// one right now) is no device: nothing can run on it, and a scheduler that saw it would keep
/// placing pods whose prepares fail.
pub fn devices(gpus: &[GpuInfo]) -> Vec<Device> {
    let mut devices = Vec::new();
    for g in gpus {
        if g.mig_enabled {
            devices.extend(
                g.mig_devices
                    .iter()
                    .filter(|m| !m.uuid.is_empty())
                    .map(|m| mig_device(g, m)),
            );
            continue;
        }
        devices.push(whole_gpu_device(g));
    }
    devices
}

/// `gpu-<minor>`: the whole GPU with its `memory`.
fn whole_gpu_device(g: &GpuInfo) -> Device {
    let mut attributes = common_attributes(g);
    attributes.insert("type".into(), string("gpu"));
    attributes.insert("uuid".into(), string(&g.uuid));
    let capacity = BTreeMap::from([(
        "memory".to_string(),
        Capacity {
            value: quantity(g.memory_mib << 20),
        },
    )]);
    Device {
        name: g.name.clone(),
        attributes,
        capacity,
        consumes_counters: Vec::new(),
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && s.split('.').all(is_dns_label)
}

fn is_c_identifier(s: &str) -> bool {
    let mut b = s.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && s.len() <= 32
}

/// A qualified attribute or capacity name: an optional DNS-subdomain domain (at most 63
/// characters) and `/`, then a C identifier of at most 32 characters.
fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((domain, id)) => is_dns_subdomain(domain, 63) && is_c_identifier(id),
        None => is_c_identifier(s),
    }
}

fn is_quantity(s: &str) -> bool {
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &s[digits.len()..];
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && [
            "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E",
        ]
        .contains(&suffix)
}

/// Checks the rules the API server applies to a ResourceSlice (names, pool, attribute keys,
/// one value type per attribute, value lengths, semantic versions, quantities, limits).
///
/// # Errors
/// Every violation found, each naming the field path.
pub fn validate(s: &ResourceSlice) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if s.api_version != API_VERSION || s.kind != "ResourceSlice" {
        errs.push(format!("apiVersion/kind: {}/{}", s.api_version, s.kind));
    }
    if !is_dns_subdomain(&s.metadata.name, 253) {
        errs.push(format!(
            "metadata.name {:?}: not a DNS subdomain",
            s.metadata.name
        ));
    }
    if !is_dns_subdomain(&s.spec.driver, 63) {
        errs.push(format!(
            "spec.driver {:?}: not a DNS subdomain of at most 63 characters",
            s.spec.driver
        ));
    }
    let pool = &s.spec.pool;
    if pool.name.is_empty()
        || pool.name.len() > 253
        || !pool.name.split('/').all(|p| is_dns_subdomain(p, 253))
    {
        errs.push(format!(
            "spec.pool.name {:?}: not DNS subdomains separated by '/'",
            pool.name
        ));
    }
    if pool.generation < 0 || pool.resource_slice_count < 1 {
        errs.push("spec.pool: generation must be >= 0 and resourceSliceCount >= 1".into());
    }
    if !is_dns_subdomain(&s.spec.node_name, 253) {
        errs.push(format!(
            "spec.nodeName {:?}: not a DNS subdomain",
            s.spec.node_name
        ));
    }
    if s.spec.devices.len() > MAX_DEVICES {
        errs.push(format!(
            "spec.devices: {} devices, at most {MAX_DEVICES}",
            s.spec.devices.len()
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, d) in s.spec.devices.iter().enumerate() {
        let at = format!("spec.devices[{i}]");
        if !is_dns_label(&d.name) {
            errs.push(format!("{at}.name {:?}: not a DNS label", d.name));
        }
        if !names.insert(&d.name) {
            errs.push(format!("{at}.name {:?}: duplicate", d.name));
        }
        if d.attributes.len() + d.capacity.len() > MAX_ATTRIBUTES_AND_CAPACITIES {
            errs.push(format!(
                "{at}: more than {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities"
            ));
        }
        for (k, v) in &d.attributes {
            if !is_qualified_name(k) {
                errs.push(format!("{at}.attributes[{k:?}]: not a qualified name"));
            }
            let set = [
                v.int.is_some(),
                v.bool.is_some(),
                v.string.is_some(),
                v.version.is_some(),
            ]
            .iter()
            .filter(|x| **x)
            .count();
            if set != 1 {
                errs.push(format!(
                    "{at}.attributes[{k:?}]: {set} value types set, exactly one allowed"
                ));
            }
            if let Some(sv) = &v.string {
                if sv.len() > MAX_VALUE_LENGTH {
                    errs.push(format!(
                        "{at}.attributes[{k:?}].string: longer than {MAX_VALUE_LENGTH}"
                    ));
                }
            }
            if let Some(vv) = &v.version {
                if vv.len() > MAX_VALUE_LENGTH || semver::Version::parse(vv).is_err() {
                    errs.push(format!(
                        "{at}.attributes[{k:?}].version {vv:?}: not a semantic version 2.0.0"
                    ));
                }
            }
        }
        for (k, c) in &d.capacity {
            if !is_qualified_name(k) {
                errs.push(format!("{at}.capacity[{k:?}]: not a qualified name"));
            }
            if !is_quantity(&c.value) {
                errs.push(format!(
                    "{at}.capacity[{k:?}].value {:?}: not a quantity",
                    c.value
                ));
            }
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

#[cfg(test)]
mod tests_support;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_versions() {
        assert_eq!(quantity(40960 << 20), "40Gi");
        assert_eq!(quantity(81559 << 20), "81559Mi");
        assert_eq!(quantity(1000), "1000");
        assert_eq!(semver_of("570.172.08"), "570.172.8");
        assert_eq!(semver_of("8.0"), "8.0.0");
        assert_eq!(semver_of("12.8"), "12.8.0");
        assert_eq!(pci_bus_id("00000000:10:1C.0"), "0000:10:1c.0");
    }

    #[test]
    fn validation_catches_each_rule() {
        let gpu = tests_support::a10g(0);
        let good = build(
            &[gpu],
            "ip-10-0-1-23.us-west-2.compute.internal",
            "gpu.nvidia.com",
        );
        validate(&good).unwrap();
        let mut bad = good.clone();
        let d = &mut bad.spec.devices[0];
        d.name = "GPU_0".into();
        d.attributes.insert("not a key".into(), string("x"));
        d.attributes.insert(
            "both".into(),
            Attribute {
                int: Some(1),
                string: Some("x".into()),
                ..Attribute::default()
            },
        );
        d.attributes.insert(
            "v".into(),
            Attribute {
                version: Some("570.172.08".into()),
                ..Attribute::default()
            },
        );
        d.attributes.insert("long".into(), string(&"x".repeat(65)));
        d.capacity.insert(
            "memory".into(),
            Capacity {
                value: "40 GB".into(),
            },
        );
        bad.spec.driver = "Gpu.Nvidia.com".into();
        let errs = validate(&bad).unwrap_err().join("\n");
        for needle in [
            "GPU_0",
            "not a key",
            "2 value types",
            "570.172.08",
            "longer than 64",
            "40 GB",
            "spec.driver",
        ] {
            assert!(errs.contains(needle), "{needle} not in:\n{errs}");
        }
    }
}

#[cfg(test)]
mod pool_tests {
    use super::*;

    #[test]
    fn a_pool_is_cut_at_the_per_slice_device_limit() {
        let gpus: Vec<GpuInfo> = (0..300).map(tests_support::a10g).collect();
        let pool = build_pool(&gpus, "node-a", "gpu.nvidia.com", 7);
        assert_eq!(
            pool.iter()
                .map(|s| s.spec.devices.len())
                .collect::<Vec<_>>(),
            [128, 128, 44]
        );
        for s in &pool {
            assert_eq!(s.spec.pool.generation, 7);
            assert_eq!(s.spec.pool.resource_slice_count, 3);
            validate(s).unwrap();
        }
        let empty = build_pool(&[], "node-a", "gpu.nvidia.com", 1);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].spec.devices.is_empty());
    }
}
