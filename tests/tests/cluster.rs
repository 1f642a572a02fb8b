//! gpushare on a real one-node Kubernetes cluster (kube-apiserver, scheduler,
//! controller-manager, kube-proxy, kubelet and containerd 2 built from their own Go modules;
//! `tests/cluster/`): the EKS guides' DRA workflow as a user follows it, from `kubectl apply`
//! to the guide's clean-up.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::PathBuf;
use std::time::Duration;

use gpushare_e2e::cluster::{
    installed, mig_template, mps_processes, prometheus_sum, repo, shared_claim, shared_template,
    sleeping_pod, Node, PodClaim, PLUGIN_NAMESPACE,
};
use gpushare_e2e::*;
use gpushare_proto::{StrategyInfo, TimeSliceInterval};

const RUNNING: Duration = Duration::from_secs(120);
/// The namespace of deployments/examples/mps-shared-claim.yaml (each example has its own).
const EXAMPLE_NS: &str = "gpushare-example-mps";

fn cases() -> Option<PathBuf> {
    let dir = setup()?.join("k8s");
    need(dir.is_dir(), "shared/cases/k8s").then_some(dir)
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().unwrap()
}

/// The guide's pod's devices: its `/dev/nvidia<N>` nodes (not nvidiactl, nvidia-uvm, ...).
fn gpu_nodes(node: &Node, ns: &str, pod: &str) -> Vec<String> {
    let mut v: Vec<String> = node
        .exec(ns, pod, "ls /dev")
        .lines()
        .filter(|l| {
            l.strip_prefix("nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn the_guides_workflow_runs_on_a_real_node_and_its_clean_up_leaves_nothing() {
    let Some(cases) = cases() else { return };
    let _serial = global_lock();
    let mut node = Node::up();
    // The guide's MIG template asks for 3g.20gb: an A100 40GB's profile (p4d), MIG on gpu-2.
    node.start_gpushared(&p4d_mig_profile());
    // Seven whole GPUs: gpu-2, in MIG mode, is published as the slices it can be cut into.
    node.install_plugin(7);

    // The guide's templates, as 1.36 serves them. The MIG one is refused by the API server
    // itself: what a user following the guide sees.
    let out = node.kubectl(&["apply", "-f", path(&cases.join("guide-templates.yaml"))]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("gpu-mig-3g20gb")
            && err.contains("gpu.nvidia.com/mig.profile")
            && err.contains("no matching overload"),
        "{err}"
    );
    node.kubectl_ok(&["apply", "-f", path(&cases.join("guide-exclusive.yaml"))]);
    node.kubectl_ok(&["apply", "-f", path(&cases.join("guide-pods.yaml"))]);

    // Exclusive, time-slicing and MPS run; the MIG pod waits for its template.
    let basic = node.wait_running("gpu-test1", "basic-gpu-pod", RUNNING);
    let timeslice = node.wait_running("ml-workloads", "inference-pod-1", RUNNING);
    let mps = node.wait_running("ml-workloads", "mps-workload", RUNNING);
    for pod in [&basic, &timeslice, &mps] {
        assert_eq!(pod["spec"]["nodeName"], node.name.as_str());
    }
    let events = node.events("ml-workloads", "inference-pod");
    assert!(
        events.contains("gpu-mig-3g20gb") && events.contains("not found"),
        "{events}"
    );

    // The corrected template of the docs: then the guide's own pod runs on a 3g.20gb slice.
    let fixed = repo().join("docs/examples/guide-mig-3g20gb.yaml");
    node.kubectl_ok(&["apply", "-f", path(&fixed)]);
    node.wait_running("ml-workloads", "inference-pod", RUNNING);

    // Each claim allocated, reserved for its pod, and prepared by gpushared with its
    // strategy; each pod sees its claim's GPU and no other.
    let claims = node.get_json(&["resourceclaims", "-A"]);
    let items = claims["items"].as_array().unwrap();
    assert_eq!(items.len(), 4, "{claims}");
    for c in items {
        assert!(c["status"]["allocation"].is_object(), "{c}");
        assert_eq!(
            c["status"]["reservedFor"].as_array().unwrap().len(),
            1,
            "{c}"
        );
    }
    let held = node.claims();
    assert_eq!(held.len(), 4, "{held:?}");
    let by_name = |pod: &str| {
        held.iter()
            .find(|c| c.name.starts_with(&format!("{pod}-gpu-")))
            .unwrap_or_else(|| panic!("no claim of {pod} in {held:?}"))
    };
    let strategy = |pod: &str| format!("{:?}", by_name(pod).groups[0].sharing);
    assert!(strategy("basic-gpu-pod").contains("Exclusive"));
    assert!(strategy("inference-pod-1").contains("TimeSlicing"));
    let StrategyInfo::Mps(mps_info) = &by_name("mps-workload").groups[0].sharing else {
        panic!("{}", strategy("mps-workload"));
    };
    assert_eq!(by_name("inference-pod").groups[0].mig.len(), 1);
    assert_eq!(by_name("inference-pod").groups[0].mig[0].profile, "3g.20gb");
    for (ns, pod) in [
        ("gpu-test1", "basic-gpu-pod"),
        ("ml-workloads", "inference-pod-1"),
        ("ml-workloads", "mps-workload"),
    ] {
        let minor = by_name(pod).groups[0].devices[0].minor;
        assert_eq!(
            gpu_nodes(&node, ns, pod),
            vec![format!("nvidia{minor}")],
            "{pod}"
        );
    }
    // MPS: the claim's pipe directory and its limit, read back from NVIDIA's control daemon.
    let env = node.exec("ml-workloads", "mps-workload", "env");
    let pipe = env
        .lines()
        .find_map(|l| l.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
        .unwrap_or_else(|| panic!("no MPS pipe directory in:\n{env}"))
        .to_string();
    let listing = node.exec("ml-workloads", "mps-workload", &format!("ls {pipe}"));
    assert!(listing.lines().any(|l| l == "control"), "{listing}");
    let host_pipe = &mps_info.pipe_dir;
    let read_back = mps_ui(
        std::path::Path::new("/usr/bin/nvidia-cuda-mps-control"),
        host_pipe,
        "get_default_active_thread_percentage",
    );
    assert_eq!(String::from_utf8_lossy(&read_back.stdout).trim(), "50.0");

    // The guide's clean-up order: pods, templates, claims, namespaces.
    node.kubectl_ok(&[
        "delete",
        "-f",
        path(&cases.join("guide-pods.yaml")),
        "--wait=true",
        "--timeout=120s",
    ]);
    node.kubectl_ok(&[
        "delete",
        "resourceclaimtemplates",
        "--all",
        "-n",
        "ml-workloads",
    ]);
    node.kubectl_ok(&[
        "delete",
        "resourceclaimtemplates",
        "--all",
        "-n",
        "gpu-test1",
    ]);
    node.kubectl_ok(&[
        "delete",
        "resourceclaims",
        "--all",
        "-n",
        "ml-workloads",
        "--wait=true",
    ]);
    node.kubectl_ok(&[
        "delete",
        "resourceclaims",
        "--all",
        "-n",
        "gpu-test1",
        "--wait=true",
    ]);
    node.kubectl_ok(&[
        "delete",
        "namespace",
        "ml-workloads",
        "gpu-test1",
        "--wait=true",
    ]);
    // No claim, claim CDI spec or MPS process (the claims' control daemons gone with them).
    node.assert_nothing_left();
}

#[test]
fn two_pods_on_one_claim_share_its_gpu_under_mps_and_under_time_slicing() {
    if setup().is_none() {
        return;
    }
    let _serial = global_lock();
    let mut node = Node::up();
    node.start_gpushared("p5.48xlarge");
    node.install_plugin(8);

    // Every device published names its NUMA node (the standard attribute schedulers align
    // CPUs and NICs by), as gpushared reports it.
    let slices = node.get_json(&["resourceslices"]);
    let devices: Vec<&serde_json::Value> = slices["items"]
        .as_array()
        .unwrap()
        .iter()
        // (A slice may hold only shared counters, and no device.)
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(
        devices
            .iter()
            .filter(|d| d["attributes"]["type"]["string"] == "gpu")
            .count(),
        8,
        "{slices}"
    );
    for d in &devices {
        let numa = &d["attributes"]["resource.kubernetes.io/numaNode"]["int"];
        assert!(numa.as_u64().is_some_and(|n| n < 2), "{d}");
    }

    // deployments/examples/mps-shared-claim.yaml as a user applies it, on the local image.
    let example =
        std::fs::read_to_string(repo().join("deployments/examples/mps-shared-claim.yaml")).unwrap();
    assert_eq!(example.matches("image: ubuntu:24.04").count(), 2);
    let example = example.replace(
        "image: ubuntu:24.04",
        "image: gpushare.test/busybox:local\n    imagePullPolicy: Never",
    );
    node.kubectl_stdin(&["apply", "-f", "-"], &example);
    let a = node.wait_running(EXAMPLE_NS, "mps-client-a", RUNNING);
    let b = node.wait_running(EXAMPLE_NS, "mps-client-b", RUNNING);
    assert_eq!(a["spec"]["nodeName"], b["spec"]["nodeName"]);

    // One claim, one MPS control daemon, both pods' containers attached to it.
    let held = node.claims();
    assert_eq!(held.len(), 1, "{held:?}");
    let claim = &held[0];
    assert_eq!(claim.name, "shared-mps");
    let StrategyInfo::Mps(mps) = &claim.groups[0].sharing else {
        panic!("{claim:?}");
    };
    assert!(
        wait_until(RUNNING, || node.claims()[0].attached.len() == 2),
        "{:?}",
        node.claims()
    );
    assert_eq!(control_daemons(&mps.pipe_dir), vec![mps.control_daemon_pid]);
    // Each attachment names its pod, as containerd's annotations gave it to the hook.
    let mut pods: Vec<String> = node.claims()[0]
        .attached
        .iter()
        .map(|a| a.pod.as_ref().map_or("-".into(), ToString::to_string))
        .collect();
    pods.sort();
    assert_eq!(
        pods,
        [
            format!("{EXAMPLE_NS}/mps-client-a"),
            format!("{EXAMPLE_NS}/mps-client-b")
        ]
    );
    // Both pods see the same one GPU, the claim's, and the same pipe directory.
    let minor = claim.groups[0].devices[0].minor;
    for pod in ["mps-client-a", "mps-client-b"] {
        assert_eq!(
            gpu_nodes(&node, EXAMPLE_NS, pod),
            vec![format!("nvidia{minor}")]
        );
        let env = node.exec(EXAMPLE_NS, pod, "env");
        assert!(env.contains("CUDA_MPS_PIPE_DIRECTORY="), "{env}");
    }

    // The same with time-slicing: one claim with NVIDIA's TimeSlicing config, two pods on it,
    // one GPU, its interval the claim's.
    let ts = shared_claim(
        EXAMPLE_NS,
        "shared-ts",
        "{ apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig, \
         sharing: { strategy: TimeSlicing, timeSlicingConfig: { interval: Long } } }",
    );
    let ts_pod = |name: &str| sleeping_pod(EXAMPLE_NS, name, PodClaim::Claim("shared-ts"), 1);
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        &[ts, ts_pod("ts-a"), ts_pod("ts-b")].join("---\n"),
    );
    node.wait_running(EXAMPLE_NS, "ts-a", RUNNING);
    node.wait_running(EXAMPLE_NS, "ts-b", RUNNING);
    let shared = || {
        node.claims()
            .into_iter()
            .find(|c| c.name == "shared-ts")
            .unwrap_or_else(|| panic!("{:?}", node.claims()))
    };
    assert!(
        wait_until(RUNNING, || shared().attached.len() == 2),
        "{:?}",
        shared()
    );
    let claim = shared();
    assert!(
        matches!(
            claim.groups[0].sharing,
            StrategyInfo::TimeSlicing {
                interval: TimeSliceInterval::Long
            }
        ),
        "{claim:?}"
    );
    assert_eq!(claim.groups[0].devices.len(), 1);
    let minor = claim.groups[0].devices[0].minor;
    for pod in ["ts-a", "ts-b"] {
        assert_eq!(
            gpu_nodes(&node, EXAMPLE_NS, pod),
            vec![format!("nvidia{minor}")]
        );
    }

    node.kubectl_ok(&[
        "-n",
        EXAMPLE_NS,
        "delete",
        "pod",
        "ts-a",
        "ts-b",
        "--wait=true",
    ]);
    node.kubectl_ok(&["-n", EXAMPLE_NS, "delete", "resourceclaim", "shared-ts"]);
    let mps_minor = node.claims()[0].groups[0].devices[0].minor;
    assert_eq!(
        node.gpus()
            .iter()
            .find(|g| g.minor == mps_minor)
            .unwrap()
            .compute_mode,
        gpushare_proto::ComputeMode::ExclusiveProcess,
        "an MPS claim's GPU runs in EXCLUSIVE_PROCESS"
    );

    // NVIDIA's GpuConfig without `sharing`: the whole GPU, nothing changed on it.
    let whole = shared_claim(
        EXAMPLE_NS,
        "whole",
        "{ apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig }",
    );
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        &[
            whole,
            sleeping_pod(EXAMPLE_NS, "whole", PodClaim::Claim("whole"), 1),
        ]
        .join("---\n"),
    );
    node.wait_running(EXAMPLE_NS, "whole", RUNNING);
    let held = node.claims();
    let claim = held.iter().find(|c| c.name == "whole").unwrap();
    assert!(
        matches!(claim.groups[0].sharing, StrategyInfo::Exclusive),
        "{claim:?}"
    );
    node.kubectl_ok(&["-n", EXAMPLE_NS, "delete", "pod", "whole", "--wait=true"]);
    node.kubectl_ok(&["-n", EXAMPLE_NS, "delete", "resourceclaim", "whole"]);

    node.kubectl_stdin(
        &["delete", "-f", "-", "--wait=true", "--timeout=120s"],
        &example,
    );
    node.assert_nothing_left();
    // The last MPS claim gone, its GPU is back in the Default compute mode.
    assert_eq!(
        node.gpus()
            .iter()
            .find(|g| g.minor == mps_minor)
            .unwrap()
            .compute_mode,
        gpushare_proto::ComputeMode::Default
    );
}

fn phase(node: &Node, ns: &str, pod: &str) -> String {
    let out = node.kubectl(&[
        "-n",
        ns,
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.phase}",
    ]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_scheduler_fills_a_mig_gpu_without_overlap_and_the_real_authorizers_hold() {
    if setup().is_none() {
        return;
    }
    let _serial = global_lock();
    let mut node = Node::up();
    node.start_gpushared(&p4d_mig_profile());
    node.install_plugin(7);
    let ns = "mig-fill";
    node.kubectl_ok(&["create", "namespace", ns]);
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        &(mig_template(ns, "mig-3g", "3g.20gb") + "---\n" + &mig_template(ns, "mig-1g", "1g.5gb")),
    );

    // One 3g.20gb slice, then 1g.5gb slices until the scheduler finds no room: an A100 40GB
    // has 8 memory slices, a 3g.20gb takes 4 (placed at 0 or 4), a 1g.5gb one of 0..=6.
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        &sleeping_pod(ns, "big", PodClaim::Template("mig-3g"), 1),
    );
    node.wait_running(ns, "big", RUNNING);
    let mut small = 0;
    let pending = loop {
        let name = format!("small-{small}");
        node.kubectl_stdin(
            &["apply", "-f", "-"],
            &sleeping_pod(ns, &name, PodClaim::Template("mig-1g"), 1),
        );
        let settled = wait_until(RUNNING, || {
            phase(&node, ns, &name) == "Running"
                || node
                    .events(ns, &name)
                    .contains("cannot allocate all claims")
        });
        assert!(settled, "{name}: {}", node.events(ns, &name));
        if phase(&node, ns, &name) != "Running" {
            break name;
        }
        small += 1;
        assert!(small <= 7, "more 1g.5gb slices than a GPU has");
    };
    // The scheduler's own reason, and the pod stays Pending.
    let events = node.events(ns, &pending);
    assert!(events.contains("cannot allocate all claims"), "{events}");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(phase(&node, ns, &pending), "Pending");

    // What gpushared made: one slice per Running pod, on gpu-2, none overlapping another,
    // and as many 1g.5gb as fit beside the 3g.20gb where it was placed.
    let held = node.claims();
    assert_eq!(held.len(), small + 1, "{held:?}");
    let slices: Vec<_> = held
        .iter()
        .flat_map(|c| c.groups.iter().flat_map(|g| g.mig.iter()))
        .collect();
    assert_eq!(slices.len(), small + 1, "{held:?}");
    let mut used = [false; 8];
    for s in &slices {
        for m in s.placement_start..s.placement_start + s.memory_slices {
            assert!(
                !used[m as usize],
                "memory slice {m} granted twice: {slices:?}"
            );
            used[m as usize] = true;
        }
    }
    let big = slices.iter().find(|s| s.profile == "3g.20gb").unwrap();
    let fit = if big.placement_start == 4 { 4 } else { 3 };
    assert_eq!(small, fit, "{slices:?}");
    assert!(slices.iter().all(|s| s.gpu_minor == big.gpu_minor));

    // Releasing one pod's slice lets the Pending pod be scheduled into it.
    node.kubectl_ok(&["-n", ns, "delete", "pod", "small-0", "--wait=true"]);
    node.wait_running(ns, &pending, RUNNING);

    // Real authorization. The plugin's service account, with a token bound to its pod (as
    // kubelet mounts it), may do what deployments/rbac.yaml grants and nothing else.
    let plugin_pod = node.kubectl_ok(&[
        "-n",
        "gpushare",
        "get",
        "pods",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let token = node
        .kubectl_ok(&[
            "-n",
            "gpushare",
            "create",
            "token",
            "gpushare-dra",
            "--bound-object-kind=Pod",
            &format!("--bound-object-name={plugin_pod}"),
        ])
        .trim()
        .to_string();
    let denied = node.kubectl_with_token(&token, &["-n", "gpushare", "get", "secrets"], "");
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(
        !denied.status.success()
            && err.contains("system:serviceaccount:gpushare:gpushare-dra")
            && err.contains("cannot list resource \"secrets\""),
        "{err}"
    );
    let claim = node.kubectl_ok(&[
        "-n",
        ns,
        "get",
        "resourceclaims",
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let denied =
        node.kubectl_with_token(&token, &["-n", ns, "delete", "resourceclaim", &claim], "");
    let err = String::from_utf8_lossy(&denied.stderr);
    assert!(
        !denied.status.success() && err.contains("cannot delete resource \"resourceclaims\""),
        "{err}"
    );
    assert!(node
        .kubectl_with_token(&token, &["-n", ns, "get", "resourceclaim", &claim], "")
        .status
        .success());

    // The admission policy: RBAC lets the plugin write ResourceSlices, the policy only its own
    // node's. Its own node's is admitted; another node's refused, by the policy, by name.
    let slice = |name: &str, node_name: &str| {
        format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{ name: {name} }}
spec:
  driver: gpu.nvidia.com
  nodeName: {node_name}
  pool: {{ name: {name}, generation: 1, resourceSliceCount: 1 }}
  devices: [{{ name: probe }}]
"#
        )
    };
    let apply_as =
        |token: &str, yaml: &str| node.kubectl_with_token(token, &["create", "-f", "-"], yaml);
    let own = apply_as(&token, &slice("probe-own", &node.name));
    assert!(own.status.success(), "{own:?}");
    // (The plugin owns its node's slices of its driver: it removes one it did not publish.)
    assert!(
        wait_until(Duration::from_secs(30), || !node
            .kubectl(&["get", "resourceslice", "probe-own"])
            .status
            .success()),
        "a stray slice on the plugin's node stays"
    );
    let other = "ip-10-0-0-1.ec2.internal";
    let refused = apply_as(&token, &slice("probe-other", other));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && err.contains("gpushare-dra-own-node-slices")
            && err.contains(&format!(
                "gpushare-dra on node {} may only change its own node's ResourceSlices, not those of {other}",
                node.name
            )),
        "{err}"
    );
    // A token bound to no pod names no node: refused too.
    let unbound = node
        .kubectl_ok(&["-n", "gpushare", "create", "token", "gpushare-dra"])
        .trim()
        .to_string();
    let refused = apply_as(&unbound, &slice("probe-unbound", &node.name));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("the service-account token names no node"),
        "{err}"
    );

    // kubelet's credential: the Node authorizer lets it read the claims of its own pods, not
    // one no pod of it uses; NodeRestriction keeps its ResourceSlice writes to its own node.
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{ name: unused, namespace: {ns} }}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{ deviceClassName: gpu.nvidia.com }}
"#
        ),
    );
    let own_claim = node.kubectl_as_kubelet(&["-n", ns, "get", "resourceclaim", &claim], "");
    assert!(own_claim.status.success(), "{own_claim:?}");
    let other_claim = node.kubectl_as_kubelet(&["-n", ns, "get", "resourceclaim", "unused"], "");
    let err = String::from_utf8_lossy(&other_claim.stderr);
    assert!(
        !other_claim.status.success()
            && err.contains(&format!("system:node:{}", node.name))
            && err.contains("forbidden"),
        "{err}"
    );
    let refused = node.kubectl_as_kubelet(&["create", "-f", "-"], &slice("probe-kubelet", other));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("forbidden"),
        "{err}"
    );
    for refused in ["probe-other", "probe-unbound", "probe-kubelet"] {
        let out = node.kubectl(&["get", "resourceslice", refused]);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("NotFound"),
            "{refused}: {out:?}"
        );
    }

    node.kubectl_ok(&["delete", "namespace", ns, "--wait=true", "--timeout=120s"]);
    node.assert_nothing_left();
}

