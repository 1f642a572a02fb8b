//! Unit tests of `sim.rs`.

use super::*;
use crate::gpu::GpuBackend;
use crate::mig::CiProfileIndex;

#[test]
fn unknown_profile_lists_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let err = SimulatedBackend::new("p9.huge", "n", dir.path()).unwrap_err();
    assert!(err.to_string().contains("p4d.24xlarge"), "{err}");
}

fn root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipped: mknod needs root");
    }
    root
}

fn uuid(b: &SimulatedBackend, name: &str) -> String {
    b.find(name).unwrap().uuid.clone()
}

fn memory_node(profile: &str) -> SimulatedBackend {
    SimulatedBackend::without_device_nodes(profile, "node", Path::new("/x")).unwrap()
}

#[test]
fn taken_placements_are_insufficient_resources_and_bad_ones_invalid_as_on_hardware() {
    let b = memory_node("p5.48xlarge");
    let g = uuid(&b, "gpu-0");
    b.set_mig_mode(&g, true).unwrap();
    let three = b.create_gpu_instance(&g, GiProfileId(9), 4).unwrap();
    b.create_gpu_instance(&g, GiProfileId(5), 0).unwrap();
    // An occupied placement is INSUFFICIENT_RESOURCES, not ALREADY_EXISTS: the same
    // one, and one that overlaps it.
    for (profile, start) in [(9, 4), (19, 5), (14, 4), (0, 0)] {
        let e = b
            .create_gpu_instance(&g, GiProfileId(profile), start)
            .unwrap_err();
        assert!(
            matches!(e, GpuError::InsufficientResources(_)),
            "{profile}@{start}: {e:?}"
        );
    }
    // A profile's instance count: one +me a GPU.
    let g1 = uuid(&b, "gpu-1");
    b.set_mig_mode(&g1, true).unwrap();
    b.create_gpu_instance(&g1, GiProfileId(20), 0).unwrap();
    let e = b.create_gpu_instance(&g1, GiProfileId(20), 1).unwrap_err();
    assert!(matches!(e, GpuError::InsufficientResources(_)), "{e:?}");
    // A placement the profile never takes, a profile the GPU lacks: INVALID_ARGUMENT.
    for (profile, start) in [(9, 2), (3, 0)] {
        let e = b
            .create_gpu_instance(&g1, GiProfileId(profile), start)
            .unwrap_err();
        assert!(
            matches!(e, GpuError::InvalidArgument(_)),
            "{profile}@{start}: {e:?}"
        );
    }
    // Nothing changed by the refusals.
    let live: Vec<(u32, u32)> = b
        .mig_instances(&g)
        .unwrap()
        .iter()
        .map(|i| (i.profile.0, i.placement.start))
        .collect();
    assert_eq!(live.len(), 2);
    assert!(live.contains(&(9, 4)) && live.contains(&(5, 0)));
    // Freed, the memory slices can be had again.
    b.destroy_gpu_instance(&g, three).unwrap();
    b.create_gpu_instance(&g, GiProfileId(19), 5).unwrap();
}

#[test]
fn a_handle_another_client_holds_is_in_use_by_another_client() {
    let b = memory_node("p5.48xlarge");
    let g = uuid(&b, "gpu-3");
    b.set_mig_mode(&g, true).unwrap();
    let gi = b.create_gpu_instance(&g, GiProfileId(14), 2).unwrap();
    let ci = b
        .create_compute_instance(&g, gi, CiProfileIndex(1))
        .unwrap();
    assert!(matches!(
        b.open_handle(&g, Some(gi + 1)),
        Err(GpuError::NotFound(_))
    ));
    // A process on the MIG device: neither its compute nor its GPU instance goes.
    b.open_handle(&g, Some(gi)).unwrap();
    let busy = |r: Result<(), GpuError>| match r {
        Err(GpuError::Busy(m)) => assert!(m.contains("In use by another client"), "{m}"),
        other => panic!("not in use: {other:?}"),
    };
    busy(b.destroy_compute_instance(&g, gi, ci.ci_id));
    assert!(b.mig_instances(&g).unwrap()[0].compute.is_some());
    b.close_handle(&g, Some(gi)).unwrap();
    b.destroy_compute_instance(&g, gi, ci.ci_id).unwrap();
    b.open_handle(&g, Some(gi)).unwrap();
    busy(b.destroy_gpu_instance(&g, gi));
    assert_eq!(b.mig_instances(&g).unwrap().len(), 1);
    b.close_handle(&g, Some(gi)).unwrap();
    b.destroy_gpu_instance(&g, gi).unwrap();
    // An NVML client on the GPU (nvidia-smi, DCGM): no mode change, no reset; handles
    // on another GPU change nothing here.
    b.open_handle(&g, None).unwrap();
    b.open_handle(&g, None).unwrap();
    b.open_handle(&uuid(&b, "gpu-4"), None).unwrap();
    busy(b.set_mig_mode(&g, false).map(|_| ()));
    busy(b.reset(&g));
    assert!(b.mig_mode(&g).unwrap().current);
    b.close_handle(&g, None).unwrap();
    busy(b.set_mig_mode(&g, false).map(|_| ()));
    b.close_handle(&g, None).unwrap();
    assert!(!b.set_mig_mode(&g, false).unwrap().current);
    b.reset(&g).unwrap();
}

