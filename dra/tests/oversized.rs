//! Answers larger than anything the API server can hold (a misbehaving proxy or server,
//! played by the stand-in streaming bodies it never holds): every body the plugin reads is
//! bounded as it arrives, past its bound the call fails naming the URL, is retried with
//! back-off and counted, and the plugin's memory stays small.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use futures_util::StreamExt;
use gpushare_dra::api::{self, ApiError, WatchEvent};
use gpushare_slice::ApiVersion;
use serde_json::json;
use support::apiserver::{ApiServer, Oversize};
use support::kubelet::{Kubelet, Release};
use support::*;

const MIB: u64 = 1024 * 1024;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of the sample `name{labels}` in a scrape, 0 when absent.
fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Peak resident memory of `pid` (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_claim_and_slice_list_fail_naming_the_url_retried_counted_and_bounded() {
    let api = ApiServer::start(NODE).await;
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "big", "namespace": "team-a", "uid": "0b6d3c5e-0000-4000-8000-00000000000a"}});
    api.add_claim(&claim, Some(NODE));
    // 256 MiB a claim and a list: far past any bound, and (read whole, as before) hundreds
    // of MiB of memory.
    api.set_oversized(Some((&[Oversize::Claims, Oversize::SliceLists], 256 * MIB)));
    let dirs = Dirs::new(&api);
    let metrics = format!("127.0.0.1:{}", free_port());
    let plugin = Plugin::start(
        &dirs,
        &dirs.root.path().join("no-gpushared.sock"),
        &[
            "--metrics-address",
            &metrics,
            "--claim-timeout-seconds",
            "20",
        ],
    );
    let reg = Kubelet::new(&dirs.registry, Release::K134)
        .register("gpu.nvidia.com", Duration::from_secs(20), None)
        .await
        .unwrap();
    let r = claim_ref(&claim);
    let answer = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    let e = answer[&r.uid].clone().unwrap_err();
    let url = format!(
        "http://{}/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/big",
        api.addr
    );
    assert!(
        e.contains(&url) && e.contains("exceeds") && e.contains("ResourceClaim"),
        "{e}\n{}",
        plugin.log()
    );
    // Retried with back-off: three GETs, the second pause longer than the first.
    let times = api.claim_get_times();
    assert_eq!(times.len(), 3, "{e}");
    let (first, second) = (times[1] - times[0], times[2] - times[1]);
    assert!(
        first >= Duration::from_millis(200) && second > first,
        "{first:?} then {second:?}"
    );
    // Counted, by operation; the publisher's list is cut off too, and listed again with
    // back-off.
    assert!(wait_until(Duration::from_secs(10), || {
        sample(
            &scrape(&metrics),
            "gpushare_dra_api_oversized_answers_total{operation=\"list_slices\"}",
        ) >= 2.0
    }));
    let body = scrape(&metrics);
    assert_eq!(
        sample(
            &body,
            "gpushare_dra_api_oversized_answers_total{operation=\"get_claim\"}"
        ),
        3.0,
        "{body}"
    );
    let lists = api.oversized_sent(Oversize::SliceLists);
    assert!(
        (2..=8).contains(&lists),
        "back-off between lists: {lists} in the test's time"
    );
    // Each read stopped at its bound: the whole plugin stays far below one answer's size.
    let peak = peak_rss_mib(plugin.child.id());
    eprintln!("gpushare-dra's peak RSS: {peak} MiB; the claim's error: {e}");
    assert!(peak < 64, "peak RSS {peak} MiB");
    assert!(plugin.log().contains(&url), "{}", plugin.log());

    // Served normally again: the claim is read whole and checked (it has no allocation).
    api.set_oversized(None);
    let answer = reg.prepare(std::slice::from_ref(&r), None).await.unwrap();
    let e = answer[&r.uid].clone().unwrap_err();
    assert!(
        e.contains("is not allocated") && !e.contains("exceeds"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_watch_event_ends_the_watch_with_an_error_naming_the_url() {
    let api = ApiServer::start(NODE).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.kubeconfig(NODE, &kubeconfig);
    let c = api::connect(Some(&kubeconfig)).await.unwrap();
    let (items, rv) = c
        .list_slices(ApiVersion::V1, "gpu.nvidia.com", NODE, 1)
        .await
        .unwrap();
    assert!(items.is_empty());
    // A slice created after the list is owed to the watch, before the oversized event.
    let slice = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "s-0"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": NODE,
                 "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1}, "devices": []}});
    c.create_slice(ApiVersion::V1, &slice).await.unwrap();
    api.set_oversized(Some((&[Oversize::WatchEvents], 64 * MIB)));
    let events: Vec<WatchEvent> = c
        .watch_slices(ApiVersion::V1, "gpu.nvidia.com", NODE, &rv)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(matches!(&events[0], WatchEvent::Upsert(o) if o["metadata"]["name"] == "s-0"));
    let WatchEvent::Error(e) = &events[1] else {
        panic!("{events:?}")
    };
    assert!(
        e.contains(&format!(
            "http://{}/apis/resource.k8s.io/v1/resourceslices?watch=true",
            api.addr
        )) && e.contains("exceeds"),
        "{e}"
    );
    assert_eq!(c.oversized_answers("watch_slices"), 1);

    // A list is bounded by the node's slice count: an answer past it fails naming the URL.
    api.set_oversized(Some((&[Oversize::SliceLists], 64 * MIB)));
    let e = c
        .list_slices(ApiVersion::V1, "gpu.nvidia.com", NODE, 1)
        .await
        .unwrap_err();
    assert!(matches!(e, ApiError::TooLarge { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!(
            "http://{}/apis/resource.k8s.io/v1/resourceslices?fieldSelector=",
            api.addr
        )),
        "{e}"
    );
    assert_eq!(c.oversized_answers("list_slices"), 1);
}
