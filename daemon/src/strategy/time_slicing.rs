//! Time-slicing: claims at one interval share a GPU, the driver switching between their
//! contexts at that interval (`nvidia-smi compute-policy --set-timeslice`; NVIDIA's codes 0–3:
//! Default, Short, Medium, Long). Claims share it only at equal intervals (admission's rule);
//! the last holder puts `Default` back. The interval is all a group needs: a prepare makes
//! nothing else for it and a release undoes nothing.

use gpushare_proto::TimeSliceInterval;

use crate::claim::{Group, Sharing};

use gpushare_core::Want;

use super::group::{check_whole_gpus, whole_gpu_holds, GpuHold, GroupLife, GroupStrategy};
use super::select::{GroupAsk, Planning};
use super::Strategy;
use crate::error::ServiceError;
use crate::gpu::GpuBackend;

/// Time-slicing at `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeSlicing {
    /// The interval the claims asked.
    pub interval: TimeSliceInterval,
}

impl TimeSlicing {
    /// Plans a group of whole GPUs time-sliced at `interval`: each GPU checked to be had
    /// whole (the interval is set at apply).
    ///
    /// # Errors
    /// A GPU that cannot be had whole now ([`check_whole_gpus`]).
    pub fn plan(
        p: &Planning<'_>,
        group: &GroupAsk<'_>,
        interval: TimeSliceInterval,
    ) -> Result<TimeSlicing, ServiceError> {
        check_whole_gpus(p, group)?;
        Ok(TimeSlicing { interval })
    }
}

impl Strategy for TimeSlicing {
    fn has_setting(&self) -> bool {
        true
    }

    fn set_up(
        &self,
        backend: &dyn GpuBackend,
        uuid: &str,
        device: &str,
    ) -> Result<(), ServiceError> {
        backend.set_time_slice(uuid, self.interval).map_err(|e| {
            ServiceError::gpu(
                format_args!("setting time-slice {} on {device}", self.interval.as_str()),
                &e,
            )
        })
    }

    fn check_again(&self, backend: &dyn GpuBackend, uuid: &str, device: &str) {
        let interval = self.interval;
        if backend.time_slice(uuid).ok() != Some(interval) {
            tracing::warn!(gpu = %device, interval = interval.as_str(), "time-slice interval differs from what its claims asked; re-applying");
            if let Err(e) = backend.set_time_slice(uuid, interval) {
                tracing::error!(gpu = %device, error = %e, "re-applying the time-slice interval");
            }
        }
    }

    fn restore(&self, backend: &dyn GpuBackend, uuid: &str, device: &str) {
        if let Err(e) = backend.set_time_slice(uuid, TimeSliceInterval::Default) {
            tracing::error!(gpu = %device, error = %e, "restoring time-slice Default");
        }
    }

    fn clear_leftover(&self, backend: &dyn GpuBackend, uuid: &str, device: &str) {
        let Ok(left) = backend.time_slice(uuid) else {
            return;
        };
        if left != TimeSliceInterval::Default {
            tracing::warn!(gpu = %device, interval = left.as_str(), "time-slice interval that no claim holds (an interrupted prepare or release left it); back to Default");
            if let Err(e) = backend.set_time_slice(uuid, TimeSliceInterval::Default) {
                tracing::error!(gpu = %device, error = %e, "putting the time-slice interval back to Default");
            }
        }
    }
}

impl GroupStrategy for TimeSlicing {
    fn whole_gpu(&self) -> Option<&dyn Strategy> {
        Some(self)
    }

    fn planned(&self) -> Sharing {
        Sharing::TimeSlicing {
            interval: self.interval,
        }
    }
}

impl GroupLife for TimeSlicing {
    fn holds(&self, group: &Group) -> Vec<GpuHold> {
        whole_gpu_holds(group, Want::TimeSliced(self.interval.as_int()))
    }
}
