//! MIG slices across gpushared restarts and behind its back: the simulated node keeps its MIG
//! state while gpushared is away, as hardware does; a slice that vanished (a GPU reset, an
//! administrator's destroy) is recreated at the claim's placement or the claim is Degraded;
//! a slice a claim records is never granted to another claim; a release destroys only the
//! instance whose identity matches the claim's record (GPU-instance IDs are reused).

use std::path::{Path, PathBuf};

use super::*;
use crate::gpu::MigInstance;
use crate::mig::{CiProfileIndex, GiProfileId};

/// The p4d.24xlarge whose gpu-2 is in MIG mode (`daemon/examples/profiles`).
fn p4d_mig2() -> String {
    format!(
        "{}/examples/profiles/p4d.24xlarge-mig2.toml",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A node that gpushared starts on again and again: every start builds its simulated GPUs
/// afresh over the node's directory, as `gpushared --simulate` does.
struct Node {
    dir: tempfile::TempDir,
    profile: String,
    cfg: ServiceConfig,
    host: FakeHost,
}

impl Node {
    /// `None` (after a note) without root: the simulated node makes real device nodes.
    fn new(profile: &str) -> Option<Node> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: the simulated node's device nodes need root (mknod)");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let cfg = ServiceConfig::for_tests(dir.path(), NODE);
        Some(Node {
            dir,
            profile: profile.to_string(),
            cfg,
            host: FakeHost::default(),
        })
    }

    fn dev(&self) -> PathBuf {
        self.dir.path().join("dev")
    }

    /// The node's GPUs as a new start of gpushared finds them.
    fn gpus(&self) -> Arc<SimulatedBackend> {
        Arc::new(SimulatedBackend::new(&self.profile, NODE, &self.dev()).unwrap())
    }

    /// gpushared starts (again): new simulated GPUs over the node's directory, a new service.
    fn start(&self) -> (Arc<SimulatedBackend>, Service) {
        let backend = self.gpus();
        let service = start(&self.cfg, &self.host, &backend);
        (backend, service)
    }

    /// The simulated node's switch: these GPUs are reset before gpushared's next start.
    fn reset_before_next_start(&self, gpus: &str) {
        std::fs::create_dir_all(self.dev()).unwrap();
        std::fs::write(self.dev().join("reset-gpus"), gpus).unwrap();
    }
}

fn gpu_uuid(b: &SimulatedBackend, name: &str) -> String {
    b.find(name).unwrap().uuid.clone()
}

fn live(b: &SimulatedBackend, gpu: &str) -> Vec<MigInstance> {
    b.mig_instances(&gpu_uuid(b, gpu)).unwrap()
}

fn slice(s: &Service, uid: &str) -> MigInstanceInfo {
    s.get_claim(uid).unwrap().groups[0].mig[0].clone()
}

/// The `/dev/nvidia-caps/…` paths in a claim's CDI spec.
fn cap_paths(cfg: &ServiceConfig, uid: &str) -> Vec<String> {
    let spec: Value =
        serde_json::from_slice(&std::fs::read(cdi::spec_path(&cfg.cdi_dir, uid)).unwrap()).unwrap();
    spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap().to_string())
        .filter(|p| p.starts_with("/dev/nvidia-caps/"))
        .collect()
}

fn caps_of(minor: u32, m: &MigInstanceInfo) -> Vec<String> {
    vec![
        format!(
            "/dev/nvidia-caps/nvidia-cap{}",
            crate::gpu::mig_cap_minor(minor, m.gi_id, None)
        ),
        format!(
            "/dev/nvidia-caps/nvidia-cap{}",
            crate::gpu::mig_cap_minor(minor, m.gi_id, m.ci_id)
        ),
    ]
}

