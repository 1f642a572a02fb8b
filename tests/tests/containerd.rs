//! containerd 1.6 end to end: a private containerd (own root, state and socket; CRI plugin off
//! but for the drop-in checks) runs a busybox image imported from an OCI archive built here, with
//! `gpushare-runtime` as its runc binary; the runtime resolves the claim's CDI device from the
//! container's environment or annotations and applies it. Also: the errors a user sees through
//! `ctr`, and the packaged containerd and nodeadm drop-ins against the real containerd.
//!
//! containerd starts one shim per container (`containerd-shim-runc-v2`), which runs the runc
//! binary with the shim's environment: containerd's, not `ctr`'s. So each test names a small
//! wrapper script as `--runc-binary` that sets `GPUSHARE_RUNTIME_CONFIG` and execs
//! `gpushare-runtime`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpushare_e2e::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The image every container here runs.
const IMAGE: &str = "localhost/gpushare-e2e/busybox:latest";
/// The CRI plugin's name in containerd 1.6/1.7 (config version 2).
const CRI: &str = "io.containerd.grpc.v1.cri";
/// What one `ctr` call may take before it counts as hung.
const CTR_LIMIT: Duration = Duration::from_secs(60);

/// One containerd at a time in this file: they share `/run/containerd/s` (where 1.6 puts shim
/// sockets whatever its `--state`), which the last one out removes when it made it.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Root, `shared/cases`, containerd with `ctr` and its runc shim, runc and tar; `None` (with a
/// note, or a failure under `GPUSHARE_E2E_REQUIRE=1`) otherwise.
fn prerequisites() -> Option<PathBuf> {
    let cases = setup()?;
    for (tool, what) in [
        ("containerd", "containerd (Debian package containerd)"),
        ("ctr", "ctr (Debian package containerd)"),
        (
            "containerd-shim-runc-v2",
            "containerd-shim-runc-v2 (Debian package containerd)",
        ),
        ("runc", "runc"),
        ("tar", "tar"),
    ] {
        if !need(which(tool).is_some(), what) {
            return None;
        }
    }
    Some(cases)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn packaging(rel: &str) -> PathBuf {
    repo_root().join("packaging").join(rel)
}

// ---------------------------------------------------------------------------------------------
// Processes

/// Runs `cmd` with stdout and stderr in files; kills it and fails after `limit`.
fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    try_output_within(cmd, limit).unwrap_or_else(|| panic!("{what} still running after {limit:?}"))
}

/// Runs `cmd` with stdout and stderr in files; `None` (after killing it) when it runs past
/// `limit` or cannot start.
fn try_output_within(cmd: &mut Command, limit: Duration) -> Option<Output> {
    let mut out = tempfile::tempfile().ok()?;
    let mut err = tempfile::tempfile().ok()?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().ok()?)
        .stderr(err.try_clone().ok()?)
        .spawn()
        .ok()?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().ok()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |f: &mut fs::File| {
        let mut v = Vec::new();
        f.rewind().ok()?;
        f.read_to_end(&mut v).ok()?;
        Some(v)
    };
    Some(Output {
        status,
        stdout: read(&mut out)?,
        stderr: read(&mut err)?,
    })
}

