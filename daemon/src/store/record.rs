//! A claim as it is kept on disk: one versioned record per claim
//! (`<state-dir>/records/<uid>.json`, see `crate::store`), the host record in the claim's run
//! directory (`<run-dir>/claims/<uid>/claim.json`: the record with its CDI spec path and
//! attached containers), and one record per released claim's tombstone
//! (`<state-dir>/tombstones/<uid>.json`). Made from the daemon's [`Claim`] and back here
//! and only here.
//!
//! The records are types of their own, apart from the registry's model and from the
//! protocol. Their JSON keeps the shape the previous release reads (format 3, whose groups
//! were the protocol's `GroupInfo`: a MIG group as `Exclusive` or `Mps` beside its `mig`
//! instances), so that a downgrade after a crash still finds every claim; format 4 adds each
//! group's `kind`, so that a MIG group is read back as one, never inferred. A record of
//! format 3 or older (no `kind`) is read through `crate::claim::wire::group_of_old`, the one
//! place that infers it. The leaf facts (a device, an MPS control daemon, a MIG slice, the
//! CDI device IDs of a request, a container) are record types too (`leaf.rs`), so a change
//! of the protocol never changes the disk; a record is checked as input when read
//! (`service::persisted`).

use serde::{Deserialize, Serialize};

use gpushare_proto::TimeSliceInterval;

use super::leaf::{AttachmentRecord, DeviceRecord, MigSliceRecord, MpsRecord, RequestRecord};

use crate::checkpoint::Tombstone;
use crate::claim::model::{Claim, Group, MigSharing, Sharing};
use crate::claim::{Cause, Phase};

/// The record format this build writes. Format 2 was the whole-node checkpoint file
/// (`checkpoint.json`); format 3 the first per-claim records; format 4 names each group's
/// strategy (`kind`). A record of a newer format is read as far as its fields are known
/// (unknown fields are ignored).
pub const RECORD_FORMAT: u32 = 4;

/// One claim's durable record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// [`RECORD_FORMAT`] of the build that wrote it; 0 in a host record written before
    /// format 4 (the protocol's `ClaimInfo` then).
    #[serde(default)]
    pub format: u32,
    /// `metadata.uid`; the record's file is named after it.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Lifecycle phase.
    pub state: PhaseRecord,
    /// Device groups with their strategies and what each owns on the host.
    pub groups: Vec<GroupRecord>,
    /// CDI device IDs per request.
    pub requests: Vec<RequestRecord>,
    /// Most containers attached at once (`replicas`).
    #[serde(default)]
    pub attach_limit: Option<u32>,
    /// Why the claim is `Degraded`, each cause with what happened (format 4); empty
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<CauseRecord>,
    /// Why the claim is `Degraded`, or what happened last.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Restarts of its MPS control daemons after they died.
    #[serde(default)]
    pub restarts: u32,
    /// `metadata.resourceVersion` of the prepared object, for its tombstone.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// Generation handed out when it was prepared (see tombstones).
    #[serde(default)]
    pub generation: u64,
}

/// A claim's phase as its record spells it (the names of format 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PhaseRecord {
    /// [`Phase::PrepareStarted`].
    PrepareStarted,
    /// [`Phase::Prepared`].
    Prepared,
    /// [`Phase::Degraded`].
    Degraded,
    /// [`Phase::Unpreparing`].
    Unpreparing,
}

/// One cause of a `Degraded` claim, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CauseRecord {
    /// Which.
    pub cause: CauseKindRecord,
    /// What happened, as the claim's message says it.
    pub detail: String,
}

/// A [`Cause`] as a record spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CauseKindRecord {
    /// [`Cause::MpsDaemonDown`].
    MpsDaemonDown,
    /// [`Cause::MpsRestartFailed`].
    MpsRestartFailed,
    /// [`Cause::SliceLost`].
    SliceLost,
    /// [`Cause::GpuMissing`].
    GpuMissing,
}

impl From<Cause> for CauseKindRecord {
    fn from(c: Cause) -> CauseKindRecord {
        match c {
            Cause::MpsDaemonDown => CauseKindRecord::MpsDaemonDown,
            Cause::MpsRestartFailed => CauseKindRecord::MpsRestartFailed,
            Cause::SliceLost => CauseKindRecord::SliceLost,
            Cause::GpuMissing => CauseKindRecord::GpuMissing,
        }
    }
}

impl From<CauseKindRecord> for Cause {
    fn from(c: CauseKindRecord) -> Cause {
        match c {
            CauseKindRecord::MpsDaemonDown => Cause::MpsDaemonDown,
            CauseKindRecord::MpsRestartFailed => Cause::MpsRestartFailed,
            CauseKindRecord::SliceLost => Cause::SliceLost,
            CauseKindRecord::GpuMissing => Cause::GpuMissing,
        }
    }
}

