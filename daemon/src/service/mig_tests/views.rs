//! What operators read about MIG: pending MIG modes in `gpushare gpus` and in layout plans
//! (a later layout cancels a pending change), a plan of a GPU claims hold shown with the GPU
//! marked, the MIG device a claim got in `gpushare claims` and `gpushare claim`, and GPU models
//! named as users know them.

use super::*;

const ON_7: &str = "version: v1\nmig-configs:\n  on:\n    - devices: [7]\n      mig-enabled: true\n      mig-devices: {\"7g.40gb\": 1}\n  off:\n    - devices: [7]\n      mig-enabled: false\n";

fn layout(f: &Fixture, config: &str, dry_run: bool) -> Result<MigApplyResult, ServiceError> {
    f.service.mig_apply(&MigApplyParams {
        layout: ON_7.into(),
        config: config.into(),
        dry_run,
    })
}

fn gpu(f: &Fixture, name: &str) -> GpuInfo {
    f.service
        .list_gpus()
        .into_iter()
        .find(|g| g.name == name)
        .unwrap()
}

#[test]
fn a_pending_mig_mode_is_shown_and_a_later_layout_cancels_it() {
    let f = fixture("p4d.24xlarge", &[]);
    let uuid = uuid_of(&f, "gpu-7");
    // On this A100 the enable stays pending a reset.
    layout(&f, "on", false).unwrap();
    assert_eq!(
        f.backend.mig_mode(&uuid).unwrap(),
        crate::gpu::MigMode {
            current: false,
            pending: true
        }
    );
    let g = gpu(&f, "gpu-7");
    assert_eq!((g.mig_enabled, g.mig_pending), (false, Some(true)));
    let table = gpushare_cli::gpus_table(&f.service.list_gpus());
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("gpu-7 "))
        .unwrap();
    assert!(row.contains("off (enable pending a GPU reset)"), "{row}");

    // Asked again, nothing is set again: the plan says the enable waits for a reset, and an
    // apply creates nothing yet.
    for dry_run in [true, false] {
        let again = layout(&f, "on", dry_run).unwrap();
        assert_eq!(again.gpus[0].set_mig_mode, None, "{again:?}");
        assert!(
            again.gpus[0]
                .note
                .as_deref()
                .is_some_and(|n| n.contains("pending a GPU reset")),
            "{again:?}"
        );
        assert_eq!(
            again.gpus[0].create.len(),
            usize::from(dry_run),
            "{again:?}"
        );
    }
    assert!(instances(&f, "gpu-7").is_empty());

    // A layout with MIG off cancels the pending enable (the current mode is off already).
    let plan = layout(&f, "off", true).unwrap();
    assert_eq!(plan.gpus[0].set_mig_mode, Some(false), "{plan:?}");
    layout(&f, "off", false).unwrap();
    assert_eq!(
        f.backend.mig_mode(&uuid).unwrap(),
        crate::gpu::MigMode::default()
    );
    assert_eq!(gpu(&f, "gpu-7").mig_pending, Some(false));
    // And then nothing is left to do.
    assert!(layout(&f, "off", true).unwrap().gpus[0]
        .set_mig_mode
        .is_none());
}

#[test]
fn a_plan_of_a_gpu_claims_hold_marks_it_and_apply_refuses() {
    let f = fixture("p4d.24xlarge", &[7]);
    f.service
        .prepare(&claim("holds", &["gpu-7-mig-3g20gb-9-0"], None))
        .unwrap();
    let plan = layout(&f, "off", true).unwrap();
    assert_eq!(plan.gpus.len(), 1);
    assert_eq!(plan.gpus[0].held_by, vec!["holds".to_string()]);
    assert_eq!(plan.gpus[0].set_mig_mode, Some(false));
    let text = gpushare_cli::mig_plan_text(&plan);
    assert!(text.contains("held by claim(s) holds"), "{text}");
    let e = layout(&f, "off", false).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict);
    assert!(e.message.contains("holds"), "{e}");
    assert_eq!(instances(&f, "gpu-7").len(), 1, "nothing changed");
    assert!(f.backend.mig_mode(&uuid_of(&f, "gpu-7")).unwrap().current);
    f.service.unprepare("holds").unwrap();
}

#[test]
fn listings_show_the_mig_device_a_claim_got() {
    let f = fixture("p5.48xlarge", &[]);
    f.service
        .prepare(&claim("short", &["gpu-5"], Some(short_mig("3g.40gb"))))
        .unwrap();
    let mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "4Gi"}}});
    f.service
        .prepare(&claim("mps", &["gpu-1-mig-2g20gb-14-2"], Some(mps)))
        .unwrap();
    let table = gpushare_cli::claims_table(&f.service.list_claims());
    let row = |uid: &str| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(uid))
            .unwrap()
            .to_string()
    };
    assert!(row("short").contains("gpu-5-mig-3g40gb-9-0"), "{table}");
    let gpus = gpushare_cli::gpus_table(&f.service.list_gpus());
    let gpu5 = gpus
        .lines()
        .find(|l| l.trim_start().starts_with("gpu-5 "))
        .unwrap();
    assert!(gpu5.contains("on (1 device)"), "{gpu5}");
    assert!(row("mps").contains("gpu-1-mig-2g20gb-14-2"), "{table}");
    let detail = gpushare_cli::claim_detail(&f.service.get_claim("short").unwrap());
    assert!(
        detail.contains("Request gpu: devices gpu-5-mig-3g40gb-9-0"),
        "{detail}"
    );
    let detail = gpushare_cli::claim_detail(&f.service.get_claim("mps").unwrap());
    assert!(
        detail.contains("CUDA device 0 = gpu-1-mig-2g20gb-14-2 (read back): 4G"),
        "{detail}"
    );
    assert!(!detail.contains(" = ?"), "{detail}");
    f.service.unprepare("short").unwrap();
    f.service.unprepare("mps").unwrap();
}

