//! Dynamic MIG through the service, on simulated GPUs and the recording fake host.

use std::collections::BTreeSet;
use std::time::Duration;

use gpushare_proto::MigApplyParams;
use serde_json::json;

use super::*;
use crate::gpu::{SimFault, SimulatedBackend};
use crate::mig::{MigDeviceName, MigModel};
use crate::sys::fake::FakeHost;

const NODE: &str = "node-mig";

struct Fixture {
    _dir: tempfile::TempDir,
    host: FakeHost,
    backend: Arc<SimulatedBackend>,
    service: Service,
    cfg: ServiceConfig,
}

/// A service over simulated `profile`; `mig_on` GPUs have MIG mode enabled (set, then reset,
/// as an operator does on Ampere).
fn fixture(profile: &str, mig_on: &[u32]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServiceConfig::for_tests(dir.path(), NODE);
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes(profile, NODE, &dir.path().join("dev")).unwrap(),
    );
    for m in mig_on {
        let uuid = backend.find(&format!("gpu-{m}")).unwrap().uuid.clone();
        backend.set_mig_mode(&uuid, true).unwrap();
        backend.reset(&uuid).unwrap();
    }
    let host = FakeHost::default();
    let service = start(&cfg, &host, &backend);
    Fixture {
        _dir: dir,
        host,
        backend,
        service,
        cfg,
    }
}

fn start(cfg: &ServiceConfig, host: &FakeHost, backend: &Arc<SimulatedBackend>) -> Service {
    let mps = MpsControl::new(
        "/usr/bin/nvidia-cuda-mps-control".into(),
        host.ops(),
        Duration::from_millis(200),
    );
    Service::new(cfg.clone(), Arc::clone(backend) as Arc<dyn GpuBackend>, mps).unwrap()
}

fn claim(uid: &str, devices: &[&str], params: Option<Value>) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": d}))
        .collect();
    let config: Vec<Value> = params
        .into_iter()
        .map(|p| json!({"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": p}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"uid": uid, "name": "c", "namespace": "ns"},
           "status": {"allocation": {"devices": {"results": results, "config": config}}}})
}

fn short_mig(profile: &str) -> Value {
    json!({"sharingMode": "mig", "migProfile": profile})
}

fn uuid_of(f: &Fixture, name: &str) -> String {
    f.backend.find(name).unwrap().uuid.clone()
}

fn instances(f: &Fixture, gpu: &str) -> Vec<crate::gpu::MigInstance> {
    f.backend.mig_instances(&uuid_of(f, gpu)).unwrap()
}

/// Makes a whole MIG instance (GPU instance and its full compute instance) on `gpu` behind
/// gpushare's back, as an administrator's `nvidia-smi mig -cgi … -C` does; returns its GI ID.
fn make_by_hand(f: &Fixture, gpu: &str, profile: u32, start: u32) -> u32 {
    let uuid = uuid_of(f, gpu);
    let gi = f
        .backend
        .create_gpu_instance(&uuid, crate::mig::GiProfileId(profile), start)
        .unwrap();
    f.backend
        .create_compute_instance(&uuid, gi, crate::mig::CiProfileIndex(0))
        .unwrap();
    gi
}

/// Plants the MIG intents file a crashed run leaves (`v`: a JSON array of intents).
fn write_intents(f: &Fixture, v: Value) {
    std::fs::create_dir_all(&f.cfg.run_dir).unwrap();
    std::fs::write(
        f.cfg.run_dir.join("mig-intents.json"),
        serde_json::to_vec(&v).unwrap(),
    )
    .unwrap();
}

/// One intent as the intents file holds it.
fn intent(f: &Fixture, claim: &str, gpu: &str, slice: (u32, u32, u32), gi: Option<u32>) -> Value {
    let (profile, start, size) = slice;
    json!({"claim": claim, "gpu_uuid": uuid_of(f, gpu), "gi_profile_id": profile,
           "placement_start": start, "memory_slices": size, "gi_id": gi})
}

