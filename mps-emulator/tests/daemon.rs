//! Process-level behaviour of `gpushare-mps-control`: start-up checks, the lock,
//! pipe-directory artefacts, UI sessions, quit, side-by-side daemons and `-f`.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};

use common::{emulator, environ_has_pipe, run_with, text, wait_until, Daemon};

const NO_DAEMON: &str = "Cannot find MPS control daemon process\n";

fn mode(path: &std::path::Path) -> u32 {
    std::fs::symlink_metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn second_daemon_on_same_pipe_dir_is_refused() {
    let daemon = Daemon::start();
    let first = daemon.holder().expect("lock holder");
    for args in [&["-d"][..], &["-f"]] {
        let out = daemon.run(args, &[], "");
        assert_eq!(
            text(&out),
            (
                "An instance of this daemon is already running\n".to_string(),
                String::new(),
                Some(1)
            ),
            "{args:?}"
        );
    }
    // The first daemon is untouched and still answers.
    assert_eq!(daemon.holder(), Some(first));
    let out = daemon.ui("get_default_active_thread_percentage\n");
    assert_eq!(text(&out), ("100.0\n".to_string(), String::new(), Some(0)));
    // Like 535, each refused instance leaves a line in the running daemon's server.log.
    let log_dir = daemon.log.display().to_string();
    assert!(wait_until(|| {
        let server_log = std::fs::read_to_string(daemon.log.join("server.log")).unwrap_or_default();
        server_log
            .lines()
            .filter(|l| {
                l.contains(" Other ") && l.ends_with(&format!("] Using log directory: {log_dir}"))
            })
            .count()
            == 2
    }));
}

#[test]
fn missing_pipe_dir_is_reported() {
    let root = tempfile::tempdir().unwrap();
    // Parents missing: nothing can be created (535 only creates the last component).
    let pipe = root.path().join("no/such/pipe");
    let log = root.path().join("log");
    std::fs::create_dir(&log).unwrap();
    let access = format!("Cannot access CUDA_MPS_PIPE_DIRECTORY={}\n", pipe.display());
    for args in [&["-d"][..], &["-f"]] {
        let out = run_with(&emulator(), args, &pipe, &log, &[], "");
        assert_eq!(
            text(&out),
            (access.clone(), String::new(), Some(1)),
            "{args:?}"
        );
    }
    // With the log directory missing as well, 535 adds its warning around the error
    // (twice with -d, once with -f).
    let bad_log = root.path().join("no/such/log");
    let warning = format!(
        "Warning: Failed writing log files to directory [{}]. No logs will be available.\n",
        bad_log.display()
    );
    let out = run_with(&emulator(), &["-d"], &pipe, &bad_log, &[], "");
    assert_eq!(
        text(&out),
        (
            format!("{warning}{access}{warning}"),
            String::new(),
            Some(1)
        )
    );
    let out = run_with(&emulator(), &["-f"], &pipe, &bad_log, &[], "");
    assert_eq!(
        text(&out),
        (format!("{warning}{access}"), String::new(), Some(1))
    );
    // A pipe "directory" that is a file cannot be used either.
    let file = root.path().join("file");
    std::fs::write(&file, "").unwrap();
    let out = run_with(&emulator(), &["-d"], &file, &log, &[], "");
    assert_eq!(
        text(&out),
        (
            format!("Cannot access CUDA_MPS_PIPE_DIRECTORY={}\n", file.display()),
            String::new(),
            Some(1)
        )
    );
    assert!(!root.path().join("no").exists(), "no directory was created");
    assert_eq!(std::fs::read_dir(&log).unwrap().count(), 0);
    // The UI fails the same way as with no daemon.
    let out = run_with(&emulator(), &[], &pipe, &log, &[], "get_server_list\n");
    assert_eq!(text(&out), (String::new(), NO_DAEMON.to_string(), Some(1)));
}

#[test]
fn missing_last_component_is_created_like_535() {
    let daemon = Daemon::dirs(&emulator());
    std::fs::remove_dir(&daemon.pipe).unwrap();
    std::fs::remove_dir(&daemon.log).unwrap();
    let out = daemon.run(&["-d"], &[], "");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    assert_eq!(mode(&daemon.pipe), 0o777);
    assert_eq!(mode(&daemon.log), 0o700);
    assert!(daemon.log.join("control.log").is_file());
}

#[test]
fn lock_is_held_by_the_daemon_process() {
    let daemon = Daemon::start();
    let holder = daemon.holder().expect("control_lock is locked");
    assert!(environ_has_pipe(holder, &daemon.pipe));
    // The lock holder is the process that logs, i.e. the one answering the UI.
    let log = std::fs::read_to_string(daemon.log.join("control.log")).unwrap();
    let first = log.lines().next().expect("start line");
    assert!(
        first.contains(&format!(
            " Control {holder:>5}] Starting control daemon using socket "
        )),
        "{first}"
    );
    // Daemonized: a new session led by the daemon, not a child of the `-d` caller, stdio
    // on /dev/null.
    let stat = std::fs::read_to_string(format!("/proc/{holder}/stat")).unwrap();
    let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let (ppid, sid): (i32, i32) = (fields[1].parse().unwrap(), fields[3].parse().unwrap());
    assert_ne!(ppid, std::process::id() as i32);
    assert_eq!(sid, holder);
    for fd in 0..=2 {
        let target = std::fs::read_link(format!("/proc/{holder}/fd/{fd}")).unwrap();
        assert_eq!(target, std::path::Path::new("/dev/null"), "fd {fd}");
    }
    // Exactly one process serves this pipe directory.
    let servers: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid| environ_has_pipe(pid, &daemon.pipe))
        .filter(|&pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false)
        })
        .collect();
    assert_eq!(servers, vec![holder]);
}

