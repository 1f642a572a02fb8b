//! Helpers shared by the integration tests: running the program, a daemon guard that
//! always stops its daemon, and lock-holder lookup.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The emulator binary built for these tests.
pub fn emulator() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gpushare-mps-control"))
}

/// `<workspace root>/../shared`, where the reference cases live; `None` when absent.
pub fn shared_dir() -> Option<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Canonicalize first so a symlinked checkout still finds its real neighbours.
    let manifest = manifest
        .canonicalize()
        .unwrap_or_else(|_| manifest.to_path_buf());
    let shared = manifest.join("../../shared");
    shared.is_dir().then_some(shared)
}

/// NVIDIA's program when it is on PATH.
pub fn nvidia_program() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("nvidia-cuda-mps-control"))
        .find(|candidate| candidate.is_file())
}

/// Runs `program args` with the given pipe/log directories and stdin text.
pub fn run_with(
    program: &Path,
    args: &[&str],
    pipe: &Path,
    log: &Path,
    extra_env: &[(&str, &str)],
    stdin: &str,
) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in extra_env {
        cmd.env(key, value);
    }
    let mut child = cmd.spawn().expect("spawn program");
    // One write: the UI then sees all lines at once, like a shell pipe. A UI that exits
    // without reading (no daemon) breaks the pipe; that is fine.
    let mut input = child.stdin.take().expect("stdin");
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    child.wait_with_output().expect("wait program")
}

/// Text of stdout and stderr plus the exit code.
pub fn text(output: &Output) -> (String, String, Option<i32>) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        output.status.code(),
    )
}

/// Pid holding a POSIX lock on `path`, asked of the kernel (`fcntl(F_GETLK)`) like gpushared
/// does: a scan of /proc/locks skips entries while other locks come and go.
pub fn lock_holder(path: &Path) -> Option<i32> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).ok()?;
    let mut probe = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_GETLK(&mut probe)).ok()?;
    (probe.l_type != libc::F_UNLCK as libc::c_short && probe.l_pid > 0).then_some(probe.l_pid)
}

/// Whether `/proc/<pid>/environ` sets `CUDA_MPS_PIPE_DIRECTORY=<pipe>`.
pub fn environ_has_pipe(pid: i32, pipe: &Path) -> bool {
    let wanted = format!("CUDA_MPS_PIPE_DIRECTORY={}", pipe.display());
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| {
            env.split(|&b| b == 0)
                .any(|entry| entry == wanted.as_bytes())
        })
        .unwrap_or(false)
}

/// Polls `cond` for up to five seconds.
pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// A daemon on its own temporary pipe and log directories, stopped on drop: first with
/// `quit`, then, if its lock is still held, by killing the lock holder.
pub struct Daemon {
    /// Program that runs the daemon and its UIs.
    pub program: PathBuf,
    /// Keeps the directories alive for the daemon's lifetime.
    pub root: tempfile::TempDir,
    /// `CUDA_MPS_PIPE_DIRECTORY`.
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`.
    pub log: PathBuf,
}

impl Daemon {
    /// Directories only; nothing started yet.
    pub fn dirs(program: &Path) -> Daemon {
        let root = tempfile::tempdir().expect("tempdir");
        let pipe = root.path().join("pipe");
        let log = root.path().join("log");
        std::fs::create_dir(&pipe).expect("pipe dir");
        std::fs::create_dir(&log).expect("log dir");
        Daemon {
            program: program.to_path_buf(),
            root,
            pipe,
            log,
        }
    }

    /// Starts `program -d` with extra environment and asserts it succeeded.
    pub fn start_with(program: &Path, extra_env: &[(&str, &str)]) -> Daemon {
        let daemon = Daemon::dirs(program);
        let out = daemon.run(&["-d"], extra_env, "");
        assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
        daemon
    }

    /// Starts the emulator with `-d`.
    pub fn start() -> Daemon {
        Daemon::start_with(&emulator(), &[])
    }

    /// Runs the program against this daemon's directories.
    pub fn run(&self, args: &[&str], extra_env: &[(&str, &str)], stdin: &str) -> Output {
        run_with(&self.program, args, &self.pipe, &self.log, extra_env, stdin)
    }

    /// Runs a UI session with `stdin`.
    pub fn ui(&self, stdin: &str) -> Output {
        self.run(&[], &[], stdin)
    }

    /// `<pipe>/<name>`.
    pub fn pipe_path(&self, name: &str) -> PathBuf {
        self.pipe.join(name)
    }

    /// Pid of the process holding `control_lock`.
    pub fn holder(&self) -> Option<i32> {
        lock_holder(&self.pipe_path("control_lock"))
    }

    /// control.log lines without their `[...]` prefix.
    pub fn log_messages(&self) -> Vec<String> {
        std::fs::read_to_string(self.log.join("control.log"))
            .unwrap_or_default()
            .lines()
            .map(|line| match line.find("] ") {
                Some(i) => line[i + 2..].to_string(),
                None => line.to_string(),
            })
            .collect()
    }

    /// Sorted names in the pipe directory.
    pub fn pipe_entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.pipe)
            .expect("read pipe dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let Some(pid) = self.holder() else { return };
        let _ = self.ui("quit\n");
        if !wait_until(|| self.holder().is_none()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            wait_until(|| self.holder().is_none());
        }
    }
}
