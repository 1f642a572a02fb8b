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

/// A mode word's mode in the words of placement's messages.
fn describe_mode(mode: Mode) -> String {
    match mode {
        Mode::Free => "free".into(),
        Mode::Exclusive => "held exclusively".into(),
        Mode::TimeSliced { interval, .. } => {
            let name = [
                TimeSliceInterval::Default,
                TimeSliceInterval::Short,
                TimeSliceInterval::Medium,
                TimeSliceInterval::Long,
            ]
            .into_iter()
            .find(|i| i.as_int() == interval)
            .map_or("an unknown interval", |i| i.as_str());
            format!("time-sliced at {name}")
        }
        Mode::Mps => "run by an MPS control daemon".into(),
        Mode::Mig { .. } => "partitioned into MIG instances".into(),
        Mode::Restoring => "being restored to its defaults".into(),
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
                    (Mode::Restoring, _) => {
                        "being restored to its defaults after its last claim left (retry shortly)"
                            .to_string()
                    }
                    (_, Some(hold)) => hold.describe(),
                    // Admitted to a claim whose prepare has not recorded it yet.
                    (mode, None) => format!("{} by a claim being prepared", describe_mode(mode)),
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::gpu::SimulatedBackend;

    fn backend() -> SimulatedBackend {
        SimulatedBackend::without_device_nodes("p4d.24xlarge", "node-a", Path::new("/x"))
            .expect("simulated node")
    }

    fn want(gpu: &Gpu, want: Want) -> (String, String, Want) {
        (gpu.uuid.clone(), gpu.device_name(), want)
    }

    #[test]
    fn admission_is_all_or_nothing_and_rebuilt_from_placement() {
        let backend = backend();
        let gpus = backend.gpus();
        let mut placement = Placement::default();
        placement
            .reserve("old", &[want(&gpus[1], Want::Mps)])
            .expect("free GPU");
        // As after a restart: the words hold what the checkpoint's placement holds.
        let modes = GpuModes::new(gpus, &placement);
        let err = modes
            .admit(
                "new",
                &[
                    want(&gpus[0], Want::Exclusive),
                    want(&gpus[1], Want::TimeSlicing(TimeSliceInterval::Default)),
                ],
                |uuid| placement.hold(uuid).cloned(),
            )
            .expect_err("gpu-1 runs old's MPS daemon");
        assert!(
            err.0.contains("gpu-1") && err.0.contains("MPS control daemon of claim old"),
            "{err}"
        );
        assert_eq!(
            modes.words[&gpus[0].uuid].load(),
            Mode::Free,
            "gpu-0, admitted before gpu-1 refused, was given back"
        );
        modes
            .admit("other", &[want(&gpus[0], Want::Exclusive)], |_| None)
            .expect("gpu-0 is free again");
        let err = modes
            .admit("late", &[want(&gpus[0], Want::Mps)], |_| None)
            .expect_err("gpu-0 is held");
        assert!(
            err.0.contains("held exclusively by a claim being prepared"),
            "{err}"
        );
    }

    #[test]
    fn the_last_holder_restores_the_interval() {
        let backend = backend();
        let gpu = backend.gpus()[2].clone();
        let modes = GpuModes::new(backend.gpus(), &Placement::default());
        let long = [want(&gpu, Want::TimeSlicing(TimeSliceInterval::Long))];
        modes.admit("a", &long, |_| None).expect("free GPU");
        modes.admit("b", &long, |_| None).expect("same interval");
        backend
            .set_time_slice(&gpu.uuid, TimeSliceInterval::Long)
            .expect("simulated");
        modes.release(&backend, &long);
        assert_eq!(
            backend.time_slice(&gpu.uuid).ok(),
            Some(TimeSliceInterval::Long),
            "b still holds it"
        );
        modes.release(&backend, &long);
        assert_eq!(
            backend.time_slice(&gpu.uuid).ok(),
            Some(TimeSliceInterval::Default)
        );
        assert_eq!(modes.words[&gpu.uuid].load(), Mode::Free);
        // A release without a hold changes nothing (and is logged).
        modes.release(&backend, &long);
        assert_eq!(modes.words[&gpu.uuid].load(), Mode::Free);
    }
}
