//! Each strategy's group on a simulated node and the fake host, with a recorder standing in for
//! the claim's record: what apply makes and records, in which order, and what a release read
//! from the record alone undoes.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpushare_proto::{ErrorCode, TimeSliceInterval};

use super::*;
use crate::claim::{Device, Group, MigSharing, MpsDaemon, Sharing};
use crate::gpu::{SimFault, SimulatedBackend};
use crate::strategy::mig::{self, Claimed, MigGroup};
use crate::strategy::mps::{self, MpsDirs, MpsGroup, MpsLaunch};
use crate::strategy::{life_of, Exclusive, TimeSlicing};
use crate::sys::fake::FakeHost;

/// What a group's strategy did to its record and the intents, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Reserved(String),
    /// The intent marked as turning MIG mode on, before it is.
    ModeOn(String),
    /// The intent marked with the GPU-instance ID.
    Marked(u32),
    /// An MPS control daemon recorded as started.
    Mps(MpsDaemon),
    /// Recorded on disk (a GPU instance just made).
    Saved(MigSlice),
    Mig(MigSlice),
    Destroying(MigSlice),
}

#[derive(Default)]
struct Recorder(Mutex<Vec<Seen>>);

impl Recorder {
    fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }
    fn push(&self, s: Seen) {
        self.0.lock().unwrap().push(s);
    }
}

impl GroupRecorder for Recorder {
    fn mps(&self, mps: &MpsDaemon) {
        self.push(Seen::Mps(mps.clone()));
    }
    fn mig_made(&self, rec: &MigSlice) -> Result<(), ServiceError> {
        self.push(Seen::Saved(rec.clone()));
        Ok(())
    }
    fn mig(&self, rec: &MigSlice) {
        self.push(Seen::Mig(rec.clone()));
    }
    fn mig_destroying(&self, rec: &MigSlice) -> Result<(), ServiceError> {
        self.push(Seen::Destroying(rec.clone()));
        Ok(())
    }
}

impl SliceIntents for Recorder {
    fn reserve(&self, target: &MigTarget) -> Result<MigTarget, ServiceError> {
        self.push(Seen::Reserved(target.device.clone()));
        Ok(target.clone())
    }
    fn made(&self, rec: &MigSlice) {
        self.push(Seen::Marked(rec.gi_id));
    }
    fn entering_mig_mode(&self, target: &MigTarget) -> Result<(), ServiceError> {
        self.push(Seen::ModeOn(target.device.clone()));
        Ok(())
    }
}

struct Node {
    _dir: tempfile::TempDir,
    claim_dir: std::path::PathBuf,
    backend: Arc<SimulatedBackend>,
    host: FakeHost,
    mps: MpsControl,
    record: Recorder,
}

impl Node {
    /// A p4d.24xlarge with gpu-2 in MIG mode (an A100 enters it only through a reset).
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let backend = Arc::new(
            SimulatedBackend::without_device_nodes("p4d.24xlarge", "node-a", Path::new("/x"))
                .unwrap(),
        );
        let uuid = backend.find("gpu-2").unwrap().uuid.clone();
        backend.set_mig_mode(&uuid, true).unwrap();
        backend.reset(&uuid).unwrap();
        let host = FakeHost::default();
        let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(200));
        Node {
            claim_dir: dir.path().join("claims/c1"),
            _dir: dir,
            backend,
            host,
            mps,
            record: Recorder::default(),
        }
    }

    fn fx(&self) -> GroupEffects<'_> {
        GroupEffects {
            uid: "c1",
            backend: self.backend.as_ref(),
            mps: &self.mps,
            record: &self.record,
            intents: &self.record,
        }
    }

    fn launch(&self, keys: &[String]) -> MpsLaunch {
        let settings = crate::config::MpsSettings {
            active_thread_percentage: Some(40),
            ..Default::default()
        };
        mps::plan_launch(
            "c1",
            &self.claim_dir,
            keys,
            &["gpu".into()],
            &settings,
            1 << 20,
        )
        .unwrap()
    }

    fn mig_target(&self, device: &str) -> MigTarget {
        mig::resolve(
            self.backend.as_ref(),
            "gpu",
            device,
            None,
            &Claimed::default(),
            &[],
        )
        .unwrap()
    }

    fn daemons(&self) -> usize {
        self.host
            .state()
            .daemons
            .values()
            .filter(|d| d.alive)
            .count()
    }
}

/// The record a prepare writes of a group, as the service builds it from `applied`.
fn record(devices: Vec<Device>, applied: Applied) -> Group {
    Group {
        requests: vec!["gpu".into()],
        devices,
        sharing: applied.sharing,
    }
}