fn wait_within(mut child: Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `/proc/<pid>/stat`: (comm, state, ppid).
fn proc_stat(pid: i32) -> Option<(String, char, i32)> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s[open + 1..close].to_string();
    let mut rest = s[close + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some((comm, state, ppid))
}

fn pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Live processes whose command line mentions `needle`, as `pid cmdline` (what `pgrep -a`
/// prints).
fn processes_mentioning(needle: &str) -> Vec<String> {
    let me = std::process::id() as i32;
    pids()
        .into_iter()
        .filter(|&p| p != me)
        .filter_map(|p| {
            let raw = fs::read(format!("/proc/{p}/cmdline")).ok()?;
            let cmdline = text(&raw).replace('\0', " ");
            cmdline
                .contains(needle)
                .then(|| format!("{p} {}", cmdline.trim()))
        })
        .collect()
}

/// Reaps exited shims that were re-parented to this process (a child subreaper: PID 1 of
/// these machines does not reap orphans, so a shim that exits would stay a zombie).
fn reap_shims() {
    let me = std::process::id() as i32;
    for p in pids() {
        if let Some((comm, 'Z', ppid)) = proc_stat(p) {
            if ppid == me && comm.starts_with("containerd-shim") {
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(p), None);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// containerd

/// What a private containerd loads besides its own directories.
#[derive(Debug, Default)]
struct ContainerdOptions {
    /// Keep the CRI plugin (off by default: nothing here needs it and it starts slower).
    cri: bool,
    /// `imports` of the config file (globs allowed).
    imports: Vec<String>,
    /// TOML tables appended to the config file.
    tables: String,
}

/// A containerd 1.6 with its own root, state and socket in a temporary directory under
/// `/tmp`. [`Containerd::stop`] (or drop) removes its containers, stops it and its shims,
/// and removes its directories.
#[derive(Debug)]
struct Containerd {
    dir: Option<tempfile::TempDir>,
    /// The temporary directory's path (every process of ours mentions it).
    path: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
    /// Whether `/run/containerd` was there before (1.6 creates `/run/containerd/s` for its
    /// shims' sockets wherever its state is).
    had_run_containerd: bool,
}

impl Containerd {
    fn start(opts: ContainerdOptions) -> Containerd {
        // Exited shims are re-parented here (containerd does not reap them) and reaped in stop.
        nix::sys::prctl::set_child_subreaper(true).unwrap();
        let had_run_containerd = Path::new("/run/containerd").exists();
        // Short: the socket path must fit in 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("gsc-")
            .tempdir_in("/tmp")
            .unwrap();
        let path = dir.path().to_path_buf();
        let socket = path.join("c.sock");
        let mut disabled = vec![
            "io.containerd.snapshotter.v1.aufs",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.zfs",
        ];
        if !opts.cri {
            disabled.push(CRI);
        }
        let quoted = |v: &[&str]| {
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let imports: Vec<&str> = opts.imports.iter().map(String::as_str).collect();
        let config = format!(
            "version = 2\nroot = {root:?}\nstate = {state:?}\nimports = [{imports}]\n\
             disabled_plugins = [{disabled}]\n\n[grpc]\n  address = {socket:?}\n\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt:?}\n\n{tables}\n",
            root = path.join("root").display().to_string(),
            state = path.join("state").display().to_string(),
            imports = quoted(&imports),
            disabled = quoted(&disabled),
            socket = socket.display().to_string(),
            opt = path.join("opt").display().to_string(),
            tables = opts.tables,
        );
        let config_path = path.join("config.toml");
        fs::write(&config_path, config).unwrap();
        let log = fs::File::create(path.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config_path)
            .arg("--root")
            .arg(path.join("root"))
            .arg("--state")
            .arg(path.join("state"))
            .arg("--address")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let c = Containerd {
            dir: Some(dir),
            path,
            socket,
            child: Some(child),
            had_run_containerd,
        };
        let up = wait_until(Duration::from_secs(30), || {
            c.log().contains("containerd successfully booted")
                && std::os::unix::net::UnixStream::connect(&c.socket).is_ok()
        });
        assert!(up, "containerd did not start; log:\n{}", c.log());
        c
    }

    fn log(&self) -> String {
        fs::read_to_string(self.path.join("containerd.log")).unwrap_or_default()
    }

    /// `ctr` against this containerd.
    fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(&self.socket);
        cmd
    }

    /// `ctr run --rm` of [`IMAGE`] as container `id` with `runtime` as its runc binary (the
    /// caller appends the command), keeping runc's state and ctr's FIFOs in our directory and
    /// giving the container a cgroup of its own (ctr's default `/default/<id>` would leave the
    /// `/default` parents behind).
    fn run(&self, runtime: &Path, id: &str, env: &[String], annotations: &[String]) -> Command {
        let mut cmd = self.ctr();
        cmd.args(["run", "--rm", "--runc-binary"])
            .arg(runtime)
            .arg("--runc-root")
            .arg(self.path.join("runc"))
            .arg("--fifo-dir")
            .arg(self.path.join("fifo"))
            .args(["--cgroup", &format!("/{id}")]);
        for e in env {
            cmd.args(["--env", e]);
        }
        for a in annotations {
            cmd.args(["--annotation", a]);
        }
        cmd.args([IMAGE, id]);
        cmd
    }

    /// Imports an OCI archive; fails unless [`IMAGE`] is then listed.
    fn import(&self, archive: &Path) {
        let out = output_within(
            self.ctr().args(["images", "import"]).arg(archive),
            CTR_LIMIT,
        );
        assert!(
            out.status.success(),
            "ctr images import: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let out = output_within(self.ctr().args(["images", "ls", "-q"]), CTR_LIMIT);
        assert!(
            text(&out.stdout).lines().any(|l| l == IMAGE),
            "{IMAGE} not imported: {}",
            text(&out.stdout)
        );
    }

    /// The status of plugin `plugin` (`<type>.<id>`) in `ctr plugins ls`: `ok`, `error`, `skip`.
    fn plugin_status(&self, plugin: &str) -> Option<String> {
        let out = output_within(self.ctr().args(["plugins", "ls"]), CTR_LIMIT);
        text(&out.stdout).lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && format!("{}.{}", f[0], f[1]) == plugin)
                .then(|| f[f.len() - 1].to_string())
        })
    }

    /// Removes what is left in containerd, stops it, and returns what outlived it: processes
    /// mentioning its directory (containerd, shims, runtimes), mounts under it.
    fn stop(&mut self) -> Vec<String> {
        let Some(mut child) = self.child.take() else {
            return Vec::new();
        };
        // `ctr run --rm` removes its container, failed or not; anything here is left over.
        let mut left = Vec::new();
        for id in self.ids(&["tasks", "ls", "-q"]) {
            left.push(format!("task {id}"));
            let _ = try_output_within(self.ctr().args(["tasks", "rm", "-f", &id]), CTR_LIMIT);
        }
        for id in self.ids(&["containers", "ls", "-q"]) {
            left.push(format!("container {id}"));
            let _ = try_output_within(self.ctr().args(["containers", "rm", &id]), CTR_LIMIT);
        }
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                left.push(format!("containerd {pid} ignored SIGTERM"));
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let needle = self.path.display().to_string();
        let gone = wait_until(Duration::from_secs(10), || {
            reap_shims();
            processes_mentioning(&needle).is_empty()
        });
        if !gone {
            for p in processes_mentioning(&needle) {
                if let Some(pid) = p.split_whitespace().next().and_then(|s| s.parse().ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                left.push(format!("process {p}"));
            }
            wait_until(Duration::from_secs(5), || {
                reap_shims();
                processes_mentioning(&needle).is_empty()
            });
        }
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .filter(|m| m.starts_with(needle.as_str()))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            left.push(format!("mount {m}"));
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
        if let Some(dir) = self.dir.take() {
            if let Err(e) = dir.close() {
                left.push(format!("removing {needle}: {e}"));
            }
        }
        if !self.had_run_containerd {
            // Only empty directories go; a containerd started meanwhile keeps its own.
            let _ = fs::remove_dir("/run/containerd/s");
            let _ = fs::remove_dir("/run/containerd");
        }
        left
    }

    fn ids(&self, args: &[&str]) -> Vec<String> {
        let Some(out) = try_output_within(self.ctr().args(args), CTR_LIMIT) else {
            return Vec::new();
        };
        text(&out.stdout)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let left = self.stop();
        if !left.is_empty() {
            eprintln!("containerd cleanup: {left:?}");
        }
    }
}

/// Stops `c` and fails if anything of it is left.
fn stop_clean(mut c: Containerd) {
    let needle = c.path.display().to_string();
    let left = c.stop();
    assert!(left.is_empty(), "left behind by containerd: {left:?}");
    assert!(processes_mentioning(&needle).is_empty());
    assert!(!Path::new(&needle).exists(), "{needle} not removed");
}

// ---------------------------------------------------------------------------------------------
// The image

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The platform's architecture in OCI's words.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// An OCI image archive (an image layout in a tar) of a busybox root filesystem with `extra`
/// host programs and their libraries, named [`IMAGE`], built under `dir`: one uncompressed
/// layer, its config and manifest, no registry.
fn busybox_image(dir: &Path, extra: &[PathBuf]) -> PathBuf {
    let rootfs = busybox_rootfs(&dir.join("image"), extra);
    let layer = dir.join("layer.tar");
    let out = output_within(
        Command::new("tar")
            .args(["--numeric-owner", "-C"])
            .arg(&rootfs)
            .arg("-cf")
            .arg(&layer)
            .arg("."),
        CTR_LIMIT,
    );
    assert!(out.status.success(), "tar: {}", text(&out.stderr));
    let layout = dir.join("layout");
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| -> Value {
        let digest = sha256_hex(bytes);
        fs::write(blobs.join(&digest), bytes).unwrap();
        json!({"digest": format!("sha256:{digest}"), "size": bytes.len()})
    };
    let layer_bytes = fs::read(&layer).unwrap();
    let mut layer_desc = put(&layer_bytes);
    layer_desc["mediaType"] = json!("application/vnd.oci.image.layer.v1.tar");
    let config = json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"].clone()]},
    });
    let mut config_desc = put(&serde_json::to_vec(&config).unwrap());
    config_desc["mediaType"] = json!("application/vnd.oci.image.config.v1+json");
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    });
    let mut manifest_desc = put(&serde_json::to_vec(&manifest).unwrap());
    manifest_desc["mediaType"] = json!("application/vnd.oci.image.manifest.v1+json");
    manifest_desc["annotations"] = json!({"io.containerd.image.name": IMAGE});
    let index = json!({"schemaVersion": 2, "manifests": [manifest_desc]});
    fs::write(layout.join("index.json"), index.to_string()).unwrap();
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let archive = dir.join("image.tar");
    let out = output_within(
        Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&archive)
            .arg("."),
        CTR_LIMIT,
    );
    assert!(out.status.success(), "tar: {}", text(&out.stderr));
    archive
}

