//! Finding the low-level runtime and replacing this process with it.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// PATH used when the environment has none (what a shell would use for root).
pub const FALLBACK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// No candidate runtime is an executable file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeNotFound {
    /// The candidates tried, in order.
    pub candidates: Vec<String>,
    /// The PATH searched for bare names.
    pub path: String,
}

impl std::fmt::Display for RuntimeNotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no low-level OCI runtime found: none of {} is an executable (PATH={})",
            self.candidates.join(", "),
            self.path
        )
    }
}

impl std::error::Error for RuntimeNotFound {}

/// The identity of `path` if it is an executable file.
fn executable_file(path: &Path) -> Option<(u64, u64)> {
    let m = std::fs::metadata(path).ok()?;
    (m.is_file() && m.permissions().mode() & 0o111 != 0).then(|| (m.dev(), m.ino()))
}

/// A file's identity: (device, inode). Two paths name the same file, through any links, when
/// their identities are equal; one `stat` each, where canonicalizing both paths cost a
/// `readlink` per path component.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The first candidate that is an executable file: a candidate containing `/` is used as a
/// path; a bare name is looked up in `path_env` (or [`FALLBACK_PATH`]). A candidate that is
/// this very program (`self_exe`: the same file, through any symbolic or hard link) is
/// skipped, so a configuration naming the wrapper itself cannot make it exec itself forever.
pub fn find_runtime(
    candidates: &[String],
    path_env: Option<&OsStr>,
    self_exe: Option<&Path>,
) -> Result<PathBuf, RuntimeNotFound> {
    let search = path_env
        .filter(|p| !p.is_empty())
        .unwrap_or(OsStr::new(FALLBACK_PATH));
    let me = self_exe.and_then(identity);
    let acceptable = |p: &Path| executable_file(p).is_some_and(|id| Some(id) != me);
    for candidate in candidates {
        if candidate.contains('/') {
            let p = PathBuf::from(candidate);
            if acceptable(&p) {
                return Ok(p);
            }
            continue;
        }
        for dir in std::env::split_paths(search) {
            let p = dir.join(candidate);
            if acceptable(&p) {
                return Ok(p);
            }
        }
    }
    Err(RuntimeNotFound {
        candidates: candidates.to_vec(),
        path: search.to_string_lossy().into_owned(),
    })
}

/// Set in the low-level runtime's environment: if this wrapper is started again with it, some
/// runtime in between (a script, a symlink, another wrapper) leads back here, and going on
/// would exec in a circle forever.
pub const LOOP_MARKER: &str = "GPUSHARE_RUNTIME_ACTIVE";

/// Replaces this process with `runtime`, argv\[0\] set to the runtime's path and the other
/// arguments exactly `args`; the environment (plus [`LOOP_MARKER`]), pid, file descriptors and
/// signal dispositions carry over, except SIGPIPE, which Rust's exec sets back to its default.
/// Returns only on failure.
pub fn exec_runtime(runtime: &Path, args: &[OsString]) -> std::io::Error {
    // Set in this process's own environment, which the exec then passes on as it is: a
    // `Command::env` would have copied and sorted the whole environment first, a third of
    // the wrapper's own instructions. The wrapper starts no threads, so nothing reads the
    // environment while it changes.
    std::env::set_var(LOOP_MARKER, "1");
    Command::new(runtime).arg0(runtime).args(args).exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make_exe(path: &Path) {
        std::fs::write(path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn bare_names_are_searched_on_path_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        make_exe(&b.join("crun"));
        make_exe(&a.join("crun"));
        std::fs::write(a.join("runc"), "not executable").unwrap();
        std::fs::create_dir(b.join("runc")).unwrap();
        let path = std::env::join_paths([&a, &b]).unwrap();
        let found = find_runtime(&["runc".into(), "crun".into()], Some(&path), None).unwrap();
        assert_eq!(found, a.join("crun"));
        make_exe(&b.join("runc2"));
        let found = find_runtime(&["runc2".into()], Some(&path), None).unwrap();
        assert_eq!(found, b.join("runc2"));
    }

    #[test]
    fn paths_are_used_as_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("nvidia-container-runtime");
        make_exe(&exe);
        let candidates = vec![
            dir.path().join("missing").display().to_string(),
            exe.display().to_string(),
        ];
        assert_eq!(
            find_runtime(&candidates, Some(OsStr::new("/nonexistent")), None).unwrap(),
            exe
        );
    }

    #[test]
    fn the_wrapper_itself_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let me = dir.path().join("runc");
        make_exe(&me);
        let link = dir.path().join("runc-link");
        std::os::unix::fs::symlink(&me, &link).unwrap();
        let err = find_runtime(
            &[me.display().to_string(), link.display().to_string()],
            None,
            Some(&me),
        )
        .unwrap_err();
        assert_eq!(err.candidates.len(), 2);
        // A hard link is the same file too; another executable beside it is taken.
        let hard = dir.path().join("runc-hard");
        std::fs::hard_link(&me, &hard).unwrap();
        let other = dir.path().join("crun");
        make_exe(&other);
        let found = find_runtime(
            &[
                link.display().to_string(),
                hard.display().to_string(),
                other.display().to_string(),
            ],
            None,
            Some(&me),
        )
        .unwrap();
        assert_eq!(found, other);
    }

    #[test]
    fn the_running_program_is_named_through_proc_self_exe() {
        // The test binary is "this program": found by its own path, it is skipped.
        let exe = std::env::current_exe().unwrap();
        let err = find_runtime(
            &[exe.display().to_string()],
            None,
            Some(Path::new("/proc/self/exe")),
        )
        .unwrap_err();
        assert_eq!(err.candidates, vec![exe.display().to_string()]);
    }

    #[test]
    fn not_found_is_one_readable_line() {
        let err = find_runtime(
            &["runc".into(), "crun".into()],
            Some(OsStr::new("/nonexistent-a:/nonexistent-b")),
            None,
        )
        .unwrap_err();
        let msg = err.to_string();
        assert_eq!(
            msg,
            "no low-level OCI runtime found: none of runc, crun is an executable (PATH=/nonexistent-a:/nonexistent-b)"
        );
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn exec_failure_is_returned() {
        let err = exec_runtime(Path::new("/nonexistent/runc"), &[]);
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
