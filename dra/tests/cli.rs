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
