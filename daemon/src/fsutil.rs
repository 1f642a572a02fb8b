//! File helpers shared by the CDI writer and the checkpoint: atomic replace and directory
//! creation with explicit modes.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Replaces `path` with `contents` atomically: a temporary file in the same directory is
/// written, fsynced and renamed over `path`, then the directory is fsynced, so a reader (podman,
/// containerd, a restarted daemon) sees the old file or the new one, never a torn one.
///
/// # Errors
/// Any I/O error; the temporary file is removed on failure.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    // A leading dot keeps CDI scanners (which read only *.json and *.yaml) away from it.
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.set_permissions(Permissions::from_mode(mode))?;
        f.write_all(contents)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Creates `path` and missing parents; the last component gets `mode` exactly (umask aside,
/// which is why the mode is set again afterwards).
///
/// # Errors
/// Any I/O error, or `path` existing as something other than a directory.
pub fn create_dir(path: &Path, mode: u32) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(mode).create(path)?;
    let meta = fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", path.display()),
        ));
    }
    fs::set_permissions(path, Permissions::from_mode(mode))
}

/// Creates `path` (and parents) with `mode` only if it is missing; an existing directory keeps
/// its mode (the CDI directory is shared with other vendors).
///
/// # Errors
/// Any I/O error, or `path` existing as something other than a directory.
pub fn create_dir_if_missing(path: &Path, mode: u32) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", path.display()),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => create_dir(path, mode),
        Err(e) => Err(e),
    }
}

/// Removes a file; a missing file is not an error (removal is idempotent).
///
/// # Errors
/// Any I/O error other than `NotFound`.
pub fn remove_file_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Removes a directory tree; a missing one is not an error.
///
/// # Errors
/// Any I/O error other than `NotFound`.
pub fn remove_dir_all_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        write_atomic(&p, b"one", 0o644).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
    }

    #[test]
    fn create_dir_refuses_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"").unwrap();
        assert!(create_dir(&p, 0o755).is_err());
        let d = dir.path().join("x/y");
        create_dir(&d, 0o711).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o711
        );
    }
}
