//! The NVIDIA driver's user-space with every claim: prepare returns, per device, the driver
//! spec's device first and the claim's device last, checks that they resolve and that every
//! node they name exists, and refuses, leaving nothing, on a node without the toolkit or whose
//! toolkit spec lacks the claim's GPU.

use std::sync::Mutex as StdMutex;

use super::*;
use crate::driver_spec::{
    sim::SimulatedToolkit, DriverSpecs, GenerateError, SpecGenerator, DEFAULT_KIND,
};

/// A generator answering `answer` (a spec text, or an error).
#[derive(Debug)]
struct Canned(StdMutex<Result<String, GenerateError>>);

impl SpecGenerator for Canned {
    fn describe(&self) -> String {
        "canned nvidia-ctk".into()
    }
    fn generate(&self, _: &str, _: &str, output: &Path) -> Result<(), GenerateError> {
        let text = self.0.lock().unwrap().clone()?;
        std::fs::write(output, text).unwrap();
        Ok(())
    }
}

struct DriverFixture {
    f: Fixture,
    backend: Arc<SimulatedBackend>,
    driver_root: PathBuf,
}

/// A service whose driver spec comes from `generator` (the simulated toolkit over the
/// service's own simulated GPUs when `None`), on `profile`; `mig_on` GPUs in MIG mode.
fn with_driver(
    profile: &str,
    mig_on: &[u32],
    generator: Option<Arc<dyn SpecGenerator>>,
) -> DriverFixture {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::default();
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes(profile, NODE, &dir.path().join("dev")).unwrap(),
    );
    for m in mig_on {
        let uuid = backend.find(&format!("gpu-{m}")).unwrap().uuid.clone();
        backend.set_mig_mode(&uuid, true).unwrap();
        backend.reset(&uuid).unwrap();
    }
    let driver_root = dir.path().join("driver");
    // A node-wide MPS control daemon ran when the spec was generated.
    std::fs::create_dir_all(driver_root.join("tmp/nvidia-mps")).unwrap();
    let generator = generator.unwrap_or_else(|| {
        Arc::new(SimulatedToolkit::new(
            Arc::clone(&backend) as Arc<dyn GpuBackend>,
            &driver_root,
        ))
    });
    let mut cfg = ServiceConfig::for_tests(dir.path(), NODE);
    cfg.driver_spec = Some(Arc::new(
        DriverSpecs::new(
            generator,
            DEFAULT_KIND,
            &cfg.cdi_dir,
            &cfg.run_dir.join("driver-spec"),
        )
        .unwrap(),
    ));
    let mps = MpsControl::new(
        "/usr/bin/nvidia-cuda-mps-control".into(),
        host.ops(),
        Duration::from_millis(200),
    );
    let service = Service::new(
        cfg.clone(),
        Arc::clone(&backend) as Arc<dyn GpuBackend>,
        mps,
    )
    .unwrap();
    DriverFixture {
        f: Fixture {
            _dir: dir,
            host,
            service,
            cfg,
        },
        backend,
        driver_root,
    }
}

fn driver_spec_path(f: &Fixture) -> PathBuf {
    f.cfg.cdi_dir.join("gpushare.io-gpu.json")
}

fn uuid(d: &DriverFixture, name: &str) -> String {
    d.backend.find(name).unwrap().uuid.clone()
}

fn claim_env(f: &Fixture, uid: &str) -> Vec<String> {
    let spec = gpushare_cdi::load_spec_file(&cdi::spec_path(&f.cfg.cdi_dir, uid)).unwrap();
    spec.devices[0].container_edits.env.clone()
}

