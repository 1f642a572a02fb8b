//! Static MIG: a MIG device that exists when a claim names it (made by `gpushare mig apply`
//! here, by mig-parted or `nvidia-smi` on a real node) is handed to the claim as it is, shared
//! with no second claim, left in place at the release and across restarts; concurrent
//! prepares of a chosen placement get distinct slices.

use super::*;
use gpushare_proto::MigOrigin;

/// Applies the `balanced` layout (gpu-0 and gpu-1: 1g.10gb ×2, 2g.20gb, 3g.40gb) and returns
/// gpu-0's devices as `(name, MIG UUID)`.
fn balanced(f: &Fixture) -> Vec<(String, String)> {
    let done = apply(f, "balanced", false).unwrap();
    done.gpus[0]
        .create
        .iter()
        .map(|c| {
            let (name, uuid) = c.split_once('=').unwrap();
            (name.to_string(), uuid.to_string())
        })
        .collect()
}

fn named<'a>(devices: &'a [(String, String)], profile: &str) -> &'a (String, String) {
    devices
        .iter()
        .find(|(n, _)| n.contains(&format!("-mig-{profile}-")))
        .unwrap()
}

#[test]
fn a_layout_s_mig_device_is_handed_to_a_claim_as_it_is_and_kept_at_release() {
    let f = fixture("p5.48xlarge", &[]);
    let layout = balanced(&f);
    let before = instances(&f, "gpu-0");
    assert_eq!(before.len(), 4);
    let (dev, mig_uuid) = named(&layout, "3g40gb").clone();

    f.service.prepare(&claim("s1", &[&dev], None)).unwrap();
    let info = f.service.get_claim("s1").unwrap();
    let rec = &info.groups[0].mig[0];
    assert_eq!(rec.origin, MigOrigin::Existing);
    assert_eq!(rec.uuid, mig_uuid);
    assert!(!rec.enabled_mig_mode);
    assert_eq!(instances(&f, "gpu-0"), before, "nothing made or destroyed");
    let owner = f
        .service
        .list_gpus()
        .into_iter()
        .find(|g| g.name == "gpu-0")
        .unwrap()
        .mig_devices
        .into_iter()
        .find(|d| d.uuid == mig_uuid)
        .unwrap()
        .owner;
    assert_eq!(owner.as_deref(), Some("s1"));

    // The same device for a second claim: Conflict naming the holder, nothing changed.
    let e = f.service.prepare(&claim("s2", &[&dev], None)).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e}");
    assert!(e.message.contains("s1"), "{e}");
    assert_clean(&f, "s2");

    // Across a restart: the claim keeps the instance, nothing is swept.
    drop(f.service.unprepare("none-such"));
    let restarted = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(
        restarted.get_claim("s1").unwrap().state,
        ClaimState::Prepared
    );
    assert_eq!(instances(&f, "gpu-0"), before);

    // Released: the instance stays, as the layout made it, and can be claimed again.
    restarted.unprepare("s1").unwrap();
    assert_eq!(instances(&f, "gpu-0"), before, "left in place");
    assert!(!cdi::spec_path(&f.cfg.cdi_dir, "s1").exists());
    restarted.prepare(&claim("s3", &[&dev], None)).unwrap();
    assert_eq!(
        restarted.get_claim("s3").unwrap().groups[0].mig[0].uuid,
        mig_uuid
    );
    restarted.unprepare("s3").unwrap();
    assert_eq!(instances(&f, "gpu-0"), before);
}

#[test]
fn a_whole_gpu_claim_with_a_profile_takes_an_existing_free_instance_first() {
    let f = fixture("p5.48xlarge", &[]);
    let layout = balanced(&f);
    let before = instances(&f, "gpu-0");
    let ones: Vec<&(String, String)> = layout
        .iter()
        .filter(|(n, _)| n.contains("-mig-1g10gb-"))
        .collect();
    assert_eq!(ones.len(), 2);
    for uid in ["w1", "w2"] {
        f.service
            .prepare(&claim(uid, &["gpu-0"], Some(short_mig("1g.10gb"))))
            .unwrap();
    }
    let got: BTreeSet<String> = ["w1", "w2"]
        .iter()
        .map(|u| {
            f.service.get_claim(u).unwrap().groups[0].mig[0]
                .uuid
                .clone()
        })
        .collect();
    let want: BTreeSet<String> = ones.iter().map(|(_, u)| u.clone()).collect();
    assert_eq!(got, want, "each took one of the layout's 1g.10gb");
    assert_eq!(instances(&f, "gpu-0"), before);
    // No free 1g.10gb left, and no room for a new one on gpu-0 (the layout fills it).
    assert_eq!(
        code(
            f.service
                .prepare(&claim("w3", &["gpu-0"], Some(short_mig("1g.10gb"))))
        ),
        ErrorCode::Conflict
    );
    assert_clean(&f, "w3");
    for uid in ["w1", "w2"] {
        f.service.unprepare(uid).unwrap();
    }
    assert_eq!(instances(&f, "gpu-0"), before);
}

