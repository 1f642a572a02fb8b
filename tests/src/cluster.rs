//! A real one-node Kubernetes cluster for the end-to-end tests (`tests/cluster/node.sh`, on the
//! components `scripts/build-cluster.sh` builds from their Go modules), installed from the
//! release's artifacts as an EKS user installs them (`packaging/release.sh`, signed with a
//! throwaway key): gpushared from the signed RPM, on the host as its unit starts it, and
//! gpushare-dra from the packaged Helm chart and the image archive. [`Node::up`] brings it up;
//! dropping the [`Node`] takes everything down again.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_proto::{ClaimInfo, Client};
use serde_json::Value;

use crate::release::{self, Release};
use crate::{output_with_input, wait_until};

/// Where gpushared's socket and run files are: the DaemonSet of `deployments/` mounts it.
const HOST_RUN: &str = "/run/gpushare";
/// The CDI directory containerd reads and the packaged config names.
const CDI_DIR: &str = "/var/run/cdi";
/// The node's run directory (`tests/cluster/node.sh`): its PKI and kubeconfigs.
const RUN: &str = "/run/gpushare-cluster";
/// The plugin's image as the release's archive names it and the chart's defaults use it.
const PLUGIN_IMAGE: &str = "localhost/gpushare-dra:0.1.0";
/// The namespace and Helm release the plugin is installed as (docs/install-eks.md's).
pub const PLUGIN_NAMESPACE: &str = "gpushare";
/// The Helm release's name.
pub const PLUGIN_RELEASE: &str = "gpushare-dra";

/// The release the tests install from, made once per test process, and the signed RPM's files
/// unpacked: gpushared and its helpers run from its `usr/bin`.
#[derive(Debug)]
pub struct Installed {
    /// The release's artifacts.
    pub release: Release,
    /// The RPM's files (`usr/bin/gpushared`, ...).
    pub root: PathBuf,
}

