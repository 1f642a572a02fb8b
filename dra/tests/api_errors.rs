//! An API server that cannot be reached is named: its URL and the kubeconfig that named it,
//! in one line per failure (not kube's own log line beside ours).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::Path;

/// A kubeconfig naming a server on a loopback port nothing listens on.
fn unreachable_kubeconfig(dir: &Path) -> (std::path::PathBuf, String) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let server = format!("http://127.0.0.1:{port}");
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n"
        ),
    )
    .unwrap();
    (path, server)
}

#[tokio::test]
async fn an_unreachable_server_is_named_with_its_kubeconfig() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, server) = unreachable_kubeconfig(dir.path());
    let api = gpushare_dra::api::connect(Some(&kubeconfig)).await.unwrap();
    let e = api.version().await.unwrap_err().to_string();
    assert!(
        e.contains(&server) && e.contains(&kubeconfig.display().to_string()),
        "{e}"
    );
    // The cause, not only kube's "client error (Connect)".
    assert!(e.to_lowercase().contains("connection refused"), "{e}");
}

#[test]
fn remove_slices_fails_in_one_line_naming_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let (kubeconfig, server) = unreachable_kubeconfig(dir.path());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .args([
            "--config",
            "/dev/null",
            "--node-name",
            "n1",
            "--remove-slices",
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("gpushare-dra: ") && lines[0].contains(&server),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_missing_kubeconfig_is_named_with_its_os_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let Err(e) = gpushare_dra::api::connect(Some(&missing)).await else {
        panic!("a missing kubeconfig was used");
    };
    let e = format!("{e:#}");
    assert_eq!(e.matches("os error 2").count(), 1, "{e}");
    assert!(e.contains(&missing.display().to_string()), "{e}");
}

#[test]
fn the_plugin_names_a_missing_kubeconfig_in_one_line_with_its_os_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .args(["--config", "/dev/null", "--node-name", "n1"])
        .arg("--kubeconfig")
        .arg(&missing)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("gpushare-dra: reading kubeconfig ")
            && lines[0].contains(&missing.display().to_string()),
        "{stderr}"
    );
    assert_eq!(lines[0].matches("os error 2").count(), 1, "{stderr}");
    assert_eq!(
        lines[0].matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
}