/// One device group's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// Requests whose devices form the group.
    pub requests: Vec<String>,
    /// Its devices, sorted by GPU UUID.
    pub devices: Vec<DeviceRecord>,
    /// The group's strategy (format 4); absent from older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<KindRecord>,
    /// Its sharing in the shape format 3 wrote: a MIG group's is `Exclusive` or the `Mps`
    /// daemon on its slices.
    pub sharing: SharingRecord,
    /// A MIG group's slices; empty otherwise.
    #[serde(default)]
    pub mig: Vec<MigSliceRecord>,
}

/// A group's strategy, as format 4 names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KindRecord {
    /// [`Sharing::Exclusive`].
    Exclusive,
    /// [`Sharing::TimeSlicing`].
    TimeSlicing,
    /// [`Sharing::Mps`].
    Mps,
    /// [`Sharing::Mig`].
    Mig,
}

/// A group's sharing as format 3 wrote it (tagged by `strategy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "strategy")]
#[allow(clippy::large_enum_variant)]
pub enum SharingRecord {
    /// No setting; a MIG group without an MPS control daemon.
    Exclusive,
    /// A time-slice interval on each GPU.
    TimeSlicing {
        /// The interval.
        interval: IntervalRecord,
    },
    /// An MPS control daemon for the group (on its slices, for a MIG group).
    Mps(MpsRecord),
}

/// A time-slice interval as a record spells it (NVIDIA's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IntervalRecord {
    /// The driver's default.
    Default,
    /// Shorter slices.
    Short,
    /// Medium slices.
    Medium,
    /// Longer slices.
    Long,
}

impl From<TimeSliceInterval> for IntervalRecord {
    fn from(i: TimeSliceInterval) -> IntervalRecord {
        match i {
            TimeSliceInterval::Default => IntervalRecord::Default,
            TimeSliceInterval::Short => IntervalRecord::Short,
            TimeSliceInterval::Medium => IntervalRecord::Medium,
            TimeSliceInterval::Long => IntervalRecord::Long,
        }
    }
}

impl From<IntervalRecord> for TimeSliceInterval {
    fn from(i: IntervalRecord) -> TimeSliceInterval {
        match i {
            IntervalRecord::Default => TimeSliceInterval::Default,
            IntervalRecord::Short => TimeSliceInterval::Short,
            IntervalRecord::Medium => TimeSliceInterval::Medium,
            IntervalRecord::Long => TimeSliceInterval::Long,
        }
    }
}

impl From<Phase> for PhaseRecord {
    fn from(p: Phase) -> PhaseRecord {
        match p {
            Phase::PrepareStarted => PhaseRecord::PrepareStarted,
            Phase::Prepared => PhaseRecord::Prepared,
            Phase::Degraded => PhaseRecord::Degraded,
            Phase::Unpreparing => PhaseRecord::Unpreparing,
        }
    }
}

impl From<PhaseRecord> for Phase {
    fn from(p: PhaseRecord) -> Phase {
        match p {
            PhaseRecord::PrepareStarted => Phase::PrepareStarted,
            PhaseRecord::Prepared => Phase::Prepared,
            PhaseRecord::Degraded => Phase::Degraded,
            PhaseRecord::Unpreparing => Phase::Unpreparing,
        }
    }
}

impl GroupRecord {
    /// The record of `g`.
    pub fn of(g: &Group) -> GroupRecord {
        let (kind, sharing, mig) = match &g.sharing {
            Sharing::Exclusive => (KindRecord::Exclusive, SharingRecord::Exclusive, Vec::new()),
            Sharing::TimeSlicing { interval } => (
                KindRecord::TimeSlicing,
                SharingRecord::TimeSlicing {
                    interval: (*interval).into(),
                },
                Vec::new(),
            ),
            Sharing::Mps(m) => (KindRecord::Mps, SharingRecord::Mps(m.into()), Vec::new()),
            Sharing::Mig(MigSharing { slices, mps }) => (
                KindRecord::Mig,
                mps.as_ref()
                    .map_or(SharingRecord::Exclusive, |m| SharingRecord::Mps(m.into())),
                slices.iter().map(MigSliceRecord::from).collect(),
            ),
        };
        GroupRecord {
            requests: g.requests.clone(),
            devices: g.devices.iter().map(DeviceRecord::from).collect(),
            kind: Some(kind),
            sharing,
            mig,
        }
    }

