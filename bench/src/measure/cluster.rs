//! Section 11: gpushare on the real one-node Kubernetes cluster of the tests
//! (`tests/cluster/`, `gpushare_e2e::cluster`): what a pod's claim costs it from `kubectl create` to Running,
//! kubelet's own NodePrepareResources timing, and pods with claims created and deleted in a
//! row with nothing left behind.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use gpushare_e2e::cluster::{
    mps_processes, prometheus_sum, shared_template, sleeping_pod, Node, PodClaim,
};

use super::{progress, row_p, sum, Ctx};
use crate::report::{ms, Row, Section, Target};
use crate::stats::ratio;

/// Pod to Running with an MPS claim against without a claim, p50.
const START_LIMIT: f64 = 1.3;
/// The last pods' cost against the first ones'.
const FLAT_LIMIT: f64 = 1.2;
/// How many pods at each end of the row are compared.
const ENDS: usize = 10;
const NS: &str = "bench";
/// Longest a pod may take to be Running, or to be gone once deleted.
const WAIT: &str = "--timeout=120s";

/// A pod `name` of the section's namespace, with a claim from the MPS template or none;
/// deleted at once (no grace period).
fn pod(name: &str, mps: bool) -> String {
    let claim = if mps {
        PodClaim::Template("mps")
    } else {
        PodClaim::None
    };
    sleeping_pod(NS, name, claim, 0)
}

/// `kubectl create` of `yaml` until pod `name` is Running (kubectl's watch).
fn to_running(node: &Node, name: &str, yaml: &str) -> Duration {
    let t = Instant::now();
    node.kubectl_stdin(&["create", "-f", "-"], yaml);
    node.kubectl_ok(&[
        "-n",
        NS,
        "wait",
        "--for=jsonpath={.status.phase}=Running",
        &format!("pod/{name}"),
        WAIT,
    ]);
    t.elapsed()
}

/// Deletes pod `name` until it is gone from the API server and gpushared holds no claim.
fn delete(node: &Node, name: &str) -> Result<Duration> {
    let t = Instant::now();
    node.kubectl_ok(&["-n", NS, "delete", "pod", name, "--wait=true", WAIT]);
    wait_for(|| node.claims().is_empty()).with_context(|| {
        format!(
            "pod {name} deleted, gpushared still holds {:?}",
            node.claims()
        )
    })?;
    Ok(t.elapsed())
}

