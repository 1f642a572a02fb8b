//! The counter sets of the four profile tables, and that what gpushare publishes from them
//! lets the scheduler allocate exactly the layouts the hardware can make: no set of devices
//! the counters admit overlaps, and every valid layout fits the counters.

use std::collections::BTreeMap;
use std::path::Path;

use gpushare_proto::{GpuInfo, MigCapacity, MigDeviceInfo};
use gpushare_slice::{build_pool_in, validate_pool, Device, Layout};

use super::*;
use crate::gpu::{GpuBackend, SimulatedBackend};
use crate::mig::MigDeviceName;

fn cap(memory_mib: u64, sm: u32, ce: u32, dec: u32, jpg: u32, ofa: u32) -> MigCapacity {
    MigCapacity {
        memory_mib,
        multiprocessors: sm,
        copy_engines: ce,
        decoders: dec,
        encoders: 0,
        jpeg_engines: jpg,
        ofa_engines: ofa,
    }
}

#[test]
fn counter_sets_of_the_four_profile_tables() {
    // A100 and H100: the whole-GPU profile's figures (7g), which every layout stays within.
    assert_eq!(
        MigModel::A100Sxm4_40.counter_capacity(),
        cap(40192, 98, 7, 5, 1, 1)
    );
    assert_eq!(
        MigModel::A100Sxm4_80.counter_capacity(),
        cap(80384, 98, 7, 5, 1, 1)
    );
    assert_eq!(
        MigModel::H100_80.counter_capacity(),
        cap(81152, 132, 8, 7, 7, 1)
    );
    // H200: the table's memory figures are inferred (go-nvml's mock: 18432 MiB for 1g.18gb,
    // 72704 for 3g.71gb, 144384 for 7g.141gb), and a 3g.71gb beside four 1g.18gb would not
    // fit 7g.141gb's memory: the set holds what that layout uses, so the scheduler can still
    // hand out all five.
    assert_eq!(
        MigModel::H200.counter_capacity(),
        cap(72704 + 4 * 18432, 132, 8, 7, 7, 1)
    );
    let h200 = MigModel::H200;
    let three = h200.profile_by_name("3g.71gb").unwrap();
    let one = h200.profile_by_name("1g.18gb").unwrap();
    let seven = h200.profile_by_name("7g.141gb").unwrap();
    assert!(three.memory_mib + 4 * one.memory_mib > seven.memory_mib);
    // Layouts counted: enumeration is what the capacities come from.
    for m in MigModel::ALL {
        let layouts = m.layouts();
        assert!(layouts.iter().any(Vec::is_empty));
        let slots = m.slots();
        // The most instances at once: seven 1-slice profiles.
        let most = layouts.iter().map(Vec::len).max().unwrap();
        assert_eq!(most, 7, "{m:?}");
        assert!(layouts
            .iter()
            .all(|l| l.iter().map(|&i| slots[i].1.size).sum::<u32>() <= MEMORY_SLICES));
    }
}

/// The GPUs of a simulated node as `list_gpus` reports them on a fresh node.
fn fresh(profile: &str) -> Vec<GpuInfo> {
    let b = SimulatedBackend::without_device_nodes(profile, "node", Path::new("/x")).unwrap();
    b.gpus().iter().map(|g| g.info()).collect()
}

fn instance(model: MigModel, profile: &str, start: u32, owner: Option<&str>) -> MigDeviceInfo {
    let mut d = model
        .profile_by_name(profile)
        .unwrap()
        .device_info(format!("MIG-{profile}-{start}"), start);
    d.owner = owner.map(str::to_string);
    d
}

