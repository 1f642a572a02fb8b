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
//! `recover.rs`). And even an honoured intent destroys only a GPU instance without a
//! compute instance: gpushare records a GPU instance on disk the moment it exists, before it
//! makes its compute instance, so what a crash leaves with only an intent naming it is bare,
//! while every layout (`gpushare mig apply`, mig-parted, `nvidia-smi mig -cgi … -C`) makes
//! whole instances. An intent of a claim whose record was refused at this start is vouched for
//! by nothing: a bare instance it names is kept, and reported with the command that removes
//! it.

use std::collections::BTreeSet;

use crate::claim::{Claim, Phase};

use super::Intent;
use crate::gpu::{GpuBackend, MigInstance};
use crate::mig::MigDeviceName;
use crate::strategy::mig::{self as strategy, Claimed};

/// The intents the last run left, as the start takes them.
#[derive(Debug, Default)]
pub struct LeftIntents {
    /// Those the claims' records vouch for: acted on.
    pub honoured: Vec<Intent>,
    /// Those of claims whose records were refused at this start: nothing vouches for them, so
    /// nothing is destroyed for them, but a bare GPU instance one names is reported
    /// ([`sweep_at_start`]), as its memory slices stay taken until an operator removes it.
    pub of_refused: Vec<Intent>,
}

/// The intents of `left` that the claims' records (`claims`, as loaded, before any rollback)
/// vouch for, as above; every other one is logged with why and left out, those of the claims
/// whose records were refused at this start (`refused`) kept apart. Intents of slices taken
/// as they existed (static MIG) are left out silently: nothing was made for them.
pub fn honoured_intents<'a>(
    left: Vec<Intent>,
    claims: impl IntoIterator<Item = &'a Claim> + Clone,
    refused: &BTreeSet<String>,
) -> LeftIntents {
    let mut out = LeftIntents::default();
    for x in left.into_iter().filter(|x| !x.existing) {
        match refusal(&x, claims.clone(), refused) {
            Refusal::None => out.honoured.push(x),
            Refusal::Quiet(why) => {
                tracing::info!(claim = %x.claim, gpu = %x.gpu_uuid, profile = x.gi_profile_id, start = x.placement_start, reason = %why, "MIG intent not taken; nothing is destroyed for it");
            }
            Refusal::Loud(why) => {
                tracing::warn!(claim = %x.claim, gpu = %x.gpu_uuid, profile = x.gi_profile_id, start = x.placement_start, reason = %why, "MIG intent refused; nothing is destroyed for it");
            }
            Refusal::RecordRefused => {
                tracing::warn!(claim = %x.claim, gpu = %x.gpu_uuid, profile = x.gi_profile_id, start = x.placement_start, "MIG intent of a claim whose record was refused at this start (see the records refused at start); nothing vouches for it, so nothing is destroyed for it");
                out.of_refused.push(x);
            }
        }
    }
    out
}

/// Whether, and why, an intent is not taken.
enum Refusal {
    /// Taken.
    None,
    /// Not taken, for a reason ordinary enough to log quietly: a claim rolled back by a start
    /// that was killed before it removed the intents.
    Quiet(String),
    /// Refused: the intent is not what gpushare writes.
    Loud(String),
    /// Its claim's record was refused at this start.
    RecordRefused,
}

