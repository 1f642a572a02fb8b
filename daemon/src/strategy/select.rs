//! Which strategy a group has: the one place each is chosen, from each of the three things
//! that name one. At prepare, a claim's config ([`plan`]: the config as it applies to the
//! group's devices, handed to its strategy's own planning); after it, a recorded group
//! ([`life_of`]); for a GPU's setting, admission's hold on it ([`of_want`], and at start
//! [`clear_leftovers`]: each strategy's setting that no holder asked for). A new strategy
//! adds its arm here to each; what a group of it holds is matched where it is modelled, sent
//! and stored (the list in `strategy/mod.rs`).

use std::path::Path;

use gpushare_core::Want;
use gpushare_proto::{ErrorCode, TimeSliceInterval};

use super::group::{GroupLife, GroupStrategy};
use super::mig::{ClaimsView, Mig, MigGroup};
use super::mps::{Mps, MpsGroup};
use super::{Exclusive, Strategy, TimeSlicing};
use crate::claim::{Device, Group, Sharing as Held};
use crate::config::{ClaimSpec, Sharing};
use crate::error::ServiceError;
use crate::gpu::{Gpu, GpuBackend};

/// What planning reads of the node for one claim, lent by the service: nothing here changes
/// anything.
#[derive(Clone, Copy)]
pub struct Planning<'a> {
    /// The GPUs (MIG mode and instances).
    pub backend: &'a dyn GpuBackend,
    /// Every claim's records: the MIG slices they hold (taken, for a MIG group; named as
    /// the owners of a GPU's instances when a whole-GPU group is refused it).
    pub claims: &'a dyn ClaimsView,
    /// The claim's directory, under which an MPS control daemon's directories are.
    pub claim_dir: &'a Path,
    /// The size of an MPS control daemon's shm tmpfs, in bytes.
    pub shm_bytes: u64,
}

impl std::fmt::Debug for Planning<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planning")
            .field("claim_dir", &self.claim_dir)
            .field("shm_bytes", &self.shm_bytes)
            .finish_non_exhaustive()
    }
}

/// One device group of a claim as planning reads it.
#[derive(Debug, Clone, Copy)]
pub struct GroupAsk<'a> {
    /// The claim's allocation and configs.
    pub spec: &'a ClaimSpec,
    /// The group's results: indices into `spec.results`.
    pub results: &'a [usize],
    /// The GPU of each of the group's results, in the order of `results` (a MIG device's
    /// parent).
    pub gpus: &'a [&'a Gpu],
    /// The requests the group serves, in order of first appearance.
    pub requests: &'a [String],
    /// The group's devices as allocated, sorted by GPU UUID.
    pub devices: &'a [Device],
}

/// A group planned: its strategy, its devices (a MIG group's are its MIG devices, named
/// canonically) and its config's cap on attached containers.
#[derive(Debug)]
pub struct Planned {
    /// What its strategy needs of the group's GPUs, makes for it and records.
    pub strategy: Box<dyn GroupStrategy>,
    /// The group's devices as its claim records them.
    pub devices: Vec<Device>,
    /// `replicas`, where the config caps attached containers.
    pub replicas: Option<u32>,
}

/// Plans `group`, whose config is `config`, touching nothing: the config as it applies to
/// the group's devices ([`applied_config`]), then its strategy's own planning (each checks
/// its GPUs first: whole GPUs for a whole-GPU strategy, MPS support for an MPS daemon).
///
/// # Errors
/// The config does not fit the devices ([`applied_config`]), or the strategy's planning
/// refuses them (its code and message).
pub fn plan(
    p: &Planning<'_>,
    group: &GroupAsk<'_>,
    config: &Sharing,
) -> Result<Planned, ServiceError> {
    // The cap is the config's as written: an MPS config's `replicas` holds on MIG devices too.
    let replicas = config.replicas();
    let whole = |strategy: Box<dyn GroupStrategy>| Planned {
        strategy,
        devices: group.devices.to_vec(),
        replicas,
    };
    Ok(match &applied_config(group, config)? {
        Sharing::Exclusive => whole(Box::new(Exclusive::plan(p, group)?)),
        Sharing::TimeSlicing { interval, .. } => {
            whole(Box::new(TimeSlicing::plan(p, group, *interval)?))
        }
        Sharing::Mps { settings, .. } => whole(Box::new(MpsGroup::plan(p, group, settings)?)),
        Sharing::Mig { profile, mps } => {
            let mig = MigGroup::plan(p, group, profile.as_deref(), mps.as_ref())?;
            Planned {
                devices: mig.devices(),
                strategy: Box::new(mig),
                replicas,
            }
        }
    })
}

