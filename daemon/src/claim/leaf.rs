//! The leaf facts a claim holds, as the daemon's own types: a device of a group, the CDI
//! device IDs of a request, an MPS control daemon, a MIG slice, an attached container.
//!
//! They have the fields (and names) of the protocol's records of the same facts, so that
//! converting is field for field, but they are the daemon's: a change of the protocol changes
//! only [`super::wire`] (model ↔ protocol, for the socket's answers and the formats that were
//! the protocol's type on disk), and the disk's shape is `crate::store::leaf` (model ↔
//! record). Neither is serialized from here.

use std::collections::BTreeMap;

/// A device of a claim's group, as found on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The request it was allocated for.
    pub request: String,
    /// The allocated device name (`gpu-<minor>`, or a MIG device's
    /// `gpu-<minor>-mig-<profile>-<GI profile ID>-<start>`).
    pub device: String,
    /// GPU UUID (the parent's, for a MIG device).
    pub uuid: String,
    /// Minor number (`/dev/nvidia<minor>`).
    pub minor: u32,
}

/// The CDI devices prepared for one request of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The request's name in the claim (`parent/sub` for a subrequest of a prioritized list).
    pub request: String,
    /// Every fully-qualified CDI device ID the request's containers need, in the order a
    /// runtime applies them: the IDs of `per_device`, flattened.
    pub cdi_device_ids: Vec<String>,
    /// The allocated device names (e.g. `gpu-3`) behind them, in allocation order.
    pub devices: Vec<String>,
    /// One entry per allocated device, in `devices` order: the CDI device IDs a kubelet plugin
    /// puts on that device. An ID that serves the whole request (the claim device
    /// `gpushare.io/claim=…`) is on the request's last entry only, so that a runtime applies
    /// it once. Empty in records older than the field.
    pub per_device: Vec<PreparedDevice>,
}

/// The CDI device IDs of one allocated device of a prepared request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The allocated device name, as in the claim's allocation result (`gpu-3`,
    /// `gpu-2-mig-3g20gb-9-4`, or a GPU UUID).
    pub device: String,
    /// The allocation result's pool (the node name).
    pub pool: String,
    /// Fully-qualified CDI device IDs for this device, in the order a runtime applies them
    /// (driver files first where the daemon provides them, the claim device last).
    pub cdi_device_ids: Vec<String>,
}

/// The MPS control daemon of one device group (an MPS group's, or the one on a MIG group's
/// slices), as started and read back from the daemon itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDaemon {
    /// PID of the MPS control daemon; 0 before it was started (a claim recorded
    /// `PrepareStarted`).
    pub control_daemon_pid: i32,
    /// Host pipe directory (mounted at `/tmp/nvidia-mps` in containers).
    pub pipe_dir: String,
    /// Host log directory (`control.log`).
    pub log_dir: String,
    /// Host tmpfs mounted at `/dev/shm` in the daemon's and the containers' mount namespaces.
    pub shm_dir: String,
    /// `CUDA_VISIBLE_DEVICES` given to the daemon: the group's GPU UUIDs, sorted.
    pub visible_devices: Vec<String>,
    /// `get_default_active_thread_percentage` as read back, in percent, e.g. `"50.0"`.
    pub active_thread_percentage: String,
    /// `get_default_device_pinned_mem_limit <ordinal>` as read back, keyed by the CUDA ordinal
    /// inside the daemon in decimal (`"0"`, `"1"`), valued `"8G"` or `"800M"`. Only devices
    /// with a limit are listed; empty for a claim without limits. Records written before
    /// this rule may hold `""` for a device without a limit.
    pub pinned_device_memory_limits: BTreeMap<String, String>,
    /// Start time of the control daemon's process, in clock ticks after boot (field 22 of
    /// `/proc/<pid>/stat`): with the pid it names the process, so a recycled pid is never
    /// taken for the daemon. 0 when unknown (a record from an older version).
    pub control_daemon_start_time: u64,
    /// What was asked, so that a restarted daemon gets exactly the same limits (the read-back
    /// values above are lossy: `1536M` reads back as `1G`).
    pub requested: MpsAsked,
    /// How often gpushared restarted this daemon after it died.
    pub restarts: u32,
}

