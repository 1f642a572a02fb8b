//! How gpushared knows which MIG instances it made: before a GPU instance is created for a
//! claim, an intent naming the claim, GPU, profile and placement is written to
//! `<run_dir>/mig-intents.json`; it is marked with the GPU-instance ID the moment the instance
//! exists, and as turning the GPU's MIG mode on before a prepare turns it on
//! ([`MigIntents::entering_mig_mode`]); it is struck once the claim's record naming the
//! instance is on disk (the prepare's end), or the attempt is over. A crash in between leaves
//! the intent for the next start (`start.rs`), which honours it only where the claims' records
//! vouch for it ([`super::honoured_intents`]: a claim the records know as interrupted that
//! planned exactly that slice, or a prepared claim recording a slice exactly there), and
//! before the rollbacks destroys only a bare GPU instance (no compute instance) that no
//! record owns and an honoured intent names exactly ([`super::sweep_at_start`]); MIG mode an
//! honoured intent says its prepare turned on goes off again once nothing is left on the GPU
//! ([`super::leave_mig_mode_at_start`]). Every other instance no claim owns was made by
//! someone else (`gpushare mig apply`, mig-parted or `nvidia-smi` at node setup: static MIG)
//! or cannot be told from such, and is never destroyed.
//!
//! The file lives in the run directory, a tmpfs like the MIG instances themselves (both are
//! gone after a reboot), and is written without an fsync: a crash of gpushared's own process
//! keeps the page cache. The in-memory list, under one lock, is also what stops two prepares
//! from making overlapping slices at once, and what stops the release of the last MIG claim
//! on a GPU from turning MIG mode off under a prepare that is making a slice there.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use gpushare_proto::ErrorCode;
use serde::{Deserialize, Serialize};

use super::MigTarget;
use crate::error::ServiceError;
use crate::fsutil::{self, ReadRefusal};
use crate::mig::{GiProfileId, MigPlacement, Occupied};

/// Largest intents file read back (a few hundred bytes per slice being made).
const MAX_BYTES: u64 = 1 << 20;

/// One MIG slice about to be made for a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    /// The claim it is made for.
    pub claim: String,
    /// Parent GPU UUID.
    pub gpu_uuid: String,
    /// GPU-instance profile ID.
    pub gi_profile_id: u32,
    /// First memory slice of the placement.
    pub placement_start: u32,
    /// Memory slices the placement spans.
    pub memory_slices: u32,
    /// The slice exists and is taken as it is (static MIG): nothing is made, and the sweep
    /// never destroys it; the intent only keeps two prepares off one instance.
    #[serde(default)]
    pub existing: bool,
    /// The GPU-instance ID the driver gave the slice, once it is made ([`MigIntents::made`]).
    #[serde(default)]
    pub gi_id: Option<u32>,
    /// Making it turned the GPU's MIG mode on (or it carries the flag of a claim that did):
    /// if a crash leaves nothing on the GPU, the start turns MIG mode off again.
    #[serde(default)]
    pub enabled_mig_mode: bool,
}

impl Intent {
    fn of(claim: &str, t: &MigTarget) -> Intent {
        Intent {
            claim: claim.to_string(),
            gpu_uuid: t.gpu_uuid.clone(),
            gi_profile_id: t.profile.id.0,
            placement_start: t.start,
            memory_slices: t.profile.memory_slices,
            existing: t.existing.is_some(),
            gi_id: None,
            // As the slice's record will: so that a crash before the instance is made or
            // recorded still tells the start whose MIG mode this was (the claim whose slice
            // carried the flag may be released meanwhile; its release does not turn the mode
            // off while this slice is being made).
            enabled_mig_mode: t.carries_mode_flag,
        }
    }

    fn placement(&self) -> MigPlacement {
        MigPlacement {
            start: self.placement_start,
            size: self.memory_slices,
        }
    }
}

/// The intents file and its in-memory copy.
#[derive(Debug)]
pub struct MigIntents {
    path: PathBuf,
    live: Mutex<Vec<Intent>>,
}

/// The intents lock held: no slice is reserved or struck meanwhile.
#[derive(Debug)]
pub struct Quiet<'a>(MutexGuard<'a, Vec<Intent>>);

impl Quiet<'_> {
    /// Whether a claim other than `claim` is making a slice on GPU `gpu_uuid` now.
    pub fn busy_for_others(&self, gpu_uuid: &str, claim: &str) -> bool {
        self.0
            .iter()
            .any(|i| i.gpu_uuid == gpu_uuid && i.claim != claim)
    }

    /// The GPUs where an intent of `claim` says its prepare turned MIG mode on (or carries
    /// the flag of a claim that did).
    pub fn mode_flagged(&self, claim: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|i| i.claim == claim && i.enabled_mig_mode)
            .map(|i| i.gpu_uuid.clone())
            .collect()
    }
}