/// kubelet's own count of NodePrepareResources calls to the plugins that succeeded (its
/// `dra_grpc_operations_duration_seconds` histogram; it starts from zero when kubelet does).
fn kubelet_prepare_calls(node: &Node) -> u64 {
    prometheus_sum(
        &node.kubelet_metrics(),
        "dra_grpc_operations_duration_seconds_count",
        &["NodePrepareResources", "grpc_status_code=\"OK\""],
    ) as u64
}

/// The CDI device IDs kubelet's DRA manager has in its checkpoint
/// (`/var/lib/kubelet/dra_manager_state`: JSON with the entries as an escaped JSON string).
fn kubelet_cdi_ids() -> std::collections::BTreeSet<String> {
    let text = std::fs::read_to_string("/var/lib/kubelet/dra_manager_state").unwrap();
    text.split('"')
        .filter(|s| s.starts_with("gpushare.io/"))
        .map(|s| s.trim_end_matches('\\').to_string())
        .collect()
}

/// Pod `ns/name`'s first container: its ID and restart count, and whether it runs and is
/// ready.
fn container(node: &Node, ns: &str, name: &str) -> (String, u64, bool) {
    let pod = node.get_json(&["-n", ns, "pod", name]);
    let c = &pod["status"]["containerStatuses"][0];
    (
        c["containerID"].as_str().unwrap_or("").to_string(),
        c["restartCount"].as_u64().unwrap_or(0),
        c["state"]["running"].is_object() && c["ready"] == true,
    )
}

