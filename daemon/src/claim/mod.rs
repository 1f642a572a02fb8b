//! A claim: its lifecycle ([`lifecycle`]: the one transition function), its durable record
//! ([`record`]: the versioned on-disk form) and its wire view ([`wire`]: the protocol's
//! `ClaimState`), converted at the edges.
//!
//! In memory the registry still keeps a claim as the protocol's `ClaimInfo` (its nested
//! device, MPS and MIG records are the facts the protocol reports); what may change its phase
//! is only [`lifecycle::transition`], through the registry.

pub mod lifecycle;
pub mod record;
pub mod wire;

pub use lifecycle::{transition, Event, IllegalTransition, Next, Phase};
pub use record::{ClaimRecord, TombstoneRecord, RECORD_FORMAT};