/// Leaves claim `uid`'s record on disk as a prepare that a crash cut short before its MIG
/// slice was recorded leaves it: `PrepareStarted`, its groups planned for `device`, no slice
/// recorded. (Prepared by the fixture's service, its instance destroyed by hand unless it
/// existed before the claim, its record rewritten; the next start rolls it back.)
fn interrupted(f: &Fixture, uid: &str, device: &str, params: Option<Value>) {
    f.service.prepare(&claim(uid, &[device], params)).unwrap();
    let c = f.service.get_claim(uid).unwrap();
    for m in c.groups.iter().flat_map(|g| &g.mig) {
        if m.origin == gpushare_proto::MigOrigin::Created {
            f.backend
                .destroy_compute_instance(&m.gpu_uuid, m.gi_id, m.ci_id.unwrap())
                .unwrap();
            f.backend
                .destroy_gpu_instance(&m.gpu_uuid, m.gi_id)
                .unwrap();
        }
    }
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    let r = cp.claims.get_mut(uid).unwrap();
    r.state = ClaimState::PrepareStarted;
    for g in &mut r.groups {
        g.mig.clear();
    }
    file.save(&cp).unwrap();
}

/// Makes a GPU instance without a compute instance on `gpu` (what a crash right after our
/// create leaves, or an administrator's `nvidia-smi mig -cgi` without `-C`); its GI ID.
fn make_bare(f: &Fixture, gpu: &str, profile: u32, start: u32) -> u32 {
    f.backend
        .create_gpu_instance(&uuid_of(f, gpu), crate::mig::GiProfileId(profile), start)
        .unwrap()
}

fn code(r: Result<PrepareResult, ServiceError>) -> ErrorCode {
    r.expect_err("prepare should be refused").code
}

/// Nothing of `uid` remains: registry, checkpoint, CDI file, run directory.
fn assert_clean(f: &Fixture, uid: &str) {
    assert!(f.service.get_claim(uid).is_err());
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone()).load().unwrap();
    assert!(!cp.checkpoint.claims.contains_key(uid));
    assert!(!cdi::spec_path(&f.cfg.cdi_dir, uid).exists());
    assert!(!f.cfg.run_dir.join("claims").join(uid).exists());
}

#[test]
fn seed_mig_3g20gb_creates_the_slice_at_4_with_caps_and_unprepare_destroys_it() {
    let f = fixture("p4d.24xlarge", &[2]);
    let uid = "5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9";
    let c = claim(uid, &["gpu-2-mig-3g20gb-9-4"], Some(short_mig("3g.20gb")));
    f.service.prepare(&c).unwrap();

    let live = instances(&f, "gpu-2");
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(live[0].profile.0, 9);
    assert_eq!((live[0].placement.start, live[0].placement.size), (4, 4));
    let ci = live[0].compute.clone().expect("a full compute instance");
    assert!(ci.uuid.starts_with("MIG-"), "{}", ci.uuid);

    let info = f.service.get_claim(uid).unwrap();
    let rec = &info.groups[0].mig[0];
    assert_eq!(rec.uuid, ci.uuid, "the UUID comes from the instance itself");
    assert_eq!((rec.gi_id, rec.ci_id), (live[0].gi_id, Some(ci.ci_id)));
    assert_eq!(info.groups[0].sharing, StrategyInfo::Exclusive);
    // `gpushare claim` says what was made, not "nothing changed on the GPU".
    let detail = gpushare_cli::claim_detail(&info);
    assert!(
        detail.contains("MIG slice: gpu-2-mig-3g20gb-9-4"),
        "{detail}"
    );
    assert!(detail.contains(&ci.uuid), "{detail}");
    assert!(!detail.contains("nothing changed"), "{detail}");

    // The CDI device carries the parent GPU and both MIG capability device nodes.
    let spec: Value =
        serde_json::from_slice(&std::fs::read(cdi::spec_path(&f.cfg.cdi_dir, uid)).unwrap())
            .unwrap();
    let nodes: Vec<String> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .collect();
    let gi_cap = crate::gpu::mig_cap_minor(2, rec.gi_id, None);
    let ci_cap = crate::gpu::mig_cap_minor(2, rec.gi_id, Some(0));
    for want in [
        "/dev/nvidia2".to_string(),
        format!("/dev/nvidia-caps/nvidia-cap{gi_cap}"),
        format!("/dev/nvidia-caps/nvidia-cap{ci_cap}"),
    ] {
        assert!(nodes.contains(&want), "{want} missing from {nodes:?}");
    }

    let g = f
        .service
        .list_gpus()
        .into_iter()
        .find(|g| g.name == "gpu-2")
        .unwrap();
    assert_eq!(g.sharing, GpuSharing::Mig);
    assert!(g.mig_enabled);
    assert_eq!(g.mig_devices.len(), 1);
    assert_eq!(g.mig_devices[0].owner.as_deref(), Some(uid));
    assert_eq!(g.mig_devices[0].device_name(2), "gpu-2-mig-3g20gb-9-4");

    assert!(f.service.prepare(&c).unwrap().already_prepared);
    assert_eq!(instances(&f, "gpu-2").len(), 1, "a retry creates nothing");

    f.service.unprepare(uid).unwrap();
    assert!(
        instances(&f, "gpu-2").is_empty(),
        "both instances destroyed"
    );
    assert_clean(&f, uid);
    let g = f
        .service
        .list_gpus()
        .into_iter()
        .find(|g| g.name == "gpu-2")
        .unwrap();
    assert_eq!(g.sharing, GpuSharing::Free);
}

