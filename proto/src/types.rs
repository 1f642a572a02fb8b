//! Request, response, and result shapes. Field names are `snake_case` on the wire.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One request line: `{"version":1,"id":7,"method":"get_claim","params":{"uid":"…"}}`.
///
/// `params` may be omitted for methods that take none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// Protocol version, from [`crate::OLDEST_PROTOCOL_VERSION`] to
    /// [`crate::PROTOCOL_VERSION`]: what the method means (only `list_claims` differs).
    pub version: u32,
    /// Caller-chosen id, echoed in the response.
    pub id: u64,
    /// One of [`Method`]'s names.
    pub method: String,
    /// Method parameters; shape depends on `method`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

/// One response line: exactly one of `result` or `error` is present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The request's protocol version ([`crate::OLDEST_PROTOCOL_VERSION`] when the request
    /// could not be read far enough to find it).
    pub version: u32,
    /// The request's id (0 when the request could not be read far enough to find it).
    pub id: u64,
    /// The method's result on success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// Why the request failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

/// The methods of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// Prepare a claim ([`PrepareParams`] → [`PrepareResult`]). Idempotent per claim UID.
    Prepare,
    /// Release a claim ([`UidParams`] → [`UnprepareResult`]). Idempotent.
    Unprepare,
    /// One claim ([`UidParams`] → [`ClaimInfo`]).
    GetClaim,
    /// All claims: in protocol version 1 no params → `Vec<ClaimInfo>`; in version 2
    /// [`ListClaimsParams`] → [`ClaimPage`].
    ListClaims,
    /// All GPUs of the node (no params → `Vec<GpuInfo>`).
    ListGpus,
    /// Tie a container to a claim ([`AttachParams`] → [`Attachment`]).
    Attach,
    /// Untie a container from a claim ([`DetachParams`] → [`DetachResult`]).
    Detach,
    /// Liveness and readiness (no params → [`HealthInfo`]).
    Health,
    /// Versions (no params → [`VersionInfo`]).
    Version,
    /// Plan or apply a mig-parted v1 MIG layout ([`MigApplyParams`] → [`MigApplyResult`]).
    MigApply,
}

impl Method {
    /// Every method, in documentation order.
    pub const ALL: [Method; 10] = [
        Method::Prepare,
        Method::Unprepare,
        Method::GetClaim,
        Method::ListClaims,
        Method::ListGpus,
        Method::Attach,
        Method::Detach,
        Method::Health,
        Method::Version,
        Method::MigApply,
    ];

    /// The method's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Prepare => "prepare",
            Method::Unprepare => "unprepare",
            Method::GetClaim => "get_claim",
            Method::ListClaims => "list_claims",
            Method::ListGpus => "list_gpus",
            Method::Attach => "attach",
            Method::Detach => "detach",
            Method::Health => "health",
            Method::Version => "version",
            Method::MigApply => "mig_apply",
        }
    }

    /// Parses a wire name; `None` for an unknown method.
    pub fn parse(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.as_str() == name)
    }

    /// Whether the method changes state (and so needs a privileged peer).
    pub fn is_changing(self) -> bool {
        matches!(
            self,
            Method::Prepare
                | Method::Unprepare
                | Method::Attach
                | Method::Detach
                | Method::MigApply
        )
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Stable, machine-readable error codes. Callers branch on these, never on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// A sharing config is malformed or out of range (field and value named in the message).
    InvalidConfig,
    /// The request itself is malformed: bad JSON, unknown method, bad claim object or UID.
    InvalidRequest,
    /// The claim's allocation names a pool other than this node.
    WrongNode,
    /// The allocation names a device this node does not have.
    UnknownDevice,
    /// The claim conflicts with what other claims hold (mode, interval, exclusivity).
    Conflict,
    /// The request is valid but this node or build cannot do it (e.g. a MIG mode change that
    /// needs a GPU reset, or a GPU without MIG).
    Unsupported,
    /// The claim exists but is not ready (e.g. its MPS control daemon is gone).
    NotReady,
    /// No claim with that UID.
    NotFound,
    /// The claim's attach limit (`replicas`) is reached.
    LimitReached,
    /// The peer may not call this method.
    PermissionDenied,
    /// A `prepare` older than a release of the same claim (a late kubelet retry): refused,
    /// nothing changed; the claim stays released.
    Stale,
    /// The daemon has no connection slot for this peer now: all of them are in use, or the
    /// share of peers that are neither root nor in `changing_uids`, or this uid's own share
    /// (the message says which and names the config key). Sent with `id` 0 before the request
    /// is read, then the connection is closed; nothing was done. Retry later.
    Busy,
    /// Anything else; the message says what failed on the host.
    Internal,
}

