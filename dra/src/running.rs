//! The plugin process behind a socket, as the kernel shows it: its pid (the socket's peer
//! credentials), its command line, working directory and `NODE_NAME` (`/proc/<pid>/…`).
//! `gpushare-dra probe` resolves the running plugin's names from these, as the plugin did at
//! its start, instead of from its own defaults: a plugin given `--node-name` through
//! `GPUSHARE_DRA_ARGS` serves that node, whatever the host is called.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// What `/proc` says about the process listening on a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningPlugin {
    /// Its pid.
    pub pid: i32,
    /// Its arguments, the program first (`/proc/<pid>/cmdline`).
    pub args: Vec<String>,
    /// Its working directory, against which a relative `--config` was read.
    pub cwd: PathBuf,
    /// Its environment's `NODE_NAME` (`Some("")` when unset), or `None` when the environment
    /// cannot be read (another user's process, without root).
    pub node_name_env: Option<String>,
}

/// The pid of the process that listens on `socket` (`SO_PEERCRED`); `None` when nothing
/// answers or the listener is in another pid namespace (the kernel then says 0).
pub fn listener_pid(socket: &Path) -> Option<i32> {
    let stream = UnixStream::connect(socket).ok()?;
    let cred =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    Some(cred.pid()).filter(|p| *p > 0)
}

/// NUL-separated strings as `/proc/<pid>/cmdline` and `environ` hold them.
fn nul_separated(raw: &[u8]) -> Vec<String> {
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// `NODE_NAME` in an environment block (`""` when unset).
fn node_name_of(environ: &[u8]) -> String {
    nul_separated(environ)
        .into_iter()
        .rev()
        .find_map(|kv| kv.strip_prefix("NODE_NAME=").map(str::to_string))
        .unwrap_or_default()
}

/// The process `pid` as `/proc` shows it; `None` when its command line or working directory
/// cannot be read (it exited, or another user's without root).
pub fn process(pid: i32) -> Option<RunningPlugin> {
    let args = nul_separated(&std::fs::read(format!("/proc/{pid}/cmdline")).ok()?);
    if args.is_empty() {
        return None;
    }
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    let node_name_env = std::fs::read(format!("/proc/{pid}/environ"))
        .ok()
        .map(|e| node_name_of(&e));
    Some(RunningPlugin {
        pid,
        args,
        cwd,
        node_name_env,
    })
}

/// The process listening on `socket`, when it can be read.
pub fn behind_socket(socket: &Path) -> Option<RunningPlugin> {
    process(listener_pid(socket)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_and_node_name_are_read_as_proc_holds_them() {
        assert_eq!(
            nul_separated(b"/usr/bin/gpushare-dra\0--node-name\0n1\0"),
            ["/usr/bin/gpushare-dra", "--node-name", "n1"]
        );
        assert_eq!(node_name_of(b"PATH=/bin\0NODE_NAME=ip-1\0"), "ip-1");
        assert_eq!(node_name_of(b"PATH=/bin\0NODE_NAMES=x\0"), "");
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = process(i32::try_from(std::process::id()).unwrap_or(i32::MAX))
            .expect("own /proc entry");
        assert_eq!(me.cwd, std::env::current_dir().unwrap());
        assert_eq!(
            me.node_name_env.as_deref(),
            Some(std::env::var("NODE_NAME").unwrap_or_default().as_str())
        );
        assert!(!me.args.is_empty());
    }
}
