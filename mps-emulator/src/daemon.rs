//! The control daemon: `-d` (daemonized) and `-f` (foreground).
//!
//! Start-up follows what NVIDIA's 535 daemon does on disk, because gpushared and other
//! tools look at those artefacts:
//!
//! * the log directory and the pipe directory are created when missing (only the last
//!   component; log dir 0700, pipe dir forced to 0777), and a pipe directory that cannot be
//!   created or used ends the start with `Cannot access CUDA_MPS_PIPE_DIRECTORY=<dir>`;
//! * `control_lock` (0666) is locked with a POSIX `F_SETLK` write lock by the daemon process
//!   itself, so `/proc/locks` names the daemon's pid; a second daemon fails that lock and
//!   says `An instance of this daemon is already running`;
//! * `control` (forced 0666) and `control_privileged` (0777 minus the umask) are
//!   `SOCK_SEQPACKET` listeners, `log` is a FIFO (forced 0777) whose lines end up in
//!   `server.log` (stdout with `-f`);
//! * after `quit` the FIFO is removed and the three other entries stay behind.
//!
//! The daemon is single-threaded like NVIDIA's: one UI connection is served completely
//! before the next is accepted. A simulated MPS server is a forked child that exits at once
//! with status 1, which is what NVIDIA's server does on a host without a GPU; its exit is
//! noticed when the daemon is idle, as with NVIDIA's.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    accept4, bind, getsockopt, listen, setsockopt, socket, sockopt, AddressFamily, Backlog,
    MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::stat::Mode;
use nix::sys::time::{TimeVal, TimeValLike};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, mkfifo, setsid, ForkResult, Pid};

use crate::cli::Dirs;
use crate::command::{Action, Caller, ControlState, Output, StartEnv};
use crate::log::{line_now, open_append, Kind, Sink};
use crate::wire::{recv_frame, send_frame, Frame, Received};

const ALREADY_RUNNING: &str = "An instance of this daemon is already running";

/// How long a simulated server lives. NVIDIA's server needs about 2 ms to fail without a
/// GPU; the daemon only notices when no UI command is pending.
const SERVER_LIFETIME: Duration = Duration::from_millis(2);

/// A stuck UI must not wedge the daemon forever on a full socket.
const UI_SEND_TIMEOUT_SECS: i64 = 10;

/// Why a start failed, as reported to the waiting `-d` parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StartError {
    AlreadyRunning,
    CannotAccess,
}

impl StartError {
    fn code(self) -> u8 {
        match self {
            StartError::AlreadyRunning => 1,
            StartError::CannotAccess => 2,
        }
    }
}

/// Byte the daemon sends its `-d` parent once it listens.
const READY: u8 = 0;