/// See [`MigIntents::strike_on_drop`].
#[derive(Debug)]
pub struct StrikeOnDrop<'a>(&'a MigIntents, String);

impl Drop for StrikeOnDrop<'_> {
    fn drop(&mut self) {
        self.0.strike(&self.1);
    }
}

impl MigIntents {
    /// The intents of `run_dir`, none live (nothing is being made before the start-up
    /// reconcile is over).
    pub fn new(run_dir: &Path) -> MigIntents {
        MigIntents {
            path: run_dir.join("mig-intents.json"),
            live: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Intent>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the last run left: the intents of attempts a crash interrupted, read, not
    /// removed (a start killed before its sweep leaves them for the next: [`MigIntents::clear`]
    /// goes after the sweep). After a reboot (`rebooted`) none is taken: every MIG instance
    /// was made since the boot, and a run directory that is not a tmpfs would still hold the
    /// last boot's. The file is read as the input it is: one that is not a regular file, too
    /// large or not an intents list counts as empty (every instance no claim owns is then
    /// kept: the side that destroys nothing), is logged and moved aside, as evidence and so
    /// that the intents of this run can be written.
    pub fn left_for_sweep(&self, rebooted: bool) -> Vec<Intent> {
        let found = match fsutil::read_own_file(&self.path, MAX_BYTES) {
            Ok(raw) => match serde_json::from_slice::<Vec<Intent>>(&raw) {
                Ok(v) => v,
                Err(e) => {
                    tracing::error!(path = %self.path.display(), error = %e, "unreadable MIG intents; no MIG instance is destroyed at this start (those a crash left stay until destroyed by hand)");
                    self.move_aside();
                    Vec::new()
                }
            },
            Err(ReadRefusal::Missing) => Vec::new(),
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e, "refusing to read the MIG intents; no MIG instance is destroyed at this start");
                self.move_aside();
                Vec::new()
            }
        };
        if rebooted && !found.is_empty() {
            tracing::info!(
                intents = found.len(),
                "MIG intents of the last boot are not taken: every MIG instance was made since"
            );
            return Vec::new();
        }
        found
    }

    /// Removes what the last run left, once the sweep has used it.
    pub fn clear(&self) {
        if let Err(e) = fsutil::remove_file_if_exists(&self.path) {
            tracing::error!(path = %self.path.display(), error = %e, "removing the MIG intents");
        }
    }

