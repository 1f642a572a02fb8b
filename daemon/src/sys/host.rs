//! The production leaf: real processes and real mounts.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Duration;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::{CommandOutput, CommandRunner, CommandSpec, Mounter, Processes};

/// How long output is still awaited after a timed-out process was killed.
const KILL_GRACE: Duration = Duration::from_secs(1);

/// Runs processes on the host with `std::process`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostRunner;

impl CommandRunner for HostRunner {
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_clear()
            .envs(&spec.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if spec.new_process_group {
            // setpgid(0, 0) in the child, which posix_spawn does (std's fast path), where a
            // setsid would take a pre_exec closure and with it a fork (below).
            cmd.process_group(0);
        }
        let mut running = lock_running();
        let mut child = match &spec.private_shm {
            Some(shm) => spawn_with_private_shm(&mut cmd, shm)?,
            None => cmd.spawn()?,
        };
        let pid = child.id();
        running.insert(pid as i32);
        drop(running);
        let _unregister = Unregister(pid as i32);
        if let Some(mut stdin) = child.stdin.take() {
            // A program that exits without reading its input must not fail the call: the
            // output tells what happened.
            let _ = stdin.write_all(&spec.stdin);
        }
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let (output, timed_out) = match rx.recv_timeout(spec.timeout) {
            Ok(out) => (out?, false),
            Err(_) => {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                // A grandchild that inherited stdout keeps the pipe open after the kill; the
                // bound must hold anyway, so the output is given up after a short grace.
                match rx.recv_timeout(KILL_GRACE) {
                    Ok(out) => (out?, true),
                    Err(_) => {
                        return Ok(CommandOutput {
                            code: None,
                            stdout: String::new(),
                            stderr: String::new(),
                            timed_out: true,
                        })
                    }
                }
            }
        };
        Ok(CommandOutput {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            timed_out,
        })
    }
}

/// Spawns `cmd` in a new mount namespace whose `/dev/shm` is the host directory `shm`, without
/// forking gpushared.
///
/// The namespace is made by a thread of its own: `unshare(CLONE_FS | CLONE_NEWNS)` moves only
/// the calling thread into a new mount namespace, and a process that thread spawns starts in
/// it. The thread ends right after, so nothing of gpushared but the child stays in the
/// namespace. The mounts are a slave copy of the host's (later host mounts still reach the
/// child; its `/dev/shm` never leaks back) with `shm` bind-mounted on `/dev/shm`.
///
/// Why not a `pre_exec` closure, which did the same in the child: with one, std forks instead
/// of using posix_spawn (a vfork), and a fork write-protects every page gpushared has written
/// for copy-on-write, so that each page written afterwards faults once more. That grew with
/// the daemon's memory and threads (BENCHMARKS.md, "MPS prepare at scale", has the figures).
///
/// # Errors
/// The `unshare` or a mount failing (gpushared lacks CAP_SYS_ADMIN), or the spawn's own.
fn spawn_with_private_shm(cmd: &mut Command, shm: &Path) -> io::Result<Child> {
    std::thread::scope(|s| {
        s.spawn(|| {
            unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS)?;
            mount(
                None::<&Path>,
                "/",
                None::<&Path>,
                MsFlags::MS_REC | MsFlags::MS_SLAVE,
                None::<&Path>,
            )?;
            mount(
                Some(shm),
                "/dev/shm",
                None::<&Path>,
                MsFlags::MS_BIND,
                None::<&Path>,
            )?;
            cmd.spawn()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the thread spawning the process panicked")))
    })
}

/// Pids of children that a [`HostRunner::run`] call is waiting for: the orphan reaper must
/// leave those to `std::process`, or their exit status would be stolen.
static RUNNING: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn lock_running() -> MutexGuard<'static, BTreeSet<i32>> {
    RUNNING.lock().unwrap_or_else(|p| p.into_inner())
}

struct Unregister(i32);

impl Drop for Unregister {
    fn drop(&mut self) {
        lock_running().remove(&self.0);
    }
}

/// Reaps exited children that nobody waits for: as a child subreaper, gpushared inherits the
/// processes that `nvidia-cuda-mps-control -d` double-forks, and PID 1 on some hosts does not
/// reap orphans either. Children a [`HostRunner::run`] call waits for are left alone. Returns
/// the reaped pids.
pub fn reap_orphans() -> Vec<i32> {
    let running = lock_running();
    let me = std::process::id() as i32;
    let mut reaped = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return reaped;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if running.contains(&pid) {
            continue;
        }
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut fields = rest.split(' ');
        let state = fields.next();
        let ppid = fields.next().and_then(|p| p.parse::<i32>().ok());
        if state == Some("Z")
            && ppid == Some(me)
            && waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)).is_ok()
        {
            reaped.push(pid);
        }
    }
    reaped
}

