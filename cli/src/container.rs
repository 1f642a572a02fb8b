//! Containers for the demo and the end-to-end tests: busybox root filesystems (Debian's
//! `busybox-static`, plus host programs copied in with the libraries `ldd` lists), podman runs
//! with the flags these hosts need, and runc bundles carrying a CDI device's edits.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

use gpushare::cli_api::{apply_to_oci_config, remove_file_if_exists};
use gpushare_cdi::ContainerEdits;

/// Where `busybox-static` installs its binary.
pub const BUSYBOX: &str = "/bin/busybox";

/// Builds `<dir>/rootfs`: busybox with a link per applet in `/bin`, and each of `extra` (host
/// absolute paths) at the same path with its shared libraries. Returns the rootfs path.
///
/// # Errors
/// busybox is missing or a file cannot be copied.
pub fn busybox_rootfs(dir: &Path, extra: &[PathBuf]) -> io::Result<PathBuf> {
    let root = dir.join("rootfs");
    for d in ["bin", "tmp", "proc", "dev", "sys", "etc", "usr/bin"] {
        fs::create_dir_all(root.join(d))?;
    }
    fs::copy(BUSYBOX, root.join("bin/busybox")).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("copying {BUSYBOX} (package busybox-static): {e}"),
        )
    })?;
    let list = Command::new(BUSYBOX).arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        match symlink("busybox", root.join("bin").join(applet)) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    for file in extra {
        copy_with_libs(file, &root)?;
    }
    Ok(root)
}

fn copy_into(src: &Path, root: &Path) -> io::Result<()> {
    let real = fs::canonicalize(src)?;
    let rel = src.strip_prefix("/").map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not absolute", src.display()),
        )
    })?;
    let dst = root.join(rel);
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(&real, &dst)?;
    Ok(())
}

/// The absolute library paths in `ldd` output lines such as
/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux-x86-64.so.2 (0x…)`.
pub fn ldd_paths(ldd_output: &str) -> Vec<PathBuf> {
    ldd_output
        .lines()
        .filter_map(|line| {
            line.split("=>")
                .last()
                .and_then(|s| s.split_whitespace().next())
                .filter(|p| p.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

fn copy_with_libs(file: &Path, root: &Path) -> io::Result<()> {
    copy_into(file, root)?;
    let out = Command::new("ldd").arg(file).output()?;
    for lib in ldd_paths(&String::from_utf8_lossy(&out.stdout)) {
        copy_into(&lib, root)?;
    }
    Ok(())
}

/// `podman run --rm` of `script` under `/bin/sh` in `rootfs` with CDI device `device`. runc,
/// not crun (crun refuses hybrid cgroup layouts), fixed rlimits (raising them is not permitted
/// in every sandbox) and no network (nothing to set up).
pub fn podman_run(device: &str, rootfs: &Path, script: &str) -> Command {
    podman_run_devices(&[device], &[], rootfs, script)
}

/// As [`podman_run`], with CDI devices `devices` in this order (podman applies them in the
/// order given, as the CDI library merges them) and `env` (`K=V`) set as an image would.
pub fn podman_run_devices<S: AsRef<str>>(
    devices: &[S],
    env: &[&str],
    rootfs: &Path,
    script: &str,
) -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["run", "--rm", "--runtime", "runc"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args(["--network", "none"]);
    for e in env {
        cmd.args(["--env", e]);
    }
    for d in devices {
        cmd.args(["--device", d.as_ref()]);
    }
    cmd.arg("--rootfs")
        .arg(rootfs)
        .args(["/bin/sh", "-c", script]);
    cmd
}

/// Writes `<bundle>/config.json` from `runc spec`, running `script` under `/bin/sh` without a
/// terminal, with `edits` (a CDI device's container edits) applied as the CDI library would.
///
/// # Errors
/// `runc spec` fails, the config cannot be read or written, or a device node of `edits` is
/// missing.
pub fn runc_config(bundle: &Path, script: &str, edits: &ContainerEdits) -> io::Result<()> {
    let path = bundle.join("config.json");
    remove_file_if_exists(&path)?;
    let st = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(bundle)
        .status()?;
    if !st.success() {
        return Err(io::Error::other(format!(
            "runc spec --bundle {} failed: {st}",
            bundle.display()
        )));
    }
    let mut config: Value = serde_json::from_slice(&fs::read(&path)?)?;
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!(["/bin/sh", "-c", script]);
    config["root"]["readonly"] = json!(false);
    apply_to_oci_config(&mut config, edits)?;
    fs::write(&path, serde_json::to_vec_pretty(&config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ldd_lines() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x7f)\n\t/lib64/ld-linux-x86-64.so.2 (0x7f)\n";
        assert_eq!(
            ldd_paths(out),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }
}
