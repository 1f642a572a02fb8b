//! The DRA kubelet plugin fed oversized API-server answers: the tests' API-server stand-in
//! answers every ResourceClaim GET and every ResourceSlice list with a body of 1,000 MB
//! (streamed as sent, never held; no real API server can be asked for one), while kubelet's
//! stand-in keeps asking `gpushare-dra` to prepare such a claim. The plugin's peak RSS
//! against its own RSS before (idle, registered, publishing against the same `gpushared`).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpushare_dra_testkit::apiserver::{ApiServer, Oversize};
use gpushare_dra_testkit::kubelet::{Claim, Kubelet, Release};
use serde_json::json;

use crate::daemon::{rss_kib, Daemon, NODE};
use crate::report::{Row, Section, Target};
use crate::stats::ratio;

/// Bytes of each oversized answer (the break round's figure).
const ANSWER: u64 = 1_000_000_000;
/// The target: peak RSS under this, MiB.
const LIMIT_MIB: f64 = 64.0;

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The sum of a counter family's samples in the plugin's `/metrics` at `addr`.
fn scrape_sum(addr: &str, family: &str) -> Result<f64> {
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connecting {addr}"))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body
        .lines()
        .filter(|l| l.starts_with(family))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Runs the measurement with `prepares` NodePrepareResources calls of an oversized claim
/// (each GETs it three times before it fails); returns its section and target.
pub fn measure(
    bin_dir: &Path,
    work: &Path,
    d: &Daemon,
    prepares: usize,
) -> Result<(Section, Vec<Target>)> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let api = ApiServer::start(NODE).await;
        let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "oversized", "namespace": "bench",
                         "uid": "0b6d3c5e-0000-4000-8000-0000000000be"}});
        api.add_claim(&claim, Some(NODE));
        let dir = work.join("dra-memory");
        let (plugins, registry) = (dir.join("p"), dir.join("r"));
        std::fs::create_dir_all(&plugins)?;
        std::fs::create_dir_all(&registry)?;
        let kubeconfig = dir.join("kubeconfig");
        api.kubeconfig(NODE, &kubeconfig);
        std::fs::write(dir.join("dra.toml"), "")?;
        let metrics = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.to_string()
        };
        let log = std::fs::File::create(dir.join("plugin.log"))?;
        let mut child = Command::new(bin_dir.join("gpushare-dra"))
            .arg("--config")
            .arg(dir.join("dra.toml"))
            .args(["--node-name", NODE, "--metrics-address", &metrics])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--gpushared-socket")
            .arg(&d.socket)
            .arg("--plugins-dir")
            .arg(&plugins)
            .arg("--registry-dir")
            .arg(&registry)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning gpushare-dra")?;
        let pid = child.id();
        let result = async {
            let reg = Kubelet::new(&registry, Release::K134)
                .register("gpu.nvidia.com", Duration::from_secs(30), None)
                .await
                .map_err(anyhow::Error::msg)?;
            // Registered and publishing the node's slices: settled.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (idle, _) = rss_kib(pid)?;
            api.set_oversized(Some((&[Oversize::Claims, Oversize::SliceLists], ANSWER)));
            // The publisher lists again (and again, with back-off) once its watch ends.
            api.end_watches();
            let r = Claim {
                namespace: "bench".into(),
                uid: "0b6d3c5e-0000-4000-8000-0000000000be".into(),
                name: "oversized".into(),
            };
            let t = Instant::now();
            for _ in 0..prepares {
                let answer = reg
                    .prepare(std::slice::from_ref(&r), None)
                    .await
                    .map_err(anyhow::Error::msg)?;
                match answer.get(&r.uid) {
                    Some(Err(e)) if e.contains("exceeds") => {}
                    other => bail!("the oversized claim was not refused by its bound: {other:?}"),
                }
            }
            let per_prepare = t.elapsed() / u32::try_from(prepares.max(1)).unwrap_or(1);
            // The publisher's lists are cut off too: a few of them.
            let deadline = Instant::now() + Duration::from_secs(15);
            while api.oversized_sent(Oversize::SliceLists) < 3 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let cut = scrape_sum(&metrics, "gpushare_dra_api_oversized_answers_total")?;
            let (after, peak) = rss_kib(pid)?;
            api.set_oversized(None);
            anyhow::Ok((idle, after, peak, cut, per_prepare))
        }
        .await;
        let _ = child.kill();
        let _ = child.wait();
        let (idle, after, peak, cut, per_prepare) = result.with_context(|| {
            format!(
                "plugin log:\n{}",
                std::fs::read_to_string(dir.join("plugin.log")).unwrap_or_default()
            )
        })?;
        let gets = api.claim_gets().len();
        if cut < (gets as f64) {
            bail!("{gets} claim GETs but only {cut} answers counted as cut off");
        }
        let rows = vec![
            Row {
                figure: format!(
                    "`gpushare-dra` peak RSS, {gets} ResourceClaim GETs and {lists} slice lists \
                     answered with 1,000 MB each",
                    lists = api.oversized_sent(Oversize::SliceLists)
                ),
                value: format!("{:.1} MiB", mib(peak)),
                baseline: "its RSS before (registered, idle)".into(),
                baseline_value: format!("{:.1} MiB", mib(idle)),
                ratio: ratio(mib(peak), mib(idle)),
            },
            Row {
                figure: "`gpushare-dra` RSS after them".into(),
                value: format!("{:.1} MiB", mib(after)),
                baseline: "its RSS before".into(),
                baseline_value: format!("{:.1} MiB", mib(idle)),
                ratio: ratio(mib(after), mib(idle)),
            },
        ];
        let targets = vec![Target {
            name: "gpushare-dra fed 1,000 MB API-server answers: peak RSS < 64 MiB".into(),
            measured: mib(peak),
            limit: LIMIT_MIB,
            unit: "MiB".into(),
        }];
        let section = Section {
            title: "9b. The DRA kubelet plugin fed oversized API-server answers".into(),
            method: format!(
                "`gpushare-dra` (registered with the kubelet stand-in, publishing against the \
                 same `gpushared`) gets, from the API-server stand-in, a body of 1,000 MB for \
                 every ResourceClaim GET and every ResourceSlice list, streamed chunk by chunk \
                 without a length (no real API server can be made to send one). {prepares} \
                 NodePrepareResources calls of such a claim, one after another (each fails \
                 naming the URL after three GETs with back-off; {per_ms:.0} ms a call), while \
                 the publisher, its watch ended, lists again with back-off. RSS is `VmRSS` \
                 (peak: `VmHWM`) from `/proc`, the RSS before taken 2 s after registration; {cut} answers were cut off at their bound \
                 (`gpushare_dra_api_oversized_answers_total`).",
                per_ms = per_prepare.as_secs_f64() * 1e3
            ),
            rows,
        };
        Ok((section, targets))
    })
}