#[test]
fn every_placement_of_every_profile_on_all_four_models() {
    for (profile, model) in [
        ("p4d.24xlarge", MigModel::A100Sxm4_40),
        ("p4de.24xlarge", MigModel::A100Sxm4_80),
        ("p5.48xlarge", MigModel::H100_80),
        ("p5e.48xlarge", MigModel::H200),
    ] {
        // Ampere needs MIG mode set beforehand; Hopper is switched on by the first prepare.
        let on: &[u32] = if model.reset_free_mode_toggle() {
            &[]
        } else {
            &[0]
        };
        let f = fixture(profile, on);
        let mut n = 0;
        for p in model.profiles() {
            for start in 0..8 {
                let name = MigDeviceName::format(0, &p, start);
                let uid = format!("{}-{}", crate::mig::squash(p.name), start);
                let c = claim(&uid, &[&name], None);
                if p.starts.contains(&start) {
                    f.service
                        .prepare(&c)
                        .unwrap_or_else(|e| panic!("{model:?} {name}: {e}"));
                    let live = instances(&f, "gpu-0");
                    assert_eq!(live.len(), 1);
                    assert_eq!(live[0].profile, p.id);
                    assert_eq!(live[0].placement.start, start);
                    assert!(live[0].compute.is_some());
                    // Every placement that overlaps this one is refused with Conflict.
                    for q in model.profiles() {
                        for qs in q.starts {
                            let qp = q.placement(*qs).unwrap();
                            if !qp.overlaps(&p.placement(start).unwrap()) {
                                continue;
                            }
                            let other = MigDeviceName::format(0, &q, *qs);
                            assert_eq!(
                                code(f.service.prepare(&claim("other", &[&other], None))),
                                ErrorCode::Conflict,
                                "{model:?}: {other} over {name}"
                            );
                            assert_clean(&f, "other");
                        }
                    }
                    f.service.unprepare(&uid).unwrap();
                    assert!(instances(&f, "gpu-0").is_empty(), "{name}");
                    n += 1;
                } else {
                    assert_eq!(
                        code(f.service.prepare(&c)),
                        ErrorCode::InvalidConfig,
                        "{model:?}: {name}"
                    );
                    assert_clean(&f, &uid);
                }
            }
        }
        assert_eq!(n, 25, "{model:?}: 7 + 7 + 4 + 3 + 2 + 1 + 1 placements");
        // A profile ID the model does not have, and a name that disagrees with its ID.
        for bad in ["gpu-0-mig-1g5gb-3-0", "gpu-0-mig-2g10gb-9-0"] {
            assert_eq!(
                code(f.service.prepare(&claim("bad", &[bad], None))),
                ErrorCode::InvalidConfig,
                "{bad}"
            );
        }
        assert_eq!(
            code(
                f.service
                    .prepare(&claim("bad", &["gpu-9-mig-7g40gb-0-0"], None))
            ),
            ErrorCode::UnknownDevice
        );
    }
}

#[test]
fn order_that_defeats_placement_less_creation_succeeds_with_explicit_placements() {
    let f = fixture("p4d.24xlarge", &[1]);
    // 19, 19, 14, 9 in this order: the driver's own choice fails at the 3g; ours does not.
    for (uid, dev) in [
        ("o1", "gpu-1-mig-1g5gb-19-2"),
        ("o2", "gpu-1-mig-1g5gb-19-3"),
        ("o3", "gpu-1-mig-2g10gb-14-0"),
        ("o4", "gpu-1-mig-3g20gb-9-4"),
    ] {
        f.service
            .prepare(&claim(uid, &[dev], None))
            .unwrap_or_else(|e| panic!("{dev}: {e}"));
    }
    let mut got: Vec<(u32, u32)> = instances(&f, "gpu-1")
        .iter()
        .map(|i| (i.profile.0, i.placement.start))
        .collect();
    got.sort();
    assert_eq!(got, [(9, 4), (14, 0), (19, 2), (19, 3)]);
    for uid in ["o1", "o2", "o3", "o4"] {
        f.service.unprepare(uid).unwrap();
    }
    assert!(instances(&f, "gpu-1").is_empty());
}

