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