    /// The group this record describes. Without `kind` (format 3 and older) it is read as
    /// the protocol's group it was, inferred as one of those is
    /// ([`crate::claim::wire::group_of_old`]). A `kind` that
    /// disagrees with the sharing recorded (a `TimeSlicing` group holding MPS) keeps what was
    /// recorded: what the group holds on the host is what a release must find.
    pub fn into_group(self) -> Group {
        let devices: Vec<_> = self.devices.into_iter().map(Into::into).collect();
        let slices: Vec<_> = self.mig.into_iter().map(Into::into).collect();
        let sharing = match (self.kind, self.sharing) {
            (Some(KindRecord::Mig), sharing) => Sharing::Mig(MigSharing {
                slices,
                mps: match sharing {
                    SharingRecord::Mps(m) => Some(m.into()),
                    SharingRecord::Exclusive | SharingRecord::TimeSlicing { .. } => None,
                },
            }),
            (Some(_), SharingRecord::Exclusive) if slices.is_empty() => Sharing::Exclusive,
            (Some(_), SharingRecord::TimeSlicing { interval }) if slices.is_empty() => {
                Sharing::TimeSlicing {
                    interval: interval.into(),
                }
            }
            (Some(_), SharingRecord::Mps(m)) if slices.is_empty() => Sharing::Mps(m.into()),
            (_, sharing) => {
                let stated = match sharing {
                    SharingRecord::Exclusive => Sharing::Exclusive,
                    SharingRecord::TimeSlicing { interval } => Sharing::TimeSlicing {
                        interval: interval.into(),
                    },
                    SharingRecord::Mps(m) => Sharing::Mps(m.into()),
                };
                return crate::claim::wire::group_of_old(self.requests, devices, stated, slices);
            }
        };
        Group {
            requests: self.requests,
            devices,
            sharing,
        }
    }
}

impl ClaimRecord {
    /// The durable part of `claim`.
    pub fn of(claim: &Claim) -> ClaimRecord {
        ClaimRecord {
            format: RECORD_FORMAT,
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            state: claim.phase.into(),
            groups: claim.groups.iter().map(GroupRecord::of).collect(),
            requests: claim.requests.iter().map(RequestRecord::from).collect(),
            attach_limit: claim.attach_limit,
            degraded: claim
                .degraded
                .iter()
                .map(|(c, d)| CauseRecord {
                    cause: (*c).into(),
                    detail: d.clone(),
                })
                .collect(),
            last_error: claim.last_error.clone(),
            restarts: claim.restarts,
            resource_version: claim.resource_version.clone(),
            generation: claim.generation,
        }
    }

    /// The claim this record describes, without containers, its CDI spec at `cdi_spec`. A
    /// `Degraded` claim whose record names no cause (format 3) gets the causes of what it
    /// holds ([`crate::claim::wire::causes_of_old`]).
    pub fn into_claim(self, cdi_spec: String) -> Claim {
        let mut claim = Claim {
            uid: self.uid,
            namespace: self.namespace,
            name: self.name,
            phase: self.state.into(),
            groups: self
                .groups
                .into_iter()
                .map(GroupRecord::into_group)
                .collect(),
            requests: self.requests.into_iter().map(Into::into).collect(),
            cdi_spec,
            attach_limit: self.attach_limit,
            attached: Vec::new(),
            degraded: self
                .degraded
                .into_iter()
                .map(|r| (Cause::from(r.cause), r.detail))
                .collect(),
            last_error: self.last_error,
            restarts: self.restarts,
            resource_version: self.resource_version,
            generation: self.generation,
        };
        if claim.phase == Phase::Degraded && claim.degraded.is_empty() {
            claim.degraded = crate::claim::wire::causes_of_old(&claim);
        }
        claim
    }
}

/// The copy of a prepared claim's record kept in its run directory
/// (`<run-dir>/claims/<uid>/claim.json`): the record with the CDI spec path and the attached
/// containers, which live only here (they die with the boot). Before format 4 it was the
/// protocol's `ClaimInfo`, which this shape still is (with `format` and each group's `kind`
/// added), so that either release reads the other's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRecord {
    /// The claim's record.
    #[serde(flatten)]
    pub record: ClaimRecord,
    /// Path of the claim's CDI spec file, as written (the start derives it again).
    #[serde(default)]
    pub cdi_spec: String,
    /// Containers attached now.
    #[serde(default)]
    pub attached: Vec<AttachmentRecord>,
}

impl HostRecord {
    /// The host record of `claim`.
    pub fn of(claim: &Claim) -> HostRecord {
        HostRecord {
            record: ClaimRecord::of(claim),
            cdi_spec: claim.cdi_spec.clone(),
            attached: claim.attached.iter().map(AttachmentRecord::from).collect(),
        }
    }

    /// The claim it describes, its containers included.
    pub fn into_claim(self) -> Claim {
        let mut claim = self.record.into_claim(self.cdi_spec);
        claim.attached = self.attached.into_iter().map(Into::into).collect();
        claim
    }
}

