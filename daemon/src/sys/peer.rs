//! The supplementary groups of a Unix socket's peer, as the kernel recorded them at connect.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Most groups asked for at first; a peer with more (Linux allows 65536) gets a second call
/// with the size the kernel reports.
const FIRST_GUESS: usize = 64;

/// The peer's supplementary gids from `SO_PEERGROUPS` (Linux 4.13+). Unlike reading
/// `/proc/<pid>/status`, these are the groups the peer had when it connected, so a pid reused
/// since cannot lend its groups to it.
///
/// # Errors
/// `getsockopt` failed: `ENOPROTOOPT` on kernels before 4.13, or the socket is not a
/// connected Unix socket.
pub fn peer_groups(socket: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; FIRST_GUESS];
    for _ in 0..2 {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is a live, writable buffer of `len` bytes; the kernel writes at most
        // `len` bytes into it and sets `len` to the bytes written (or needed, with ERANGE).
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(count);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ERANGE) || count <= groups.len() {
            return Err(err);
        }
        groups.resize(count, 0);
    }
    Err(io::Error::other(
        "SO_PEERGROUPS: the peer's group list kept growing",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_socketpair_peer_has_our_groups() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut got = peer_groups(a.as_fd()).unwrap();
        let mut ours: Vec<u32> = nix::unistd::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        got.sort_unstable();
        ours.sort_unstable();
        assert_eq!(got, ours);
    }
}
