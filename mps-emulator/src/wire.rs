//! Framing between the UI and the daemon over the pipe directory's `SOCK_SEQPACKET` sockets.
//!
//! The UI copy may run inside a container that only sees the bind-mounted pipe directory,
//! so the Unix socket is the whole transport. SEQPACKET keeps message boundaries, so each
//! message is one frame: a type byte followed by its payload.
//!
//! | type | name | direction | payload |
//! |---|---|---|---|
//! | 1 | hello | daemon → UI, once after accept | protocol name, [`HELLO`] |
//! | 2 | command | UI → daemon | one command line as read, without its newline |
//! | 3 | output | daemon → UI | one line of output; the UI adds the newline |
//! | 4 | exit | daemon → UI, last | exit status for the UI, `i32` little-endian |
//!
//! Type bytes are control characters so that text from a foreign peer (NVIDIA's daemon
//! greets with `OUTBHELL`) never decodes. The UI ends its input with `shutdown(SHUT_WR)`;
//! the daemon answers with an exit frame and closes.

use std::os::fd::{AsFd, AsRawFd};

use nix::sys::socket::{recv, send, MsgFlags};

/// Protocol name carried by the hello frame, to reject foreign daemons on the socket.
pub const HELLO: &[u8] = b"gpushare-mps-control/1";

/// Largest frame either side sends or accepts; longer command lines are cut to fit.
pub const MAX_FRAME: usize = 64 * 1024;

const TAG_HELLO: u8 = 1;
const TAG_COMMAND: u8 = 2;
const TAG_OUTPUT: u8 = 3;
const TAG_EXIT: u8 = 4;

/// One decoded message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Daemon greeting, sent once the connection is accepted.
    Hello,
    /// A command line from the UI.
    Command(Vec<u8>),
    /// A line of output for the UI's stdout.
    Output(Vec<u8>),
    /// End of the session with the UI's exit status.
    Exit(i32),
}

impl Frame {
    /// Serialises the frame; payloads longer than [`MAX_FRAME`] − 1 bytes are truncated.
    pub fn encode(&self) -> Vec<u8> {
        let (tag, payload): (u8, &[u8]) = match self {
            Frame::Hello => (TAG_HELLO, HELLO),
            Frame::Command(line) => (TAG_COMMAND, line),
            Frame::Output(text) => (TAG_OUTPUT, text),
            Frame::Exit(status) => return [&[TAG_EXIT][..], &status.to_le_bytes()].concat(),
        };
        let mut bytes = Vec::with_capacity(1 + payload.len().min(MAX_FRAME - 1));
        bytes.push(tag);
        bytes.extend_from_slice(&payload[..payload.len().min(MAX_FRAME - 1)]);
        bytes
    }

    /// Parses one received message; `None` for anything this protocol does not define.
    pub fn decode(bytes: &[u8]) -> Option<Frame> {
        let (&tag, payload) = bytes.split_first()?;
        match tag {
            TAG_HELLO if payload == HELLO => Some(Frame::Hello),
            TAG_COMMAND => Some(Frame::Command(payload.to_vec())),
            TAG_OUTPUT => Some(Frame::Output(payload.to_vec())),
            TAG_EXIT => Some(Frame::Exit(i32::from_le_bytes(payload.try_into().ok()?))),
            _ => None,
        }
    }
}

/// Result of reading one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A well-formed frame.
    Frame(Frame),
    /// The peer closed or shut down its side.
    Eof,
    /// A message this protocol does not define (e.g. NVIDIA's own daemon on the socket).
    Garbage,
}

/// Sends one frame; `MSG_NOSIGNAL` so a vanished peer is an error, not a SIGPIPE.
pub fn send_frame(fd: impl AsFd, frame: &Frame, extra: MsgFlags) -> nix::Result<()> {
    let bytes = frame.encode();
    let sent = send(
        fd.as_fd().as_raw_fd(),
        &bytes,
        MsgFlags::MSG_NOSIGNAL | extra,
    )?;
    if sent == bytes.len() {
        Ok(())
    } else {
        // SEQPACKET sends whole messages or fail; a short count means a broken socket.
        Err(nix::errno::Errno::EMSGSIZE)
    }
}

/// Receives one message (blocking unless the socket is non-blocking).
pub fn recv_frame(fd: impl AsFd) -> nix::Result<Received> {
    let mut buf = vec![0u8; MAX_FRAME];
    let n = recv(fd.as_fd().as_raw_fd(), &mut buf, MsgFlags::empty())?;
    if n == 0 {
        return Ok(Received::Eof);
    }
    Ok(match Frame::decode(&buf[..n]) {
        Some(frame) => Received::Frame(frame),
        None => Received::Garbage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for frame in [
            Frame::Hello,
            Frame::Command(b"get_server_list".to_vec()),
            Frame::Command(Vec::new()),
            Frame::Output(b"100.0".to_vec()),
            Frame::Output(Vec::new()),
            Frame::Exit(0),
            Frame::Exit(1),
            Frame::Exit(-7),
        ] {
            assert_eq!(Frame::decode(&frame.encode()), Some(frame.clone()));
        }
    }

    #[test]
    fn rejects_foreign_messages() {
        // NVIDIA's daemon greets with "OUTBHELL\0".
        assert_eq!(Frame::decode(b"OUTBHELL\0"), None);
        assert_eq!(Frame::decode(b""), None);
        assert_eq!(Frame::decode(b"\x01nope"), None);
        assert_eq!(Frame::decode(b"\x04\x01"), None);
    }

    #[test]
    fn long_lines_are_cut_to_one_frame() {
        let frame = Frame::Command(vec![b'a'; MAX_FRAME * 2]);
        assert_eq!(frame.encode().len(), MAX_FRAME);
    }

    #[test]
    fn over_a_socketpair() {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        send_frame(&a, &Frame::Command(b"ps".to_vec()), MsgFlags::empty()).unwrap();
        send_frame(&a, &Frame::Exit(3), MsgFlags::empty()).unwrap();
        assert_eq!(
            recv_frame(&b).unwrap(),
            Received::Frame(Frame::Command(b"ps".to_vec()))
        );
        assert_eq!(recv_frame(&b).unwrap(), Received::Frame(Frame::Exit(3)));
        nix::sys::socket::shutdown(a.as_raw_fd(), nix::sys::socket::Shutdown::Write).unwrap();
        assert_eq!(recv_frame(&b).unwrap(), Received::Eof);
    }
}
