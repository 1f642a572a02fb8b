//! Upgrading from the build whose registry held the protocol's `ClaimInfo` (record format 3):
//! the records, host records and simulated MIG state it left (`tests/fixtures/records-v3`,
//! written by that build: a claim of every strategy, MIG with MPS included, a `Degraded`
//! claim, an attached container, a tombstone) are read by this build in the same boot with
//! no claim lost, every MPS control daemon re-adopted (pids unchanged, none stopped), every
//! MIG slice kept as it was, and every record written again in this build's format.

use super::*;
use crate::store::RECORD_FORMAT;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/records-v3");

/// Copies the fixture under `root`, its `@ROOT@` replaced; returns what its host records say,
/// by UID (the protocol's view of each claim as the old build left it).
fn plant(root: &Path) -> BTreeMap<String, ClaimInfo> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(Path::new(FIXTURE), &mut files);
    let mut host = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(FIXTURE).unwrap();
        if rel.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&f)
            .unwrap()
            .replace("@ROOT@", &root.display().to_string());
        let to = root.join(rel);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(&to, &text).unwrap();
        if rel.ends_with("claim.json") {
            let info: ClaimInfo = serde_json::from_str(&text).unwrap();
            host.insert(info.uid.clone(), info);
        }
    }
    host
}

#[test]
fn records_of_the_previous_format_keep_every_claim_daemon_and_slice() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let old = plant(root);
    assert_eq!(old.len(), 6);
    let cfg = ServiceConfig::for_tests(root, NODE);
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes_keeping_mig_state(
            "p4d.24xlarge",
            NODE,
            &root.join("dev"),
        )
        .unwrap(),
    );
    let gpu5 = uuid_of_backend(&backend, "gpu-5");
    let slices_before = backend.mig_instances(&gpu5).unwrap();
    assert_eq!(slices_before.len(), 2, "the fixture's two slices");
    // The old build's MPS control daemons run on (but degraded-1's, which died), configured
    // as it configured them; degraded-1's cannot be started again yet.
    let host = FakeHost::default();
    let mut daemons = BTreeMap::new();
    for c in old.values() {
        for g in &c.groups {
            if let StrategyInfo::Mps(m) = &g.sharing {
                let mut d = crate::sys::fake::FakeDaemon::new(
                    m.control_daemon_pid,
                    BTreeMap::from([
                        ("CUDA_MPS_PIPE_DIRECTORY".to_string(), m.pipe_dir.clone()),
                        (
                            "CUDA_VISIBLE_DEVICES".to_string(),
                            m.visible_devices.join(","),
                        ),
                    ]),
                );
                for cmd in crate::strategy::mps::set_commands(&crate::strategy::mps::launch_of(
                    &m.clone().into(),
                )) {
                    d.execute(&cmd);
                }
                if c.state == ClaimState::Degraded {
                    d.die();
                } else {
                    daemons.insert(c.uid.clone(), m.control_daemon_pid);
                }
                host.state().daemons.insert(PathBuf::from(&m.pipe_dir), d);
            }
        }
    }
    assert_eq!(daemons.len(), 2, "mps-1's and mig-mps-1's");
    host.state().fail_start = true;
    // The same boot the fixture was written in (`fake-boot`): an upgrade, not a reboot.
    let service = start(&cfg, &host, &backend);

    // Every claim, as the old build showed it; degraded-1 still Degraded, saying why.
    let now: BTreeMap<String, ClaimInfo> = service
        .list_claims()
        .into_iter()
        .map(|c| (c.uid.clone(), c))
        .collect();
    assert_eq!(
        now.keys().collect::<Vec<_>>(),
        old.keys().collect::<Vec<_>>()
    );
    for (uid, was) in &old {
        if uid == "degraded-1" {
            let c = &now[uid];
            assert_eq!(c.state, ClaimState::Degraded);
            assert!(
                c.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("restarting the MPS control daemon")),
                "{c:?}"
            );
            assert_eq!(c.groups, was.groups);
        } else {
            assert_eq!(&now[uid], was, "claim {uid} as the old build left it");
        }
    }
    assert_eq!(now["mps-1"].attached[0].container_id, "ctr-mps-1");
    // Daemons re-adopted, none stopped; the MIG slices untouched.
    for (uid, pid) in &daemons {
        let c = &now[uid];
        assert!(
            c.groups.iter().any(
                |g| matches!(&g.sharing, StrategyInfo::Mps(m) if m.control_daemon_pid == *pid)
            ),
            "{uid} keeps daemon {pid}: {c:?}"
        );
    }
    assert!(host.state().killed.is_empty(), "{:?}", host.state().killed);
    assert_eq!(backend.mig_instances(&gpu5).unwrap(), slices_before);

    // Every record in this build's format, a MIG group named as one.
    for uid in old.keys() {
        let rec: Value =
            serde_json::from_slice(&std::fs::read(service.records.store.claim_path(uid)).unwrap())
                .unwrap();
        assert_eq!(rec["format"], json!(RECORD_FORMAT), "{uid}");
        let host_rec: Value = serde_json::from_slice(
            &std::fs::read(cfg.run_dir.join("claims").join(uid).join("claim.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(host_rec["format"], json!(RECORD_FORMAT), "{uid}");
        let kind = &rec["groups"][0]["kind"];
        let want = match uid.as_str() {
            "mig-1" | "mig-mps-1" => "Mig",
            "mps-1" | "degraded-1" => "Mps",
            "timeslice-1" => "TimeSlicing",
            _ => "Exclusive",
        };
        assert_eq!(kind, &json!(want), "{uid}: {rec}");
    }
    // The tombstone stands: the released claim's late prepare is refused.
    let late = claim("released-1", &["gpu-6"], None);
    let mut late = late;
    late["metadata"]["resourceVersion"] = json!("107");
    assert_eq!(service.prepare(&late).unwrap_err().code, ErrorCode::Stale);
    // And the claims release as ever: the MIG slices go with theirs.
    drop(service);
    host.state().fail_start = false;
    let again = start(&cfg, &host, &backend);
    for uid in old.keys() {
        again.unprepare(uid).unwrap();
    }
    assert!(backend.mig_instances(&gpu5).unwrap().is_empty());
    assert!(host.state().daemons.values().all(|d| !d.alive));
}

fn uuid_of_backend(backend: &SimulatedBackend, name: &str) -> String {
    backend.find(name).unwrap().uuid.clone()
}

/// Review finding (issue 28): a format 3 record of a `Degraded` claim running MPS on MIG
/// slices names no cause; read as "daemon down" alone it stayed `Degraded` for good, since
/// its daemon was re-adopted and its slices were there. Each cause read from what it holds is
/// checked at start and cleared: it comes up `Prepared`, its daemon kept.
#[test]
fn an_old_degraded_mig_mps_claim_whose_daemon_and_slices_are_there_comes_up_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let old = plant(root);
    let path = root.join("state/records/mig-mps-1.json");
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    rec["state"] = json!("Degraded");
    rec["last_error"] = json!("at 1 s after the epoch: MIG device gpu-5-mig-2g10gb-14-0 vanished while gpushared was away and could not be recreated at placement 0:2: busy");
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let cfg = ServiceConfig::for_tests(root, NODE);
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes_keeping_mig_state(
            "p4d.24xlarge",
            NODE,
            &root.join("dev"),
        )
        .unwrap(),
    );
    let host = FakeHost::default();
    let StrategyInfo::Mps(m) = &old["mig-mps-1"].groups[0].sharing else {
        panic!("the fixture's MIG claim runs MPS")
    };
    let mut d = crate::sys::fake::FakeDaemon::new(
        m.control_daemon_pid,
        BTreeMap::from([("CUDA_MPS_PIPE_DIRECTORY".to_string(), m.pipe_dir.clone())]),
    );
    for cmd in
        crate::strategy::mps::set_commands(&crate::strategy::mps::launch_of(&m.clone().into()))
    {
        d.execute(&cmd);
    }
    host.state().daemons.insert(PathBuf::from(&m.pipe_dir), d);
    let service = start(&cfg, &host, &backend);
    let c = service.get_claim("mig-mps-1").unwrap();
    assert_eq!(c.state, ClaimState::Prepared, "{:?}", c.last_error);
    assert!(
        c.groups[0].sharing == old["mig-mps-1"].groups[0].sharing,
        "its daemon re-adopted as it ran"
    );
    let rec: Value = serde_json::from_slice(
        &std::fs::read(service.records.store.claim_path("mig-mps-1")).unwrap(),
    )
    .unwrap();
    assert_eq!(rec["state"], json!("Prepared"));
    assert!(rec.get("degraded").is_none(), "{rec}");
}
