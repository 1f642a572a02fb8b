//! Unread answers: `gpushared`'s memory while readers leave `list_claims` answers unread.
//!
//! A daemon of its own holds 10,000 time-sliced claims; a reading uid's share of connections
//! (16, `socket.max_connections_per_uid`) each send `list_claims` (protocol version 1: the
//! whole list in one line, about 9 MB, as any old client asks for it) and never read. The
//! figure is the daemon's RSS once every answer has gone as far as it goes, against its RSS
//! with the same claims just before; then after the readers close. Beside it: the time to list
//! every claim in pages (the CLI's way) while the readers wait, against the same before.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use gpushare_proto::{ClaimInfo, Method};

use crate::daemon::{claim, prepare, rss_kib, time_slicing_params, Daemon, Uids};
use crate::report::{ms, num, Row, Section, Target};
use crate::stats::{ratio, summarize};

/// Claims held, and listings timed on each side.
struct Sizes {
    claims: usize,
    listings: usize,
}

/// A reading uid's share of connections (`socket.max_connections_per_uid`).
const READERS: usize = 16;

/// GPUs the claims spread over (time-slicing: any number of claims share one).
const GPUS: usize = 8;

/// Bytes waiting to be read on `s`, peeked into `buf` (nothing is taken).
fn queued(s: &UnixStream, buf: &mut [u8]) -> usize {
    use nix::sys::socket::{recv, MsgFlags};
    recv(
        s.as_raw_fd(),
        buf,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    )
    .unwrap_or(0)
}

/// Lists every claim page by page on a new connection; the time it took.
fn paged_listing(d: &Daemon, claims: usize) -> Result<Duration> {
    let t = Instant::now();
    let listed: Vec<ClaimInfo> = d.client()?.list_claims()?;
    let took = t.elapsed();
    if listed.len() != claims {
        bail!("listed {} claims of {claims}", listed.len());
    }
    Ok(took)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Runs the measurement on a daemon of its own in `work`; returns the report's section and
/// target.
pub fn measure(
    bin_dir: &Path,
    work: &Path,
    uids: &mut Uids,
    smoke: bool,
) -> Result<(Section, Vec<Target>)> {
    let sizes = if smoke {
        Sizes {
            claims: 200,
            listings: 2,
        }
    } else {
        Sizes {
            claims: 10_000,
            listings: 5,
        }
    };
    let d = Daemon::start(
        bin_dir,
        &work.join("r"),
        &bin_dir.join("gpushare-mps-control"),
    )?;
    let pid = d.pid()?;
    let mut c = d.client()?;
    for i in 0..sizes.claims {
        let gpu = format!("gpu-{}", i % GPUS);
        prepare(&mut c, &claim(&uids.next(), &gpu, &time_slicing_params()))?;
    }
    // One whole answer read first, so that whatever a listing allocates for good is in the
    // baseline.
    let whole: Vec<ClaimInfo> = c.call(Method::ListClaims, None::<&()>)?;
    let answer_bytes = serde_json::to_vec(&whole)?.len();
    drop((c, whole));
    let mut before = vec![];
    for _ in 0..sizes.listings {
        before.push(paged_listing(&d, sizes.claims)?);
    }
    std::thread::sleep(Duration::from_secs(1));
    let (baseline, _) = rss_kib(pid)?;

    let request = b"{\"version\":1,\"id\":1,\"method\":\"list_claims\"}\n";
    let mut readers = vec![];
    for _ in 0..READERS {
        let mut s = UnixStream::connect(&d.socket)?;
        std::io::Write::write_all(&mut s, request)?;
        readers.push(s);
    }
    // Every answer has gone as far as it goes while nobody reads: each socket holds the start
    // of its answer, and none grows any more.
    let mut buf = vec![0u8; 8 << 20];
    let mut last = vec![usize::MAX; READERS];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now: Vec<usize> = readers.iter().map(|s| queued(s, &mut buf)).collect();
        if now.iter().all(|&n| n > 0) && now == last {
            break;
        }
        if Instant::now() > deadline {
            bail!("the unread answers never settled: {now:?} bytes queued");
        }
        last = now;
    }
    let (with_readers, peak) = rss_kib(pid)?;
    let mut during = vec![];
    for _ in 0..sizes.listings {
        during.push(paged_listing(&d, sizes.claims)?);
    }
    drop(readers);
    std::thread::sleep(Duration::from_secs(1));
    let (after, _) = rss_kib(pid)?;
    let queued_kib = last.iter().sum::<usize>() as f64 / 1024.0 / READERS as f64;

    let (b, w) = (
        summarize(&before).ok_or_else(|| anyhow::anyhow!("no samples"))?,
        summarize(&during).ok_or_else(|| anyhow::anyhow!("no samples"))?,
    );
    let claims = sizes.claims;
    let rows = vec![
        Row {
            figure: format!("RSS with {READERS} unread `list_claims` answers, {claims} claims"),
            value: format!(
                "{} MiB (peak {} MiB)",
                num(mib(with_readers)),
                num(mib(peak))
            ),
            baseline: format!("{claims} claims, no reader"),
            baseline_value: format!("{} MiB", num(mib(baseline))),
            ratio: ratio(with_readers as f64, baseline as f64),
        },
        Row {
            figure: format!("RSS after the {READERS} readers closed"),
            value: format!("{} MiB", num(mib(after))),
            baseline: format!("{claims} claims, no reader"),
            baseline_value: format!("{} MiB", num(mib(baseline))),
            ratio: ratio(after as f64, baseline as f64),
        },
        Row {
            figure: format!(
                "every claim in pages (the CLI's listing) while the {READERS} wait, p50"
            ),
            value: ms(w.p50_ms),
            baseline: "the same before they asked".into(),
            baseline_value: ms(b.p50_ms),
            ratio: ratio(w.p50_ms, b.p50_ms),
        },
    ];
    let section = Section {
        title: "10. Unread answers".into(),
        method: format!(
            "A `gpushared` of its own holds {claims} time-sliced claims (a whole `list_claims` \
             answer: {} MiB). {READERS} connections, a reading uid's share, each send \
             `list_claims` in protocol version 1 (the whole list in one line) and never read; \
             once the bytes waiting on every socket stop growing (about {} KiB each, in the \
             kernel's socket buffer), the daemon's `VmRSS` (peak: `VmHWM`, since its start) is \
             taken from `/proc`, against its `VmRSS` with the same claims just before (after \
             one whole answer was read, {} paged listings, and 1 s). The readers then close, \
             and it is taken again 1 s later. The listing times are the Rust client's \
             `list_claims` (pages of 500) on a new connection, {} before the readers asked and \
             {} while they wait.",
            num(answer_bytes as f64 / 1048576.0),
            num(queued_kib),
            sizes.listings,
            sizes.listings,
            sizes.listings
        ),
        rows,
    };
    let target = Target {
        name: format!(
            "gpushared RSS with {READERS} unread `list_claims` answers at {claims} claims ≤ 2 × without them"
        ),
        measured: with_readers as f64 / baseline as f64,
        limit: 2.0,
        unit: "×".into(),
    };
    Ok((section, vec![target]))
}
