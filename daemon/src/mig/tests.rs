use super::layout::{self, Devices, GpuState, LayoutError, PlannedInstance};
use super::*;

#[test]
fn the_two_numberings_differ_and_resolve_to_the_same_profile() {
    let m = MigModel::A100Sxm4_40;
    let by_id = m.profile_by_id(GiProfileId(9)).unwrap();
    let by_index = m.profile_by_index(GiProfileIndex(2)).unwrap();
    assert_eq!(by_id, by_index);
    assert_eq!(by_id.name, "3g.20gb");
    // ID 2 is no profile at all; index 9 is 1g.10gb (ID 15).
    assert!(m.profile_by_id(GiProfileId(2)).is_none());
    assert_eq!(
        m.profile_by_index(GiProfileIndex(9)).unwrap().id,
        GiProfileId(15)
    );
    assert_eq!(by_id.full_ci_profile(), CiProfileIndex(2));
}

#[test]
fn tables_are_consistent_for_every_model() {
    for m in MigModel::ALL {
        let ps = m.profiles();
        assert_eq!(ps.len(), 7, "{m:?}");
        for p in &ps {
            assert!(p.max_instances <= p.starts.len() as u32, "{m:?} {}", p.name);
            for pl in p.placements() {
                assert!(pl.start + pl.size <= MEMORY_SLICES, "{m:?} {}", p.name);
            }
            let name = MigDeviceName::format(3, p, p.starts[0]);
            let parsed = MigDeviceName::parse(&name).unwrap();
            assert_eq!(
                (parsed.minor, parsed.gi_profile, parsed.start),
                (3, p.id, p.starts[0])
            );
        }
    }
    assert_eq!(
        MigModel::from_product_name("NVIDIA H100 80GB HBM3"),
        Some(MigModel::H100_80)
    );
    assert_eq!(
        MigModel::from_product_name("NVIDIA H200"),
        Some(MigModel::H200)
    );
    assert_eq!(MigModel::from_product_name("NVIDIA A10G"), None);
}

#[test]
fn device_names_parse_as_the_dra_driver_writes_them() {
    let n = MigDeviceName::parse("gpu-2-mig-3g20gb-9-4").unwrap();
    assert_eq!(n.minor, 2);
    assert_eq!(n.profile, "3g20gb");
    assert_eq!(n.gi_profile, GiProfileId(9));
    assert_eq!(n.start, 4);
    for bad in [
        "gpu-2",
        "gpu-x-mig-3g20gb-9-4",
        "gpu-2-mig-3g.20gb-9-4",
        "gpu-2-mig--9-4",
        "gpu-2-mig-3g20gb-9",
        "gpu-2-mig-3g20gb-9-",
        "MIG-0f0e",
    ] {
        assert!(MigDeviceName::parse(bad).is_none(), "{bad}");
    }
}

#[test]
fn placements_refuse_invalid_starts_overlaps_and_counts() {
    let m = MigModel::H100_80;
    let at = |id, start| Occupied {
        profile: GiProfileId(id),
        placement: m
            .profile_by_id(GiProfileId(id))
            .unwrap()
            .placement(start)
            .unwrap(),
    };
    assert!(matches!(
        check_placement(m, GiProfileId(9), 2, &[]),
        Err(PlacementError::Invalid(_))
    ));
    assert!(matches!(
        check_placement(m, GiProfileId(7), 0, &[]),
        Err(PlacementError::Invalid(_))
    ));
    assert!(matches!(
        check_placement(m, GiProfileId(14), 4, &[at(9, 4)]),
        Err(PlacementError::Taken(_))
    ));
    // +me: one per GPU, even with room left.
    assert!(matches!(
        check_placement(m, GiProfileId(20), 1, &[at(20, 0)]),
        Err(PlacementError::Taken(_))
    ));
    assert_eq!(
        check_placement(m, GiProfileId(19), 6, &[at(9, 0), at(14, 4)]),
        Ok(MigPlacement { start: 6, size: 1 })
    );
}

