//! Minimal container root filesystems for the demo and the end-to-end tests: busybox from
//! Debian's `busybox-static`, plus host programs copied in with the libraries `ldd` lists.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

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
