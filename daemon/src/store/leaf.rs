//! The leaf facts of a claim's record, as the disk keeps them: a device, the CDI device IDs
//! of a request, an MPS control daemon, a MIG slice, an attached container. Types of their
//! own, so that a change of the protocol never changes what is on disk: their JSON is what
//! format 3 wrote (the protocol's records of the same facts then), field for field, and a
//! test holds them to it (`record.rs`: a record this build writes still reads as format 3's
//! `ClaimInfo`). Converted to and from the daemon's own leaf facts (`crate::claim::leaf`)
//! here alone; the protocol's types appear only in the test that holds the JSON to theirs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::claim::{
    Attachment, Device, MigSlice, MpsAsked, MpsDaemon, Pod, PreparedDevice, Request, SliceOrigin,
};

/// A device of a group: the request it was allocated for, its DRA device name, its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// The request it was allocated for.
    pub request: String,
    /// The allocated device name (`gpu-<minor>`, or a MIG device's).
    pub device: String,
    /// GPU UUID (the parent's, for a MIG device).
    pub uuid: String,
    /// Minor number (`/dev/nvidia<minor>`).
    pub minor: u32,
}

/// The CDI device IDs prepared for one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The request's name (`parent/sub` for a subrequest).
    pub request: String,
    /// Every CDI device ID of the request, flattened.
    pub cdi_device_ids: Vec<String>,
    /// The allocated device names, in allocation order.
    pub devices: Vec<String>,
    /// The CDI device IDs of each allocated device, in `devices` order; absent from records
    /// older than the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_device: Vec<PreparedDeviceRecord>,
}

/// The CDI device IDs of one allocated device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDeviceRecord {
    /// The allocated device name.
    pub device: String,
    /// The allocation result's pool.
    pub pool: String,
    /// Its CDI device IDs, in the order a runtime applies them.
    pub cdi_device_ids: Vec<String>,
}

/// A group's MPS control daemon, as started and read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsRecord {
    /// Its pid; 0 before it was started (a claim recorded `PrepareStarted`).
    pub control_daemon_pid: i32,
    /// Host pipe directory.
    pub pipe_dir: String,
    /// Host log directory.
    pub log_dir: String,
    /// Host shm tmpfs.
    pub shm_dir: String,
    /// `CUDA_VISIBLE_DEVICES` given to it.
    pub visible_devices: Vec<String>,
    /// Default active thread percentage as read back (`"50.0"`).
    pub active_thread_percentage: String,
    /// Default pinned device memory limits as read back, by CUDA ordinal (`"8G"`).
    pub pinned_device_memory_limits: BTreeMap<String, String>,
    /// Its process's start time in clock ticks after boot; 0 in older records.
    #[serde(default)]
    pub control_daemon_start_time: u64,
    /// What it was started with, as configured.
    #[serde(default)]
    pub requested: MpsAskedRecord,
    /// Restarts after it died.
    #[serde(default)]
    pub restarts: u32,
}

/// What an MPS control daemon was started with.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MpsAskedRecord {
    /// Started with `-M`.
    #[serde(default)]
    pub multi_user: bool,
    /// Default active thread percentage, 1–100; `None`: the daemon's default.
    #[serde(default)]
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory limit per CUDA ordinal, in MiB.
    #[serde(default)]
    pub pinned_limits_mib: Vec<Option<u64>>,
    /// Size of the shm tmpfs in bytes.
    #[serde(default)]
    pub shm_bytes: u64,
}

/// A MIG slice (GPU instance with its compute instance) a group holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSliceRecord {
    /// The request it was allocated for.
    pub request: String,
    /// The allocated MIG device name.
    pub device: String,
    /// Parent GPU UUID.
    pub gpu_uuid: String,
    /// Parent GPU minor.
    pub gpu_minor: u32,
    /// GPU-instance profile name (`3g.20gb`).
    pub profile: String,
    /// GPU-instance profile ID.
    pub gi_profile_id: u32,
    /// First memory slice of its placement.
    pub placement_start: u32,
    /// Memory slices its placement spans.
    pub memory_slices: u32,
    /// GPU-instance ID.
    pub gi_id: u32,
    /// Compute-instance ID; `None` until it exists.
    #[serde(default)]
    pub ci_id: Option<u32>,
    /// `MIG-…` UUID; empty until the compute instance exists.
    #[serde(default)]
    pub uuid: String,
    /// The MIG UUID at prepare, once the slice was made again with another.
    #[serde(default)]
    pub original_uuid: String,
    /// Who made it.
    #[serde(default)]
    pub origin: OriginRecord,
    /// gpushare turned its GPU's MIG mode on for it (or took the flag over).
    #[serde(default)]
    pub enabled_mig_mode: bool,
    /// A release began destroying it.
    #[serde(default)]
    pub destroying: bool,
}

/// Who made a MIG slice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OriginRecord {
    /// gpushare, for the claim.
    #[default]
    Created,
    /// Someone before the claim (static MIG).
    Existing,
}

