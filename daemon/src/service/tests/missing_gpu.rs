//! A claim read back at start whose record names a GPU the node does not have (a record of
//! another node's, a GPU gone since) is kept, to be released, and `Degraded` with the reason:
//! never `Prepared`, since the CDI IDs handed out for it resolve nowhere (break-it finding 5).

use super::*;

/// The node again with one GPU (g5.xlarge: the simulated UUIDs depend on the node name and
/// minor only, so its gpu-0 is the p4d's gpu-0 and gpu-1..7 are gone).
fn one_gpu_backend() -> Arc<SimulatedBackend> {
    Arc::new(SimulatedBackend::without_device_nodes("g5.xlarge", NODE, Path::new("/x")).unwrap())
}

#[test]
fn a_claim_on_a_gpu_the_node_lacks_comes_up_degraded_and_can_be_released() {
    let f = fixture();
    f.service.prepare(&claim("keep", &["gpu-0"], None)).unwrap();
    f.service.prepare(&claim("e1", &["gpu-3"], None)).unwrap();
    f.service
        .prepare(&claim("m1", &["gpu-5"], Some(mps(40))))
        .unwrap();
    let gone = gpu(&f, "gpu-3").uuid;
    let again = restart(&f, one_gpu_backend());
    assert!(again.health().ready);
    assert_eq!(again.get_claim("keep").unwrap().state, ClaimState::Prepared);
    for (uid, device) in [("e1", "gpu-3"), ("m1", "gpu-5")] {
        let c = again.get_claim(uid).unwrap();
        assert_eq!(c.state, ClaimState::Degraded, "{uid}");
        let why = c.last_error.unwrap_or_default();
        assert!(
            why.contains(&format!("the node has no GPU {device}")),
            "{uid}: {why}"
        );
        // New containers are refused with the reason.
        let e = again
            .attach(&AttachParams {
                claim_uid: uid.into(),
                container_id: "c".into(),
                pid: None,
                bundle: None,
                pod: None,
            })
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotReady, "{uid}: {}", e.message);
        assert!(e.message.contains("the node has no GPU"), "{}", e.message);
        assert!(
            !e.message.contains("retry later") && e.message.contains("release the claim"),
            "what to do: {}",
            e.message
        );
    }
    assert!(
        again
            .get_claim("e1")
            .unwrap()
            .last_error
            .unwrap()
            .contains(&gone),
        "the reason names the GPU's UUID"
    );
    assert_eq!(again.health().degraded_claims, 2);
    // On disk too: the next start finds it Degraded as well.
    let on_disk = RecordsOnDisk::new(f.cfg.checkpoint.clone())
        .load()
        .unwrap()
        .checkpoint;
    assert_eq!(on_disk.claims["e1"].state, ClaimState::Degraded);
    // A restart of its MPS control daemon does not make it Prepared again.
    f.host
        .state()
        .daemons
        .values_mut()
        .for_each(|d| d.alive = false);
    again.restart_dead_daemons("m1");
    let m1 = again.get_claim("m1").unwrap();
    assert_eq!(m1.state, ClaimState::Degraded);
    assert!(
        m1.last_error
            .unwrap_or_default()
            .contains("the node has no GPU gpu-5"),
        "the reason stays"
    );
    // It keeps its record, so its release works and leaves nothing.
    again.unprepare("e1").unwrap();
    again.unprepare("m1").unwrap();
    assert!(again.get_claim("e1").is_err() && again.get_claim("m1").is_err());
    assert!(!f.cfg.run_dir.join("claims/m1").exists());
    assert!(!cdi::spec_path(&f.cfg.cdi_dir, "m1").exists());
    assert!(f.host.state().mounts.is_empty());
}