#[test]
fn pipe_dir_artefacts_and_quit() {
    let daemon = Daemon::start();
    assert_eq!(
        daemon.pipe_entries(),
        ["control", "control_lock", "control_privileged", "log"]
    );
    let meta = |name: &str| std::fs::symlink_metadata(daemon.pipe_path(name)).unwrap();
    assert!(meta("control").file_type().is_socket());
    assert_eq!(mode(&daemon.pipe_path("control")), 0o666);
    assert!(meta("control_privileged").file_type().is_socket());
    assert!(meta("control_lock").file_type().is_file());
    assert_eq!(meta("control_lock").size(), 0);
    assert_eq!(mode(&daemon.pipe_path("control_lock")), 0o666);
    assert!(meta("log").file_type().is_fifo());
    assert_eq!(mode(&daemon.pipe_path("log")), 0o777);
    assert!(!daemon.pipe_path("nvidia-cuda-mps-control.pid").exists());

    let out = daemon.ui("quit\n");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    // When the UI returns, the daemon has released its lock.
    assert_eq!(daemon.holder(), None);
    assert_eq!(
        daemon.pipe_entries(),
        ["control", "control_lock", "control_privileged"]
    );
    let out = daemon.ui("get_server_list\n");
    assert_eq!(text(&out), (String::new(), NO_DAEMON.to_string(), Some(1)));
    // No "UI closed" after quit.
    let log = daemon.log_messages();
    assert_eq!(
        log[log.len() - 3..],
        ["NEW UI", "Cmd:quit", "Exit with status 0"]
    );

    // A new daemon starts over the stale entries.
    let out = daemon.run(&["-d"], &[], "");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    assert_eq!(
        daemon.pipe_entries(),
        ["control", "control_lock", "control_privileged", "log"]
    );
    let out = daemon.ui("get_default_client_priority\n");
    assert_eq!(text(&out), ("0\n".to_string(), String::new(), Some(0)));
}

#[test]
fn ui_session_with_several_commands() {
    let daemon = Daemon::start();
    // The last line has no newline (NVIDIA's device plugin writes commands that way).
    let out = daemon.ui(
        "get_default_active_thread_percentage\n  set_default_active_thread_percentage 40 50  \n\nGET_SERVER_LIST\nget_default_client_priority",
    );
    assert_eq!(
        text(&out),
        (
            "100.0\n40.0\nUnknown command \"\"\nUnknown command \"GET_SERVER_LIST\"\n0\n"
                .to_string(),
            String::new(),
            Some(0)
        )
    );
    let log = daemon.log_messages();
    assert_eq!(
        log[2..],
        [
            "Accepting connection...",
            "NEW UI",
            "Cmd:get_default_active_thread_percentage",
            "100.0",
            // Logged exactly as received.
            "Cmd:  set_default_active_thread_percentage 40 50  ",
            "40.0",
            "Cmd:",
            "Unknown command \"\"",
            "Cmd:GET_SERVER_LIST",
            "Unknown command \"GET_SERVER_LIST\"",
            "Cmd:get_default_client_priority",
            "0",
            "UI closed",
        ]
    );
    // Empty input still makes a (silent) session.
    let out = daemon.ui("");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
}

