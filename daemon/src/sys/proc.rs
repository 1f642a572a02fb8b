//! Reading `/proc`: lock holders, liveness, cgroups.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::kill;
use nix::unistd::Pid;

/// One POSIX or flock lock from `/proc/locks`: the holder's pid and the file's device and
/// inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockEntry {
    /// Holder's pid (in our pid namespace).
    pub pid: i32,
    /// Major device number of the locked file.
    pub major: u32,
    /// Minor device number of the locked file.
    pub minor: u32,
    /// Inode of the locked file.
    pub inode: u64,
}

/// Parses `/proc/locks` text. Lines look like
/// `1: POSIX  ADVISORY  WRITE 2238 fe:00:10010780 0 EOF`; `->` lines (waiters) are skipped.
pub fn parse_proc_locks(text: &str) -> Vec<LockEntry> {
    text.lines()
        .filter(|l| !l.contains("->"))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let pid = fields.get(4)?.parse().ok()?;
            let mut dev = fields.get(5)?.split(':');
            let major = u32::from_str_radix(dev.next()?, 16).ok()?;
            let minor = u32::from_str_radix(dev.next()?, 16).ok()?;
            let inode = dev.next()?.parse().ok()?;
            Some(LockEntry {
                pid,
                major,
                minor,
                inode,
            })
        })
        .collect()
}

/// The pid holding a lock on `path`, if any.
///
/// NVIDIA's MPS control daemon holds a POSIX lock on `<pipe>/control_lock` for its whole life
/// and (in 535) writes no pid file, so the lock is the one reliable way to learn the pid of a
/// daemon that `-d` double-forked away from us.
///
/// # Errors
/// `path` or `/proc/locks` cannot be read.
pub fn find_lock_holder(path: &Path) -> io::Result<Option<i32>> {
    let meta = fs::metadata(path)?;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let text = fs::read_to_string("/proc/locks")?;
    Ok(parse_proc_locks(&text)
        .into_iter()
        .find(|l| l.inode == meta.ino() && l.major == major && l.minor == minor)
        .map(|l| l.pid))
}

/// Whether a process with this pid exists (a zombie counts as gone).
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 || kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself hold spaces.
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

/// Start time of `pid` in clock ticks after boot: field 22 of `/proc/<pid>/stat`. `None`
/// when the process does not exist (or is a zombie) or the file cannot be parsed.
pub fn process_start_time(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_start_time(&stat)
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line; `None` for a zombie.
fn parse_start_time(stat: &str) -> Option<u64> {
    // The command name is parenthesised and may hold spaces and parentheses: count fields
    // after its last `) `. Field 3 (state) is then the first.
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first().is_some_and(|s| *s == "Z" || *s == "X") {
        return None;
    }
    fields.get(22 - 3)?.parse().ok()
}

/// Live processes whose environment sets `var` to a path under `dir` (component-wise), with
/// that path. Every MPS control daemon, UI session and MPS server carries
/// `CUDA_MPS_PIPE_DIRECTORY`, so this finds the MPS processes of a run directory even when a
/// crash left them without the directory (and its lock file) they were started for. Processes
/// whose environment cannot be read are skipped.
pub fn processes_with_env_under(var: &str, dir: &Path) -> Vec<(i32, PathBuf)> {
    let prefix = format!("{var}=");
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let value = env.split(|b| *b == 0).find_map(|kv| {
            kv.strip_prefix(prefix.as_bytes())
                .map(|v| PathBuf::from(std::ffi::OsStr::from_bytes(v)))
        });
        if let Some(path) = value.filter(|p| p.starts_with(dir)) {
            if pid_alive(pid) {
                out.push((pid, path));
            }
        }
    }
    out
}

/// The cgroup of a process: the cgroup v2 path (`0::/…`), else the first v1 line's path.
pub fn read_cgroup(pid: i32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let pick = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::to_string)
    };
    pick("0::").or_else(|| {
        text.lines()
            .next()
            .and_then(|l| l.splitn(3, ':').nth(2))
            .map(str::to_string)
    })
}