#[test]
fn compute_instance_failure_leaves_no_instance_and_no_claim() {
    let f = fixture("p4d.24xlarge", &[2]);
    f.backend.inject(SimFault::CreateComputeInstance);
    let c = claim("ci-fail", &["gpu-2-mig-3g20gb-9-0"], None);
    let e = f.service.prepare(&c).unwrap_err();
    assert_eq!(e.code, ErrorCode::Internal, "{e}");
    assert!(e.message.contains("compute instance"), "{e}");
    assert!(
        instances(&f, "gpu-2").is_empty(),
        "the GPU instance was rolled back"
    );
    assert_clean(&f, "ci-fail");
    // And the slice can be had afterwards.
    f.service.prepare(&c).unwrap();
    f.service.unprepare("ci-fail").unwrap();
}

#[test]
fn gpu_instance_that_cannot_be_destroyed_keeps_the_claim_for_a_retry() {
    let f = fixture("p4d.24xlarge", &[2]);
    let c = claim("keep", &["gpu-2-mig-4g20gb-5-0"], None);
    f.service.prepare(&c).unwrap();
    f.backend.inject(SimFault::DestroyGpuInstance);
    let e = f.service.unprepare("keep").unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e}");
    assert_eq!(
        f.service.get_claim("keep").unwrap().state,
        ClaimState::Unpreparing
    );
    assert_eq!(instances(&f, "gpu-2").len(), 1);
    f.service.unprepare("keep").unwrap();
    assert!(instances(&f, "gpu-2").is_empty());
    assert_clean(&f, "keep");
}

#[test]
fn mode_rules_ampere_pending_and_busy_gpus() {
    // Ampere with MIG off: enabling needs a reset, so Unsupported, nothing touched.
    let f = fixture("p4d.24xlarge", &[]);
    let e = f
        .service
        .prepare(&claim("amp", &["gpu-0-mig-3g20gb-9-0"], None))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported);
    assert!(e.message.contains("reset"), "{e}");
    assert_eq!(
        f.backend.mig_mode(&uuid_of(&f, "gpu-0")).unwrap(),
        crate::gpu::MigMode::default(),
        "MIG mode was not touched"
    );
    assert_clean(&f, "amp");
    // A pending change (someone ran nvidia-smi -mig 1 without a reset): Unsupported.
    f.backend.set_mig_mode(&uuid_of(&f, "gpu-1"), true).unwrap();
    let e = f
        .service
        .prepare(&claim("pend", &["gpu-1-mig-3g20gb-9-0"], None))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported);
    assert!(e.message.contains("pending"), "{e}");

    // Hopper, MIG off, processes on the GPU: refused at once with the pids, mode unchanged.
    let f = fixture("p5.48xlarge", &[]);
    let uuid = uuid_of(&f, "gpu-3");
    f.backend.set_processes(&uuid, vec![4242]).unwrap();
    let e = f
        .service
        .prepare(&claim("busy", &["gpu-3-mig-3g40gb-9-0"], None))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("4242"), "{e}");
    assert!(!f.backend.mig_mode(&uuid).unwrap().current);
    assert_clean(&f, "busy");
    f.backend.set_processes(&uuid, vec![]).unwrap();
    f.service
        .prepare(&claim("busy", &["gpu-3-mig-3g40gb-9-0"], None))
        .unwrap();
    assert!(
        f.backend.mig_mode(&uuid).unwrap().current,
        "enabled without a reset"
    );
    f.service.unprepare("busy").unwrap();
}

