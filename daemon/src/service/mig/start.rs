//! What a start does with the MIG intents the last run left (`intents.rs`): it checks each
//! against the claims' records ([`honoured_intents`]), destroys the GPU instances an honoured
//! one names that no record owns, before the rollbacks ([`sweep_at_start`]), and turns MIG
//! mode off again where a crashed prepare had turned it on for nothing
//! ([`leave_mig_mode_at_start`]).
//!
//! The intents file is input like any file read back: an intent is honoured only for a claim
//! UID that is one, of a claim the records know as interrupted (its prepare or release cut
//! short: `PrepareStarted` or `Unpreparing`) that planned exactly that slice, or of a prepared
//! claim that records a slice at exactly that place (one being made again at start,
//! `mig_recover.rs`). And even an honoured intent destroys only a GPU instance without a
//! compute instance: gpushare records a GPU instance on disk the moment it exists, before it
//! makes its compute instance, so what a crash leaves with only an intent naming it is bare,
//! while every layout (`gpushare mig apply`, mig-parted, `nvidia-smi mig -cgi … -C`) makes
//! whole instances.

use std::collections::BTreeSet;

use gpushare_proto::{ClaimInfo, ClaimState};

use super::Intent;
use crate::gpu::{GpuBackend, MigInstance};
use crate::mig::MigDeviceName;
use crate::strategy::mig::{self as strategy, Claimed};

/// The intents of `left` that the claims' records (`claims`, as loaded, before any rollback)
/// vouch for, as above; every other one is logged with why and left out. Intents of slices
/// taken as they existed (static MIG) are left out silently: nothing was made for them.
pub(in crate::service) fn honoured_intents<'a>(
    left: Vec<Intent>,
    claims: impl IntoIterator<Item = &'a ClaimInfo> + Clone,
) -> Vec<Intent> {
    left.into_iter()
        .filter(|x| !x.existing)
        .filter(|x| match refusal(x, claims.clone()) {
            None => true,
            Some((why, quiet)) => {
                if quiet {
                    tracing::info!(claim = %x.claim, gpu = %x.gpu_uuid, profile = x.gi_profile_id, start = x.placement_start, reason = %why, "MIG intent not taken; nothing is destroyed for it");
                } else {
                    tracing::warn!(claim = %x.claim, gpu = %x.gpu_uuid, profile = x.gi_profile_id, start = x.placement_start, reason = %why, "MIG intent refused; nothing is destroyed for it");
                }
                false
            }
        })
        .collect()
}

/// Why intent `x` is not taken (and whether that is ordinary enough to log quietly: a claim
/// rolled back by a start that was killed before it removed the intents), or `None`.
fn refusal<'a>(
    x: &Intent,
    claims: impl IntoIterator<Item = &'a ClaimInfo>,
) -> Option<(String, bool)> {
    if let Some(why) = crate::config::claim_uid_problem(&x.claim) {
        return Some((
            format!("its claim {:?} is no claim UID: it {why}", x.claim),
            false,
        ));
    }
    let Some(c) = claims.into_iter().find(|c| c.uid == x.claim) else {
        return Some((
            "no record of its claim (released or rolled back since, or never ours)".into(),
            true,
        ));
    };
    match c.state {
        ClaimState::PrepareStarted | ClaimState::Unpreparing if planned(c, x) => None,
        ClaimState::PrepareStarted | ClaimState::Unpreparing => Some((
            format!(
                "claim {} never planned a slice of GPU-instance profile {} at memory slice {} of that GPU",
                c.uid, x.gi_profile_id, x.placement_start
            ),
            false,
        )),
        ClaimState::Prepared | ClaimState::Degraded if records_exactly(c, x) => None,
        ClaimState::Prepared | ClaimState::Degraded => Some((
            format!(
                "claim {} is prepared and records no slice there",
                c.uid
            ),
            false,
        )),
    }
}