impl ErrorCode {
    /// The code's wire name, e.g. `"InvalidConfig"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidConfig => "InvalidConfig",
            ErrorCode::InvalidRequest => "InvalidRequest",
            ErrorCode::WrongNode => "WrongNode",
            ErrorCode::UnknownDevice => "UnknownDevice",
            ErrorCode::Conflict => "Conflict",
            ErrorCode::Unsupported => "Unsupported",
            ErrorCode::NotReady => "NotReady",
            ErrorCode::NotFound => "NotFound",
            ErrorCode::LimitReached => "LimitReached",
            ErrorCode::PermissionDenied => "PermissionDenied",
            ErrorCode::Stale => "Stale",
            ErrorCode::Busy => "Busy",
            ErrorCode::Internal => "Internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error answer: a stable code and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable code.
    pub code: ErrorCode,
    /// One line naming the field and value at fault.
    pub message: String,
}

impl fmt::Display for ErrorBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Parameters of `prepare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrepareParams {
    /// A whole `ResourceClaim` object (`resource.k8s.io` v1, v1beta1 or v1beta2) as JSON, with
    /// its `status.allocation`.
    pub claim: Value,
}

/// Parameters of `unprepare` and `get_claim`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UidParams {
    /// The claim's `metadata.uid`.
    pub uid: String,
}

/// Parameters of `list_claims` in protocol version 2 (both optional; version 1 takes none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListClaimsParams {
    /// Most claims in the page, at least 1; the daemon gives at most
    /// [`crate::MAX_CLAIMS_PAGE`] (a larger limit is lowered to it), and that many when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The `continue` of the previous page; absent for the first page.
    #[serde(default, rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_from: Option<String>,
}

/// Result of `list_claims` in protocol version 2: one page of claims, by UID.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimPage {
    /// The page's claims, in UID order.
    pub claims: Vec<ClaimInfo>,
    /// Where the next page starts (pass it back as the params' `continue`; its content is the
    /// daemon's business); `None` on the last page.
    #[serde(rename = "continue")]
    pub next: Option<String>,
}

/// CDI devices prepared for one request of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestDevices {
    /// The request's name in the claim (`parent/sub` for a subrequest of a prioritized list).
    pub request: String,
    /// Every fully-qualified CDI device ID the request's containers need, in the order a
    /// runtime applies them: the same IDs as `per_device`, flattened (for clients that want one
    /// list, such as `gpushare-runtime`'s `GPUSHARE_VISIBLE_DEVICES`).
    pub cdi_device_ids: Vec<String>,
    /// The allocated device names (e.g. `gpu-3`) behind them, in allocation order.
    pub devices: Vec<String>,
    /// One entry per allocated device, in `devices` order: the CDI device IDs that a kubelet
    /// plugin puts on that device's `Device` of `NodePrepareResources`. An ID that serves the
    /// whole request (the claim device `gpushare.io/claim=…`) is on exactly one entry, the
    /// request's last, because kubelet hands the runtime every ID of every `Device` and an ID
    /// given twice would be applied twice. Absent (empty) from daemons older than this field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_device: Vec<PreparedDevice>,
}

/// The CDI device IDs of one allocated device of a prepared request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// Result of `prepare`: what a kubelet plugin hands back from `NodePrepareResources`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrepareResult {
    /// The claim's UID.
    pub uid: String,
    /// One entry per request, in the claim's allocation order.
    pub requests: Vec<RequestDevices>,
    /// `true` when the claim was already prepared and nothing was done.
    pub already_prepared: bool,
}

/// Result of `unprepare`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnprepareResult {
    /// The claim's UID.
    pub uid: String,
    /// `false` when there was no such claim (nothing to do; not an error).
    pub released: bool,
}

/// Lifecycle state of a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClaimState {
    /// Host setup is in progress.
    PrepareStarted,
    /// Every strategy is applied and verified; containers may attach.
    Prepared,
    /// Release is in progress.
    Unpreparing,
    /// Prepared, but an MPS control daemon of the claim died and is being restarted; new
    /// containers are refused (the claim's `last_error` says why) until it runs again with
    /// verified limits.
    Degraded,
}

/// Time-slice interval as NVIDIA names it; the number is what `nvidia-smi compute-policy
/// --set-timeslice` takes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub enum TimeSliceInterval {
    /// Driver default (0).
    #[default]
    Default,
    /// Shorter slices (1).
    Short,
    /// Medium slices (2).
    Medium,
    /// Longer slices (3).
    Long,
}