#[test]
fn each_device_gets_the_driver_device_first_and_the_request_the_claim_device_last() {
    let d = with_driver("p4d.24xlarge", &[], None);
    let f = &d.f;
    assert!(
        driver_spec_path(f).is_file(),
        "generated at start, before any claim"
    );
    let r = f
        .service
        .prepare(&claim("u1", &["gpu-5", "gpu-4"], Some(mps(30))))
        .unwrap();
    let (g5, g4) = (uuid(&d, "gpu-5"), uuid(&d, "gpu-4"));
    let per: Vec<(&str, Vec<String>)> = r.requests[0]
        .per_device
        .iter()
        .map(|x| (x.device.as_str(), x.cdi_device_ids.clone()))
        .collect();
    assert_eq!(
        per,
        vec![
            ("gpu-5", vec![format!("gpushare.io/gpu={g5}")]),
            (
                "gpu-4",
                vec![
                    format!("gpushare.io/gpu={g4}"),
                    "gpushare.io/claim=u1".to_string()
                ]
            ),
        ]
    );
    assert_eq!(
        r.requests[0].cdi_device_ids,
        vec![
            format!("gpushare.io/gpu={g5}"),
            format!("gpushare.io/gpu={g4}"),
            "gpushare.io/claim=u1".to_string()
        ]
    );
    // Recorded as returned; a retry answers the same.
    assert_eq!(f.service.get_claim("u1").unwrap().requests, r.requests);
    let again = f
        .service
        .prepare(&claim("u1", &["gpu-5", "gpu-4"], Some(mps(30))))
        .unwrap();
    assert!(again.already_prepared);
    assert_eq!(again.requests, r.requests);
    // The IDs resolve against what is in the CDI directory.
    let registry = gpushare_cdi::Registry::load(&[&f.cfg.cdi_dir]);
    let edits = registry.resolve(&r.requests[0].cdi_device_ids).unwrap();
    assert!(edits
        .mounts
        .iter()
        .any(|m| m.container_path.starts_with("/usr/lib64/libcuda.so.")));
    let mps_mounts: Vec<&str> = edits
        .mounts
        .iter()
        .filter(|m| m.container_path == "/tmp/nvidia-mps")
        .map(|m| m.host_path.as_str())
        .collect();
    assert_eq!(
        mps_mounts.len(),
        1,
        "only the claim's pipe dir: {mps_mounts:?}"
    );
    assert!(
        !mps_mounts[0].starts_with(&d.driver_root.display().to_string()),
        "{mps_mounts:?}"
    );
    assert!(claim_env(f, "u1").contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    f.service.unprepare("u1").unwrap();
    assert_clean(f, "u1");
    assert!(driver_spec_path(f).is_file(), "the node's, kept for others");
}

#[test]
fn without_a_driver_spec_the_claim_device_alone_still_hides_other_gpus() {
    let f = fixture();
    let r = f.service.prepare(&claim("u1", &["gpu-1"], None)).unwrap();
    assert_eq!(
        r.requests[0].per_device[0].cdi_device_ids,
        vec!["gpushare.io/claim=u1"]
    );
    assert!(claim_env(&f, "u1").contains(&"NVIDIA_VISIBLE_DEVICES=void".to_string()));
    assert!(!driver_spec_path(&f).exists());
}

#[test]
fn a_node_without_the_toolkit_refuses_in_one_line_and_leaves_nothing() {
    let canned = Arc::new(Canned(StdMutex::new(Err(GenerateError::NotInstalled(
        "nvidia-ctk is in none of /usr/bin, /usr/local/bin".into(),
    )))));
    let d = with_driver("p4d.24xlarge", &[], Some(canned.clone()));
    let f = &d.f;
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-2"], Some(mps(50))))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Unsupported, "{err}");
    assert!(
        err.message.contains("NVIDIA Container Toolkit not found")
            && err.message.contains("nvidia-ctk is in none of")
            && err.message.contains("install nvidia-container-toolkit")
            && !err.message.contains('\n'),
        "{err}"
    );
    assert_clean(f, "u1");
    assert!(
        f.host.state().calls.is_empty(),
        "nothing was started: {:?}",
        f.host.state().calls
    );
    // Installed later: the next prepare generates the spec and works.
    let spec = with_driver("p4d.24xlarge", &[], None);
    let text = std::fs::read_to_string(driver_spec_path(&spec.f)).unwrap();
    *canned.0.lock().unwrap() = Ok(text);
    f.service
        .prepare(&claim("u1", &["gpu-2"], Some(mps(50))))
        .unwrap();
}

#[test]
fn a_gpu_missing_from_the_toolkit_spec_is_refused_naming_it() {
    let d0 = with_driver("p4d.24xlarge", &[], None);
    let mut spec = gpushare_cdi::load_spec_file(&driver_spec_path(&d0.f)).unwrap();
    let g3 = uuid(&d0, "gpu-3");
    spec.devices.retain(|x| x.name != g3);
    let canned = Arc::new(Canned(StdMutex::new(Ok(
        serde_json::to_string(&spec).unwrap()
    ))));
    let d = with_driver("p4d.24xlarge", &[], Some(canned));
    let f = &d.f;
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-2", "gpu-3"], Some(mps(50))))
        .unwrap_err();
    assert!(
        err.message.contains(&format!("gpu-3 ({g3})"))
            && err.message.contains("gpushare.io-gpu.json")
            && !err.message.contains("gpu-2 ("),
        "{err}"
    );
    assert_clean(f, "u1");
    assert!(f.host.state().calls.is_empty(), "nothing was started");
}

#[test]
fn a_node_only_the_driver_device_names_is_checked_too() {
    let d0 = with_driver("p4d.24xlarge", &[], None);
    let mut spec = gpushare_cdi::load_spec_file(&driver_spec_path(&d0.f)).unwrap();
    spec.container_edits
        .device_nodes
        .push(gpushare_cdi::DeviceNode {
            path: "/dev/nvidia-uvm".into(),
            ..Default::default()
        });
    let canned = Arc::new(Canned(StdMutex::new(Ok(
        serde_json::to_string(&spec).unwrap()
    ))));
    let d = with_driver("p4d.24xlarge", &[], Some(canned));
    let f = &d.f;
    f.host
        .state()
        .missing_nodes
        .insert(PathBuf::from("/dev/nvidia-uvm"));
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-0"], None))
        .unwrap_err();
    assert!(
        err.message.contains("/dev/nvidia-uvm does not exist"),
        "{err}"
    );
    assert_clean(f, "u1");
    f.host.state().missing_nodes.clear();
    let r = f.service.prepare(&claim("u1", &["gpu-0"], None)).unwrap();
    // Vanished after: the retry is not answered "already prepared".
    f.host
        .state()
        .missing_nodes
        .insert(PathBuf::from("/dev/nvidia-uvm"));
    let err = f
        .service
        .prepare(&claim("u1", &["gpu-0"], None))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::NotReady, "{err}");
    f.host.state().missing_nodes.clear();
    assert_eq!(
        f.service
            .prepare(&claim("u1", &["gpu-0"], None))
            .unwrap()
            .requests,
        r.requests
    );
}

