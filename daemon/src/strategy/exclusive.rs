//! Exclusive use: one claim holds the whole GPU, unshared. The GPU needs no setting (compute
//! mode stays `DEFAULT`, so the claim's containers may open it as many times as they like):
//! admission alone keeps every other claim off it.

use super::Strategy;

/// One claim, the whole GPU, no setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exclusive;

impl Strategy for Exclusive {}