/// Parses the `Groups:` line of `/proc/<pid>/status` (supplementary gids, space separated);
/// `None` when the line is missing or malformed.
pub fn parse_status_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    line.split_whitespace().map(|g| g.parse().ok()).collect()
}

/// The supplementary groups of `pid` from `/proc/<pid>/status`; `None` when it cannot be read
/// (the process is gone). SO_PEERCRED carries only the primary gid, and a socket's reading
/// group is usually granted as a supplementary one.
pub fn read_groups(pid: i32) -> Option<Vec<u32>> {
    parse_status_groups(&fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_locks_lines() {
        let text = "1: POSIX  ADVISORY  WRITE 2238 fe:00:10010780 0 EOF\n\
                    2: FLOCK  ADVISORY  WRITE 17 00:1a:42 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 18 00:1a:42 0 EOF\n";
        let locks = parse_proc_locks(text);
        assert_eq!(
            locks,
            vec![
                LockEntry {
                    pid: 2238,
                    major: 0xfe,
                    minor: 0,
                    inode: 10010780
                },
                LockEntry {
                    pid: 17,
                    major: 0,
                    minor: 0x1a,
                    inode: 42
                },
            ]
        );
    }

    #[test]
    fn finds_our_own_lock() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control_lock");
        let file = fs::File::create(&path).unwrap();
        assert_eq!(find_lock_holder(&path).unwrap(), None);
        let lock = libc::flock {
            l_type: libc::F_WRLCK as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: 0,
            l_len: 0,
            l_pid: 0,
        };
        // SAFETY: `lock` is a valid flock struct and the fd is open for the call's duration.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) };
        assert_eq!(rc, 0);
        assert_eq!(
            find_lock_holder(&path).unwrap(),
            Some(std::process::id() as i32)
        );
    }

    #[test]
    fn start_time_is_field_22_even_with_spaces_in_the_name() {
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 1";
        assert_eq!(parse_start_time(stat), Some(987654));
        let zombie = "42 (x) Z 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1 1";
        assert_eq!(parse_start_time(zombie), None);
        let me = std::process::id() as i32;
        assert!(process_start_time(me).is_some_and(|t| t > 0));
        assert_eq!(process_start_time(me), process_start_time(me));
        assert_eq!(process_start_time(i32::MAX), None);
    }

    #[test]
    fn finds_processes_by_an_environment_path() {
        let dir = tempfile::tempdir().unwrap();
        let pipe = dir.path().join("claims/u/mps-1/pipe");
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let found = processes_with_env_under("CUDA_MPS_PIPE_DIRECTORY", &dir.path().join("claims"));
        assert!(found.contains(&(pid, pipe.clone())), "{found:?}");
        let other = processes_with_env_under("CUDA_MPS_PIPE_DIRECTORY", &dir.path().join("clai"));
        assert!(!other.iter().any(|(p, _)| *p == pid), "component-wise");
        child.kill().unwrap();
        child.wait().unwrap();
        let gone = processes_with_env_under("CUDA_MPS_PIPE_DIRECTORY", dir.path());
        assert!(!gone.iter().any(|(p, _)| *p == pid));
    }

    #[test]
    fn liveness_and_cgroup_of_self() {
        let me = std::process::id() as i32;
        assert!(pid_alive(me));
        assert!(!pid_alive(0));
        assert!(!pid_alive(i32::MAX));
        assert!(read_cgroup(me).is_some());
    }

    #[test]
    fn status_groups() {
        let status = "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 27 1000 \nNgid:\t0\n";
        assert_eq!(parse_status_groups(status), Some(vec![4, 27, 1000]));
        assert_eq!(parse_status_groups("Groups:\n"), Some(vec![]));
        assert_eq!(parse_status_groups("Groups:\t4 x\n"), None);
        assert_eq!(parse_status_groups("Name: a\n"), None);
        let mine = read_groups(std::process::id() as i32).expect("own status");
        assert_eq!(mine.len(), nix::unistd::getgroups().unwrap().len());
    }
}
