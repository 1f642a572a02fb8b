//! The protocol's view of a claim, converted here and only here: the lifecycle's [`Phase`]
//! as `gpushare_proto::ClaimState`, and a [`Claim`] as `gpushare_proto::ClaimInfo`, for the
//! socket's answers (`crate::server`) and for the formats that were the protocol's type on
//! disk (the version 2 checkpoint, format 3 records, host records before format 4: read
//! back in `crate::store` and `crate::service`, and the version 2 downgrade export).
//!
//! The leaf facts ([`super::leaf`]) are converted here too, field for field, to and from the
//! protocol's records of them (`ClaimDevice`, `RequestDevices`, `MpsInfo`, `MigInstanceInfo`,
//! `Attachment`): the socket answers with those, and the old formats hold them.
//!
//! The protocol has no MIG strategy: a MIG group is `Exclusive` (the slices alone) or `Mps`
//! (a daemon on them) beside its `mig` instances. [`group_of_old`] is the one place that
//! tells a MIG group from those, by its instances or its devices' names.

use gpushare_proto::{
    Attachment as AttachmentInfo, ClaimDevice, ClaimInfo, ClaimState, GroupInfo, MigInstanceInfo,
    MigOrigin, MpsInfo, MpsRequested, PodRef, PreparedDevice as PreparedDeviceInfo, RequestDevices,
    StrategyInfo,
};

use std::collections::BTreeMap;

use super::leaf::{
    Attachment, Device, MigSlice, MpsAsked, MpsDaemon, Pod, PreparedDevice, Request, SliceOrigin,
};
use super::lifecycle::Cause;
use super::model::{Claim, Group, MigSharing, Sharing};
use super::Phase;

impl From<Phase> for ClaimState {
    fn from(p: Phase) -> ClaimState {
        match p {
            Phase::PrepareStarted => ClaimState::PrepareStarted,
            Phase::Prepared => ClaimState::Prepared,
            Phase::Degraded => ClaimState::Degraded,
            Phase::Unpreparing => ClaimState::Unpreparing,
        }
    }
}

impl From<ClaimState> for Phase {
    fn from(s: ClaimState) -> Phase {
        match s {
            ClaimState::PrepareStarted => Phase::PrepareStarted,
            ClaimState::Prepared => Phase::Prepared,
            ClaimState::Degraded => Phase::Degraded,
            ClaimState::Unpreparing => Phase::Unpreparing,
        }
    }
}

/// `claim` as the protocol reports it.
pub fn claim_info(claim: &Claim) -> ClaimInfo {
    ClaimInfo {
        uid: claim.uid.clone(),
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        state: claim.phase.into(),
        groups: claim.groups.iter().map(group_info).collect(),
        requests: claim.requests.iter().map(RequestDevices::from).collect(),
        cdi_spec: claim.cdi_spec.clone(),
        attach_limit: claim.attach_limit,
        attached: claim.attached.iter().map(AttachmentInfo::from).collect(),
        last_error: claim.last_error.clone(),
        restarts: claim.restarts,
        resource_version: claim.resource_version.clone(),
        generation: claim.generation,
    }
}

/// `group` as the protocol reports it.
pub fn group_info(group: &Group) -> GroupInfo {
    let (sharing, mig) = match &group.sharing {
        Sharing::Exclusive => (StrategyInfo::Exclusive, Vec::new()),
        Sharing::TimeSlicing { interval } => (
            StrategyInfo::TimeSlicing {
                interval: *interval,
            },
            Vec::new(),
        ),
        Sharing::Mps(m) => (StrategyInfo::Mps(m.into()), Vec::new()),
        Sharing::Mig(MigSharing { slices, mps }) => (
            mps.as_ref()
                .map_or(StrategyInfo::Exclusive, |m| StrategyInfo::Mps(m.into())),
            slices.iter().map(MigInstanceInfo::from).collect(),
        ),
    };
    GroupInfo {
        requests: group.requests.clone(),
        devices: group.devices.iter().map(ClaimDevice::from).collect(),
        sharing,
        mig,
    }
}

