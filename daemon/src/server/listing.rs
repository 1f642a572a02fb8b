//! `list_claims` answers, written as they are read.
//!
//! A whole listing is large (about 0.9 KiB a claim: 9 MB at 10,000 claims) and a reader may
//! leave it unread as long as the idle timeout allows. Built whole, every such answer held the
//! claims' copies, their JSON tree and its text until the peer took the last byte, so a reader
//! with its share of connections could hold gigabytes. Here an answer is read from the
//! published view a few claims at a time ([`BATCH`], in UID order after the last one written)
//! and encoded into one buffer that is handed to the socket whenever it reaches
//! [`PIECE_BYTES`]; the next claims are read only once the socket has taken it. So a connection
//! holds at most one piece (plus the one claim that crossed its end) and a batch of shared
//! claim handles, whatever the claim count and however slowly its peer reads: a uid's
//! connections together at most its share of slots times that (`slots`), all connections at
//! most `max_connections` times that. The rest waits in the kernel's socket buffer, charged to
//! the socket, or is not read yet.
//!
//! The price: a listing is not one instant's view. Each claim is as it was when its batch was
//! read; a claim prepared or released while the answer is written may be in it or not; every
//! other claim is in it once.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_proto::{
    ErrorCode, ListClaimsParams, Method, MAX_CLAIMS_PAGE, OLDEST_PROTOCOL_VERSION,
};
use serde_json::Value;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::claim::wire::claim_info;
use crate::claim::Claim;
use crate::error::ServiceError;
use crate::service::Service;

/// Bytes of an answer encoded before they are handed to the socket (and the next claims read).
pub const PIECE_BYTES: usize = 64 * 1024;

/// Claims read from the view at a time.
pub const BATCH: usize = 64;

/// Where a listing's claims come from: the service's published view, or a test's map.
pub trait ClaimSource {
    /// Up to `n` claims after the UID `after` (from the first when `None`), in UID order.
    fn claims_after(&self, after: Option<&str>, n: usize) -> Vec<Arc<Claim>>;
}

impl ClaimSource for Service {
    fn claims_after(&self, after: Option<&str>, n: usize) -> Vec<Arc<Claim>> {
        Service::claims_after(self, after, n)
    }
}

/// One `list_claims` request, checked, to be answered by [`write()`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The request's protocol version (the answer's).
    pub version: u32,
    /// The request's id.
    pub id: u64,
    /// Version 2's page; `None`: every claim, as one array (version 1).
    pub page: Option<Page>,
}

/// One page of a version-2 listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Most claims in it (1 to [`MAX_CLAIMS_PAGE`]).
    pub limit: usize,
    /// The last claim UID of the previous page (its `continue`).
    pub after: Option<String>,
}

