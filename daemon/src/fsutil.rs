//! File helpers shared by the CDI writer, the checkpoint and the MPS strategy: atomic replace,
//! directory creation with explicit modes that never follows a symbolic link, and the check
//! that a configured directory is one only root controls.
//!
//! The threat: `gpushared` runs as root and writes under its run, state and CDI directories.
//! Anyone who can plant a symbolic link (or own a directory) on one of those paths could make
//! it create, chmod or overwrite files elsewhere. So a configured directory must be a real
//! directory, reached only through links and directories owned by root, and writable by root
//! alone ([`check_trusted_dir`]); every directory created below it is opened with `O_NOFOLLOW`
//! and changed through that handle ([`create_dir`]); every file is created with `O_EXCL` and
//! `O_NOFOLLOW` and renamed into place ([`write_atomic`]).

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Mode of missing parents that [`create_dir`] creates: traversable (a bind-mount source
/// below must stay reachable) but not listable by others.
pub const PARENT_MODE: u32 = 0o711;

fn refused(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}; refusing it", path.display()),
    )
}

fn our_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Refuses `path` when it contains `..` or when a symbolic link on the way (as written, the
/// last component included when it exists) is owned by anyone but root or us: only root can
/// plant those in root's directories, and whoever else could is not to be followed.
fn check_links_on_the_way(path: &Path) -> io::Result<()> {
    let me = our_uid();
    let mut prefix = PathBuf::new();
    for c in path.components() {
        if matches!(c, Component::ParentDir) {
            return Err(refused(path, "contains \"..\""));
        }
        prefix.push(c);
        let m = match fs::symlink_metadata(&prefix) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if m.file_type().is_symlink() && m.uid() != 0 && m.uid() != me {
            return Err(refused(
                &prefix,
                format_args!("is a symbolic link owned by uid {}", m.uid()),
            ));
        }
    }
    Ok(())
}

/// Checks that `dir` (absolute) is a directory only root (or this process's uid) controls:
/// `dir` itself is not a symbolic link; every symbolic link on the way is owned by root; every
/// directory of its resolved path is owned by root or us, and not writable by others unless it
/// is sticky (`/tmp`); `dir` itself is writable by its owner alone. Links owned by root, such as
/// `/var/run` → `/run`, are fine.
///
/// # Errors
/// `PermissionDenied` naming the offending path and why; `NotFound` and other I/O errors as
/// they come.
pub fn check_trusted_dir(dir: &Path) -> io::Result<()> {
    if !dir.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not an absolute path", dir.display()),
        ));
    }
    let me = our_uid();
    let trusted_owner = |uid: u32| uid == 0 || uid == me;
    let meta = fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() {
        return Err(refused(
            dir,
            "is a symbolic link (name the real directory instead)",
        ));
    }
    if !meta.is_dir() {
        return Err(refused(dir, "is not a directory"));
    }
    check_links_on_the_way(dir)?;
    // The directories it resolves to.
    let real = fs::canonicalize(dir)?;
    let mut prefix = PathBuf::new();
    let count = real.components().count();
    for (i, c) in real.components().enumerate() {
        prefix.push(c);
        let m = fs::metadata(&prefix)?;
        if !trusted_owner(m.uid()) {
            return Err(refused(
                &prefix,
                format_args!("is owned by uid {}, not by root", m.uid()),
            ));
        }
        let mode = m.mode();
        let last = i + 1 == count;
        let sticky = mode & 0o1000 != 0;
        if last && mode & 0o022 != 0 {
            return Err(refused(
                &prefix,
                format_args!(
                    "is writable by group or others (mode {:04o})",
                    mode & 0o7777
                ),
            ));
        }
        if !last && mode & 0o002 != 0 && !sticky {
            return Err(refused(
                &prefix,
                format_args!(
                    "is writable by others and not sticky (mode {:04o})",
                    mode & 0o7777
                ),
            ));
        }
    }
    Ok(())
}

/// Replaces `path` with `contents` atomically: a temporary file in the same directory is
/// written, fsynced and renamed over `path`, then the directory is fsynced, so a reader (podman,
/// containerd, a restarted daemon) sees the old file or the new one, never a torn one.
///
/// # Errors
/// Any I/O error; the temporary file is removed on failure.
pub fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    path.parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))?;
    write_via(path, &temporary_for(path, "")?, contents, mode, true, true)
}

