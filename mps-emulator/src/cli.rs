//! Command line and environment, as NVIDIA's 535 program reads them.
//!
//! 535 recognises an option only when it is the single argument: `-d`, `-f`, `-h`,
//! `--help`. Anything else (`-v`, `-d -f`, `foo`, and `-d -M`, the multi-user start of newer
//! releases) runs the UI front end, which then finds no daemon. The emulator does the same, so
//! that gpushared behaves alike with either program.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// What one invocation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Print the banner and exit 0.
    Help,
    /// Start a control daemon.
    Daemon {
        /// `-f`: stay in the foreground, log to stdout, write no log files.
        foreground: bool,
    },
    /// Front end: send stdin's lines to the daemon, print its replies.
    Ui,
}

/// Chooses the mode from the arguments after the program name.
pub fn parse_mode<S: AsRef<OsStr>>(args: &[S]) -> Mode {
    let args: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    let is = |a: &OsStr, s: &str| a == OsStr::new(s);
    match args.as_slice() {
        [a] if is(a, "-h") || is(a, "--help") => Mode::Help,
        [a] if is(a, "-d") || is(a, "-f") => Mode::Daemon {
            foreground: is(a, "-f"),
        },
        _ => Mode::Ui,
    }
}

/// Banner for `-h`/`--help`, shaped like NVIDIA's (title, notice, blank, indented text,
/// blank) so scripts that skim it see the same layout.
pub const HELP: &str = "\
gpushare MPS Control emulator for Linux.
Part of gpushare, licensed under the Apache License 2.0.

  This program stands in for nvidia-cuda-mps-control (535, legacy command interface) where NVIDIA's program is absent: -d starts a control daemon, -f runs one in the foreground, and with no option it sends the commands read from standard input to the daemon.

";

/// NVIDIA's default pipe directory.
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// NVIDIA's default log directory.
pub const DEFAULT_LOG_DIR: &str = "/var/log/nvidia-mps";

/// The pipe and log directories of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    /// `CUDA_MPS_PIPE_DIRECTORY`: sockets, lock file and log FIFO.
    pub pipe: PathBuf,
    /// `CUDA_MPS_LOG_DIRECTORY`: control.log and server.log.
    pub log: PathBuf,
}

impl Dirs {
    /// Reads both variables; unset or empty means NVIDIA's defaults.
    pub fn from_env() -> Self {
        Self::from_values(
            std::env::var_os("CUDA_MPS_PIPE_DIRECTORY"),
            std::env::var_os("CUDA_MPS_LOG_DIRECTORY"),
        )
    }

    /// Same as [`Dirs::from_env`] with explicit values.
    pub fn from_values(pipe: Option<OsString>, log: Option<OsString>) -> Self {
        let pick = |value: Option<OsString>, default: &str| {
            PathBuf::from(value.filter(|v| !v.is_empty()).unwrap_or(default.into()))
        };
        Dirs {
            pipe: pick(pipe, DEFAULT_PIPE_DIR),
            log: pick(log, DEFAULT_LOG_DIR),
        }
    }

    /// `<pipe>/<name>` spelled like NVIDIA's `"%s/<name>"`, so the text in messages
    /// matches even when the variable ends with a slash.
    pub fn in_pipe(&self, name: &str) -> PathBuf {
        join_raw(&self.pipe, name)
    }

    /// `<log>/<name>`, spelled like [`Dirs::in_pipe`].
    pub fn in_log(&self, name: &str) -> PathBuf {
        join_raw(&self.log, name)
    }
}

fn join_raw(dir: &Path, name: &str) -> PathBuf {
    let mut s = dir.as_os_str().to_owned();
    s.push("/");
    s.push(name);
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        let daemon = |foreground| Mode::Daemon { foreground };
        assert_eq!(parse_mode::<&str>(&[]), Mode::Ui);
        assert_eq!(parse_mode(&["-h"]), Mode::Help);
        assert_eq!(parse_mode(&["--help"]), Mode::Help);
        assert_eq!(parse_mode(&["-d"]), daemon(false));
        assert_eq!(parse_mode(&["-f"]), daemon(true));
        // Like 535, everything else is a UI invocation.
        for args in [
            &["-v"][..],
            &["-x"],
            &["foo"],
            &["-d", "-f"],
            &["-h", "x"],
            &["x", "-h"],
            &["-d", "x"],
            &["--version"],
            &["-dM"],
            &["-M"],
            &["-d", "-M"],
            &["-M", "-d"],
            &["-f", "-M"],
            &["-d", "-M", "-M"],
        ] {
            assert_eq!(parse_mode(args), Mode::Ui, "{args:?}");
        }
    }

    #[test]
    fn help_has_the_banner_shape() {
        let lines: Vec<&str> = HELP.split('\n').collect();
        assert_eq!(lines.len(), 6, "{HELP:?}");
        assert!(!lines[0].is_empty() && !lines[1].is_empty());
        assert!(lines[2].is_empty());
        assert!(lines[3].starts_with("  "));
        assert!(lines[4].is_empty() && lines[5].is_empty());
    }

    #[test]
    fn dirs() {
        let d = Dirs::from_values(None, Some("".into()));
        assert_eq!(d.pipe, PathBuf::from(DEFAULT_PIPE_DIR));
        assert_eq!(d.log, PathBuf::from(DEFAULT_LOG_DIR));
        let d = Dirs::from_values(Some("/x/pipe/".into()), Some("/x/log".into()));
        assert_eq!(d.in_pipe("control"), PathBuf::from("/x/pipe//control"));
        assert_eq!(d.in_log("control.log"), PathBuf::from("/x/log/control.log"));
    }
}