#[test]
fn gpu_models_are_named_as_users_know_them() {
    let f = fixture("p4d.24xlarge", &[]);
    let e = f
        .service
        .prepare(&claim("amp", &["gpu-0-mig-3g20gb-9-0"], None))
        .unwrap_err();
    assert!(e.message.contains("NVIDIA A100-SXM4-40GB"), "{e}");
    let bad = ON_7.replace("7g.40gb", "7g.80gb");
    let e = f
        .service
        .mig_apply(&MigApplyParams {
            layout: bad,
            config: "on".into(),
            dry_run: true,
        })
        .unwrap_err();
    assert!(e.message.contains("NVIDIA A100-SXM4-40GB"), "{e}");
    let e = crate::mig::check_placement(MigModel::H100_80, crate::mig::GiProfileId(3), 0, &[])
        .unwrap_err();
    assert!(e.to_string().contains("NVIDIA H100 80GB HBM3"), "{e}");
    let e = crate::mig::layout::parse(
        "version: v1\nmig-configs:\n  x:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 3}\n",
    )
    .and_then(|cfg| {
        crate::mig::layout::plan(
            &cfg,
            "x",
            &[crate::mig::layout::GpuState {
                minor: 0,
                name: "gpu-0".into(),
                model: Ok(MigModel::A100Sxm4_40),
                mig_enabled: true,
                mig_pending: true,
                instances: Vec::new(),
                claims: Vec::new(),
            }],
        )
    })
    .unwrap_err();
    assert!(e.to_string().contains("NVIDIA A100-SXM4-40GB"), "{e}");
    // Each model is named by its product name, the one `gpushare gpus` shows.
    for m in MigModel::ALL {
        let name = m.to_string();
        assert!(name.starts_with("NVIDIA "), "{name}");
        assert_eq!(MigModel::from_product_name(&name), Some(m), "{name}");
    }
    assert_eq!(MigModel::H200.to_string(), "NVIDIA H200");
}

#[test]
fn a_mig_claims_strategy_metric_says_mig_with_or_without_a_daemon_on_its_slice() {
    let f = fixture("p5.48xlarge", &[]);
    let mps = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}});
    f.service
        .prepare(&claim("alone", &["gpu-1-mig-1g10gb-19-0"], None))
        .unwrap();
    f.service
        .prepare(&claim("with-mps", &["gpu-1-mig-1g10gb-19-1"], Some(mps)))
        .unwrap();
    let Fixture { _dir, service, .. } = f;
    let collector = crate::metrics::ServiceCollector::new(Arc::new(service), Arc::new(|_| true));
    let registry = crate::metrics::registry(
        &Arc::new(crate::metrics::RequestMetrics::default()),
        collector,
    );
    let text = crate::metrics::render(&registry).unwrap();
    for uid in ["alone", "with-mps"] {
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("gpushare_claim_strategy{") && l.contains(&format!("claim=\"{uid}\""))
            })
            .unwrap_or_else(|| panic!("no strategy line for {uid}: {text}"));
        assert!(line.ends_with("strategy=\"MIG\"} 1"), "{line}");
    }
}

#[test]
fn a_mig_capable_gpu_without_profile_tables_is_named_alike_by_mig_plan_and_prepare() {
    // A B200 supports MIG; gpushare has no profile tables for it (yet). The trial saw `mig
    // plan` call it "non MIG-capable" while a prepare said "no MIG profile tables".
    let f = fixture("p6-b200.48xlarge", &[]);
    let plan = f
        .service
        .mig_apply(&MigApplyParams {
            layout: "version: v1\nmig-configs:\n  on:\n    - devices: [0]\n      mig-enabled: true\n      mig-devices: {\"1g.23gb\": 1}\n".into(),
            config: "on".into(),
            dry_run: true,
        })
        .unwrap_err();
    let prepare = f
        .service
        .prepare(&claim("b200", &["gpu-0-mig-1g23gb-19-0"], None))
        .unwrap_err();
    let why = "gpu-0 (NVIDIA B200): gpushare has no MIG profile tables for this GPU";
    assert_eq!(plan.code, ErrorCode::InvalidConfig, "{}", plan.message);
    assert!(plan.message.contains(why), "{}", plan.message);
    assert!(
        !plan.message.contains("non MIG-capable"),
        "{}",
        plan.message
    );
    assert_eq!(prepare.code, ErrorCode::Unsupported, "{}", prepare.message);
    assert!(prepare.message.contains(why), "{}", prepare.message);
}