/// Runs `-d` or `-f`; returns the exit status of this process.
pub fn run(dirs: &Dirs, foreground: bool) -> i32 {
    let log_ok = prepare_log_dir(&dirs.log);
    if !log_ok {
        say(&log_warning(dirs));
    }
    if !prepare_pipe_dir(&dirs.pipe) {
        say(&cannot_access(dirs));
        if !log_ok && !foreground {
            // 535's -d prints the log warning a second time on this path.
            say(&log_warning(dirs));
        }
        return 1;
    }
    if foreground {
        match Daemon::start(dirs, true) {
            Ok(mut daemon) => daemon.serve(),
            Err(err) => {
                say(&start_error_text(err, dirs));
                1
            }
        }
    } else {
        daemonize(dirs)
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn log_warning(dirs: &Dirs) -> String {
    format!(
        "Warning: Failed writing log files to directory [{}]. No logs will be available.",
        dirs.log.display()
    )
}

fn cannot_access(dirs: &Dirs) -> String {
    format!(
        "Cannot access CUDA_MPS_PIPE_DIRECTORY={}",
        dirs.pipe.display()
    )
}

fn start_error_text(err: StartError, dirs: &Dirs) -> String {
    match err {
        StartError::AlreadyRunning => ALREADY_RUNNING.to_string(),
        StartError::CannotAccess => cannot_access(dirs),
    }
}

/// Creates the log directory if missing; false when it can be neither found nor created.
fn prepare_log_dir(dir: &Path) -> bool {
    match nix::unistd::mkdir(dir, Mode::from_bits_truncate(0o700)) {
        // 535 stays silent when the path exists, even as a non-directory (it then simply
        // cannot open its log files).
        Ok(()) | Err(Errno::EEXIST) => true,
        Err(_) => false,
    }
}

/// Creates the pipe directory if missing (0777 regardless of umask, like 535) and checks
/// that it is a usable directory.
fn prepare_pipe_dir(dir: &Path) -> bool {
    match nix::unistd::mkdir(dir, Mode::from_bits_truncate(0o777)) {
        Ok(()) => {
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
        }
        Err(Errno::EEXIST) => {}
        Err(_) => return false,
    }
    let is_dir = std::fs::metadata(dir).map(|m| m.is_dir()).unwrap_or(false);
    let access = nix::unistd::AccessFlags::R_OK
        | nix::unistd::AccessFlags::W_OK
        | nix::unistd::AccessFlags::X_OK;
    is_dir && nix::unistd::access(dir, access).is_ok()
}

/// `-d`: double fork so the daemon is not a child of the caller, then wait until it
/// listens (or says why it cannot) before exiting.
fn daemonize(dirs: &Dirs) -> i32 {
    let (ready_r, ready_w) = match nix::unistd::pipe2(OFlag::O_CLOEXEC) {
        Ok(pair) => pair,
        Err(_) => {
            say("Internal error");
            return 1;
        }
    };
    // SAFETY: the process is single-threaded here (nothing in this program starts
    // threads), so the child may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(_) => {
            say("Internal error");
            1
        }
        Ok(ForkResult::Parent { child }) => {
            drop(ready_w);
            // Reap the intermediate child right away so it leaves no zombie.
            let _ = waitpid(child, None);
            let mut byte = [0u8; 1];
            match File::from(ready_r).read(&mut byte) {
                Ok(1) if byte[0] == READY => 0,
                Ok(1) if byte[0] == StartError::AlreadyRunning.code() => {
                    say(ALREADY_RUNNING);
                    1
                }
                Ok(1) => {
                    say(&cannot_access(dirs));
                    1
                }
                _ => {
                    say("Internal error");
                    1
                }
            }
        }
        Ok(ForkResult::Child) => {
            drop(ready_r);
            // SAFETY: still single-threaded, see above.
            match unsafe { fork() } {
                Ok(ForkResult::Child) => {}
                // The intermediate child only exists to orphan the daemon. `_exit` skips
                // Rust and libc exit handlers, which belong to the parent.
                _ => exit_now(0),
            }
            // A new session detaches the daemon from the caller's terminal and job control.
            let _ = setsid();
            redirect_stdio();
            let status = match Daemon::start(dirs, false) {
                Ok(mut daemon) => {
                    let _ = File::from(ready_w).write_all(&[READY]);
                    daemon.serve()
                }
                Err(err) => {
                    let _ = File::from(ready_w).write_all(&[err.code()]);
                    1
                }
            };
            exit_now(status)
        }
    }
}

/// Ends a forked process without running exit handlers or flushing inherited buffers.
fn exit_now(status: i32) -> ! {
    // SAFETY: `_exit` only terminates the calling process; no Rust state is observed after.
    unsafe { libc::_exit(status) }
}

/// The daemon must not keep its caller's stdout/stderr pipes open (callers that capture
/// output would wait forever) nor read its stdin.
fn redirect_stdio() {
    if let Ok(null) = OpenOptions::new().read(true).write(true).open("/dev/null") {
        for target in 0..=2 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), target);
        }
    }
}