#[test]
fn a_deleted_driver_spec_is_written_again_for_a_retried_prepare() {
    let d = with_driver("p4d.24xlarge", &[], None);
    let f = &d.f;
    let c = claim("u1", &["gpu-6"], Some(mps(50)));
    let r = f.service.prepare(&c).unwrap();
    std::fs::remove_file(driver_spec_path(f)).unwrap();
    let again = f.service.prepare(&c).unwrap();
    assert!(again.already_prepared);
    assert_eq!(again.requests, r.requests);
    assert!(driver_spec_path(f).is_file());
}

#[test]
fn mig_devices_get_their_mig_uuid_device_and_the_spec_follows_mig_changes() {
    let d = with_driver("p4d.24xlarge", &[2], None);
    let f = &d.f;
    let c = claim(
        "u1",
        &["gpu-2"],
        Some(json!({"sharingMode": "mig", "migProfile": "3g.20gb"})),
    );
    let r = f.service.prepare(&c).unwrap();
    let info = f.service.get_claim("u1").unwrap();
    let mig_uuid = info.groups[0].mig[0].uuid.clone();
    assert!(mig_uuid.starts_with("MIG-"), "{mig_uuid}");
    assert_eq!(
        r.requests[0].per_device[0].cdi_device_ids,
        vec![
            format!("gpushare.io/gpu={mig_uuid}"),
            "gpushare.io/claim=u1".to_string()
        ]
    );
    let names = |f: &Fixture| -> Vec<String> {
        gpushare_cdi::load_spec_file(&driver_spec_path(f))
            .unwrap()
            .devices
            .iter()
            .map(|x| x.name.clone())
            .collect()
    };
    assert!(
        names(f).contains(&mig_uuid),
        "generated after the MIG device was made"
    );
    f.service.unprepare("u1").unwrap();
    assert_clean(f, "u1");
    assert!(
        !names(f).contains(&mig_uuid),
        "generated again after it was destroyed"
    );
}