#[test]
fn whole_gpu_and_mig_claims_on_one_gpu_conflict() {
    let f = fixture("p5.48xlarge", &[]);
    f.service
        .prepare(&claim("whole", &["gpu-4"], None))
        .unwrap();
    assert_eq!(
        code(
            f.service
                .prepare(&claim("slice", &["gpu-4-mig-1g10gb-19-0"], None))
        ),
        ErrorCode::Conflict
    );
    assert!(instances(&f, "gpu-4").is_empty());
    assert_clean(&f, "slice");
    f.service.unprepare("whole").unwrap();

    f.service
        .prepare(&claim("slice", &["gpu-4-mig-1g10gb-19-0"], None))
        .unwrap();
    f.service
        .prepare(&claim("slice2", &["gpu-4-mig-1g10gb-19-1"], None))
        .unwrap();
    assert_eq!(
        code(f.service.prepare(&claim("whole", &["gpu-4"], None))),
        ErrorCode::Conflict
    );
    // Two overlapping slices in one claim.
    assert_eq!(
        code(f.service.prepare(&claim(
            "twice",
            &["gpu-4-mig-2g20gb-14-2", "gpu-4-mig-1g10gb-19-3"],
            None
        ))),
        ErrorCode::Conflict
    );
    assert_clean(&f, "twice");
    f.service.unprepare("slice").unwrap();
    f.service.unprepare("slice2").unwrap();
    assert!(instances(&f, "gpu-4").is_empty());
}

#[test]
fn short_form_on_a_whole_gpu_takes_the_lowest_free_placement() {
    let f = fixture("p4d.24xlarge", &[5]);
    f.service
        .prepare(&claim("s1", &["gpu-5"], Some(short_mig("3g.20gb"))))
        .unwrap();
    f.service
        .prepare(&claim("s2", &["gpu-5"], Some(short_mig("3g.20gb"))))
        .unwrap();
    let starts: BTreeSet<u32> = instances(&f, "gpu-5")
        .iter()
        .map(|i| i.placement.start)
        .collect();
    assert_eq!(starts, BTreeSet::from([0, 4]));
    assert_eq!(
        f.service.get_claim("s2").unwrap().groups[0].devices[0].device,
        "gpu-5-mig-3g20gb-9-4"
    );
    assert_eq!(
        code(
            f.service
                .prepare(&claim("s3", &["gpu-5"], Some(short_mig("3g.20gb"))))
        ),
        ErrorCode::Conflict
    );
    assert_eq!(
        code(
            f.service
                .prepare(&claim("s4", &["gpu-5"], Some(short_mig("5g.30gb"))))
        ),
        ErrorCode::InvalidConfig
    );
    // migProfile disagreeing with the allocated device.
    assert_eq!(
        code(f.service.prepare(&claim(
            "s5",
            &["gpu-6-mig-3g20gb-9-0"],
            Some(short_mig("1g.5gb"))
        ))),
        ErrorCode::InvalidConfig
    );
    f.service.unprepare("s1").unwrap();
    f.service.unprepare("s2").unwrap();
}

#[test]
fn mig_device_config_with_mps_runs_a_daemon_on_the_slice() {
    let f = fixture("p5.48xlarge", &[]);
    let cfg = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    f.service
        .prepare(&claim("mps-mig", &["gpu-1-mig-2g20gb-14-2"], Some(cfg)))
        .unwrap();
    let info = f.service.get_claim("mps-mig").unwrap();
    let mig_uuid = info.groups[0].mig[0].uuid.clone();
    let StrategyInfo::Mps(m) = &info.groups[0].sharing else {
        panic!("not MPS: {info:?}")
    };
    assert_eq!(m.visible_devices, vec![mig_uuid.clone()]);
    {
        let st = f.host.state();
        let d = st.daemons.values().next().unwrap();
        assert_eq!(d.env["CUDA_VISIBLE_DEVICES"], mig_uuid);
    }
    // Compute mode is the parent GPU's, shared by every slice: left alone.
    assert_eq!(
        f.backend.compute_mode(&uuid_of(&f, "gpu-1")).unwrap(),
        ComputeMode::Default
    );
    f.service.unprepare("mps-mig").unwrap();
    assert!(f.host.state().daemons.values().all(|d| !d.alive));
    assert!(instances(&f, "gpu-1").is_empty());
    assert_clean(&f, "mps-mig");
}

