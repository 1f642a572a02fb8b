//! gRPC clients other than kubelet over the plugin's Unix sockets: current grpcio (C-core),
//! grpc-java, grpc-swift and grpcurl send the socket's path, percent-encoded, as
//! `:authority`, which is no valid URI authority. The plugin answers them as it answers
//! kubelet (`localhost`). The client here writes HTTP/2 frames and HPACK by hand, because no
//! HTTP library lets a request carry such an authority: literal and indexed from the dynamic
//! table, raw and Huffman-coded, in one HEADERS frame or split over CONTINUATION frames, with
//! padding and priority.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use gpushare_dra::grpc::registration::PluginInfo;
use gpushare_dra::grpc::v1::NodePrepareResourcesResponse;
use prost::Message;
use support::apiserver::ApiServer;
use support::*;

/// What the operators' tools send for `unix:///var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock`.
const ENCODED_PATH: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins%2Fgpu.nvidia.com%2Fdra.sock";

const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// An HPACK integer with an `n`-bit prefix under `flags` (RFC 7541 §5.1).
fn int(flags: u8, n: u32, mut v: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128 + 128) as u8);
        v /= 128;
    }
    out.push(v as u8);
}

/// An HPACK string literal, raw.
fn raw(s: &[u8], out: &mut Vec<u8>) {
    int(0, 7, s.len(), out);
    out.extend_from_slice(s);
}

/// Huffman codes (RFC 7541 Appendix B) of the symbols `alphabet` holds, found by asking
/// the HPACK decoder which bit strings decode to them: the shortest `code` for which
/// `code code` (padded with ones) decodes to the symbol twice.
fn huffman_codes(alphabet: &[u8]) -> std::collections::BTreeMap<u8, (u32, u32)> {
    let mut decoder = loona_hpack::huffman::HuffmanDecoder::new();
    let mut decode = |bits: u64, len: u32| -> Option<Vec<u8>> {
        let pad = (8 - len % 8) % 8;
        let all = (bits << pad) | ((1u64 << pad) - 1);
        let bytes = (len + pad) / 8;
        let buf: Vec<u8> = (0..bytes).rev().map(|i| (all >> (8 * i)) as u8).collect();
        decoder.decode(&buf).ok()
    };
    let mut distinct = alphabet.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    distinct
        .iter()
        .map(|&c| {
            let code = (5..=13u32)
                .flat_map(|len| (0..1u32 << len).map(move |v| (v, len)))
                .find(|&(v, len)| {
                    let twice = (u64::from(v) << len) | u64::from(v);
                    decode(twice, 2 * len).as_deref() == Some(&[c, c])
                })
                .unwrap_or_else(|| panic!("no code for {c:?}"));
            (c, code)
        })
        .collect()
}

/// An HPACK string literal, Huffman-coded.
fn huffman(s: &[u8], out: &mut Vec<u8>) {
    let codes = huffman_codes(s);
    let (mut acc, mut n, mut bytes) = (0u64, 0u32, Vec::new());
    for c in s {
        let (code, len) = codes[c];
        acc = (acc << len) | u64::from(code);
        n += len;
        while n >= 8 {
            bytes.push((acc >> (n - 8)) as u8);
            n -= 8;
        }
    }
    if n > 0 {
        bytes.push(((acc << (8 - n)) as u8) | ((1u8 << (8 - n)) - 1));
    }
    int(0x80, 7, bytes.len(), out);
    out.extend_from_slice(&bytes);
}

#[derive(Debug, Clone, Copy)]
enum Authority<'a> {
    /// Literal with incremental indexing, indexed name (`:authority`, static 1), raw value.
    IndexedRaw(&'a str),
    /// Literal without indexing, Huffman-coded value.
    Huffman(&'a str),
    /// The whole field from the dynamic table.
    FromTable(usize),
}

/// A gRPC request's header block for `path`.
fn request_block(path: &str, authority: Authority<'_>) -> Vec<u8> {
    let mut b = Vec::new();
    b.push(0x83); // :method POST
    b.push(0x86); // :scheme http
    int(0x00, 4, 4, &mut b); // :path, indexed name, without indexing
    raw(path.as_bytes(), &mut b);
    match authority {
        Authority::IndexedRaw(a) => {
            int(0x40, 6, 1, &mut b);
            raw(a.as_bytes(), &mut b);
        }
        Authority::Huffman(a) => {
            int(0x00, 4, 1, &mut b);
            huffman(a.as_bytes(), &mut b);
        }
        Authority::FromTable(i) => int(0x80, 7, i, &mut b),
    }
    int(0x00, 4, 31, &mut b); // content-type
    raw(b"application/grpc", &mut b);
    b.push(0x00); // te: trailers, a new name
    raw(b"te", &mut b);
    raw(b"trailers", &mut b);
    b
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// How the header block goes on the wire.
#[derive(Debug, Clone, Copy)]
enum Framing {
    One,
    /// HEADERS with padding and priority, then the block in CONTINUATION frames of 7 bytes.
    PaddedSplit,
}

/// What became of a call.
#[derive(Debug)]
enum Outcome {
    /// RST_STREAM with this error code (1: PROTOCOL_ERROR).
    Reset(u32),
    /// GOAWAY with this error code.
    GoAway(u32),
    Answered {
        grpc_status: String,
        message: Vec<u8>,
    },
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Reset(code) => write!(f, "stream reset, error code {code}"),
            Outcome::GoAway(code) => write!(f, "connection ended (GOAWAY), error code {code}"),
            Outcome::Answered {
                grpc_status,
                message,
            } => write!(
                f,
                "answered, grpc-status {grpc_status}, {} bytes",
                message.len()
            ),
        }
    }
}