#[test]
fn mig_apply_generates_the_driver_spec_again() {
    let d = with_driver("p4d.24xlarge", &[2], None);
    let f = &d.f;
    let before = gpushare_cdi::load_spec_file(&driver_spec_path(f)).unwrap();
    let layout = "version: v1\nmig-configs:\n  two:\n    - devices: [2]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 2}\n";
    f.service
        .mig_apply(&gpushare_proto::MigApplyParams {
            layout: layout.into(),
            config: "two".into(),
            dry_run: false,
        })
        .unwrap();
    let live: Vec<String> = d
        .backend
        .mig_instances(&uuid(&d, "gpu-2"))
        .unwrap()
        .into_iter()
        .filter_map(|i| i.compute.map(|c| c.uuid))
        .collect();
    assert_eq!(live.len(), 2);
    let after = gpushare_cdi::load_spec_file(&driver_spec_path(f)).unwrap();
    for m in &live {
        assert!(
            after.devices.iter().any(|x| &x.name == m),
            "{m} in the spec generated after mig apply"
        );
        assert!(!before.devices.iter().any(|x| &x.name == m));
    }
}

#[test]
fn a_host_record_with_the_driver_devices_of_its_own_gpus_is_accepted_and_others_are_not() {
    // Found by the crash suite after merging: host records carry the driver's IDs, and the
    // start-up reconcile refused them as "not the claim's own", losing every claim.
    let d = with_driver("p4d.24xlarge", &[], None);
    let f = &d.f;
    f.service
        .prepare(&claim("u1", &["gpu-5", "gpu-4"], Some(mps(30))))
        .unwrap();
    let text = std::fs::read_to_string(f.cfg.run_dir.join("claims/u1/claim.json")).unwrap();
    let info: ClaimInfo = serde_json::from_str(&text).unwrap();
    assert!(info.requests[0]
        .cdi_device_ids
        .iter()
        .any(|id| id.starts_with("gpushare.io/gpu=GPU-")));
    let claim = crate::claim::wire::claim_of(info.clone());
    crate::service::persisted::check_record(&claim, "u1", &f.cfg.run_dir).unwrap();
    // A driver ID of a GPU the claim does not hold, or of all GPUs, is refused.
    for foreign in [
        format!("gpushare.io/gpu={}", uuid(&d, "gpu-1")),
        "nvidia.com/gpu=all".to_string(),
    ] {
        let mut bad = claim.clone();
        bad.requests[0].per_device[0].cdi_device_ids = vec![foreign.clone()];
        let e = crate::service::persisted::check_record(&bad, "u1", &f.cfg.run_dir).unwrap_err();
        assert!(
            matches!(&e, crate::service::persisted::Refused::ForeignId { id, .. } if *id == foreign),
            "{foreign}: {e}"
        );
        assert!(
            e.to_string().contains("is not the claim's own"),
            "{foreign}: {e}"
        );
    }
}

