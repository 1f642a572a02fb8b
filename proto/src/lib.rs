//! Wire types of `gpushared`'s socket protocol and a small blocking client.
//!
//! The protocol is newline-delimited JSON over a Unix stream socket: each request is one line
//! holding a [`Request`], answered by one line holding a [`Response`] with the same `id`.
//! `docs/protocol.md` (with its JSON Schema) is the reference for implementers in other
//! languages; this crate is the reference for Rust callers.
//!
//! This crate has no async runtime and few dependencies on purpose: `gpushare-cdi-hook` links it
//! and runs at every container start, so it must start fast.

mod client;
mod summary;
mod types;

pub use client::{Client, ClientError};
pub use types::*;

/// Newest version of the wire protocol spoken by this crate and the daemon (what `version`
/// reports). Version 2 answers `list_claims` in pages ([`ListClaimsParams`], [`ClaimPage`]);
/// every other method means the same in both. A request carrying a version outside
/// [`OLDEST_PROTOCOL_VERSION`]`..=`[`PROTOCOL_VERSION`] is refused with
/// [`ErrorCode::InvalidRequest`].
pub const PROTOCOL_VERSION: u32 = 2;

/// Oldest protocol version the daemon still accepts, and the one [`Client`] sends for every
/// method that means the same in every version (all but a paged `list_claims`), so that it
/// reaches daemons of any version.
pub const OLDEST_PROTOCOL_VERSION: u32 = 1;

/// Most claims in one `list_claims` page (protocol version 2).
pub const MAX_CLAIMS_PAGE: u32 = 500;

/// Longest request line the daemon accepts, in bytes (2 MiB): a ResourceClaim is at most
/// 1.5 MiB (etcd's object limit), plus the envelope. [`Client`] refuses a longer request
/// before sending it; the daemon answers one with `InvalidRequest` and closes the connection.
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// Default path of the daemon's socket.
pub const DEFAULT_SOCKET: &str = "/run/gpushare/gpushared.sock";

/// The CDI kind under which every claim's devices are published (`gpushare.io/claim=<name>`).
pub const CDI_KIND: &str = "gpushare.io/claim";
