//! `--help` lists, for each command, only what that command accepts.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn only_gpus_offers_the_resourceslice_output() {
    // `doctor -o resourceslice` is refused, so its help must not offer it.
    for command in ["doctor", "claims", "status"] {
        let text = help(&[command]);
        assert!(!text.contains("resourceslice"), "{command}:\n{text}");
        assert!(text.contains("json") && text.contains("yaml"), "{text}");
    }
    assert!(help(&["gpus"]).contains("-o resourceslice"));
}

#[test]
fn every_command_offers_wide_and_says_what_the_table_shortens() {
    let text = help(&["claims"]);
    assert!(text.contains("wide"), "{text}");
    assert!(text.contains("at most 120 columns"), "{text}");
    for command in ["claim", "unprepare"] {
        let text = help(&[command]);
        assert!(text.contains("a unique start of it"), "{command}:\n{text}");
    }
}