impl TimeSliceInterval {
    /// The `nvidia-smi compute-policy --set-timeslice` value, 0–3.
    pub fn as_int(self) -> u8 {
        match self {
            TimeSliceInterval::Default => 0,
            TimeSliceInterval::Short => 1,
            TimeSliceInterval::Medium => 2,
            TimeSliceInterval::Long => 3,
        }
    }

    /// The interval of an `nvidia-smi compute-policy --set-timeslice` value; `None` above 3.
    pub fn from_int(n: u8) -> Option<TimeSliceInterval> {
        [
            TimeSliceInterval::Default,
            TimeSliceInterval::Short,
            TimeSliceInterval::Medium,
            TimeSliceInterval::Long,
        ]
        .into_iter()
        .find(|i| i.as_int() == n)
    }

    /// NVIDIA's name (`Default`, `Short`, `Medium`, `Long`).
    pub fn as_str(self) -> &'static str {
        match self {
            TimeSliceInterval::Default => "Default",
            TimeSliceInterval::Short => "Short",
            TimeSliceInterval::Medium => "Medium",
            TimeSliceInterval::Long => "Long",
        }
    }
}

/// GPU compute mode as NVML names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum ComputeMode {
    /// Many processes per GPU (0).
    #[default]
    Default,
    /// No CUDA contexts (2).
    Prohibited,
    /// One process per GPU (3); what MPS wants, so only the MPS server holds the GPU.
    ExclusiveProcess,
}

/// A device of a claim, as found on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimDevice {
    /// The request it was allocated for.
    pub request: String,
    /// The allocated device name (`gpu-<minor>`).
    pub device: String,
    /// GPU UUID.
    pub uuid: String,
    /// Minor number (`/dev/nvidia<minor>`).
    pub minor: u32,
}

/// MPS control daemon of one device group, as read back from the daemon itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsInfo {
    /// PID of the MPS control daemon.
    pub control_daemon_pid: i32,
    /// Host pipe directory (mounted at `/tmp/nvidia-mps` in containers).
    pub pipe_dir: String,
    /// Host log directory (`control.log`).
    pub log_dir: String,
    /// Host tmpfs mounted at `/dev/shm` in the daemon's and the containers' mount namespaces.
    pub shm_dir: String,
    /// `CUDA_VISIBLE_DEVICES` given to the daemon: the group's GPU UUIDs, sorted.
    pub visible_devices: Vec<String>,
    /// `get_default_active_thread_percentage` as read back, e.g. `"50.0"`.
    pub active_thread_percentage: String,
    /// `get_default_device_pinned_mem_limit <ordinal>` as read back, keyed by the CUDA ordinal
    /// inside the daemon written in decimal (`"0"`, `"1"`; string keys because JSON object keys
    /// are strings), valued `"8G"` or `"800M"`. Only devices with a limit are listed (each
    /// other device is read back too, and must show none); `{}` for a claim without limits.
    /// Records written before this rule may hold `""` for a device without a limit.
    pub pinned_device_memory_limits: BTreeMap<String, String>,
    /// Start time of the control daemon's process, in clock ticks after boot (field 22 of
    /// `/proc/<pid>/stat`): with the pid it names the process, so a recycled pid is never taken
    /// for the daemon. 0 when unknown (a record from an older version).
    #[serde(default)]
    pub control_daemon_start_time: u64,
    /// What was asked, so that a restarted daemon gets exactly the same limits (the read-back
    /// values above are lossy: `1536M` reads back as `1G`).
    #[serde(default)]
    pub requested: MpsRequested,
    /// How often gpushared restarted this daemon after it died.
    #[serde(default)]
    pub restarts: u32,
}

/// The limits and options an MPS control daemon was started with, as configured.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MpsRequested {
    /// Started with `-M` (multi-user).
    #[serde(default)]
    pub multi_user: bool,
    /// Default active thread percentage, 1–100; `None`: the daemon's default (100).
    #[serde(default)]
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory limit per CUDA ordinal, in MiB; `None`: no limit.
    #[serde(default)]
    pub pinned_limits_mib: Vec<Option<u64>>,
    /// Size of the shm tmpfs in bytes.
    #[serde(default)]
    pub shm_bytes: u64,
}