impl Listing {
    /// Checks the params of a `list_claims` of protocol `version`: none in version 1,
    /// [`ListClaimsParams`] in version 2 (a limit past [`MAX_CLAIMS_PAGE`] is lowered to it).
    ///
    /// # Errors
    /// `InvalidRequest` naming the parameter at fault.
    pub fn of(version: u32, id: u64, params: Option<Value>) -> Result<Listing, ServiceError> {
        let method = Method::ListClaims;
        if version == OLDEST_PROTOCOL_VERSION {
            super::dispatch::no_params(method, &params)?;
            return Ok(Listing {
                version,
                id,
                page: None,
            });
        }
        // Both are optional: no params (or null) is the first page of the longest.
        let p: ListClaimsParams = match params {
            None | Some(Value::Null) => ListClaimsParams::default(),
            given => super::dispatch::params(method, given)?,
        };
        let invalid = |why: String| {
            Err(ServiceError::new(
                ErrorCode::InvalidRequest,
                format!("params of {method}: {why}"),
            ))
        };
        let limit = match p.limit {
            Some(0) => {
                return invalid(format!(
                    "limit must be 1 or more (at most {MAX_CLAIMS_PAGE} are given)"
                ))
            }
            Some(n) => n.min(MAX_CLAIMS_PAGE),
            None => MAX_CLAIMS_PAGE,
        };
        if let Some(token) = &p.continue_from {
            // The token is the last UID of a page this daemon wrote: anything else did not
            // come from it.
            if crate::config::claim_uid_problem(token).is_some() {
                return invalid(format!(
                    "continue: {token:?} is not the continue of a list_claims page"
                ));
            }
        }
        Ok(Listing {
            version,
            id,
            page: Some(Page {
                limit: limit as usize,
                after: p.continue_from,
            }),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing encoded yet.
    Head,
    /// Between claims.
    Claims,
    /// The end of the line is encoded (and not yet handed out).
    Tail,
    /// Everything was handed out.
    Done,
}

/// The answer line of a [`Listing`], piece by piece ([`Pieces::next_piece`]).
#[derive(Debug)]
pub struct Pieces<'a, S: ?Sized> {
    source: &'a S,
    listing: &'a Listing,
    stage: Stage,
    /// Read from the source, not encoded yet (at most [`BATCH`]).
    pending: VecDeque<Arc<Claim>>,
    /// The last claim UID encoded.
    after: Option<String>,
    /// Claims encoded.
    listed: usize,
    buf: Vec<u8>,
}

impl<'a, S: ClaimSource + ?Sized> Pieces<'a, S> {
    /// The answer to `listing`, from `source`.
    pub fn new(source: &'a S, listing: &'a Listing) -> Pieces<'a, S> {
        Pieces {
            source,
            listing,
            stage: Stage::Head,
            pending: VecDeque::new(),
            after: listing.page.as_ref().and_then(|p| p.after.clone()),
            listed: 0,
            // Room for a piece and the claim that crosses its end, most of the time.
            buf: Vec::with_capacity(PIECE_BYTES + 16 * 1024),
        }
    }

    /// The next piece of the answer line: about [`PIECE_BYTES`] (more only by the claim that
    /// crossed that size), the last one ending in the newline; `None` once all was given.
    ///
    /// # Errors
    /// A claim could not be encoded (the line is then broken off: close the connection).
    pub fn next_piece(&mut self) -> Result<Option<&[u8]>, serde_json::Error> {
        self.buf.clear();
        while self.buf.len() < PIECE_BYTES {
            match self.stage {
                Stage::Head => self.head(),
                Stage::Claims => self.claim()?,
                Stage::Tail | Stage::Done => break,
            }
        }
        match self.stage {
            Stage::Done => Ok(None),
            Stage::Tail => {
                self.stage = Stage::Done;
                Ok(Some(&self.buf))
            }
            Stage::Head | Stage::Claims => Ok(Some(&self.buf)),
        }
    }

    fn head(&mut self) {
        let l = self.listing;
        // Infallible: writing to a Vec.
        let _ = write!(
            self.buf,
            "{{\"version\":{},\"id\":{},\"result\":",
            l.version, l.id
        );
        self.buf.extend_from_slice(match l.page {
            Some(_) => b"{\"claims\":[",
            None => b"[",
        });
        self.stage = Stage::Claims;
    }

    /// Encodes the next claim, or the end when there is none (or the page is full).
    fn claim(&mut self) -> Result<(), serde_json::Error> {
        let limit = self.listing.page.as_ref().map(|p| p.limit);
        if self.pending.is_empty() {
            // One more than the page holds tells whether another page follows.
            let want = limit.map_or(BATCH, |l| (l - self.listed + 1).min(BATCH));
            self.pending = self.source.claims_after(self.after.as_deref(), want).into();
            if self.pending.is_empty() {
                return self.tail(false);
            }
        }
        if limit == Some(self.listed) {
            // The page is full and a claim follows it.
            return self.tail(true);
        }
        let Some(claim) = self.pending.pop_front() else {
            return Ok(());
        };
        if self.listed > 0 {
            self.buf.push(b',');
        }
        // The protocol's view of the claim, made here, one claim at a time.
        serde_json::to_writer(&mut self.buf, &claim_info(&claim))?;
        self.after = Some(claim.uid.clone());
        self.listed += 1;
        Ok(())
    }

    /// Ends the line; `more`: another page follows this one.
    fn tail(&mut self, more: bool) -> Result<(), serde_json::Error> {
        self.pending.clear();
        if self.listing.page.is_some() {
            self.buf.extend_from_slice(b"],\"continue\":");
            let next = if more { self.after.as_deref() } else { None };
            serde_json::to_writer(&mut self.buf, &next)?;
            self.buf.extend_from_slice(b"}}\n");
        } else {
            self.buf.extend_from_slice(b"]}\n");
        }
        self.stage = Stage::Tail;
        Ok(())
    }
}

/// Writes the answer to `listing` to `out`, piece by piece, reading the next claims only once
/// `out` has taken the last piece. `work` accumulates the time spent reading and encoding
/// (not waiting for the peer), also when the future is dropped half-way.
///
/// # Errors
/// Writing failed (the peer went away), or a claim could not be encoded.
pub async fn write<W, S>(
    out: &mut W,
    source: &S,
    listing: &Listing,
    work: &mut Duration,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
    S: ClaimSource + ?Sized,
{
    let mut pieces = Pieces::new(source, listing);
    loop {
        let started = Instant::now();
        let piece = pieces.next_piece().map_err(|e| {
            io::Error::other(format!(
                "encoding a claim of list_claims {}: {e}",
                listing.id
            ))
        })?;
        *work += started.elapsed();
        let Some(piece) = piece else {
            return Ok(());
        };
        out.write_all(piece).await?;
    }
}

#[cfg(test)]
#[path = "listing_tests.rs"]
mod tests;