#[test]
fn startup_destroys_only_what_a_crash_left_of_gpushare_s_own_making() {
    let f = fixture("p4d.24xlarge", &[3]);
    f.service
        .prepare(&claim("owned", &["gpu-3-mig-3g20gb-9-4"], None))
        .unwrap();
    f.service
        .prepare(&claim("half", &["gpu-3-mig-2g10gb-14-0"], None))
        .unwrap();
    let uuid = uuid_of(&f, "gpu-3");
    // What a crash between making `half`'s GPU instance and recording it leaves: its record
    // still PrepareStarted without the slice, its intent in the run directory, the GPU
    // instance without a compute instance (the record is on disk before one is made).
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    let half = cp.claims.get_mut("half").unwrap();
    half.state = ClaimState::PrepareStarted;
    let (half_gi, half_ci) = (half.groups[0].mig[0].gi_id, half.groups[0].mig[0].ci_id);
    half.groups[0].mig.clear();
    file.save(&cp).unwrap();
    f.backend
        .destroy_compute_instance(&uuid, half_gi, half_ci.unwrap())
        .unwrap();
    let intent = |claim: &str, profile: u32, start: u32, size: u32, gi: Option<u32>| {
        json!({"claim": claim, "gpu_uuid": uuid, "gi_profile_id": profile,
               "placement_start": start, "memory_slices": size, "gi_id": gi})
    };
    // Made by someone else: a whole 1g.5gb at 2 under an intent that never got its GI ID (a
    // crash came before gpushare's create: only a GPU instance without a compute instance
    // can be what such a crash leaves), and a GPU instance without its compute instance at 3
    // (an administrator's half-made one) under no intent.
    make_by_hand(&f, "gpu-3", 19, 2);
    f.backend
        .create_gpu_instance(&uuid, crate::mig::GiProfileId(19), 3)
        .unwrap();
    std::fs::write(
        f.cfg.run_dir.join("mig-intents.json"),
        serde_json::to_vec(&json!([
            intent("half", 14, 0, 2, Some(half_gi)),
            intent("gone", 19, 2, 1, None)
        ]))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(instances(&f, "gpu-3").len(), 4);

    let restarted = start(&f.cfg, &f.host, &f.backend);
    let mut live: Vec<(u32, u32)> = instances(&f, "gpu-3")
        .iter()
        .map(|i| (i.profile.0, i.placement.start))
        .collect();
    live.sort_unstable();
    assert_eq!(
        live,
        [(9, 4), (19, 2), (19, 3)],
        "half's instance destroyed; the claim's and the others' kept"
    );
    assert!(restarted.get_claim("half").is_err(), "rolled back");
    assert!(
        !f.cfg.run_dir.join("mig-intents.json").exists(),
        "intents cleared once the sweep used them"
    );
    restarted.unprepare("owned").unwrap();
    let left: Vec<u32> = instances(&f, "gpu-3")
        .iter()
        .map(|i| i.placement.start)
        .collect();
    assert_eq!(left, [2, 3], "a release destroys only its own");
    // A next start has no intents: nothing of others' is touched.
    drop(restarted);
    let _again = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(instances(&f, "gpu-3").len(), 2);
}

#[test]
fn unreadable_intents_destroy_nothing() {
    let f = fixture("p4d.24xlarge", &[3]);
    make_by_hand(&f, "gpu-3", 19, 6);
    // Torn, and a fifo (opening one would block the start).
    std::fs::create_dir_all(&f.cfg.run_dir).unwrap();
    std::fs::write(
        f.cfg.run_dir.join("mig-intents.json"),
        b"[{\"claim\": \"x\", \"gpu_u",
    )
    .unwrap();
    let s = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(instances(&f, "gpu-3").len(), 1);
    drop(s);
    let fifo = f.cfg.run_dir.join("mig-intents.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let _s = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(instances(&f, "gpu-3").len(), 1);
}

const LAYOUT: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  balanced:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "1g.10gb": 2
        "2g.20gb": 1
        "3g.40gb": 1
  halves:
    - device-filter: ["0x233010DE"]
      devices: [1]
      mig-enabled: true
      mig-devices: {"3g.40gb": 2}
"#;

fn apply(f: &Fixture, config: &str, dry_run: bool) -> Result<MigApplyResult, ServiceError> {
    f.service.mig_apply(&MigApplyParams {
        layout: LAYOUT.into(),
        config: config.into(),
        dry_run,
    })
}

use gpushare_proto::MigApplyResult;

#[test]
fn mig_parted_layout_plans_applies_and_refuses_claimed_gpus() {
    let f = fixture("p5.48xlarge", &[]);
    // Plan: nothing changes.
    let plan = apply(&f, "balanced", true).unwrap();
    assert_eq!(plan.gpus.len(), 2);
    assert_eq!(plan.gpus[0].set_mig_mode, Some(true));
    assert_eq!(plan.gpus[0].create.len(), 4);
    assert!(instances(&f, "gpu-0").is_empty(), "a plan changes nothing");

    // Apply: the 19,19,14,9 set, each at an explicit placement.
    let done = apply(&f, "balanced", false).unwrap();
    assert!(
        done.gpus[0].create.iter().all(|c| c.contains("=MIG-")),
        "{done:?}"
    );
    for gpu in ["gpu-0", "gpu-1"] {
        let mut got: Vec<u32> = instances(&f, gpu).iter().map(|i| i.profile.0).collect();
        got.sort();
        assert_eq!(got, [9, 14, 19, 19], "{gpu}");
    }
    assert!(instances(&f, "gpu-2").is_empty(), "not selected");
    // Applying again is a no-op.
    let again = apply(&f, "balanced", true).unwrap();
    assert!(again
        .gpus
        .iter()
        .all(|g| g.create.is_empty() && g.destroy.is_empty()));

    // The layout's instances survive a restart; a claim's slice fits beside nothing there.
    let _restarted = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(instances(&f, "gpu-0").len(), 4);

    // A claim on gpu-1 (its free memory slices 0..2 are taken; use gpu-2): layouts refuse
    // to touch a GPU a claim holds, and change nothing anywhere.
    f.service
        .prepare(&claim("held", &["gpu-2-mig-7g80gb-0-0"], None))
        .unwrap();
    let layout2 = LAYOUT.replace("devices: [0, 1]", "devices: [0, 2]");
    let e = f
        .service
        .mig_apply(&MigApplyParams {
            layout: layout2,
            config: "balanced".into(),
            dry_run: false,
        })
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("held"), "{e}");
    assert_eq!(instances(&f, "gpu-2").len(), 1);

    // Second named config: gpu-1 goes to two 3g.40gb; gpu-0 is untouched.
    let before0 = instances(&f, "gpu-0");
    let halves = apply(&f, "halves", false).unwrap();
    assert_eq!(halves.gpus.len(), 1);
    assert_eq!(halves.gpus[0].destroy.len(), 4);
    let starts: Vec<u32> = instances(&f, "gpu-1")
        .iter()
        .map(|i| i.placement.start)
        .collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(instances(&f, "gpu-0"), before0);

    // Bad input: unknown config, unknown profile, bad version: InvalidConfig, nothing changed.
    assert_eq!(
        apply(&f, "nope", false).unwrap_err().code,
        ErrorCode::InvalidConfig
    );
    for bad in [
        LAYOUT.replace("v1", "v2"),
        LAYOUT.replace("\"3g.40gb\": 2", "\"3g.20gb\": 2"),
        LAYOUT.replace(
            "mig-enabled: false",
            "mig-enabled: false\n      mig-devices: {\"1g.10gb\": 1}",
        ),
        LAYOUT.replace("\"3g.40gb\": 2", "\"3g.40gb\": 3"),
    ] {
        let e = f
            .service
            .mig_apply(&MigApplyParams {
                layout: bad,
                config: "halves".into(),
                dry_run: false,
            })
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidConfig, "{e}");
    }
    assert_eq!(instances(&f, "gpu-1").len(), 2);

    f.service.unprepare("held").unwrap();
    // Disabling: destroys the layout's instances and turns MIG mode off (Hopper: no reset).
    apply(&f, "all-disabled", false).unwrap();
    for gpu in ["gpu-0", "gpu-1", "gpu-2"] {
        assert!(instances(&f, gpu).is_empty(), "{gpu}");
        assert!(
            !f.backend.mig_mode(&uuid_of(&f, gpu)).unwrap().current,
            "{gpu}"
        );
    }
}