/// A container tied to the claim (host records only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRecord {
    /// The claim's UID.
    pub claim_uid: String,
    /// OCI container id.
    pub container_id: String,
    /// Host PID of its init process.
    pub pid: Option<i32>,
    /// Its cgroup path.
    pub cgroup: Option<String>,
    /// OCI bundle directory.
    pub bundle: Option<String>,
    /// Seconds since the Unix epoch.
    pub attached_at: u64,
    /// The Kubernetes pod it belongs to. Left out when unknown, so a record without one reads
    /// as before this field, and an older gpushared (which ignores fields it does not know)
    /// reads the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRecord>,
}

/// A Kubernetes pod, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}

impl From<&Device> for DeviceRecord {
    fn from(d: &Device) -> DeviceRecord {
        DeviceRecord {
            request: d.request.clone(),
            device: d.device.clone(),
            uuid: d.uuid.clone(),
            minor: d.minor,
        }
    }
}

impl From<DeviceRecord> for Device {
    fn from(d: DeviceRecord) -> Device {
        Device {
            request: d.request,
            device: d.device,
            uuid: d.uuid,
            minor: d.minor,
        }
    }
}

impl From<&Request> for RequestRecord {
    fn from(r: &Request) -> RequestRecord {
        RequestRecord {
            request: r.request.clone(),
            cdi_device_ids: r.cdi_device_ids.clone(),
            devices: r.devices.clone(),
            per_device: r
                .per_device
                .iter()
                .map(|p| PreparedDeviceRecord {
                    device: p.device.clone(),
                    pool: p.pool.clone(),
                    cdi_device_ids: p.cdi_device_ids.clone(),
                })
                .collect(),
        }
    }
}

impl From<RequestRecord> for Request {
    fn from(r: RequestRecord) -> Request {
        Request {
            request: r.request,
            cdi_device_ids: r.cdi_device_ids,
            devices: r.devices,
            per_device: r
                .per_device
                .into_iter()
                .map(|p| PreparedDevice {
                    device: p.device,
                    pool: p.pool,
                    cdi_device_ids: p.cdi_device_ids,
                })
                .collect(),
        }
    }
}

impl From<&MpsDaemon> for MpsRecord {
    fn from(m: &MpsDaemon) -> MpsRecord {
        MpsRecord {
            control_daemon_pid: m.control_daemon_pid,
            pipe_dir: m.pipe_dir.clone(),
            log_dir: m.log_dir.clone(),
            shm_dir: m.shm_dir.clone(),
            visible_devices: m.visible_devices.clone(),
            active_thread_percentage: m.active_thread_percentage.clone(),
            pinned_device_memory_limits: m.pinned_device_memory_limits.clone(),
            control_daemon_start_time: m.control_daemon_start_time,
            requested: MpsAskedRecord {
                multi_user: m.requested.multi_user,
                active_thread_percentage: m.requested.active_thread_percentage,
                pinned_limits_mib: m.requested.pinned_limits_mib.clone(),
                shm_bytes: m.requested.shm_bytes,
            },
            restarts: m.restarts,
        }
    }
}

impl From<MpsRecord> for MpsDaemon {
    fn from(m: MpsRecord) -> MpsDaemon {
        MpsDaemon {
            control_daemon_pid: m.control_daemon_pid,
            pipe_dir: m.pipe_dir,
            log_dir: m.log_dir,
            shm_dir: m.shm_dir,
            visible_devices: m.visible_devices,
            active_thread_percentage: m.active_thread_percentage,
            pinned_device_memory_limits: m.pinned_device_memory_limits,
            control_daemon_start_time: m.control_daemon_start_time,
            requested: MpsAsked {
                multi_user: m.requested.multi_user,
                active_thread_percentage: m.requested.active_thread_percentage,
                pinned_limits_mib: m.requested.pinned_limits_mib,
                shm_bytes: m.requested.shm_bytes,
            },
            restarts: m.restarts,
        }
    }
}

impl From<&MigSlice> for MigSliceRecord {
    fn from(s: &MigSlice) -> MigSliceRecord {
        MigSliceRecord {
            request: s.request.clone(),
            device: s.device.clone(),
            gpu_uuid: s.gpu_uuid.clone(),
            gpu_minor: s.gpu_minor,
            profile: s.profile.clone(),
            gi_profile_id: s.gi_profile_id,
            placement_start: s.placement_start,
            memory_slices: s.memory_slices,
            gi_id: s.gi_id,
            ci_id: s.ci_id,
            uuid: s.uuid.clone(),
            original_uuid: s.original_uuid.clone(),
            origin: match s.origin {
                SliceOrigin::Created => OriginRecord::Created,
                SliceOrigin::Existing => OriginRecord::Existing,
            },
            enabled_mig_mode: s.enabled_mig_mode,
            destroying: s.destroying,
        }
    }
}

impl From<MigSliceRecord> for MigSlice {
    fn from(s: MigSliceRecord) -> MigSlice {
        MigSlice {
            request: s.request,
            device: s.device,
            gpu_uuid: s.gpu_uuid,
            gpu_minor: s.gpu_minor,
            profile: s.profile,
            gi_profile_id: s.gi_profile_id,
            placement_start: s.placement_start,
            memory_slices: s.memory_slices,
            gi_id: s.gi_id,
            ci_id: s.ci_id,
            uuid: s.uuid,
            original_uuid: s.original_uuid,
            origin: match s.origin {
                OriginRecord::Created => SliceOrigin::Created,
                OriginRecord::Existing => SliceOrigin::Existing,
            },
            enabled_mig_mode: s.enabled_mig_mode,
            destroying: s.destroying,
        }
    }
}