/// Whether claim `c` planned the slice `x` names: its allocation names exactly that slice of
/// a GPU its groups hold, or that whole GPU (the short form, `migProfile`: the placement is
/// chosen, and may be chosen again, as the slice is made).
fn planned(c: &ClaimInfo, x: &Intent) -> bool {
    let Some(minor) = c
        .groups
        .iter()
        .flat_map(|g| &g.devices)
        .find(|d| d.uuid == x.gpu_uuid)
        .map(|d| d.minor)
    else {
        return false;
    };
    let whole = format!("gpu-{minor}");
    c.requests
        .iter()
        .flat_map(|r| &r.devices)
        .any(|name| match MigDeviceName::parse(name) {
            Some(n) => {
                n.minor == minor
                    && n.gi_profile.0 == x.gi_profile_id
                    && n.start == x.placement_start
            }
            None => *name == whole || *name == x.gpu_uuid,
        })
}

/// Whether claim `c` records a slice at exactly the place `x` names.
fn records_exactly(c: &ClaimInfo, x: &Intent) -> bool {
    c.groups.iter().flat_map(|g| &g.mig).any(|m| {
        m.gpu_uuid == x.gpu_uuid
            && m.gi_profile_id == x.gi_profile_id
            && m.placement_start == x.placement_start
            && m.memory_slices == x.memory_slices
    })
}

/// Whether honoured intent `x` names live instance `inst` of GPU `gpu`: its profile and
/// placement, and its GPU-instance ID once the intent has one (an intent without, a crash
/// during the create, names whatever GPU instance is there).
fn names(x: &Intent, gpu: &str, inst: &MigInstance) -> bool {
    x.gpu_uuid == gpu
        && x.gi_profile_id == inst.profile.0
        && x.placement_start == inst.placement.start
        && x.memory_slices == inst.placement.size
        && x.gi_id.is_none_or(|gi| gi == inst.gi_id)
}

/// At start-up, before the rollbacks (whose claims' records are what vouches for their
/// intents; a start killed after them finds the instances gone already): destroys each GPU
/// instance that no claim record owns, that an `honoured` intent names, and that holds no
/// compute instance, which only a crash between making a GPU instance and recording it
/// leaves. Every other instance no claim owns is kept and logged (static MIG), a whole one an
/// intent names included.
pub(in crate::service) fn sweep_at_start<'a>(
    backend: &dyn GpuBackend,
    honoured: &[Intent],
    claims: impl IntoIterator<Item = &'a ClaimInfo>,
) {
    let claimed = Claimed::of(claims);
    let made_by_us = |gpu: &str, inst: &MigInstance| {
        if !honoured.iter().any(|x| names(x, gpu, inst)) {
            return false;
        }
        if inst.compute.is_some() {
            tracing::warn!(gpu = %gpu, gi = inst.gi_id, placement = %inst.placement, "a MIG intent names this instance, but it holds a compute instance: what gpushare leaves unrecorded never does; kept as the node's");
            return false;
        }
        true
    };
    let swept = strategy::sweep_unowned(backend, &claimed, made_by_us);
    if !swept.is_empty() {
        tracing::warn!(
            count = swept.len(),
            "start-up: GPU instances gpushare made that no claim recorded were found"
        );
    }
}

/// At start-up, after the rollbacks: MIG mode a crashed prepare turned on for its slice (its
/// `honoured` intent says so) goes off again where no claim records a slice on the GPU and
/// nothing is left there, as a release would have done; only where the GPU leaves MIG mode
/// without a reset.
pub(in crate::service) fn leave_mig_mode_at_start<'a>(
    backend: &dyn GpuBackend,
    honoured: &[Intent],
    claims: impl IntoIterator<Item = &'a ClaimInfo>,
) {
    let claimed = Claimed::of(claims);
    let flipped: BTreeSet<&str> = honoured
        .iter()
        .filter(|x| x.enabled_mig_mode && !claimed.any_on(&x.gpu_uuid))
        .map(|x| x.gpu_uuid.as_str())
        .collect();
    for gpu in flipped {
        let Some(g) = backend.find(gpu) else { continue };
        if !strategy::model_of(g).is_ok_and(|m| m.reset_free_mode_toggle())
            || !backend.mig_instances(gpu).is_ok_and(|v| v.is_empty())
        {
            continue;
        }
        match backend.set_mig_mode(gpu, false) {
            Ok(m) if !m.current => {
                tracing::info!(gpu = %g.device_name(), "MIG mode disabled: a prepare that crashed had turned it on, and nothing is left on the GPU")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(gpu = %g.device_name(), error = %e, "disabling MIG mode a crashed prepare turned on")
            }
        }
    }
}
