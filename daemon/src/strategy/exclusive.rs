//! Exclusive use: one claim holds the whole GPU, unshared. The GPU needs no setting (compute
//! mode stays `DEFAULT`, so the claim's containers may open it as many times as they like):
//! admission alone keeps every other claim off it. A prepare makes nothing for its group and
//! a release undoes nothing.

use gpushare_core::Want;

use super::group::{whole_gpu_holds, GpuHold, GroupLife, GroupStrategy};
use super::Strategy;
use crate::claim::{Group, Sharing};

/// One claim, the whole GPU, no setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exclusive;

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