#[test]
fn whole_gpu_and_slices_follow_the_architecture_and_mode() {
    let a100 = MigModel::A100Sxm4_40;
    let h100 = MigModel::H100_80;
    let all = |m: MigModel| m.slots().len();
    // Ampere, MIG off: enabling needs a reset; whole only.
    let p = partitions(a100, false, false, &[]);
    assert!(p.whole_gpu && !p.slices && p.placements.is_empty());
    // Ampere, MIG on: turning it off needs a reset; slices only.
    let p = partitions(a100, true, true, &[]);
    assert!(!p.whole_gpu && p.slices);
    assert_eq!(p.placements.len(), all(a100));
    assert_eq!(all(a100), 7 + 7 + 4 + 3 + 2 + 1 + 1);
    // A change pending a reset: neither.
    for (current, pending) in [(false, true), (true, false)] {
        let p = partitions(a100, current, pending, &[]);
        assert!(!p.whole_gpu && !p.slices && p.placements.is_empty());
    }
    // Hopper toggles without a reset: both, MIG on or off.
    for on in [false, true] {
        let p = partitions(h100, on, on, &[]);
        assert!(p.whole_gpu && p.slices);
        assert_eq!(p.placements.len(), all(h100));
    }
    // Instances claims own are those claims' allocations: nothing is left out for them.
    let owned = [instance(h100, "3g.40gb", 4, Some("claim-a"))];
    let p = partitions(h100, true, true, &owned);
    assert!(p.whole_gpu);
    assert_eq!(p.placements.len(), all(h100));
    // An instance of the node's layout: the GPU is not offered whole, what overlaps it or
    // its profile's count rules out is left out.
    let layout = [
        instance(h100, "3g.40gb", 4, None),
        instance(h100, "1g.10gb+me", 0, None),
    ];
    let p = partitions(h100, true, true, &layout);
    assert!(!p.whole_gpu);
    let names: Vec<String> = p.placements.iter().map(|s| s.device_name(3)).collect();
    assert!(!names.iter().any(|n| n.contains("me-20-")), "{names:?}");
    assert!(!names.contains(&"gpu-3-mig-3g40gb-9-4".to_string()));
    assert!(!names.contains(&"gpu-3-mig-3g40gb-9-0".to_string()));
    assert!(!names.contains(&"gpu-3-mig-1g10gb-19-0".to_string()));
    assert!(names.contains(&"gpu-3-mig-1g10gb-19-1".to_string()));
    assert!(names.contains(&"gpu-3-mig-2g20gb-14-2".to_string()));
    // 1g.10gb at 1..=3, 1g.20gb at 2, 2g.20gb at 2.
    assert_eq!(names.len(), 5, "{names:?}");
    assert_eq!(p.capacity, h100.counter_capacity());
    assert!(for_gpu("NVIDIA A10G", false, false, &[]).is_none());
    assert_eq!(
        for_gpu("NVIDIA H100 80GB HBM3", true, true, &layout),
        Some(p)
    );
}

/// A counter quantity as written by the slice builder, as a number.
fn amount(q: &str) -> u128 {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u128 = digits.parse().unwrap();
    match &q[digits.len()..] {
        "" => n,
        "Mi" => n << 20,
        "Gi" => n << 30,
        other => panic!("unexpected suffix {other:?} in {q}"),
    }
}

/// Counters by name, as numbers.
type Amounts = BTreeMap<String, u128>;

/// What each device takes from the GPU's counter set, and what the set holds.
fn counters(pool: &[gpushare_slice::ResourceSlice]) -> (Amounts, Vec<(Device, Amounts)>) {
    let sets: Vec<_> = pool.iter().flat_map(|s| &s.spec.shared_counters).collect();
    assert_eq!(sets.len(), 1);
    let have = sets[0]
        .counters
        .iter()
        .map(|(k, v)| (k.clone(), amount(&v.value)))
        .collect();
    let devices = pool
        .iter()
        .flat_map(|s| &s.spec.devices)
        .map(|d| {
            assert_eq!(d.consumes_counters.len(), 1, "{}", d.name);
            let c = d.consumes_counters[0]
                .counters
                .iter()
                .map(|(k, v)| (k.clone(), amount(&v.value)))
                .collect();
            (d.clone(), c)
        })
        .collect();
    (have, devices)
}