// ---------------------------------------------------------------------------------------------
// gpushare-runtime's configuration

/// `packaging/runtime.toml` with its four keys set to these values (each must be set there,
/// uncommented, on one line: that is what the test checks of the packaged file too).
fn runtime_config(dir: &Path, name: &str, runtimes: &[&str], spec_dirs: &[&Path]) -> PathBuf {
    let packaged = packaging("runtime.toml");
    let template =
        fs::read_to_string(&packaged).unwrap_or_else(|e| panic!("{}: {e}", packaged.display()));
    let list = |v: Vec<String>| {
        format!(
            "[{}]",
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let values = [
        (
            "runtimes",
            list(runtimes.iter().map(|s| s.to_string()).collect()),
        ),
        (
            "spec_dirs",
            list(spec_dirs.iter().map(|p| p.display().to_string()).collect()),
        ),
        (
            "log_file",
            format!(
                "{:?}",
                dir.join(format!("{name}.log")).display().to_string()
            ),
        ),
        ("log_level", "\"debug\"".to_string()),
    ];
    let mut seen = Vec::new();
    let lines: Vec<String> = template
        .lines()
        .map(|line| {
            for (key, value) in &values {
                let t = line.trim_start();
                if t.strip_prefix(key)
                    .is_some_and(|r| r.trim_start().starts_with('='))
                {
                    seen.push(*key);
                    return format!("{key} = {value}");
                }
            }
            line.to_string()
        })
        .collect();
    for (key, _) in &values {
        assert!(
            seen.contains(key),
            "{} does not set `{key}` (uncommented, one line)",
            packaged.display()
        );
    }
    let path = dir.join(format!("{name}.toml"));
    fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// A runc binary for containerd: sets `GPUSHARE_RUNTIME_CONFIG` (the shim's environment is
/// containerd's, never `ctr`'s) and execs `gpushare-runtime`.
fn runtime_wrapper(dir: &Path, name: &str, config: &Path) -> PathBuf {
    let path = dir.join(name);
    fs::write(
        &path,
        format!(
            "#!/bin/sh\nGPUSHARE_RUNTIME_CONFIG='{}'\nexport GPUSHARE_RUNTIME_CONFIG\nexec '{}' \"$@\"\n",
            config.display(),
            bin("gpushare-runtime").display()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The single line `ctr` prints when a container does not start, checked to carry the
/// runtime's own message (not "unable to retrieve OCI runtime error", which containerd says
/// when the runtime wrote no log line, nor the raw JSON of that line).
fn error_line(out: &Output, what: &str) -> String {
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "{what}: the container must not start; stdout: {stdout}\nstderr: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{what}: one error line from ctr: {stderr}");
    let line = lines[0].to_string();
    assert!(
        line.contains("OCI runtime create failed"),
        "{what}: containerd's create error: {line}"
    );
    assert!(
        !line.contains("unable to retrieve OCI runtime error"),
        "{what}: the runtime logged no error line for the shim: {line}"
    );
    assert!(
        !line.contains("\"level\"") && !line.contains("\\n"),
        "{what}: a readable message: {line}"
    );
    eprintln!("{what}: {line}");
    line
}

fn seed_mps(cases: &Path, uid: &str) -> Value {
    with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), uid)
}

/// The host directory the claim's CDI spec mounts at `container_path`.
fn spec_mount_source(spec: &Path, container_path: &str) -> PathBuf {
    let spec: gpushare::cdi::Spec = serde_json::from_slice(&fs::read(spec).unwrap()).unwrap();
    spec.devices
        .iter()
        .flat_map(|d| d.container_edits.mounts.iter())
        .find(|m| m.container_path == container_path)
        .map(|m| PathBuf::from(&m.host_path))
        .unwrap_or_else(|| panic!("no mount at {container_path} in the claim's spec"))
}

// ---------------------------------------------------------------------------------------------
// Tests

#[test]
fn ctr_runs_an_mps_container_through_gpushare_runtime() {
    let Some(cases) = prerequisites() else {
        return;
    };
    let _serial = serial();
    let started = Instant::now();
    let program = mps_programs().remove(0).1;
    let d = Daemon::start(DaemonOptions {
        mps_control: program.clone(),
        cdi_dir: None,
        run_dir: None,
    });
    let uid = unique_uid("containerd");
    d.prepare(&seed_mps(&cases, &uid))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let spec = d.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"));
    // A file only the claim's tmpfs holds: proves /dev/shm inside is the claim's.
    let marker = format!("shm-of-{uid}");
    fs::write(
        spec_mount_source(&spec, "/dev/shm").join("gpushare-e2e-marker"),
        &marker,
    )
    .unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let archive = busybox_image(tmp.path(), std::slice::from_ref(&program));
    let c = Containerd::start(ContainerdOptions::default());
    c.import(&archive);
    let booted = started.elapsed();

    let config = runtime_config(tmp.path(), "runtime", &["runc"], &[&d.cdi_dir]);
    let runtime = runtime_wrapper(tmp.path(), "gpushare-runtime.sh", &config);
    let id = format!("gs-ctrd-{}", std::process::id());
    let script = format!(
        "echo env=$CUDA_MPS_PIPE_DIRECTORY; test -S /tmp/nvidia-mps/control && echo pipe-ok; \
         grep ' /dev/shm ' /proc/self/mountinfo; echo shm=$(cat /dev/shm/gpushare-e2e-marker); \
         echo atp=$(echo get_default_active_thread_percentage | {}); sleep 2",
        program.display()
    );
    let outfile = tmp.path().join("ctr.out");
    let errfile = tmp.path().join("ctr.err");
    let mut child = c
        .run(
            &runtime,
            &id,
            &[format!("GPUSHARE_VISIBLE_DEVICES=gpushare.io/claim={uid}")],
            &[],
        )
        .args(["/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&outfile).unwrap())
        .stderr(fs::File::create(&errfile).unwrap())
        .spawn()
        .unwrap();
    // While the container runs (or until ctr gives up), the daemon must show it attached.
    let mut during = None;
    wait_until(Duration::from_secs(30), || {
        let c = d.claim(&uid).unwrap();
        if c.attached.iter().any(|a| a.container_id == id) {
            during = Some(c);
        }
        during.is_some() || child.try_wait().unwrap().is_some()
    });
    let attached = during.is_some();
    let status = wait_within(child, CTR_LIMIT, "ctr run");
    let stdout = fs::read_to_string(&outfile).unwrap();
    let stderr = fs::read_to_string(&errfile).unwrap();
    let runtime_log = fs::read_to_string(tmp.path().join("runtime.log")).unwrap_or_default();
    assert!(
        status.success(),
        "ctr run: {status}\nstdout: {stdout}\nstderr: {stderr}\ngpushare-runtime log:\n{runtime_log}"
    );
    assert!(
        attached,
        "the daemon never showed {id} attached to {uid}; stdout: {stdout}"
    );
    let during = during.unwrap();
    let a = during
        .attached
        .iter()
        .find(|a| a.container_id == id)
        .unwrap();
    assert!(a.pid.is_some_and(|p| p > 0), "{a:?}");
    assert!(
        a.bundle
            .as_deref()
            .is_some_and(|b| b.starts_with(&c.path.display().to_string())),
        "the bundle is our containerd's: {a:?}"
    );
    assert!(stdout.contains("env=/tmp/nvidia-mps"), "{stdout}");
    assert!(stdout.contains("pipe-ok"), "pipe dir mounted: {stdout}");
    let shm = stdout
        .lines()
        .find(|l| l.contains(" /dev/shm "))
        .unwrap_or_default();
    assert!(shm.contains("tmpfs"), "a tmpfs on /dev/shm: {stdout}");
    assert!(
        stdout.contains(&format!("shm={marker}")),
        "the claim's tmpfs on /dev/shm: {stdout}"
    );
    assert!(
        stdout.contains("atp=50.0"),
        "the claim's control daemon answers inside: {stdout}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || d
            .claim(&uid)
            .map(|c| c.attached.is_empty())
            .unwrap_or(false)),
        "detached after exit: {:?}",
        d.claim(&uid)
    );
    let ran = started.elapsed();
    stop_clean(c);
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
    eprintln!(
        "timings: image + containerd {booted:?}, container run {:?}, total {:?}",
        ran - booted,
        started.elapsed()
    );
}

#[test]
fn ctr_shows_one_readable_line_per_runtime_error() {
    let Some(cases) = prerequisites() else {
        return;
    };
    let _serial = serial();
    let started = Instant::now();
    let d = Daemon::emulated();
    let uid = unique_uid("ctrd-err");
    d.prepare(&seed_mps(&cases, &uid))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let tmp = tempfile::tempdir().unwrap();
    let archive = busybox_image(tmp.path(), &[]);
    let c = Containerd::start(ContainerdOptions::default());
    c.import(&archive);

    // A second spec directory (listed first: lower priority) holding broken specs: another
    // vendor's file that is not even YAML, one of our kind cut off mid-way, and one of our kind
    // with a field CDI does not define (the reference library, as in podman, rejects such a
    // file; each only loses its own devices).
    let broken_dir = tmp.path().join("cdi-static");
    fs::create_dir_all(&broken_dir).unwrap();
    fs::write(
        broken_dir.join("vendor.example-gpu.yaml"),
        "cdiVersion: 0.5.0\nkind: vendor.example/gpu\ndevices: [ {name: 0,\n",
    )
    .unwrap();
    let ours = fs::read_to_string(d.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"))).unwrap();
    let truncated = format!("{uid}-truncated");
    let truncated_text = ours.replace(&uid, &truncated);
    fs::write(
        broken_dir.join(format!("gpushare.io-claim_{truncated}.json")),
        &truncated_text[..truncated_text.len() / 2],
    )
    .unwrap();
    let invalid = format!("{uid}-invalid");
    let mut spec: Value = serde_json::from_str(&ours.replace(&uid, &invalid)).unwrap();
    spec["devices"][0]["containerEdits"]["noSuchField"] = json!(true);
    fs::write(
        broken_dir.join(format!("gpushare.io-claim_{invalid}.json")),
        spec.to_string(),
    )
    .unwrap();
    let dirs: [&Path; 2] = [&broken_dir, &d.cdi_dir];
    let config = runtime_config(tmp.path(), "runtime", &["runc"], &dirs);
    let runtime = runtime_wrapper(tmp.path(), "gpushare-runtime.sh", &config);
    let run = |id: &str, env: &[String], annotations: &[String], script: &str| {
        output_within(
            c.run(&runtime, id, env, annotations)
                .args(["/bin/sh", "-c", script]),
            CTR_LIMIT,
        )
    };

    // 1. A device no spec defines (asked for by annotation, as CRI passes them): its name.
    let missing = "gpushare.io/claim=no-such-claim";
    let out = run(
        "gs-err-unknown",
        &[],
        &[format!("cdi.k8s.io/gpushare-e2e={missing}")],
        "echo started",
    );
    let line = error_line(&out, "unknown device");
    assert!(line.contains(missing), "names the device: {line}");

    // 2. Broken spec files affect only their own devices: ours still works beside them ...
    let out = run(
        "gs-err-beside-broken",
        &[format!("GPUSHARE_VISIBLE_DEVICES=gpushare.io/claim={uid}")],
        &[],
        "echo env=$CUDA_MPS_PIPE_DIRECTORY; test -S /tmp/nvidia-mps/control && echo pipe-ok",
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains("env=/tmp/nvidia-mps")
            && stdout.contains("pipe-ok"),
        "our device beside broken spec files: {stdout}\n{}",
        text(&out.stderr)
    );
    // ... and a device only a broken file defines is refused with its name.
    for (n, name) in [&truncated, &invalid].into_iter().enumerate() {
        let wanted = format!("gpushare.io/claim={name}");
        let out = run(
            &format!("gs-err-broken-{n}"),
            &[format!("GPUSHARE_VISIBLE_DEVICES={wanted}")],
            &[],
            "echo started",
        );
        let line = error_line(&out, &format!("device of a broken spec ({name})"));
        assert!(line.contains(&wanted), "names the device: {line}");
    }

    // 3. No low-level runtime where the config says: its path.
    let config = runtime_config(
        tmp.path(),
        "runtime-missing-runc",
        &["/nonexistent/runc"],
        &[&d.cdi_dir],
    );
    let runtime_missing = runtime_wrapper(tmp.path(), "gpushare-runtime-missing.sh", &config);
    let out = output_within(
        c.run(&runtime_missing, "gs-err-runc", &[], &[])
            .args(["/bin/sh", "-c", "echo started"]),
        CTR_LIMIT,
    );
    let line = error_line(&out, "missing runtime");
    assert!(
        line.contains("/nonexistent/runc"),
        "names the runtime: {line}"
    );

    assert!(
        d.claim(&uid).unwrap().attached.is_empty(),
        "nothing attached: {:?}",
        d.claim(&uid)
    );
    stop_clean(c);
    eprintln!("timings: {:?}", started.elapsed());
}

#[test]
fn ctr_starts_a_container_without_devices_despite_broken_specs_and_config() {
    if prerequisites().is_none() {
        return;
    }
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let archive = busybox_image(tmp.path(), &[]);
    let c = Containerd::start(ContainerdOptions::default());
    c.import(&archive);

    // Spec directories that are all wrong: broken files, a file where a directory should be,
    // a directory that does not exist.
    let broken_dir = tmp.path().join("cdi-broken");
    fs::create_dir_all(&broken_dir).unwrap();
    fs::write(
        broken_dir.join("gpushare.io-claim_x.json"),
        "{\"cdiVersion\":",
    )
    .unwrap();
    fs::write(broken_dir.join("vendor.example-gpu.yaml"), "\u{0}\u{1}: [").unwrap();
    let not_a_dir = tmp.path().join("not-a-dir");
    fs::write(&not_a_dir, "").unwrap();
    let absent = tmp.path().join("absent");
    let dirs: [&Path; 3] = [&broken_dir, &not_a_dir, &absent];
    let config = runtime_config(tmp.path(), "runtime-broken-dirs", &["runc"], &dirs);
    let runtime = runtime_wrapper(tmp.path(), "gpushare-runtime-dirs.sh", &config);
    let out = output_within(
        c.run(&runtime, "gs-nodev-dirs", &[], &[]).args([
            "/bin/sh",
            "-c",
            "echo started-$((6 * 7))",
        ]),
        CTR_LIMIT,
    );
    assert!(
        out.status.success() && text(&out.stdout).contains("started-42"),
        "no device, broken spec dirs: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // A config file that is not TOML.
    let bad_config = tmp.path().join("broken-config.toml");
    fs::write(&bad_config, "runtimes = [\"runc\"\nspec_dirs = {{{\n").unwrap();
    let runtime = runtime_wrapper(tmp.path(), "gpushare-runtime-bad-config.sh", &bad_config);
    let out = output_within(
        c.run(&runtime, "gs-nodev-config", &[], &[]).args([
            "/bin/sh",
            "-c",
            "echo started-$((6 * 7))",
        ]),
        CTR_LIMIT,
    );
    assert!(
        out.status.success() && text(&out.stdout).contains("started-42"),
        "no device, broken config: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    stop_clean(c);
}

// ---------------------------------------------------------------------------------------------
// Packaging

/// `key = value` lines of `[header]` in TOML text (containerd's `config dump` or ours), up to
/// the next table header.
fn toml_table(toml: &str, header: &str) -> Option<BTreeMap<String, String>> {
    let want = format!("[{header}]");
    let mut lines = toml.lines().map(str::trim);
    lines.by_ref().find(|l| *l == want)?;
    Some(
        lines
            .take_while(|l| !l.starts_with('['))
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect(),
    )
}

/// The runtime `name` of the CRI plugin in `toml`: its table and its `options` table.
fn cri_runtime(
    toml: &str,
    name: &str,
) -> Option<(BTreeMap<String, String>, BTreeMap<String, String>)> {
    let base = format!("plugins.\"{CRI}\".containerd.runtimes.{name}");
    Some((
        toml_table(toml, &base)?,
        toml_table(toml, &format!("{base}.options"))?,
    ))
}

fn config_dump(c: &Containerd) -> String {
    let out = output_within(
        Command::new("containerd")
            .arg("--config")
            .arg(c.path.join("config.toml"))
            .args(["config", "dump"]),
        CTR_LIMIT,
    );
    assert!(out.status.success(), "config dump: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Checks the `gpushare` runtime of a containerd whose CRI plugin loaded a config: the plugin
/// is up (`ctr plugins ls`), it logged the runtime with our binary, and `config dump` shows it.
fn assert_cri_has_gpushare(c: &Containerd, what: &str) {
    assert_eq!(
        c.plugin_status(CRI).as_deref(),
        Some("ok"),
        "{what}: the CRI plugin must load; log:\n{}",
        c.log()
    );
    let log = c.log();
    let started = log
        .lines()
        .find(|l| l.contains("Start cri plugin with config"))
        .unwrap_or_else(|| panic!("{what}: no CRI config in the log:\n{log}"));
    assert!(
        started.contains("gpushare:{Type:io.containerd.runc.v2")
            && started.contains("BinaryName:/usr/bin/gpushare-runtime"),
        "{what}: the CRI plugin's runtimes: {started}"
    );
    let dump = config_dump(c);
    let (rt, opts) = cri_runtime(&dump, "gpushare")
        .unwrap_or_else(|| panic!("{what}: no gpushare runtime in config dump:\n{dump}"));
    assert_eq!(rt["runtime_type"], "\"io.containerd.runc.v2\"", "{what}");
    assert_eq!(
        opts["BinaryName"], "\"/usr/bin/gpushare-runtime\"",
        "{what}"
    );
}

#[test]
fn containerd_accepts_the_packaged_drop_in() {
    if !need(is_root(), "root (containerd)")
        || !need(
            which("containerd").is_some() && which("ctr").is_some(),
            "containerd (Debian package containerd)",
        )
    {
        return;
    }
    let _serial = serial();
    let drop_in = packaging("containerd/gpushare-runtime.toml");
    let conf_d = tempfile::tempdir().unwrap();
    fs::copy(&drop_in, conf_d.path().join("gpushare-runtime.toml")).unwrap();
    // As installed: a glob in the main config's imports.
    let mut c = Containerd::start(ContainerdOptions {
        cri: true,
        imports: vec![conf_d.path().join("*.toml").display().to_string()],
        tables: String::new(),
    });
    assert_cri_has_gpushare(&c, "drop-in");
    // The default runtime survives the drop-in (containerd 1.6 replaces the CRI table and its
    // runtime list with the imported ones).
    let dump = config_dump(&c);
    let (runc, _) = cri_runtime(&dump, "runc").expect("runc runtime still configured");
    assert_eq!(runc["runtime_type"], "\"io.containerd.runc.v2\"");
    let left = c.stop();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn nodeadm_drop_in_registers_the_same_runtime() {
    let path = packaging("nodeadm/gpushare-nodeconfig.yaml");
    let doc: Value = serde_norway::from_str(&fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(doc["apiVersion"], "node.eks.aws/v1alpha1");
    assert_eq!(doc["kind"], "NodeConfig");
    let fragment = doc["spec"]["containerd"]["config"]
        .as_str()
        .expect("spec.containerd.config (a TOML string)");
    let packaged = fs::read_to_string(packaging("containerd/gpushare-runtime.toml")).unwrap();
    let (rt, opts) =
        cri_runtime(fragment, "gpushare").expect("the gpushare runtime in nodeadm's TOML");
    let (want_rt, want_opts) =
        cri_runtime(&packaged, "gpushare").expect("the gpushare runtime in the containerd drop-in");
    assert_eq!(rt["runtime_type"], want_rt["runtime_type"]);
    assert_eq!(opts["BinaryName"], want_opts["BinaryName"]);
    assert_eq!(opts["BinaryName"], "\"/usr/bin/gpushare-runtime\"");

    // nodeadm merges the fragment into the config it generates; no table of the fragment may
    // clash with it, so containerd reads the union as one file. Check that union with the real
    // containerd, on a base like nodeadm's (version 2, default runtime declared).
    if !need(is_root(), "root (containerd)")
        || !need(
            which("containerd").is_some() && which("ctr").is_some(),
            "containerd (Debian package containerd)",
        )
    {
        return;
    }
    let _serial = serial();
    let base = format!(
        "[plugins.\"{CRI}\".containerd]\n  default_runtime_name = \"runc\"\n\
         [plugins.\"{CRI}\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n\
         [plugins.\"{CRI}\".containerd.runtimes.runc.options]\n  SystemdCgroup = false\n\n"
    );
    // The fragment uses the base runtime spec nodeadm writes; containerd's CRI plugin loads it
    // at start, so give it one where the fragment looks.
    let nodeadm_spec = "/etc/containerd/base-runtime-spec.json";
    assert!(fragment.contains(nodeadm_spec), "{fragment}");
    let tmp = tempfile::tempdir().unwrap();
    let spec = tmp.path().join("base-runtime-spec.json");
    let out = output_within(Command::new("ctr").args(["oci", "spec"]), CTR_LIMIT);
    assert!(out.status.success(), "ctr oci spec: {}", text(&out.stderr));
    fs::write(&spec, &out.stdout).unwrap();
    let mut c = Containerd::start(ContainerdOptions {
        cri: true,
        imports: Vec::new(),
        tables: base + &fragment.replace(nodeadm_spec, &spec.display().to_string()),
    });
    assert_cri_has_gpushare(&c, "nodeadm fragment");
    let left = c.stop();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn packaged_runtime_config_documents_every_key() {
    let path = packaging("runtime.toml");
    let text = fs::read_to_string(&path).unwrap();
    for key in ["runtimes", "spec_dirs", "log_file", "log_level"] {
        let at = text
            .lines()
            .position(|l| l.starts_with(&format!("{key} =")))
            .unwrap_or_else(|| panic!("{}: `{key} = …` at the start of a line", path.display()));
        let comment = text.lines().nth(at.saturating_sub(1)).unwrap_or_default();
        assert!(
            comment.starts_with('#'),
            "{}: `{key}` is documented in the comment above it",
            path.display()
        );
    }
}

/// The done-when of the driver's user-space, through containerd 1.6 (no CDI of its own) and
/// `gpushare-runtime`: the container on an MPS claim, asking for both of the claim's CDI IDs
/// (the driver's device, then the claim's) and for `NVIDIA_VISIBLE_DEVICES=all`, sees the
/// driver's files at the generated spec's paths, the claim's pipe dir at `/tmp/nvidia-mps`
/// although a node-wide one existed when the spec was generated, and only the claim's GPU.
#[test]
fn ctr_container_gets_the_drivers_files_its_claims_pipe_and_no_other_gpu() {
    use gpushare_e2e::driver_view::*;
    let Some(_cases) = prerequisites() else {
        return;
    };
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let root = driver_root_with_host_mps(tmp.path());
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        &sim_root_config(&root),
    );
    let uid = unique_uid("ctrd-drv");
    let claim = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"uid": uid, "name": "drv", "namespace": "default"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-6"}],
            "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
              "parameters": {"sharingMode": "mps", "mpsActiveThreadPercentage": 50}}}]}}}});
    let r = d
        .prepare(&claim)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let ids = r.requests[0].cdi_device_ids.clone();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids[0].starts_with("gpushare.io/gpu=GPU-"), "{ids:?}");
    let files = driver_files(&d.driver_spec());

    let archive = busybox_image(tmp.path(), &[]);
    let c = Containerd::start(ContainerdOptions::default());
    c.import(&archive);
    let config = runtime_config(tmp.path(), "runtime", &["runc"], &[&d.cdi_dir]);
    let runtime = runtime_wrapper(tmp.path(), "gpushare-runtime.sh", &config);
    let id = format!("gs-ctrd-drv-{}", std::process::id());
    let out = output_within(
        c.run(
            &runtime,
            &id,
            &[
                "NVIDIA_VISIBLE_DEVICES=all".to_string(),
                format!("GPUSHARE_VISIBLE_DEVICES={}", ids.join(",")),
            ],
            &[],
        )
        .args(["/bin/sh", "-c", &view_script(&files)])
        .stdin(Stdio::null()),
        CTR_LIMIT,
    );
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "ctr run: {stdout}\n{}\ngpushare-runtime log:\n{}",
        text(&out.stderr),
        fs::read_to_string(tmp.path().join("runtime.log")).unwrap_or_default()
    );
    check_view(&stdout, &files, "nvidia6");
    stop_clean(c);
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
}