/// An HTTP/2 connection over a Unix socket, frames written and read by hand.
struct Conn {
    s: UnixStream,
    decoder: loona_hpack::Decoder<'static>,
}

impl Conn {
    fn open(path: &Path) -> Conn {
        let mut s = UnixStream::connect(path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
        s.write_all(&frame(0x4, 0, 0, &[])).unwrap(); // SETTINGS
        Conn {
            s,
            decoder: loona_hpack::Decoder::new(),
        }
    }

    fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut h = [0u8; 9];
        self.s.read_exact(&mut h).ok()?;
        let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        self.s.read_exact(&mut payload).ok()?;
        Some((h[3], h[4], stream, payload))
    }

    /// Calls `path` with `message` on `stream`, the request's header block framed as
    /// `framing`.
    fn call(
        &mut self,
        stream: u32,
        path: &str,
        authority: Authority<'_>,
        framing: Framing,
        message: &[u8],
    ) -> Outcome {
        let block = request_block(path, authority);
        match framing {
            Framing::One => {
                self.s
                    .write_all(&frame(HEADERS, END_HEADERS, stream, &block))
                    .unwrap();
            }
            Framing::PaddedSplit => {
                let mut first = vec![3u8]; // pad length
                first.extend_from_slice(&[0, 0, 0, 0, 15]); // depends on 0, weight 16
                first.extend_from_slice(&block[..5]);
                first.extend_from_slice(&[0, 0, 0]);
                self.s
                    .write_all(&frame(HEADERS, PADDED | PRIORITY, stream, &first))
                    .unwrap();
                let rest: Vec<&[u8]> = block[5..].chunks(7).collect();
                for (i, c) in rest.iter().enumerate() {
                    let flags = if i + 1 == rest.len() { END_HEADERS } else { 0 };
                    self.s
                        .write_all(&frame(CONTINUATION, flags, stream, c))
                        .unwrap();
                }
            }
        }
        let mut data = vec![0u8];
        data.extend_from_slice(&(message.len() as u32).to_be_bytes());
        data.extend_from_slice(message);
        self.s
            .write_all(&frame(0x0, END_STREAM, stream, &data))
            .unwrap();
        let mut body = Vec::new();
        let mut grpc_status = None;
        loop {
            let Some((kind, flags, id, payload)) = self.read_frame() else {
                panic!("the connection closed during stream {stream}");
            };
            match kind {
                0x4 if flags & 0x1 == 0 => {
                    self.s.write_all(&frame(0x4, 0x1, 0, &[])).unwrap();
                }
                0x7 => {
                    return Outcome::GoAway(u32::from_be_bytes([
                        payload[4], payload[5], payload[6], payload[7],
                    ]))
                }
                0x3 if id == stream => {
                    return Outcome::Reset(u32::from_be_bytes([
                        payload[0], payload[1], payload[2], payload[3],
                    ]))
                }
                0x0 if id == stream => body.extend_from_slice(&payload),
                0x1 => {
                    // Every header block goes through the decoder, to keep its table.
                    let fields = self.decoder.decode(&payload).unwrap();
                    if id == stream {
                        for (n, v) in fields {
                            if n == b"grpc-status" {
                                grpc_status = Some(String::from_utf8(v).unwrap());
                            }
                        }
                        if flags & END_STREAM != 0 {
                            let message = body.get(5..).unwrap_or_default().to_vec();
                            return Outcome::Answered {
                                grpc_status: grpc_status.unwrap_or_default(),
                                message,
                            };
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

fn get_info(outcome: Outcome) -> PluginInfo {
    match outcome {
        Outcome::Answered {
            grpc_status,
            message,
        } if grpc_status == "0" => PluginInfo::decode(&message[..]).unwrap(),
        other => panic!("GetInfo not answered: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_encoded_socket_path_as_authority_is_answered_on_both_sockets() {
    let api = ApiServer::start(NODE).await;
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &dirs.root.path().join("no-gpushared.sock"), &[]);
    assert!(wait_until(Duration::from_secs(10), || dirs
        .reg_socket()
        .exists()));
    let get_info_path = "/pluginregistration.Registration/GetInfo";
    let mut c = Conn::open(&dirs.reg_socket());
    // grpcio's first call: the path as a literal the table keeps (index 62 from then on).
    let info = get_info(c.call(
        1,
        get_info_path,
        Authority::IndexedRaw(ENCODED_PATH),
        Framing::One,
        &[],
    ));
    assert_eq!(info.name, "gpu.nvidia.com", "{}", plugin.log());
    // Its next calls name it by index; then Huffman-coded, split over CONTINUATION frames
    // with padding and priority; then kubelet's valid authority on the same connection.
    for (stream, authority, framing) in [
        (3, Authority::FromTable(62), Framing::One),
        (5, Authority::Huffman(ENCODED_PATH), Framing::One),
        (7, Authority::FromTable(62), Framing::PaddedSplit),
        (9, Authority::IndexedRaw("localhost"), Framing::One),
        (11, Authority::FromTable(62), Framing::One),
    ] {
        let info = get_info(c.call(stream, get_info_path, authority, framing, &[]));
        assert_eq!(info.name, "gpu.nvidia.com", "stream {stream}");
    }

    // The DRA socket: NodePrepareResources without claims (a health probe's call).
    let mut c = Conn::open(&dirs.dra_socket());
    match c.call(
        1,
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        Authority::Huffman(ENCODED_PATH),
        Framing::One,
        &[],
    ) {
        Outcome::Answered {
            grpc_status,
            message,
        } if grpc_status == "0" => {
            let r = NodePrepareResourcesResponse::decode(&message[..]).unwrap();
            assert!(r.claims.is_empty());
        }
        other => panic!("NodePrepareResources not answered: {other}"),
    }
}