fn device(name: &str, uuid: &str) -> Device {
    Device {
        request: "gpu".into(),
        device: name.into(),
        uuid: uuid.into(),
        minor: 0,
    }
}

#[test]
fn exclusive_and_time_slicing_groups_make_and_release_nothing() {
    let node = Node::new();
    let ts = TimeSlicing {
        interval: TimeSliceInterval::Short,
    };
    for (g, sharing) in [
        (&Exclusive as &dyn GroupStrategy, Sharing::Exclusive),
        (
            &ts,
            Sharing::TimeSlicing {
                interval: TimeSliceInterval::Short,
            },
        ),
    ] {
        assert!(g.whole_gpu().is_some());
        assert_eq!(g.planned(), sharing);
        let applied = g.apply(&node.fx()).unwrap();
        assert_eq!(applied.sharing, sharing);
        let rec = record(vec![device("gpu-0", "GPU-x")], applied);
        life_of(&rec).stop(&node.fx(), &rec).unwrap();
        life_of(&rec).destroy(&node.fx(), &rec).unwrap();
    }
    assert_eq!(node.record.seen(), vec![]);
    assert!(node.host.state().calls.is_empty());
    // Only time-slicing changes the GPU, so only it has the crash point after its setting.
    assert!(ts.whole_gpu().unwrap().has_setting());
    assert!(!Exclusive.whole_gpu().unwrap().has_setting());
}

#[test]
fn an_mps_group_records_its_daemon_at_once_and_its_record_alone_stops_it() {
    let node = Node::new();
    let uuids = vec![node.backend.gpus()[0].uuid.clone()];
    let group = MpsGroup {
        launch: node.launch(&uuids),
    };
    assert!(group.whole_gpu().unwrap().has_setting());
    // Before it runs, the record holds the directories (what a rollback cleans) and pid 0.
    let Sharing::Mps(before) = group.planned() else {
        panic!("not MPS: {:?}", group.planned())
    };
    assert_eq!(before.control_daemon_pid, 0);
    assert_eq!(
        Path::new(&before.pipe_dir),
        MpsDirs::for_group(&node.claim_dir, &uuids).pipe
    );
    assert_eq!(before.visible_devices, uuids);
    assert_eq!(before.requested.active_thread_percentage, Some(40));

    let applied = group.apply(&node.fx()).unwrap();
    let Sharing::Mps(started) = &applied.sharing else {
        panic!("not MPS: {applied:?}")
    };
    assert!(started.control_daemon_pid > 0);
    assert_eq!(started.active_thread_percentage, "40.0");
    assert_eq!(node.record.seen(), vec![Seen::Mps(started.clone())]);
    assert_eq!(node.daemons(), 1);

    let rec = record(vec![device("gpu-0", &uuids[0])], applied);
    life_of(&rec).stop(&node.fx(), &rec).unwrap();
    life_of(&rec).destroy(&node.fx(), &rec).unwrap();
    assert_eq!(node.daemons(), 0);
    assert!(!Path::new(&before.pipe_dir).exists());
}

#[test]
fn an_mps_daemon_that_fails_to_start_is_not_recorded() {
    let node = Node::new();
    node.host.state().fail_start = true;
    let group = MpsGroup {
        launch: node.launch(&[node.backend.gpus()[0].uuid.clone()]),
    };
    let e = group.apply(&node.fx()).unwrap_err();
    assert_eq!(e.code, ErrorCode::Internal);
    assert!(e.message.starts_with("claim c1: "), "{}", e.message);
    assert_eq!(node.record.seen(), vec![]);
}