#[test]
fn control_log_format_and_start_lines() {
    let daemon = Daemon::start_with(
        &emulator(),
        &[
            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "abc"),
            ("CUDA_MPS_CLIENT_PRIORITY", "5"),
        ],
    );
    let holder = daemon.holder().unwrap();
    let text_log = std::fs::read_to_string(daemon.log.join("control.log")).unwrap();
    for line in text_log.lines() {
        // [YYYY-MM-DD HH:MM:SS.mmm Control PPPPP] message
        let b = line.as_bytes();
        assert_eq!(b[0], b'[', "{line}");
        for (i, c) in [
            (5, b'-'),
            (8, b'-'),
            (11, b' '),
            (14, b':'),
            (17, b':'),
            (20, b'.'),
        ] {
            assert_eq!(b[i], c, "{line}");
        }
        assert_eq!(
            &line[24..],
            format!(
                " Control {holder:>5}] {}",
                &line[line.find("] ").unwrap() + 2..]
            ),
            "{line}"
        );
    }
    let pipe = daemon.pipe.display();
    assert_eq!(
        daemon.log_messages(),
        [
            format!("Starting control daemon using socket {pipe}/control"),
            format!("To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={pipe}"),
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE should be between (0.0, 100.0]".to_string(),
            "CUDA_MPS_CLIENT_PRIORITY should be between [0,1]".to_string(),
        ]
    );
    let out = daemon.ui("get_default_active_thread_percentage\nget_default_client_priority\n");
    assert_eq!(
        text(&out),
        ("100.0\n0\n".to_string(), String::new(), Some(0))
    );
    // server.log exists (empty) like 535's.
    assert_eq!(std::fs::read(daemon.log.join("server.log")).unwrap(), b"");
}

#[test]
fn several_daemons_side_by_side() {
    let a = Daemon::start();
    let b = Daemon::start_with(&emulator(), &[("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")]);
    assert_ne!(a.holder(), b.holder());
    let get = "get_default_active_thread_percentage\n";
    assert_eq!(text(&a.ui(get)).0, "100.0\n");
    assert_eq!(text(&b.ui(get)).0, "25.0\n");
    assert_eq!(
        text(&a.ui("set_default_active_thread_percentage 50\n")).0,
        "50.0\n"
    );
    assert_eq!(text(&b.ui(get)).0, "25.0\n");
    assert_eq!(text(&a.ui("quit\n")).2, Some(0));
    assert_eq!(
        text(&b.ui(get)),
        ("25.0\n".to_string(), String::new(), Some(0))
    );
}

#[test]
fn simulated_server_fails_like_one_without_gpu() {
    let daemon = Daemon::start();
    let out = daemon.ui("start_server -uid 0\n");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    assert!(wait_until(|| daemon.log_messages().iter().any(|l| l
        .starts_with("Server ")
        && l.ends_with(" exited with status 1"))));
    let log = daemon.log_messages();
    let start = log
        .iter()
        .position(|l| l.starts_with("Starting new server "))
        .expect("start line");
    let pid: i32 = log[start]
        .trim_start_matches("Starting new server ")
        .trim_end_matches(" for user 0")
        .parse()
        .expect("pid");
    assert_eq!(
        log[start + 1..],
        [
            "UI closed".to_string(),
            format!("Server {pid} exited with status 1"),
            "Removed Shm file at ".to_string(),
        ]
    );
    assert_eq!(text(&daemon.ui("get_server_list\n")).0, "");
    // A server that failed is remembered in the daemon's exit status.
    let out = daemon.ui("quit\n");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    assert_eq!(daemon.log_messages().last().unwrap(), "Exit with status 1");
}

#[test]
fn server_started_and_quit_in_one_session() {
    let daemon = Daemon::start();
    let out = daemon.ui("start_server -uid 0\nquit\nget_server_list\n");
    let (stdout, stderr, _) = text(&out);
    assert_eq!((stdout.as_str(), stderr.as_str()), ("", ""));
    let log = daemon.log_messages();
    assert_eq!(log.last().unwrap(), "Exit with status 1");
    // Nothing after quit is executed.
    assert!(!log.iter().any(|l| l == "Cmd:get_server_list"));
    assert_eq!(daemon.holder(), None);
}