#[test]
fn layout_on_ampere_leaves_mode_pending_and_says_so() {
    let f = fixture("p4d.24xlarge", &[]);
    let layout = "version: v1\nmig-configs:\n  on:\n    - devices: [7]\n      mig-enabled: true\n      mig-devices: {\"7g.40gb\": 1}\n";
    let r = f
        .service
        .mig_apply(&MigApplyParams {
            layout: layout.into(),
            config: "on".into(),
            dry_run: false,
        })
        .unwrap();
    assert!(
        r.gpus[0].note.as_deref().unwrap_or("").contains("reset"),
        "{r:?}"
    );
    let mode = f.backend.mig_mode(&uuid_of(&f, "gpu-7")).unwrap();
    assert!(!mode.current && mode.pending);
    // After the operator's reset, applying again creates the instance.
    f.backend.reset(&uuid_of(&f, "gpu-7")).unwrap();
    f.service
        .mig_apply(&MigApplyParams {
            layout: layout.into(),
            config: "on".into(),
            dry_run: false,
        })
        .unwrap();
    assert_eq!(instances(&f, "gpu-7").len(), 1);
}

#[test]
fn instances_gpushare_did_not_make_are_kept_at_every_start() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes(
            &format!(
                "{}/../docs/examples/node-profile-mig.toml",
                env!("CARGO_MANIFEST_DIR")
            ),
            NODE,
            &dir.path().join("dev"),
        )
        .unwrap(),
    );
    let uuid = backend.find("gpu-0").unwrap().uuid.clone();
    assert_eq!(backend.mig_instances(&uuid).unwrap().len(), 3);
    let cfg = ServiceConfig::for_tests(dir.path(), NODE);
    let host = FakeHost::default();
    let first = start(&cfg, &host, &backend);
    assert_eq!(backend.mig_instances(&uuid).unwrap().len(), 3, "adopted");
    let listed = first
        .list_gpus()
        .into_iter()
        .find(|g| g.name == "gpu-0")
        .unwrap();
    assert_eq!(listed.mig_devices.len(), 3);
    assert!(listed.mig_devices.iter().all(|d| d.owner.is_none()));
    drop(first);
    // The 1g instance is destroyed and made again behind gpushare's back (same GI ID, new MIG
    // UUID): not gpushare's either, so the next start keeps it with the others.
    let one_g = backend
        .mig_instances(&uuid)
        .unwrap()
        .into_iter()
        .find(|i| i.profile.0 == 19)
        .unwrap();
    backend
        .destroy_compute_instance(&uuid, one_g.gi_id, 0)
        .unwrap();
    backend.destroy_gpu_instance(&uuid, one_g.gi_id).unwrap();
    let gi = backend
        .create_gpu_instance(&uuid, crate::mig::GiProfileId(19), 6)
        .unwrap();
    assert_eq!(gi, one_g.gi_id, "the driver reuses GI IDs");
    backend
        .create_compute_instance(&uuid, gi, crate::mig::CiProfileIndex(0))
        .unwrap();
    let _second = start(&cfg, &host, &backend);
    let left: Vec<u32> = backend
        .mig_instances(&uuid)
        .unwrap()
        .iter()
        .map(|i| i.profile.0)
        .collect();
    assert_eq!(
        left,
        [9, 14, 19],
        "gpushare made none of them: every one kept"
    );
}

