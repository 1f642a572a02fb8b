//! `gpushare generate-man DIR`: one page per command the user can type, down to `mig plan`
//! and `mig apply`, each NAME line saying what the command does without repeating its name.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeMap;
use std::process::Command;

/// Every page written by `gpushare generate-man`, by file name.
fn pages() -> BTreeMap<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare"))
        .arg("generate-man")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap(),
            )
        })
        .collect()
}

/// A page's NAME line, roff's `\-` read as `-`: (name, what it says after ` - `).
fn name_line(page: &str) -> (String, String) {
    let line = page
        .split(".SH NAME\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no NAME section:\n{page}"))
        .replace("\\-", "-");
    let (name, what) = line
        .split_once(" - ")
        .unwrap_or_else(|| panic!("NAME line without ' - ': {line}"));
    (name.to_string(), what.to_string())
}

#[test]
fn every_page_names_its_command_once() {
    let pages = pages();
    assert!(pages.len() > 10, "{:?}", pages.keys());
    for (file, page) in &pages {
        let (name, what) = name_line(page);
        assert_eq!(format!("{name}.1"), *file);
        let first = what.split([':', ' ']).next().unwrap_or_default();
        assert!(
            !first.eq_ignore_ascii_case(&name) && !first.eq_ignore_ascii_case("gpushare"),
            "{file}: NAME repeats the name: {name} - {what}"
        );
        assert!(!what.trim().is_empty(), "{file}: empty NAME");
    }
}

#[test]
fn mig_plan_and_apply_have_pages_of_their_own() {
    let pages = pages();
    // `mig list` has no option of its own to look for.
    for (sub, option) in [
        ("plan", Some("config")),
        ("apply", Some("config")),
        ("list", None),
    ] {
        let file = format!("gpushare-mig-{sub}.1");
        let page = pages
            .get(&file)
            .unwrap_or_else(|| panic!("{file} missing: {:?}", pages.keys()));
        let (name, _) = name_line(page);
        assert_eq!(name, format!("gpushare-mig-{sub}"));
        // The synopsis is what the user types.
        let synopsis = page.split(".SH SYNOPSIS\n").nth(1).unwrap();
        assert!(
            synopsis.starts_with(&format!("\\fBgpushare mig {sub}\\fR")),
            "{file}: {synopsis}"
        );
        if let Some(option) = option {
            assert!(page.contains(option), "{file}: {page}");
        }
        // Global options reach nested pages too.
        assert!(page.contains("socket"), "{file}: {page}");
    }
    // The mig page points at them.
    let mig = &pages["gpushare-mig.1"];
    for sub in ["plan", "apply"] {
        assert!(
            mig.contains(&format!("gpushare\\-mig\\-{sub}(1)")),
            "gpushare-mig.1: {mig}"
        );
    }
}
