//! The front end: `gpushare-mps-control` with no option.
//!
//! Connects to the daemon of `CUDA_MPS_PIPE_DIRECTORY` (root uses `control_privileged`,
//! others `control`, as NVIDIA's UI does), sends each stdin line as it arrives and prints
//! the replies. Lines are pipelined rather than sent one by one after each answer: when a
//! script pipes several commands, the daemon sees them back to back exactly as NVIDIA's
//! does, which matters for when it notices a simulated server's exit.

use std::collections::VecDeque;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    connect, shutdown, socket, AddressFamily, MsgFlags, Shutdown, SockFlag, SockType, UnixAddr,
};

use crate::cli::Dirs;
use crate::wire::{recv_frame, send_frame, Frame, Received};

const NO_DAEMON: &str = "Cannot find MPS control daemon process";
const NO_HANDSHAKE: &str = "Cannot authenticate or connect to MPS control daemon process";
const LOST: &str = "Cannot send command to MPS control daemon process";

/// Lines read ahead of what the daemon has taken; bounds memory for huge inputs.
const MAX_QUEUED: usize = 256;

/// How long to wait for the daemon to close the connection after its final status.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Runs the front end and returns the process exit status.
pub fn run(dirs: &Dirs) -> i32 {
    let name = if nix::unistd::geteuid().is_root() {
        "control_privileged"
    } else {
        "control"
    };
    let sock = match connect_seqpacket(&dirs.in_pipe(name)) {
        Ok(sock) => sock,
        Err(_) => return fail(NO_DAEMON),
    };
    match recv_frame(&sock) {
        Ok(Received::Frame(Frame::Hello)) => {}
        _ => return fail(NO_HANDSHAKE),
    }
    let stdin = std::io::stdin();
    match Session::new(sock.as_fd(), stdin.as_fd()).run() {
        Some(status) => status,
        None => fail(LOST),
    }
}

fn fail(message: &str) -> i32 {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{message}");
    1
}

/// Connects a `SOCK_SEQPACKET` socket to `path`.
pub fn connect_seqpacket(path: &std::path::Path) -> nix::Result<OwnedFd> {
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    connect(sock.as_raw_fd(), &addr)?;
    Ok(sock)
}

/// Splits complete lines off `buf`, leaving an unterminated tail in place.
fn take_lines(buf: &mut Vec<u8>, out: &mut VecDeque<Vec<u8>>) {
    while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
        let rest = buf.split_off(pos + 1);
        let mut line = std::mem::replace(buf, rest);
        line.pop();
        out.push_back(line);
    }
}

struct Session<'a> {
    sock: BorrowedFd<'a>,
    stdin: BorrowedFd<'a>,
    partial: Vec<u8>,
    queue: VecDeque<Vec<u8>>,
    stdin_open: bool,
    write_shut: bool,
    status: Option<i32>,
    resets: u32,
}

impl<'a> Session<'a> {
    fn new(sock: BorrowedFd<'a>, stdin: BorrowedFd<'a>) -> Self {
        Session {
            sock,
            stdin,
            partial: Vec::new(),
            queue: VecDeque::new(),
            stdin_open: true,
            write_shut: false,
            status: None,
            resets: 0,
        }
    }

    /// Pumps stdin to the daemon and replies to stdout until the daemon closes.
    /// Returns the status the daemon sent, `None` if it vanished without one.
    fn run(mut self) -> Option<i32> {
        loop {
            if !self.stdin_open && self.queue.is_empty() && !self.write_shut {
                // End of input: the daemon logs "UI closed" and answers with a status.
                let _ = shutdown(self.sock.as_raw_fd(), Shutdown::Write);
                self.write_shut = true;
            }
            let mut sock_events = PollFlags::POLLIN;
            if !self.queue.is_empty() && !self.write_shut {
                sock_events |= PollFlags::POLLOUT;
            }
            let read_stdin = self.stdin_open && self.queue.len() < MAX_QUEUED;
            let mut fds = vec![PollFd::new(self.sock, sock_events)];
            if read_stdin {
                fds.push(PollFd::new(self.stdin, PollFlags::POLLIN));
            }
            let timeout = if self.status.is_some() {
                // The status came; the daemon only has to close. Do not hang if it does not.
                PollTimeout::try_from(CLOSE_GRACE).unwrap_or(PollTimeout::NONE)
            } else {
                PollTimeout::NONE
            };
            match poll(&mut fds, timeout) {
                Ok(0) => return self.status,
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => return self.status,
            }
            let sock_ready = fds[0].revents().unwrap_or(PollFlags::empty());
            let stdin_ready = fds
                .get(1)
                .and_then(|fd| fd.revents())
                .unwrap_or(PollFlags::empty());
            if !stdin_ready.is_empty() {
                self.read_stdin();
            }
            if sock_ready.contains(PollFlags::POLLOUT) {
                self.send_queued();
            }
            if sock_ready.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
                && self.receive()
            {
                return self.status;
            }
        }
    }