/// The sharing strategy applied to one device group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy")]
// A claim holds a handful of these and they travel as JSON: boxing the MPS variant would only
// add an allocation and noise at every match.
#[allow(clippy::large_enum_variant)]
pub enum StrategyInfo {
    /// The group's GPUs belong to this claim alone; nothing was changed on them.
    Exclusive,
    /// The GPUs run with this time-slice interval.
    TimeSlicing {
        /// Interval applied to each GPU of the group.
        interval: TimeSliceInterval,
    },
    /// The group runs under its own MPS control daemon.
    Mps(MpsInfo),
}

/// One device group: results that share one config object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// Requests whose devices form the group.
    pub requests: Vec<String>,
    /// GPUs of the group, sorted by UUID.
    pub devices: Vec<ClaimDevice>,
    /// What is applied to them.
    pub sharing: StrategyInfo,
    /// MIG instances created for the group's MIG devices (empty for whole GPUs). `sharing`
    /// then applies to the slices: `Exclusive` (the slice alone) or `Mps` (an MPS control
    /// daemon on the slice). Read as empty when an older daemon or checkpoint leaves it out.
    #[serde(default)]
    pub mig: Vec<MigInstanceInfo>,
}

/// A MIG instance (GPU instance with its one compute instance) a claim holds: one gpushare
/// created for it (recorded as soon as the GPU instance exists, so that a release after a
/// crash destroys it) or one that existed and was handed over (static MIG).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstanceInfo {
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
    #[serde(default)]
    pub ci_id: Option<u32>,
    /// `MIG-…` UUID read from the compute instance; empty until it exists.
    #[serde(default)]
    pub uuid: String,
    /// The MIG UUID the slice had when the claim was prepared, once the slice has been made
    /// again with another (after a GPU reset or a reboot, MIG UUIDs are never reused); empty
    /// while it is the slice first made (and from older daemons). The claim's CDI device IDs keep naming it
    /// (`gpushare.io/gpu=MIG-<original>`: kubelet caches them for the claim's whole life),
    /// and the driver's CDI spec keeps a device of that name with the edits of the slice's
    /// device now, while the claim holds the slice.
    #[serde(default)]
    pub original_uuid: String,
    /// Who made the instance: gpushare for this claim (destroyed at its release), or someone
    /// else before the claim (static MIG: handed over as it is, never destroyed). Records
    /// without the field are `created` (every slice was, before static MIG).
    #[serde(default)]
    pub origin: MigOrigin,
    /// gpushare turned the parent GPU's MIG mode on for this slice, or for an earlier claim's
    /// slice on the GPU that this one took the flag over from: the release of the last slice
    /// carrying it turns MIG mode off again (on GPUs that leave MIG mode without a reset).
    #[serde(default)]
    pub enabled_mig_mode: bool,
    /// A release began destroying the instance: this was on disk before its compute instance
    /// was destroyed, so a crash part-way is finished at the next start (the GPU instance is
    /// then known as this record's with its recorded compute instance or with none). Read as
    /// false when absent.
    #[serde(default)]
    pub destroying: bool,
}

/// Who made a claim's MIG instance (see [`MigInstanceInfo::origin`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MigOrigin {
    /// gpushare created it for the claim at prepare; it is destroyed at the claim's release.
    #[default]
    Created,
    /// It existed when the claim was prepared (`gpushare mig apply`, mig-parted,
    /// `nvidia-smi`): the claim uses it as it is and leaves it at release.
    Existing,
}

/// Params of `mig_apply`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigApplyParams {
    /// The mig-parted v1 config file's text (YAML or JSON).
    pub layout: String,
    /// Name of the config under `mig-configs` to apply.
    pub config: String,
    /// Only plan: change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What `mig_apply` planned (and, unless a dry run, did) per GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigApplyResult {
    /// The config applied.
    pub config: String,
    /// Nothing was changed.
    pub dry_run: bool,
    /// One entry per GPU the config selects.
    pub gpus: Vec<MigGpuPlan>,
}

/// The plan for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGpuPlan {
    /// Device name (`gpu-<minor>`).
    pub gpu: String,
    /// MIG mode set (`true` enable, `false` disable), when it changes.
    #[serde(default)]
    pub set_mig_mode: Option<bool>,
    /// MIG devices destroyed, by device name.
    pub destroy: Vec<String>,
    /// MIG devices created, by device name (with their MIG UUIDs once applied:
    /// `name=MIG-…`).
    pub create: Vec<String>,
    /// What is left to do by hand, e.g. a MIG mode change pending a GPU reset.
    #[serde(default)]
    pub note: Option<String>,
    /// Claims holding the GPU when the plan would change it: a plan shows it marked, an
    /// apply refuses it (`Conflict`) until they are released. Read as empty from daemons
    /// before this field.
    #[serde(default)]
    pub held_by: Vec<String>,
}