/// The claim a record in the protocol's shape describes (a version 2 checkpoint's entry, a
/// format 3 record's claim, an old host record). Those say only that a claim is `Degraded`,
/// not why: its causes are read from what it holds ([`causes_of_old`]).
pub fn claim_of(info: ClaimInfo) -> Claim {
    let mut claim = Claim {
        uid: info.uid,
        namespace: info.namespace,
        name: info.name,
        phase: info.state.into(),
        groups: info.groups.into_iter().map(group_of).collect(),
        requests: info.requests.into_iter().map(Into::into).collect(),
        cdi_spec: info.cdi_spec,
        attach_limit: info.attach_limit,
        attached: info.attached.into_iter().map(Into::into).collect(),
        degraded: BTreeMap::new(),
        last_error: info.last_error,
        restarts: info.restarts,
        resource_version: info.resource_version,
        generation: info.generation,
    };
    if claim.phase == Phase::Degraded {
        claim.degraded = causes_of_old(&claim);
    }
    claim
}

/// The causes of a `Degraded` claim whose record does not name them (written before they
/// were recorded), from what it holds, never from its message: an MPS control daemon down
/// where it runs one, a MIG slice lost where it holds slices (both for MPS on slices), else a
/// missing GPU (the only other way to `Degraded`). Each keeps the old message as its detail.
/// The start checks each again and clears what is not so: a daemon re-adopted or started
/// again (`service/revive.rs`), slices that are there or made again
/// (`strategy/mig/recover.rs`); a GPU still missing is found again
/// (`service/missing_gpus.rs`).
pub fn causes_of_old(claim: &Claim) -> BTreeMap<Cause, String> {
    let mut causes = Vec::new();
    if claim.runs_mps() {
        causes.push(Cause::MpsDaemonDown);
    }
    if claim.groups.iter().any(Group::is_mig) {
        causes.push(Cause::SliceLost);
    }
    if causes.is_empty() {
        causes.push(Cause::GpuMissing);
    }
    causes
        .into_iter()
        .map(|c| {
            let detail = claim.last_error.clone().unwrap_or_else(|| c.to_string());
            (c, detail)
        })
        .collect()
}

/// The group a group in the protocol's shape describes ([`group_of_old`]).
pub fn group_of(g: GroupInfo) -> Group {
    let stated = match g.sharing {
        StrategyInfo::Exclusive => Sharing::Exclusive,
        StrategyInfo::TimeSlicing { interval } => Sharing::TimeSlicing { interval },
        StrategyInfo::Mps(m) => Sharing::Mps(m.into()),
    };
    group_of_old(
        g.requests,
        g.devices.into_iter().map(Into::into).collect(),
        stated,
        g.mig.into_iter().map(Into::into).collect(),
    )
}

/// The group an old record describes, which said only `Exclusive`, `TimeSlicing` or `Mps`
/// (`stated`) beside its MIG instances (`slices`): a MIG group when it has slices or its
/// devices are MIG devices (`gpu-<minor>-mig-…`), its sharing then the daemon on the slices
/// (if `Mps`); otherwise its sharing as stated. Taken in the model's terms, so that the
/// records on disk (`crate::store::record`) ask this too without the protocol's types. An old
/// record cannot state `Mig`; were it given, its daemon is kept and `slices` are the slices.
pub fn group_of_old(
    requests: Vec<String>,
    devices: Vec<Device>,
    stated: Sharing,
    slices: Vec<MigSlice>,
) -> Group {
    let mig_devices = devices
        .iter()
        .any(|d| crate::mig::MigDeviceName::parse(&d.device).is_some());
    let sharing = if mig_devices || !slices.is_empty() {
        Sharing::Mig(MigSharing {
            slices,
            mps: match stated {
                Sharing::Mps(m) => Some(m),
                Sharing::Mig(m) => m.mps,
                Sharing::Exclusive | Sharing::TimeSlicing { .. } => None,
            },
        })
    } else {
        stated
    };
    Group {
        requests,
        devices,
        sharing,
    }
}

impl From<&Device> for ClaimDevice {
    fn from(d: &Device) -> ClaimDevice {
        ClaimDevice {
            request: d.request.clone(),
            device: d.device.clone(),
            uuid: d.uuid.clone(),
            minor: d.minor,
        }
    }
}

impl From<ClaimDevice> for Device {
    fn from(d: ClaimDevice) -> Device {
        Device {
            request: d.request,
            device: d.device,
            uuid: d.uuid,
            minor: d.minor,
        }
    }
}

