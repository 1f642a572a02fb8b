use std::collections::BTreeMap;

use gpushare_proto::MigDeviceInfo;

use super::*;
use crate::tests_support::{a10g, h100, mig_a100};
use crate::{counters_of_object, devices_of_object, validate_layout, validate_pool, ApiVersion};

const NODE: &str = "node-a";
const DRIVER: &str = "gpu.nvidia.com";

fn names(slice: &ResourceSlice) -> Vec<&str> {
    slice.spec.devices.iter().map(|d| d.name.as_str()).collect()
}

fn device<'a>(pool: &'a [ResourceSlice], name: &str) -> &'a Device {
    pool.iter()
        .flat_map(|s| &s.spec.devices)
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("no device {name}"))
}

fn consumed(d: &Device) -> BTreeMap<String, String> {
    assert_eq!(d.consumes_counters.len(), 1, "{}", d.name);
    assert_eq!(d.consumes_counters[0].counter_set, "gpu-1-counter-set");
    plain(&d.consumes_counters[0].counters)
}

fn plain(counters: &BTreeMap<String, Counter>) -> BTreeMap<String, String> {
    counters
        .iter()
        .map(|(k, v)| (k.clone(), v.value.clone()))
        .collect()
}

/// A node: an A10G (no MIG), an H100 offered whole and in slices, an A100 in MIG mode
/// gpushared reports nothing about (an older daemon: static only).
fn node() -> Vec<GpuInfo> {
    vec![a10g(0), h100(1, true, true, &[]), mig_a100(2)]
}