/// A running control daemon.
struct Daemon {
    /// Holds the `control_lock` POSIX lock for the daemon's lifetime.
    lock: Option<File>,
    control: Option<OwnedFd>,
    privileged: Option<OwnedFd>,
    fifo: Option<File>,
    fifo_path: std::path::PathBuf,
    sink: Sink,
    server_log: Sink,
    state: ControlState,
    /// Simulated servers with the time their exit becomes visible.
    servers: Vec<(Pid, Instant)>,
}

impl Daemon {
    /// Takes the lock, creates the sockets and the FIFO, logs the start lines.
    fn start(dirs: &Dirs, foreground: bool) -> Result<Daemon, StartError> {
        let lock = take_lock(&dirs.in_pipe("control_lock")).inspect_err(|err| {
            if *err == StartError::AlreadyRunning {
                announce_to_running_daemon(dirs);
            }
        })?;
        let (sink, server_log) = if foreground {
            (Sink::Stdout, Sink::Stdout)
        } else {
            (
                Sink::File(open_append(&dirs.in_log("control.log")).ok()),
                Sink::File(open_append(&dirs.in_log("server.log")).ok()),
            )
        };
        let control_path = dirs.in_pipe("control");
        let control = listen_at(&control_path)?;
        // Everyone may talk to `control`; `control_privileged` keeps its umask-given mode.
        std::fs::set_permissions(&control_path, std::fs::Permissions::from_mode(0o666))
            .map_err(|_| StartError::CannotAccess)?;
        let privileged = listen_at(&dirs.in_pipe("control_privileged"))?;
        let fifo_path = dirs.in_pipe("log");
        let fifo = make_fifo(&fifo_path)?;

        let env = StartEnv {
            active_thread_percentage: env_string("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
            client_priority: env_string("CUDA_MPS_CLIENT_PRIORITY"),
            daemon_uid: nix::unistd::geteuid().as_raw(),
        };
        let (state, warnings) = ControlState::new(&env);
        let mut daemon = Daemon {
            lock: Some(lock),
            control: Some(control),
            privileged: Some(privileged),
            fifo: Some(fifo),
            fifo_path,
            sink,
            server_log,
            state,
            servers: Vec::new(),
        };
        daemon.sink.log(&format!(
            "Starting control daemon using socket {}",
            control_path.display()
        ));
        daemon.sink.log(&format!(
            "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={}",
            dirs.pipe.display()
        ));
        for warning in warnings {
            daemon.sink.log(&warning);
        }
        Ok(daemon)
    }

    /// Accepts UIs until `quit`; returns the daemon's exit status.
    fn serve(&mut self) -> i32 {
        loop {
            let (Some(control), Some(privileged), Some(fifo)) =
                (&self.control, &self.privileged, &self.fifo)
            else {
                return 1;
            };
            let mut fds = [
                PollFd::new(control.as_fd(), PollFlags::POLLIN),
                PollFd::new(privileged.as_fd(), PollFlags::POLLIN),
                PollFd::new(fifo.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, self.next_timeout()) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
            let ready: Vec<bool> = fds
                .iter()
                .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            self.reap_due();
            if ready[2] {
                self.relay_fifo();
            }
            for (index, is_ready) in ready.iter().take(2).enumerate() {
                if !is_ready {
                    continue;
                }
                let listener = if index == 0 {
                    &self.control
                } else {
                    &self.privileged
                };
                let Some(listener) = listener else { continue };
                let Ok(raw) = accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) else {
                    continue;
                };
                // SAFETY: accept4 just returned this descriptor and nothing else owns it.
                let conn = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
                if let Some(status) = self.session(&conn) {
                    return status;
                }
            }
        }
    }

    /// Poll timeout until the next simulated server exit is due.
    fn next_timeout(&self) -> PollTimeout {
        match self.servers.iter().map(|(_, due)| *due).min() {
            None => PollTimeout::NONE,
            Some(due) => {
                let wait = due.saturating_duration_since(Instant::now());
                // Round up so the deadline has passed when poll returns.
                let millis = wait.as_micros().div_ceil(1000);
                PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX)
            }
        }
    }