#[test]
fn a_mig_group_records_each_slice_as_it_is_made_then_its_daemon_on_the_mig_uuids() {
    let node = Node::new();
    let names = vec!["gpu-2-mig-3g20gb-9-4".to_string()];
    let target = node.mig_target(&names[0]);
    let gpu = target.gpu_uuid.clone();
    let group = MigGroup {
        targets: vec![target],
        mps: Some(MpsLaunch {
            visible_devices: Vec::new(),
            ..node.launch(&names)
        }),
    };
    assert!(group.whole_gpu().is_none());
    let Sharing::Mig(MigSharing {
        slices,
        mps: Some(before),
    }) = group.planned()
    else {
        panic!("not MIG with MPS: {:?}", group.planned())
    };
    assert!(slices.is_empty() && before.visible_devices.is_empty());

    let applied = group.apply(&node.fx()).unwrap();
    let Sharing::Mig(MigSharing {
        slices,
        mps: Some(started),
    }) = &applied.sharing
    else {
        panic!("not MIG with MPS: {applied:?}")
    };
    let made = &slices[0];
    assert!(
        made.ci_id.is_some() && made.uuid.starts_with("MIG-"),
        "{made:?}"
    );
    assert_eq!(started.visible_devices, vec![made.uuid.clone()]);
    // The intent, marked with the GI ID, then the GPU instance alone recorded on disk
    // (before its compute instance is asked for), then the whole slice, then the daemon.
    let seen = node.record.seen();
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert_eq!(seen[0], Seen::Reserved(names[0].clone()));
    assert_eq!(seen[1], Seen::Marked(made.gi_id));
    let Seen::Saved(partial) = &seen[2] else {
        panic!("{seen:?}")
    };
    assert_eq!((partial.gi_id, partial.ci_id), (made.gi_id, None));
    assert_eq!(seen[3], Seen::Mig(made.clone()));
    assert_eq!(seen[4], Seen::Mps(started.clone()));

    // Released from its record: the daemon first, then the slice it ran on, its destroy
    // recorded as begun before anything of it went.
    let rec = record(vec![device(&names[0], &gpu)], applied);
    life_of(&rec).stop(&node.fx(), &rec).unwrap();
    assert_eq!(node.daemons(), 0);
    assert_eq!(node.backend.mig_instances(&gpu).unwrap().len(), 1);
    life_of(&rec).destroy(&node.fx(), &rec).unwrap();
    assert!(node.backend.mig_instances(&gpu).unwrap().is_empty());
    assert_eq!(
        node.record.seen().last(),
        Some(&Seen::Destroying(rec.slices()[0].clone()))
    );
}

#[test]
fn a_gpu_instance_whose_record_cannot_be_written_is_destroyed_before_its_compute_instance() {
    // A record that is not on disk would leave nothing but the intent to say the instance is
    // ours, and an intent never vouches for a whole instance: no compute instance is made,
    // and the GPU instance goes.
    let node = Node::new();
    let target = node.mig_target("gpu-2-mig-3g20gb-9-4");
    let e = mig::create(
        node.backend.as_ref(),
        &target,
        || Ok(()),
        |_| Err(ServiceError::internal("No space left on device")),
    )
    .unwrap_err();
    assert!(e.message.contains("No space left"), "{e}");
    assert!(node
        .backend
        .mig_instances(&target.gpu_uuid)
        .unwrap()
        .is_empty());
}

#[test]
fn a_failed_compute_instance_leaves_its_gpu_instance_recorded_and_destroyed() {
    let node = Node::new();
    let target = node.mig_target("gpu-2-mig-3g20gb-9-4");
    let gpu = target.gpu_uuid.clone();
    node.backend.inject(SimFault::CreateComputeInstance);
    let group = MigGroup {
        targets: vec![target],
        mps: None,
    };
    assert_eq!(group.planned(), Sharing::Mig(MigSharing::default()));
    assert!(group.apply(&node.fx()).is_err());
    // The GPU instance was the claim's the moment it existed; the failed compute instance
    // took it with it, and no daemon was started.
    let seen = node.record.seen();
    assert!(
        matches!(&seen[..], [Seen::Reserved(_), Seen::Marked(_), Seen::Saved(m)] if m.ci_id.is_none()),
        "{seen:?}"
    );
    assert!(node.backend.mig_instances(&gpu).unwrap().is_empty());
    assert!(node.host.state().calls.is_empty());
}

#[test]
fn a_release_tries_every_slice_and_answers_with_the_first_failure() {
    let node = Node::new();
    let names = ["gpu-2-mig-3g20gb-9-0", "gpu-2-mig-3g20gb-9-4"];
    let targets: Vec<MigTarget> = names.iter().map(|n| node.mig_target(n)).collect();
    let gpu = targets[0].gpu_uuid.clone();
    let group = MigGroup { targets, mps: None };
    let applied = group.apply(&node.fx()).unwrap();
    assert!(
        matches!(&applied.sharing, Sharing::Mig(MigSharing { slices, mps: None }) if slices.len() == 2),
        "{applied:?}"
    );
    let rec = record(names.iter().map(|n| device(n, &gpu)).collect(), applied);
    node.backend.inject(SimFault::DestroyGpuInstance);
    let e = life_of(&rec).destroy(&node.fx(), &rec).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(
        e.message.starts_with("claim c1: gpu-2-mig-3g20gb-9-0"),
        "{}",
        e.message
    );
    // The second slice went all the same; the first is left for a retry.
    let live = node.backend.mig_instances(&gpu).unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].gi_id, rec.slices()[0].gi_id);
}