#[test]
fn combined_puts_each_gpus_counter_set_with_its_devices() {
    let pool = build_pool_in(&node(), NODE, DRIVER, 3, Layout::Combined);
    validate_pool(&pool, Layout::Combined).unwrap();
    assert_eq!(pool.len(), 2);
    // The GPUs without counters together (the A100's MIG device as the static layout has it).
    assert_eq!(names(&pool[0]), ["gpu-0", "gpu-2-mig-3g20gb-9-4"]);
    assert!(pool[0].spec.shared_counters.is_empty());
    assert!(pool[0]
        .spec
        .devices
        .iter()
        .all(|d| d.consumes_counters.is_empty()));
    // The H100: its whole GPU first, then every placement, one counter set.
    let s = &pool[1];
    assert_eq!(s.spec.shared_counters.len(), 1);
    let set = &s.spec.shared_counters[0];
    assert_eq!(set.name, "gpu-1-counter-set");
    let mut want: Vec<String> = vec!["gpu-1".into()];
    want.extend((0..7).map(|i| format!("gpu-1-mig-1g10gb-19-{i}")));
    want.extend(["gpu-1-mig-3g40gb-9-0".into(), "gpu-1-mig-3g40gb-9-4".into()]);
    want.push("gpu-1-mig-7g80gb-0-0".into());
    assert_eq!(names(s), want);
    let mut all: BTreeMap<String, String> = [
        ("multiprocessors", "132"),
        ("copy-engines", "8"),
        ("decoders", "7"),
        ("encoders", "0"),
        ("jpeg-engines", "7"),
        ("ofa-engines", "1"),
        ("memory", "81152Mi"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    all.extend((0..8).map(|i| (format!("memory-slice-{i}"), "1".to_string())));
    assert_eq!(plain(&set.counters), all);
    // The whole GPU takes everything; its memory capacity stays the GPU's own.
    let whole = device(&pool, "gpu-1");
    assert_eq!(consumed(whole), all);
    assert_eq!(whole.attributes["type"].string.as_deref(), Some("gpu"));
    assert_eq!(whole.capacity["memory"].value, "81559Mi");
    assert_eq!(whole.capacity["multiprocessors"].value, "132");
    // A slice: its capacities and exactly the memory slices of its placement.
    let s4 = device(&pool, "gpu-1-mig-3g40gb-9-4");
    let c = consumed(s4);
    assert_eq!(c["multiprocessors"], "60");
    assert_eq!(c["memory"], "40448Mi");
    let slices: Vec<&str> = c
        .keys()
        .map(String::as_str)
        .filter(|k| k.starts_with("memory-slice-"))
        .collect();
    assert_eq!(
        slices,
        [
            "memory-slice-4",
            "memory-slice-5",
            "memory-slice-6",
            "memory-slice-7"
        ]
    );
    // Not created yet: a MIG device without a uuid, its parent named.
    assert!(!s4.attributes.contains_key("uuid"));
    assert_eq!(s4.attributes["type"].string.as_deref(), Some("mig"));
    assert_eq!(
        s4.attributes["parentUUID"].string.as_deref(),
        Some(node()[1].uuid.as_str())
    );
    assert_eq!(s4.attributes["profile"].string.as_deref(), Some("3g.40gb"));
    assert!(!s4.capacity.keys().any(|k| k.starts_with("memorySlice")));
    for s in &pool {
        assert_eq!(s.spec.pool.resource_slice_count, 2);
        assert_eq!(s.spec.pool.generation, 3);
    }
}

#[test]
fn split_puts_counter_sets_apart_and_cuts_device_slices_at_64() {
    // Nine H100s: nine sets, more than one counters-only slice holds.
    let gpus: Vec<GpuInfo> = (0..9).map(|m| h100(m, true, true, &[])).collect();
    let pool = build_pool_in(&gpus, NODE, DRIVER, 1, Layout::Split);
    validate_pool(&pool, Layout::Split).unwrap();
    let sets: Vec<usize> = pool.iter().map(|s| s.spec.shared_counters.len()).collect();
    assert_eq!(&sets[..2], [8, 1]);
    assert!(pool[..2].iter().all(|s| s.spec.devices.is_empty()));
    assert_eq!(pool.len(), 2 + 9);
    assert!(pool[2..]
        .iter()
        .all(|s| s.spec.shared_counters.is_empty() && s.spec.devices.len() == 11));
    // The same pool breaks the older server's rules (counters of another slice), and the
    // combined pool the newer's (devices and counters in one slice).
    assert!(validate_pool(&pool, Layout::Combined).is_err());
    let combined = build_pool_in(&gpus, NODE, DRIVER, 1, Layout::Combined);
    validate_pool(&combined, Layout::Combined).unwrap();
    let errs = validate_pool(&combined, Layout::Split)
        .unwrap_err()
        .join("\n");
    assert!(
        errs.contains("only one of devices and sharedCounters"),
        "{errs}"
    );

    // A GPU with more placements than one slice may hold where devices consume counters.
    let mut big = h100(0, false, true, &[]);
    let p = big.mig_partitions.as_mut().unwrap();
    let one = p.placements[0].clone();
    p.placements = (0..100)
        .map(|i| MigSlot {
            gi_profile_id: 100 + i,
            ..one.clone()
        })
        .collect();
    let pool = build_pool_in(&[big], NODE, DRIVER, 1, Layout::Split);
    assert_eq!(
        pool.iter()
            .map(|s| s.spec.devices.len())
            .collect::<Vec<_>>(),
        [0, 64, 36]
    );
    validate_pool(&pool, Layout::Split).unwrap();
}

#[test]
fn the_whole_gpu_and_slices_only_where_they_can_be_had() {
    // Ampere in MIG mode (no whole GPU), Ampere with MIG off (whole only: no counters),
    // a GPU with a mode change pending (nothing).
    let gpus = [
        h100(0, false, true, &[]),
        h100(1, true, false, &[]),
        h100(2, false, false, &[]),
    ];
    let pool = build_pool_in(&gpus, NODE, DRIVER, 1, Layout::Combined);
    validate_pool(&pool, Layout::Combined).unwrap();
    let all: Vec<&str> = pool.iter().flat_map(names).collect();
    assert!(!all.contains(&"gpu-0"), "{all:?}");
    assert!(all.contains(&"gpu-0-mig-7g80gb-0-0"));
    assert!(all.contains(&"gpu-1"));
    assert!(!all
        .iter()
        .any(|n| n.starts_with("gpu-1-mig") || n.starts_with("gpu-2")));
    assert!(device(&pool, "gpu-1").consumes_counters.is_empty());
    let sets: Vec<&str> = pool
        .iter()
        .flat_map(|s| &s.spec.shared_counters)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(sets, ["gpu-0-counter-set"]);
}

#[test]
fn static_instances_are_published_as_they_are_and_claims_slices_as_slices() {
    // gpu-1 in MIG mode: a 3g.40gb at 4 of the node's layout (no owner), a 1g.10gb at 0 a
    // claim created. gpushared leaves out what overlaps the static one.
    let mut g = h100(1, false, true, &[(4, 4)]);
    let inst = |uuid: &str, profile: &str, id, start, size, owner: Option<&str>| MigDeviceInfo {
        uuid: uuid.into(),
        profile: profile.into(),
        gi_profile_id: id,
        placement_start: start,
        memory_slices: size,
        memory_mib: 40448,
        multiprocessors: 60,
        copy_engines: 3,
        decoders: 3,
        encoders: 0,
        jpeg_engines: 3,
        ofa_engines: 0,
        gi_id: Some(1),
        owner: owner.map(str::to_string),
    };
    g.mig_enabled = true;
    g.mig_devices = vec![
        inst("MIG-static", "3g.40gb", 9, 4, 4, None),
        inst("MIG-claimed", "1g.10gb", 19, 0, 1, Some("claim-a")),
        // A GPU instance a crash left without a compute instance: no device.
        inst("", "1g.10gb", 19, 6, 1, None),
    ];
    let pool = build_pool_in(&[g.clone()], NODE, DRIVER, 1, Layout::Split);
    validate_pool(&pool, Layout::Split).unwrap();
    let d = device(&pool, "gpu-1-mig-3g40gb-9-4");
    assert_eq!(d.attributes["uuid"].string.as_deref(), Some("MIG-static"));
    assert_eq!(d.capacity["memorySlice4"].value, "1");
    let c = consumed(d);
    assert_eq!(c["memory-slice-7"], "1");
    assert!(!c.contains_key("memory-slice-3"));
    // The claim's instance is its slice, without a uuid: the pool does not change when a
    // claim is prepared or released.
    let claimed = device(&pool, "gpu-1-mig-1g10gb-19-0");
    assert!(!claimed.attributes.contains_key("uuid"));
    let all: Vec<&str> = pool.iter().flat_map(names).collect();
    assert_eq!(
        all.iter().filter(|n| n.contains("-mig-")).count(),
        1 + 4 + 1,
        "the static instance, 1g.10gb at 0..=3 and 3g.40gb at 0: {all:?}"
    );
    assert!(!all.contains(&"gpu-1-mig-7g80gb-0-0"));
    assert!(!all.contains(&"gpu-1"));

    // In the static layout: the devices that exist, uuids and all; the GPU instance without
    // a compute instance is no device (a scheduler would place pods on it, and their prepares
    // would fail).
    let pool = build_pool_in(&[g], NODE, DRIVER, 1, Layout::Static);
    assert_eq!(
        names(&pool[0]),
        ["gpu-1-mig-3g40gb-9-4", "gpu-1-mig-1g10gb-19-0"]
    );
    validate_pool(&pool, Layout::Static).unwrap();
}

#[test]
fn no_layout_publishes_a_mig_device_without_a_compute_instance() {
    // What a crash left (or a prepare is half-way through): GPU instances without a compute
    // instance, one no claim owns and one a claim does, both with an empty MIG UUID.
    let mut g = h100(1, false, true, &[]);
    let bare = |start, owner: Option<&str>| MigDeviceInfo {
        uuid: String::new(),
        profile: "1g.10gb".into(),
        gi_profile_id: 19,
        placement_start: start,
        memory_slices: 1,
        memory_mib: 9856,
        multiprocessors: 16,
        copy_engines: 1,
        decoders: 1,
        encoders: 0,
        jpeg_engines: 1,
        ofa_engines: 0,
        gi_id: Some(start + 1),
        owner: owner.map(str::to_string),
    };
    g.mig_enabled = true;
    g.mig_devices = vec![bare(2, None), bare(3, Some("claim-a"))];
    for layout in [Layout::Static, Layout::Combined, Layout::Split] {
        let pool = build_pool_in(&[g.clone()], NODE, DRIVER, 1, layout);
        for d in pool.iter().flat_map(|s| &s.spec.devices) {
            let uuid = d.attributes.get("uuid").and_then(|a| a.string.as_deref());
            assert_ne!(
                uuid,
                Some(""),
                "{layout:?}: {} published without a MIG UUID",
                d.name
            );
        }
    }
    let pool = build_pool_in(&[g], NODE, DRIVER, 1, Layout::Static);
    assert!(
        pool.iter().all(|s| s.spec.devices.is_empty()),
        "{:?}",
        pool.iter().flat_map(names).collect::<Vec<_>>()
    );
}

#[test]
fn counters_survive_every_api_version_and_read_back() {
    let pool = build_pool_in(&node(), NODE, DRIVER, 1, Layout::Split);
    for v in ApiVersion::PREFERENCE {
        for s in &pool {
            let obj = s.to_api_object(v);
            assert_eq!(devices_of_object(&obj, v).unwrap(), s.spec.devices, "{v}");
            assert_eq!(counters_of_object(&obj).unwrap(), s.spec.shared_counters);
            if s.spec.devices.is_empty() {
                assert!(obj["spec"].get("devices").is_none(), "{obj}");
            }
            let consuming = s
                .spec
                .devices
                .iter()
                .position(|d| !d.consumes_counters.is_empty());
            if let Some(i) = consuming {
                let d = &obj["spec"]["devices"][i];
                let at = if v == ApiVersion::V1beta1 {
                    &d["basic"]
                } else {
                    d
                };
                assert!(at["consumesCounters"][0]["counterSet"].is_string(), "{d}");
            }
        }
    }
}

#[test]
fn layout_rules_catch_what_each_server_refuses() {
    let gpus = [h100(0, true, true, &[]), h100(1, true, true, &[])];
    let combined = build_pool_in(&gpus, NODE, DRIVER, 1, Layout::Combined);
    // Two GPUs' sets in one slice: 30 counters fit; a third set would not.
    let mut two = combined[0].clone();
    two.spec
        .shared_counters
        .extend(combined[1].spec.shared_counters.clone());
    two.spec.devices.extend(combined[1].spec.devices.clone());
    validate_layout(&two, Layout::Combined).unwrap();
    let mut three = two.clone();
    let mut extra = combined[1].spec.shared_counters[0].clone();
    extra.name = "gpu-9-counter-set".into();
    three.spec.shared_counters.push(extra);
    let errs = validate_layout(&three, Layout::Combined)
        .unwrap_err()
        .join("\n");
    assert!(
        errs.contains("45 counters in all sets, at most 32"),
        "{errs}"
    );
    // Names, values, references, a second entry for one set.
    let mut bad = combined[0].clone();
    bad.spec.shared_counters[0]
        .counters
        .insert("Memory_Slice".into(), Counter { value: "1".into() });
    let d = &mut bad.spec.devices[1];
    d.consumes_counters[0].counters.insert(
        "memory".into(),
        Counter {
            value: "lots".into(),
        },
    );
    d.consumes_counters.push(d.consumes_counters[0].clone());
    bad.spec.devices[2].consumes_counters[0].counter_set = "gpu-7-counter-set".into();
    let errs = validate_layout(&bad, Layout::Combined)
        .unwrap_err()
        .join("\n");
    for needle in [
        "\"Memory_Slice\"]: not a DNS label",
        "\"lots\": not a quantity",
        "a second entry for one set",
        "must reference a counter set of this slice",
    ] {
        assert!(errs.contains(needle), "{needle} not in:\n{errs}");
    }
    // From 1.35: at most two sets a device, 64 devices where any consumes counters.
    let split = build_pool_in(&gpus, NODE, DRIVER, 1, Layout::Split);
    let mut many = split[1].clone();
    let more: Vec<Device> = (0..6)
        .flat_map(|i| {
            split[1].spec.devices.iter().map(move |d| Device {
                name: format!("{}-x{i}", d.name),
                ..d.clone()
            })
        })
        .collect();
    many.spec.devices.extend(more);
    let c = many.spec.devices[0].consumes_counters[0].clone();
    many.spec.devices[0].consumes_counters = vec![
        c.clone(),
        DeviceCounterConsumption {
            counter_set: "b".into(),
            ..c.clone()
        },
        DeviceCounterConsumption {
            counter_set: "c".into(),
            ..c
        },
    ];
    let errs = validate_layout(&many, Layout::Split)
        .unwrap_err()
        .join("\n");
    assert!(errs.contains("more than 2 entries"), "{errs}");
    assert!(errs.contains("77 devices, at most 64"), "{errs}");
    // A static slice holds no counters; a pool that consumes more than a set holds, or from
    // a set it lacks, is refused.
    assert!(validate_layout(&combined[0], Layout::Static).is_err());
    let mut over = split.clone();
    over[1].spec.devices[1].consumes_counters[0]
        .counters
        .insert(
            "multiprocessors".into(),
            Counter {
                value: "133".into(),
            },
        );
    over[2].spec.devices[1].consumes_counters[0].counter_set = "gpu-5-counter-set".into();
    let errs = validate_pool(&over, Layout::Split).unwrap_err().join("\n");
    assert!(errs.contains("consumes multiprocessors = 133"), "{errs}");
    assert!(errs.contains("no counter set of the pool"), "{errs}");
}

#[test]
fn a_daemon_before_mig_partitions_gets_its_existing_devices_in_every_layout() {
    // list_gpus of an older gpushared: no mig_partitions field at all.
    let mut v = serde_json::to_value(mig_a100(2)).unwrap();
    v.as_object_mut().unwrap().remove("mig_partitions");
    let old: GpuInfo = serde_json::from_value(v).unwrap();
    assert!(old.mig_partitions.is_none());
    for layout in [Layout::Static, Layout::Combined, Layout::Split] {
        let pool = build_pool_in(std::slice::from_ref(&old), NODE, DRIVER, 1, layout);
        assert_eq!(pool.len(), 1);
        assert_eq!(names(&pool[0]), ["gpu-2-mig-3g20gb-9-4"]);
        assert!(pool[0].spec.shared_counters.is_empty());
        validate_pool(&pool, layout).unwrap();
    }
}