#[test]
fn mode_changes_that_need_a_reset_stay_pending_until_one() {
    // Ampere: the change waits for a reset, and no GPU instance can be made meanwhile.
    let b = memory_node("p4d.24xlarge");
    let g = uuid(&b, "gpu-0");
    assert_eq!(
        b.set_mig_mode(&g, true).unwrap(),
        MigMode {
            current: false,
            pending: true
        }
    );
    let e = b.create_gpu_instance(&g, GiProfileId(9), 0).unwrap_err();
    match e {
        GpuError::Unsupported(m) => assert!(m.contains("pending a GPU reset"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(b.mig_instances(&g).unwrap().is_empty());
    b.reset(&g).unwrap();
    assert!(b.mig_mode(&g).unwrap().current);
    let gi = b.create_gpu_instance(&g, GiProfileId(9), 0).unwrap();
    // Leaving MIG mode: refused while instances exist, then pending until a reset, which
    // takes the instances with it.
    assert!(matches!(b.set_mig_mode(&g, false), Err(GpuError::Busy(_))));
    b.destroy_gpu_instance(&g, gi).unwrap();
    assert_eq!(
        b.set_mig_mode(&g, false).unwrap(),
        MigMode {
            current: true,
            pending: false
        }
    );
    b.reset(&g).unwrap();
    assert_eq!(b.mig_mode(&g).unwrap(), MigMode::default());
    // Hopper: in effect at once, both ways.
    let b = memory_node("p5e.48xlarge");
    let g = uuid(&b, "gpu-0");
    assert_eq!(
        b.set_mig_mode(&g, true).unwrap(),
        MigMode {
            current: true,
            pending: true
        }
    );
    assert_eq!(b.set_mig_mode(&g, false).unwrap(), MigMode::default());
}

#[test]
fn mig_state_outlives_the_backend_as_hardware_does() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let b = SimulatedBackend::new("p5.48xlarge", "node", dir.path()).unwrap();
    let g = uuid(&b, "gpu-1");
    b.set_mig_mode(&g, true).unwrap();
    let gi = b.create_gpu_instance(&g, GiProfileId(9), 4).unwrap();
    let ci = b
        .create_compute_instance(&g, gi, CiProfileIndex(2))
        .unwrap();
    let half = b.create_gpu_instance(&g, GiProfileId(19), 0).unwrap();
    let before = b.mig_instances(&g).unwrap();
    drop(b);

    // gpushared starts again: a new backend over the same node directory.
    let b = SimulatedBackend::new("p5.48xlarge", "node", dir.path()).unwrap();
    assert_eq!(
        b.mig_mode(&g).unwrap(),
        MigMode {
            current: true,
            pending: true
        }
    );
    assert_eq!(b.mig_instances(&g).unwrap(), before);
    assert!(b.mig_instances(&uuid(&b, "gpu-0")).unwrap().is_empty());
    // MIG UUIDs keep counting: a new compute instance never repeats one handed out.
    let ci2 = b
        .create_compute_instance(&g, half, CiProfileIndex(0))
        .unwrap();
    assert_ne!(ci2.uuid, ci.uuid);
    b.destroy_compute_instance(&g, gi, ci.ci_id).unwrap();
    b.destroy_gpu_instance(&g, gi).unwrap();
    let again = b.create_gpu_instance(&g, GiProfileId(9), 4).unwrap();
    assert_eq!(again, gi, "GI IDs are reused");
    let ci3 = b
        .create_compute_instance(&g, again, CiProfileIndex(2))
        .unwrap();
    assert!(![&ci.uuid, &ci2.uuid].contains(&&ci3.uuid));
    // A backend without a node directory of its own keeps nothing.
    let mem = SimulatedBackend::without_device_nodes("p5.48xlarge", "node", dir.path()).unwrap();
    assert!(mem.mig_instances(&g).unwrap().is_empty());
}

#[test]
fn the_reset_switch_resets_the_gpus_it_names_once() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let b = SimulatedBackend::new("p4d.24xlarge", "node", dir.path()).unwrap();
    let (g0, g1) = (uuid(&b, "gpu-0"), uuid(&b, "gpu-1"));
    for g in [&g0, &g1] {
        b.set_mig_mode(g, true).unwrap();
        b.reset(g).unwrap();
        let gi = b.create_gpu_instance(g, GiProfileId(0), 0).unwrap();
        b.create_compute_instance(g, gi, CiProfileIndex(4)).unwrap();
    }
    // A pending change on gpu-0 (Ampere): it takes effect at the reset.
    b.destroy_compute_instance(&g0, 0, 0).unwrap();
    b.destroy_gpu_instance(&g0, 0).unwrap();
    b.set_mig_mode(&g0, false).unwrap();
    let gi = b.create_gpu_instance(&g0, GiProfileId(0), 0).unwrap();
    b.create_compute_instance(&g0, gi, CiProfileIndex(4))
        .unwrap();
    drop(b);

    let switch = dir.path().join(state::RESET_SWITCH);
    std::fs::write(&switch, "gpu-9\n").unwrap();
    let err = SimulatedBackend::new("p4d.24xlarge", "node", dir.path()).unwrap_err();
    assert!(err.to_string().contains("gpu-9"), "{err}");
    assert!(
        switch.exists(),
        "a bad switch is left for the operator to fix"
    );

    std::fs::write(&switch, "# after nvidia-smi --gpu-reset -i 0\ngpu-0\n").unwrap();
    let b = SimulatedBackend::new("p4d.24xlarge", "node", dir.path()).unwrap();
    assert!(!switch.exists(), "the switch acts once");
    assert_eq!(b.mig_mode(&g0).unwrap(), MigMode::default());
    assert!(b.mig_instances(&g0).unwrap().is_empty());
    assert_eq!(
        b.mig_instances(&g1).unwrap().len(),
        1,
        "gpu-1 was not reset"
    );
    drop(b);
    let b = SimulatedBackend::new("p4d.24xlarge", "node", dir.path()).unwrap();
    assert_eq!(b.mig_instances(&g1).unwrap().len(), 1);
    drop(b);
    std::fs::write(&switch, "").unwrap();
    let b = SimulatedBackend::new("p4d.24xlarge", "node", dir.path()).unwrap();
    assert!(
        b.mig_instances(&g1).unwrap().is_empty(),
        "an empty switch resets all"
    );
    assert!(b.mig_mode(&g1).unwrap().current, "MIG mode itself stays");
}

#[test]
fn a_mig_state_file_is_input() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let b = SimulatedBackend::new("p5.48xlarge", "node", dir.path()).unwrap();
    let g = uuid(&b, "gpu-2");
    b.set_mig_mode(&g, true).unwrap();
    let gi = b.create_gpu_instance(&g, GiProfileId(9), 0).unwrap();
    b.create_compute_instance(&g, gi, CiProfileIndex(2))
        .unwrap();
    drop(b);
    let path = dir.path().join(state::STATE_FILE);
    let good = std::fs::read_to_string(&path).unwrap();
    for (bad, why) in [
        ("{not json".to_string(), "key must be a string"),
        (
            good.replace("\"placement_start\": 0", "\"placement_start\": 1"),
            "cannot start",
        ),
        (
            good.replace("\"gi_profile_id\": 9", "\"gi_profile_id\": 3"),
            "does not exist",
        ),
        (
            good.replace("\"mig_current\": true", "\"mig_current\": false"),
            "MIG mode off",
        ),
        (good.replace("MIG-", "GPU-"), "not a valid one"),
        (
            good.replace(&g, "GPU-00000000-0000-0000-0000-000000000000"),
            "no GPU",
        ),
    ] {
        std::fs::write(&path, &bad).unwrap();
        let err = SimulatedBackend::new("p5.48xlarge", "node", dir.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(why) && msg.contains(&path.display().to_string()),
            "{why}: {msg}"
        );
    }
    // Another simulated node's state is another machine's: this node starts afresh.
    std::fs::write(
        &path,
        good.replace("\"node\": \"node\"", "\"node\": \"other\""),
    )
    .unwrap();
    let b = SimulatedBackend::new("p5.48xlarge", "node", dir.path()).unwrap();
    assert!(b.mig_instances(&g).unwrap().is_empty());
    drop(b);
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("\"node\": \"node\""));
}

