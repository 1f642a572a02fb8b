//! Admission: the one owner of the sharing rules. A claim is admitted to its GPUs by each
//! GPU's lock-free mode word ([`gpushare_core::GpuModeWord`], whose transitions are the rules
//! and are loom-checked), all or nothing, and a release restores a GPU's settings as its last
//! holder leaves, outside every lock.
//!
//! [`Placement`](crate::placement::Placement) under the registry mutex only remembers who holds what, for listings and
//! error messages. A prepare is admitted on all its GPUs (in UUID order, undoing the ones
//! taken when a later one refuses) before it touches the registry, so two prepares of
//! different claims never wait on each other to be refused, and a release restores time-slice
//! Default or compute mode DEFAULT with no lock held: no other claim can be admitted to that
//! GPU until the restore is done. The start-up reconcile admits the checkpointed claims the
//! same way, so a record that conflicts with another is refused by the same rules.

use std::collections::BTreeMap;

use gpushare_core::{GpuModeWord, Mode, Released, Want};
use gpushare_proto::TimeSliceInterval;

use crate::gpu::{Gpu, GpuBackend};
use crate::placement::Hold;

/// A refused admission: the message names the GPU, what holds it and what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Conflict(pub String);

/// An interval code as NVIDIA names it.
fn interval_name(code: u8) -> &'static str {
    TimeSliceInterval::from_int(code).map_or("an unknown interval", TimeSliceInterval::as_str)
}

/// What a claim asks of a GPU, for error messages ("time-slicing at Long", …).
pub fn describe_want(want: Want) -> String {
    match want {
        Want::Exclusive => "it exclusively".into(),
        Want::TimeSliced(i) => format!("time-slicing at {}", interval_name(i)),
        Want::Mps => "MPS".into(),
        Want::Mig => "a MIG instance".into(),
    }
}

/// The mode word of every GPU of the node, by UUID.
#[derive(Debug, Default)]
pub(crate) struct GpuModes {
    words: BTreeMap<String, GpuModeWord>,
}

/// A mode word's mode in the words of placement's messages.
fn describe_mode(mode: Mode) -> String {
    match mode {
        Mode::Free => "free".into(),
        Mode::Exclusive => "held exclusively".into(),
        Mode::TimeSliced { interval, .. } => format!("time-sliced at {}", interval_name(interval)),
        Mode::Mps => "run by an MPS control daemon".into(),
        Mode::Mig { .. } => "partitioned into MIG instances".into(),
        Mode::Restoring => "being restored to its defaults".into(),
    }
}

impl GpuModes {
    /// Words for `gpus`, every one free.
    pub(crate) fn new(gpus: &[Gpu]) -> GpuModes {
        GpuModes {
            words: gpus
                .iter()
                .map(|g| (g.uuid.clone(), GpuModeWord::new()))
                .collect(),
        }
    }

    /// Admits a claim read back at start, as [`GpuModes::admit`] does, except that a GPU this
    /// node does not have (a record of another node's, a GPU gone) is logged and skipped: the
    /// claim is kept, `Degraded`, to be released (`service/missing_gpus.rs`).
    ///
    /// # Errors
    /// [`Conflict`] when it conflicts with a claim admitted before it; nothing is taken.
    pub(crate) fn adopt(
        &self,
        claim: &str,
        wants: &[(String, String, Want)],
    ) -> Result<(), Conflict> {
        let known: Vec<(String, String, Want)> = wants
            .iter()
            .filter(|(uuid, name, _)| {
                let here = self.words.contains_key(uuid);
                if !here {
                    tracing::error!(claim, gpu = %name, uuid = %uuid, "checkpointed claim holds a GPU this node does not have");
                }
                here
            })
            .cloned()
            .collect();
        self.admit(claim, &known, |_| None)
    }

    /// Admits `claim` on every `(uuid, device name, want)`, all or nothing. `holder` says
    /// what holds a GPU, for the message (a moment's view: it may lag the word).
    ///
    /// # Errors
    /// [`Conflict`] naming the first GPU that refused; every word taken before it is given
    /// back, so nothing changes.
    pub(crate) fn admit(
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
            if let Err(mode) = word.try_acquire(*want) {
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
                match word.release(*want) {
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
    pub(crate) fn release(&self, backend: &dyn GpuBackend, wants: &[(String, String, Want)]) {
        for (uuid, name, want) in wants {
            let Some(word) = self.words.get(uuid) else {
                continue;
            };
            match word.release(*want) {
                Ok(Released::Last(guard)) => {
                    // MIG mode and instances are the MIG strategy's to undo, with its claim.
                    crate::strategy::of_want(*want).restore(backend, uuid, name);
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
    use crate::placement::Placement;

    fn backend() -> SimulatedBackend {
        SimulatedBackend::without_device_nodes("p4d.24xlarge", "node-a", Path::new("/x"))
            .expect("simulated node")
    }

    fn want(gpu: &Gpu, want: Want) -> (String, String, Want) {
        (gpu.uuid.clone(), gpu.device_name(), want)
    }

    #[test]
    fn admission_is_all_or_nothing_and_start_up_admits_by_the_same_rules() {
        let backend = backend();
        let gpus = backend.gpus();
        let modes = GpuModes::new(gpus);
        let mut placement = Placement::default();
        let old = [want(&gpus[1], Want::Mps)];
        // As at start: a checkpointed claim is admitted like any other.
        modes.adopt("old", &old).expect("free GPU");
        placement.record("old", &old);
        let err = modes
            .adopt("twin", &[want(&gpus[1], Want::TimeSliced(0))])
            .expect_err("a record that conflicts with another is refused at start too");
        assert!(err.0.contains("gpu-1"), "{err}");
        let err = modes
            .admit(
                "new",
                &[
                    want(&gpus[0], Want::Exclusive),
                    want(&gpus[1], Want::TimeSliced(0)),
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
        // A GPU the node does not have is skipped at start, not a conflict.
        let gone = [("GPU-gone".to_string(), "gpu-9".to_string(), Want::Mps)];
        modes
            .adopt("elsewhere", &gone)
            .expect("kept, to be released");
    }

    #[test]
    fn the_last_holder_restores_the_interval() {
        let backend = backend();
        let gpu = backend.gpus()[2].clone();
        let modes = GpuModes::new(backend.gpus());
        let long = [want(
            &gpu,
            Want::TimeSliced(TimeSliceInterval::Long.as_int()),
        )];
        modes.admit("a", &long, |_| None).expect("free GPU");
        modes.admit("b", &long, |_| None).expect("same interval");
        let err = modes
            .admit("c", &[want(&gpu, Want::TimeSliced(1))], |_| None)
            .expect_err("another interval");
        assert!(
            err.0.contains("time-sliced at Long") && err.0.contains("time-slicing at Short"),
            "{err}"
        );
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
