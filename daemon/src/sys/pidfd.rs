//! Waiting for other processes to exit without polling: Linux pidfds (`pidfd_open(2)`, Linux
//! 5.3+), which become readable when their process exits, whoever its parent is.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A file descriptor referring to one process (not to its pid, which may be reused).
#[derive(Debug)]
pub struct PidFd(OwnedFd);

impl PidFd {
    /// Opens a pidfd for `pid`.
    ///
    /// # Errors
    /// `ESRCH` when no such process exists; `ENOSYS` before Linux 5.3.
    pub fn open(pid: i32) -> io::Result<PidFd> {
        if pid <= 0 {
            return Err(io::Error::from_raw_os_error(libc::ESRCH));
        }
        // SAFETY: pidfd_open takes a pid and flags by value and returns a new descriptor or
        // -1; no memory is shared with the kernel.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = RawFd::try_from(fd).map_err(io::Error::other)?;
        // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
        Ok(PidFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl From<PidFd> for OwnedFd {
    fn from(p: PidFd) -> OwnedFd {
        p.0
    }
}

/// Whether `fd` is readable now (for a pidfd: its process exited), without waiting.
pub fn readable_now(fd: RawFd) -> bool {
    let mut poll = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `poll` is one valid pollfd, exclusively borrowed for the call; timeout 0 never
    // blocks.
    let rc = unsafe { libc::poll(&mut poll, 1, 0) };
    rc > 0 && poll.revents != 0
}

impl AsRawFd for PidFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Blocks until one of `fds` is readable (for a pidfd: its process exited) or `timeout`
/// passes (`None`: no limit). Returns the indices of the readable ones; empty on timeout or
/// when a signal interrupted the wait.
///
/// # Errors
/// `poll(2)` failed for another reason.
pub fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<Vec<usize>> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| {
        libc::c_int::try_from(t.as_millis().max(1)).unwrap_or(libc::c_int::MAX)
    });
    let nfds = libc::nfds_t::try_from(polls.len()).map_err(io::Error::other)?;
    // SAFETY: `polls` is a valid, exclusively borrowed array of `nfds` pollfd structs that
    // outlives the call.
    let rc = unsafe { libc::poll(polls.as_mut_ptr(), nfds, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(Vec::new())
        } else {
            Err(e)
        };
    }
    Ok(polls
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents != 0)
        .map(|(i, _)| i)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_pidfd_becomes_readable_when_its_process_exits() {
        let mut child = Command::new("/bin/sh")
            .args(["-c", "read x"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let fd = PidFd::open(child.id() as i32).unwrap();
        assert!(
            wait_readable(&[fd.as_raw_fd()], Some(Duration::from_millis(50)))
                .unwrap()
                .is_empty()
        );
        drop(child.stdin.take());
        // No time bound asserted: the wait returns because the process exited.
        assert_eq!(wait_readable(&[fd.as_raw_fd()], None).unwrap(), vec![0]);
        child.wait().unwrap();
        assert_eq!(
            PidFd::open(i32::MAX).unwrap_err().raw_os_error(),
            Some(libc::ESRCH)
        );
    }
}
