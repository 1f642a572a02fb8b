//! The device nodes a claim's CDI spec names: checked before the claim is ready, and again
//! when a retried prepare finds it prepared.

use super::*;
use crate::sys::{NodeKind, NodeStat};

fn dev(f: &Fixture, name: &str) -> PathBuf {
    f._dir.path().join("dev").join(name)
}

#[test]
fn a_missing_gpu_node_refuses_the_claim_naming_it_and_leaves_nothing() {
    let f = fixture();
    let node = dev(&f, "nvidia3");
    f.host.state().missing_nodes.insert(node.clone());
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-3"], Some(mps(50))))
        .unwrap_err();
    assert!(
        err.message.contains(&node.display().to_string()) && err.message.contains("does not exist"),
        "{err}"
    );
    assert!(err.message.contains("/dev/nvidia3"), "{err}");
    assert_clean(&f, "u1");
    // Once the node is back, the kubelet's retry prepares the claim.
    f.host.state().missing_nodes.clear();
    f.service
        .prepare(&claim("u1", &["gpu-3"], Some(mps(50))))
        .unwrap();
}

#[test]
fn a_missing_control_node_or_a_wrong_one_is_refused_too() {
    let f = fixture();
    f.host.state().missing_nodes.insert(dev(&f, "nvidiactl"));
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-0"], None))
        .unwrap_err();
    assert!(err.message.contains("nvidiactl"), "{err}");
    assert_clean(&f, "u1");
    f.host.state().missing_nodes.clear();
    f.host.state().node_stats.insert(
        dev(&f, "nvidia1"),
        NodeStat {
            kind: NodeKind::Other("a regular file"),
            major: 0,
            minor: 0,
        },
    );
    f.host
        .state()
        .node_stats
        .insert(dev(&f, "nvidia2"), NodeStat::char_device(195, 5));
    let err = f
        .service
        .prepare(&claim("u2", &["gpu-1", "gpu-2"], None))
        .unwrap_err();
    assert!(
        err.message
            .contains("is a regular file, not a character device")
            && err.message.contains("is device 195:5, expected 195:2"),
        "both nodes named: {err}"
    );
    assert_clean(&f, "u2");
}

#[test]
fn already_prepared_is_not_answered_when_a_node_vanished() {
    let f = fixture();
    let c = claim("u1", &["gpu-4"], Some(mps(50)));
    f.service.prepare(&c).unwrap();
    let node = dev(&f, "nvidia4");
    f.host.state().missing_nodes.insert(node.clone());
    let err = f.service.prepare(&c).unwrap_err();
    assert_eq!(err.code, ErrorCode::NotReady, "{err}");
    assert!(err.message.contains(&node.display().to_string()), "{err}");
    // The claim stays as it is (its running containers keep their GPU); the node's return
    // makes the retry answer as before.
    assert_eq!(
        f.service.get_claim("u1").unwrap().state,
        ClaimState::Prepared
    );
    f.host.state().missing_nodes.clear();
    assert!(f.service.prepare(&c).unwrap().already_prepared);
}