/// A container tied to a claim by the hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Seconds since the Unix epoch.
    pub attached_at: u64,
    /// The Kubernetes pod the container belongs to, when its runtime named it (null for a
    /// container started outside Kubernetes, and from daemons before this field).
    #[serde(default)]
    pub pod: Option<PodRef>,
}

/// The Kubernetes pod a container belongs to, as its runtime names it in the container's
/// annotations: containerd's CRI plugin sets `io.kubernetes.cri.sandbox-namespace` and
/// `io.kubernetes.cri.sandbox-name`, CRI-O `io.kubernetes.pod.namespace` and
/// `io.kubernetes.pod.name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodRef {
    /// The pod's namespace (a DNS label: at most 63 characters).
    pub namespace: String,
    /// The pod's name (a DNS subdomain: at most 253 characters).
    pub name: String,
}

/// The annotation pairs (namespace, name) that name a container's pod, per runtime.
const POD_ANNOTATIONS: [(&str, &str); 2] = [
    (
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
    ),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name"),
];

impl PodRef {
    /// The pod named by a container's OCI annotations, or `None` when no runtime's pair is
    /// there or its values are not a valid namespace and pod name.
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Option<PodRef> {
        POD_ANNOTATIONS.iter().find_map(|(ns, name)| {
            let pod = PodRef {
                namespace: annotations.get(*ns)?.clone(),
                name: annotations.get(*name)?.clone(),
            };
            pod.is_valid().then_some(pod)
        })
    }

    /// Whether the namespace is a DNS label (at most 63 characters) and the name a DNS
    /// subdomain (at most 253, its dot-separated parts of any length), lower case, as the API
    /// server's RFC 1123 checks require of them.
    pub fn is_valid(&self) -> bool {
        let part = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        self.namespace.len() <= 63
            && part(&self.namespace)
            && self.name.len() <= 253
            && self.name.split('.').all(part)
    }
}

impl fmt::Display for PodRef {
    /// `namespace/name`, as kubectl names a pod.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Everything the daemon knows about one claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Lifecycle state.
    pub state: ClaimState,
    /// Device groups with their strategies.
    pub groups: Vec<GroupInfo>,
    /// CDI devices per request.
    pub requests: Vec<RequestDevices>,
    /// Path of the claim's CDI spec file.
    pub cdi_spec: String,
    /// Most containers that may be attached at once (`replicas`), if limited.
    pub attach_limit: Option<u32>,
    /// Containers attached now.
    pub attached: Vec<Attachment>,
    /// Last thing that went wrong with the claim after it was prepared (an MPS control
    /// daemon that died, a restart that failed), with the time in its text; kept after
    /// recovery as history.
    #[serde(default)]
    pub last_error: Option<String>,
    /// MPS control daemon restarts of all groups together.
    #[serde(default)]
    pub restarts: u32,
    /// `metadata.resourceVersion` of the claim object that was prepared, when it had one.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// Daemon-wide sequence number of the prepare that created this record: a release leaves
    /// a tombstone with a later one, so a prepare that started before the release can never
    /// bring the claim back.
    #[serde(default)]
    pub generation: u64,
}

