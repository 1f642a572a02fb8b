//! What tests and the demo do to a simulated node from outside gpushared: inject a fault,
//! put compute processes or another client's handles on a GPU, reset a GPU.

use super::{SimFault, SimulatedBackend};
use crate::gpu::GpuError;

impl SimulatedBackend {
    /// Makes the next call of `fault`'s kind fail once.
    pub fn inject(&self, fault: SimFault) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fault);
    }

    /// Sets the compute processes running on a GPU (an empty list: idle).
    ///
    /// # Errors
    /// Unknown GPU.
    pub fn set_processes(&self, uuid: &str, pids: Vec<u32>) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| s.processes = pids)
    }

    /// Performs a GPU reset: a pending MIG mode takes effect and every MIG instance is gone,
    /// as on hardware. Refused while processes or other clients' handles hold the GPU.
    ///
    /// # Errors
    /// `Busy` with processes or open handles, unknown GPU.
    pub fn reset(&self, uuid: &str) -> Result<(), GpuError> {
        self.change_mig(uuid, |s| {
            if !s.processes.is_empty() {
                return Err(GpuError::Busy(format!(
                    "GPU {uuid}: In use by another client ({} processes)",
                    s.processes.len()
                )));
            }
            s.refuse_if_held(uuid, None)?;
            s.reset();
            Ok(())
        })
    }

    /// Opens a handle on a GPU as another client would (`gi: None`: the whole GPU, e.g.
    /// nvidia-smi or DCGM; `Some(id)`: GPU instance `id`, a process on its MIG device). While
    /// it is open, what hardware answers "In use by another client" is refused as
    /// [`GpuError::Busy`]: destroying that instance or its compute instance, changing MIG
    /// mode, a reset.
    ///
    /// # Errors
    /// Unknown GPU, or (`NotFound`) no such GPU instance.
    pub fn open_handle(&self, uuid: &str, gi: Option<u32>) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| {
            if let Some(id) = gi {
                if !s.instances.iter().any(|i| i.gi_id == id) {
                    return Err(GpuError::NotFound(format!(
                        "GPU {uuid}: no GPU instance {id}"
                    )));
                }
            }
            *s.handles.entry(gi).or_default() += 1;
            Ok(())
        })?
    }

    /// Closes a handle [`SimulatedBackend::open_handle`] opened (nothing when none is open).
    ///
    /// # Errors
    /// Unknown GPU.
    pub fn close_handle(&self, uuid: &str, gi: Option<u32>) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| {
            if let Some(n) = s.handles.get_mut(&gi) {
                *n -= 1;
                if *n == 0 {
                    s.handles.remove(&gi);
                }
            }
        })
    }
}