#[test]
fn unprivileged_ui_cannot_quit() {
    if !is_root() {
        eprintln!("note: not root, skipping the unprivileged-user test");
        return;
    }
    let daemon = Daemon::start();
    // Let "nobody" reach the pipe directory.
    std::fs::set_permissions(daemon.root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run_as_nobody = |stdin: &str| {
        use std::io::Write;
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(emulator())
            .env("CUDA_MPS_PIPE_DIRECTORY", &daemon.pipe)
            .uid(65534)
            .gid(65534)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let out = run_as_nobody("quit\nstart_server -uid 0\nget_default_client_priority\n");
    assert_eq!(
        text(&out),
        (
            "Not enough privilege to execute quit command\nInsufficient privileges for UID 65534\n0\n"
                .to_string(),
            String::new(),
            Some(0)
        )
    );
    assert!(daemon.holder().is_some());
}

#[test]
fn foreground_logs_to_stdout() {
    let root = tempfile::tempdir().unwrap();
    let (pipe, log) = (root.path().join("pipe"), root.path().join("log"));
    std::fs::create_dir(&pipe).unwrap();
    std::fs::create_dir(&log).unwrap();
    let mut child = Command::new(emulator())
        .arg("-f")
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The lock is taken before the sockets and the log FIFO exist (as NVIDIA's daemon does):
    // a UI run between the two finds no daemon. The FIFO is made last.
    let ready = wait_until(|| {
        common::lock_holder(&pipe.join("control_lock")).is_some() && pipe.join("log").exists()
    });
    if ready {
        let out = run_with(
            &emulator(),
            &[],
            &pipe,
            &log,
            &[],
            "get_server_list\nquit\n",
        );
        assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    } else {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(ready, "foreground daemon never took its lock");
    let (stdout, stderr, code) = text(&out);
    assert_eq!((stderr.as_str(), code), ("", Some(0)));
    let messages: Vec<&str> = stdout
        .lines()
        .map(|l| &l[l.find("] ").unwrap() + 2..])
        .collect();
    assert_eq!(
        messages,
        [
            format!(
                "Starting control daemon using socket {}/control",
                pipe.display()
            )
            .as_str(),
            &format!(
                "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY={}",
                pipe.display()
            ),
            "Accepting connection...",
            "NEW UI",
            "Cmd:get_server_list",
            "Cmd:quit",
            "Exit with status 0",
        ]
    );
    assert_eq!(
        std::fs::read_dir(&log).unwrap().count(),
        0,
        "no log files with -f"
    );
}

#[test]
fn help_and_unknown_options() {
    for flag in ["-h", "--help"] {
        let out = Command::new(emulator()).arg(flag).output().unwrap();
        let (stdout, stderr, code) = text(&out);
        assert_eq!((stderr.as_str(), code), ("", Some(0)));
        let lines: Vec<&str> = stdout.split('\n').collect();
        assert_eq!(lines.len(), 6, "{stdout:?}");
        assert!(lines[3].starts_with("  "));
    }
    // Anything else is a UI invocation, like 535.
    let root = tempfile::tempdir().unwrap();
    for args in [&["-v"][..], &["-d", "-f"], &["foo"]] {
        let out = run_with(&emulator(), args, root.path(), root.path(), &[], "");
        assert_eq!(
            text(&out),
            (String::new(), NO_DAEMON.to_string(), Some(1)),
            "{args:?}"
        );
    }
}

#[test]
fn multi_user_start_is_a_ui_call_as_in_535() {
    // 535 has no -M: `-d -M` is two arguments, hence the UI, which finds no daemon.
    let daemon = Daemon::dirs(&emulator());
    let out = daemon.run(&["-d", "-M"], &[], "");
    assert_eq!(text(&out), (String::new(), NO_DAEMON.to_string(), Some(1)));
    assert!(daemon.holder().is_none());
}

#[test]
fn stale_sockets_without_daemon() {
    let daemon = Daemon::start();
    let holder = daemon.holder().unwrap();
    // A daemon killed outright leaves everything behind, FIFO included.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(wait_until(|| daemon.holder().is_none()));
    let out = daemon.ui("get_server_list\n");
    assert_eq!(text(&out), (String::new(), NO_DAEMON.to_string(), Some(1)));
    let out = daemon.run(&["-d"], &[], "");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    assert_eq!(text(&daemon.ui("get_server_list\n")).2, Some(0));
}