#[test]
fn pack_finds_a_layout_whatever_the_order() {
    let m = MigModel::A100Sxm4_40;
    let p = |id| m.profile_by_id(GiProfileId(id)).unwrap();
    // The MIG guide's order that placement-less creation fails on.
    let placed = layout::pack(&[p(19), p(19), p(14), p(9)]).unwrap();
    let mut occupied: Vec<Occupied> = Vec::new();
    for (prof, pl) in &placed {
        check_placement(m, prof.id, pl.start, &occupied).unwrap();
        occupied.push(Occupied {
            profile: prof.id,
            placement: *pl,
        });
    }
    assert_eq!(placed.len(), 4);
    assert!(layout::pack(&[p(9), p(9), p(19)]).is_none(), "no room");
    assert!(
        layout::pack(&[p(5), p(9), p(19)]).is_none(),
        "4g + 3g fill it"
    );
    assert_eq!(layout::pack(&vec![p(19); 7]).unwrap().len(), 7);
    assert!(layout::pack(&vec![p(19); 8]).is_none());
}

const FILE: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  mixed:
    - devices: [0, 1]
      mig-enabled: false
    - device-filter: "0x20B010DE"
      devices: [2]
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
"#;

fn gpus() -> Vec<GpuState> {
    (0..3)
        .map(|minor| GpuState {
            minor,
            name: format!("gpu-{minor}"),
            model: Ok(MigModel::A100Sxm4_40),
            mig_enabled: minor == 2,
            mig_pending: minor == 2,
            instances: Vec::new(),
            claims: Vec::new(),
        })
        .collect()
}