impl From<&Attachment> for AttachmentRecord {
    fn from(a: &Attachment) -> AttachmentRecord {
        AttachmentRecord {
            claim_uid: a.claim_uid.clone(),
            container_id: a.container_id.clone(),
            pid: a.pid,
            cgroup: a.cgroup.clone(),
            bundle: a.bundle.clone(),
            attached_at: a.attached_at,
            pod: a.pod.as_ref().map(|p| PodRecord {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
            }),
        }
    }
}

impl From<AttachmentRecord> for Attachment {
    fn from(a: AttachmentRecord) -> Attachment {
        Attachment {
            claim_uid: a.claim_uid,
            container_id: a.container_id,
            pid: a.pid,
            cgroup: a.cgroup,
            bundle: a.bundle,
            attached_at: a.attached_at,
            pod: a.pod.map(|p| Pod {
                namespace: p.namespace,
                name: p.name,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::{
        Attachment as AttachmentInfo, ClaimDevice, MigInstanceInfo, MigOrigin, MpsInfo,
        MpsRequested, PreparedDevice as PreparedDeviceInfo, RequestDevices,
    };
    use serde_json::{to_value, Value};

    /// A leaf record writes what the protocol's type of the same fact wrote (format 3 read
    /// it so), every field set, and gives the same fact back. The fact is given in the
    /// protocol's type, whose JSON is the reference, and taken through the daemon's own
    /// (`M`, converted in `crate::claim::wire`), which is what the records are made from.
    fn same_json<M, P, R>(proto: P)
    where
        P: Serialize + Clone + PartialEq + std::fmt::Debug + for<'m> From<&'m M>,
        M: From<P> + From<R>,
        R: Serialize + for<'m> From<&'m M>,
    {
        let rec = R::from(&M::from(proto.clone()));
        let want: Value = to_value(&proto).unwrap();
        assert_eq!(to_value(&rec).unwrap(), want);
        assert_eq!(P::from(&M::from(rec)), proto);
    }

    #[test]
    fn every_leaf_record_is_written_as_the_protocol_wrote_it() {
        same_json::<Device, _, DeviceRecord>(ClaimDevice {
            request: "r".into(),
            device: "gpu-1".into(),
            uuid: "GPU-1".into(),
            minor: 1,
        });
        same_json::<Request, _, RequestRecord>(RequestDevices {
            request: "r".into(),
            cdi_device_ids: vec!["gpushare.io/claim=u-r".into()],
            devices: vec!["gpu-1".into()],
            per_device: vec![PreparedDeviceInfo {
                device: "gpu-1".into(),
                pool: "node".into(),
                cdi_device_ids: vec!["gpushare.io/claim=u-r".into()],
            }],
        });
        same_json::<MpsDaemon, _, MpsRecord>(MpsInfo {
            control_daemon_pid: 7,
            pipe_dir: "/run/gpushare/claims/u/mps-0a1b2/pipe".into(),
            log_dir: "/run/gpushare/claims/u/mps-0a1b2/log".into(),
            shm_dir: "/run/gpushare/claims/u/mps-0a1b2/shm".into(),
            visible_devices: vec!["GPU-1".into()],
            active_thread_percentage: "50.0".into(),
            pinned_device_memory_limits: BTreeMap::from([("0".into(), "8G".into())]),
            control_daemon_start_time: 12345,
            requested: MpsRequested {
                multi_user: true,
                active_thread_percentage: Some(50),
                pinned_limits_mib: vec![Some(8192), None],
                shm_bytes: 1 << 30,
            },
            restarts: 2,
        });
        for origin in [MigOrigin::Created, MigOrigin::Existing] {
            same_json::<MigSlice, _, MigSliceRecord>(MigInstanceInfo {
                request: "r".into(),
                device: "gpu-0-mig-3g20gb-9-4".into(),
                gpu_uuid: "GPU-0".into(),
                gpu_minor: 0,
                profile: "3g.20gb".into(),
                gi_profile_id: 9,
                placement_start: 4,
                memory_slices: 4,
                gi_id: 2,
                ci_id: Some(0),
                uuid: "MIG-b".into(),
                original_uuid: "MIG-a".into(),
                origin,
                enabled_mig_mode: true,
                destroying: true,
            });
        }
        same_json::<Attachment, _, AttachmentRecord>(AttachmentInfo {
            claim_uid: "u".into(),
            container_id: "c".into(),
            pid: Some(42),
            cgroup: Some("/kubepods/x".into()),
            bundle: Some("/run/bundle".into()),
            attached_at: 1_700_000_000,
            pod: Some(gpushare_proto::PodRef {
                namespace: "team-a".into(),
                name: "trainer-0".into(),
            }),
        });
    }
}