/// Why intent `x` is not taken, if it is not.
fn refusal<'a>(
    x: &Intent,
    claims: impl IntoIterator<Item = &'a Claim>,
    refused: &BTreeSet<String>,
) -> Refusal {
    if let Some(why) = crate::config::claim_uid_problem(&x.claim) {
        return Refusal::Loud(format!("its claim {:?} is no claim UID: it {why}", x.claim));
    }
    let Some(c) = claims.into_iter().find(|c| c.uid == x.claim) else {
        if refused.contains(&x.claim) {
            return Refusal::RecordRefused;
        }
        return Refusal::Quiet(
            "no record of its claim (released or rolled back since, or never ours)".into(),
        );
    };
    match c.phase {
        Phase::PrepareStarted | Phase::Unpreparing if planned(c, x) => Refusal::None,
        Phase::PrepareStarted | Phase::Unpreparing => Refusal::Loud(format!(
            "claim {} never planned a slice of GPU-instance profile {} at memory slice {} of that GPU",
            c.uid, x.gi_profile_id, x.placement_start
        )),
        Phase::Prepared | Phase::Degraded if records_exactly(c, x) => Refusal::None,
        Phase::Prepared | Phase::Degraded => Refusal::Loud(format!(
            "claim {} is prepared and records no slice there",
            c.uid
        )),
    }
}

/// Whether claim `c` planned the slice `x` names: its allocation names exactly that slice of
/// a GPU its groups hold, or that whole GPU (the short form, `migProfile`: the placement is
/// chosen, and may be chosen again, as the slice is made).
fn planned(c: &Claim, x: &Intent) -> bool {
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
fn records_exactly(c: &Claim, x: &Intent) -> bool {
    c.groups.iter().flat_map(|g| g.slices()).any(|m| {
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
/// instance that no claim record owns, that an honoured intent names, and that holds no
/// compute instance, which only a crash between making a GPU instance and recording it
/// leaves. Every other instance no claim owns is kept and logged (static MIG), a whole one an
/// intent names included. A bare one that an intent of a claim whose record was refused
/// names is kept too, and reported at warn level with the command that removes it once an
/// operator has checked it: a refused record's word is not taken, and without it the intent
/// alone cannot tell gpushare's bare instance from an administrator's `nvidia-smi mig -cgi`
/// without `-C` at that place.
pub fn sweep_at_start<'a>(
    backend: &dyn GpuBackend,
    left: &LeftIntents,
    claims: impl IntoIterator<Item = &'a Claim>,
) {
    let honoured = &left.honoured;
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
    for x in &left.of_refused {
        let Ok(live) = backend.mig_instances(&x.gpu_uuid) else {
            continue;
        };
        let gpu = backend
            .find(&x.gpu_uuid)
            .map_or_else(|| x.gpu_uuid.clone(), |g| g.device_name());
        for inst in live.iter().filter(|i| {
            i.compute.is_none()
                && names(x, &x.gpu_uuid, i)
                && claimed.owner(&x.gpu_uuid, i).is_none()
        }) {
            tracing::warn!(
                claim = %x.claim,
                gpu = %gpu,
                gi = inst.gi_id,
                placement = %inst.placement,
                "a GPU instance without a compute instance, named by a MIG intent of a claim whose record was refused at this start, is kept (its memory slices stay taken): nothing vouches that gpushare made it. Once you have checked that nobody else did (the refused record in the quarantine, `gpushare mig list`), remove it: nvidia-smi mig -dgi -gi {} -i {}",
                inst.gi_id,
                x.gpu_uuid
            );
        }
    }
}

/// At start-up, after the rollbacks: MIG mode a crashed prepare turned on for its slice (its
/// `honoured` intent says so) goes off again where no claim records a slice on the GPU and
/// nothing is left there, as a release would have done; only where the GPU leaves MIG mode
/// without a reset.
pub fn leave_mig_mode_at_start<'a>(
    backend: &dyn GpuBackend,
    honoured: &[Intent],
    claims: impl IntoIterator<Item = &'a Claim>,
) {
    let claimed = Claimed::of(claims);
    let flipped: BTreeSet<&str> = honoured
        .iter()
        .filter(|x| x.enabled_mig_mode && !claimed.any_on(&x.gpu_uuid))
        .map(|x| x.gpu_uuid.as_str())
        .collect();
    for gpu in flipped {
        if let Some(g) = backend.find(gpu) {
            strategy::mode_off_if_bare(backend, g, strategy::ModeOffFor::CrashedPrepare);
        }
    }
}
