//! `gpushare-cdi-hook`: the OCI hook named in the CDI specs `gpushared` writes.
//!
//! A runtime (runc, crun) runs it with the container's OCI state on stdin:
//!
//! - `attach` at `createRuntime` ties the container to its claim through the daemon's `attach`
//!   method. A refusal (claim unknown or not ready, attach limit reached) or an unreachable
//!   daemon fails the container's start with one line on stderr.
//! - `detach` at `poststop` unties it. It never fails: problems are one warning line.
//! - Any other hook name is ignored with a note, so specs from newer or older daemons never
//!   block a container.
//!
//! The library holds everything but argument parsing: [`state`] and [`report`] are pure
//! (parsing and messages), [`hook`] does the I/O with every wait bounded by the hook's timeout.

pub mod hook;
pub mod report;
pub mod state;