#[test]
fn mig_parted_files_parse_and_refuse_like_mig_parted() {
    let cfg = layout::parse(FILE).unwrap();
    assert_eq!(cfg.mig_configs.len(), 2);
    assert_eq!(
        cfg.mig_configs["mixed"][0].devices,
        Devices::List(vec![0, 1])
    );
    for (bad, says) in [
        (FILE.replace("v1", "v2"), "unknown version"),
        (FILE.replace("devices: all", "devices: some"), "neither"),
        (
            FILE.replace(
                "mig-enabled: false\n  mixed",
                "mig-enabled: false\n      extra: 1\n  mixed",
            ),
            "unknown field",
        ),
        (
            FILE.replace("      mig-devices: {\"3g.20gb\": 2}\n", ""),
            "required",
        ),
        (FILE.replace("0x20B010DE", "A100"), "PCI device ID"),
        ("version: v1\nmig-configs: {}\n".to_string(), "empty"),
    ] {
        let e = layout::parse(&bad).unwrap_err();
        assert!(matches!(e, LayoutError::Invalid(_)), "{e}");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
}

#[test]
fn plans_change_only_what_differs_and_refuse_claimed_gpus() {
    let cfg = layout::parse(FILE).unwrap();
    let plan = layout::plan(&cfg, "mixed", &gpus()).unwrap();
    assert_eq!(plan.len(), 3);
    assert!(plan[0].is_noop() && plan[1].is_noop(), "already off");
    assert_eq!(plan[2].create.len(), 2);
    let starts: Vec<u32> = plan[2].create.iter().map(|(_, pl)| pl.start).collect();
    assert_eq!(starts, [0, 4]);

    // Once there, nothing to do.
    let mut now = gpus();
    now[2].instances = plan[2]
        .create
        .iter()
        .enumerate()
        .map(|(i, (p, pl))| PlannedInstance {
            gi_id: Some(i as u32 + 1),
            profile: p.id,
            profile_name: p.name.into(),
            placement: *pl,
            owner: None,
        })
        .collect();
    assert!(layout::plan(&cfg, "mixed", &now).unwrap()[2].is_noop());

    // A claim on gpu-2: the plan of disabling it marks the GPU, and an apply is refused;
    // gpu-0 and 1 alone would pass.
    now[2].claims = vec!["c1".into()];
    let plan = layout::plan(&cfg, "all-disabled", &now).unwrap();
    assert_eq!(plan[2].held_by, ["c1"]);
    assert!(plan[0].held_by.is_empty() && plan[1].held_by.is_empty());
    let e = layout::refuse_held(&plan).unwrap_err();
    assert!(matches!(e, LayoutError::Refused(_)), "{e}");
    assert!(
        e.to_string().contains("gpu-2") && e.to_string().contains("c1"),
        "{e}"
    );
    assert!(
        e.to_string()
            .ends_with("release those claims before changing the MIG layout"),
        "{e}"
    );
    assert!(layout::refuse_held(&plan[..2]).is_ok());
    // Unchanged, a held GPU is not marked.
    let plan = layout::plan(&cfg, "mixed", &now).unwrap();
    assert!(plan[2].is_noop() && plan[2].held_by.is_empty());

    // A filter that matches no GPU selects nothing; an unknown config is named.
    let h100 = FILE.replace("0x20B010DE", "0x233010DE");
    let cfg = layout::parse(&h100).unwrap();
    assert_eq!(layout::plan(&cfg, "mixed", &gpus()).unwrap().len(), 2);
    assert!(layout::plan(&cfg, "nope", &gpus())
        .unwrap_err()
        .to_string()
        .contains("all-disabled, mixed"));
}

#[test]
fn plans_compare_with_the_pending_mode() {
    let cfg = layout::parse(FILE).unwrap();
    let mut now = gpus();
    // gpu-0: an enable waits for a reset; gpu-2: a disable does (both A100).
    now[0].mig_pending = true;
    now[2].mig_pending = false;
    let plan = layout::plan(&cfg, "mixed", &now).unwrap();
    assert_eq!(
        plan[0].set_mig_mode,
        Some(false),
        "cancels the pending enable"
    );
    assert!(plan[0].note.is_none(), "off is in effect already");
    assert_eq!(
        plan[2].set_mig_mode,
        Some(true),
        "cancels the pending disable"
    );
    assert!(plan[2].note.is_none());
    assert_eq!(plan[2].create.len(), 2);
    assert!(plan[1].is_noop());

    // Asking for what is pending sets nothing, and says the reset is still to come.
    let plan = layout::plan(&cfg, "all-disabled", &now).unwrap();
    assert_eq!(plan[2].set_mig_mode, None);
    assert!(plan[2]
        .note
        .as_deref()
        .unwrap()
        .contains("disable is pending a GPU reset"));
    let on = FILE.replace(
        "devices: [0, 1]\n      mig-enabled: false",
        "devices: [0, 1]\n      mig-enabled: true\n      mig-devices: {}",
    );
    let plan = layout::plan(&layout::parse(&on).unwrap(), "mixed", &now).unwrap();
    assert_eq!(plan[0].set_mig_mode, None);
    assert!(plan[0]
        .note
        .as_deref()
        .unwrap()
        .contains("enable is pending a GPU reset"));
    // On gpu-1, nothing pending: enabling on an A100 will wait for a reset, and says so.
    assert_eq!(plan[1].set_mig_mode, Some(true));
    assert!(plan[1].note.is_some());
    // On Hopper the change is in effect at once: no note.
    for g in &mut now {
        g.model = Ok(MigModel::H100_80);
    }
    let h100 = on
        .replace("3g.20gb", "3g.40gb")
        .replace("0x20B010DE", "0x233010DE");
    let plan = layout::plan(&layout::parse(&h100).unwrap(), "mixed", &now).unwrap();
    assert_eq!(plan[1].set_mig_mode, Some(true));
    assert!(plan[1].note.is_none(), "{:?}", plan[1]);
}

#[test]
fn the_documented_example_layout_parses_and_plans() {
    let text = include_str!("../../../docs/examples/mig-layout.yaml");
    let cfg = layout::parse(text).unwrap();
    let plan = layout::plan(&cfg, "all-balanced", &gpus()).unwrap();
    assert_eq!(plan.len(), 3);
    assert!(plan.iter().all(|g| g.create.len() == 4));
}