#[test]
fn driver_spec_temporaries_of_a_killed_writer_are_removed_at_start() {
    let d = with_driver("p4d.24xlarge", &[], None);
    let f = &d.f;
    // Named as fsutil::write_atomic names its temporaries (.<file>.tmp-<pid>-<n>): what a kill
    // during a regeneration leaves. The fake host knows no process 99: its writer is gone.
    let dead = f.cfg.cdi_dir.join(".gpushare.io-gpu.json.tmp-99-3");
    std::fs::write(&dead, "{").unwrap();
    // One whose writer still runs (another gpushared on this CDI directory) is left to it.
    fake_process(f, "another-gpushared", 777_003);
    let live = f.cfg.cdi_dir.join(".gpushare.io-gpu.json.tmp-777003-0");
    std::fs::write(&live, "{").unwrap();
    // Another kind's temporary, and a name that only looks like one, are not ours.
    let foreign = f.cfg.cdi_dir.join(".nvidia.com-gpu.json.tmp-99-0");
    std::fs::write(&foreign, "{").unwrap();
    let odd = f.cfg.cdi_dir.join(".gpushare.io-gpu.json.tmp-99-x");
    std::fs::write(&odd, "{").unwrap();

    let _again = restart(f, Arc::clone(&d.backend));
    assert!(!dead.exists(), "a killed regeneration's temporary is swept");
    assert!(live.exists(), "a running writer's");
    assert!(foreign.exists(), "another kind's");
    assert!(odd.exists(), "not a temporary of ours");
    assert!(driver_spec_path(f).is_file());
}

/// The capability device nodes (container paths) that `ids` give a container, resolved as the
/// CDI library reads the CDI directory.
fn resolved_caps(f: &Fixture, ids: &[String]) -> Vec<String> {
    let registry = gpushare_cdi::Registry::load(&[&f.cfg.cdi_dir]);
    let edits = registry
        .resolve(ids)
        .unwrap_or_else(|e| panic!("{ids:?} do not resolve: {e}"));
    let mut caps: Vec<String> = edits
        .device_nodes
        .iter()
        .map(|n| n.path.clone())
        .filter(|p| p.starts_with("/dev/nvidia-caps/"))
        .collect();
    // Named by both the driver's device and the claim's: one node in the container.
    caps.sort();
    caps.dedup();
    caps
}

/// The capability device nodes of `slice` (on gpu-2), sorted.
fn caps_of(slice: &gpushare_proto::MigInstanceInfo) -> Vec<String> {
    let mut caps: Vec<String> = [None, slice.ci_id]
        .iter()
        .map(|ci| {
            format!(
                "/dev/nvidia-caps/nvidia-cap{}",
                crate::gpu::mig_cap_minor(2, slice.gi_id, *ci)
            )
        })
        .collect();
    caps.sort();
    caps
}

