//! The claim registry's parts that are not the service's: claims and tombstones that know
//! what changed ([`claims`]), and transactions that undo themselves unless committed
//! ([`txn`]).

pub mod claims;
pub mod txn;

pub use claims::{Claims, Tombstones, TransitionError};
pub(crate) use txn::{Registry, Txn};
