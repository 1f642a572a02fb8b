//! `gpushare demo`: the whole job on a simulated node, from claim files to a container.
//!
//! It starts `gpushared` (from beside this executable) on a simulated p4d.24xlarge in a
//! temporary directory, prepares the sample claims, prints what the node now looks like,
//! starts a container on the MPS claim with podman (or runc), releases everything, and checks
//! that nothing is left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpushare_proto::{
    ClaimInfo, Client, GpuInfo, Method, PrepareParams, PrepareResult, StrategyInfo, UidParams,
    UnprepareResult,
};
use serde_json::Value;

use crate::{claim_detail, claims_table, container, gpus_table, mig_table};
use gpushare::cli_api::{parse_claim_document, pid_alive, split_kind};

/// Writes the demo's output to stdout, ignoring a failed write. The demo keeps Rust's
/// ignored SIGPIPE (`main` restores the default for every other command): it must live on
/// after `gpushare demo | head` closes the pipe, to release its claims and stop its
/// gpushared, and `print!` would panic on the EPIPE instead. Its output is diagnostics, so
/// losing the rest of it is harmless; the clean-up's checks still fail the command.
fn emit(args: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    // A closed pipe (BrokenPipe) or any other failed write: nothing is left to tell.
    let _ = out.write_fmt(args).and_then(|()| out.flush());
}

/// `print!` for the demo: [`emit`].
macro_rules! say {
    ($($arg:tt)*) => { emit(format_args!($($arg)*)) };
}