/// The host's processes, through `/proc` and signals.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostProcesses;

impl Processes for HostProcesses {
    fn lock_holder(&self, path: &Path) -> io::Result<Option<i32>> {
        match super::find_lock_holder(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            other => other,
        }
    }

    fn alive(&self, pid: i32) -> bool {
        super::pid_alive(pid)
    }

    fn kill(&self, pid: i32) {
        if pid > 0 {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    fn reap(&self, pid: i32) {
        // ECHILD (not our child) is expected and harmless.
        if pid > 0 {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }

    fn start_time(&self, pid: i32) -> Option<u64> {
        super::process_start_time(pid)
    }

    fn stopped(&self, pid: i32) -> bool {
        super::process_stopped(pid)
    }

    fn with_env_under(&self, var: &str, dir: &Path) -> Vec<(i32, std::path::PathBuf)> {
        super::processes_with_env_under(var, dir)
    }

    fn watch(&self, pid: i32) -> io::Result<std::os::fd::OwnedFd> {
        super::PidFd::open(pid).map(Into::into)
    }
}

/// Mounts with the real syscalls (needs CAP_SYS_ADMIN).
#[derive(Debug, Default, Clone, Copy)]
pub struct HostMounter;

impl Mounter for HostMounter {
    fn mount_tmpfs(&self, target: &Path, size_bytes: u64) -> io::Result<()> {
        let options = format!("size={size_bytes},mode=1777");
        mount(
            Some("tmpfs"),
            target,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some(options.as_str()),
        )
        .map_err(io::Error::from)
    }

    fn unmount(&self, target: &Path) -> io::Result<()> {
        if !self.is_mounted(target)? {
            return Ok(());
        }
        // Detach: a container that still has the tmpfs mounted keeps its copy alive, and the
        // host path is freed at once. Never through a link: a planted one where a claim's shm
        // directory should be would have us unmount whatever it points at.
        umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW).map_err(io::Error::from)
    }

    fn is_mounted(&self, target: &Path) -> io::Result<bool> {
        let text = fs::read_to_string("/proc/self/mountinfo")?;
        // mountinfo shows resolved paths; a target reached through a symlink must be too.
        let real = fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
        Ok(mountinfo_has(&text, &real))
    }
}

/// Whether mountinfo text has a mount point exactly at `target` (octal escapes decoded).
pub(crate) fn mountinfo_has(text: &str, target: &Path) -> bool {
    let want = target.as_os_str().as_bytes();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|field| unescape_octal(field) == want)
}

fn unescape_octal(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let n = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    fn spec(program: &str, args: &[&str], stdin: &str, timeout_ms: u64) -> CommandSpec {
        CommandSpec {
            program: PathBuf::from(program),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::from([("PATH".into(), "/usr/bin:/bin".into())]),
            stdin: stdin.as_bytes().to_vec(),
            timeout: Duration::from_millis(timeout_ms),
            private_shm: None,
            new_process_group: false,
        }
    }

    #[test]
    fn runs_with_stdin_and_exact_env() {
        let out = HostRunner
            .run(&spec(
                "/bin/sh",
                &["-c", "cat; echo \"[$HOME]\" >&2; exit 3"],
                "hi",
                5000,
            ))
            .unwrap();
        assert_eq!(out.stdout, "hi");
        assert_eq!(out.stderr, "[]\n", "HOME is not inherited");
        assert_eq!(out.code, Some(3));
        assert!(!out.timed_out);
    }

    #[test]
    fn kills_at_the_timeout() {
        let start = Instant::now();
        let out = HostRunner
            .run(&spec("/bin/sleep", &["30"], "", 200))
            .unwrap();
        assert!(out.timed_out);
        assert_eq!(out.code, None);
        assert!(start.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn the_bound_holds_when_a_grandchild_keeps_stdout_open() {
        let start = Instant::now();
        let out = HostRunner
            .run(&spec("/bin/sh", &["-c", "sleep 4 & exit 0"], "", 300))
            .unwrap();
        assert!(out.timed_out);
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
    }

    /// `(pid, pgrp, session)` from a `/proc/<pid>/stat` line.
    fn stat_ids(stat: &str) -> (i32, i32, i32) {
        let (pid, rest) = stat.split_once(" (").unwrap();
        let f: Vec<&str> = rest.rsplit_once(") ").unwrap().1.split(' ').collect();
        (
            pid.parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        )
    }

    #[test]
    fn a_new_process_group_is_the_childs_own_in_our_session() {
        let me = stat_ids(&fs::read_to_string("/proc/self/stat").unwrap());
        let mut s = spec("/bin/cat", &["/proc/self/stat"], "", 5000);
        let (_, pgrp, session) = stat_ids(&HostRunner.run(&s).unwrap().stdout);
        assert_eq!((pgrp, session), (me.1, me.2), "without: our group");
        s.new_process_group = true;
        let (pid, pgrp, session) = stat_ids(&HostRunner.run(&s).unwrap().stdout);
        assert_eq!(pgrp, pid, "with: a group it leads");
        assert_eq!(session, me.2, "a process group, not a session");
    }

    /// Held by the tests that make mount namespaces, so that one's scan of our threads never
    /// meets the other's short-lived namespace thread.
    static NAMESPACE_TESTS: Mutex<()> = Mutex::new(());

    /// For a test that makes a mount namespace: `None` (skipped, said on stderr) unless root;
    /// else [`NAMESPACE_TESTS`], held until dropped.
    fn namespace_test() -> Option<MutexGuard<'static, ()>> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return None;
        }
        Some(NAMESPACE_TESTS.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn mount_ns(task: &str) -> PathBuf {
        fs::read_link(format!("/proc/{task}/ns/mnt")).unwrap()
    }

    #[test]
    fn a_private_shm_is_the_childs_dev_shm_and_nobody_elses() {
        let Some(_serial) = namespace_test() else {
            return;
        };
        let shm = tempfile::tempdir().unwrap();
        let marker = format!("gpushare-test-{}", std::process::id());
        fs::write(shm.path().join(&marker), "").unwrap();
        let ours = mount_ns("self");
        let mut s = spec(
            "/bin/sh",
            &["-c", "ls /dev/shm; readlink /proc/self/ns/mnt"],
            "",
            5000,
        );
        s.private_shm = Some(shm.path().to_path_buf());
        let out = HostRunner.run(&s).unwrap();
        assert_eq!(out.code, Some(0), "{out:?}");
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines[..lines.len() - 1],
            [marker.as_str()],
            "its /dev/shm is the directory"
        );
        assert_ne!(
            Path::new(lines[lines.len() - 1]),
            ours,
            "in a mount namespace of its own"
        );
        // The thread that made the namespace is gone: every thread left is in ours, whose
        // /dev/shm is the host's.
        for task in fs::read_dir("/proc/self/task").unwrap().flatten() {
            let task = format!("self/task/{}", task.file_name().to_string_lossy());
            assert_eq!(mount_ns(&task), ours, "{task}");
        }
        assert!(!Path::new("/dev/shm").join(&marker).exists());
    }

    #[test]
    fn a_private_shm_that_cannot_be_mounted_fails_the_spawn() {
        let Some(_serial) = namespace_test() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let witness = dir.path().join("ran");
        let mut s = spec(
            "/bin/sh",
            &["-c", &format!("touch {}", witness.display())],
            "",
            5000,
        );
        s.private_shm = Some(dir.path().join("missing"));
        let err = HostRunner.run(&s).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
        assert!(!witness.exists(), "the program never ran");
    }

    #[test]
    fn mountinfo_matching_decodes_escapes() {
        let text = "36 35 98:0 / /mnt/with\\040space rw - tmpfs tmpfs rw\n\
                    37 35 98:0 / /run/x rw - tmpfs tmpfs rw\n";
        assert!(mountinfo_has(text, Path::new("/mnt/with space")));
        assert!(mountinfo_has(text, Path::new("/run/x")));
        assert!(!mountinfo_has(text, Path::new("/run")));
    }

    #[test]
    fn unmount_never_follows_a_link_to_another_mount() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to mount");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        let link = dir.path().join("link");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        HostMounter.mount_tmpfs(&real, 1 << 20).unwrap();
        // What a planted link where a claim's shm directory should be would ask.
        let result = HostMounter.unmount(&link);
        let still = HostMounter.is_mounted(&real).unwrap();
        let _ = umount2(&real, MntFlags::MNT_DETACH);
        assert!(still, "the link's target was unmounted ({result:?})");
        assert!(result.is_err(), "refused, not pretended done");
    }
}