    fn read_stdin(&mut self) {
        let mut buf = [0u8; 16 * 1024];
        match nix::unistd::read(self.stdin.as_raw_fd(), &mut buf) {
            Ok(0) => self.end_of_input(),
            Ok(n) => {
                self.partial.extend_from_slice(&buf[..n]);
                take_lines(&mut self.partial, &mut self.queue);
            }
            Err(Errno::EINTR | Errno::EAGAIN) => {}
            // An unreadable stdin ends the input like EOF would.
            Err(_) => self.end_of_input(),
        }
    }

    fn end_of_input(&mut self) {
        // A final line without a newline still counts as a command.
        if !self.partial.is_empty() {
            self.queue.push_back(std::mem::take(&mut self.partial));
        }
        self.stdin_open = false;
    }

    fn send_queued(&mut self) {
        while let Some(line) = self.queue.front() {
            match send_frame(
                self.sock,
                &Frame::Command(line.clone()),
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(()) => {
                    self.queue.pop_front();
                }
                Err(Errno::EAGAIN | Errno::EINTR) => return,
                Err(_) => {
                    // The daemon stopped listening (e.g. after `quit`); keep reading its
                    // last answers and drop the rest of the input, as NVIDIA's UI does.
                    self.queue.clear();
                    self.stdin_open = false;
                    self.write_shut = true;
                    return;
                }
            }
        }
    }

    /// Handles one message from the daemon; true once the connection is over.
    fn receive(&mut self) -> bool {
        match recv_frame(self.sock) {
            Ok(Received::Frame(Frame::Output(text))) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&text);
                let _ = out.write_all(b"\n");
                let _ = out.flush();
                false
            }
            Ok(Received::Frame(Frame::Exit(status))) => {
                self.status = Some(status);
                // Nothing more will be read; stop feeding commands.
                self.queue.clear();
                self.stdin_open = false;
                self.write_shut = true;
                false
            }
            Ok(Received::Frame(_) | Received::Garbage) => false,
            Err(Errno::EINTR | Errno::EAGAIN) => false,
            // Linux reports ECONNRESET once when the daemon closed with input of ours still
            // unread (lines after `quit`); its last frames are still queued behind it.
            Err(Errno::ECONNRESET) if self.resets < 3 => {
                self.resets += 1;
                false
            }
            Ok(Received::Eof) | Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_tail_kept() {
        let mut buf = b"a\n\nb c\npartial".to_vec();
        let mut out = VecDeque::new();
        take_lines(&mut buf, &mut out);
        assert_eq!(
            out,
            VecDeque::from(vec![b"a".to_vec(), Vec::new(), b"b c".to_vec()])
        );
        assert_eq!(buf, b"partial");
        buf.extend_from_slice(b" end\n");
        take_lines(&mut buf, &mut out);
        assert_eq!(out.back(), Some(&b"partial end".to_vec()));
        assert!(buf.is_empty());
    }

    #[test]
    fn session_over_socketpair() {
        use nix::sys::socket::socketpair;
        let (ui, daemon) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (input_r, input_w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&input_w, b"one\n  two  \nthree").unwrap();
        drop(input_w);
        let fake_daemon = std::thread::spawn(move || {
            let mut got = Vec::new();
            loop {
                match recv_frame(&daemon).unwrap() {
                    Received::Frame(Frame::Command(line)) => got.push(line),
                    Received::Eof => break,
                    other => panic!("{other:?}"),
                }
            }
            send_frame(&daemon, &Frame::Exit(0), MsgFlags::empty()).unwrap();
            got
        });
        let status = Session::new(ui.as_fd(), input_r.as_fd()).run();
        assert_eq!(status, Some(0));
        assert_eq!(
            fake_daemon.join().unwrap(),
            vec![b"one".to_vec(), b"  two  ".to_vec(), b"three".to_vec()]
        );
    }
}
