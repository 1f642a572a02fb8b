//! `gpushare mig list|plan|apply` and `gpushare gpus` against a real gpushared on a simulated
//! p4d.24xlarge whose gpu-2 is in MIG mode.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::Path;
use std::process::{Command, Output};

use gpushare_e2e::*;

fn cli(d: &Daemon, args: &[&str]) -> Output {
    Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .output()
        .expect("gpushare")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A gpushared on simulated `profile`, with the emulator as its MPS control program.
fn daemon_on(profile: &str) -> Daemon {
    Daemon::start_on(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        profile,
    )
}

#[test]
fn mig_cli_lists_plans_applies_and_refuses_claimed_gpus() {
    let Some(cases) = setup() else {
        return;
    };
    let d = daemon_on(&p4d_mig_profile());
    let uid = unique_uid("mig-cli");
    let claim = with_uid(
        &load_claim(&cases.join("claims/seed-mig-3g20gb.yaml")),
        &uid,
    );
    d.prepare(&claim)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));

    // The table: the owner's UID shortened to a start that `gpushare claim` takes back;
    // -o wide: the instance's UUID and the whole UID.
    let row_of = |args: &[&str]| {
        let list = cli(&d, args);
        assert!(list.status.success(), "{}", text(&list));
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .find(|l| l.contains("gpu-2-mig-3g20gb-9-4"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no row: {}", text(&list)))
    };
    let row = row_of(&["mig", "list"]);
    let owner = row.split_whitespace().last().unwrap();
    assert!(uid.starts_with(owner) && owner.len() < uid.len(), "{row}");
    let shown: serde_json::Value =
        serde_json::from_slice(&cli(&d, &["-o", "json", "claim", owner]).stdout).unwrap();
    assert_eq!(shown["uid"], uid.as_str(), "{shown}");
    for want in ["3g.20gb", "4:4"] {
        assert!(row.contains(want), "{want} in {row}");
    }
    assert!(!row.contains("MIG-"), "{row}");
    let row = row_of(&["-o", "wide", "mig", "list"]);
    for want in ["3g.20gb", "4:4", "MIG-", &uid] {
        assert!(row.contains(want), "{want} in {row}");
    }
    let gpus = cli(&d, &["gpus"]);
    assert!(
        String::from_utf8_lossy(&gpus.stdout)
            .lines()
            .any(|l| l.contains("gpu-2") && l.contains("on (1 device)") && l.contains(" MIG ")),
        "{}",
        text(&gpus)
    );

    let layout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/mig-layout.yaml");
    let layout = layout.to_str().unwrap();
    // gpu-2 is held by the claim: the plan shows it marked, the apply refuses; nothing
    // changes.
    let o = cli(&d, &["mig", "plan", "-f", layout, "-c", "half-and-half"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("gpu-2: held by claim(s) {uid}"))
            && text(&o).contains("would set MIG mode disabled"),
        "{}",
        text(&o)
    );
    let o = cli(&d, &["mig", "apply", "-f", layout, "-c", "half-and-half"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("Conflict") && text(&o).contains(&uid),
        "{}",
        text(&o)
    );
    assert_eq!(d.gpus()["gpu-2"].mig_devices.len(), 1);
    let o = cli(&d, &["mig", "apply", "-f", layout, "-c", "no-such-config"]);
    assert!(text(&o).contains("InvalidConfig"), "{}", text(&o));

    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
    // Free now: the plan shows the change, and the apply on this Ampere GPU leaves the mode
    // change pending a reset and says so.
    let o = cli(&d, &["mig", "plan", "-f", layout, "-c", "half-and-half"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("gpu-2:") && text(&o).contains("would set MIG mode disabled"),
        "{}",
        text(&o)
    );
    assert!(d.gpus()["gpu-2"].mig_enabled, "a plan changes nothing");
    let o = cli(&d, &["mig", "apply", "-f", layout, "-c", "half-and-half"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("pending a GPU reset"), "{}", text(&o));
    let gpus = cli(&d, &["gpus"]);
    assert!(
        String::from_utf8_lossy(&gpus.stdout)
            .lines()
            .any(|l| l.contains("gpu-2 ")
                && l.contains("on (0 devices; disable pending a GPU reset)")),
        "{}",
        text(&gpus)
    );
    assert_eq!(d.gpus()["gpu-2"].mig_pending, Some(false));

    // A later layout with MIG on for gpu-2 cancels the pending disable and creates its slices.
    let o = cli(&d, &["mig", "plan", "-f", layout, "-c", "all-balanced"]);
    let plan = text(&o);
    let gpu2 = plan.split("  gpu-2:").nth(1).unwrap_or_default();
    let gpu2 = gpu2.split("  gpu-3").next().unwrap_or_default();
    assert!(
        gpu2.contains("would set MIG mode enabled") && !gpu2.contains("note:"),
        "{plan}"
    );
    let o = cli(&d, &["mig", "apply", "-f", layout, "-c", "all-balanced"]);
    assert!(o.status.success(), "{}", text(&o));
    let g = &d.gpus()["gpu-2"];
    assert_eq!((g.mig_enabled, g.mig_pending), (true, Some(true)));
    assert_eq!(g.mig_devices.len(), 4, "{g:?}");
    // The other A100s were off: their enable waits for a reset.
    let g = &d.gpus()["gpu-3"];
    assert_eq!((g.mig_enabled, g.mig_pending), (false, Some(true)));
}

#[test]
fn hopper_mig_mode_gpushare_turned_on_is_off_again_after_the_last_mig_claim() {
    let Some(_cases) = setup() else {
        return;
    };
    let d = daemon_on("p5.48xlarge");
    assert!(!d.gpus()["gpu-5"].mig_enabled);
    let claim = |uid: &str, device: &str, params: serde_json::Value| {
        serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "m", "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {
                "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE,
                             "device": device}],
                "config": [{"source": "FromClaim", "requests": ["gpu"],
                            "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]}}}})
    };
    let a = unique_uid("hop-a");
    let b = unique_uid("hop-b");
    d.prepare(&claim(
        &a,
        "gpu-5",
        serde_json::json!({"sharingMode": "mig", "migProfile": "3g.40gb"}),
    ))
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert!(d.gpus()["gpu-5"].mig_enabled, "turned on for the claim");
    d.prepare(&claim(
        &b,
        "gpu-5",
        serde_json::json!({"sharingMode": "mig", "migProfile": "1g.10gb"}),
    ))
    .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let shown = text(&cli(&d, &["claim", &b]));
    assert!(
        shown.contains("MIG mode was turned on by gpushare"),
        "{shown}"
    );
    d.unprepare(&a);
    assert!(
        d.gpus()["gpu-5"].mig_enabled,
        "the other claim still has a slice"
    );
    d.unprepare(&b);
    let g = &d.gpus()["gpu-5"];
    assert!(
        !g.mig_enabled && g.mig_devices.is_empty(),
        "{g:?}\n{}",
        d.log()
    );
    d.assert_nothing_left(&a, &[]);
    d.assert_nothing_left(&b, &[]);
}