#[test]
fn the_cdi_ids_a_prepare_handed_out_stay_valid_for_recreated_mig_slices() {
    let d = with_driver("p4d.24xlarge", &[2], None);
    let f = &d.f;
    let gpu2 = uuid(&d, "gpu-2");
    // Prepared in this order, the slice at 0 gets GPU instance 1 and the one at 4 gets 2; a
    // start recreates slices in claim UID order ("a-…" first), so the IDs swap and every
    // capability device node changes: the old ones would give the other claim's slice.
    let claims = [
        ("b-low", claim("b-low", &["gpu-2-mig-3g20gb-9-0"], None)),
        ("a-high", claim("a-high", &["gpu-2-mig-3g20gb-9-4"], None)),
    ];
    let mut handed = Vec::new();
    for (uid, c) in &claims {
        let r = f.service.prepare(c).unwrap();
        let slice = f.service.get_claim(uid).unwrap().groups[0].mig[0].clone();
        assert_eq!(
            resolved_caps(f, &r.requests[0].cdi_device_ids),
            caps_of(&slice)
        );
        handed.push((r.requests.clone(), slice));
    }
    assert_eq!((handed[0].1.gi_id, handed[1].1.gi_id), (1, 2));
    let mps = || MpsControl::new("/x".into(), f.host.ops(), Duration::from_millis(200));
    let mut previous: Vec<String> = handed.iter().map(|(_, s)| s.uuid.clone()).collect();
    let mut service = None;
    // What kubelet caches is what the first prepare returned; it never prepares the claim
    // again. A reset, a second reset, a reboot and a plain restart later, those IDs must
    // still resolve, each to the slice the claim holds now.
    for round in ["reset", "second reset", "reboot", "restart"] {
        drop(service.take());
        match round {
            "restart" => {}
            "reboot" => {
                // MIG instances, /run and the CDI specs there do not survive it.
                d.backend.reset(&gpu2).unwrap();
                std::fs::remove_dir_all(&f.cfg.run_dir).unwrap();
                std::fs::remove_dir_all(&f.cfg.cdi_dir).unwrap();
            }
            _ => d.backend.reset(&gpu2).unwrap(),
        }
        let s = if round == "reboot" {
            Service::with_boot_id(
                f.cfg.clone(),
                Arc::clone(&d.backend) as Arc<dyn GpuBackend>,
                mps(),
                "after-the-reboot".into(),
            )
            .unwrap()
        } else {
            restart(f, Arc::clone(&d.backend))
        };
        for (i, (uid, c)) in claims.iter().enumerate() {
            let (requests, first) = &handed[i];
            let info = s.get_claim(uid).unwrap();
            assert_eq!(
                info.state,
                ClaimState::Prepared,
                "{round}, {uid}: {:?}",
                info.last_error
            );
            let now = info.groups[0].mig[0].clone();
            if round == "restart" {
                assert_eq!(now.uuid, previous[i], "{round}, {uid}: nothing recreated");
            } else {
                assert_ne!(now.uuid, previous[i], "{round}, {uid}: a new MIG UUID");
            }
            previous[i] = now.uuid.clone();
            assert_eq!(
                now.original_uuid, first.uuid,
                "{round}, {uid}: its first name"
            );
            assert_eq!(
                &info.requests, requests,
                "{round}, {uid}: the IDs handed out are the claim's for its whole life"
            );
            let ids = &requests[0].cdi_device_ids;
            // The driver's device alone (what NVIDIA's generator gives a MIG device) and the
            // whole list: the recreated slice's nodes, not the first one's.
            let driver_id = &ids[0];
            assert!(driver_id.ends_with(&first.uuid), "{driver_id}");
            assert_eq!(
                resolved_caps(f, std::slice::from_ref(driver_id)),
                caps_of(&now),
                "{round}, {uid}"
            );
            assert_eq!(resolved_caps(f, ids), caps_of(&now), "{round}, {uid}");
            // A kubelet that prepares it again anyway is answered the same IDs.
            let again = s.prepare(c).unwrap();
            assert!(again.already_prepared);
            assert_eq!(&again.requests, requests, "{round}, {uid}");
        }
        service = Some(s);
    }
    let s = service.unwrap();
    assert_ne!(
        (s.get_claim("a-high").unwrap().groups[0].mig[0].gi_id),
        handed[1].1.gi_id,
        "the GPU instances changed places"
    );
    for (uid, _) in &claims {
        s.unprepare(uid).unwrap();
    }
    let spec = gpushare_cdi::load_spec_file(&driver_spec_path(f)).unwrap();
    for (_, first) in &handed {
        assert!(
            !spec.devices.iter().any(|x| x.name == first.uuid),
            "no name of a released claim's slice is left in the driver's spec"
        );
    }
}