/// An administrator's `nvidia-smi mig -dci` and `-dgi` of every instance at `start`.
fn destroy_by_hand(b: &SimulatedBackend, gpu: &str, start: u32) {
    let uuid = gpu_uuid(b, gpu);
    for i in live(b, gpu)
        .into_iter()
        .filter(|i| i.placement.start == start)
    {
        if let Some(ci) = i.compute {
            b.destroy_compute_instance(&uuid, i.gi_id, ci.ci_id)
                .unwrap();
        }
        b.destroy_gpu_instance(&uuid, i.gi_id).unwrap();
    }
}

use gpushare_proto::MigInstanceInfo;

#[test]
fn a_restart_keeps_the_slice_and_never_grants_it_to_a_second_claim() {
    // Hopper: a prepare turns MIG mode on itself, so a GPU that lost its state looks free.
    let Some(node) = Node::new("p5.48xlarge") else {
        return;
    };
    let (b1, s1) = node.start();
    s1.prepare(&claim("first", &["gpu-1-mig-3g40gb-9-4"], None))
        .unwrap();
    let before = slice(&s1, "first");
    drop(s1);

    let (b2, s2) = node.start();
    let now = live(&b2, "gpu-1");
    assert_eq!(now.len(), 1, "the instance outlives gpushared: {now:?}");
    assert_eq!(
        (
            now[0].gi_id,
            now[0].compute.as_ref().map(|c| c.uuid.clone())
        ),
        (before.gi_id, Some(before.uuid.clone()))
    );
    let second = s2.prepare(&claim("second", &["gpu-1-mig-3g40gb-9-4"], None));
    assert_eq!(
        second.as_ref().err().map(|e| e.code),
        Some(ErrorCode::Conflict),
        "one slice granted to two claims: {second:?}"
    );
    assert_eq!(s2.get_claim("first").unwrap().state, ClaimState::Prepared);
    assert_eq!(slice(&s2, "first"), before, "nothing recreated");
    s2.unprepare("first").unwrap();
    assert!(live(&b2, "gpu-1").is_empty());
    drop(b1);
}