impl From<&Request> for RequestDevices {
    fn from(r: &Request) -> RequestDevices {
        RequestDevices {
            request: r.request.clone(),
            cdi_device_ids: r.cdi_device_ids.clone(),
            devices: r.devices.clone(),
            per_device: r
                .per_device
                .iter()
                .map(|p| PreparedDeviceInfo {
                    device: p.device.clone(),
                    pool: p.pool.clone(),
                    cdi_device_ids: p.cdi_device_ids.clone(),
                })
                .collect(),
        }
    }
}

impl From<RequestDevices> for Request {
    fn from(r: RequestDevices) -> Request {
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

impl From<&MpsDaemon> for MpsInfo {
    fn from(m: &MpsDaemon) -> MpsInfo {
        MpsInfo {
            control_daemon_pid: m.control_daemon_pid,
            pipe_dir: m.pipe_dir.clone(),
            log_dir: m.log_dir.clone(),
            shm_dir: m.shm_dir.clone(),
            visible_devices: m.visible_devices.clone(),
            active_thread_percentage: m.active_thread_percentage.clone(),
            pinned_device_memory_limits: m.pinned_device_memory_limits.clone(),
            control_daemon_start_time: m.control_daemon_start_time,
            requested: MpsRequested {
                multi_user: m.requested.multi_user,
                active_thread_percentage: m.requested.active_thread_percentage,
                pinned_limits_mib: m.requested.pinned_limits_mib.clone(),
                shm_bytes: m.requested.shm_bytes,
            },
            restarts: m.restarts,
        }
    }
}

impl From<MpsInfo> for MpsDaemon {
    fn from(m: MpsInfo) -> MpsDaemon {
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

impl From<&MigSlice> for MigInstanceInfo {
    fn from(s: &MigSlice) -> MigInstanceInfo {
        MigInstanceInfo {
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
                SliceOrigin::Created => MigOrigin::Created,
                SliceOrigin::Existing => MigOrigin::Existing,
            },
            enabled_mig_mode: s.enabled_mig_mode,
            destroying: s.destroying,
        }
    }
}

impl From<MigInstanceInfo> for MigSlice {
    fn from(s: MigInstanceInfo) -> MigSlice {
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
                MigOrigin::Created => SliceOrigin::Created,
                MigOrigin::Existing => SliceOrigin::Existing,
            },
            enabled_mig_mode: s.enabled_mig_mode,
            destroying: s.destroying,
        }
    }
}

impl From<&Attachment> for AttachmentInfo {
    fn from(a: &Attachment) -> AttachmentInfo {
        AttachmentInfo {
            claim_uid: a.claim_uid.clone(),
            container_id: a.container_id.clone(),
            pid: a.pid,
            cgroup: a.cgroup.clone(),
            bundle: a.bundle.clone(),
            attached_at: a.attached_at,
            pod: a.pod.as_ref().map(|p| PodRef {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
            }),
        }
    }
}

impl From<AttachmentInfo> for Attachment {
    fn from(a: AttachmentInfo) -> Attachment {
        Attachment {
            claim_uid: a.claim_uid,
            container_id: a.container_id,
            pid: a.pid,
            cgroup: a.cgroup,
            bundle: a.bundle,
            attached_at: a.attached_at,
            pod: a.pod.map(Pod::from),
        }
    }
}

impl From<PodRef> for Pod {
    fn from(p: PodRef) -> Pod {
        Pod {
            namespace: p.namespace,
            name: p.name,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_round_trips_through_the_wire() {
        for p in super::super::lifecycle::PHASES {
            assert_eq!(Phase::from(ClaimState::from(p)), p);
        }
    }

    /// Every claim of the version 2 fixture (every strategy) comes back from the model as
    /// it was, and its MIG group is a MIG group there.
    #[test]
    fn every_claim_of_the_v2_fixture_round_trips_through_the_model() {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/checkpoint-v2.json")).unwrap();
        let cp: crate::checkpoint::Checkpoint = serde_json::from_value(v).unwrap();
        let mut mig = 0;
        for info in cp.claims.values() {
            let claim = claim_of(info.clone());
            mig += claim.groups.iter().filter(|g| g.is_mig()).count();
            assert_eq!(claim_info(&claim), *info);
        }
        assert!(mig > 0, "the fixture has a MIG group");
    }
}
