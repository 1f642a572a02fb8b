//! Any `:authority` on the plugin's Unix sockets. gRPC clients name a Unix socket's server
//! by the socket's path: current grpcio (C-core), grpc-java, grpc-swift and grpcurl (without
//! `-authority`) send it, percent-encoded (`%2Fvar%2Flib%2Fkubelet%2F…`), as `:authority`;
//! kubelet sends `localhost`. That is no valid URI authority (a `%` belongs only in the
//! userinfo), and the HTTP/2 server under tonic (the `h2` crate) resets every stream whose
//! `:authority` it cannot parse as one (`PROTOCOL_ERROR`), before the request reaches tonic,
//! with no setting to relax it. On a Unix socket the authority names nothing to route by, so
//! the plugin accepts any: [`Rewriter`] reads what the client sends before `h2` does, and a
//! request whose `:authority` would be refused reaches `h2` with `localhost`.
//!
//! Header blocks are HPACK-compressed against a table the client's encoder and the server's
//! decoder keep in step, so a block cannot be edited in place. The rewriter decodes every
//! block (so its table follows the client's) and forwards the client's bytes unchanged while
//! no authority needs changing: the server's table stays the client's. From the first block
//! that needs it on, every block of the connection is re-encoded as literals the server
//! does not index (the server's table is never touched again, so it cannot disagree with what
//! the client references). Frames other than headers pass through as they arrive, unbuffered.
//! What the rewriter cannot follow (a malformed frame sequence, a block its decoder refuses)
//! is passed on unchanged for `h2` to refuse as it would have, while nothing was re-encoded;
//! after that, it ends the connection (`h2`'s table no longer matches the client's).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client's connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types and flags (RFC 9113 §6).
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts (`SETTINGS_MAX_FRAME_SIZE`'s least value): the
/// re-encoded blocks are framed in it.
const FRAME: usize = 16_384;
/// The most one header frame, and one compressed block, may hold here. `h2` advertises
/// 16 KiB frames; kubelet's blocks are a few hundred bytes.
const MAX_BLOCK: usize = 1024 * 1024;
/// The most a decoded header list re-encoded may hold (names, values and 32 bytes each, as
/// RFC 9113 counts `SETTINGS_MAX_HEADER_LIST_SIZE`).
const MAX_LIST: usize = 1024 * 1024;
/// The dynamic table size the server lets clients use: `h2`'s, which tonic leaves at
/// HPACK's default (RFC 7541 §4.2).
const TABLE_SIZE: usize = 4096;
/// What a refused `:authority` becomes: what kubelet sends.
const LOCALHOST: &[u8] = b"localhost";

/// The client's bytes could not be followed after a block was re-encoded.
#[derive(Debug, thiserror::Error)]
#[error("HTTP/2 from the client cannot be followed after rewriting its :authority: {0}")]
pub struct RewriteError(String);

/// Where the client's byte stream is.
#[derive(Debug)]
enum Stage {
    /// In the connection preface, `n` bytes of it seen.
    Preface(usize),
    /// Between or inside frames.
    Frames,
    /// Not followed: everything goes through unchanged.
    Passthrough,
}

/// A header block being collected: its HEADERS frame's fields and its fragments.
#[derive(Debug)]
struct Block {
    stream: [u8; 4],
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragments: Vec<u8>,
    /// The frames as received, forwarded as they are when nothing needs changing.
    original: Vec<u8>,
}

/// Whether `value` parses as a URI authority (`h2`'s check, through the `http` crate).
pub fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// The client-to-server half of one connection, rewritten as the module says (pure: bytes
/// in, bytes out).
#[derive(Debug)]
pub struct Rewriter {
    stage: Stage,
    /// Received bytes not processed yet (at most a frame header, or one header frame).
    input: Vec<u8>,
    /// Payload bytes of the current non-header frame still to pass through.
    passing: usize,
    block: Option<Block>,
    decoder: Decoder,
    /// A block was re-encoded: every later one is too.
    reencoding: bool,
    rewritten: u64,
}

/// `loona_hpack::Decoder` has no `Debug`.
struct Decoder(loona_hpack::Decoder<'static>);

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Decoder")
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A connection's rewriter, before its preface.
    pub fn new() -> Rewriter {
        let mut d = loona_hpack::Decoder::new();
        d.set_max_allowed_table_size(TABLE_SIZE);
        Rewriter {
            stage: Stage::Preface(0),
            input: Vec::new(),
            passing: 0,
            block: None,
            decoder: Decoder(d),
            reencoding: false,
            rewritten: 0,
        }
    }

    /// Requests whose `:authority` was replaced so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Feeds bytes the client sent; appends what the server is to read to `out`.
    ///
    /// # Errors
    /// After a block was re-encoded, bytes that cannot be followed: the connection must end.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut data = data;
        loop {
            match self.stage {
                Stage::Passthrough => {
                    out.extend_from_slice(data);
                    return Ok(());
                }
                Stage::Preface(seen) => {
                    let n = data.len().min(PREFACE.len() - seen);
                    if data[..n] != PREFACE[seen..seen + n] {
                        // Not HTTP/2 with prior knowledge: h2 answers it. The `seen` bytes
                        // that matched went on as they came.
                        self.stage = Stage::Passthrough;
                        continue;
                    }
                    out.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    self.stage = if seen + n == PREFACE.len() {
                        Stage::Frames
                    } else {
                        Stage::Preface(seen + n)
                    };
                    if data.is_empty() {
                        return Ok(());
                    }
                }
                Stage::Frames => {
                    if self.passing > 0 {
                        let n = data.len().min(self.passing);
                        out.extend_from_slice(&data[..n]);
                        self.passing -= n;
                        data = &data[n..];
                        if data.is_empty() {
                            return Ok(());
                        }
                        continue;
                    }
                    self.input.extend_from_slice(data);
                    return self.frames(out);
                }
            }
        }
    }

    /// Processes the whole frames in `input`.
    fn frames(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut at = 0;
        let result = loop {
            let rest = &self.input[at..];
            if rest.len() < 9 {
                break Ok(());
            }
            let len =
                (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let stream = [rest[5], rest[6], rest[7], rest[8]];
            let header_frame = kind == HEADERS || kind == CONTINUATION;
            if !header_frame {
                if self.block.is_some() {
                    break self.lost("a frame inside a header block", at, out);
                }
                // Passed through as it comes, the payload unbuffered.
                out.extend_from_slice(&rest[..9]);
                let n = (rest.len() - 9).min(len);
                out.extend_from_slice(&rest[9..9 + n]);
                at += 9 + n;
                if n < len {
                    self.passing = len - n;
                    // `input` holds nothing past this frame's payload.
                    break Ok(());
                }
                continue;
            }
            if len > MAX_BLOCK {
                break self.lost("a header frame larger than 1 MiB", at, out);
            }
            if rest.len() < 9 + len {
                break Ok(());
            }
            let whole = rest[..9 + len].to_vec();
            match self.header_frame(kind, flags, stream, &whole[9..], &whole) {
                Ok(()) => {}
                Err(why) => break self.lost(why, at, out),
            }
            at += 9 + len;
            if flags & END_HEADERS != 0 {
                if let Err(e) = self.finish(out) {
                    break Err(e);
                }
                if matches!(self.stage, Stage::Passthrough) {
                    // Given up on this block: what follows it goes on unchanged too.
                    out.extend_from_slice(&self.input[at..]);
                    self.input = Vec::new();
                    break Ok(());
                }
            }
        };
        // An error ends the connection (`lost` may have emptied `input` already); only a
        // connection still followed keeps the rest for the next read.
        if result.is_ok() && matches!(self.stage, Stage::Frames) {
            self.input.drain(..at);
        }
        result
    }

    /// Adds a HEADERS or CONTINUATION frame to the block.
    fn header_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: [u8; 4],
        payload: &[u8],
        whole: &[u8],
    ) -> Result<(), &'static str> {
        let fragment = if kind == HEADERS {
            if self.block.is_some() {
                return Err("HEADERS inside a header block");
            }
            let mut p = payload;
            let mut pad = 0;
            if flags & PADDED != 0 {
                let (&n, r) = p.split_first().ok_or("HEADERS without its pad length")?;
                pad = usize::from(n);
                p = r;
            }
            let mut priority = None;
            if flags & PRIORITY != 0 {
                if p.len() < 5 {
                    return Err("HEADERS without its priority");
                }
                let mut pr = [0u8; 5];
                pr.copy_from_slice(&p[..5]);
                priority = Some(pr);
                p = &p[5..];
            }
            if pad > p.len() {
                return Err("HEADERS padding longer than the frame");
            }
            self.block = Some(Block {
                stream,
                end_stream: flags & END_STREAM != 0,
                priority,
                fragments: Vec::new(),
                original: Vec::new(),
            });
            &p[..p.len() - pad]
        } else {
            match &self.block {
                Some(b) if b.stream == stream => payload,
                _ => return Err("CONTINUATION outside its header block"),
            }
        };
        let Some(b) = self.block.as_mut() else {
            return Err("no header block");
        };
        if b.fragments.len() + fragment.len() > MAX_BLOCK {
            return Err("a header block larger than 1 MiB");
        }
        b.fragments.extend_from_slice(fragment);
        b.original.extend_from_slice(whole);
        Ok(())
    }

    /// Decodes the finished block and forwards it: as received, or re-encoded.
    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let Some(b) = self.block.take() else {
            return Ok(());
        };
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let (mut size, mut refused) = (0usize, false);
        let decoded = self.decoder.0.decode_with_cb(&b.fragments, |name, value| {
            if &*name == b":authority" && !is_valid_authority(&value) {
                refused = true;
            }
            size = size.saturating_add(name.len() + value.len() + 32);
            if size <= MAX_LIST {
                fields.push((name.into_owned(), value.into_owned()));
            }
        });
        if let Err(e) = decoded {
            // The client's table is lost to us: h2 refuses the block as it would have.
            out.extend_from_slice(&b.original);
            return self.give_up(&format!("its header block does not decode: {e:?}"));
        }
        if !refused && !self.reencoding {
            out.extend_from_slice(&b.original);
            return Ok(());
        }
        if size > MAX_LIST {
            return Err(RewriteError(format!(
                "a header list of {size} bytes (at most {MAX_LIST} are re-encoded)"
            )));
        }
        if refused {
            self.rewritten += 1;
        }
        self.reencoding = true;
        let mut block = Vec::new();
        for (name, value) in &fields {
            let value: &[u8] = if name == b":authority" && !is_valid_authority(value) {
                LOCALHOST
            } else {
                value
            };
            // Literal without indexing, new name (RFC 7541 §6.2.2): the server's table is
            // left as it is.
            block.push(0);
            string(name, &mut block);
            string(value, &mut block);
        }
        write_block(&b, &block, out);
        Ok(())
    }

    /// The frames cannot be followed from `input[at..]` on (`why`): before anything was
    /// re-encoded, they go on unchanged (with a block in progress) for h2 to judge.
    fn lost(&mut self, why: &str, at: usize, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        if let Some(b) = self.block.take() {
            out.extend_from_slice(&b.original);
        }
        out.extend_from_slice(&self.input[at..]);
        self.input = Vec::new();
        self.give_up(why)
    }

    fn give_up(&mut self, why: &str) -> Result<(), RewriteError> {
        if self.reencoding {
            return Err(RewriteError(why.to_string()));
        }
        tracing::debug!(reason = why, "not following this HTTP/2 connection further");
        self.stage = Stage::Passthrough;
        Ok(())
    }
}

