//! Scanning a runc command line, without changing it.
//!
//! The wrapper receives exactly what containerd or podman would pass to runc:
//! `[global flags] <subcommand> [subcommand flags] [args]`. Flags follow Go's `flag` package
//! (as used by runc's CLI library): one or two leading dashes, a value either as `--f=v` or as
//! the next argument for flags that take one, `--` ends the flags, and flag parsing of a
//! subcommand stops at its first positional argument. Only what the wrapper needs is
//! extracted: the log file and format, `--debug`, the subcommand, and for `create`/`run` the
//! bundle directory.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// Global flags that take a value (`--root X`, `--log=X`, ...): runc's, and crun's
/// `--cgroup-manager` and `--log-level`. Every other global flag is a switch.
const GLOBAL_VALUE_FLAGS: [&str; 7] = [
    "log",
    "log-format",
    "root",
    "criu",
    "rootless",
    "cgroup-manager",
    "log-level",
];

/// Flags of `create` and `run` that take a value.
const CREATE_VALUE_FLAGS: [&str; 8] = [
    "bundle",
    "b",
    "console-socket",
    "pid-file",
    "preserve-fds",
    "pidfd-socket",
    "config",
    "f",
];

/// What the wrapper needs to know about one runc command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invocation {
    /// `--log <file>`: where runc (and so this wrapper) appends log lines.
    pub log_file: Option<PathBuf>,
    /// `--log-format text|json`.
    pub log_format: Option<String>,
    /// `--debug` was given (and not `--debug=false`).
    pub debug: bool,
    /// The global `--version`/`-v`: the wrapper prints its own version before the low-level
    /// runtime prints its one.
    pub version: bool,
    /// The subcommand (`create`, `start`, `delete`, ...), if any.
    pub subcommand: Option<String>,
    /// For `create`, `run` and `restore`: the bundle directory from `--bundle`/`-b` (the
    /// last one given wins), or `.` when absent or empty, as runc does.
    pub bundle: Option<PathBuf>,
    /// crun's `create --config FILE` (`-f`): the OCI config to use instead of the bundle's.
    pub config: Option<PathBuf>,
}

impl Invocation {
    /// True for the subcommands that create a container from a bundle (`restore` creates one
    /// from a checkpoint, with the bundle's config).
    pub fn creates_container(&self) -> bool {
        matches!(
            self.subcommand.as_deref(),
            Some("create" | "run" | "restore")
        )
    }
}

/// A flag token split into name and inline value: `--log=x` → (`log`, `Some("x")`).
/// `None` for non-flags (`x`, `-`) and for the terminator `--`.
fn split_flag(arg: &OsStr) -> Option<(String, Option<OsString>)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = arg.as_bytes();
    let body = bytes
        .strip_prefix(b"--")
        .or_else(|| bytes.strip_prefix(b"-"))?;
    if body.is_empty() || body.starts_with(b"-") {
        return None;
    }
    match body.iter().position(|b| *b == b'=') {
        Some(eq) => Some((
            String::from_utf8_lossy(&body[..eq]).into_owned(),
            Some(OsStr::from_bytes(&body[eq + 1..]).to_os_string()),
        )),
        None => Some((String::from_utf8_lossy(body).into_owned(), None)),
    }
}

fn is_terminator(arg: &OsStr) -> bool {
    arg == "--"
}

/// Go's boolean flag values.
fn parse_bool(value: &OsStr) -> bool {
    matches!(
        value.to_string_lossy().as_ref(),
        "1" | "t" | "T" | "true" | "TRUE" | "True"
    )
}

/// Scans `args` (argv without argv\[0\]).
pub fn scan(args: &[OsString]) -> Invocation {
    let mut inv = Invocation::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if is_terminator(arg) {
            i += 1;
            break;
        }
        let Some((name, inline)) = split_flag(arg) else {
            break;
        };
        i += 1;
        let value = if GLOBAL_VALUE_FLAGS.contains(&name.as_str()) {
            match inline {
                Some(v) => Some(v),
                None => {
                    let v = args.get(i).cloned();
                    i += 1;
                    v
                }
            }
        } else {
            inline
        };
        match name.as_str() {
            "log" => inv.log_file = value.filter(|v| !v.is_empty()).map(PathBuf::from),
            "log-format" => inv.log_format = value.map(|v| v.to_string_lossy().into_owned()),
            "debug" => {
                inv.debug = match value.as_deref() {
                    None => true,
                    Some(v) => parse_bool(v),
                }
            }
            "version" | "v" => {
                inv.version = match value.as_deref() {
                    None => true,
                    Some(v) => parse_bool(v),
                }
            }
            _ => {}
        }
    }
    let Some(sub) = args.get(i) else {
        return inv;
    };
    inv.subcommand = Some(sub.to_string_lossy().into_owned());
    if inv.creates_container() {
        let (bundle, config) = scan_bundle(&args[i + 1..]);
        inv.bundle = Some(bundle);
        inv.config = config;
    }
    inv
}

