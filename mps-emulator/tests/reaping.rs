//! `-d` leaves no zombie behind: the `-d` process reaps its intermediate child, and the
//! daemon is orphaned. Alone in its own test binary because it makes the test process a
//! child subreaper, which would adopt every other test's daemons too.

mod common;

use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use common::{text, wait_until, Daemon};

/// Children of this process as (pid, state letter), from /proc.
fn children() -> Vec<(i32, char)> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
            let state = fields.first()?.chars().next()?;
            (fields.get(1) == Some(&me.as_str())).then_some((pid, state))
        })
        .collect()
}

#[test]
fn daemonize_reaps_the_intermediate_child() {
    // Orphans get re-parented to us instead of init, so any zombie `-d` leaves is visible.
    nix::sys::prctl::set_child_subreaper(true).expect("become a child subreaper");
    let daemon = Daemon::start();
    let holder = daemon.holder().expect("daemon holds the lock");
    // The only adopted process is the running daemon: no zombie intermediate.
    let adopted = children();
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    assert_eq!(adopted[0].0, holder);
    assert_ne!(adopted[0].1, 'Z', "the daemon itself is alive");

    let out = daemon.ui("quit\n");
    assert_eq!(text(&out), (String::new(), String::new(), Some(0)));
    // The daemon exits with the status it logged.
    assert!(wait_until(|| children() == vec![(holder, 'Z')]));
    assert_eq!(
        waitpid(Pid::from_raw(holder), None),
        Ok(WaitStatus::Exited(Pid::from_raw(holder), 0))
    );
    assert!(children().is_empty());
}
