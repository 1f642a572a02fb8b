//! A claim as the daemon holds it in its registry: its [`Phase`], its device groups, each
//! with its strategy as an explicit [`Sharing`] variant (MIG included, with the MPS control
//! daemon it may run on its slices), its CDI devices per request and attached containers.
//!
//! This is the daemon's own model. The protocol's `ClaimInfo` (which has no MIG strategy: a
//! MIG group there is `Exclusive` or `Mps` beside its `mig` instances) is made from it only
//! in [`super::wire`], for the socket's answers; the durable records are made from it only
//! in `crate::store::record`. The leaf facts it holds (a device, a request's CDI device IDs,
//! an MPS control daemon as read back, a MIG slice, a container) are the daemon's own too
//! ([`super::leaf`]), converted to the protocol's records of them in [`super::wire`] and to
//! their records on disk in `crate::store::leaf`. Only the time-slice interval, a code of
//! four values, is the protocol's `TimeSliceInterval`.

use gpushare_proto::TimeSliceInterval;

use std::collections::BTreeMap;

use super::leaf::{Attachment, Device, MigSlice, MpsDaemon, Request};
use super::lifecycle::{Cause, Causes};
use super::Phase;

/// One claim on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Where it is in its life; changed only through `crate::claim::lifecycle` (a record read
    /// back is taken as it says).
    pub phase: Phase,
    /// Device groups (results that share one config), each with its strategy.
    pub groups: Vec<Group>,
    /// CDI device IDs per request, as the prepare answered them.
    pub requests: Vec<Request>,
    /// Path of the claim's CDI spec file (derived from the UID and the CDI directory).
    pub cdi_spec: String,
    /// Most containers attached at once (`replicas`), if limited.
    pub attach_limit: Option<u32>,
    /// Containers attached now (kept in the claim's run directory: they die with the boot).
    pub attached: Vec<Attachment>,
    /// Why it is `Degraded`: each cause with what happened (changed only through
    /// `crate::claim::lifecycle`; a record read back is taken as it says); empty otherwise.
    pub degraded: BTreeMap<Cause, String>,
    /// Last thing that went wrong after it was prepared, with its time: while `Degraded`,
    /// rendered from `degraded`; kept as history after.
    pub last_error: Option<String>,
    /// MPS control daemon restarts of all groups together.
    pub restarts: u32,
    /// `metadata.resourceVersion` of the prepared object, for its tombstone.
    pub resource_version: Option<String>,
    /// Daemon-wide sequence number of the prepare that created it (see tombstones).
    pub generation: u64,
}

/// One device group of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Requests whose devices form the group.
    pub requests: Vec<String>,
    /// Its devices (whole GPUs, or the MIG devices a MIG group holds), sorted by GPU UUID.
    pub devices: Vec<Device>,
    /// Its strategy and what the strategy holds on the host.
    pub sharing: Sharing,
}

/// A group's strategy, one variant each, with what it holds on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
// A claim holds a handful of groups: boxing the larger variants would only add noise.
#[allow(clippy::large_enum_variant)]
pub enum Sharing {
    /// The group's GPUs are the claim's alone; nothing was changed on them.
    Exclusive,
    /// The GPUs run with this time-slice interval.
    TimeSlicing {
        /// Interval applied to each GPU of the group.
        interval: TimeSliceInterval,
    },
    /// One MPS control daemon for the group's whole GPUs (compute mode `EXCLUSIVE_PROCESS`).
    Mps(MpsDaemon),
    /// MIG slices made (or taken, static MIG) for the group's MIG devices.
    Mig(MigSharing),
}

/// What a MIG group holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigSharing {
    /// Its slices, in the order of the group's devices, each recorded the moment its GPU
    /// instance exists.
    pub slices: Vec<MigSlice>,
    /// The MPS control daemon on the slices, where the claim's config asks for one.
    pub mps: Option<MpsDaemon>,
}

impl Group {
    /// The group's MPS control daemon: an MPS group's, or the one on a MIG group's slices.
    pub fn mps(&self) -> Option<&MpsDaemon> {
        match &self.sharing {
            Sharing::Mps(m) => Some(m),
            Sharing::Mig(MigSharing { mps, .. }) => mps.as_ref(),
            Sharing::Exclusive | Sharing::TimeSlicing { .. } => None,
        }
    }

    /// As [`Group::mps`], to change (a restarted daemon's record).
    pub fn mps_mut(&mut self) -> Option<&mut MpsDaemon> {
        match &mut self.sharing {
            Sharing::Mps(m) => Some(m),
            Sharing::Mig(MigSharing { mps, .. }) => mps.as_mut(),
            Sharing::Exclusive | Sharing::TimeSlicing { .. } => None,
        }
    }

    /// Records `mps` as the group's MPS control daemon: a MIG group's on its slices, else the
    /// group's own (an MPS group).
    pub fn set_mps(&mut self, mps: MpsDaemon) {
        match &mut self.sharing {
            Sharing::Mig(m) => m.mps = Some(mps),
            // A group of whole GPUs that runs a daemon is an MPS group (its planned record
            // is already one: this replaces the daemon's record with the started one).
            whole @ (Sharing::Mps(_) | Sharing::Exclusive | Sharing::TimeSlicing { .. }) => {
                *whole = Sharing::Mps(mps);
            }
        }
    }

    /// The MIG slices the group holds; empty for a group of whole GPUs.
    pub fn slices(&self) -> &[MigSlice] {
        match &self.sharing {
            Sharing::Mig(m) => &m.slices,
            Sharing::Exclusive | Sharing::TimeSlicing { .. } | Sharing::Mps(_) => &[],
        }
    }

    /// The MIG slices, to change; `None` for a group of whole GPUs.
    pub fn slices_mut(&mut self) -> Option<&mut Vec<MigSlice>> {
        match &mut self.sharing {
            Sharing::Mig(m) => Some(&mut m.slices),
            Sharing::Exclusive | Sharing::TimeSlicing { .. } | Sharing::Mps(_) => None,
        }
    }

    /// Whether the group is a MIG group.
    pub fn is_mig(&self) -> bool {
        matches!(self.sharing, Sharing::Mig(_))
    }
}

impl Sharing {
    /// The strategy's name as logs and metrics say it: `Exclusive`, `TimeSlicing`, `MPS`,
    /// `MIG`.
    pub fn name(&self) -> &'static str {
        match self {
            Sharing::Exclusive => "Exclusive",
            Sharing::TimeSlicing { .. } => "TimeSlicing",
            Sharing::Mps(_) => "MPS",
            Sharing::Mig(_) => "MIG",
        }
    }
}

impl Claim {
    /// The causes of its degradation.
    pub fn causes(&self) -> Causes {
        Causes::of(&self.degraded)
    }

    /// Whether the claim runs an MPS control daemon (an MPS group, or MPS on MIG slices).
    pub fn runs_mps(&self) -> bool {
        self.groups.iter().any(|g| g.mps().is_some())
    }

    /// Every MPS control daemon of the claim, group by group.
    pub fn mps_daemons(&self) -> impl Iterator<Item = &MpsDaemon> {
        self.groups.iter().filter_map(Group::mps)
    }

    /// Every MIG slice of the claim, group by group.
    pub fn slices(&self) -> impl Iterator<Item = &MigSlice> {
        self.groups.iter().flat_map(|g| g.slices().iter())
    }
}