/// An HPACK string literal, not Huffman-coded (RFC 7541 §5.2).
fn string(s: &[u8], out: &mut Vec<u8>) {
    integer(0, 7, s.len(), out);
    out.extend_from_slice(s);
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1).
fn integer(flags: u8, n: u32, mut v: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// `block` as `b`'s stream's HEADERS frame (its END_STREAM and priority kept, no padding)
/// and CONTINUATION frames, each at most [`FRAME`] bytes.
fn write_block(b: &Block, block: &[u8], out: &mut Vec<u8>) {
    let mut first = Vec::new();
    let mut flags = 0;
    if b.end_stream {
        flags |= END_STREAM;
    }
    if let Some(p) = b.priority {
        flags |= PRIORITY;
        first.extend_from_slice(&p);
    }
    let room = FRAME - first.len();
    let (head, mut rest) = block.split_at(block.len().min(room));
    first.extend_from_slice(head);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    frame(HEADERS, flags, b.stream, &first, out);
    while !rest.is_empty() {
        let (chunk, more) = rest.split_at(rest.len().min(FRAME));
        let flags = if more.is_empty() { END_HEADERS } else { 0 };
        frame(CONTINUATION, flags, b.stream, chunk, out);
        rest = more;
    }
}

fn frame(kind: u8, flags: u8, stream: [u8; 4], payload: &[u8], out: &mut Vec<u8>) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream);
    out.extend_from_slice(payload);
}