#[test]
fn whole_gpu_claims_on_gpus_in_mig_mode() {
    // Ampere with MIG on: turning it off needs a reset.
    let f = fixture("p4d.24xlarge", &[1]);
    let e = f
        .service
        .prepare(&claim("w1", &["gpu-1"], None))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported, "{e}");
    assert_clean(&f, "w1");

    // Hopper: a MIG claim turned MIG mode on; while its slice exists a whole-GPU claim is a
    // Conflict naming it; once released, the whole-GPU claim turns MIG mode off.
    let f = fixture("p5.48xlarge", &[]);
    f.service
        .prepare(&claim("m1", &["gpu-6-mig-1g10gb-19-0"], None))
        .unwrap();
    let uuid = uuid_of(&f, "gpu-6");
    assert!(f.backend.mig_mode(&uuid).unwrap().current);
    f.service.unprepare("m1").unwrap();
    f.service.prepare(&claim("w2", &["gpu-6"], None)).unwrap();
    assert!(
        !f.backend.mig_mode(&uuid).unwrap().current,
        "MIG mode off again"
    );
    f.service.unprepare("w2").unwrap();

    // A slice of the node's layout (not a claim's) on the GPU: Conflict naming the layout.
    let gi = f
        .backend
        .create_gpu_instance(&uuid, crate::mig::GiProfileId(9), 0)
        .unwrap_err();
    assert!(
        matches!(gi, crate::gpu::GpuError::Unsupported(_)),
        "MIG is off: {gi}"
    );
    f.backend.set_mig_mode(&uuid, true).unwrap();
    f.backend
        .create_gpu_instance(&uuid, crate::mig::GiProfileId(9), 0)
        .unwrap();
    let e = f
        .service
        .prepare(&claim("w3", &["gpu-6"], None))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e}");
    assert!(e.message.contains("layout"), "{e}");
}

mod forged_intents;
mod intents;
mod mode;
mod reconcile;
mod static_mig;
mod upgrade;
mod views;