#[test]
fn mps_runs_on_a_static_mig_device_as_on_a_dynamic_one() {
    let f = fixture("p5.48xlarge", &[]);
    let layout = balanced(&f);
    let (dev, mig_uuid) = named(&layout, "2g20gb").clone();
    let cfg = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    f.service.prepare(&claim("sm", &[&dev], Some(cfg))).unwrap();
    let info = f.service.get_claim("sm").unwrap();
    let StrategyInfo::Mps(m) = &info.groups[0].sharing else {
        panic!("not MPS: {info:?}")
    };
    assert_eq!(m.visible_devices, vec![mig_uuid.clone()]);
    {
        let st = f.host.state();
        let d = st.daemons.values().find(|d| d.alive).unwrap();
        assert_eq!(d.env["CUDA_VISIBLE_DEVICES"], mig_uuid);
    }
    f.service.unprepare("sm").unwrap();
    assert!(f.host.state().daemons.values().all(|d| !d.alive));
    assert!(instances(&f, "gpu-0")
        .iter()
        .any(|i| i.compute.as_ref().is_some_and(|c| c.uuid == mig_uuid)));
    assert_clean(&f, "sm");
}

#[test]
fn a_gpu_instance_without_its_compute_instance_is_not_handed_out() {
    let f = fixture("p5.48xlarge", &[2]);
    let uuid = uuid_of(&f, "gpu-2");
    f.backend
        .create_gpu_instance(&uuid, crate::mig::GiProfileId(9), 4)
        .unwrap();
    let e = f
        .service
        .prepare(&claim("bare", &["gpu-2-mig-3g40gb-9-4"], None))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e}");
    assert!(e.message.contains("compute instance"), "{e}");
    assert_eq!(instances(&f, "gpu-2").len(), 1, "left as it is");
    assert_clean(&f, "bare");
}

#[test]
fn a_chosen_placement_another_prepare_is_making_is_chosen_again() {
    // Two prepares admitted at once both see placement 0 free; the second finds the first's
    // intent when it reserves, and takes the next placement instead of failing.
    let f = fixture("p5.48xlarge", &[2]);
    let gpu = f.backend.find("gpu-2").unwrap().clone();
    let model = crate::strategy::mig::model_of(&gpu).unwrap();
    let profile = model.profile_by_name("1g.10gb").unwrap();
    let first = crate::strategy::mig::MigTarget {
        request: "gpu".into(),
        device: MigDeviceName::format(2, &profile, 0),
        gpu_uuid: gpu.uuid.clone(),
        gpu_minor: 2,
        model,
        profile,
        start: 0,
        existing: None,
        chosen: true,
        carries_mode_flag: false,
    };
    f.service.host.mig_intents.reserve("racer", &first).unwrap();
    f.service
        .prepare(&claim("second", &["gpu-2"], Some(short_mig("1g.10gb"))))
        .unwrap();
    let got = &f.service.get_claim("second").unwrap().groups[0].mig[0];
    assert_ne!(got.placement_start, 0, "{got:?}");
    assert_eq!(
        got.device,
        format!("gpu-2-mig-1g10gb-19-{}", got.placement_start)
    );
    let group = &f.service.get_claim("second").unwrap().groups[0];
    assert_eq!(
        group.devices[0].device, got.device,
        "the group names the slice it got"
    );
    // The named form has no choice: Conflict at once, naming the other claim.
    let named = "gpu-2-mig-1g10gb-19-0".to_string();
    let e = f
        .service
        .prepare(&claim("third", &[&named], None))
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e}");
    assert!(e.message.contains("racer"), "{e}");
    assert_clean(&f, "third");
    f.service.host.mig_intents.strike("racer");
    f.service.unprepare("second").unwrap();
}

#[test]
fn concurrent_whole_gpu_prepares_get_distinct_placements() {
    // Seven 1g.10gb fit an H100; ten claims at once: seven prepared, three refused for want of
    // room, none for a placement another prepare was making.
    let f = Arc::new(fixture("p5.48xlarge", &[2]));
    let threads: Vec<_> = (0..10)
        .map(|i| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                f.service
                    .prepare(&claim(
                        &format!("cc-{i}"),
                        &["gpu-2"],
                        Some(short_mig("1g.10gb")),
                    ))
                    .map(|_| ())
            })
        })
        .collect();
    let results: Vec<Result<(), ServiceError>> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 7, "{results:?}");
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(e.message.contains("no free placement"), "{e}");
    }
    let starts: BTreeSet<u32> = instances(&f, "gpu-2")
        .iter()
        .map(|i| i.placement.start)
        .collect();
    assert_eq!(starts.len(), 7);
}