/// A connection whose reads go through a [`Rewriter`]; writes (the server's answers) pass
/// untouched.
#[derive(Debug)]
pub struct AnyAuthority<IO> {
    inner: IO,
    rewriter: Rewriter,
    /// Rewritten bytes not read yet.
    out: VecDeque<u8>,
    scratch: Vec<u8>,
}

impl<IO> AnyAuthority<IO> {
    /// Wraps an accepted connection.
    pub fn new(inner: IO) -> AnyAuthority<IO> {
        AnyAuthority {
            inner,
            rewriter: Rewriter::new(),
            out: VecDeque::new(),
            scratch: vec![0; FRAME],
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AnyAuthority<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.out.is_empty() {
                let (a, b) = this.out.as_slices();
                let chunk = if a.is_empty() { b } else { a };
                let n = chunk.len().min(buf.remaining());
                buf.put_slice(&chunk[..n]);
                this.out.drain(..n);
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {}
            }
            let got = rb.filled();
            if got.is_empty() {
                return Poll::Ready(Ok(())); // end of stream
            }
            let before = this.rewriter.rewritten();
            let mut produced = Vec::new();
            this.rewriter
                .feed(got, &mut produced)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if this.rewriter.rewritten() > before {
                tracing::debug!(
                    rewritten = this.rewriter.rewritten(),
                    "a request's :authority is no URI authority (a socket path?): serving it as localhost"
                );
            }
            this.out.extend(produced);
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AnyAuthority<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for AnyAuthority<tokio::net::UnixStream> {
    type ConnectInfo = tonic::transport::server::UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &[u8] = b"%2Fvar%2Flib%2Fkubelet%2Fplugins%2Fgpu.nvidia.com%2Fdra.sock";

    fn f(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        frame(kind, flags, stream.to_be_bytes(), payload, &mut out);
        out
    }

    /// A request block: `:authority` as a literal the table keeps (62 from then on), or by
    /// index.
    fn block(authority: Option<&[u8]>, index: Option<usize>) -> Vec<u8> {
        let mut b = vec![0x83, 0x86]; // :method POST, :scheme http
        integer(0, 4, 4, &mut b);
        string(b"/pluginregistration.Registration/GetInfo", &mut b);
        if let Some(a) = authority {
            integer(0x40, 6, 1, &mut b);
            string(a, &mut b);
        }
        if let Some(i) = index {
            integer(0x80, 7, i, &mut b);
        }
        b
    }

    fn data(stream: u32) -> Vec<u8> {
        f(0x0, END_STREAM, stream, &[0, 0, 0, 0, 0])
    }

    /// What the server (h2) decodes from `wire`: each block's fields, in order.
    fn server_view(wire: &[u8]) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
        assert!(wire.starts_with(PREFACE));
        let mut d = loona_hpack::Decoder::new();
        let (mut at, mut blocks, mut pending) = (PREFACE.len(), Vec::new(), Vec::new());
        while at < wire.len() {
            let len = (usize::from(wire[at]) << 16)
                | (usize::from(wire[at + 1]) << 8)
                | usize::from(wire[at + 2]);
            let (kind, flags) = (wire[at + 3], wire[at + 4]);
            let mut p = &wire[at + 9..at + 9 + len];
            if kind == HEADERS || kind == CONTINUATION {
                if kind == HEADERS && flags & PADDED != 0 {
                    let pad = usize::from(p[0]);
                    p = &p[1..p.len() - pad];
                }
                if kind == HEADERS && flags & PRIORITY != 0 {
                    p = &p[5..];
                }
                pending.extend_from_slice(p);
                if flags & END_HEADERS != 0 {
                    blocks.push(d.decode(&pending).expect("the server decodes it"));
                    pending.clear();
                }
            }
            at += 9 + len;
        }
        blocks
    }

    fn authority_of(fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        fields
            .iter()
            .find(|(n, _)| n == b":authority")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    fn feed_all(r: &mut Rewriter, wire: &[u8], step: usize) -> Result<Vec<u8>, RewriteError> {
        let mut out = Vec::new();
        for c in wire.chunks(step) {
            r.feed(c, &mut out)?;
        }
        Ok(out)
    }

    fn connection(blocks: &[Vec<u8>]) -> Vec<u8> {
        let mut wire = PREFACE.to_vec();
        wire.extend(f(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
        for (i, b) in blocks.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            wire.extend(f(HEADERS, END_HEADERS, stream, b));
            wire.extend(data(stream));
        }
        wire
    }

    #[test]
    fn valid_authorities_pass_byte_for_byte() {
        let wire = connection(&[block(Some(b"localhost"), None), block(None, Some(62))]);
        for step in [1, 7, wire.len()] {
            let mut r = Rewriter::new();
            assert_eq!(feed_all(&mut r, &wire, step).unwrap(), wire, "step {step}");
            assert_eq!(r.rewritten(), 0);
        }
    }

    #[test]
    fn a_path_authority_becomes_localhost_and_the_tables_stay_in_step() {
        // Literal (indexed as 62), by index, a valid one, by index again.
        let wire = connection(&[
            block(Some(PATH), None),
            block(None, Some(62)),
            block(Some(b"localhost"), None),
            block(None, Some(63)),
        ]);
        let mut outs = Vec::new();
        for step in [1, 5, 4096] {
            let mut r = Rewriter::new();
            outs.push(feed_all(&mut r, &wire, step).unwrap());
            assert_eq!(r.rewritten(), 3, "step {step}");
        }
        assert!(
            outs.windows(2).all(|w| w[0] == w[1]),
            "same bytes however split"
        );
        let view = server_view(&outs[0]);
        assert_eq!(view.len(), 4);
        for fields in &view {
            assert_eq!(authority_of(fields), b"localhost");
            assert_eq!(fields[2].1, b"/pluginregistration.Registration/GetInfo");
        }
        // DATA frames pass unchanged, in order.
        assert_eq!(
            outs[0]
                .windows(data(7).len())
                .filter(|w| *w == data(7))
                .count(),
            1
        );
    }

    #[test]
    fn flags_priority_and_continuation_survive_and_big_blocks_are_framed() {
        let mut b = block(Some(PATH), None);
        // A header large enough to need CONTINUATION frames once re-encoded.
        b.push(0);
        string(b"x-big", &mut b);
        string(&vec![b'v'; 40_000], &mut b);
        let mut first = vec![2u8, 0, 0, 0, 0, 9];
        first.extend_from_slice(&b[..10]);
        first.extend_from_slice(&[0, 0]);
        let mut wire = PREFACE.to_vec();
        wire.extend(f(HEADERS, END_STREAM | PADDED | PRIORITY, 1, &first));
        let rest: Vec<&[u8]> = b[10..].chunks(9000).collect();
        for (i, c) in rest.iter().enumerate() {
            let flags = if i + 1 == rest.len() { END_HEADERS } else { 0 };
            wire.extend(f(CONTINUATION, flags, 1, c));
        }
        let mut r = Rewriter::new();
        let out = feed_all(&mut r, &wire, 1000).unwrap();
        let view = server_view(&out);
        assert_eq!(authority_of(&view[0]), b"localhost");
        assert_eq!(view[0].last().unwrap().1.len(), 40_000);
        // HEADERS keeps END_STREAM and its priority; every frame fits 16 KiB.
        let at = PREFACE.len();
        assert_eq!(out[at + 4] & (END_STREAM | PRIORITY), END_STREAM | PRIORITY);
        assert_eq!(&out[at + 9..at + 14], &[0, 0, 0, 0, 9]);
        let mut at = PREFACE.len();
        let mut frames = 0;
        while at < out.len() {
            let len = (usize::from(out[at]) << 16)
                | (usize::from(out[at + 1]) << 8)
                | usize::from(out[at + 2]);
            assert!(len <= FRAME);
            at += 9 + len;
            frames += 1;
        }
        assert!(frames >= 3, "{frames}");
    }

    #[test]
    fn what_cannot_be_followed_goes_to_h2_unchanged_until_a_rewrite_then_ends() {
        // Not HTTP/2: passed on for h2 to refuse.
        let mut r = Rewriter::new();
        let junk = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        assert_eq!(feed_all(&mut r, &junk, 3).unwrap(), junk);
        // A CONTINUATION out of place, before any rewrite: unchanged, and from then on.
        let mut wire = connection(&[block(Some(b"localhost"), None)]);
        wire.extend(f(CONTINUATION, END_HEADERS, 3, &block(Some(PATH), None)));
        wire.extend(connection(&[block(Some(PATH), None)])[PREFACE.len()..].to_vec());
        let mut r = Rewriter::new();
        assert_eq!(feed_all(&mut r, &wire, 11).unwrap(), wire);
        // A block the decoder refuses (an index past the table), likewise.
        let wire = connection(&[block(None, Some(70)), block(Some(PATH), None)]);
        let mut r = Rewriter::new();
        assert_eq!(feed_all(&mut r, &wire, 11).unwrap(), wire);
        // After a rewrite the server's table is no longer the client's: the connection ends.
        let wire = connection(&[block(Some(PATH), None), block(None, Some(70))]);
        let mut r = Rewriter::new();
        let e = feed_all(&mut r, &wire, 11).unwrap_err();
        assert!(e.to_string().contains("does not decode"), "{e}");
    }

    #[test]
    fn a_frame_then_one_that_cannot_be_followed_in_one_read_after_a_rewrite_ends_without_a_panic() {
        // After a rewrite, one read holding a whole frame and then a frame inside a header
        // block that is never ended (DATA amid HEADERS/CONTINUATION): an error, not a panic.
        let mut wire = connection(&[block(Some(PATH), None)]);
        let mut tail = data(3);
        tail.extend(f(HEADERS, 0, 5, &block(Some(PATH), None)));
        tail.extend(data(5));
        let mut r = Rewriter::new();
        let mut out = Vec::new();
        r.feed(&wire, &mut out).unwrap();
        let e = r.feed(&tail, &mut out).unwrap_err();
        assert!(e.to_string().contains("inside a header block"), "{e}");
        wire.extend(tail);
        let mut r = Rewriter::new();
        assert!(feed_all(&mut r, &wire, wire.len()).is_err());
    }

    #[test]
    fn a_split_preface_that_turns_out_not_http2_passes_once_unchanged() {
        // A client whose first bytes match the preface's start, in several reads, then
        // differ: h2 must see exactly what the client sent, each byte once.
        let junk = b"PRI * HTTP/1.1\r\n\r\n".to_vec();
        for step in [1, 3, 5] {
            let mut r = Rewriter::new();
            assert_eq!(feed_all(&mut r, &junk, step).unwrap(), junk, "step {step}");
        }
    }

    #[test]
    fn authorities_are_judged_as_h2_judges_them() {
        assert!(is_valid_authority(b"localhost"));
        assert!(is_valid_authority(b"127.0.0.1:9000"));
        assert!(!is_valid_authority(PATH));
        assert!(!is_valid_authority(b"/var/lib/kubelet/plugins/x.sock"));
    }
}