/// How a GPU is shared right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuSharing {
    /// No claim holds it.
    Free,
    /// One claim holds it whole.
    Exclusive,
    /// Claims time-slice it.
    TimeSlicing,
    /// Claims' MPS control daemons share it.
    Mps,
    /// Claims hold MIG instances of it.
    Mig,
}

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Device name as allocated (`gpu-<minor>`).
    pub name: String,
    /// Minor number.
    pub minor: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA A100-SXM4-40GB`.
    pub product_name: String,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// Current compute mode.
    pub compute_mode: ComputeMode,
    /// Current time-slice interval.
    pub time_slice: TimeSliceInterval,
    /// Sharing mode held by claims.
    pub sharing: GpuSharing,
    /// UIDs of the claims holding it.
    pub claims: Vec<String>,
    /// Brand as NVML names it, e.g. `Nvidia` or `Tesla` (empty from daemons before this field).
    #[serde(default)]
    pub brand: String,
    /// Architecture, e.g. `Ampere`, `Hopper`, `Ada Lovelace`.
    #[serde(default)]
    pub architecture: String,
    /// CUDA compute capability as `major.minor`, e.g. `8.0`.
    #[serde(default)]
    pub cuda_compute_capability: String,
    /// Kernel driver version as NVML reports it, e.g. `570.172.08`.
    #[serde(default)]
    pub driver_version: String,
    /// Highest CUDA version the driver supports, `major.minor`, e.g. `12.8`.
    #[serde(default)]
    pub cuda_driver_version: String,
    /// PCI bus ID as NVML reports it, e.g. `00000000:10:1C.0`.
    #[serde(default)]
    pub pci_bus_id: String,
    /// NUMA node of the GPU; `None` when the platform does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// The GPU supports MIG.
    #[serde(default)]
    pub mig_capable: bool,
    /// MIG mode is currently enabled.
    #[serde(default)]
    pub mig_enabled: bool,
    /// MIG mode after the next GPU reset (`nvmlDeviceGetMigMode`'s pending mode): differs
    /// from `mig_enabled` while a change waits for a reset (Ampere). `None` (null) for GPUs
    /// without MIG, and read as `None` from daemons before this field.
    #[serde(default)]
    pub mig_pending: Option<bool>,
    /// MIG devices that exist on it now (only when MIG mode is enabled).
    #[serde(default)]
    pub mig_devices: Vec<MigDeviceInfo>,
    /// What gpushared can make of the GPU's MIG layout at a claim's prepare (dynamic MIG),
    /// for the ResourceSlice's partitionable devices; `None` (null) for GPUs whose layout
    /// gpushare does not change (no MIG, or no profile tables for the model), and read as
    /// `None` from daemons before this field.
    #[serde(default)]
    pub mig_partitions: Option<MigPartitions>,
}

/// What gpushared can make of one MIG-capable GPU's layout now, computed from its MIG model
/// (profile tables, placements, MIG mode and the instances that exist): what a DRA driver
/// publishes as partitionable devices (KEP-4815), as NVIDIA's DynamicMIG does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigPartitions {
    /// A whole-GPU claim can have the GPU now: MIG mode off with no change pending, or on
    /// (no change pending, no instance that no claim owns) on a GPU that turns it off without
    /// a reset (Hopper and later). `false` on Ampere in MIG mode.
    pub whole_gpu: bool,
    /// MIG slices can be created at a claim's prepare now: MIG mode on with no change
    /// pending, or off on a GPU that turns it on without a reset. `false` on Ampere with MIG
    /// mode off (enabling it needs a reset) and on any GPU with a mode change pending.
    pub slices: bool,
    /// Memory slices of the GPU (placements lie in `0..memory_slices`; 8 on A100/H100/H200).
    pub memory_slices: u32,
    /// What the GPU's slices draw from, per dimension: the most that any valid layout of the
    /// GPU uses (at least the largest profile's). The ResourceSlice's counter set.
    pub capacity: MigCapacity,
    /// Every (profile, placement) a claim can be given: empty unless `slices`; placements
    /// that overlap a MIG instance no claim owns (made by `gpushare mig apply`, mig-parted or
    /// nvidia-smi), or that its profile's instance count rules out beside them, are left out.
    /// Placements of instances claims own are listed (those claims hold them).
    pub placements: Vec<MigSlot>,
}

/// Capacities of a MIG slice, or of a whole GPU's counter set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigCapacity {
    /// Memory in MiB (NVML's profile `memorySizeMB`, summed for a layout).
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
}

/// One (GPU-instance profile, placement) of a GPU: a MIG slice a claim can be given. Its
/// device name is the MIG device's it becomes,
/// `gpu-<minor>-mig-<profile, letters and digits only>-<gi_profile_id>-<placement_start>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSlot {
    /// GPU-instance profile name, e.g. `3g.20gb`.
    pub profile: String,
    /// GPU-instance profile ID as `nvidia-smi mig -lgip` shows it, e.g. 9 for `3g.20gb`.
    pub gi_profile_id: u32,
    /// First memory slice of the placement.
    pub placement_start: u32,
    /// Memory slices the placement spans.
    pub memory_slices: u32,
    /// What the slice has (and draws from the GPU's counter set).
    pub capacity: MigCapacity,
}