#[test]
fn p4d_has_eight_a100_with_device_nodes() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: mknod needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let b = SimulatedBackend::new("p4d.24xlarge", "node", dir.path()).unwrap();
    assert_eq!(b.gpus().len(), 8);
    let g = b.find("gpu-7").unwrap();
    assert_eq!(g.product_name, "NVIDIA A100-SXM4-40GB");
    assert_eq!(b.find(&g.uuid).unwrap().minor, 7);
    let meta = std::fs::metadata(dir.path().join("nvidia7")).unwrap();
    assert!(meta.file_type().is_char_device());
    assert_eq!(meta.rdev(), makedev(195, 7));
    b.set_time_slice(&g.uuid, TimeSliceInterval::Long).unwrap();
    assert_eq!(b.time_slice(&g.uuid).unwrap(), TimeSliceInterval::Long);
    assert!(b
        .set_compute_mode("GPU-nope", ComputeMode::Default)
        .is_err());
}

#[test]
fn compute_mode_and_time_slice_outlive_a_restart_until_a_reset() {
    if !root() {
        return;
    }
    // g5.48xlarge: GPUs without MIG keep their settings too.
    let dir = tempfile::tempdir().unwrap();
    let b = SimulatedBackend::new("g5.48xlarge", "node", dir.path()).unwrap();
    let (g0, g1) = (uuid(&b, "gpu-0"), uuid(&b, "gpu-1"));
    b.set_compute_mode(&g0, ComputeMode::ExclusiveProcess)
        .unwrap();
    b.set_time_slice(&g1, TimeSliceInterval::Long).unwrap();
    drop(b);
    // gpushared starts again: the GPUs kept what was set, as hardware does.
    let b = SimulatedBackend::new("g5.48xlarge", "node", dir.path()).unwrap();
    assert_eq!(b.compute_mode(&g0).unwrap(), ComputeMode::ExclusiveProcess);
    assert_eq!(b.time_slice(&g1).unwrap(), TimeSliceInterval::Long);
    assert_eq!(b.compute_mode(&g1).unwrap(), ComputeMode::Default);
    drop(b);
    // A reset (the switch) restores the defaults of the GPUs it names only.
    std::fs::write(dir.path().join(state::RESET_SWITCH), "gpu-0\n").unwrap();
    let b = SimulatedBackend::new("g5.48xlarge", "node", dir.path()).unwrap();
    assert_eq!(b.compute_mode(&g0).unwrap(), ComputeMode::Default);
    assert_eq!(b.time_slice(&g1).unwrap(), TimeSliceInterval::Long);
}

