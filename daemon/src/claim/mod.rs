//! A claim: the daemon's model of it ([`model`]: its phase and its device groups, each with
//! its strategy; [`leaf`]: the leaf facts they hold, a device, a request's CDI device IDs, an
//! MPS control daemon, a MIG slice, a container), its lifecycle ([`lifecycle`]: the one
//! transition function) and the protocol's view of it ([`wire`]: `ClaimInfo`, `ClaimState`
//! and the protocol's records of the leaf facts, converted there alone).
//! Its durable records are `crate::store::record` (their leaf facts `crate::store::leaf`),
//! converted there alone; the registry it lives in is `crate::registry`, held by the
//! service's `Records` (`service/records.rs`: published view, group commit).
//!
//! The registry (`crate::registry`) holds [`Claim`]s; what may change a claim's phase is only
//! [`lifecycle::transition`], through the registry.

pub mod leaf;
pub mod lifecycle;
pub mod model;
pub mod wire;

pub use leaf::{
    Attachment, Device, MigSlice, MpsAsked, MpsDaemon, Pod, PreparedDevice, Request, SliceOrigin,
};
pub use lifecycle::{transition, Cause, Causes, Event, IllegalTransition, Next, Phase};
pub use model::{Claim, Group, MigSharing, Sharing};