/// The strategy of recorded `group`, by its sharing: the one constructor from a group.
pub fn life_of(group: &Group) -> Box<dyn GroupLife> {
    match &group.sharing {
        Held::Exclusive => Box::new(Exclusive),
        Held::TimeSlicing { interval } => Box::new(TimeSlicing {
            interval: *interval,
        }),
        Held::Mps(_) => Box::new(Mps),
        Held::Mig(_) => Box::new(Mig),
    }
}

/// The strategy that holds a GPU as `want` says (admission's word for it). An interval code
/// the proto does not know is time-slicing at `Default`, which only a restore reads.
pub fn of_want(want: Want) -> Box<dyn Strategy> {
    match want {
        Want::Exclusive => Box::new(Exclusive),
        Want::TimeSliced(code) => Box::new(TimeSlicing {
            interval: TimeSliceInterval::from_int(code).unwrap_or(TimeSliceInterval::Default),
        }),
        Want::Mps => Box::new(Mps),
        Want::Mig => Box::new(Mig),
    }
}

/// At start, on a GPU held as `held` (`None`: by no claim): every other strategy's setting
/// that an interrupted prepare or release left on it put back to the node's default
/// ([`Strategy::clear_leftover`]); the holder's own is its [`Strategy::check_again`].
pub fn clear_leftovers(backend: &dyn GpuBackend, uuid: &str, device: &str, held: Option<Want>) {
    // Each strategy once (an interval code stands for time-slicing at any interval).
    let every = [
        Want::Exclusive,
        Want::TimeSliced(TimeSliceInterval::Default.as_int()),
        Want::Mps,
        Want::Mig,
    ];
    let same = |a: &Want, b: &Want| std::mem::discriminant(a) == std::mem::discriminant(b);
    for want in every.iter().filter(|w| !held.is_some_and(|h| same(&h, w))) {
        of_want(*want).clear_leftover(backend, uuid, device);
    }
}

/// `config` as it applies to `group`'s devices: MIG devices get MIG whatever the config
/// says (no config: the slice alone; MPS: a daemon on the slice).
///
/// # Errors
/// MIG devices and whole GPUs under one config (`InvalidRequest`), time-slicing of MIG
/// devices (`InvalidConfig`).
pub fn applied_config(group: &GroupAsk<'_>, config: &Sharing) -> Result<Sharing, ServiceError> {
    let migs = group
        .results
        .iter()
        .filter(|&&i| crate::mig::MigDeviceName::parse(&group.spec.results[i].device).is_some())
        .count();
    if migs == 0 {
        return Ok(config.clone());
    }
    let requests = group.requests.join(", ");
    if migs != group.results.len() {
        return Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("request(s) {requests} mix MIG devices and whole GPUs under one config"),
        ));
    }
    match config {
        Sharing::Exclusive => Ok(Sharing::Mig {
            profile: None,
            mps: None,
        }),
        Sharing::Mps { settings, .. } => Ok(Sharing::Mig {
            profile: None,
            mps: Some(settings.clone()),
        }),
        Sharing::TimeSlicing { .. } => Err(ServiceError::new(
            ErrorCode::InvalidConfig,
            format!(
                "request(s) {requests}: time-slicing applies to whole GPUs, not MIG devices (use MPS or no sharing)"
            ),
        )),
        m @ Sharing::Mig { .. } => Ok(m.clone()),
    }
}

#[cfg(test)]
#[path = "select_tests.rs"]
mod tests;