/// Starts a simulated node on `dir` on a thread of its own: a start that blocks (a fifo
/// opened for reading waits for a writer forever) fails the test instead of hanging it.
fn start_bounded(dir: &Path) -> io::Result<SimulatedBackend> {
    let dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(SimulatedBackend::new("p4d.24xlarge", "node", &dir));
    });
    rx.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the start blocked on a file that is not a regular one")
}

/// Break-it finding 16: a fifo at `<sim-dev-root>/reset-gpus` hung the start forever (a
/// blocking open waits for a writer), where every other file read at start is opened
/// non-blocking and regular files only. Anything but a regular file at the switch (or at the
/// MIG state file) is refused naming it, and left for the operator.
#[test]
fn a_switch_or_state_file_that_is_not_a_regular_file_is_refused_not_waited_on() {
    if !root() {
        return;
    }
    for name in [state::RESET_SWITCH, state::STATE_FILE] {
        for what in ["fifo", "directory", "symlink"] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(name);
            match what {
                "fifo" => {
                    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                        .unwrap()
                }
                "directory" => std::fs::create_dir(&path).unwrap(),
                _ => {
                    let target = dir.path().join("elsewhere");
                    std::fs::write(&target, "all\n").unwrap();
                    std::os::unix::fs::symlink(&target, &path).unwrap();
                }
            }
            let err = start_bounded(dir.path()).expect_err(what);
            let msg = err.to_string();
            assert!(
                msg.contains(&path.display().to_string())
                    && msg.contains(&format!(
                        "it is a {}",
                        what.replace("symlink", "symbolic link")
                    )),
                "{name} as a {what}: {msg}"
            );
            assert!(
                std::fs::symlink_metadata(&path).is_ok(),
                "{name}: left for the operator"
            );
        }
    }
}
