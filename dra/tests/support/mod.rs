//! Harness of gpushare-dra's end-to-end tests: a real gpushared (the `gpushare-e2e`
//! harness), the real `gpushare-dra` binary, and the two stand-ins (kubelet, API server).
#![allow(dead_code, clippy::unwrap_used)]

pub use gpushare_dra_testkit::{apiserver, kubelet};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub use gpushare_e2e::*;

/// A running `gpushare-dra` with its own kubelet directories.
#[derive(Debug)]
pub struct Plugin {
    pub child: Child,
    pub log: PathBuf,
}

/// kubelet's directories and the plugin's kubeconfig, in a temporary directory.
#[derive(Debug)]
pub struct Dirs {
    pub root: tempfile::TempDir,
    pub plugins: PathBuf,
    pub registry: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Dirs {
    pub fn new(api: &apiserver::ApiServer) -> Dirs {
        let root = tempfile::Builder::new()
            .prefix("dra-")
            .tempdir_in("/tmp")
            .unwrap();
        let plugins = root.path().join("plugins");
        let registry = root.path().join("registry");
        std::fs::create_dir_all(&plugins).unwrap();
        std::fs::create_dir_all(&registry).unwrap();
        let kubeconfig = root.path().join("kubeconfig");
        api.kubeconfig(NODE, &kubeconfig);
        Dirs {
            root,
            plugins,
            registry,
            kubeconfig,
        }
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.plugins.join("gpu.nvidia.com/dra.sock")
    }

    pub fn reg_socket(&self) -> PathBuf {
        self.registry.join("gpu.nvidia.com-reg.sock")
    }
}

impl Plugin {
    /// Starts `gpushare-dra` on `dirs` against gpushared's `socket`, with `extra` flags.
    pub fn start(dirs: &Dirs, socket: &Path, extra: &[&str]) -> Plugin {
        let log = dirs
            .root
            .path()
            .join(format!("plugin-{}.log", fastrand::u32(..)));
        let f = std::fs::File::create(&log).unwrap();
        // Before the plugin starts: it reads its config first thing.
        std::fs::write(dirs.root.path().join("none.toml"), "").unwrap();
        let child = Command::new(bin("gpushare-dra"))
            .arg("--config")
            .arg(dirs.root.path().join("none.toml"))
            .args(if extra.contains(&"--node-name") {
                vec![]
            } else {
                vec!["--node-name", NODE]
            })
            .args(if extra.contains(&"--metrics-address") {
                vec![]
            } else {
                vec!["--metrics-address", "off"]
            })
            .arg("--kubeconfig")
            .arg(&dirs.kubeconfig)
            .arg("--gpushared-socket")
            .arg(socket)
            .arg("--plugins-dir")
            .arg(&dirs.plugins)
            .arg("--registry-dir")
            .arg(&dirs.registry)
            .args(extra)
            .env("RUST_LOG", "gpushare_dra=debug,info")
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap();
        Plugin { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Waits up to `t` for the process to exit; its status.
    pub fn wait_exit(&mut self, t: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + t;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kubelet's claim reference for a claim object.
pub fn claim_ref(claim: &serde_json::Value) -> kubelet::Claim {
    kubelet::Claim {
        namespace: claim["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .into(),
        uid: claim["metadata"]["uid"].as_str().unwrap().into(),
        name: claim["metadata"]["name"].as_str().unwrap().into(),
    }
}

/// The valid shared cases (file name, claim).
pub fn valid_cases() -> Option<Vec<(String, serde_json::Value)>> {
    let dir = cases_dir()?.join("claims");
    let mut out: Vec<(String, serde_json::Value)> = std::fs::read_dir(&dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                load_claim(&e.path()),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Some(out)
}

/// The invalid shared cases (file name, claim, expected code).
pub fn invalid_cases() -> Option<Vec<(String, serde_json::Value, String)>> {
    let dir = cases_dir()?.join("claims/invalid");
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).ok()?).ok()?;
    let mut out: Vec<_> = expected
        .as_object()?
        .iter()
        .map(|(f, code)| {
            (
                f.clone(),
                load_claim(&dir.join(f)),
                code.as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Some(out)
}

/// The MPS control program to use: NVIDIA's when installed, else our emulator.
pub fn mps_program() -> PathBuf {
    mps_programs().into_iter().next().map(|(_, p)| p).unwrap()
}

/// The names created in some directories since [`Creations::watch`], seen through inotify:
/// a socket made and removed again before anyone looked still shows.
#[derive(Debug)]
pub struct Creations {
    inotify: std::fs::File,
    /// Each watch descriptor's directory.
    dirs: Vec<(i32, PathBuf)>,
}

impl Creations {
    /// Starts watching `dirs` (which exist) for names created in them.
    pub fn watch(dirs: &[&Path]) -> Creations {
        use nix::libc;
        use std::os::fd::{AsRawFd, FromRawFd};
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: a system call with flags only; the descriptor it returns is owned by the
        // File made from it below, and by nothing else.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(
            fd >= 0,
            "inotify_init1: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` is the open inotify descriptor just returned, owned by no one else.
        let inotify = unsafe { std::fs::File::from_raw_fd(fd) };
        let mut watched = Vec::new();
        for dir in dirs {
            let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
            // SAFETY: `path` is NUL-terminated and outlives the call; the descriptor is an
            // open inotify instance.
            let wd = unsafe {
                libc::inotify_add_watch(inotify.as_raw_fd(), path.as_ptr(), libc::IN_CREATE)
            };
            assert!(
                wd >= 0,
                "watching {}: {}",
                dir.display(),
                std::io::Error::last_os_error()
            );
            watched.push((wd, dir.to_path_buf()));
        }
        Creations {
            inotify,
            dirs: watched,
        }
    }

    /// Every path created in the watched directories so far.
    pub fn paths(&mut self) -> Vec<PathBuf> {
        use std::io::Read;
        // struct inotify_event: wd (i32), mask, cookie, len (u32), then `len` bytes of name.
        const HEADER: usize = 16;
        let mut bytes = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match self.inotify.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("reading inotify events: {e}"),
            }
        }
        let mut out = Vec::new();
        let mut at = 0;
        while at + HEADER <= bytes.len() {
            let wd = i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
            let len = u32::from_ne_bytes(bytes[at + 12..at + 16].try_into().unwrap()) as usize;
            let name = &bytes[at + HEADER..at + HEADER + len];
            let name = String::from_utf8_lossy(name)
                .trim_end_matches('\0')
                .to_string();
            let dir = self
                .dirs
                .iter()
                .find(|(w, _)| *w == wd)
                .map_or_else(PathBuf::new, |(_, d)| d.clone());
            out.push(dir.join(name));
            at += HEADER + len;
        }
        out
    }
}
