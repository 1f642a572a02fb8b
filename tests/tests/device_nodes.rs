//! A CDI spec never names a device node the host lacks: with a simulated GPU's real device
//! node deleted under gpushared's feet, a prepare is refused naming the node (and leaves
//! nothing behind), and a retried prepare of a prepared claim says the claim is not usable
//! instead of "already prepared".

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::fs;

use gpushare_e2e::*;
use gpushare_proto::ClaimState;
use nix::sys::stat::{makedev, mknod, Mode, SFlag};
use serde_json::{json, Value};

fn whole_gpu_claim(uid: &str, device: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"uid": uid, "name": "nodes", "namespace": "default"},
           "status": {"allocation": {"devices": {"results": [
               {"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}]}}}})
}

#[test]
fn a_deleted_device_node_refuses_the_claim_and_is_checked_again_on_retry() {
    if !need(is_root(), "root (device nodes)") {
        return;
    }
    let d = Daemon::emulated();
    let dev = d.run_dir.join("simulated-dev");

    // Deleted before the claim: refused with the node's path, nothing left.
    let node3 = dev.join("nvidia3");
    fs::remove_file(&node3).unwrap();
    let uid = unique_uid("nodes-a");
    let err = d.prepare(&whole_gpu_claim(&uid, "gpu-3")).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&node3.display().to_string()) && text.contains("does not exist"),
        "{text}"
    );
    d.assert_nothing_left(&uid, &[]);

    // Deleted after the claim was prepared: the kubelet's retry gets NotReady, not
    // "already prepared"; the claim stays; once the node is back the retry answers as before.
    let uid = unique_uid("nodes-b");
    let claim = whole_gpu_claim(&uid, "gpu-4");
    assert!(!d.prepare(&claim).unwrap().already_prepared);
    let node4 = dev.join("nvidia4");
    fs::remove_file(&node4).unwrap();
    let err = d.prepare(&claim).unwrap_err();
    let body = err.remote().expect("an error answer");
    assert_eq!(body.code.as_str(), "NotReady", "{body:?}");
    assert!(
        body.message.contains(&node4.display().to_string()),
        "{body:?}"
    );
    assert_eq!(d.claim(&uid).unwrap().state, ClaimState::Prepared);
    // A node of the wrong number is no better than none.
    mknod(
        &node4,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(195, 5),
    )
    .unwrap();
    let body = d.prepare(&claim).unwrap_err().remote().cloned().unwrap();
    assert!(body.message.contains("expected 195:4"), "{body:?}");
    fs::remove_file(&node4).unwrap();
    mknod(
        &node4,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(195, 4),
    )
    .unwrap();
    assert!(d.prepare(&claim).unwrap().already_prepared);
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
}
