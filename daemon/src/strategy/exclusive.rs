//! Exclusive use: one claim holds the whole GPU, unshared. The GPU needs no setting (compute
//! mode stays `DEFAULT`, so the claim's containers may open it as many times as they like):
//! admission alone keeps every other claim off it. A prepare makes nothing for its group and
//! a release undoes nothing.

use gpushare_core::Want;

use super::group::{check_whole_gpus, whole_gpu_holds, GpuHold, GroupLife, GroupStrategy};
use super::select::{GroupAsk, Planning};
use super::Strategy;
use crate::claim::{Group, Sharing};
use crate::error::ServiceError;

/// One claim, the whole GPU, no setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exclusive;

impl Exclusive {
    /// Plans a group of whole GPUs held exclusively: each GPU checked to be had whole.
    ///
    /// # Errors
    /// A GPU that cannot be had whole now ([`check_whole_gpus`]).
    pub fn plan(p: &Planning<'_>, group: &GroupAsk<'_>) -> Result<Exclusive, ServiceError> {
        check_whole_gpus(p, group)?;
        Ok(Exclusive)
    }
}

impl Strategy for Exclusive {}

impl GroupStrategy for Exclusive {
    fn whole_gpu(&self) -> Option<&dyn Strategy> {
        Some(self)
    }

    fn planned(&self) -> Sharing {
        Sharing::Exclusive
    }
}

impl GroupLife for Exclusive {
    fn holds(&self, group: &Group) -> Vec<GpuHold> {
        whole_gpu_holds(group, Want::Exclusive)
    }
}
