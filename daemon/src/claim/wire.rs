//! The protocol's view of a claim, converted here and only here: the lifecycle's [`Phase`]
//! as `gpushare_proto::ClaimState`, and a [`Claim`] as `gpushare_proto::ClaimInfo`, for the
//! socket's answers (`crate::server`) and for the formats that were the protocol's type on
//! disk (the version 2 checkpoint, format 3 records, host records before format 4: read
//! back in `crate::store` and `crate::service`, and the version 2 downgrade export).
//!
//! The protocol has no MIG strategy: a MIG group is `Exclusive` (the slices alone) or `Mps`
//! (a daemon on them) beside its `mig` instances. [`claim_of`] is the one place that tells a
//! MIG group from those, by its instances or its devices' names.

use gpushare_proto::{ClaimInfo, ClaimState, GroupInfo, StrategyInfo};

use std::collections::BTreeMap;

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
        requests: claim.requests.clone(),
        cdi_spec: claim.cdi_spec.clone(),
        attach_limit: claim.attach_limit,
        attached: claim.attached.clone(),
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
        Sharing::Mps(m) => (StrategyInfo::Mps(m.clone()), Vec::new()),
        Sharing::Mig(MigSharing { slices, mps }) => (
            mps.clone()
                .map_or(StrategyInfo::Exclusive, StrategyInfo::Mps),
            slices.clone(),
        ),
    };
    GroupInfo {
        requests: group.requests.clone(),
        devices: group.devices.clone(),
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
        requests: info.requests,
        cdi_spec: info.cdi_spec,
        attach_limit: info.attach_limit,
        attached: info.attached,
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

/// The group a group in the protocol's shape describes: a MIG group when it records MIG
/// instances or its devices are MIG devices (`gpu-<minor>-mig-…`), its sharing then the
/// daemon on the slices (if `Mps`); otherwise its sharing as it says.
pub fn group_of(g: GroupInfo) -> Group {
    let mig_devices = g
        .devices
        .iter()
        .any(|d| crate::mig::MigDeviceName::parse(&d.device).is_some());
    let sharing = if mig_devices || !g.mig.is_empty() {
        Sharing::Mig(MigSharing {
            slices: g.mig,
            mps: match g.sharing {
                StrategyInfo::Mps(m) => Some(m),
                StrategyInfo::Exclusive | StrategyInfo::TimeSlicing { .. } => None,
            },
        })
    } else {
        match g.sharing {
            StrategyInfo::Exclusive => Sharing::Exclusive,
            StrategyInfo::TimeSlicing { interval } => Sharing::TimeSlicing { interval },
            StrategyInfo::Mps(m) => Sharing::Mps(m),
        }
    };
    Group {
        requests: g.requests,
        devices: g.devices,
        sharing,
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
