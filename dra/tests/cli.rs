//! `gpushare-dra`'s command line: what each command's help offers is what it uses.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn probe_help_lists_only_what_the_probe_reads() {
    let text = help(&["probe"]);
    for used in [
        "--config",
        "--json",
        "--driver-name",
        "--node-name",
        "--gpushared-socket",
        "--plugins-dir",
        "--registry-dir",
    ] {
        assert!(text.contains(used), "{used} missing:\n{text}");
    }
    for unused in [
        "--kubeconfig",
        "--metrics-address",
        "--claim-timeout-seconds",
        "--device-health",
    ] {
        assert!(!text.contains(unused), "{unused} offered:\n{text}");
    }
    // The plugin itself still takes them.
    let text = help(&[]);
    assert!(text.contains("--kubeconfig") && text.contains("--device-health"));
}

#[test]
fn the_man_page_and_completions_are_generated_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .arg("--generate-man")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(dir.path().join("gpushare-dra.8")).unwrap();
    assert!(page.contains(".TH gpushare-dra 8"), "{page}");
    for needle in ["probe", "remove\\-slices", "kubeconfig"] {
        assert!(page.contains(needle), "{needle}: {page}");
    }
    let probe = std::fs::read_to_string(dir.path().join("gpushare-dra-probe.8")).unwrap();
    assert!(probe.contains("gpushared\\-socket"), "{probe}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .args(["--completion", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("gpushare-dra") && script.contains("--remove-slices"));
}
