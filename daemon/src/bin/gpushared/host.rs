//! What `gpushared` takes from the host at start: its directories (created, checked that only
//! root controls them, resolved, and locked against a second daemon), the programs it runs
//! beside it or on `PATH`, and the socket's group.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

pub(crate) fn beside_exe(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding gpushared's own path")?;
    Ok(exe.with_file_name(name))
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

pub(crate) fn default_mps_control() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding gpushared's own path")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    gpushare::mps_program::default_program(find_in_path, dir, Path::is_file)
        .map_err(|e| anyhow::anyhow!("{e}; pass --mps-control"))
}

/// Holds a POSIX write lock on `<dir>/gpushared.lock` (the directory exists: see
/// [`real_dir`]) for the daemon's life, as long as the returned file stays open; a second
/// daemon on the same `what` directory (`"state"` or `"run"`) is refused at once.
///
/// A POSIX lock, not a flock: the kernel names its holder to anyone who asks
/// (`fcntl(F_GETLK)`, which `gpushare doctor` uses to tell which gpushared owns a
/// directory), and forked children do not inherit it. gpushared never opens this file
/// elsewhere (closing any descriptor of it would drop the lock).
pub(crate) fn lock_instance(dir: &Path, what: &str) -> Result<std::fs::File> {
    let path = dir.join("gpushared.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // A previous gpushared that is still exiting (killed a moment ago) holds the lock until
    // it is gone: wait that out (bounded) rather than fail the restart.
    let deadline = std::time::Instant::now() + INSTANCE_LOCK_WAIT;
    let lock = gpushare::sys::whole_file_write_lock();
    loop {
        use std::os::fd::AsRawFd;
        match nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_SETLK(&lock)) {
            Ok(_) => return Ok(file),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES)
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                let holder = gpushare::sys::find_lock_holder(&path)
                    .ok()
                    .flatten()
                    .map(|pid| format!(", held by pid {pid}"))
                    .unwrap_or_default();
                bail!(
                    "another gpushared already runs on {what} directory {} ({}: {e}{holder})",
                    dir.display(),
                    path.display()
                )
            }
        }
    }
}

/// How long a start waits for the instance lock of a previous gpushared to go.
const INSTANCE_LOCK_WAIT: Duration = Duration::from_secs(2);

pub(crate) fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("making {} absolute", p.display()))
}

/// Creates `dir` if missing, checks that only root controls it (not a symbolic link, no
/// foreign-owned directory or link on the way: see [`gpushare::fsutil::check_trusted_dir`]) and
/// resolves it to its real path. Mount points are compared with `/proc/self/mountinfo`, which
/// shows resolved paths, and the default CDI directory itself (`/var/run/cdi`) usually lies
/// behind the root-owned `/var/run` → `/run` link.
pub(crate) fn real_dir(what: &str, dir: &Path, mode: u32) -> Result<PathBuf> {
    let dir = absolute(dir)?;
    // Created without following a link that is not root's (a missing parent gets 0711).
    gpushare::fsutil::create_dir_if_missing(&dir, mode)
        .with_context(|| format!("creating {what} {}", dir.display()))?;
    gpushare::fsutil::check_trusted_dir(&dir)
        .with_context(|| format!("{what} {}", dir.display()))?;
    std::fs::canonicalize(&dir).with_context(|| format!("resolving {what} {}", dir.display()))
}

/// Resolves `socket.group`: a numeric gid as is, else a name from the group database.
pub(crate) fn resolve_group(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => bail!("socket.group: no group named {group:?} on this host"),
        Err(e) => bail!("socket.group: looking up group {group:?}: {e}"),
    }
}
