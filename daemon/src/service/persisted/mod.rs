//! Claim records read back from disk are input: the checkpoint's entries and the host records
//! (`<run-dir>/claims/<uid>/claim.json`) are checked as a request's would be before any path
//! is built from them, and a record that fails is moved to the state directory's quarantine
//! alone, so that the other claims go on and nothing outside the run, state and CDI
//! directories is ever touched because a file said so.
//!
//! Here: the check of one record ([`check`]), the records that claim one MIG slice twice
//! ([`collisions`]), the host records read back ([`host`]) and the quarantine of refused ones
//! ([`quarantine`]).

mod check;
mod collisions;
mod host;
mod quarantine;

#[cfg(test)]
pub(super) use check::Refused;
pub(super) use check::{check_record, normalize};
pub(super) use collisions::mig_collisions;
pub(super) use host::{host_record_read, host_records};
pub(super) use quarantine::Quarantine;

/// File name of the copy of a claim's record kept in its run directory
/// (`<run-dir>/claims/<uid>/claim.json`): what the claims are rebuilt from when the checkpoint
/// is missing or corrupt, or lacks them.
pub(super) const HOST_RECORD: &str = "claim.json";

/// Largest host record read, in bytes. A record is a few KiB (a claim with many containers
/// attached some tens); anything larger is not one this daemon wrote.
pub(super) const MAX_HOST_RECORD_BYTES: u64 = 4 << 20;

/// Directory under the state directory where refused records are kept as evidence.
pub(super) const QUARANTINE_DIR: &str = "quarantine";