/// Replaces `path` with `contents` as [`write_atomic`] does, but without any fsync: a reader,
/// or this daemon restarted after a crash of its own process (`kill -9`), sees the old file or
/// the new one, never a torn one (the kernel's page cache outlives the process), but a power
/// loss may lose the change. For what dies with the boot anyway: a claim's run-directory
/// record with its attached containers (`/run` is a tmpfs, where an fsync costs nothing
/// either).
///
/// # Errors
/// Any I/O error; the temporary file is removed on failure.
pub fn write_replace(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    path.parent()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))?;
    write_via(
        path,
        &temporary_for(path, "r")?,
        contents,
        mode,
        false,
        false,
    )
}

/// Writes `path` as [`write_atomic`] does, fsyncing the file but not its directory: the caller
/// writes several files of one directory and makes their renames durable at once with
/// [`sync_dir`] (one flush for a batch instead of one per file).
///
/// # Errors
/// Any I/O error; the temporary file is removed on failure.
pub fn write_synced(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    write_via(
        path,
        &temporary_for(path, "s")?,
        contents,
        mode,
        true,
        false,
    )
}

/// The temporary file a write of `path` goes through: `.<name>.tmp-<pid>-<tag><n>` beside
/// it. A leading dot keeps CDI scanners (which read only *.json and *.yaml) away from it; the
/// pid tells whose it is (see [`temporary_writer`]); the counter keeps two writers of one
/// path in this process off each other's file; the tag tells the three kinds of write apart.
fn temporary_for(path: &Path, tag: &str) -> io::Result<PathBuf> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(dir.join(format!(
        ".{}.tmp-{}-{tag}{n}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// fsyncs directory `dir`, making the renames and removals in it durable.
///
/// # Errors
/// Any I/O error.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The pid of the process that wrote `name`, when `name` is one of [`write_atomic`]'s
/// temporary files for the file called `target` (`.<target>.tmp-<pid>-<n>`): a write killed
/// half-way leaves one behind, which may go once that process is gone.
pub fn temporary_writer(name: &str, target: &str) -> Option<i32> {
    let rest = name
        .strip_prefix('.')?
        .strip_prefix(target)?
        .strip_prefix(".tmp-")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// [`write_atomic`] through the temporary file `tmp` (in `path`'s directory).
fn write_via(
    path: &Path,
    tmp: &Path,
    contents: &[u8],
    mode: u32,
    sync_file: bool,
    sync_parent: bool,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // A leftover of a crash, or something planted: O_EXCL below never writes through it.
    remove_file_if_exists(tmp)?;
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(tmp)?;
        f.set_permissions(Permissions::from_mode(mode))?;
        f.write_all(contents)?;
        if sync_file {
            f.sync_all()?;
        }
        fs::rename(tmp, path)?;
        if sync_parent {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// Creates `path` with exactly `mode`, and missing parents with [`PARENT_MODE`], never
/// following a symbolic link: each directory created (or found) is opened with `O_NOFOLLOW`,
/// checked to be ours and chmodded through that handle. An existing parent is taken as it is
/// unless a symbolic link on its way belongs to someone but root (the configured directories
/// above were checked by [`check_trusted_dir`]).
///
/// # Errors
/// `PermissionDenied` when a component is a symbolic link or a directory owned by another uid;
/// `AlreadyExists` when it is not a directory; any other I/O error.
pub fn create_dir(path: &Path, mode: u32) -> io::Result<()> {
    check_links_on_the_way(path)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            create_dir(parent, PARENT_MODE)?;
        }
    }
    match DirBuilder::new().mode(mode).create(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // With O_DIRECTORY the kernel reports a link as ENOTDIR.
            Some(libc::ELOOP | libc::ENOTDIR)
                if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                refused(path, "is a symbolic link")
            }
            Some(libc::ENOTDIR) => io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a directory", path.display()),
            ),
            _ => e,
        })?;
    let meta = dir.metadata()?;
    if meta.uid() != our_uid() {
        return Err(refused(
            path,
            format_args!("is owned by uid {}, not by gpushared", meta.uid()),
        ));
    }
    dir.set_permissions(Permissions::from_mode(mode))
}

/// Makes `path` a directory of ours with exactly `mode`, as [`create_dir`] does, but returns at
/// once (one `lstat`, nothing written) when it already is one: the start-up reconcile checks
/// every claim's directory, and the full walk of [`create_dir`] for each was a good part of a
/// restart on a node holding many claims.
///
/// # Errors
/// As [`create_dir`].
pub fn ensure_dir(path: &Path, mode: u32) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() && meta.uid() == our_uid() && meta.mode() & 0o7777 == mode => {
            Ok(())
        }
        _ => create_dir(path, mode),
    }
}

