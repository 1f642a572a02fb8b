//! Reading HTTP bodies within a bound, frame by frame as they arrive: a body past its bound
//! is dropped (and its connection with it) after at most one frame more than the bound, never
//! collected first. A declared length past the bound fails before anything is read.
//! [`crate::api`] bounds every API-server answer with these.

use std::collections::VecDeque;

use futures_util::Stream;
use http_body_util::BodyExt;
use hyper::body::Bytes;

/// Why a body was not read whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// It is (or declares itself) longer than `limit` bytes; `seen` bytes were read or
    /// declared when reading stopped.
    #[error("the answer exceeds {limit} bytes (cut off at {seen} bytes)")]
    TooLarge {
        /// The bound, bytes.
        limit: usize,
        /// Bytes read (or the declared length) when reading stopped.
        seen: u64,
    },
    /// The connection failed while reading.
    #[error("reading the answer: {0}")]
    Read(String),
}

/// The whole of `body`, at most `limit` bytes.
///
/// # Errors
/// [`BodyError::TooLarge`] past the bound (a declared `Content-Length` past it fails before
/// reading); [`BodyError::Read`] when the body fails.
pub async fn read<B>(mut body: B, limit: usize) -> Result<Vec<u8>, BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let declared = hyper::body::Body::size_hint(&body).lower();
    if declared > limit as u64 {
        return Err(BodyError::TooLarge {
            limit,
            seen: declared,
        });
    }
    // The frames are kept as they came (no copy, no buffer doubling past the bound) and
    // joined once the body is whole: an oversized body costs its bound, nothing more.
    let (mut frames, mut total) = (Vec::new(), 0usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total += data.len();
        if total > limit {
            return Err(BodyError::TooLarge {
                limit,
                seen: total as u64,
            });
        }
        frames.push(data);
    }
    let mut out = Vec::with_capacity(total);
    for f in frames {
        out.extend_from_slice(&f);
    }
    Ok(out)
}

/// The lines of `body` (without their `\n`), each at most `limit` bytes. The stream ends
/// after the body does, or after its first error: a line past the bound (nothing of it is
/// kept past one frame more), or a failed read. Lines complete before the error come first.
pub fn lines<B>(body: B, limit: usize) -> impl Stream<Item = Result<Vec<u8>, BodyError>>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    struct State<B> {
        body: B,
        /// Bytes after the last `\n` seen.
        partial: Vec<u8>,
        /// Lines (and at most one error, last) not handed out yet.
        ready: VecDeque<Result<Vec<u8>, BodyError>>,
        /// Nothing more is read: the body ended or failed, or a line was too long.
        done: bool,
    }
    let state = State {
        body,
        partial: Vec::new(),
        ready: VecDeque::new(),
        done: false,
    };
    futures_util::stream::unfold(state, move |mut s| async move {
        loop {
            if let Some(item) = s.ready.pop_front() {
                return Some((item, s));
            }
            if s.done {
                return None;
            }
            match s.body.frame().await {
                None => {
                    s.done = true;
                    if !s.partial.is_empty() {
                        s.ready.push_back(Ok(std::mem::take(&mut s.partial)));
                    }
                }
                Some(Err(e)) => {
                    s.done = true;
                    s.ready.push_back(Err(BodyError::Read(e.to_string())));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        split(&mut s.partial, &data, limit, &mut s.ready);
                        s.done = matches!(s.ready.back(), Some(Err(_)));
                    }
                }
            }
        }
    })
}

/// Appends `data` to the line in `partial`, moving each complete line to `ready`; a line
/// past `limit` bytes ends it with an error (and `partial` is dropped).
fn split(
    partial: &mut Vec<u8>,
    data: &[u8],
    limit: usize,
    ready: &mut VecDeque<Result<Vec<u8>, BodyError>>,
) {
    let mut rest = data;
    loop {
        let end = rest.iter().position(|b| *b == b'\n');
        let take = end.unwrap_or(rest.len());
        if partial.len() + take > limit {
            ready.push_back(Err(BodyError::TooLarge {
                limit,
                seen: (partial.len() + take) as u64,
            }));
            *partial = Vec::new();
            return;
        }
        partial.extend_from_slice(&rest[..take]);
        match end {
            Some(i) => {
                ready.push_back(Ok(std::mem::take(partial)));
                rest = &rest[i + 1..];
            }
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;

    type Chunks = StreamBody<
        futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>,
    >;

    /// A body of these chunks, without a declared length (as a chunked answer).
    fn chunked(chunks: &[&[u8]]) -> Chunks {
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_within_its_bound_and_cut_off_past_it() {
        assert_eq!(read(chunked(&[b"ab", b"cd"]), 4).await.unwrap(), b"abcd");
        assert_eq!(
            read(chunked(&[b"ab", b"cd", b"e"]), 4).await,
            Err(BodyError::TooLarge { limit: 4, seen: 5 })
        );
        // A declared length past the bound fails before reading.
        assert_eq!(
            read(Full::new(Bytes::from_static(b"abcdef")), 4).await,
            Err(BodyError::TooLarge { limit: 4, seen: 6 })
        );
        assert_eq!(
            read(Full::new(Bytes::from_static(b"abcd")), 4)
                .await
                .unwrap(),
            b"abcd"
        );
        // A failing connection is a read error, not a short body.
        let failing = StreamBody::new(futures_util::stream::iter(vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("reset")),
        ]));
        assert!(matches!(read(failing, 10).await, Err(BodyError::Read(m)) if m.contains("reset")));
    }

    #[tokio::test]
    async fn an_endless_body_is_read_only_to_its_bound() {
        // Never ends: only the bound stops it.
        let endless = StreamBody::new(futures_util::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(&[b'a'; 1024])))
        }));
        assert_eq!(
            read(endless, 10 * 1024).await,
            Err(BodyError::TooLarge {
                limit: 10 * 1024,
                seen: 11 * 1024
            })
        );
        let endless = StreamBody::new(futures_util::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(&[b'a'; 1024])))
        }));
        let got: Vec<_> = lines(endless, 4096).collect().await;
        assert_eq!(
            got,
            [Err(BodyError::TooLarge {
                limit: 4096,
                seen: 5 * 1024
            })]
        );
    }

    #[tokio::test]
    async fn lines_split_across_chunks_each_bounded_the_ones_before_a_long_one_first() {
        let got: Vec<_> = lines(chunked(&[b"one\ntw", b"o\n", b"\nthree"]), 5)
            .collect()
            .await;
        let want: Vec<Result<Vec<u8>, BodyError>> = vec![
            Ok(b"one".to_vec()),
            Ok(b"two".to_vec()),
            Ok(Vec::new()),
            Ok(b"three".to_vec()),
        ];
        assert_eq!(got, want);
        let got: Vec<_> = lines(chunked(&[b"ok\nfour", b"more\nnever"]), 5)
            .collect()
            .await;
        assert_eq!(
            got,
            [
                Ok(b"ok".to_vec()),
                Err(BodyError::TooLarge { limit: 5, seen: 8 })
            ]
        );
    }
}