impl MigSlot {
    /// The device name NVIDIA's DRA driver gives the slice (the same as the MIG device's
    /// once it exists, [`MigDeviceInfo::device_name`]).
    pub fn device_name(&self, parent_minor: u32) -> String {
        mig_device_name(
            parent_minor,
            &self.profile,
            self.gi_profile_id,
            self.placement_start,
        )
    }
}

fn mig_device_name(parent_minor: u32, profile: &str, gi_profile_id: u32, start: u32) -> String {
    let profile: String = profile
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    format!("gpu-{parent_minor}-mig-{profile}-{gi_profile_id}-{start}")
}

/// A MIG device (GPU instance with one full compute instance) of a GPU in MIG mode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDeviceInfo {
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// GPU-instance profile name, e.g. `3g.20gb`.
    pub profile: String,
    /// GPU-instance profile ID as `nvidia-smi mig -lgip` shows it, e.g. 9 for `3g.20gb`.
    pub gi_profile_id: u32,
    /// First memory slice of its placement.
    pub placement_start: u32,
    /// Memory slices its placement spans (4 for `3g.20gb`).
    pub memory_slices: u32,
    /// Memory in MiB (NVML's profile `memorySizeMB`).
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
    /// GPU-instance ID, when the backend reads live instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
    /// UID of the claim that created and owns it; `None` for instances no claim owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl MigDeviceInfo {
    /// The device name NVIDIA's DRA driver gives it:
    /// `gpu-<minor>-mig-<profile, letters and digits only>-<GI profile id>-<placement start>`.
    pub fn device_name(&self, parent_minor: u32) -> String {
        mig_device_name(
            parent_minor,
            &self.profile,
            self.gi_profile_id,
            self.placement_start,
        )
    }
}

/// Parameters of `attach` (sent by `gpushare-cdi-hook attach` at `createRuntime`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachParams {
    /// The claim's UID (from the hook's arguments in the CDI spec).
    pub claim_uid: String,
    /// OCI container id.
    pub container_id: String,
    /// Host PID of the container's init process.
    #[serde(default)]
    pub pid: Option<i32>,
    /// OCI bundle directory.
    #[serde(default)]
    pub bundle: Option<String>,
    /// The Kubernetes pod the container belongs to, from its annotations
    /// ([`PodRef::from_annotations`]); omitted or null when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// Parameters of `detach` (sent by `gpushare-cdi-hook detach` at `poststop`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetachParams {
    /// The claim's UID.
    pub claim_uid: String,
    /// OCI container id.
    pub container_id: String,
}

/// Result of `detach`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetachResult {
    /// `false` when the container was not attached (nothing to do; not an error).
    pub detached: bool,
}

/// Result of `health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthInfo {
    /// The daemon accepts changing requests.
    pub ready: bool,
    /// Node (pool) name allocations must name.
    pub node_name: String,
    /// Number of GPUs found.
    pub gpus: usize,
    /// Number of claims held.
    pub claims: usize,
    /// GPU backend in use (`simulated:<profile>` or `nvml`).
    pub backend: String,
    /// Path of the MPS control program in use.
    pub mps_control: String,
    /// Set when the checkpoint found at start was corrupt: where it was moved and why it
    /// was refused. The daemon rebuilt what it could from the host.
    #[serde(default)]
    pub checkpoint_quarantined: Option<String>,
    /// Claim records refused at start (from the checkpoint or a host record: an invalid
    /// UID, a path outside the claim's directories, a CDI device ID not the claim's), one
    /// line each: the claim, why, and where the refused record is kept
    /// (`<state-dir>/quarantine/`). Those claims were not re-adopted. Empty from daemons
    /// before this field.
    #[serde(default)]
    pub quarantined_records: Vec<String>,
    /// Set while the checkpoint cannot be written (say, the disk is full): the error of the
    /// last attempt. Changing requests fail meanwhile and change nothing.
    #[serde(default)]
    pub checkpoint_error: Option<String>,
    /// Claims in state `Degraded`.
    #[serde(default)]
    pub degraded_claims: usize,
    /// The daemon is stopping (SIGTERM): changing requests are refused.
    #[serde(default)]
    pub stopping: bool,
    /// The DRA driver names whose allocation results it serves (`[node] drivers`); a DRA
    /// kubelet plugin checks its own driver name against them. Empty from daemons before
    /// this field.
    #[serde(default)]
    pub drivers: Vec<String>,
    /// The NVIDIA driver's CDI spec that every prepared device needs (`[cdi] driver_spec =
    /// "toolkit"`): whether it can be generated now. `None` with `driver_spec = "none"`, and
    /// from daemons before this field.
    #[serde(default)]
    pub driver_spec: Option<DriverSpecHealth>,
}