/// The pids of NVIDIA's MPS control daemons serving pipe directory `pipe`.
fn control_daemons(pipe: &str) -> Vec<i32> {
    mps_processes()
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|e| e.ends_with("nvidia-cuda-mps-control"))
                && std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    env.split(|b| *b == 0)
                        .any(|v| v == format!("CUDA_MPS_PIPE_DIRECTORY={pipe}").as_bytes())
                })
        })
        .collect()
}

fn mps_of(claim: &gpushare_proto::ClaimInfo) -> gpushare_proto::MpsInfo {
    match &claim.groups[0].sharing {
        StrategyInfo::Mps(m) => m.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn pods_keep_their_gpus_across_kubelet_plugin_and_gpushared_restarts_a_crash_and_a_reboot() {
    if setup().is_none() {
        return;
    }
    let _serial = global_lock();
    let mut node = Node::up();
    node.start_gpushared(&p4d_mig_profile());
    node.install_plugin(7);
    let ns = "faults";
    node.kubectl_ok(&["create", "namespace", ns]);
    let templates = [
        shared_template(
            ns,
            "mps",
            r#"{ sharingMode: mps, mpsActiveThreadPercentage: 50 }"#,
        ),
        shared_template(
            ns,
            "timeslice",
            r#"{ sharingMode: time-slicing, timeSlice: default }"#,
        ),
        mig_template(ns, "mig", "1g.5gb"),
    ];
    node.kubectl_stdin(&["apply", "-f", "-"], &templates.join("---\n"));
    let start = |node: &Node, name: &str, template: &str| {
        node.kubectl_stdin(
            &["apply", "-f", "-"],
            &sleeping_pod(ns, name, PodClaim::Template(template), 1),
        );
    };
    start(&node, "mps", "mps");
    start(&node, "mig", "mig");
    node.wait_running(ns, "mps", RUNNING);
    node.wait_running(ns, "mig", RUNNING);
    let claim_of = |node: &Node, pod: &str| {
        node.claims()
            .into_iter()
            .find(|c| c.name.starts_with(&format!("{pod}-gpu-")))
            .unwrap_or_else(|| panic!("no claim of {pod}: {:?}", node.claims()))
    };
    let mps_before = mps_of(&claim_of(&node, "mps"));
    let mig_before = claim_of(&node, "mig").groups[0].mig[0].clone();
    let containers = |node: &Node, pods: &[&str]| -> Vec<(String, u64, bool)> {
        pods.iter().map(|p| container(node, ns, p)).collect()
    };
    let before = containers(&node, &["mps", "mig"]);
    assert!(kubelet_prepare_calls(&node) >= 2);

    // kubelet restarted with the pods running: it reads its checkpoint and prepares nothing
    // again; the containers keep running.
    node.node_sh("restart-kubelet");
    // kubelet back, and its pod workers through every pod (the plugin's and the two).
    let synced = wait_until(RUNNING, || {
        let m = node.kubelet_metrics();
        prometheus_sum(&m, "kubelet_pod_worker_duration_seconds_count", &[]) >= 3.0
            && prometheus_sum(&m, "kubelet_running_pods", &[]) >= 3.0
    });
    assert!(synced, "{}", node.kubelet_metrics());
    assert_eq!(containers(&node, &["mps", "mig"]), before);
    assert_eq!(kubelet_prepare_calls(&node), 0);
    assert_eq!(
        mps_of(&claim_of(&node, "mps")).control_daemon_pid,
        mps_before.control_daemon_pid
    );

    // The plugin's pod deleted: its DaemonSet makes another, which registers with kubelet;
    // a new pod's claim is then prepared through it.
    let plugin_pod = || {
        node.kubectl_ok(&[
            "-n",
            "gpushare",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=gpushare-dra",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
    };
    let old_plugin = plugin_pod();
    node.kubectl_ok(&[
        "-n",
        "gpushare",
        "delete",
        "pod",
        &old_plugin,
        "--wait=true",
    ]);
    node.kubectl_ok(&[
        "-n",
        "gpushare",
        "rollout",
        "status",
        "daemonset/gpushare-dra",
        "--timeout=120s",
    ]);
    assert_ne!(plugin_pod(), old_plugin);
    start(&node, "after-plugin", "timeslice");
    node.wait_running(ns, "after-plugin", RUNNING);
    assert_eq!(kubelet_prepare_calls(&node), 1);

    // gpushared restarted (SIGTERM, as systemd restarts it): the pods and their claims stay,
    // the same MPS control daemon serves the claim.
    node.stop_gpushared(nix::sys::signal::Signal::SIGTERM);
    node.spawn_gpushared(&[]);
    assert_eq!(containers(&node, &["mps", "mig"]), before);
    assert_eq!(node.claims().len(), 3);
    assert_eq!(
        mps_of(&claim_of(&node, "mps")).control_daemon_pid,
        mps_before.control_daemon_pid
    );

    // gpushared killed in the middle of a pod's prepare, right after it started the claim's MPS
    // control daemon (a crash point: abort, as kill -9 leaves it); started again, kubelet's
    // retry prepares the claim, and one control daemon serves it.
    node.stop_gpushared(nix::sys::signal::Signal::SIGTERM);
    node.spawn_gpushared(&[("GPUSHARE_CRASH_AT", "prepare.mps_started")]);
    start(&node, "crashed", "mps");
    let status = node.wait_gpushared_exit(RUNNING);
    assert!(!status.success(), "{status:?}");
    assert!(node
        .gpushared_log()
        .contains("crash point prepare.mps_started reached"));
    node.spawn_gpushared(&[]);
    node.wait_running(ns, "crashed", RUNNING);
    let crashed = mps_of(&claim_of(&node, "crashed"));
    assert_eq!(
        control_daemons(&crashed.pipe_dir),
        vec![crashed.control_daemon_pid],
        "{crashed:?}"
    );
    assert_eq!(control_daemons(&mps_before.pipe_dir).len(), 1);

    // A reboot. gpushared, started before kubelet, makes the MIG slice and the MPS daemons
    // again and writes the CDI specs again, under the IDs kubelet cached in its checkpoint.
    // kubelet 1.36 reads its checkpoint back with every claim marked not prepared
    // (pkg/kubelet/cm/dra/claiminfo.go, newClaimInfoFromState), so each pod's new sandbox
    // prepares its claim once more: gpushared answers from its records, with the same IDs.
    let pods = ["mps", "mig", "after-plugin", "crashed"];
    let before = containers(&node, &pods);
    let cached = kubelet_cdi_ids();
    assert!(
        cached
            .iter()
            .any(|id| id.starts_with("gpushare.io/gpu=MIG-")),
        "{cached:?}"
    );
    node.reboot();
    for pod in pods {
        node.wait_running(ns, pod, RUNNING);
    }
    // (The pods' phase says Running from before the reboot until kubelet reports again: the
    // new containers' own state is what shows them back.)
    let ready = wait_until(RUNNING, || {
        containers(&node, &pods)
            .iter()
            .zip(&before)
            .all(|((id, _, up), (old, _, _))| *up && !id.is_empty() && id != old)
    });
    assert!(ready, "{:?} vs {before:?}", containers(&node, &pods));
    assert_eq!(kubelet_prepare_calls(&node), 4);
    assert_eq!(kubelet_cdi_ids(), cached);
    assert_eq!(node.claims().len(), 4);
    let mig_after = claim_of(&node, "mig").groups[0].mig[0].clone();
    assert_eq!(
        (mig_after.placement_start, mig_after.profile.as_str()),
        (mig_before.placement_start, mig_before.profile.as_str())
    );
    assert_ne!(mig_after.uuid, mig_before.uuid);
    assert_eq!(mig_after.original_uuid, mig_before.uuid);
    let mps_after = mps_of(&claim_of(&node, "mps"));
    assert_ne!(mps_after.control_daemon_pid, mps_before.control_daemon_pid);
    assert_eq!(
        control_daemons(&mps_after.pipe_dir),
        vec![mps_after.control_daemon_pid]
    );
    let listing = node.exec(ns, "mps", "ls $CUDA_MPS_PIPE_DIRECTORY");
    assert!(listing.lines().any(|l| l == "control"), "{listing}");
    let minor = claim_of(&node, "mps").groups[0].devices[0].minor;
    assert_eq!(gpu_nodes(&node, ns, "mps"), vec![format!("nvidia{minor}")]);

    node.kubectl_ok(&["delete", "namespace", ns, "--wait=true", "--timeout=120s"]);
    node.assert_nothing_left();
}

/// The plugin's pod's UID ("" when there is none).
fn plugin_pod_uid(node: &Node) -> String {
    String::from_utf8_lossy(
        &node
            .kubectl(&[
                "-n",
                PLUGIN_NAMESPACE,
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=gpushare-dra",
                "-o",
                "jsonpath={.items[*].metadata.uid}",
            ])
            .stdout,
    )
    .trim()
    .to_string()
}

#[test]
fn the_chart_refuses_a_strict_namespace_upgrades_under_running_pods_and_uninstalls_cleanly() {
    if setup().is_none() {
        return;
    }
    let _serial = global_lock();
    let mut node = Node::up();
    node.start_gpushared("p5.48xlarge");
    let chart = installed(&node.helm_path())
        .release
        .artifact("gpushare-dra-", ".tgz");
    let chart = path(&chart);

    // A namespace enforcing `baseline` would refuse the plugin's hostPath mounts: the chart
    // refuses to install there, saying how to fix it, and creates nothing.
    node.kubectl_ok(&["create", "namespace", "strict"]);
    node.kubectl_ok(&[
        "label",
        "namespace",
        "strict",
        "pod-security.kubernetes.io/enforce=baseline",
    ]);
    let out = node.helm(&["install", "gpushare-dra", chart, "--namespace", "strict"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(r#"namespace strict enforces Pod Security level "baseline""#)
            && err.contains("pod-security.kubernetes.io/enforce=privileged"),
        "{err}"
    );
    let releases = node.helm(&["list", "--namespace", "strict", "--all", "-q"]);
    assert_eq!(String::from_utf8_lossy(&releases.stdout).trim(), "");
    assert_eq!(
        node.kubectl_ok(&["-n", "strict", "get", "all", "-o", "name"])
            .trim(),
        ""
    );
    assert_eq!(
        node.kubectl_ok(&["get", "deviceclasses", "-o", "name"])
            .trim(),
        ""
    );
    node.kubectl_ok(&["delete", "namespace", "strict", "--wait=true"]);

    // Installed as the guide does; a pod with an MPS claim runs.
    node.install_plugin(8);
    let ns = "chart";
    node.kubectl_ok(&["create", "namespace", ns]);
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        &shared_template(
            ns,
            "mps",
            r#"{ sharingMode: mps, mpsActiveThreadPercentage: 50 }"#,
        ),
    );
    let start = |name: &str| {
        node.kubectl_stdin(
            &["apply", "-f", "-"],
            &sleeping_pod(ns, name, PodClaim::Template("mps"), 1),
        );
        node.wait_running(ns, name, RUNNING)
    };
    let before = start("before");

    // `helm upgrade` with a changed value rolls the plugin's pod: the running pod keeps its
    // claim and GPU, and the new plugin prepares a new pod's claim.
    let first = plugin_pod_uid(&node);
    let out = node.helm(&[
        "upgrade",
        "gpushare-dra",
        chart,
        "--namespace",
        PLUGIN_NAMESPACE,
        "--reuse-values",
        "--set",
        "metrics.port=9473",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        wait_until(RUNNING, || {
            let now = plugin_pod_uid(&node);
            !now.is_empty() && now != first && !now.contains(' ')
        }),
        "the plugin's pod was not replaced: {}",
        plugin_pod_uid(&node)
    );
    node.wait_plugin_ready(8);
    let ds = node.get_json(&["-n", PLUGIN_NAMESPACE, "daemonset", "gpushare-dra"]);
    let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--metrics-address=0.0.0.0:9473"), "{args}");
    let again = node.get_json(&["-n", ns, "pod", "before"]);
    assert_eq!(again["status"]["phase"], "Running");
    assert_eq!(again["metadata"]["uid"], before["metadata"]["uid"]);
    start("after");
    assert_eq!(node.claims().len(), 2, "{:?}", node.claims());

    // A pod written for NVIDIA's device plugin (`nvidia.com/gpu: 1`, no claim) gets a whole
    // GPU through the chart's DeviceClass (extendedResourceName; DRAExtendedResource, on by
    // default in 1.36): the scheduler makes its claim, gpushared prepares it Exclusive.
    node.kubectl_stdin(
        &["apply", "-f", "-"],
        &sleeping_pod(ns, "legacy", PodClaim::Extended("nvidia.com/gpu"), 1),
    );
    let legacy = node.wait_running(ns, "legacy", RUNNING);
    let made = legacy["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        .as_str()
        .unwrap_or_else(|| panic!("no extended-resource claim in {legacy}"))
        .to_string();
    let held = node.claims();
    let claim = held
        .iter()
        .find(|c| c.name == made)
        .unwrap_or_else(|| panic!("gpushared holds no {made}: {held:?}"));
    assert!(
        matches!(claim.groups[0].sharing, StrategyInfo::Exclusive),
        "{claim:?}"
    );
    assert_eq!(claim.groups[0].devices.len(), 1, "{claim:?}");
    let minor = claim.groups[0].devices[0].minor;
    assert_eq!(
        gpu_nodes(&node, ns, "legacy"),
        vec![format!("nvidia{minor}")]
    );

    // Uninstall as the guide says: the pods first (kubelet needs the plugin to unprepare
    // their claims), then the release. Nothing of the chart stays, and kubelet removes the
    // plugin's ResourceSlices once it is gone.
    node.kubectl_ok(&["delete", "namespace", ns, "--wait=true", "--timeout=120s"]);
    node.assert_nothing_left();
    let out = node.helm(&[
        "uninstall",
        "gpushare-dra",
        "--namespace",
        PLUGIN_NAMESPACE,
        "--wait",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = |node: &Node| {
        node.kubectl_ok(&[
            "get",
            "deviceclasses,validatingadmissionpolicies,validatingadmissionpolicybindings,clusterroles,clusterrolebindings",
            "-l",
            "app.kubernetes.io/instance=gpushare-dra",
            "-o",
            "name",
        ]) + &node.kubectl_ok(&["-n", PLUGIN_NAMESPACE, "get", "all,serviceaccounts,networkpolicies", "-l", "app.kubernetes.io/instance=gpushare-dra", "-o", "name"])
    };
    // (The plugin's pod goes after its DaemonSet, by garbage collection: waited for.)
    assert!(
        wait_until(RUNNING, || left(&node).trim().is_empty()),
        "left after helm uninstall: {}",
        left(&node)
    );
    assert!(
        wait_until(Duration::from_secs(120), || {
            node.get_json(&["resourceslices"])["items"]
                .as_array()
                .is_some_and(Vec::is_empty)
        }),
        "ResourceSlices left: {}",
        node.get_json(&["resourceslices"])
    );
}