/// The release made from this build's RPM (`packaging/build-rpm.sh --profile dev`, which
/// scripts/test.sh runs) with `helm`, checked with `rpm -K` against its key before its files
/// are unpacked. Made once per process, under the build's `target/e2e-release` (a static is
/// never dropped: a temporary directory would outlive the tests; the next run replaces it).
///
/// # Panics
/// When there is no RPM of this build, or a step fails.
pub fn installed(helm: &Path) -> &'static Installed {
    static INSTALLED: std::sync::OnceLock<Installed> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        let rpm = release::built_rpm()
            .expect("no RPM of this build: run packaging/build-rpm.sh --profile dev first");
        let base = crate::bin_dir()
            .parent()
            .expect("target dir")
            .join("e2e-release");
        let release = release::make(&rpm, helm, &base);
        let signed = release.artifact("gpushare-0", ".rpm");
        let db = tempfile::tempdir().expect("tempdir");
        run(Command::new("rpm")
            .arg("--dbpath")
            .arg(db.path())
            .arg("--import")
            .arg(release.dir.join("RPM-GPG-KEY-gpushare")));
        let checked = succeeded(
            "rpm -K",
            Command::new("rpm")
                .arg("--dbpath")
                .arg(db.path())
                .arg("-K")
                .arg(&signed)
                .output()
                .expect("rpm -K"),
        );
        assert!(checked.contains("digests signatures OK"), "{checked}");
        let root = base.join("root");
        fs::create_dir_all(&root).expect("RPM root");
        // rpm2archive - < RPM | tar -xz -C ROOT
        let mut archive = Command::new("rpm2archive")
            .arg("-")
            .stdin(fs::File::open(&signed).expect("signed RPM"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("rpm2archive");
        run(Command::new("tar")
            .arg("-xz")
            .arg("-C")
            .arg(&root)
            .stdin(archive.stdout.take().expect("rpm2archive's output")));
        assert!(archive.wait().expect("rpm2archive").success());
        Installed { release, root }
    })
}

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A running one-node cluster; taken down on drop (pods deleted through the API first, so
/// kubelet unprepares their claims while gpushared still answers).
#[derive(Debug)]
pub struct Node {
    /// The components' directory (kubectl, ctr, ...).
    pub bin: PathBuf,
    /// The node's name (EKS-like, from its address).
    pub name: String,
    /// The cluster administrator's kubeconfig.
    pub kubeconfig: PathBuf,
    /// The node's address: the API server listens on it (port 6443).
    pub ip: String,
    containerd: String,
    gpushared: Option<Child>,
    /// Where gpushared and gpushare-dra are taken from when not from the release (a
    /// benchmark's release build: [`Node::use_binaries`]).
    bins: Option<PathBuf>,
    /// The simulated node's profile gpushared runs on (set by [`Node::start_gpushared`]).
    profile: String,
    /// gpushared's state directory (a temporary one: the host's /var/lib/gpushare is left be).
    state: tempfile::TempDir,
}

impl Node {
    /// Brings the node up (a leftover of a killed run is taken down first).
    ///
    /// # Panics
    /// When a component does not come up; the output of `node.sh` says which, with its log.
    pub fn up() -> Node {
        let script = repo().join("tests/cluster/node.sh");
        if Path::new(RUN).exists() {
            let _ = Command::new(&script).arg("down").status();
        }
        remove_gpushared_run_files();
        let out = Command::new(&script)
            .arg("up")
            .output()
            .expect("node.sh up");
        assert!(
            out.status.success(),
            "node.sh up failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let env = Command::new(&script)
            .arg("env")
            .output()
            .expect("node.sh env");
        let env = String::from_utf8_lossy(&env.stdout).into_owned();
        let var = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("node.sh env lacks {k}:\n{env}"))
                .to_string()
        };
        Node {
            bin: PathBuf::from(var("BIN")),
            name: var("NODE"),
            kubeconfig: PathBuf::from(var("KUBECONFIG")),
            ip: var("IP"),
            containerd: var("CONTAINERD_ADDRESS"),
            gpushared: None,
            profile: String::new(),
            bins: None,
            state: tempfile::Builder::new()
                .prefix("gs-cluster-")
                .tempdir()
                .expect("tempdir"),
        }
    }

    /// Takes gpushared and gpushare-dra from `dir` (a benchmark's release build) rather than
    /// from the tests' build.
    pub fn use_binaries(&mut self, dir: &Path) {
        self.bins = Some(dir.to_path_buf());
    }

    /// Where gpushared and its helpers run from: the signed RPM's `usr/bin`, or
    /// [`Node::use_binaries`]'.
    fn bins(&self) -> PathBuf {
        match &self.bins {
            Some(dir) => dir.clone(),
            None => installed(&self.helm_path()).root.join("usr/bin"),
        }
    }

    /// The helm built with the node's components.
    pub fn helm_path(&self) -> PathBuf {
        self.bin.join("helm")
    }

    /// `helm ARGS` as the cluster administrator; its output, not checked.
    pub fn helm(&self, args: &[&str]) -> Output {
        Command::new(self.helm_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .expect("helm")
    }

    /// `kubectl ARGS` as the cluster administrator, not run yet.
    fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        cmd
    }

    /// `kubectl ARGS` as the cluster administrator.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command(args)
            .output()
            .expect("running kubectl")
    }

    /// `kubectl ARGS`, which must succeed; its standard output.
    ///
    /// # Panics
    /// When kubectl fails, with what it printed.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        succeeded(&format!("kubectl {}", args.join(" ")), self.kubectl(args))
    }

    /// `kubectl ARGS` with `text` on its standard input (`apply -f -`, `delete -f -`), which
    /// must succeed; its standard output.
    ///
    /// # Panics
    /// When kubectl fails, with what it printed.
    pub fn kubectl_stdin(&self, args: &[&str], text: &str) -> String {
        let out = output_with_input(&mut self.kubectl_command(args), text);
        succeeded(&format!("kubectl {}", args.join(" ")), out)
    }

    /// `kubectl ARGS` authenticated by bearer `token` alone (a service account's), not by the
    /// administrator's certificate; `text` on its standard input.
    pub fn kubectl_with_token(&self, token: &str, args: &[&str], text: &str) -> Output {
        let ca = Path::new(RUN).join("pki/ca.crt");
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.args(["--kubeconfig", "/dev/null"])
            .arg(format!("--server=https://{}:6443", self.ip))
            .arg(format!("--certificate-authority={}", ca.display()))
            .arg(format!("--token={token}"))
            .args(args);
        output_with_input(&mut cmd, text)
    }

    /// `kubectl ARGS` as kubelet (`system:node:<name>`, its own credential), `text` on its
    /// standard input.
    pub fn kubectl_as_kubelet(&self, args: &[&str], text: &str) -> Output {
        let mut cmd = Command::new(self.bin.join("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(Path::new(RUN).join("kubelet.kubeconfig"))
            .args(args);
        output_with_input(&mut cmd, text)
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&a)).expect("kubectl's JSON")
    }

    /// Starts gpushared on the host as its unit does (the packaged config and the unit's
    /// environment file's arguments), on simulated `profile` with NVIDIA's MPS control program,
    /// named as the node, its state in a temporary directory; waits until it answers.
    ///
    /// # Panics
    /// When it does not answer within 20 s, with its log.
    pub fn start_gpushared(&mut self, profile: &str) {
        self.profile = profile.to_string();
        let boot = self.state.path().join("boot_id");
        if !boot.exists() {
            fs::write(&boot, "boot-1\n").expect("boot ID file");
        }
        self.spawn_gpushared(&[]);
    }

    /// gpushared started again as [`Node::start_gpushared`] did, with `env` added (a crash
    /// point: `GPUSHARE_CRASH_AT`).
    ///
    /// # Panics
    /// When it is running, or does not answer within 20 s.
    pub fn spawn_gpushared(&mut self, env: &[(&str, &str)]) {
        assert!(self.gpushared.is_none(), "gpushared runs");
        let unit = fs::read_to_string(repo().join("systemd/gpushared.env")).expect("unit env");
        let unit_args: Vec<String> = unit
            .lines()
            .find_map(|l| l.strip_prefix("GPUSHARED_ARGS="))
            .unwrap_or("")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state.path().join("gpushared.log"))
            .expect("log");
        let child = Command::new(self.bins().join("gpushared"))
            .args(&unit_args)
            .arg("--config")
            .arg(repo().join("packaging/config.toml"))
            .args(["--simulate", &self.profile, "--node-name", &self.name])
            .arg("--state-dir")
            .arg(self.state.path().join("state"))
            // The simulated GPUs keep their state (MIG mode, instances) on disk, as hardware
            // keeps its own across a reboot that empties /run; the boot ID is a file a test
            // can change as a reboot does.
            .arg("--sim-dev-root")
            .arg(self.state.path().join("gpus"))
            .arg("--boot-id-file")
            .arg(self.state.path().join("boot_id"))
            .arg("--mps-control")
            .arg("/usr/bin/nvidia-cuda-mps-control")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning gpushared");
        self.gpushared = Some(child);
        let socket = Path::new(HOST_RUN).join("gpushared.sock");
        assert!(
            wait_until(Duration::from_secs(20), || Client::connect(
                &socket,
                Duration::from_secs(2)
            )
            .is_ok()),
            "gpushared did not start:\n{}",
            self.gpushared_log()
        );
    }

    /// Stops gpushared with `signal` (SIGTERM as systemd does; SIGKILL) and reaps it; its MPS
    /// control daemons and MIG slices stay, as they do on a node.
    pub fn stop_gpushared(&mut self, signal: nix::sys::signal::Signal) {
        let Some(mut child) = self.gpushared.take() else {
            return;
        };
        // Our own child, not reaped yet: the pid is still its.
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Waits until gpushared has exited by itself (a crash point); its status.
    ///
    /// # Panics
    /// When it still runs after `timeout`.
    pub fn wait_gpushared_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let child = self.gpushared.as_mut().expect("gpushared was started");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("waiting for gpushared") {
                self.gpushared = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "gpushared still runs:\n{}",
                self.gpushared_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `tests/cluster/node.sh COMMAND` (`restart-kubelet`, `power-off`, `power-on`).
    ///
    /// # Panics
    /// When it fails, with what it printed.
    pub fn node_sh(&self, command: &str) {
        run(Command::new("bash")
            .arg("-x")
            .arg(repo().join("tests/cluster/node.sh"))
            .arg(command));
    }

    /// A reboot of the node (its control plane stays up, as EKS's does): kubelet, containerd,
    /// the containers and gpushared stopped, MPS daemons gone, a new boot ID, every simulated
    /// MIG instance gone (MIG mode stays), /run's gpushare and CDI files gone, containerd's
    /// state and kubelet's pod directories wiped (kubelet's checkpoints kept); then gpushared
    /// started (its unit runs before kubelet's) and the node's own processes.
    pub fn reboot(&mut self) {
        self.node_sh("power-off");
        self.stop_gpushared(nix::sys::signal::Signal::SIGTERM);
        let boot = self.state.path().join("boot_id");
        let old = fs::read_to_string(&boot).expect("boot ID file");
        fs::write(&boot, format!("{}-next\n", old.trim())).expect("boot ID file");
        fs::write(self.state.path().join("gpus/reset-gpus"), "all\n").expect("reset-gpus");
        remove_gpushared_run_files();
        self.spawn_gpushared(&[]);
        self.node_sh("power-on");
    }

    /// gpushared's log so far.
    pub fn gpushared_log(&self) -> String {
        fs::read_to_string(self.state.path().join("gpushared.log")).unwrap_or_default()
    }

    /// The claims gpushared holds.
    pub fn claims(&self) -> Vec<ClaimInfo> {
        Client::connect(
            Path::new(HOST_RUN).join("gpushared.sock"),
            Duration::from_secs(5),
        )
        .expect("gpushared's socket")
        .list_claims()
        .expect("list_claims")
    }

    /// The GPUs gpushared reports (`list_gpus`).
    pub fn gpus(&self) -> Vec<gpushare_proto::GpuInfo> {
        Client::connect(
            Path::new(HOST_RUN).join("gpushared.sock"),
            Duration::from_secs(5),
        )
        .expect("gpushared's socket")
        .call(gpushare_proto::Method::ListGpus, None::<&()>)
        .expect("list_gpus")
    }

    /// Installs gpushare-dra as docs/install-eks.md does: the release's image archive
    /// imported into containerd (as a registry would hand it over), the release namespace made
    /// with its Pod Security label, the release's packaged chart installed with `helm install`,
    /// and the node labelled; waits until the plugin's pod is ready and its ResourceSlices list
    /// `gpus` GPUs. With [`Node::use_binaries`], the image is built from those binaries and the
    /// chart is installed from its directory.
    ///
    /// # Panics
    /// When a step fails or the plugin is not ready in 120 s.
    pub fn install_plugin(&self, gpus: usize) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (archive, chart) = match &self.bins {
            None => {
                let release = &installed(&self.helm_path()).release;
                (
                    release.artifact("gpushare-dra-", ".oci.tar"),
                    release.artifact("gpushare-dra-", ".tgz"),
                )
            }
            Some(bins) => {
                let archive = dir.path().join("gpushare-dra.tar");
                run(Command::new(repo().join("deployments/build-image.sh"))
                    .arg(bins.join("gpushare-dra"))
                    .arg(PLUGIN_IMAGE));
                run(Command::new("podman")
                    .args(["save", "--quiet", "--format", "oci-archive", "-o"])
                    .arg(&archive)
                    .arg(PLUGIN_IMAGE));
                let _ = Command::new("podman")
                    .args(["rmi", "--force", PLUGIN_IMAGE])
                    .output();
                (archive, repo().join("deployments/helm/gpushare-dra"))
            }
        };
        run(Command::new(self.bin.join("ctr"))
            .args([
                "--address",
                &self.containerd,
                "-n",
                "k8s.io",
                "images",
                "import",
            ])
            .arg(&archive));
        self.kubectl_ok(&["create", "namespace", PLUGIN_NAMESPACE]);
        self.kubectl_ok(&[
            "label",
            "namespace",
            PLUGIN_NAMESPACE,
            "pod-security.kubernetes.io/enforce=privileged",
        ]);
        succeeded(
            "helm install",
            self.helm(&[
                "install",
                PLUGIN_RELEASE,
                chart.to_str().expect("utf-8 path"),
                "--namespace",
                PLUGIN_NAMESPACE,
            ]),
        );
        self.kubectl_ok(&["label", "node", &self.name, "gpushare.io/gpushared=true"]);
        self.wait_plugin_ready(gpus);
    }

    /// Waits until the plugin's DaemonSet is rolled out and its ResourceSlices list `gpus`
    /// GPUs.
    ///
    /// # Panics
    /// When that takes over 120 s, with the plugin's and gpushared's logs.
    pub fn wait_plugin_ready(&self, gpus: usize) {
        let ready = wait_until(Duration::from_secs(120), || {
            self.kubectl(&[
                "-n",
                PLUGIN_NAMESPACE,
                "rollout",
                "status",
                "daemonset/gpushare-dra",
                "--timeout=5s",
            ])
            .status
            .success()
                && self.gpus_published() == gpus
        });
        assert!(
            ready,
            "gpushare-dra not ready with {gpus} GPUs published ({} now):\n{}\n{}",
            self.gpus_published(),
            String::from_utf8_lossy(
                &self
                    .kubectl(&[
                        "-n",
                        PLUGIN_NAMESPACE,
                        "logs",
                        "daemonset/gpushare-dra",
                        "--tail=30"
                    ])
                    .stdout
            ),
            self.gpushared_log()
        );
    }

    /// The whole GPUs (`type: gpu`) this node's ResourceSlices publish.
    pub fn gpus_published(&self) -> usize {
        let slices = self.get_json(&[
            "resourceslices",
            "--field-selector",
            &format!("spec.nodeName={}", self.name),
        ]);
        slices["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
            .filter(|d| d["attributes"]["type"]["string"] == "gpu")
            .count()
    }

    /// Waits until pod `ns/name` is Running; its JSON.
    ///
    /// # Panics
    /// When it is not Running in `timeout`, with its events.
    pub fn wait_running(&self, ns: &str, name: &str, timeout: Duration) -> Value {
        let ok = wait_until(timeout, || {
            self.kubectl(&[
                "-n",
                ns,
                "get",
                "pod",
                name,
                "-o",
                "jsonpath={.status.phase}",
            ])
            .stdout
                == b"Running"
        });
        assert!(
            ok,
            "pod {ns}/{name} not Running after {timeout:?}:\n{}\ngpushared:\n{}",
            String::from_utf8_lossy(&self.kubectl(&["-n", ns, "describe", "pod", name]).stdout),
            self.gpushared_log()
        );
        self.get_json(&["-n", ns, "pod", name])
    }

    /// kubelet's metrics (Prometheus text), through the API server's node proxy.
    pub fn kubelet_metrics(&self) -> String {
        self.kubectl_ok(&[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/metrics", self.name),
        ])
    }

    /// Waits until gpushared holds no claim and nothing of one is left on the host: no claim
    /// CDI spec, no MPS process.
    ///
    /// # Panics
    /// When something is left after 60 s, naming it.
    pub fn assert_nothing_left(&self) {
        assert!(
            wait_until(Duration::from_secs(60), || self.claims().is_empty()),
            "claims left: {:?}",
            self.claims()
        );
        let specs: Vec<String> = fs::read_dir(CDI_DIR)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("gpushare.io-claim"))
                    .collect()
            })
            .unwrap_or_default();
        assert!(specs.is_empty(), "claim CDI specs left: {specs:?}");
        assert!(
            wait_until(Duration::from_secs(10), || mps_processes().is_empty()),
            "MPS processes left: {:?}",
            mps_processes()
        );
    }

    /// The events of object `name` in `ns`, one message per line.
    pub fn events(&self, ns: &str, name: &str) -> String {
        let v = self.get_json(&[
            "-n",
            ns,
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ]);
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!(
                    "{}: {}",
                    e["reason"].as_str().unwrap_or(""),
                    e["message"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `sh -c SCRIPT` in pod `ns/name`'s first container; its standard output.
    pub fn exec(&self, ns: &str, name: &str, script: &str) -> String {
        self.kubectl_ok(&["-n", ns, "exec", name, "--", "sh", "-c", script])
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawning");
    succeeded(&format!("{cmd:?}"), out);
}

/// `out`'s standard output, after checking that `what` succeeded.
///
/// # Panics
/// When it failed, with what it printed.
pub(crate) fn succeeded(what: &str, out: Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("tests/cluster/node.sh"))
            .arg("down")
            .status();
        self.stop_gpushared(nix::sys::signal::Signal::SIGTERM);
        remove_gpushared_run_files();
    }
}

/// What gpushared leaves on purpose when it stops (MPS control daemons, the claims' run
/// directories and their mounts, its driver spec), which nothing on a test machine would
/// remove; a reboot removes them all (they live in memory and under /run).
fn remove_gpushared_run_files() {
    for pid in mps_processes() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // (No panic: this runs in Drop too, maybe while a failed test unwinds.)
    if !wait_until(Duration::from_secs(10), || mps_processes().is_empty()) {
        eprintln!("MPS processes survive SIGKILL: {:?}", mps_processes());
    }
    let mut mounts: Vec<String> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&format!("{HOST_RUN}/")))
        .map(str::to_string)
        .collect();
    mounts.sort_by(|a, b| b.cmp(a)); // deepest first
    for m in mounts {
        let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
    let _ = fs::remove_dir_all(HOST_RUN);
    if let Ok(dir) = fs::read_dir(CDI_DIR) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with("gpushare.io-") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

// Manifests the tests and the bench apply.

/// A ResourceClaimTemplate `name` in `ns` for one MIG slice of `profile`, selected as the
/// corrected guide template does (`mig.nvidia.com`, the `profile` attribute).
pub fn mig_template(ns: &str, name: &str, profile: &str) -> String {
    format!(
        r#"apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: device.attributes["gpu.nvidia.com"].profile == "{profile}"
"#
    )
}

/// The spec of a claim for one whole GPU (class `gpu.nvidia.com`) with opaque `parameters`
/// (YAML flow style) for the driver, as one YAML flow mapping.
fn gpu_claim_spec(parameters: &str) -> String {
    format!(
        "{{ devices: {{ requests: [{{ name: gpu, exactly: {{ deviceClassName: gpu.nvidia.com }} }}], \
         config: [{{ requests: [gpu], opaque: {{ driver: gpu.nvidia.com, parameters: {parameters} }} }}] }} }}"
    )
}

/// A ResourceClaimTemplate `name` in `ns` for one whole GPU shared with `parameters` (the
/// guides' opaque configuration, JSON).
pub fn shared_template(ns: &str, name: &str, parameters: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\n\
         metadata: {{ name: {name}, namespace: {ns} }}\nspec: {{ spec: {} }}\n",
        gpu_claim_spec(parameters)
    )
}