    /// Serves one UI connection; `Some(status)` when it ended the daemon with `quit`.
    fn session(&mut self, conn: &OwnedFd) -> Option<i32> {
        self.sink.log("Accepting connection...");
        let caller = Caller {
            // Unknown credentials get no privileges.
            uid: getsockopt(conn, sockopt::PeerCredentials)
                .map(|c| c.uid())
                .unwrap_or(u32::MAX),
        };
        let _ = setsockopt(
            conn,
            sockopt::SendTimeout,
            &TimeVal::seconds(UI_SEND_TIMEOUT_SECS),
        );
        if send_frame(conn, &Frame::Hello, MsgFlags::empty()).is_err() {
            return None;
        }
        self.sink.log("NEW UI");
        loop {
            let mut fds = [PollFd::new(conn.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, self.next_timeout()) {
                Ok(0) => {
                    // The UI is idle: now a simulated server's exit can be noticed.
                    self.reap_due();
                    continue;
                }
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => {}
            }
            match recv_frame(conn) {
                Ok(Received::Frame(Frame::Command(line))) => {
                    if let Some(status) = self.command(conn, &line, caller) {
                        return Some(status);
                    }
                }
                Ok(Received::Frame(_) | Received::Garbage) | Err(Errno::EINTR) => {}
                Ok(Received::Eof) | Err(_) => {
                    self.sink.log("UI closed");
                    let _ = send_frame(conn, &Frame::Exit(0), MsgFlags::empty());
                    return None;
                }
            }
        }
    }

    /// Runs one command line; `Some(status)` after `quit`.
    fn command(&mut self, conn: &OwnedFd, line: &[u8], caller: Caller) -> Option<i32> {
        let text = String::from_utf8_lossy(line);
        self.sink.log(&format!("Cmd:{text}"));
        let outcome = self.state.execute(&text, caller);
        for output in outcome.outputs {
            // Log first: a caller that reads control.log after the UI returns sees it all.
            let stdout = match output {
                Output::Reply(text) => {
                    self.sink.log(&text);
                    text
                }
                Output::LogOnly(text) => {
                    self.sink.log(&text);
                    continue;
                }
                Output::StdoutOnly(text) => text,
            };
            let _ = send_frame(conn, &Frame::Output(stdout.into_bytes()), MsgFlags::empty());
        }
        match outcome.action {
            Action::None => None,
            Action::StartServer { uid } => {
                if let Some(pid) = spawn_failing_server() {
                    let line = self.state.server_started(pid.as_raw(), uid);
                    self.sink.log(&line);
                    self.servers.push((pid, Instant::now() + SERVER_LIFETIME));
                }
                None
            }
            Action::Quit { .. } => Some(self.quit(conn)),
        }
    }

    /// Reaps the simulated servers whose exit is due and logs it.
    fn reap_due(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = self.servers.iter().partition(|(_, t)| *t <= now);
        self.servers = later;
        for (pid, _) in due {
            let status = wait_status(pid);
            for line in self.state.server_exited(pid.as_raw(), status) {
                self.sink.log(&line);
            }
        }
    }

    /// Waits for the remaining servers, logs the end, tears down and answers the UI.
    fn quit(&mut self, conn: &OwnedFd) -> i32 {
        let reaped: Vec<(i32, i32)> = std::mem::take(&mut self.servers)
            .into_iter()
            .map(|(pid, _)| (pid.as_raw(), wait_status(pid)))
            .collect();
        let report = self.state.finish_quit(&reaped);
        for line in &report.log {
            self.sink.log(line);
        }
        // The FIFO goes away; control, control_privileged and control_lock stay, like 535.
        let _ = std::fs::remove_file(&self.fifo_path);
        self.fifo = None;
        self.control = None;
        self.privileged = None;
        let _ = send_frame(conn, &Frame::Exit(report.ui_status), MsgFlags::empty());
        // Lines sent after `quit` are ignored; consuming them spares the UI a reset.
        while matches!(
            nix::sys::socket::recv(conn.as_raw_fd(), &mut [0u8; 1], MsgFlags::MSG_DONTWAIT),
            Ok(n) if n > 0
        ) {}
        // Release the lock before the UI sees the connection close, so a new daemon can
        // start as soon as `quit` returns.
        self.lock = None;
        report.exit_status
    }

    /// Copies whatever writers put into the `log` FIFO to server.log (stdout with `-f`).
    fn relay_fifo(&mut self) {
        let Some(fifo) = &mut self.fifo else { return };
        let mut buf = [0u8; 16 * 1024];
        loop {
            match fifo.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => self.server_log.write_raw(&buf[..n]),
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }
}

fn env_string(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// Opens `control_lock` (0666 whatever the umask) and takes the whole-file write lock.
fn take_lock(path: &Path) -> Result<File, StartError> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        // The running daemon's lock file is never modified by a contender.
        .truncate(false)
        .mode(0o666)
        .open(path)
        .map_err(|_| StartError::CannotAccess)?;
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // A process-owned (not open-file-description) lock: /proc/locks then shows the
    // daemon's pid, which is how gpushared finds NVIDIA's daemon too.
    match fcntl(file.as_raw_fd(), FcntlArg::F_SETLK(&lock)) {
        Ok(_) => Ok(file),
        Err(Errno::EAGAIN | Errno::EACCES) => Err(StartError::AlreadyRunning),
        Err(_) => Err(StartError::CannotAccess),
    }
}

/// A refused second instance leaves a line in the running daemon's server.log through
/// its FIFO, as 535 does.
fn announce_to_running_daemon(dirs: &Dirs) {
    let fifo = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(dirs.in_pipe("log"));
    if let Ok(mut fifo) = fifo {
        let message = format!("Using log directory: {}", dirs.log.display());
        let _ = fifo.write_all(line_now(Kind::Other, &message).as_bytes());
    }
}

/// Replaces any stale socket at `path` with a listening `SOCK_SEQPACKET` socket.
fn listen_at(path: &Path) -> Result<OwnedFd, StartError> {
    // Only the lock holder gets here, so an existing file is debris of a dead daemon.
    let _ = std::fs::remove_file(path);
    let sock = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|_| StartError::CannotAccess)?;
    let addr = UnixAddr::new(path).map_err(|_| StartError::CannotAccess)?;
    bind(sock.as_raw_fd(), &addr).map_err(|_| StartError::CannotAccess)?;
    let backlog = Backlog::new(128).unwrap_or(Backlog::MAXCONN);
    listen(&sock, backlog).map_err(|_| StartError::CannotAccess)?;
    Ok(sock)
}

/// Creates the `log` FIFO (0777 whatever the umask) and opens it for reading.
fn make_fifo(path: &Path) -> Result<File, StartError> {
    let _ = std::fs::remove_file(path);
    mkfifo(path, Mode::from_bits_truncate(0o777)).map_err(|_| StartError::CannotAccess)?;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777));
    // Read-write so the daemon is itself a writer: reads never see EOF when the last
    // outside writer leaves, and poll does not spin on POLLHUP.
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|_| StartError::CannotAccess)
}

/// Forks a child standing for an MPS server that fails at once, as NVIDIA's does without
/// a GPU. A real child gives a real, unique pid and a real exit status to report.
fn spawn_failing_server() -> Option<Pid> {
    // SAFETY: the daemon is single-threaded and the child only calls `_exit`.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => exit_now(1),
        Ok(ForkResult::Parent { child }) => Some(child),
        Err(_) => None,
    }
}

/// Waits for a simulated server and returns the status 535 would print.
fn wait_status(pid: Pid) -> i32 {
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, signal, _)) => return signal as i32,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return 1,
        }
    }
}