/// Polls `done` every 20 ms for up to 60 s.
fn wait_for(mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        ensure!(Instant::now() < deadline, "still not done after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The mean of histogram `name` (its `_sum` over its `_count`) among samples with every label
/// of `labels`, in milliseconds, and its count.
fn histogram_mean_ms(text: &str, name: &str, labels: &[&str]) -> Result<(f64, f64)> {
    let count = prometheus_sum(text, &format!("{name}_count"), labels);
    ensure!(count > 0.0, "no {name} samples with {labels:?}");
    Ok((
        prometheus_sum(text, &format!("{name}_sum"), labels) / count * 1e3,
        count,
    ))
}

impl Ctx {
    /// Section 11 and its two targets.
    pub(super) fn cluster(&mut self) -> Result<()> {
        let pairs = self.sizes.cluster_pairs;
        let row_len = self.sizes.cluster_pods;
        let ends = ENDS.min(row_len / 2);
        progress("the real cluster: bringing the node up");
        let mut node = Node::up();
        node.use_binaries(&self.bin_dir);
        node.start_gpushared("p5.48xlarge");
        node.install_plugin(8);
        node.kubectl_ok(&["create", "namespace", NS]);
        // The guide's MPS template.
        node.kubectl_stdin(
            &["apply", "-f", "-"],
            &shared_template(
                NS,
                "mps",
                "{ sharingMode: mps, mpsActiveThreadPercentage: 50 }",
            ),
        );
        // One pod of each first, not counted: images and caches warm on both sides.
        for (name, mps) in [("warm-plain", false), ("warm-mps", true)] {
            to_running(&node, name, &pod(name, mps));
            delete(&node, name)?;
        }

        progress(&format!(
            "the real cluster: {pairs} pods a side, alternating"
        ));
        let (mut plain, mut mps, mut plain_down, mut mps_down) = (vec![], vec![], vec![], vec![]);
        for i in 0..pairs {
            let name = format!("plain-{i}");
            plain.push(to_running(&node, &name, &pod(&name, false)));
            plain_down.push(delete(&node, &name)?);
            let name = format!("mps-{i}");
            mps.push(to_running(&node, &name, &pod(&name, true)));
            mps_down.push(delete(&node, &name)?);
        }
        let (p, p0) = (sum(&mps)?, sum(&plain)?);
        let (d, d0) = (sum(&mps_down)?, sum(&plain_down)?);

        progress(&format!(
            "the real cluster: {row_len} pods with MPS claims in a row"
        ));
        let mut ups = vec![];
        for i in 0..row_len {
            let name = format!("row-{i}");
            ups.push(to_running(&node, &name, &pod(&name, true)));
            delete(&node, &name)?;
        }
        // Nothing left: no claim in the API server or in gpushared, no claim CDI spec, no MPS
        // daemon.
        // (The controller-manager deletes the last pod's ResourceClaim after the pod is gone.)
        let claim_objects = || node.kubectl_ok(&["get", "resourceclaims", "-A", "-o", "name"]);
        wait_for(|| claim_objects().trim().is_empty())
            .with_context(|| format!("ResourceClaims left after the row: {}", claim_objects()))?;
        ensure!(node.claims().is_empty(), "claims held: {:?}", node.claims());
        let specs: Vec<String> = std::fs::read_dir("/var/run/cdi")?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("gpushare.io-claim"))
            .collect();
        ensure!(specs.is_empty(), "claim CDI specs left: {specs:?}");
        wait_for(|| mps_processes().is_empty())
            .with_context(|| format!("MPS processes left: {:?}", mps_processes()))?;
        let (first, last) = (sum(&ups[..ends])?, sum(&ups[row_len - ends..])?);

        // kubelet's own figures for every prepare above, through the API server's node proxy,
        // against gpushared's prepare histogram (its metrics endpoint of packaging/config.toml).
        let kubelet = node.kubelet_metrics();
        let (grpc_ms, grpc_n) = histogram_mean_ms(
            &kubelet,
            "dra_grpc_operations_duration_seconds",
            &["NodePrepareResources", "grpc_status_code=\"OK\""],
        )?;
        let (ungrpc_ms, ungrpc_n) = histogram_mean_ms(
            &kubelet,
            "dra_grpc_operations_duration_seconds",
            &["NodeUnprepareResources", "grpc_status_code=\"OK\""],
        )?;
        let daemon = std::process::Command::new("curl")
            .args(["-sf", "http://127.0.0.1:9471/metrics"])
            .output()
            .context("curl")?;
        ensure!(daemon.status.success(), "gpushared's metrics endpoint");
        let daemon = String::from_utf8_lossy(&daemon.stdout);
        let (own_ms, own_n) = histogram_mean_ms(
            &daemon,
            "gpushare_prepare_duration_seconds",
            &["outcome=\"ok\""],
        )?;
        let (unown_ms, unown_n) = histogram_mean_ms(
            &daemon,
            "gpushare_unprepare_duration_seconds",
            &["outcome=\"ok\""],
        )?;
        drop(node);

        self.report.targets.push(Target {
            name: format!(
                "pod to Running with an MPS claim ≤ {START_LIMIT:.1} × without a claim (p50, real cluster, interleaved)"
            ),
            measured: p.p50_ms / p0.p50_ms,
            limit: START_LIMIT,
            unit: "×".into(),
        });
        self.report.targets.push(Target {
            name: format!(
                "{row_len} pods with MPS claims in a row: the last {ends} ≤ {FLAT_LIMIT:.1} × the first {ends} (median pod to Running, real cluster; nothing left after)"
            ),
            measured: last.p50_ms / first.p50_ms,
            limit: FLAT_LIMIT,
            unit: "×".into(),
        });
        let mut rows: Vec<Row> = row_p(
            "pod to Running, MPS claim",
            &p,
            "pod to Running, no claim",
            &p0,
        )
        .into();
        rows.push(Row {
            figure: format!("MPS pod to Running, last {ends} of {row_len} in a row (median)"),
            value: ms(last.p50_ms),
            baseline: format!("the first {ends}"),
            baseline_value: ms(first.p50_ms),
            ratio: ratio(last.p50_ms, first.p50_ms),
        });
        rows.push(Row {
            figure: "pod deleted until nothing of it is left, MPS claim, p50".into(),
            value: ms(d.p50_ms),
            baseline: "the same, no claim".into(),
            baseline_value: ms(d0.p50_ms),
            ratio: ratio(d.p50_ms, d0.p50_ms),
        });
        rows.push(Row {
            figure: format!("kubelet: NodePrepareResources to gpushare-dra, mean of {grpc_n:.0}"),
            value: ms(grpc_ms),
            baseline: format!("gpushared's prepare, mean of {own_n:.0}"),
            baseline_value: ms(own_ms),
            ratio: ratio(grpc_ms, own_ms),
        });
        rows.push(Row {
            figure: format!(
                "kubelet: NodeUnprepareResources to gpushare-dra, mean of {ungrpc_n:.0}"
            ),
            value: ms(ungrpc_ms),
            baseline: format!("gpushared's unprepare, mean of {unown_n:.0}"),
            baseline_value: ms(unown_ms),
            ratio: ratio(ungrpc_ms, unown_ms),
        });
        self.report.sections.push(Section {
            title: "11. The real cluster: pods with claims".into(),
            method: format!(
                "The tests' one-node cluster (`tests/cluster/node.sh`: Kubernetes 1.36.3's \
                 kube-apiserver, scheduler, controller-manager, kubelet and kube-proxy, \
                 containerd 2.4, Debian's runc), gpushared on a simulated p5.48xlarge with \
                 NVIDIA's MPS control program, gpushare-dra installed from `deployments/`, both \
                 from the build under test. A pod is timed from `kubectl create` to kubectl's \
                 watch seeing it Running, then deleted until the API server no longer has it and \
                 gpushared holds no claim. {pairs} pods with a claim from the guide's MPS template \
                 (the controller-manager makes the claim, the scheduler allocates a GPU, kubelet \
                 prepares it through gpushare-dra, which gpushared serves with a control daemon \
                 of its own) alternate with {pairs} pods without a claim, after one of each \
                 uncounted. Each pod's deletion is timed too, the same way. Then {row_len} MPS \
                 pods in a row, each created (timed to Running: the target) and deleted, and \
                 after the row no ResourceClaim, claim, claim CDI spec or MPS process is left. \
                 kubelet's own histogram of its successful NodePrepareResources \
                 calls (`dra_grpc_operations_duration_seconds`: the gRPC call to gpushare-dra, which \
                 calls gpushared) is read through the API server's node proxy at the end, \
                 against `gpushare_prepare_duration_seconds` from gpushared's metrics endpoint; \
                 both cover every prepare of the section (its `dra_operations_duration_seconds` \
                 is left out: it times pods without claims too)."
            ),
            rows,
        });
        Ok(())
    }
}
