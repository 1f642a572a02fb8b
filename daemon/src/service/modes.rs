//! Admission of claims to GPUs through each GPU's lock-free mode word
//! ([`gpushare_core::GpuModeWord`]), and the restore of a GPU's settings by its last holder
//! outside every lock.
//!
//! The word is what admits or refuses a claim; [`Placement`] under the registry mutex only
//! remembers who holds what, for listings and error messages. A prepare is admitted on all its
//! GPUs (in UUID order, undoing the ones taken when a later one refuses) before it touches the
//! registry, so two prepares of different claims never wait on each other to be refused, and a
//! release restores time-slice Default or compute mode DEFAULT with no lock held: no other
//! claim can be admitted to that GPU until the restore is done.

use std::collections::BTreeMap;

use gpushare_core::{GpuModeWord, Mode, Released};
use gpushare_proto::{ComputeMode, TimeSliceInterval};

use crate::gpu::{Gpu, GpuBackend};
use crate::placement::{describe_want, Conflict, Hold, Placement, Want};

/// The mode word of every GPU of the node, by UUID.
#[derive(Debug, Default)]
pub(super) struct GpuModes {
    words: BTreeMap<String, GpuModeWord>,
}

fn core_want(want: Want) -> gpushare_core::Want {
    match want {
        Want::Exclusive => gpushare_core::Want::Exclusive,
        Want::TimeSlicing(interval) => gpushare_core::Want::TimeSliced(interval.as_int()),
        Want::Mps => gpushare_core::Want::Mps,
    }
}

impl GpuModes {
    /// Words for `gpus`, holding what `placement` (rebuilt from the checkpoint) holds.
    pub(super) fn new(gpus: &[Gpu], placement: &Placement) -> GpuModes {
        let modes = GpuModes {
            words: gpus
                .iter()
                .map(|g| (g.uuid.clone(), GpuModeWord::new()))
                .collect(),
        };
        for (uuid, hold) in placement.holds() {
            let (want, holders) = match hold {
                Hold::Exclusive(_) => (Want::Exclusive, 1),
                Hold::Mps(_) => (Want::Mps, 1),
                Hold::TimeSliced { interval, claims } => {
                    (Want::TimeSlicing(*interval), claims.len())
                }
            };
            let Some(word) = modes.words.get(uuid) else {
                tracing::error!(gpu = %uuid, "checkpointed claim holds a GPU this node does not have");
                continue;
            };
            for _ in 0..holders {
                if let Err(mode) = word.try_acquire(core_want(want)) {
                    // Placement admitted the same holds by the same rules; this would be a bug.
                    tracing::error!(gpu = %uuid, ?mode, "mode word refused a hold placement admitted");
                }
            }
        }
        modes
    }

    /// Admits `claim` on every `(uuid, device name, want)`, all or nothing. `holder` says
    /// what holds a GPU, for the message (a moment's view: it may lag the word).
    ///
    /// # Errors
    /// [`Conflict`] naming the first GPU that refused; every word taken before it is given
    /// back, so nothing changes.
    pub(super) fn admit(
        &self,
        claim: &str,
        wants: &[(String, String, Want)],
        holder: impl Fn(&str) -> Option<Hold>,
    ) -> Result<(), Conflict> {
        // UUID order, so two multi-GPU claims meet on their first common GPU and one of them
        // is refused there, instead of each taking half.
        let mut order: Vec<&(String, String, Want)> = wants.iter().collect();
        order.sort_by(|a, b| a.0.cmp(&b.0));
        for (i, (uuid, name, want)) in order.iter().enumerate() {
            let Some(word) = self.words.get(uuid) else {
                self.give_back(&order[..i]);
                return Err(Conflict(format!(
                    "{name} ({uuid}) is not a GPU of this node"
                )));
            };
            if let Err(mode) = word.try_acquire(core_want(*want)) {
                self.give_back(&order[..i]);
                let what = match (mode, holder(uuid)) {
                    (Mode::Restoring, _) | (_, None) => {
                        "being released by its last claim (retry shortly)".to_string()
                    }
                    (_, Some(hold)) => hold.describe(),
                };
                return Err(Conflict(format!(
                    "{name} ({uuid}) is {what}; claim {claim} asks {}",
                    describe_want(*want)
                )));
            }
        }
        Ok(())
    }

    /// Gives back holds that were admitted, with no restore: nothing was applied yet, and a
    /// GPU left to its first holder's settings is only ever changed by the next first holder.
    fn give_back(&self, taken: &[&(String, String, Want)]) {
        for (uuid, _, want) in taken {
            if let Some(word) = self.words.get(uuid) {
                match word.release(core_want(*want)) {
                    Ok(Released::Last(guard)) => drop(guard),
                    Ok(Released::Shared { .. }) => {}
                    Err(e) => tracing::error!(gpu = %uuid, error = %e, "giving back an admission"),
                }
            }
        }
    }

    /// Releases a claim's holds; the last holder of a GPU restores time-slice Default or
    /// compute mode DEFAULT before the GPU can be admitted to anyone else. Call with no lock
    /// held: the restore is an NVML call.
    pub(super) fn release(&self, backend: &dyn GpuBackend, wants: &[(String, String, Want)]) {
        for (uuid, name, want) in wants {
            let Some(word) = self.words.get(uuid) else {
                continue;
            };
            match word.release(core_want(*want)) {
                Ok(Released::Last(guard)) => {
                    match want {
                        Want::TimeSlicing(_) => {
                            if let Err(e) = backend.set_time_slice(uuid, TimeSliceInterval::Default)
                            {
                                tracing::error!(gpu = %name, error = %e, "restoring time-slice Default");
                            }
                        }
                        Want::Mps => {
                            if let Err(e) = backend.set_compute_mode(uuid, ComputeMode::Default) {
                                tracing::error!(gpu = %name, error = %e, "restoring compute mode DEFAULT");
                            }
                        }
                        Want::Exclusive => {}
                    }
                    drop(guard);
                }
                Ok(Released::Shared { .. }) => {}
                Err(e) => {
                    tracing::error!(gpu = %name, error = %e, "releasing a hold the GPU's mode word does not have")
                }
            }
        }
    }
}