/// `println!` for the demo: [`emit`].
macro_rules! sayln {
    ($($arg:tt)*) => { emit(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Node name of the sample claims' allocations.
pub const DEMO_NODE: &str = "ip-10-0-1-23.us-west-2.compute.internal";

/// The CDI kind of the demo's (simulated) driver spec: not the default `gpushare.io/gpu`, so
/// that the demo, whose specs go to `/var/run/cdi` for podman, never replaces the driver spec
/// of a gpushared that serves this host.
pub const DEMO_DRIVER_KIND: &str = "gpushare.io/demo-gpu";

/// The sample claims: real-shaped ResourceClaim objects as our users write them.
const CLAIMS: &[(&str, &str)] = &[
    (
        "seed-mps.yaml",
        include_str!("../../daemon/examples/claims/seed-mps.yaml"),
    ),
    (
        "seed-timeslicing.yaml",
        include_str!("../../daemon/examples/claims/seed-timeslicing.yaml"),
    ),
    (
        "seed-basic-v1beta1.yaml",
        include_str!("../../daemon/examples/claims/seed-basic-v1beta1.yaml"),
    ),
    (
        "nvidia-mps-2gpu.json",
        include_str!("../../daemon/examples/claims/nvidia-mps-2gpu.json"),
    ),
    (
        "nvidia-two-requests.yaml",
        include_str!("../../daemon/examples/claims/nvidia-two-requests.yaml"),
    ),
    (
        "seed-mig-3g20gb.yaml",
        include_str!("../../daemon/examples/claims/seed-mig-3g20gb.yaml"),
    ),
];

/// Container engine for the container step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// podman if installed, else runc, else skip the step.
    Auto,
    /// podman (reads our CDI spec itself).
    Podman,
    /// runc with the claim's CDI edits applied to its config.json.
    Runc,
    /// No container.
    None,
}

/// Flags of `gpushare demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Container engine for the container step.
    #[arg(long, value_enum, default_value_t = Engine::Auto)]
    engine: Engine,
    /// MPS control program (default: gpushared's choice: NVIDIA's if installed, else the
    /// emulator).
    #[arg(long)]
    mps_control: Option<PathBuf>,
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The demo's daemon; stopped (after releasing what is left) on drop, its driver spec
/// removed.
struct DemoDaemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    driver_spec: PathBuf,
}

impl DemoDaemon {
    fn client(&self) -> Result<Client> {
        Client::connect(&self.socket, Duration::from_secs(60))
            .context("connecting to the demo's gpushared")
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for DemoDaemon {
    fn drop(&mut self) {
        if let Ok(mut c) = Client::connect(&self.socket, Duration::from_secs(5)) {
            if let Ok(claims) = c.list_claims() {
                for claim in claims {
                    let _ =
                        c.call::<_, Value>(Method::Unprepare, Some(&UidParams { uid: claim.uid }));
                }
            }
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        // A real node keeps its driver spec across restarts; the demo's is simulated.
        let _ = fs::remove_file(&self.driver_spec);
    }
}

/// Engines' 64-hex container ids, shortened the way `podman ps` shows them.
fn short_id(id: &str) -> &str {
    if id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
        &id[..12]
    } else {
        id
    }
}

fn step(text: &str) {
    sayln!("\n==> {text}");
}

/// Runs the demo.
///
/// # Errors
/// Not root, a binary is missing, or a step failed (the message says which).
pub fn run(args: &DemoArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("gpushare demo must run as root: it creates simulated GPU device nodes (mknod), mounts a tmpfs per MPS claim and starts containers");
    }
    let exe = std::env::current_exe().context("finding gpushare's own path")?;
    let gpushared = exe.with_file_name("gpushared");
    if !gpushared.is_file() {
        bail!(
            "{} is missing: build the whole workspace (cargo build --workspace)",
            gpushared.display()
        );
    }
    let engine = match args.engine {
        Engine::Auto if which("podman").is_some() && which("runc").is_some() => Engine::Podman,
        Engine::Auto if which("runc").is_some() => Engine::Runc,
        Engine::Auto => Engine::None,
        e => e,
    };
    let tmp = tempfile::Builder::new()
        // Short: the MPS sockets under it must fit in a Unix socket address.
        .prefix("gsdemo-")
        .tempdir_in("/tmp")
        .context("creating a temporary directory")?;
    // podman reads CDI specs only from /etc/cdi and /var/run/cdi.
    let cdi_dir = if engine == Engine::Podman {
        PathBuf::from("/var/run/cdi")
    } else {
        tmp.path().join("cdi")
    };
    let socket = tmp.path().join("gpushared.sock");
    let log = tmp.path().join("gpushared.log");
    let log_file = fs::File::create(&log)?;
    // A p4d.24xlarge whose operator turned MIG mode on for gpu-2 (on A100 that needs a GPU
    // reset, which gpushare never does), so the MIG sample claim gets its slice.
    let profile = tmp.path().join("p4d.24xlarge-mig2.toml");
    fs::write(
        &profile,
        include_str!("../../daemon/examples/profiles/p4d.24xlarge-mig2.toml"),
    )?;
    // A config of our own: the host's /etc/gpushare/config.toml is not the demo's.
    let config = tmp.path().join("config.toml");
    fs::write(
        &config,
        format!("[cdi]\ndriver_spec = \"toolkit\"\ndriver_kind = \"{DEMO_DRIVER_KIND}\"\n"),
    )?;
    let driver_spec = {
        let (vendor, class) = split_kind(DEMO_DRIVER_KIND).map_err(anyhow::Error::msg)?;
        cdi_dir.join(format!("{vendor}-{class}.json"))
    };
    let mut cmd = Command::new(&gpushared);
    // The node's own gpushared may serve the default metrics port.
    cmd.arg("--config")
        .arg(&config)
        .arg("--no-metrics")
        .arg("--simulate")
        .arg(&profile)
        .args(["--node-name", DEMO_NODE, "--shm-size-mib", "64"])
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .arg("--run-dir")
        .arg(tmp.path().join("run"))
        .arg("--cdi-dir")
        .arg(&cdi_dir)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file);
    if let Some(p) = &args.mps_control {
        cmd.arg("--mps-control").arg(p);
    }
    let daemon = DemoDaemon {
        child: cmd
            .spawn()
            .with_context(|| format!("starting {}", gpushared.display()))?,
        socket: socket.clone(),
        log: log.clone(),
        driver_spec: driver_spec.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Client::connect(&socket, Duration::from_secs(2)).is_err() {
        if Instant::now() > deadline {
            bail!(
                "gpushared did not start within 20 s; its log:\n{}",
                daemon.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut client = daemon.client()?;
    let health: gpushare_proto::HealthInfo = client.call(Method::Health, None::<&()>)?;
    step(&format!(
        "gpushared runs on a simulated p4d.24xlarge with MIG mode on gpu-2 (node {DEMO_NODE}, {} GPUs), MPS control program {}",
        health.gpus, health.mps_control
    ));
    // As gpushared reports the claims' specs: resolved (/var/run/cdi is a link to /run/cdi).
    sayln!(
        "  the driver's CDI spec (what NVIDIA's nvidia-ctk cdi generate writes, simulated): {}",
        fs::canonicalize(&driver_spec)
            .unwrap_or_else(|_| driver_spec.clone())
            .display()
    );

    step("Preparing the sample ResourceClaims");
    let mut prepared: Vec<String> = Vec::new();
    for (file, text) in CLAIMS {
        let claim = parse_claim_document(text).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        match client.call::<_, PrepareResult>(Method::Prepare, Some(&PrepareParams { claim })) {
            Ok(r) => {
                let ids: Vec<String> = r
                    .requests
                    .iter()
                    .flat_map(|q| q.cdi_device_ids.clone())
                    .collect();
                sayln!("  {file:<26} prepared -> {}", ids.join(", "));
                prepared.push(r.uid);
            }
            Err(e) => match e.remote() {
                Some(body) => sayln!("  {file:<26} refused: {} ({})", body.code, body.message),
                None => bail!("{file}: {e}"),
            },
        }
    }

    step("GPUs (gpushare gpus)");
    let gpus: Vec<GpuInfo> = client.call(Method::ListGpus, None::<&()>)?;
    say!("{}", gpus_table(&gpus));
    step("MIG devices (gpushare mig list)");
    say!("{}", mig_table(&gpus));
    step("Claims (gpushare claims)");
    let claims = client.list_claims()?;
    say!("{}", claims_table(&claims));
    let mps_pids: Vec<i32> = claims
        .iter()
        .flat_map(|c| c.groups.iter())
        .filter_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.control_daemon_pid),
            _ => None,
        })
        .collect();
    let mps_claim = claims
        .iter()
        .find(|c| c.name == "inference-pod-gpu-claim-4xk9q")
        .context("the MPS sample claim was not prepared")?
        .clone();
    step(&format!(
        "One claim in detail (gpushare claim {})",
        mps_claim.uid
    ));
    say!("{}", claim_detail(&mps_claim));

    container_step(
        engine,
        &daemon,
        &mps_claim,
        &health.mps_control,
        &cdi_dir,
        tmp.path(),
    )?;

    step("Releasing every claim");
    for uid in &prepared {
        let r: UnprepareResult =
            client.call(Method::Unprepare, Some(&UidParams { uid: uid.clone() }))?;
        sayln!("  {uid} released: {}", r.released);
    }
    let claims = client.list_claims()?;
    let gpus: Vec<GpuInfo> = client.call(Method::ListGpus, None::<&()>)?;
    let mig_left: Vec<String> = gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|d| d.device_name(g.minor)))
        .collect();
    if !mig_left.is_empty() {
        bail!("left behind: MIG devices {mig_left:?}");
    }
    let run_claims = tmp.path().join("run/claims");
    let leftovers: Vec<String> = fs::read_dir(&run_claims)
        .map(|r| {
            r.flatten()
                .map(|e| e.path().display().to_string())
                .collect()
        })
        .unwrap_or_default();
    let specs: Vec<&String> = prepared
        .iter()
        .filter(|u| cdi_dir.join(format!("gpushare.io-claim_{u}.json")).exists())
        .collect();
    let alive: Vec<&i32> = mps_pids.iter().filter(|p| pid_alive(**p)).collect();
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mounted = mounts.contains(&run_claims.display().to_string());
    if !claims.is_empty()
        || !leftovers.is_empty()
        || !specs.is_empty()
        || !alive.is_empty()
        || mounted
    {
        bail!("left behind: claims {claims:?}, dirs {leftovers:?}, CDI specs {specs:?}, MPS daemons {alive:?}, mounts {mounted}");
    }
    sayln!(
        "  nothing left behind: {} MPS control daemons quit, MIG devices destroyed, no mount, directory, CDI spec or checkpoint entry remains",
        mps_pids.len()
    );
    drop(daemon);
    if driver_spec.exists() {
        bail!(
            "left behind: the demo's driver spec {}",
            driver_spec.display()
        );
    }
    sayln!("\nDemo complete.");
    Ok(())
}

