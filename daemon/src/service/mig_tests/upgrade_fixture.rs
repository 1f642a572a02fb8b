//! Writes the upgrade fixture `tests/fixtures/records-v3/`: the claim records, tombstones,
//! host records and simulated MIG state that this build leaves on disk with a claim of every
//! strategy (MIG with MPS included), a Degraded claim and an attached container. Run by hand,
//! once, at the commit before a change of the record formats:
//! `GPUSHARE_FIXTURE_OUT=<dir> cargo test -p gpushare --lib write_the_upgrade_fixture -- --ignored`.

use super::*;

#[test]
#[ignore = "writes a fixture; run by hand"]
fn write_the_upgrade_fixture() {
    let out = PathBuf::from(std::env::var("GPUSHARE_FIXTURE_OUT").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = ServiceConfig::for_tests(root, NODE);
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes_keeping_mig_state(
            "p4d.24xlarge",
            NODE,
            &root.join("dev"),
        )
        .unwrap(),
    );
    let gpu5 = backend.find("gpu-5").unwrap().uuid.clone();
    backend.set_mig_mode(&gpu5, true).unwrap();
    backend.reset(&gpu5).unwrap();
    let host = FakeHost::default();
    let service = start(&cfg, &host, &backend);
    let with_rv = |mut c: Value, rv: &str| {
        c["metadata"]["resourceVersion"] = json!(rv);
        c
    };
    let mps = |atp: u32| {
        json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
               "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": atp,
                 "defaultPinnedDeviceMemoryLimit": "8Gi"}}})
    };
    let ts = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
    let mig_mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    let prepare = |c: Value| service.prepare(&c).unwrap();
    prepare(with_rv(claim("exclusive-1", &["gpu-0"], None), "101"));
    prepare(with_rv(claim("timeslice-1", &["gpu-1"], Some(ts)), "102"));
    prepare(with_rv(
        claim("mps-1", &["gpu-2", "gpu-3"], Some(mps(30))),
        "103",
    ));
    prepare(with_rv(
        claim("degraded-1", &["gpu-4"], Some(mps(50))),
        "104",
    ));
    prepare(with_rv(
        claim("mig-1", &["gpu-5-mig-3g20gb-9-4"], None),
        "105",
    ));
    prepare(with_rv(
        claim("mig-mps-1", &["gpu-5-mig-2g10gb-14-0"], Some(mig_mps)),
        "106",
    ));
    prepare(with_rv(claim("released-1", &["gpu-6"], None), "107"));
    service.unprepare("released-1").unwrap();
    service
        .attach(&AttachParams {
            claim_uid: "mps-1".into(),
            container_id: "ctr-mps-1".into(),
            pid: None,
            bundle: None,
        })
        .unwrap();
    // degraded-1's daemon dies and cannot be started again.
    let pid = service
        .get_claim("degraded-1")
        .unwrap()
        .groups
        .iter()
        .find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.control_daemon_pid),
            _ => None,
        })
        .unwrap();
    for d in host.state().daemons.values_mut() {
        if d.pid == pid {
            d.die();
        }
    }
    host.state().fail_start = true;
    service.mps_daemon_exited("degraded-1", pid);
    let due = service.next_restart().unwrap();
    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    service.run_due_restarts();
    let c = service.get_claim("degraded-1").unwrap();
    assert_eq!(c.state, ClaimState::Degraded);
    // The rest as a running gpushared leaves it (the daemons' start times as the fake host
    // reports them).
    let boot = std::fs::read_to_string(root.join("state/store.json")).unwrap();
    assert!(boot.contains("boot_id"), "{boot}");
    drop(service);
    let copy = |from: &Path, to: &Path| {
        let text = std::fs::read_to_string(from).unwrap();
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, text.replace(&root.display().to_string(), "@ROOT@")).unwrap();
    };
    for entry in walk(root) {
        let rel = entry.strip_prefix(root).unwrap();
        let keep = rel.starts_with("state")
            || rel.starts_with("dev")
            || (rel.starts_with("run/claims") && rel.ends_with("claim.json"));
        if keep && !rel.starts_with("state/quarantine") {
            copy(&entry, &out.join(rel));
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}
