//! `-o wide`: offered by the commands that print a table, refused before anything is asked by
//! the others, and wider than `-o table` by the columns the narrow table leaves out.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::process::{Command, Output};

fn gpushare(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpushare"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn wide_is_refused_by_commands_without_a_table_before_anything_is_asked() {
    // No daemon on this socket: the refusal comes first, not the connection's error.
    for args in [
        &["status"][..],
        &["claim", "3f75ec50"][..],
        &["unprepare", "3f75ec50"][..],
        &["prepare", "-f", "/dev/null"][..],
        &["mig", "plan", "-f", "x.yaml", "-c", "all"][..],
        &["doctor"][..],
        &["completion", "bash"][..],
    ] {
        let mut all = vec!["--socket", "/nonexistent/s.sock", "-o", "wide"];
        all.extend(args);
        let out = gpushare(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim(),
            "gpushare: -o wide applies to the tables of `gpushare gpus`, `claims`, `mig list` and `profiles` only; use -o table, json or yaml here",
            "{args:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn a_profile_s_gpus_wide_add_the_columns_the_table_leaves_out() {
    let narrow = gpushare(&["profiles", "p5.48xlarge"]);
    let wide = gpushare(&["-o", "wide", "profiles", "p5.48xlarge"]);
    assert!(narrow.status.success() && wide.status.success(), "{wide:?}");
    let (narrow, wide) = (
        String::from_utf8(narrow.stdout).unwrap(),
        String::from_utf8(wide.stdout).unwrap(),
    );
    let header = |t: &str| -> Vec<String> {
        // Two-word headers are the only cells with one space inside.
        t.lines()
            .next()
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        header(&narrow),
        ["DEVICE", "PRODUCT", "MEMORY", "MIG", "SHARING", "CLAIMS"]
    );
    assert_eq!(
        header(&wide),
        [
            "DEVICE",
            "UUID",
            "PRODUCT",
            "ARCH",
            "CC",
            "MEMORY",
            "MIG",
            "COMPUTE MODE",
            "TIME-SLICE",
            "SHARING",
            "CLAIMS"
        ]
    );
    assert_eq!(narrow.lines().count(), 9);
    assert_eq!(wide.lines().count(), 9);
    assert!(wide.lines().nth(1).unwrap().contains(" GPU-"), "{wide}");
    // The list of profiles has nothing to leave out: one table either way.
    assert_eq!(
        gpushare(&["profiles"]).stdout,
        gpushare(&["-o", "wide", "profiles"]).stdout
    );
}