/// A released claim's tombstone as kept on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TombstoneRecord {
    /// [`RECORD_FORMAT`] of the build that wrote it.
    pub format: u32,
    /// The tombstone.
    #[serde(flatten)]
    pub tombstone: Tombstone,
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::{ClaimInfo, StrategyInfo};

    fn v2_claims() -> Vec<ClaimInfo> {
        let v: serde_json::Value =
            serde_json::from_str(include_str!("../../tests/fixtures/checkpoint-v2.json")).unwrap();
        let cp: crate::checkpoint::Checkpoint = serde_json::from_value(v).unwrap();
        cp.claims.into_values().collect()
    }

    #[test]
    fn a_record_leaves_out_containers_and_the_spec_path_and_gives_the_rest_back() {
        let info = v2_claims()
            .into_iter()
            .find(|c| c.uid == "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01")
            .unwrap();
        assert_eq!(
            info.attached.len(),
            1,
            "the fixture's MPS claim has a container"
        );
        let claim = crate::claim::wire::claim_of(info.clone());
        let rec = ClaimRecord::of(&claim);
        let text = serde_json::to_string(&rec).unwrap();
        assert!(
            !text.contains("attached") && !text.contains("cdi_spec"),
            "{text}"
        );
        assert!(text.starts_with("{\"format\":4,"), "{text}");
        let back: ClaimRecord = serde_json::from_str(&text).unwrap();
        let again = back.into_claim(info.cdi_spec.clone());
        assert_eq!(
            Claim {
                attached: claim.attached.clone(),
                ..again
            },
            claim
        );
    }

    /// Every group of every strategy survives a record and a host record, and what this
    /// build writes is still read by the previous release as the claim it is: its JSON
    /// parses as the protocol's `ClaimInfo` (what format 3 read) with the same groups.
    #[test]
    fn records_round_trip_and_stay_readable_as_format_3() {
        let mut mig = 0;
        for info in v2_claims() {
            let claim = crate::claim::wire::claim_of(info.clone());
            mig += usize::from(claim.groups.iter().any(Group::is_mig));
            let host = HostRecord::of(&claim);
            let text = serde_json::to_string(&host).unwrap();
            let back: HostRecord = serde_json::from_str(&text).unwrap();
            assert_eq!(back.into_claim(), claim);
            let as_v3: ClaimInfo = serde_json::from_str(&text).unwrap();
            assert_eq!(as_v3, info, "the previous release reads it as it wrote it");
            // A record without `kind` (format 3) reads the same.
            let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
            for g in v["groups"].as_array_mut().unwrap() {
                g.as_object_mut().unwrap().remove("kind");
            }
            v["format"] = 3.into();
            let old: HostRecord = serde_json::from_value(v).unwrap();
            assert_eq!(old.into_claim(), claim);
        }
        assert!(mig > 0);
    }

    /// A `Degraded` claim's causes are kept with their details; a record that names none
    /// (format 3) gets the causes of what the claim holds, its message as their detail.
    #[test]
    fn a_degraded_claims_causes_are_kept_and_old_ones_read_from_what_it_holds() {
        let info = v2_claims()
            .into_iter()
            .find(|c| {
                c.groups
                    .iter()
                    .any(|g| matches!(g.sharing, StrategyInfo::Mps(_)))
            })
            .unwrap();
        let mut claim = crate::claim::wire::claim_of(info);
        claim.phase = Phase::Prepared;
        crate::claim::lifecycle::take(
            &mut claim,
            crate::claim::Event::SliceLost,
            vec![(Cause::SliceLost, "slice 3 is gone".into())],
        )
        .unwrap();
        crate::claim::lifecycle::take(
            &mut claim,
            crate::claim::Event::DaemonDied,
            vec![(Cause::MpsDaemonDown, "pid 7 exited".into())],
        )
        .unwrap();
        let text = serde_json::to_string(&ClaimRecord::of(&claim)).unwrap();
        let back: ClaimRecord = serde_json::from_str(&text).unwrap();
        let back = back.into_claim(claim.cdi_spec.clone());
        assert_eq!(back.degraded, claim.degraded);
        assert_eq!(
            back.last_error.as_deref(),
            Some("pid 7 exited; slice 3 is gone")
        );

        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_object_mut().unwrap().remove("degraded");
        v["format"] = 3.into();
        let old: ClaimRecord = serde_json::from_value(v).unwrap();
        let old = old.into_claim(String::new());
        assert_eq!(
            old.degraded.keys().copied().collect::<Vec<_>>(),
            [Cause::MpsDaemonDown],
            "it runs an MPS control daemon"
        );
        assert_eq!(
            old.degraded[&Cause::MpsDaemonDown],
            "pid 7 exited; slice 3 is gone"
        );
    }
}