    fn move_aside(&self) {
        let aside = self.path.with_extension(format!(
            "json.refused-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        ));
        if let Err(e) = std::fs::rename(&self.path, &aside) {
            tracing::error!(path = %self.path.display(), error = %e, "moving the refused MIG intents aside");
        } else {
            tracing::warn!(path = %self.path.display(), moved_to = %aside.display(), "refused MIG intents moved aside");
        }
    }

    /// Records that `target` is about to be made for `claim`, before anything is created.
    ///
    /// # Errors
    /// `Conflict` when another claim is making an overlapping slice on that GPU right now
    /// (two prepares admitted at once); `Internal` when the intent cannot be written (then
    /// nothing may be created).
    pub fn reserve(&self, claim: &str, target: &MigTarget) -> Result<(), ServiceError> {
        let mut live = self.lock();
        self.push(&mut live, Intent::of(claim, target), target)
    }

    fn push(
        &self,
        live: &mut Vec<Intent>,
        intent: Intent,
        target: &MigTarget,
    ) -> Result<(), ServiceError> {
        if let Some(other) = live.iter().find(|i| {
            i.claim != intent.claim
                && i.gpu_uuid == intent.gpu_uuid
                && i.placement().overlaps(&intent.placement())
        }) {
            return Err(ServiceError::new(
                ErrorCode::Conflict,
                format!(
                    "{}: memory slices {} are being prepared as a MIG device for claim {} right now",
                    target.device,
                    intent.placement(),
                    other.claim
                ),
            ));
        }
        if live.contains(&intent) {
            return Ok(());
        }
        live.push(intent);
        if let Err(e) = self.write(live) {
            live.pop();
            return Err(ServiceError::internal(format!(
                "{}: recording the MIG slice about to be made in {}: {e}",
                target.device,
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Chooses a slice on GPU `gpu_uuid` with `choose`, given the slices being made there now
    /// by any claim, and records its intent, all under the intents' lock (so a concurrent
    /// prepare's choice sees this one). The slice carries the MIG-mode flag where another
    /// claim's intent on the GPU does.
    ///
    /// # Errors
    /// `choose`'s error; as [`MigIntents::reserve`].
    pub fn reserve_with(
        &self,
        claim: &str,
        gpu_uuid: &str,
        choose: impl FnOnce(&[Occupied]) -> Result<MigTarget, ServiceError>,
    ) -> Result<MigTarget, ServiceError> {
        let mut live = self.lock();
        let busy: Vec<Occupied> = live
            .iter()
            .filter(|i| i.gpu_uuid == gpu_uuid)
            .map(|i| Occupied {
                profile: GiProfileId(i.gi_profile_id),
                placement: i.placement(),
            })
            .collect();
        let mut target = choose(&busy)?;
        // A prepare beside this one that turned MIG mode on (or carries the flag of one that
        // did) marked its intent before the mode changed: this slice, planned while the mode
        // looked on already, carries the flag too, so that the last release turns it off.
        target.carries_mode_flag |= live
            .iter()
            .any(|i| i.gpu_uuid == gpu_uuid && i.claim != claim && i.enabled_mig_mode);
        self.push(&mut live, Intent::of(claim, &target), &target)?;
        Ok(target)
    }

    /// Marks `claim`'s intent for the slice `rec` names with its GPU-instance ID, the moment
    /// the instance exists: the sweep then takes for ours only the instance with that ID.
    pub fn made(&self, claim: &str, rec: &crate::claim::MigSlice) {
        let mut live = self.lock();
        let Some(i) = live.iter_mut().find(|i| {
            i.claim == claim
                && i.gpu_uuid == rec.gpu_uuid
                && i.placement_start == rec.placement_start
                && i.gi_profile_id == rec.gi_profile_id
                && (i.gi_id != Some(rec.gi_id) || (rec.enabled_mig_mode && !i.enabled_mig_mode))
        }) else {
            return;
        };
        i.gi_id = Some(rec.gi_id);
        i.enabled_mig_mode |= rec.enabled_mig_mode;
        if let Err(e) = self.write(&live) {
            tracing::warn!(path = %self.path.display(), error = %e, "marking a MIG intent made");
        }
    }

    /// Marks `claim`'s intent for `target` as turning the GPU's MIG mode on, on disk before
    /// the mode changes: a crash before the slice is recorded (or even made) leaves the intent
    /// to say so, and the next start turns the mode off again once nothing is left on the GPU.
    ///
    /// # Errors
    /// `Internal` when the intent is not there or cannot be written: the mode must then not
    /// be changed (nothing would say why it is on).
    pub fn entering_mig_mode(&self, claim: &str, target: &MigTarget) -> Result<(), ServiceError> {
        let mut live = self.lock();
        let Some(at) = live.iter().position(|i| {
            i.claim == claim
                && i.gpu_uuid == target.gpu_uuid
                && i.placement_start == target.start
                && i.gi_profile_id == target.profile.id.0
        }) else {
            return Err(ServiceError::internal(format!(
                "{}: no MIG intent of claim {claim} to record that MIG mode is turned on for it",
                target.device
            )));
        };
        if live[at].enabled_mig_mode {
            return Ok(());
        }
        live[at].enabled_mig_mode = true;
        if let Err(e) = self.write(&live) {
            live[at].enabled_mig_mode = false;
            return Err(ServiceError::internal(format!(
                "{}: recording in {} that MIG mode is turned on for the slice: {e}",
                target.device,
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Strikes every intent of `claim`: its record now names what was made, or nothing was.
    pub fn strike(&self, claim: &str) {
        let mut live = self.lock();
        let before = live.len();
        live.retain(|i| i.claim != claim);
        if live.len() == before {
            return;
        }
        if let Err(e) = self.write(&live) {
            // Harmless: a stale intent acts only for a claim whose record is half-prepared.
            tracing::warn!(path = %self.path.display(), error = %e, "striking MIG intents");
        }
    }

    /// Strikes `claim`'s intents when dropped: held across a prepare's apply and commit.
    pub fn strike_on_drop(&self, claim: &str) -> StrikeOnDrop<'_> {
        StrikeOnDrop(self, claim.to_string())
    }

    /// Holds the intents still (see [`Quiet::busy_for_others`]).
    pub fn quiet(&self) -> Quiet<'_> {
        Quiet(self.lock())
    }

    fn write(&self, live: &[Intent]) -> std::io::Result<()> {
        if live.is_empty() {
            return fsutil::remove_file_if_exists(&self.path);
        }
        let raw = serde_json::to_vec(live).map_err(std::io::Error::other)?;
        if let Some(dir) = self.path.parent() {
            fsutil::create_dir_if_missing(dir, 0o755)?;
        }
        fsutil::write_replace(&self.path, &raw, 0o600)
    }
}