/// The driver's CDI spec in [`HealthInfo`]: while its generation fails, every prepare that
/// needs it (all of them, unless `[cdi] driver_spec = "none"`) is refused with `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverSpecHealth {
    /// The spec file gpushared installs (`<cdi-dir>/gpushare.io-gpu.json` by default).
    pub path: String,
    /// What generates it, e.g. `/usr/bin/nvidia-ctk cdi generate (driver root /)`.
    pub generator: String,
    /// A spec is installed and its last generation succeeded: prepares can have it.
    pub ok: bool,
    /// Why the last generation failed (the generator's own words, e.g. `Failed to initialize
    /// NVML: Driver/library version mismatch`); `None` while `ok`.
    #[serde(default)]
    pub error: Option<String>,
    /// Failed generations in a row (0 while `ok`).
    #[serde(default)]
    pub failures: u32,
    /// Seconds until gpushared runs the generator again on its own (it backs off while
    /// generations fail; a change of the generator, the driver's libraries or its kernel
    /// module, a reload or a restart tries at once). `None` while `ok`, and while the toolkit
    /// is not installed (looked for again at every prepare, which costs nothing).
    #[serde(default)]
    pub retry_in_seconds: Option<u64>,
    /// The bound of one generation (`[cdi] generate_timeout_seconds`); `None` for the
    /// simulated generator, which runs no program.
    #[serde(default)]
    pub generate_timeout_seconds: Option<u64>,
}

/// Result of `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// `gpushared`'s version.
    pub daemon: String,
    /// The protocol version it speaks.
    pub protocol: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn a_containers_pod_is_read_from_containerds_or_cri_os_annotations_and_checked() {
        let containerd = annotations(&[
            ("io.kubernetes.cri.sandbox-namespace", "ml-workloads"),
            ("io.kubernetes.cri.sandbox-name", "inference-pod"),
            ("io.kubernetes.cri.container-name", "cuda"),
        ]);
        let want = PodRef {
            namespace: "ml-workloads".into(),
            name: "inference-pod".into(),
        };
        assert_eq!(PodRef::from_annotations(&containerd), Some(want.clone()));
        assert_eq!(want.to_string(), "ml-workloads/inference-pod");
        let crio = annotations(&[
            ("io.kubernetes.pod.namespace", "team-a"),
            ("io.kubernetes.pod.name", "trainer-0.shard-1"),
        ]);
        assert_eq!(
            PodRef::from_annotations(&crio).map(|p| p.to_string()),
            Some("team-a/trainer-0.shard-1".into())
        );
        // A pod name's parts may be longer than a DNS label (only the whole is bounded).
        let long = format!("{}.x", "p".repeat(100));
        let pod = PodRef {
            namespace: "a".into(),
            name: long,
        };
        assert!(pod.is_valid());
        assert!(!PodRef {
            name: "p".repeat(254),
            ..pod
        }
        .is_valid());
        // Half a pair, or names the API server would never have admitted: no pod.
        for bad in [
            annotations(&[("io.kubernetes.cri.sandbox-name", "p")]),
            annotations(&[
                ("io.kubernetes.cri.sandbox-namespace", "Team"),
                ("io.kubernetes.cri.sandbox-name", "p"),
            ]),
            annotations(&[
                ("io.kubernetes.cri.sandbox-namespace", "a"),
                ("io.kubernetes.cri.sandbox-name", "p/../../etc"),
            ]),
            annotations(&[
                ("io.kubernetes.cri.sandbox-namespace", &"n".repeat(64)),
                ("io.kubernetes.cri.sandbox-name", "p"),
            ]),
            annotations(&[
                ("io.kubernetes.cri.sandbox-namespace", "a"),
                ("io.kubernetes.cri.sandbox-name", "-p"),
            ]),
            annotations(&[]),
        ] {
            assert_eq!(PodRef::from_annotations(&bad), None, "{bad:?}");
        }
    }

    #[test]
    fn attach_params_without_a_pod_are_written_as_before_the_field() {
        // A gpushared before `pod` refuses unknown fields, even a null one.
        let p = AttachParams {
            claim_uid: "u".into(),
            container_id: "c".into(),
            pid: Some(1),
            bundle: None,
            pod: None,
        };
        let v = serde_json::to_value(&p).unwrap();
        assert!(v.get("pod").is_none(), "{v}");
        let back: AttachParams = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }
}