/// A ResourceClaim `ns/name` for one whole GPU with opaque `parameters` for the driver: one
/// claim several pods may share.
pub fn shared_claim(ns: &str, name: &str, parameters: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\n\
         metadata: {{ name: {name}, namespace: {ns} }}\nspec: {}\n",
        gpu_claim_spec(parameters)
    )
}

/// Where a [`sleeping_pod`]'s claim comes from.
#[derive(Debug, Clone, Copy)]
pub enum PodClaim<'a> {
    /// No claim.
    None,
    /// A claim of its own, made from this ResourceClaimTemplate.
    Template(&'a str),
    /// This ResourceClaim, shared with other pods.
    Claim(&'a str),
    /// No claim: one unit of this extended resource in its limits (`nvidia.com/gpu`, as pods
    /// written for a device plugin ask).
    Extended(&'a str),
}

/// A pod `name` in `ns` on the local busybox image that sleeps an hour, holding `claim` (as
/// its `gpu`), deleted after `grace` seconds.
pub fn sleeping_pod(ns: &str, name: &str, claim: PodClaim, grace: u32) -> String {
    let source = match claim {
        PodClaim::None | PodClaim::Extended(_) => None,
        PodClaim::Template(t) => Some(format!("resourceClaimTemplateName: {t}")),
        PodClaim::Claim(c) => Some(format!("resourceClaimName: {c}")),
    };
    let claim = match (source, claim) {
        (Some(source), _) => format!("    resources: {{ claims: [{{ name: gpu }}] }}\n  resourceClaims:\n  - name: gpu\n    {source}\n"),
        (None, PodClaim::Extended(name)) => format!("    resources: {{ limits: {{ {name}: 1 }} }}\n"),
        (None, _) => String::new(),
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  terminationGracePeriodSeconds: {grace}
  containers:
  - name: main
    image: gpushare.test/busybox:local
    imagePullPolicy: Never
    command: ["sleep", "3600"]
{claim}"#
    )
}

/// The sum of the samples of metric `name` (with labels or without) whose lines contain every
/// one of `labels`, in Prometheus text `text` (a histogram's `_count` or `_sum` summed over its
/// other labels).
pub fn prometheus_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && labels.iter().all(|x| l.contains(x))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The pids of NVIDIA's MPS processes (control daemons and servers) serving gpushared's
/// claims: their pipe directory is under its run directory.
pub fn mps_processes() -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("nvidia-cuda-mps"))
                && fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    env.split(|b| *b == 0).any(|v| {
                        v.starts_with(format!("CUDA_MPS_PIPE_DIRECTORY={HOST_RUN}/").as_bytes())
                    })
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_claim_and_template_ask_for_one_gpu_with_the_drivers_parameters() {
        let params = "{ sharingMode: mps, mpsActiveThreadPercentage: 50 }";
        let template: Value = serde_norway::from_str(&shared_template("ns", "t", params)).unwrap();
        let claim: Value = serde_norway::from_str(&shared_claim("ns", "c", params)).unwrap();
        assert_eq!(template["kind"], "ResourceClaimTemplate");
        assert_eq!(claim["kind"], "ResourceClaim");
        assert_eq!(claim["metadata"]["namespace"], "ns");
        let devices = &claim["spec"]["devices"];
        assert_eq!(&template["spec"]["spec"]["devices"], devices);
        assert_eq!(
            devices["requests"][0]["exactly"]["deviceClassName"],
            "gpu.nvidia.com"
        );
        assert_eq!(devices["config"][0]["requests"][0], "gpu");
        let opaque = &devices["config"][0]["opaque"];
        assert_eq!(opaque["driver"], "gpu.nvidia.com");
        assert_eq!(opaque["parameters"]["mpsActiveThreadPercentage"], 50);
    }
}