/// The limits and options an MPS control daemon was started with, as configured.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MpsAsked {
    /// Started with `-M` (multi-user).
    pub multi_user: bool,
    /// Default active thread percentage, in percent, 1–100; `None`: the daemon's default
    /// (100).
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory limit per CUDA ordinal, in MiB; `None`: no limit.
    pub pinned_limits_mib: Vec<Option<u64>>,
    /// Size of the shm tmpfs, in bytes.
    pub shm_bytes: u64,
}

/// A MIG slice (GPU instance with its one compute instance) a claim's group holds: one
/// gpushare created for it (recorded as soon as the GPU instance exists, so that a release
/// after a crash destroys it) or one that existed and was handed over (static MIG).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigSlice {
    /// The request it was allocated for.
    pub request: String,
    /// The allocated device name (`gpu-<minor>-mig-<profile>-<GI profile ID>-<start>`).
    pub device: String,
    /// Parent GPU UUID.
    pub gpu_uuid: String,
    /// Parent GPU minor.
    pub gpu_minor: u32,
    /// GPU-instance profile name, e.g. `3g.20gb`.
    pub profile: String,
    /// GPU-instance profile ID (`nvidia-smi mig -lgip`), e.g. 9.
    pub gi_profile_id: u32,
    /// First memory slice of its placement.
    pub placement_start: u32,
    /// Memory slices its placement spans.
    pub memory_slices: u32,
    /// GPU-instance ID the driver assigned.
    pub gi_id: u32,
    /// Compute-instance ID; `None` until the compute instance exists.
    pub ci_id: Option<u32>,
    /// `MIG-…` UUID read from the compute instance; empty until it exists.
    pub uuid: String,
    /// The MIG UUID the slice had when the claim was prepared, once the slice has been made
    /// again with another (after a GPU reset or a reboot, MIG UUIDs are never reused); empty
    /// while it is the slice first made. The claim's CDI device IDs keep naming it (kubelet
    /// caches them for the claim's whole life), and the driver's CDI spec keeps a device of
    /// that name with the edits of the slice's device now, while the claim holds the slice.
    pub original_uuid: String,
    /// Who made the instance: gpushare for this claim (destroyed at its release), or someone
    /// else before the claim (static MIG: never destroyed).
    pub origin: SliceOrigin,
    /// gpushare turned the parent GPU's MIG mode on for this slice, or for an earlier claim's
    /// slice on the GPU that this one took the flag over from: the release of the last slice
    /// carrying it turns MIG mode off again (on GPUs that leave MIG mode without a reset).
    pub enabled_mig_mode: bool,
    /// A release began destroying the instance: this was on disk before its compute instance
    /// was destroyed, so a crash part-way is finished at the next start (the GPU instance is
    /// then known as this record's with its recorded compute instance or with none).
    pub destroying: bool,
}

/// Who made a claim's MIG slice (see [`MigSlice::origin`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SliceOrigin {
    /// gpushare created it for the claim at prepare; it is destroyed at the claim's release.
    /// Records without an origin are this (every slice was, before static MIG).
    #[default]
    Created,
    /// It existed when the claim was prepared (`gpushare mig apply`, mig-parted,
    /// `nvidia-smi`): the claim uses it as it is and leaves it at release.
    Existing,
}

/// A container tied to a claim by the hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The claim's UID.
    pub claim_uid: String,
    /// OCI container id.
    pub container_id: String,
    /// Host PID of the container's init process, if the runtime gave one.
    pub pid: Option<i32>,
    /// The container's cgroup path (from `/proc/<pid>/cgroup`), if it could be read.
    pub cgroup: Option<String>,
    /// OCI bundle directory, if given.
    pub bundle: Option<String>,
    /// When it attached, in seconds since the Unix epoch.
    pub attached_at: u64,
    /// The Kubernetes pod it belongs to, when its runtime named it (its annotations, read by
    /// the hook).
    pub pod: Option<Pod>,
}

/// A Kubernetes pod, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
}
