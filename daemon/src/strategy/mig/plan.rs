//! A claim's MIG group planned at prepare ([`plan_group`]: its devices resolved against the
//! node and checked, touching nothing), and each slice reserved in the intents just before it
//! is made ([`reserve_slice`], under the intents' lock, so that concurrent prepares never
//! make the same one).

use std::path::Path;

use gpushare_proto::ErrorCode;

use super::{check, repick, resolve, Claimed, ClaimsView, MigGroup, MigIntents, MigTarget};
use crate::claim::Device;
use crate::config::{ClaimSpec, MpsSettings};
use crate::error::ServiceError;
use crate::gpu::GpuBackend;
use crate::strategy::mps::{plan_launch, MpsLaunch};
use crate::strategy::mps_support;
use crate::strategy::select::{GroupAsk, Planning};

/// An MPS control daemon asked for on a MIG group's slices.
#[derive(Debug, Clone, Copy)]
pub struct MpsOnSlices<'a> {
    /// Its settings, from the claim's config.
    pub settings: &'a MpsSettings,
    /// The requests the group serves.
    pub requests: &'a [String],
    /// The claim's directory, under which the daemon's are.
    pub claim_dir: &'a Path,
    /// The size of the daemon's shm.
    pub shm_bytes: u64,
}

impl MigGroup {
    /// Plans a MIG group as its config asks (the short form's `profile`; `mps`, a daemon on
    /// the slices, each parent GPU checked to keep its settings first), touching nothing
    /// ([`plan_group`], against every claim's slices).
    ///
    /// # Errors
    /// `Unsupported` for a GPU whose MPS cannot keep the settings; else [`plan_group`]'s.
    pub fn plan(
        p: &Planning<'_>,
        group: &GroupAsk<'_>,
        profile: Option<&str>,
        mps: Option<&MpsSettings>,
    ) -> Result<MigGroup, ServiceError> {
        if let Some(settings) = mps {
            mps_support::check_gpus(group.gpus, settings)?;
        }
        let mps = mps.map(|settings| MpsOnSlices {
            settings,
            requests: group.requests,
            claim_dir: p.claim_dir,
            shm_bytes: p.shm_bytes,
        });
        let claimed = p.claims.claimed(None);
        plan_group(p.backend, &claimed, group.spec, group.results, profile, mps)
    }

    /// The group's devices as its claim records them: its MIG devices, named canonically,
    /// each with its parent GPU, in the order of its slices.
    pub fn devices(&self) -> Vec<Device> {
        self.targets
            .iter()
            .map(|t| Device {
                request: t.request.clone(),
                device: t.device.clone(),
                uuid: t.gpu_uuid.clone(),
                minor: t.gpu_minor,
            })
            .collect()
    }
}

/// Resolves a MIG group's devices (results `results` of `spec`, with the short form's
/// `profile`) and checks they can be created now, touching nothing; with `mps`, plans the
/// daemon on them too. `claimed` is what every claim records: slices claims record count as
/// taken even where their instance vanished (a GPU reset, a destroy by hand): they are those
/// claims' until released.
///
/// # Errors
/// A device that cannot be resolved or created now (`resolve`, `check`), or an MPS daemon
/// that cannot be planned.
pub fn plan_group(
    backend: &dyn GpuBackend,
    claimed: &Claimed,
    spec: &ClaimSpec,
    results: &[usize],
    profile: Option<&str>,
    mps: Option<MpsOnSlices<'_>>,
) -> Result<MigGroup, ServiceError> {
    let mut targets = Vec::with_capacity(results.len());
    for &i in results {
        let r = &spec.results[i];
        let t = resolve(backend, &r.request, &r.device, profile, claimed, &targets)?;
        targets.push(t);
    }
    check(backend, &targets, claimed)?;
    let Some(m) = mps else {
        return Ok(MigGroup { targets, mps: None });
    };
    let names: Vec<String> = targets.iter().map(|t| t.device.clone()).collect();
    let launch = plan_launch(
        &spec.uid,
        m.claim_dir,
        &names,
        m.requests,
        m.settings,
        m.shm_bytes,
    )?;
    Ok(MigGroup {
        targets,
        mps: Some(MpsLaunch {
            // The MIG UUIDs, once the instances exist.
            visible_devices: Vec::new(),
            ..launch
        }),
    })
}

/// Writes `t`'s intent for claim `uid`. A placement chosen here (`chosen`) is chosen again
/// under the intents' lock, from the live instances, the claims' records and the slices
/// other prepares are making now, so concurrent prepares never pick the same one. The
/// MIG-mode flag is decided again there too: a prepare that planned while another was
/// turning MIG mode on saw the mode on already, and must still carry the flag (the other's
/// intent or record says it, and both are read under that lock).
///
/// # Errors
/// `Conflict` where another claim holds or is making the slice (or no placement is free any
/// more); the intent cannot be written.
pub fn reserve_slice(
    backend: &dyn GpuBackend,
    intents: &MigIntents,
    claims: &dyn ClaimsView,
    uid: &str,
    t: &MigTarget,
) -> Result<MigTarget, ServiceError> {
    if !t.chosen {
        // Under the intents' lock, against the claims as they are now: a prepare that
        // planned before another's record named this slice, and reserves after that one
        // struck its intent, must not get the same slice.
        return intents.reserve_with(uid, &t.gpu_uuid, |_| {
            let others = claims.claimed(Some(uid));
            let holders = others.holders(&t.gpu_uuid, &t.occupied().placement);
            if holders.is_empty() {
                return Ok(MigTarget {
                    carries_mode_flag: t.carries_mode_flag
                        || others.mode_enabled_by_gpushare(&t.gpu_uuid),
                    ..t.clone()
                });
            }
            Err(ServiceError::new(
                ErrorCode::Conflict,
                format!(
                    "{}: its memory slices are held by claim(s) {}",
                    t.device,
                    holders.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ))
        });
    }
    intents.reserve_with(uid, &t.gpu_uuid, |busy| {
        let claimed = claims.claimed(None);
        let mut again = repick(backend, t, &claimed, busy)?;
        again.carries_mode_flag |= claimed.mode_enabled_by_gpushare(&t.gpu_uuid);
        Ok(again)
    })
}