/// Every set of devices the scheduler could allocate together from `have` (each device
/// at most once: it is one device), smallest first, by index.
fn admissible(have: &Amounts, devices: &[(Device, Amounts)]) -> Vec<Vec<usize>> {
    fn go(
        left: &mut Amounts,
        devices: &[(Device, Amounts)],
        from: usize,
        chosen: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        out.push(chosen.clone());
        for i in from..devices.len() {
            let need = &devices[i].1;
            if need
                .iter()
                .all(|(k, v)| left.get(k).is_some_and(|h| h >= v))
            {
                for (k, v) in need {
                    *left.get_mut(k).unwrap() -= v;
                }
                chosen.push(i);
                go(left, devices, i + 1, chosen, out);
                chosen.pop();
                for (k, v) in need {
                    *left.get_mut(k).unwrap() += v;
                }
            }
        }
    }
    let mut out = Vec::new();
    go(&mut have.clone(), devices, 0, &mut Vec::new(), &mut out);
    out
}

#[test]
fn the_published_counters_admit_exactly_the_layouts_the_hardware_can_make() {
    // One GPU of each model, MIG on (Hopper also offered whole: it can leave MIG mode).
    for (profile, minor, model) in [
        ("p4d.24xlarge", 0, MigModel::A100Sxm4_40),
        ("p4de.24xlarge", 1, MigModel::A100Sxm4_80),
        ("p5.48xlarge", 2, MigModel::H100_80),
        ("p5e.48xlarge", 3, MigModel::H200),
    ] {
        let mut g = fresh(profile).remove(minor);
        assert_eq!(MigModel::from_product_name(&g.product_name), Some(model));
        g.mig_enabled = true;
        g.mig_partitions = Some(partitions(model, true, true, &[]));
        let pool = build_pool_in(
            std::slice::from_ref(&g),
            "node",
            "gpu.nvidia.com",
            1,
            Layout::Split,
        );
        validate_pool(&pool, Layout::Split).unwrap();
        let (have, devices) = counters(&pool);
        let whole = g.name.clone();
        assert_eq!(
            devices.iter().any(|(d, _)| d.name == whole),
            model.reset_free_mode_toggle(),
            "{model:?}: the whole GPU only where MIG mode can be left without a reset"
        );
        // Each MIG device is one (profile, placement) of the table, by its canonical name.
        let slots = model.slots();
        let slot_of = |d: &Device| -> usize {
            let n = MigDeviceName::parse(&d.name).unwrap();
            assert_eq!(n.minor, g.minor);
            slots
                .iter()
                .position(|(p, pl)| p.id == n.gi_profile && pl.start == n.start)
                .unwrap()
        };
        let mut published: Vec<usize> = devices
            .iter()
            .filter(|(d, _)| d.name != whole)
            .map(|(d, _)| slot_of(d))
            .collect();
        published.sort_unstable();
        assert_eq!(published, (0..slots.len()).collect::<Vec<_>>(), "{model:?}");

        // Sound: whatever the counters admit together, the hardware can hold together.
        let sets = admissible(&have, &devices);
        for set in &sets {
            if set.iter().any(|&i| devices[i].0.name == whole) {
                assert_eq!(set.len(), 1, "{model:?}: the whole GPU beside a slice");
                continue;
            }
            let mut taken: Vec<Occupied> = Vec::new();
            for &i in set {
                let (p, pl) = &slots[slot_of(&devices[i].0)];
                if let Err(e) = check_placement(model, p.id, pl.start, &taken) {
                    panic!(
                        "{model:?}: the counters admit {:?} together: {e}",
                        set.iter().map(|&i| &devices[i].0.name).collect::<Vec<_>>()
                    );
                }
                taken.push(Occupied {
                    profile: p.id,
                    placement: *pl,
                });
            }
        }
        // Complete: every layout the hardware can make, the counters admit.
        let mut admitted: Vec<Vec<usize>> = sets
            .iter()
            .filter(|s| !s.iter().any(|&i| devices[i].0.name == whole))
            .map(|s| {
                let mut v: Vec<usize> = s.iter().map(|&i| slot_of(&devices[i].0)).collect();
                v.sort_unstable();
                v
            })
            .collect();
        admitted.sort();
        let mut layouts = model.layouts();
        for l in &mut layouts {
            l.sort_unstable();
        }
        layouts.sort();
        assert_eq!(admitted.len(), layouts.len(), "{model:?}");
        assert_eq!(admitted, layouts, "{model:?}");
        eprintln!(
            "{model:?}: {} layouts, each admitted, nothing else",
            layouts.len()
        );
    }
}
