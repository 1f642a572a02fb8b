//! GPUs as `list_gpus` reports them, for this crate's tests.

use gpushare_proto::{ComputeMode, GpuInfo, GpuSharing, MigDeviceInfo, TimeSliceInterval};

/// An A10G (g5) GPU with minor `minor`, MIG-incapable.
pub fn a10g(minor: u32) -> GpuInfo {
    GpuInfo {
        name: format!("gpu-{minor}"),
        minor,
        uuid: format!("GPU-0000000{minor}-1111-2222-3333-444444444444"),
        product_name: "NVIDIA A10G".into(),
        memory_mib: 23028,
        compute_mode: ComputeMode::Default,
        time_slice: TimeSliceInterval::Default,
        sharing: GpuSharing::Free,
        claims: Vec::new(),
        brand: "Nvidia".into(),
        architecture: "Ampere".into(),
        cuda_compute_capability: "8.6".into(),
        driver_version: "570.172.08".into(),
        cuda_driver_version: "12.8".into(),
        pci_bus_id: "00000000:00:1E.0".into(),
        numa_node: Some(0),
        mig_capable: false,
        mig_enabled: false,
        mig_devices: Vec::new(),
        mig_pending: None,
        mig_partitions: None,
    }
}

/// An A100-SXM4-40GB with minor `minor` in MIG mode holding one 3g.20gb device at start 4.
pub fn mig_a100(minor: u32) -> GpuInfo {
    GpuInfo {
        product_name: "NVIDIA A100-SXM4-40GB".into(),
        memory_mib: 40960,
        cuda_compute_capability: "8.0".into(),
        mig_capable: true,
        mig_enabled: true,
        mig_devices: vec![MigDeviceInfo {
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
        }],
        ..a10g(minor)
    }
}

/// An H100 80GB with minor `minor` whose MIG layout gpushared may change, with three of its
/// profiles (1g.10gb at 0..=6, 3g.40gb at 0 and 4, 7g.80gb at 0; figures from its table),
/// offered whole or not and cut into slices or not as `whole` and `slices` say; placements
/// overlapping `taken` (start, size) are left out, as gpushared leaves out those of static
/// instances.
pub fn h100(minor: u32, whole: bool, slices: bool, taken: &[(u32, u32)]) -> GpuInfo {
    use gpushare_proto::{MigCapacity, MigPartitions, MigSlot};
    let cap = |memory_mib, multiprocessors, ce, dec, jpg, ofa| MigCapacity {
        memory_mib,
        multiprocessors,
        copy_engines: ce,
        decoders: dec,
        encoders: 0,
        jpeg_engines: jpg,
        ofa_engines: ofa,
    };
    let rows = [
        (
            "1g.10gb",
            19,
            1,
            &[0, 1, 2, 3, 4, 5, 6][..],
            cap(9984, 16, 1, 1, 1, 0),
        ),
        ("3g.40gb", 9, 4, &[0, 4][..], cap(40448, 60, 3, 3, 3, 0)),
        ("7g.80gb", 0, 8, &[0][..], cap(81152, 132, 8, 7, 7, 1)),
    ];
    let mut placements = Vec::new();
    for (profile, id, size, starts, capacity) in rows {
        for &start in starts {
            if taken
                .iter()
                .any(|&(s, n)| start < s + n && s < start + size)
            {
                continue;
            }
            placements.push(MigSlot {
                profile: profile.into(),
                gi_profile_id: id,
                placement_start: start,
                memory_slices: size,
                capacity,
            });
        }
    }
    if !slices {
        placements.clear();
    }
    GpuInfo {
        product_name: "NVIDIA H100 80GB HBM3".into(),
        architecture: "Hopper".into(),
        memory_mib: 81559,
        cuda_compute_capability: "9.0".into(),
        mig_capable: true,
        mig_partitions: Some(MigPartitions {
            whole_gpu: whole,
            slices,
            memory_slices: 8,
            capacity: cap(81152, 132, 8, 7, 7, 1),
            placements,
        }),
        ..a10g(minor)
    }
}
