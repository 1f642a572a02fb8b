//! Sharing strategies that need more than a GPU setting. Time-slicing and exclusive use are a
//! backend setting and a placement rule, handled by the service; MPS needs a control daemon.

pub mod mig;
pub mod mps;
pub mod mps_support;