/// Creates `path` (and parents) with `mode` only if it is missing, as [`create_dir`] does; an
/// existing directory keeps its mode (the CDI directory is shared with other vendors).
///
/// # Errors
/// Any I/O error; `PermissionDenied` when `path` is a symbolic link or a link on its way is
/// not root's; `AlreadyExists` when it is something else than a directory.
pub fn create_dir_if_missing(path: &Path, mode: u32) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(meta) if meta.file_type().is_symlink() => Err(refused(
            path,
            "is a symbolic link (name the real directory instead)",
        )),
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

/// Why [`read_own_file`] refused what it found.
#[derive(Debug)]
pub enum ReadRefusal {
    /// Nothing is there.
    Missing,
    /// Something other than a regular file is there (a directory, a symbolic link, a fifo,
    /// a socket, a device node): named in words.
    NotAFile(&'static str),
    /// A regular file larger than the limit, with its size in bytes.
    TooLarge(u64),
    /// It could not be opened or read.
    Io(io::Error),
}

impl std::fmt::Display for ReadRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadRefusal::Missing => f.write_str("it does not exist"),
            ReadRefusal::NotAFile(what) => write!(f, "it is {what}, not a regular file"),
            ReadRefusal::TooLarge(n) => write!(f, "it is {n} bytes long, larger than any we write"),
            ReadRefusal::Io(e) => write!(f, "reading it: {e}"),
        }
    }
}

/// What kind of thing `t` is, in words, when it is not a regular file.
fn not_a_file(t: fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_symlink() {
        Some("a symbolic link")
    } else if t.is_fifo() {
        Some("a fifo")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device node")
    } else {
        Some("not a file")
    }
}

/// Reads a file this daemon wrote itself (the checkpoint, a claim's host record, a CDI spec)
/// as the input it is: only a regular file, never through a symbolic link, at most
/// `max_bytes` long. The type is looked at before opening (opening a fifo would block, a
/// device node may act), and checked again on the handle (opened `O_NOFOLLOW | O_NONBLOCK`),
/// so a swap in between is refused too.
///
/// # Errors
/// [`ReadRefusal`]: missing, not a regular file, too large, or an I/O error.
pub fn read_own_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, ReadRefusal> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadRefusal::Missing),
        Err(e) => return Err(ReadRefusal::Io(e)),
    };
    if let Some(what) = not_a_file(meta.file_type()) {
        return Err(ReadRefusal::NotAFile(what));
    }
    read_listed_file(path, max_bytes)
}

/// As [`read_own_file`], for a path that a directory listing has just reported as a regular
/// file: the listing's entry type (`d_type`, which `readdir` returns with the name, at no
/// cost) stands for the look before opening, and the handle is checked as there. A restart
/// reads every claim's record, and on this path the `lstat` was a fifth of the time each
/// read took. A listing that could not tell the type (`DT_UNKNOWN`) is no such report: use
/// [`read_own_file`].
///
/// The file is read up to the size its handle reports, not on to an end-of-file read: ours
/// are replaced by rename, never grown in place. One that reports no size (as `/proc`'s do)
/// is read to its end, bounded.
///
/// # Errors
/// As [`read_own_file`].
pub fn read_listed_file(path: &Path, max_bytes: u64) -> Result<Vec<u8>, ReadRefusal> {
    use std::io::Read;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ReadRefusal::Missing),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ReadRefusal::NotAFile("a symbolic link"))
        }
        Err(e) => return Err(ReadRefusal::Io(e)),
    };
    let meta = file.metadata().map_err(ReadRefusal::Io)?;
    if let Some(what) = not_a_file(meta.file_type()) {
        return Err(ReadRefusal::NotAFile(what));
    }
    if meta.len() > max_bytes {
        return Err(ReadRefusal::TooLarge(meta.len()));
    }
    let limit = if meta.len() == 0 {
        max_bytes + 1
    } else {
        meta.len()
    };
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    // Bounded even if it grows while being read.
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(ReadRefusal::Io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(ReadRefusal::TooLarge(bytes.len() as u64));
    }
    Ok(bytes)
}

#[cfg(test)]
#[path = "fsutil_tests.rs"]
mod tests;
