//! The daemon's life once privileges are dropped: the host's directories locked, the service
//! reconciled and its socket bound (then `READY=1`), signals served (SIGCHLD, SIGHUP, SIGTERM,
//! SIGINT), and the bounded graceful stop.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, SignalKind};

use gpushare::cdi::HookConfig;
use gpushare::daemon_config::{parse_mode, DaemonConfig};
use gpushare::privileges;
use gpushare::server::{self, ServerConfig};
use gpushare::service::{Service, ServiceConfig};
use gpushare::strategy::mps::MpsControl;
use gpushare::sys::{reap_orphans, HostOps};
use gpushare::{metrics, notify};

use crate::args::Args;
use crate::backends::{driver_specs, gpu_backend};
use crate::host::{
    absolute, beside_exe, default_mps_control, lock_instance, real_dir, resolve_group,
};
use crate::logging::init_logging;
use crate::metrics_endpoint::start_metrics;
use crate::reload::Running;
use crate::watchdog::watchdog_loop;

/// Runs the daemon until SIGTERM or SIGINT (or until serving fails), then stops it within
/// `--stop-timeout`.
#[tokio::main]
pub(crate) async fn run(
    args: Args,
    settings: DaemonConfig,
    kept: Vec<caps::Capability>,
    privileges: privileges::Outcome,
) -> Result<()> {
    let filter = init_logging(&settings.log.level)?;
    let capabilities = kept
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    if privileges == privileges::Outcome::NoSetpcap {
        tracing::warn!(
            kept = %capabilities,
            "no CAP_SETPCAP: effective and permitted capabilities reduced, the bounding set left as the service manager set it"
        );
    }

    // MPS control daemons double-fork away from us; as a subreaper we get them back as
    // children, learn of their exit, and reap them (PID 1 here may not).
    nix::sys::prctl::set_child_subreaper(true).context("becoming a child subreaper")?;
    let node_name = match settings.node.name.as_str() {
        "" => nix::unistd::gethostname()
            .context("reading the host name (pass --node-name)")?
            .to_string_lossy()
            .into_owned(),
        name => name.to_string(),
    };
    let run_dir = real_dir("run directory", &settings.paths.run_dir, 0o755)?;
    let state_dir = real_dir("state directory", &settings.paths.state_dir, 0o700)?;
    let cdi_dir = real_dir("CDI directory", &settings.paths.cdi_dir, 0o755)?;
    gpushare::daemon_config::check_layout(&run_dir, &state_dir, &cdi_dir)
        .map_err(anyhow::Error::msg)?;
    // Two daemons on one state directory would each believe they own every claim; two on one
    // run directory would each remove the other's claim directories as orphans at start.
    // One directory serving as both is locked once (a second descriptor of the lock file,
    // closed, would drop the process's lock).
    let _instance = lock_instance(&state_dir, "state")?;
    let _run = if run_dir == state_dir {
        None
    } else {
        Some(lock_instance(&run_dir, "run")?)
    };
    let backend = gpu_backend(&settings.gpus, &node_name, &run_dir)?;
    let driver_spec = driver_specs(&settings, &backend, &run_dir, &cdi_dir)?;

    let mps_program = if settings.mps.control.as_os_str().is_empty() {
        default_mps_control()?
    } else {
        absolute(&settings.mps.control)?
    };
    let executable = std::fs::metadata(&mps_program)
        .map(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        })
        .unwrap_or(false);
    if !executable {
        bail!(
            "MPS control program {} is not an executable file",
            mps_program.display()
        );
    }
    let hook_path = if settings.hook.path.as_os_str().is_empty() {
        beside_exe("gpushare-cdi-hook")?
    } else {
        absolute(&settings.hook.path)?
    };
    let socket = absolute(&settings.paths.socket)?;
    let mps = MpsControl::new(
        mps_program.clone(),
        HostOps::host(),
        Duration::from_secs(settings.mps.timeout_seconds),
    );
    let cfg = ServiceConfig {
        node_name: node_name.clone(),
        drivers: settings.node.drivers.clone(),
        run_dir,
        cdi_dir,
        checkpoint: state_dir.join("checkpoint.json"),
        hook: HookConfig {
            path: hook_path,
            socket: socket.clone(),
            timeout_secs: settings.hook.timeout_seconds,
        },
        shm_bytes: (settings.mps.shm_size_mib > 0).then_some(settings.mps.shm_size_mib << 20),
        driver_spec: driver_spec.clone(),
    };
    let boot_id_file = args
        .boot_id_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(gpushare::service::BOOT_ID_PATH));
    let boot_id = std::fs::read_to_string(&boot_id_file)
        .map(|s| s.trim().to_string())
        .with_context(|| format!("reading the boot ID from {}", boot_id_file.display()))?;
    // Before the reconcile: the `-d` parents of MPS control daemons it starts again exit
    // meanwhile and become our children (a child subreaper); their SIGCHLD, had it come
    // before this stream existed, would be lost and they would stay zombies.
    let mut sigchld = signal(SignalKind::child())?;
    // Reconciles the host with the checkpoint (re-adoption, restarts, rollbacks, orphans)
    // before the socket exists: nobody is served from a half-known state.
    let service = Arc::new(
        Service::with_boot_id(cfg, backend.clone(), mps, boot_id)
            .map_err(|e| anyhow::anyhow!(e))?,
    );
    gpushare::supervise::spawn(Arc::clone(&service))
        .context("starting the MPS control daemon supervisor")?;
    if let Some(specs) = &driver_spec {
        // A failing generator is run again when due, so `health` clears without a prepare.
        gpushare::driver_spec::retry::spawn_retries(Arc::clone(specs))
            .context("starting the driver spec's retry thread")?;
    }
    let requests = Arc::new(metrics::RequestMetrics::default());
    let registry = Arc::new(metrics::registry(
        &requests,
        metrics::ServiceCollector::new(Arc::clone(&service), Arc::new(metrics::pid_alive)),
    ));
    let server_cfg = Arc::new(ServerConfig {
        socket: socket.clone(),
        mode: parse_mode(&settings.socket.mode).map_err(anyhow::Error::msg)?,
        group: resolve_group(&settings.socket.group)?,
        changing_uids: settings.socket.changing_uids.clone(),
        max_connections: settings.socket.max_connections,
        reserved_connections: settings.socket.reserved_connections,
        max_connections_per_uid: settings.socket.max_connections_per_uid,
        first_request_timeout: Duration::from_secs(settings.socket.first_request_timeout_seconds),
        idle_timeout: Duration::from_secs(settings.socket.idle_timeout_seconds),
        request_timeout: Duration::from_secs(settings.socket.request_timeout_seconds),
        metrics: Some(Arc::clone(&requests)),
    });
    let listener = server::bind(&server_cfg)
        .with_context(|| format!("binding socket {}", socket.display()))?;
    // Metrics are for watching the node, not part of serving it: a port taken by another
    // process is an error in the journal, never a node without GPU sharing.
    let metrics_task = match start_metrics(&settings, &registry).await {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "metrics endpoint not served; fix [metrics] and reload");
            None
        }
    };
    tracing::info!(
        socket = %socket.display(),
        node = %node_name,
        backend = %backend.describe(),
        mps_control = %mps_program.display(),
        %capabilities,
        "gpushared ready"
    );
    // Service::with_boot_id has loaded the checkpoint and reconciled the host with it
    // (re-adoption, restarts, rollbacks, orphans, the MIG sweep), and the socket is bound:
    // clients that systemd lets start after us are served from here on.
    let health = service.health();
    notify::ready(&format!(
        "serving {} claims on {} GPUs",
        health.claims, health.gpus
    ));
    let watchdog = notify::watchdog_interval().map(|every| {
        tracing::info!(
            every_ms = every.as_millis() as u64,
            "pinging the systemd watchdog"
        );
        tokio::spawn(watchdog_loop(Arc::clone(&service), every))
    });
    let mut running = Running {
        settings,
        filter,
        metrics: metrics_task,
        registry,
        driver_spec,
    };
    let mut sighup = signal(SignalKind::hangup())?;

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    // A task of its own, not a future polled here on the main thread: a connection the accept
    // loop spawns then starts on the worker that accepted it, where one polled by `block_on`
    // was handed over to a worker by a wake-up, one more hand-over per hook call (each may
    // wait for another CPU to be run; bench/NOTES.md, the hook's p99). Aborted at SIGTERM,
    // which drops (closes) the listener.
    let mut serving = tokio::spawn(server::serve(listener, Arc::clone(&service), server_cfg));
    let result = loop {
        tokio::select! {
            r = &mut serving => break match r {
                Ok(served) => served.context("serving"),
                Err(e) => Err(anyhow::anyhow!("the accept loop ended: {e}")),
            },
            _ = sigchld.recv() => {
                let reaped = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or_default();
                if !reaped.is_empty() {
                    tracing::debug!(?reaped, "reaped exited children");
                }
            }
            _ = sighup.recv() => running.reload(&args).await,
            _ = sigterm.recv() => break Ok(()),
            _ = sigint.recv() => break Ok(()),
        }
    };
    notify::stopping();
    if let Some(w) = watchdog {
        w.abort();
    }
    if let Some((_, m)) = running.metrics.take() {
        m.abort();
    }
    // Stop accepting first (the listener is dropped with `serving`), then let requests under
    // way finish, bounded, and write the checkpoint. MPS control daemons are left running on
    // purpose: GPU jobs must survive a restart of gpushared.
    serving.abort();
    // The listener is dropped when the aborted task is; an ended one has already dropped it.
    let _ = serving.await;
    server::remove_socket(&socket);
    let bound = Duration::from_secs(args.stop_timeout);
    let stopping = Arc::clone(&service);
    let stopped = tokio::task::spawn_blocking(move || stopping.stop(bound))
        .await
        .context("stopping the service")?;
    match stopped {
        Ok(true) => tracing::info!("{}", stopped_line(&service)),
        Ok(false) => {
            tracing::warn!(
                "gpushared stopped with requests still under way; the next start reconciles them"
            );
            // The runtime would wait for them without a bound when dropped.
            server::remove_socket(&socket);
            std::process::exit(0);
        }
        Err(e) => tracing::error!(error = %e, "writing the checkpoint at stop"),
    }
    result
}

/// The last log line of a clean stop: how many MPS control daemons stay behind on purpose.
fn stopped_line(service: &Service) -> String {
    let left = service
        .claims()
        .iter()
        .flat_map(|c| c.mps_daemons())
        .filter(|m| m.control_daemon_pid > 0)
        .count();
    match left {
        0 => "gpushared stopped".to_string(),
        1 => "gpushared stopped; 1 MPS control daemon left running for its claim (the next start re-adopts it)".to_string(),
        n => format!("gpushared stopped; {n} MPS control daemons left running for their claims (the next start re-adopts them)"),
    }
}