fn container_step(
    engine: Engine,
    daemon: &DemoDaemon,
    claim: &ClaimInfo,
    mps_control: &str,
    cdi_dir: &Path,
    tmp: &Path,
) -> Result<()> {
    if engine == Engine::None {
        step("Skipping the container step (--engine none, or neither podman nor runc installed)");
        return Ok(());
    }
    if !Path::new(container::BUSYBOX).is_file() {
        step("No /bin/busybox (package busybox-static): skipping the container step");
        return Ok(());
    }
    // Every CDI device of the request, in order: the driver's device of its GPU first, the
    // claim's device last.
    let devices = claim
        .requests
        .first()
        .map(|r| r.cdi_device_ids.clone())
        .filter(|ids| !ids.is_empty())
        .context("claim has no CDI device")?;
    let pipe_dir = claim
        .groups
        .iter()
        .find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.pipe_dir.clone()),
            _ => None,
        })
        .context("the MPS claim has no pipe directory")?;
    let ui = PathBuf::from(mps_control);
    let root = container::busybox_rootfs(tmp, std::slice::from_ref(&ui))?;
    let script = format!(
        "echo \"  driver libraries: $(ls /usr/lib64/libcuda.so* /usr/lib64/libnvidia-ml.so* | tr '\\n' ' ')\"; \
         echo \"  nvidia-smi: $(nvidia-smi)\"; \
         echo \"  GPUs: $(ls /dev | grep -E '^nvidia[0-9]+$' | tr '\\n' ' ')(NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES)\"; \
         echo \"  CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY, the claim's pipe dir {pipe_dir}: $(ls /tmp/nvidia-mps | tr '\\n' ' ')\"; \
         echo \"  /dev/shm: $(grep ' /dev/shm ' /proc/self/mountinfo | cut -d' ' -f9-)\"; \
         echo \"  get_default_active_thread_percentage -> $(echo get_default_active_thread_percentage | {})\"; sleep 2",
        ui.display()
    );
    let shown = devices
        .iter()
        .map(|d| format!("--device {d}"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = match engine {
        Engine::Podman => {
            step(&format!(
                "podman run {shown} (podman reads the driver's and the claim's CDI specs)"
            ));
            container::podman_run_devices(&devices, &[], &root, &script)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting podman")?
        }
        _ => {
            step(&format!(
                "runc run with the CDI edits of {} in config.json",
                devices.join(", ")
            ));
            let bundle = root.parent().context("bundle dir")?.to_path_buf();
            let edits = gpushare_cdi::Registry::load(&[cdi_dir])
                .resolve(&devices)
                .context("resolving the claim's CDI devices")?;
            container::runc_config(&bundle, &script, &edits)?;
            Command::new("runc")
                .arg("--root")
                .arg(tmp.join("runc"))
                .args(["run", "--bundle"])
                .arg(&bundle)
                .arg("gpushare-demo")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting runc")?
        }
    };
    let mut client = daemon.client()?;
    let mut get = || -> Result<ClaimInfo> {
        Ok(client.call(
            Method::GetClaim,
            Some(&UidParams {
                uid: claim.uid.clone(),
            }),
        )?)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attached = None;
    while Instant::now() < deadline && attached.is_none() {
        attached = get()?.attached.first().cloned();
        if attached.is_none() {
            if let Some(status) = child.try_wait()? {
                let out = child.wait_with_output()?;
                bail!(
                    "the container exited ({status}) before attaching: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    match &attached {
        Some(a) => sayln!(
            "  gpushare claim {}: container {} attached (pid {}, cgroup {})",
            claim.uid,
            short_id(&a.container_id),
            a.pid.map_or("-".into(), |p| p.to_string()),
            a.cgroup.as_deref().unwrap_or("-")
        ),
        None => bail!("the container never attached to claim {}", claim.uid),
    }
    let out = child.wait_with_output()?;
    say!("{}", String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        bail!(
            "the container failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get()?.attached.is_empty() {
        if Instant::now() > deadline {
            bail!("the container exited but is still attached");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    sayln!(
        "  container exited; gpushare claim {}: 0 containers attached",
        claim.uid
    );
    Ok(())
}
