//! Who is on the other end of a connection (SO_PEERCRED, SO_PEERGROUPS) and what it may
//! call ([`authorize`]); denials are logged once per uid.

use std::collections::HashSet;
use std::sync::Mutex;

use gpushare_proto::Method;
use tokio::net::UnixStream;

use super::ServerConfig;

/// Most distinct uids remembered for "logged once per peer"; past it denials are still
/// refused, only no longer logged, so a uid-cycling client cannot grow the daemon's memory.
const MAX_LOGGED_PEERS: usize = 4096;

/// Who is on the other end of a connection, from SO_PEERCRED and SO_PEERGROUPS (both as the
/// kernel recorded them at connect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Effective uid when it connected.
    pub uid: u32,
    /// Primary gid when it connected.
    pub gid: u32,
    /// Pid, when the kernel gives one (not across pid namespaces).
    pub pid: Option<i32>,
    /// Supplementary gids; on kernels without SO_PEERGROUPS (before 4.13) read from
    /// `/proc/<pid>/status`, empty when that fails too.
    pub groups: Vec<u32>,
}

impl Peer {
    pub(super) fn of(stream: &UnixStream) -> Option<Peer> {
        use std::os::fd::AsFd;
        let cred = stream.peer_cred().ok()?;
        let pid = cred.pid().filter(|p| *p > 0);
        let groups = crate::sys::peer_groups(stream.as_fd())
            .ok()
            .or_else(|| pid.and_then(crate::sys::read_groups))
            .unwrap_or_default();
        Some(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid,
            groups,
        })
    }
}

/// Why [`authorize`] refused a call. Its message is the `PermissionDenied` answer's, naming
/// the method and, where known, the peer's uid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthorizeError {
    /// The kernel gave no credentials for the connection (SO_PEERCRED failed).
    #[error("{method} refused: the peer's credentials are unknown")]
    UnknownPeer {
        /// The method called.
        method: Method,
    },
    /// A changing method called by a uid that is neither root nor in `socket.changing_uids`.
    #[error("{method} needs root or a uid in socket.changing_uids (peer uid {uid})")]
    ChangeRefused {
        /// The method called.
        method: Method,
        /// The peer's uid.
        uid: u32,
    },
    /// A reading method called by a uid that is neither root nor in `socket.changing_uids`
    /// nor a member of the socket's group.
    #[error("{method} needs root, a uid in socket.changing_uids or membership of the socket's group {group} (peer uid {uid})")]
    ReadRefused {
        /// The method called.
        method: Method,
        /// The socket's group.
        group: u32,
        /// The peer's uid.
        uid: u32,
    },
}

/// May `peer` call `method`? Root and `changing_uids` may call everything; members of the
/// socket's group may call reading methods; nobody else anything (an unknown peer included).
///
/// # Errors
/// [`AuthorizeError`], whose message the `PermissionDenied` answer carries.
pub fn authorize(
    cfg: &ServerConfig,
    peer: Option<&Peer>,
    method: Method,
) -> Result<(), AuthorizeError> {
    let Some(peer) = peer else {
        return Err(AuthorizeError::UnknownPeer { method });
    };
    if peer.uid == 0 || cfg.changing_uids.contains(&peer.uid) {
        return Ok(());
    }
    let in_group = peer.gid == cfg.group || peer.groups.contains(&cfg.group);
    if method.is_changing() {
        return Err(AuthorizeError::ChangeRefused {
            method,
            uid: peer.uid,
        });
    }
    if in_group {
        return Ok(());
    }
    Err(AuthorizeError::ReadRefused {
        method,
        group: cfg.group,
        uid: peer.uid,
    })
}

/// Uids already logged as denied, so a client retrying in a loop does not flood the journal.
#[derive(Debug, Default)]
pub(super) struct DeniedPeers(Mutex<HashSet<u32>>);

impl DeniedPeers {
    /// True the first time `uid` is seen (and while the set has room).
    pub(super) fn first(&self, uid: u32) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.len() < MAX_LOGGED_PEERS && seen.insert(uid)
    }
}
