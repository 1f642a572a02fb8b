//! Reading `/proc` (liveness, cgroups, environments) and asking the kernel for lock holders.

use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::kill;
use nix::unistd::Pid;

/// The pid holding a POSIX lock on `path`, if any; `Ok(None)` as well when `path` is not a
/// regular file (no MPS control daemon locks anything else).
///
/// NVIDIA's MPS control daemon holds a POSIX lock on `<pipe>/control_lock` for its whole life
/// and (in 535) writes no pid file, so the lock is the one reliable way to learn the pid of a
/// daemon that `-d` double-forked away from us. The kernel is asked directly (`fcntl(F_GETLK)`
/// for a write lock over the whole file), which is exact and O(1): a scan of `/proc/locks`
/// costs what the host's every lock costs and, read in pieces while other locks come and go,
/// skips entries, which once made a running daemon look gone (a start on its pipe directory
/// then failed with "An instance of this daemon is already running").
///
/// Locks held by this process itself do not conflict with the probe and are never reported:
/// gpushared holds none on MPS files.
///
/// # Errors
/// `path` cannot be opened, or the holder is outside this pid namespace (its pid reads 0).
pub fn find_lock_holder(path: &Path) -> io::Result<Option<i32>> {
    if !fs::symlink_metadata(path)?.is_file() {
        return Ok(None);
    }
    // O_NONBLOCK and O_NOFOLLOW: a file swapped for a fifo or a link after the check above
    // neither blocks the open nor leads elsewhere.
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let mut probe = whole_file_write_lock();
    nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut probe))?;
    if probe.l_type == libc::F_UNLCK as libc::c_short {
        return Ok(None);
    }
    if probe.l_pid <= 0 {
        return Err(io::Error::other(format!(
            "{} is locked by a process outside this pid namespace",
            path.display()
        )));
    }
    Ok(Some(probe.l_pid))
}

/// A POSIX write lock over the whole file (`F_WRLCK` from offset 0 to the end, however it
/// grows): what gpushared holds on its instance lock, what NVIDIA's MPS control daemon holds
/// on `control_lock`, and the probe [`find_lock_holder`] asks the kernel with.
pub fn whole_file_write_lock() -> libc::flock {
    libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    }
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

/// Whether `pid` is stopped: by a signal (`T`: SIGSTOP, SIGTSTP, …) or under a tracer (`t`),
/// as field 3 of `/proc/<pid>/stat` says. Such a process answers nothing until it is continued,
/// so a control session on it can only run out its timeout. `false` when it does not exist or
/// the file cannot be read (nothing is known, and nothing is skipped on a guess).
pub fn process_stopped(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| parse_stopped(&stat))
}

/// Whether the state (field 3) of a `/proc/<pid>/stat` line is `T` or `t`.
fn parse_stopped(stat: &str) -> bool {
    stat.rsplit_once(") ")
        .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
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

    /// A process other than ours holding a POSIX write lock on `path` until a byte is written
    /// to the returned pipe (the child holds a copy of its write end, so closing ours is not
    /// enough); returns its pid once the lock is held.
    fn hold_lock_in_child(path: &Path) -> (i32, std::os::fd::OwnedFd) {
        use std::ffi::CString;
        let cpath = CString::new(path.as_os_str().as_bytes()).unwrap();
        let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
        let (release_r, release_w) = nix::unistd::pipe().unwrap();
        // SAFETY: the child calls only async-signal-safe functions (open, fcntl, write, read,
        // _exit) on memory prepared before the fork, so another thread's lock held at the
        // fork cannot be waited on.
        match unsafe { nix::unistd::fork() }.unwrap() {
            // SAFETY: raw libc calls on a NUL-terminated path, a valid flock struct and
            // one-byte buffers that live through each call; the child never returns.
            nix::unistd::ForkResult::Child => unsafe {
                let fd = libc::open(cpath.as_ptr(), libc::O_RDWR);
                let lock = whole_file_write_lock();
                if fd < 0 || libc::fcntl(fd, libc::F_SETLK, &lock) != 0 {
                    libc::_exit(1);
                }
                libc::write(ready_w.as_raw_fd(), b"x".as_ptr().cast(), 1);
                let mut b = 0u8;
                libc::read(release_r.as_raw_fd(), (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            },
            nix::unistd::ForkResult::Parent { child } => {
                drop(ready_w);
                drop(release_r);
                let mut b = [0u8; 1];
                assert_eq!(nix::unistd::read(ready_r.as_raw_fd(), &mut b).unwrap(), 1);
                (child.as_raw(), release_w)
            }
        }
    }

    #[test]
    fn finds_another_process_lock_while_other_locks_come_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control_lock");
        fs::File::create(&path).unwrap();
        let churn: Vec<fs::File> = (0..32)
            .map(|i| fs::File::create(dir.path().join(format!("other-{i}"))).unwrap())
            .collect();
        assert_eq!(find_lock_holder(&path).unwrap(), None, "not locked yet");
        let (pid, release) = hold_lock_in_child(&path);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let missed = std::thread::scope(|s| {
            // Other locks taken and dropped all the time, as on a node where MPS daemons,
            // package managers and databases come and go: a listing of /proc/locks read in
            // pieces skips entries that moved between two reads.
            s.spawn(|| {
                let set = |f: &fs::File, t: libc::c_int| {
                    let lock = libc::flock {
                        l_type: t as libc::c_short,
                        ..whole_file_write_lock()
                    };
                    // SAFETY: a valid flock struct; the fd is open for the call's duration.
                    unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &lock) };
                };
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    churn.iter().for_each(|f| set(f, libc::F_WRLCK));
                    churn.iter().for_each(|f| set(f, libc::F_UNLCK));
                }
            });
            let missed = (0..3000)
                .filter(|_| find_lock_holder(&path).unwrap() != Some(pid))
                .count();
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            missed
        });
        nix::unistd::write(&release, b"x").unwrap();
        nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(missed, 0, "the holder was missed {missed} times in 3000");
        assert_eq!(find_lock_holder(&path).unwrap(), None, "released at exit");
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
    fn a_stopped_process_is_seen_in_its_state_field() {
        assert!(parse_stopped("42 (a) b (c) T 1 42 42 0"));
        assert!(parse_stopped("42 (gdb) t 1 42 42 0"));
        assert!(
            !parse_stopped("42 (T) S 1 42 42 0"),
            "the name is not the state"
        );
        assert!(!parse_stopped("42 (x) R 1"));
        assert!(!parse_stopped("garbage"));
        let mut child = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let state = |stopped: bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while process_stopped(pid) != stopped && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            process_stopped(pid)
        };
        assert!(!state(false), "running");
        kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP).unwrap();
        assert!(state(true), "SIGSTOPped");
        kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT).unwrap();
        assert!(!state(false), "continued");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!process_stopped(pid), "gone");
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