/// The bundle of `create`/`run`: the last `--bundle`/`-b` (`.` when there is none or it is
/// empty), and crun's `--config`/`-f`. runc's CLI library also takes flags after the container
/// id (`run ID --bundle B` works), so positional arguments are stepped over, up to `--`.
fn scan_bundle(args: &[OsString]) -> (PathBuf, Option<PathBuf>) {
    use std::os::unix::ffi::OsStrExt;
    let mut bundle: Option<OsString> = None;
    let mut config: Option<OsString> = None;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if is_terminator(arg) {
            break;
        }
        let Some((name, inline)) = split_flag(arg) else {
            continue;
        };
        // crun (getopt) also takes a short flag's value attached: `-b/path`, `-fconfig.json`.
        // Go's single-dash long names (`-bundle`) are known flags and parse as such; no runc
        // or crun create switch starts with `b` or `f`.
        let bytes = arg.as_bytes();
        if !CREATE_VALUE_FLAGS.contains(&name.as_str())
            && bytes.len() > 2
            && !bytes.starts_with(b"--")
            && inline.is_none()
        {
            let attached = OsStr::from_bytes(&bytes[2..]).to_os_string();
            match bytes[1] {
                b'b' => bundle = Some(attached),
                b'f' => config = Some(attached),
                _ => {}
            }
            continue;
        }
        if !CREATE_VALUE_FLAGS.contains(&name.as_str()) {
            continue;
        }
        let value = match inline {
            Some(v) => Some(v),
            None => {
                let v = args.get(i).cloned();
                i += 1;
                v
            }
        };
        match name.as_str() {
            "bundle" | "b" => bundle = value,
            "config" | "f" => config = value.filter(|v| !v.is_empty()),
            _ => {}
        }
    }
    let bundle = match bundle {
        Some(b) if !b.is_empty() => PathBuf::from(b),
        _ => PathBuf::from("."),
    };
    (bundle, config.map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &str) -> Vec<OsString> {
        line.split_whitespace().map(OsString::from).collect()
    }

    const ID: &str = "3f0b6c0e4a1d";

    #[test]
    fn the_version_flag_is_global_only() {
        for line in ["--version", "-v", "--root /r --version", "--version=true"] {
            assert!(scan(&argv(line)).version, "{line}");
        }
        for line in ["--version=false", "exec -v ctr", "state --version", "list"] {
            assert!(!scan(&argv(line)).version, "{line}");
        }
    }

    #[test]
    fn containerd_1_6_create() {
        let line = format!(
            "--root /run/containerd/runc/k8s.io --log /run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/log.json \
             --log-format json create --bundle /run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID} \
             --pid-file /run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/init.pid {ID}"
        );
        let inv = scan(&argv(&line));
        assert_eq!(inv.subcommand.as_deref(), Some("create"));
        assert_eq!(
            inv.log_file,
            Some(PathBuf::from(format!(
                "/run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}/log.json"
            )))
        );
        assert_eq!(inv.log_format.as_deref(), Some("json"));
        assert!(!inv.debug);
        assert_eq!(
            inv.bundle,
            Some(PathBuf::from(format!(
                "/run/containerd/io.containerd.runtime.v2.task/k8s.io/{ID}"
            )))
        );
        assert!(inv.creates_container());
    }

    #[test]
    fn containerd_with_systemd_cgroup_and_console_socket() {
        let line = format!(
            "--root /run/containerd/runc/k8s.io --log /x/log.json --log-format json --systemd-cgroup \
             create --bundle /b/{ID} --pid-file /b/{ID}/init.pid --console-socket /tmp/pty123/pty.sock {ID}"
        );
        let inv = scan(&argv(&line));
        assert_eq!(inv.subcommand.as_deref(), Some("create"));
        assert_eq!(inv.bundle, Some(PathBuf::from(format!("/b/{ID}"))));
    }

    #[test]
    fn podman_4_3_create() {
        // Recorded from podman 4.3.1 with a recording runtime named runc.
        let line = format!(
            "--log-format=json --log /run/containers/storage/overlay-containers/{ID}/userdata/oci-log \
             create --bundle /var/lib/containers/storage/overlay-containers/{ID}/userdata \
             --pid-file /run/containers/storage/overlay-containers/{ID}/userdata/pidfile {ID}"
        );
        let inv = scan(&argv(&line));
        assert_eq!(inv.log_format.as_deref(), Some("json"));
        assert_eq!(
            inv.log_file,
            Some(PathBuf::from(format!(
                "/run/containers/storage/overlay-containers/{ID}/userdata/oci-log"
            )))
        );
        assert_eq!(
            inv.bundle,
            Some(PathBuf::from(format!(
                "/var/lib/containers/storage/overlay-containers/{ID}/userdata"
            )))
        );
    }

    #[test]
    fn other_subcommands_have_no_bundle() {
        for (line, sub) in [
            (format!("--root /run/containerd/runc/k8s.io --log /x/log.json --log-format json start {ID}"), "start"),
            (format!("--root /r --log /x/log.json --log-format json delete --force {ID}"), "delete"),
            (format!("delete --force {ID}"), "delete"),
            (format!("--root /r kill {ID} 9"), "kill"),
            (format!("--root /r state {ID}"), "state"),
            (format!("--root /r exec --process /tmp/p.json --detach --pid-file /tmp/p.pid {ID}"), "exec"),
            ("features".to_string(), "features"),
            (format!("--root /r --log /x --log-format json update --resources - {ID}"), "update"),
        ] {
            let inv = scan(&argv(&line));
            assert_eq!(inv.subcommand.as_deref(), Some(sub), "{line}");
            assert_eq!(inv.bundle, None, "{line}");
            assert!(!inv.creates_container());
        }
    }

    #[test]
    fn bundle_spellings() {
        for (line, want) in [
            ("create --bundle /b id", "/b"),
            ("create -b /b id", "/b"),
            ("create --bundle=/b id", "/b"),
            ("create -b=/b id", "/b"),
            ("create -bundle /b id", "/b"),
            ("create --bundle= id", "."),
            ("create id", "."),
            ("create", "."),
            ("create --pid-file /p id", "."),
            ("create --bundle /first --bundle /second id", "/second"),
            ("run --detach --bundle /b id", "/b"),
            ("run -d -b /b --keep id", "/b"),
            // A value that looks like a subcommand or a flag is still a value.
            ("create --pid-file --bundle id", "."),
            ("create --console-socket /s --bundle create id", "create"),
            // runc's CLI library reads flags after the container id too (`run ID --bundle B`
            // starts B); only `--` ends the flags.
            ("create id --bundle /late", "/late"),
            ("run id -b=/late", "/late"),
            ("create -- --bundle /b", "."),
            // crun's getopt: a short flag's value attached.
            ("create -b/attached id", "/attached"),
            ("restore --bundle /r id", "/r"),
            (
                "create --no-pivot --no-new-keyring --preserve-fds 3 --bundle /b id",
                "/b",
            ),
        ] {
            let inv = scan(&argv(line));
            assert_eq!(inv.bundle, Some(PathBuf::from(want)), "{line}");
        }
    }

    #[test]
    fn crun_command_lines() {
        let inv = scan(&argv(
            "--cgroup-manager cgroupfs --log-level debug create --bundle /b -f /b/other.json id",
        ));
        assert_eq!(inv.subcommand.as_deref(), Some("create"));
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        assert_eq!(inv.config, Some(PathBuf::from("/b/other.json")));
        let inv = scan(&argv("create --config=/c.json -b /b id"));
        assert_eq!(inv.config, Some(PathBuf::from("/c.json")));
        let inv = scan(&argv("create -fcfg.json -b /b id"));
        assert_eq!(inv.config, Some(PathBuf::from("cfg.json")));
    }

    #[test]
    fn global_flag_forms() {
        let inv = scan(&argv(
            "--debug --log=/l --log-format text --root=/r create --bundle /b id",
        ));
        assert!(inv.debug);
        assert_eq!(inv.log_file, Some(PathBuf::from("/l")));
        assert_eq!(inv.log_format.as_deref(), Some("text"));
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
        let inv = scan(&argv("--debug=false -log /l create"));
        assert!(!inv.debug);
        assert_eq!(inv.log_file, Some(PathBuf::from("/l")));
        let inv = scan(&argv(
            "--debug=true --criu /usr/sbin/criu --rootless auto start id",
        ));
        assert!(inv.debug);
        assert_eq!(inv.subcommand.as_deref(), Some("start"));
        // The value of --root is never taken for the subcommand, even if it reads "create".
        let inv = scan(&argv("--root create start id"));
        assert_eq!(inv.subcommand.as_deref(), Some("start"));
        let inv = scan(&argv("-- create --bundle /b id"));
        assert_eq!(inv.subcommand.as_deref(), Some("create"));
        assert_eq!(inv.bundle, Some(PathBuf::from("/b")));
    }

    #[test]
    fn degenerate_lines() {
        assert_eq!(scan(&[]), Invocation::default());
        assert_eq!(scan(&argv("--version")).subcommand, None);
        assert_eq!(scan(&argv("--log")).log_file, None);
        assert_eq!(scan(&argv("--help")).subcommand, None);
        let inv = scan(&argv("--systemd-cgroup"));
        assert_eq!(inv.subcommand, None);
        // "-" alone is not a flag: it is taken as the subcommand, as runc would.
        assert_eq!(scan(&argv("- x")).subcommand.as_deref(), Some("-"));
    }

    #[test]
    fn non_utf8_arguments_are_tolerated() {
        use std::os::unix::ffi::OsStringExt;
        let args = vec![
            OsString::from("create"),
            OsString::from("--bundle"),
            OsString::from_vec(vec![b'/', 0xff, b'b']),
            OsString::from("id"),
        ];
        let inv = scan(&args);
        assert_eq!(
            inv.bundle.map(PathBuf::into_os_string),
            Some(args[2].clone())
        );
    }
}
