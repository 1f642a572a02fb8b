//! The CLI's cut from the daemon: its sources reach the daemon's library through
//! `gpushare::cli_api` only, so the claim service, the socket server, the strategies and the
//! registry stay the daemon's alone (the CLI talks to them over the socket, with
//! `gpushare-proto`). A new need is a re-export added to `daemon/src/cli_api.rs`, where it is
//! seen.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `gpushare::<path>` in `text` (the daemon library's crate name, not `gpushare_cli`
/// or `gpushare_proto`) that does not start with `cli_api`, as (line number, line).
fn outside_cli_api(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("gpushare::") {
            let before = rest[..at].chars().next_back();
            let after = &rest[at + "gpushare::".len()..];
            let named = !before.is_some_and(|c| c.is_alphanumeric() || c == '_');
            if named && !after.starts_with("cli_api") {
                found.push((n + 1, line.trim().to_string()));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn the_finder_sees_every_way_of_naming_the_daemon_library() {
    let text = "use gpushare::service::Service;\nlet x = gpushare::gpu::catalog();\n\
                use gpushare::cli_api::Checkpoint;\nuse gpushare_proto::Client;\n\
                let y = gpushare_cli::claims_table(&c);\nuse gpushare::{cli_api, server};";
    let found: Vec<usize> = outside_cli_api(text).into_iter().map(|f| f.0).collect();
    assert_eq!(found, vec![1, 2, 6]);
}

#[test]
fn the_cli_uses_the_daemon_library_through_cli_api_only() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() >= 5, "{files:?}");
    let mut wrong = Vec::new();
    for f in &files {
        for (n, line) in outside_cli_api(&std::fs::read_to_string(f).unwrap()) {
            wrong.push(format!("{}:{n}: {line}", f.display()));
        }
    }
    assert!(
        wrong.is_empty(),
        "the CLI names the daemon's library outside gpushare::cli_api (add a re-export there instead):\n{}",
        wrong.join("\n")
    );
}
