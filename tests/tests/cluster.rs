//! gpushare on a real one-node Kubernetes cluster (kube-apiserver, scheduler,
//! controller-manager, kube-proxy, kubelet and containerd 2 built from their own Go modules;
//! `tests/cluster/`): the EKS guides' DRA workflow as a user follows it, from `kubectl apply`
//! to the guide's clean-up.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use gpushare_e2e::cluster::{repo, Node};
use gpushare_e2e::*;
use gpushare_proto::StrategyInfo;

const RUNNING: Duration = Duration::from_secs(120);

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
    assert!(
        wait_until(Duration::from_secs(60), || node.claims().is_empty()),
        "claims left: {:?}",
        node.claims()
    );
    let left: Vec<String> = std::fs::read_dir("/var/run/cdi")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("gpushare.io-claim"))
        .collect();
    assert!(left.is_empty(), "claim CDI specs left: {left:?}");
    // The claim's MPS control daemon (and its server) gone with the release.
    let mps_left = || {
        let out = Command::new("pgrep")
            .args(["-a", "nvidia-cuda-mps"]) // the process name: both programs
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let gone = wait_until(Duration::from_secs(10), || mps_left().is_empty());
    assert!(gone, "MPS processes left: {}", mps_left());
}

#[test]
fn two_pods_on_one_mps_claim_run_under_one_control_daemon() {
    if setup().is_none() {
        return;
    }
    let _serial = global_lock();
    let mut node = Node::up();
    node.start_gpushared("p5.48xlarge");
    node.install_plugin(8);

    // deployments/examples/mps-shared-claim.yaml as a user applies it, on the local image.
    let example =
        std::fs::read_to_string(repo().join("deployments/examples/mps-shared-claim.yaml")).unwrap();
    assert_eq!(example.matches("image: ubuntu:24.04").count(), 2);
    let example = example.replace(
        "image: ubuntu:24.04",
        "image: gpushare.test/busybox:local\n    imagePullPolicy: Never",
    );
    node.kubectl_stdin(&["apply", "-f", "-"], &example);
    let a = node.wait_running("gpushare-example", "mps-client-a", RUNNING);
    let b = node.wait_running("gpushare-example", "mps-client-b", RUNNING);
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
    let controls = Command::new("pgrep")
        .args(["-x", "nvidia-cuda-mps"]) // the process name of both NVIDIA programs
        .output()
        .unwrap();
    let pids: Vec<&str> = std::str::from_utf8(&controls.stdout)
        .unwrap()
        .lines()
        .collect();
    assert!(
        pids.contains(&mps.control_daemon_pid.to_string().as_str()),
        "{pids:?} vs {mps:?}"
    );
    // Both pods see the same one GPU, the claim's, and the same pipe directory.
    let minor = claim.groups[0].devices[0].minor;
    for pod in ["mps-client-a", "mps-client-b"] {
        assert_eq!(
            gpu_nodes(&node, "gpushare-example", pod),
            vec![format!("nvidia{minor}")]
        );
        let env = node.exec("gpushare-example", pod, "env");
        assert!(env.contains("CUDA_MPS_PIPE_DIRECTORY="), "{env}");
    }

    node.kubectl_stdin(
        &["delete", "-f", "-", "--wait=true", "--timeout=120s"],
        &example,
    );
    assert!(
        wait_until(Duration::from_secs(60), || node.claims().is_empty()),
        "claims left: {:?}",
        node.claims()
    );
}