#[test]
fn a_slice_whose_instance_vanished_under_a_running_daemon_is_not_granted_again() {
    let f = fixture("p4d.24xlarge", &[2]);
    f.service
        .prepare(&claim("holder", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    destroy_by_hand(&f.backend, "gpu-2", 4);
    assert!(instances(&f, "gpu-2").is_empty());

    // The holder's record still counts: the same slice, or one overlapping it, is refused.
    for (uid, dev) in [
        ("taker", "gpu-2-mig-3g20gb-9-4"),
        ("overlap", "gpu-2-mig-1g5gb-19-5"),
    ] {
        let e = f.service.prepare(&claim(uid, &[dev], None)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Conflict, "{dev}: {e}");
        assert!(e.message.contains("holder"), "{e}");
        assert_clean(&f, uid);
    }
    // The short form takes the placement nobody records.
    f.service
        .prepare(&claim("short", &["gpu-2"], Some(short_mig("3g.20gb"))))
        .unwrap();
    assert_eq!(
        f.service.get_claim("short").unwrap().groups[0].devices[0].device,
        "gpu-2-mig-3g20gb-9-0"
    );
    assert_eq!(
        code(
            f.service
                .prepare(&claim("short2", &["gpu-2"], Some(short_mig("3g.20gb"))))
        ),
        ErrorCode::Conflict
    );
    // Released, the slice can be had again.
    f.service.unprepare("holder").unwrap();
    f.service
        .prepare(&claim("taker", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    f.service.unprepare("taker").unwrap();
    f.service.unprepare("short").unwrap();
    assert!(instances(&f, "gpu-2").is_empty());
}

#[test]
fn a_release_destroys_only_the_instance_whose_identity_matches_the_record() {
    let f = fixture("p4d.24xlarge", &[2]);
    let uuid = uuid_of(&f, "gpu-2");
    f.service
        .prepare(&claim("mine", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    let mine = slice(&f.service, "mine");

    // Destroyed by hand and a GPU instance made again at the same placement: the driver
    // reuses the GI ID, and the new one has no compute instance yet (an operator half-way).
    destroy_by_hand(&f.backend, "gpu-2", 4);
    let gi = f
        .backend
        .create_gpu_instance(&uuid, GiProfileId(9), 4)
        .unwrap();
    assert_eq!(gi, mine.gi_id, "GI IDs are reused");
    f.service.unprepare("mine").unwrap();
    assert_eq!(instances(&f, "gpu-2").len(), 1, "not the claim's: kept");

    // With a compute instance (a new MIG UUID) too: kept.
    f.backend
        .create_compute_instance(&uuid, gi, CiProfileIndex(2))
        .unwrap();
    f.service
        .prepare(&claim("again", &["gpu-2-mig-3g20gb-9-0"], None))
        .unwrap();
    let again = slice(&f.service, "again");
    destroy_by_hand(&f.backend, "gpu-2", 0);
    let gi0 = f
        .backend
        .create_gpu_instance(&uuid, GiProfileId(9), 0)
        .unwrap();
    assert_eq!(gi0, again.gi_id);
    let ci = f
        .backend
        .create_compute_instance(&uuid, gi0, CiProfileIndex(2))
        .unwrap();
    assert_ne!(ci.uuid, again.uuid);
    f.service.unprepare("again").unwrap();
    assert_eq!(instances(&f, "gpu-2").len(), 2, "neither is a claim's");
}

/// Review finding (issue 28): an MPS control daemon that does not start on the slices a
/// start made again is the daemon's cause, restarted with backoff on the new slices, and the
/// claim heals once it runs; recorded as a lost slice it stayed `Degraded`.
#[test]
fn a_daemon_that_cannot_start_on_remade_slices_is_restarted_and_the_claim_heals() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (_b1, s1) = node.start();
    let mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    s1.prepare(&claim("m", &["gpu-2-mig-3g20gb-9-0"], Some(mps)))
        .unwrap();
    drop(s1);
    node.reset_before_next_start("gpu-2\n");
    node.host.state().fail_start = true;
    let (_b2, s2) = node.start();
    let c = s2.get_claim("m").unwrap();
    assert_eq!(c.state, ClaimState::Degraded);
    let why = c.last_error.clone().unwrap_or_default();
    assert!(
        why.contains("restarting the MPS control daemon failed")
            && !why.contains("could not be recreated"),
        "{why}"
    );
    let due = s2.next_restart().expect("a restart is scheduled");
    node.host.state().fail_start = false;
    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    s2.run_due_restarts();
    let c = s2.get_claim("m").unwrap();
    assert_eq!(c.state, ClaimState::Prepared, "{:?}", c.last_error);
    let StrategyInfo::Mps(m) = &c.groups[0].sharing else {
        panic!("not MPS")
    };
    assert_eq!(
        m.visible_devices,
        vec![slice(&s2, "m").uuid],
        "on the new slice"
    );
    s2.unprepare("m").unwrap();
}

#[test]
fn vanished_slices_are_recreated_at_their_placements_with_cdi_and_mps_following() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (_b1, s1) = node.start();
    // Prepared in this order the slice at 0 gets GPU instance 1 and the one at 4 gets 2; the
    // reconcile goes by claim UID, so after the reset the IDs swap.
    let mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    s1.prepare(&claim("b-low", &["gpu-2-mig-3g20gb-9-0"], Some(mps)))
        .unwrap();
    s1.prepare(&claim("a-high", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    let (old_low, old_high) = (slice(&s1, "b-low"), slice(&s1, "a-high"));
    assert_eq!((old_low.gi_id, old_high.gi_id), (1, 2));
    assert_eq!(cap_paths(&node.cfg, "a-high"), caps_of(2, &old_high));
    let StrategyInfo::Mps(old_mps) = s1.get_claim("b-low").unwrap().groups[0].sharing.clone()
    else {
        panic!("not MPS")
    };
    drop(s1);

    node.reset_before_next_start("gpu-2\n");
    let (b2, s2) = node.start();
    assert!(
        !node.dev().join("reset-gpus").exists(),
        "the switch acts once"
    );
    let now = live(&b2, "gpu-2");
    assert_eq!(now.len(), 2, "{now:?}");
    for (uid, old, start) in [("a-high", &old_high, 4), ("b-low", &old_low, 0)] {
        let c = s2.get_claim(uid).unwrap();
        assert_eq!(c.state, ClaimState::Prepared, "{uid}: {:?}", c.last_error);
        let new = slice(&s2, uid);
        assert_eq!(
            (new.placement_start, new.device.as_str()),
            (start, old.device.as_str())
        );
        assert_ne!(
            new.uuid, old.uuid,
            "{uid}: a new instance has a new MIG UUID"
        );
        let inst = now.iter().find(|i| i.placement.start == start).unwrap();
        assert_eq!(inst.gi_id, new.gi_id);
        assert_eq!(inst.compute.as_ref().unwrap().uuid, new.uuid);
        assert_eq!(
            cap_paths(&node.cfg, uid),
            caps_of(2, &new),
            "{uid}: CDI spec"
        );
    }
    assert_eq!(slice(&s2, "a-high").gi_id, 1);
    assert_eq!(slice(&s2, "b-low").gi_id, 2);
    // The slice's MPS control daemon runs on the new MIG device, with its limits.
    let c = s2.get_claim("b-low").unwrap();
    let StrategyInfo::Mps(m) = &c.groups[0].sharing else {
        panic!("not MPS")
    };
    let new_uuid = slice(&s2, "b-low").uuid;
    assert_eq!(m.visible_devices, vec![new_uuid.clone()]);
    assert_ne!(m.control_daemon_pid, old_mps.control_daemon_pid);
    {
        let st = node.host.state();
        let d = &st.daemons[Path::new(&m.pipe_dir)];
        assert!(d.alive);
        assert_eq!(d.env["CUDA_VISIBLE_DEVICES"], new_uuid);
    }
    assert_eq!(m.active_thread_percentage, "40.0");
    // The host record (what a lost checkpoint is rebuilt from) has the new instance too.
    let record: ClaimInfo = serde_json::from_slice(
        &std::fs::read(node.cfg.run_dir.join("claims/a-high/claim.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record.groups[0].mig[0], slice(&s2, "a-high"));

    // Another start finds them as they are: nothing recreated.
    drop(s2);
    let (b3, s3) = node.start();
    assert_eq!(slice(&s3, "a-high"), c_slice(&b3, "a-high", &s3));
    s3.unprepare("a-high").unwrap();
    s3.unprepare("b-low").unwrap();
    assert!(live(&b3, "gpu-2").is_empty());
}

/// The claim's recorded slice, checked to be the live one.
fn c_slice(b: &SimulatedBackend, uid: &str, s: &Service) -> MigInstanceInfo {
    let rec = slice(s, uid);
    let inst = live(b, "gpu-2")
        .into_iter()
        .find(|i| i.gi_id == rec.gi_id)
        .unwrap();
    assert_eq!(inst.compute.unwrap().uuid, rec.uuid);
    rec
}

#[test]
fn a_slice_that_cannot_be_recreated_leaves_the_claim_degraded_with_the_reason() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (b1, s1) = node.start();
    s1.prepare(&claim("held", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    drop(s1);
    // While gpushared is away an operator destroys the slice, turns MIG mode off (pending
    // on this A100) and resets the GPU.
    destroy_by_hand(&b1, "gpu-2", 4);
    b1.set_mig_mode(&gpu_uuid(&b1, "gpu-2"), false).unwrap();
    node.reset_before_next_start("gpu-2\n");
    let (b2, s2) = node.start();
    assert!(!b2.mig_mode(&gpu_uuid(&b2, "gpu-2")).unwrap().current);
    let c = s2.get_claim("held").unwrap();
    assert_eq!(c.state, ClaimState::Degraded);
    let why = c.last_error.clone().unwrap();
    assert!(
        why.contains("gpu-2-mig-3g20gb-9-4") && why.contains("MIG mode"),
        "{why}"
    );
    assert_eq!(s2.health().degraded_claims, 1);
    // New containers are refused with the reason; the release still works.
    let e = s2
        .attach(&AttachParams {
            claim_uid: "held".into(),
            container_id: "c1".into(),
            pid: None,
            bundle: None,
            pod: None,
        })
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotReady);
    assert!(e.message.contains("gpu-2-mig-3g20gb-9-4"), "{e}");
    assert!(!e.message.contains("MPS control daemon"), "{e}");
    s2.unprepare("held").unwrap();
}

#[test]
fn a_slice_whose_placement_was_taken_while_away_leaves_the_claim_degraded() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (_b1, s1) = node.start();
    s1.prepare(&claim("held", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    drop(s1);
    // A reboot: the GPU is reset, a layout tool (mig-parted at boot) creates a 1g.5gb at
    // memory slice 5: not gpushare's making, so it is kept.
    node.reset_before_next_start("gpu-2\n");
    let b2 = node.gpus();
    let uuid = gpu_uuid(&b2, "gpu-2");
    let gi = b2.create_gpu_instance(&uuid, GiProfileId(19), 5).unwrap();
    b2.create_compute_instance(&uuid, gi, CiProfileIndex(0))
        .unwrap();
    let mps = MpsControl::new(
        "/usr/bin/nvidia-cuda-mps-control".into(),
        node.host.ops(),
        Duration::from_millis(200),
    );
    let s2 = Service::with_boot_id(
        node.cfg.clone(),
        Arc::clone(&b2) as Arc<dyn GpuBackend>,
        mps,
        "another-boot".into(),
    )
    .unwrap();
    let c = s2.get_claim("held").unwrap();
    assert_eq!(c.state, ClaimState::Degraded);
    let why = c.last_error.unwrap();
    assert!(why.contains("1g.5gb") && why.contains("5:1"), "{why}");
    assert_eq!(live(&b2, "gpu-2").len(), 1, "the layout's instance is kept");
    // The claim's placement is still its own: nobody else gets it.
    assert_eq!(
        code(s2.prepare(&claim("taker", &["gpu-2-mig-3g20gb-9-4"], None))),
        ErrorCode::Conflict
    );
    s2.prepare(&claim("other", &["gpu-2-mig-3g20gb-9-0"], None))
        .unwrap();
    s2.unprepare("held").unwrap();
    assert_eq!(
        live(&b2, "gpu-2").len(),
        2,
        "the layout's instance is not the claim's"
    );
    s2.unprepare("other").unwrap();
}

/// The simulated toolkit, counting its generations.
#[derive(Debug)]
struct Counted {
    inner: crate::driver_spec::sim::SimulatedToolkit,
    runs: std::sync::atomic::AtomicUsize,
}

impl crate::driver_spec::SpecGenerator for Counted {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn generate(
        &self,
        vendor: &str,
        class: &str,
        output: &Path,
    ) -> Result<(), crate::driver_spec::GenerateError> {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.generate(vendor, class, output)
    }
}

/// gpushared starts on `node` with the driver's CDI spec made by the simulated toolkit over
/// the GPUs of that start.
fn start_with_driver_spec(node: &Node) -> (Arc<SimulatedBackend>, Service) {
    let (backend, service, _) = start_counting_generations(node);
    (backend, service)
}

/// The same, with the generator's count of runs.
fn start_counting_generations(node: &Node) -> (Arc<SimulatedBackend>, Service, Arc<Counted>) {
    use crate::driver_spec::{sim::SimulatedToolkit, DriverSpecs, DEFAULT_KIND};
    let backend = node.gpus();
    let driver_root = node.dir.path().join("driver");
    std::fs::create_dir_all(driver_root.join("tmp/nvidia-mps")).unwrap();
    let generator = Arc::new(Counted {
        inner: SimulatedToolkit::new(Arc::clone(&backend) as Arc<dyn GpuBackend>, &driver_root),
        runs: Default::default(),
    });
    let mut cfg = node.cfg.clone();
    cfg.driver_spec = Some(Arc::new(
        DriverSpecs::new(
            Arc::clone(&generator) as Arc<dyn crate::driver_spec::SpecGenerator>,
            DEFAULT_KIND,
            &cfg.cdi_dir,
            &cfg.run_dir.join("driver-spec"),
        )
        .unwrap(),
    ));
    let service = start(&cfg, &node.host, &backend);
    (backend, service, generator)
}

/// Every CDI device ID a claim hands out, in the flat list and per device.
fn handed_out(c: &ClaimInfo) -> Vec<String> {
    c.requests
        .iter()
        .flat_map(|r| {
            r.cdi_device_ids
                .iter()
                .chain(r.per_device.iter().flat_map(|d| d.cdi_device_ids.iter()))
        })
        .cloned()
        .collect()
}

#[test]
fn a_recreated_slice_keeps_the_driver_cdi_ids_handed_out_across_restarts() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (_b1, s1) = start_with_driver_spec(&node);
    s1.prepare(&claim("m", &["gpu-2-mig-3g20gb-9-0"], None))
        .unwrap();
    let old = slice(&s1, "m");
    let old_id = format!("gpushare.io/gpu={}", old.uuid);
    assert!(
        handed_out(&s1.get_claim("m").unwrap()).contains(&old_id),
        "the driver spec's MIG device"
    );
    drop(s1);

    node.reset_before_next_start("gpu-2\n");
    let (_b2, s2) = start_with_driver_spec(&node);
    let c = s2.get_claim("m").unwrap();
    assert_eq!(c.state, ClaimState::Prepared, "{:?}", c.last_error);
    let new = slice(&s2, "m");
    assert_ne!(new.uuid, old.uuid);
    // Kubelet keeps the IDs it was handed: they stay the claim's, the driver's spec keeping
    // the old name for the new instance (driver_spec::alias).
    let ids = handed_out(&c);
    assert!(ids.contains(&old_id), "{ids:?}");
    assert!(!ids.iter().any(|i| i.contains(&new.uuid)), "{ids:?}");
    assert_eq!(new.original_uuid, old.uuid);
    // A retried prepare (the kubelet's, after its own restart) answers the same IDs.
    let again = s2
        .prepare(&claim("m", &["gpu-2-mig-3g20gb-9-0"], None))
        .unwrap();
    assert_eq!(again.requests, c.requests);
    drop(s2);

    // The next start finds the claim as it was left: its record names only devices it holds.
    let (b3, s3) = start_with_driver_spec(&node);
    let c = s3
        .get_claim("m")
        .expect("the claim is not quarantined at the next start");
    assert_eq!(c.state, ClaimState::Prepared, "{:?}", c.last_error);
    assert_eq!(slice(&s3, "m"), new);
    assert_eq!(live(&b3, "gpu-2").len(), 1, "the slice is kept");
    s3.unprepare("m").unwrap();
    assert!(live(&b3, "gpu-2").is_empty());
}

/// A start that makes the slices of several claims again generates the driver's spec once,
/// with every claim's alias: not once per claim (each run of `nvidia-ctk` may take its whole
/// `generate_timeout_seconds`, and the socket exists only after the start).
#[test]
fn a_start_recreating_several_claims_slices_generates_the_driver_spec_once() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let uids = ["m0", "m1", "m2", "m3"];
    let (_b1, s1) = start_with_driver_spec(&node);
    let mut before = Vec::new();
    for (i, uid) in uids.iter().enumerate() {
        let device = format!("gpu-2-mig-1g5gb-19-{i}");
        s1.prepare(&claim(uid, &[device.as_str()], None)).unwrap();
        before.push(s1.get_claim(uid).unwrap());
    }
    drop(s1);

    node.reset_before_next_start("gpu-2\n");
    let (b2, s2, generator) = start_counting_generations(&node);
    assert_eq!(
        generator.runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one generation at start, whatever the number of claims whose slices were made again"
    );
    assert_eq!(live(&b2, "gpu-2").len(), uids.len());
    let spec =
        gpushare_cdi::load_spec_file(&s2.cfg.driver_spec.as_ref().unwrap().spec_path()).unwrap();
    for (uid, old) in uids.iter().zip(&before) {
        let c = s2.get_claim(uid).unwrap();
        assert_eq!(c.state, ClaimState::Prepared, "{uid}: {:?}", c.last_error);
        assert_eq!(c.requests, old.requests, "{uid}: the IDs handed out stay");
        let new = slice(&s2, uid);
        assert_ne!(new.uuid, old.groups[0].mig[0].uuid, "{uid}");
        assert!(
            spec.devices.iter().any(|d| d.name == new.original_uuid),
            "{uid}: the alias {} is in the spec",
            new.original_uuid
        );
    }
    for uid in uids {
        s2.unprepare(uid).unwrap();
    }
    assert!(live(&b2, "gpu-2").is_empty());
}

/// A MIG prepare runs one generation of the driver's spec, for its new slice: also when the
/// spec's file was deleted (its check before making the slice generated it first, and a
/// prepare then waited on two generations).
#[test]
fn a_mig_prepare_runs_one_generation_even_when_the_spec_file_is_gone() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (b, s, generator) = start_counting_generations(&node);
    let runs = || generator.runs.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(runs(), 1, "at start");
    s.prepare(&claim("a", &["gpu-2-mig-1g5gb-19-0"], None))
        .unwrap();
    assert_eq!(runs(), 2, "for the new slice");
    let path = s.cfg.driver_spec.as_ref().unwrap().spec_path();
    std::fs::remove_file(&path).unwrap();
    s.prepare(&claim("b", &["gpu-2-mig-1g5gb-19-1"], None))
        .unwrap();
    assert_eq!(runs(), 3, "one generation for the prepare");
    let spec = gpushare_cdi::load_spec_file(&path).unwrap();
    let uuid = slice(&s, "b").uuid;
    assert!(spec.devices.iter().any(|d| d.name == uuid));
    for uid in ["a", "b"] {
        s.unprepare(uid).unwrap();
    }
    assert!(live(&b, "gpu-2").is_empty());
}

/// A reboot: the GPUs' MIG instances are gone (MIG mode stays, as on hardware), so are every
/// process, mount, the run directory and the CDI specs; gpushared starts under a new boot ID.
#[test]
fn after_a_reboot_mig_slices_of_prepared_claims_are_made_again_before_ready() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (_b1, s1) = node.start();
    let mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    s1.prepare(&claim("with-mps", &["gpu-2-mig-3g20gb-9-0"], Some(mps)))
        .unwrap();
    s1.prepare(&claim("plain", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    let before = [slice(&s1, "with-mps"), slice(&s1, "plain")];
    drop(s1);

    node.reset_before_next_start("all\n");
    {
        let mut st = node.host.state();
        for d in st.daemons.values_mut() {
            d.alive = false;
        }
        st.mounts.clear();
    }
    std::fs::remove_dir_all(&node.cfg.run_dir).unwrap();
    std::fs::remove_dir_all(&node.cfg.cdi_dir).unwrap();
    let backend = node.gpus();
    let mpsc = MpsControl::new(
        "/usr/bin/nvidia-cuda-mps-control".into(),
        node.host.ops(),
        Duration::from_millis(200),
    );
    let s2 = Service::with_boot_id(
        node.cfg.clone(),
        Arc::clone(&backend) as Arc<dyn GpuBackend>,
        mpsc,
        "a-boot-after-the-reboot".into(),
    )
    .unwrap();
    // Ready (the constructor returned) with every slice there again.
    assert!(s2.health().ready);
    let now = live(&backend, "gpu-2");
    assert_eq!(now.len(), 2, "{now:?}");
    for (uid, old) in ["with-mps", "plain"].iter().zip(&before) {
        let c = s2.get_claim(uid).unwrap();
        assert_eq!(c.state, ClaimState::Prepared, "{uid}: {:?}", c.last_error);
        let new = slice(&s2, uid);
        assert_eq!(
            (new.placement_start, new.memory_slices, &new.profile),
            (old.placement_start, old.memory_slices, &old.profile),
            "{uid}: same profile and placement"
        );
        assert_ne!(new.uuid, old.uuid, "{uid}: a new MIG UUID");
        assert!(
            Path::new(&c.cdi_spec).is_file(),
            "{uid}: CDI spec rewritten"
        );
        assert_eq!(cap_paths(&node.cfg, uid), caps_of(2, &new), "{uid}");
    }
    let c = s2.get_claim("with-mps").unwrap();
    let StrategyInfo::Mps(m) = &c.groups[0].sharing else {
        panic!("not MPS")
    };
    assert_eq!(m.visible_devices, vec![slice(&s2, "with-mps").uuid]);
    assert_eq!(m.active_thread_percentage, "40.0");
    assert!(node.host.state().daemons[Path::new(&m.pipe_dir)].alive);
    assert_eq!(c.restarts, 0, "a reboot is not a crash");
    s2.unprepare("with-mps").unwrap();
    s2.unprepare("plain").unwrap();
    assert!(live(&backend, "gpu-2").is_empty());
}

/// Writes `owner`'s host record again as claim `copy`'s, in `state`: a record that is not
/// its own, naming another claim's MIG slice.
fn copy_host_record(node: &Node, owner: &str, copy: &str, state: &str) {
    let claims = node.cfg.run_dir.join("claims");
    let text = std::fs::read_to_string(claims.join(owner).join("claim.json")).unwrap();
    let text = text
        .replace(owner, copy)
        .replace("\"Prepared\"", &format!("{state:?}"));
    assert!(text.contains(state), "{text}");
    std::fs::create_dir_all(claims.join(copy)).unwrap();
    std::fs::write(claims.join(copy).join("claim.json"), text).unwrap();
}

#[test]
fn a_record_naming_another_claim_s_mig_slice_is_refused_and_never_releases_it() {
    let Some(node) = Node::new(&p4d_mig2()) else {
        return;
    };
    let (_b1, s1) = node.start();
    s1.prepare(&claim("owner", &["gpu-2-mig-3g20gb-9-0"], None))
        .unwrap();
    let slice0 = slice(&s1, "owner");
    drop(s1);
    for (copy, state) in [
        ("copy-releasing", "Unpreparing"),
        ("copy-prepared", "Prepared"),
    ] {
        copy_host_record(&node, "owner", copy, state);
        let (b, s) = node.start();
        assert!(s.get_claim(copy).is_err(), "{copy}: refused");
        let c = s.get_claim("owner").unwrap();
        assert_eq!(c.state, ClaimState::Prepared, "{:?}", c.last_error);
        assert_eq!(
            slice(&s, "owner"),
            slice0,
            "{copy}: the owner's slice untouched"
        );
        assert_eq!(c_slice(&b, "owner", &s), slice0);
        let shown = s.health().quarantined_records;
        assert!(
            shown
                .iter()
                .any(|l| l.contains(copy) && l.contains("\"owner\"")),
            "{copy}: refused and shown naming the other claim: {shown:#?}"
        );
        drop(s);
    }
    let (b, s) = node.start();
    s.unprepare("owner").unwrap();
    assert!(live(&b, "gpu-2").is_empty());
}
